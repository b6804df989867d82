// The integer path of a quantized product (--weights quant-i8), shared between its
// files: quant_i8_pack.cpp (the tile layouts), quant_i8.cpp (activations, the
// driver, the embedding), quant_i8_legacy.cpp (32-weight blocks), quant_i8_k.cpp
// (256-weight K-quant super-blocks).
//
// Each row of x is rounded to int8 on its own, as llama.cpp rounds its activations:
// per 32 values for the 32-weight formats (its Q8_0 / Q8_1), per 256 for the
// K-quants (its Q8_K), with the integer sums of the values that the zero points
// and the K-quants' minimums need. Every block's dot product is then exact in
// int32 by VPDPBUSD (AVX-512-VNNI): 64 multiply-adds an instruction, and a 4-bit
// weight costs a mask or a shift, no conversion. Only the block scales are float.
//
// Row invariance by construction: a vector lane is one output, no sum runs across
// lanes or rows, and a thread takes whole outputs (never a share of k). Each
// y[r, o] is one fp32 accumulator from 0, advanced block by block in increasing
// order by the same float operations on x[r, :] and W[o, :] alone, + bias, rounded
// once to bf16. So the bits do not depend on the row count, the other rows, the
// chunking or the thread count, and speculation on this path is bit-exact against
// plain decoding on it. The logits are not the bf16 path's (docs/quant_kernels.md).
//
// A tile holds 16 outputs x one block, [scales][quants]; the quants as bytes in
// VPDPBUSD's order, one 64-byte "step" per 4 values of k: byte 4o + j of step c is
// output o at k = 4c + j. Two 4-bit steps share one 64-byte vector, in its low and
// high nibbles. The layouts per format are in quant_i8_pack.cpp.
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "matmul.h"
#include "quant_stack.h"

namespace vs::i8 {

constexpr int64_t kMagic = 0x324138505153564c;  // "LVSQP8A2"

struct Header {
  int64_t magic, out, in, groups, data_offset;
  int64_t per32, per256;  // whether some group's format wants x per 32 / per 256 values
  int64_t reserved;
};
using View = StackView<Header>;
inline View view(const at::Tensor& packed) { return stack_view<Header>(packed); }

struct Format {
  int64_t type;
  const char* name;
  int64_t block;  // weights per raw block along k: 32, or 256 (K-quants)
  int64_t raw_bytes;  // one raw block
  int64_t tile_bytes;  // 16 outputs x one block
  void (*repack)(const uint8_t* const* rows, uint8_t* dst);
  // Output o's weight at k of a tile, as gguf.quants.dequantize computes it in
  // float32 (the embedding's values, equal to the bf16 path's).
  float (*weight)(const uint8_t* tile, int o, int k);
};
const Format* find(int64_t type);  // nullptr when the integer path lacks it
const Format* formats(int64_t* count);

// x's rows on the integer path. A row's values are q = round_even(x / d) with
// d = max|x| / 127 over the block (0 for an all-zero block).
struct Rows {
  int64_t n = 0, in = 0;
  // Per 32 values (the 32-weight formats): q [n][in], d and d * sum(q) [n][in / 32],
  // sum(q) [n][in / 32].
  std::vector<int8_t> q32;
  std::vector<float> d32, xs32;
  std::vector<int32_t> s32;
  // Per 256 values (K-quants): q [n][in], d [n][in / 256], and the sums of q over
  // each 16 and each 32 values, [n][in / 16] and [n][in / 32] (|sum| <= 32 * 127).
  std::vector<int8_t> q256;
  std::vector<float> d256;
  std::vector<int16_t> sum16, sum32;
};
Rows quantize_rows(const uint16_t* x, int64_t n, int64_t in, bool per32, bool per256);

// Rows [r0, r0 + rows) of the 64-output group gd (its tiles [block][4]) in a
// 32-weight format, over all `blocks`, into acc [n][4 tiles][16] (their rows).
void legacy_group(int64_t type, const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, int64_t rows,
                  float* acc);
// All n rows of a K-quant group, into acc [n][4 tiles][16], which must start at 0.
void k_group(int64_t type, const uint8_t* gd, int64_t blocks, const Rows& x, float* acc);

#define VS_I8_INLINE inline __attribute__((always_inline))

// Four int8 values of x as the broadcast operand of VPDPBUSD.
VS_I8_INLINE __m512i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

}  // namespace vs::i8
