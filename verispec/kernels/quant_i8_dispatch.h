// How both integer-path modules (AVX-512: quant_i8_legacy.cpp, quant_i8_k.cpp; AVX-VNNI:
// quant_i8_vnni256_legacy.cpp, quant_i8_vnni256_k.cpp) turn a ggml type and a row count
// into one of their kernel instances. Only the kernels differ between the modules, so
// the walk over blocks and row chunks is written once here and compiled into each
// module with its own instruction set.
#pragma once
#include <iterator>
#include <utility>

#include "quant_i8.h"

namespace vs::i8 {

// Rows [r0, r0 + rows) of a 32-weight group, 1 <= rows <= MaxRows:
// Kernel<Fi, R>::run(gd, blocks, x, r0, acc) for the type's index Fi in kLegacy.
template <template <int, int> class Kernel, int Fi, int... Rs>
void legacy_rows(const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, int64_t rows, float* acc,
                 std::integer_sequence<int, Rs...>) {
  ((rows == Rs + 1 ? Kernel<Fi, Rs + 1>::run(gd, blocks, x, r0, acc) : void()), ...);
}

template <template <int, int> class Kernel, int MaxRows>
void legacy_dispatch(int64_t type, const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, int64_t rows,
                     float* acc) {
  static_assert(std::size(kLegacy) == 5, "legacy_dispatch walks five formats");
  const auto run = [&](auto fi) {
    legacy_rows<Kernel, decltype(fi)::value>(gd, blocks, x, r0, rows, acc,
                                              std::make_integer_sequence<int, MaxRows>());
  };
  switch (type) {
    case kLegacy[0].type: run(std::integral_constant<int, 0>()); break;
    case kLegacy[1].type: run(std::integral_constant<int, 1>()); break;
    case kLegacy[2].type: run(std::integral_constant<int, 2>()); break;
    case kLegacy[3].type: run(std::integral_constant<int, 3>()); break;
    default: run(std::integral_constant<int, 4>()); break;
  }
}

constexpr int64_t k_tile_bytes(int type) { return type == 12 ? 2368 : type == 13 ? 2880 : 3360; }

// All n rows of a K-quant group: super-blocks outer, then the rows in balanced chunks of
// at most MaxRows, each Chunk<Type, R>::run(block, x, r0, b, acc, next); a super-block
// of the group is read from DRAM once and stays in L1 for every chunk. Only the first
// chunk requests the stream ahead (`next`; null for the others).
template <template <int, int> class Chunk, int MaxRows, int Type, int... Rs>
void k_chunks(const uint8_t* gd, int64_t blocks, const Rows& x, float* acc, std::integer_sequence<int, Rs...>) {
  constexpr int64_t block_bytes = kGroupTiles * k_tile_bytes(Type);
  const int64_t chunks = (x.n + MaxRows - 1) / MaxRows;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = gd + b * block_bytes;
    const char* next = reinterpret_cast<const char*>(block + kAheadBytes);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t r0 = c * x.n / chunks, rows = (c + 1) * x.n / chunks - r0;
      const char* ahead = c == 0 ? next : nullptr;
      ((rows == Rs + 1 ? Chunk<Type, Rs + 1>::run(block, x, r0, b, acc, ahead) : void()), ...);
    }
  }
}

template <template <int, int> class Chunk, int MaxRows>
void k_dispatch(int64_t type, const uint8_t* gd, int64_t blocks, const Rows& x, float* acc) {
  const auto seq = std::make_integer_sequence<int, MaxRows>();
  switch (type) {
    case 12: k_chunks<Chunk, MaxRows, 12>(gd, blocks, x, acc, seq); break;
    case 13: k_chunks<Chunk, MaxRows, 13>(gd, blocks, x, acc, seq); break;
    default: k_chunks<Chunk, MaxRows, 14>(gd, blocks, x, acc, seq); break;
  }
}

}  // namespace vs::i8
