// The integer path on AVX-VNNI (256-bit VPDPBUSD, no AVX-512): Intel's Alder Lake,
// Raptor Lake and Arrow Lake cores and their kin, where the AVX-512 module
// (build.py) cannot load. A module of its own, compiled with -mavx2 -mfma -mf16c
// -mavxvnni: quant_i8_vnni256.cpp (x rounded to int8, the driver, the store),
// quant_i8_vnni256_legacy.cpp (32-weight blocks), quant_i8_vnni256_k.cpp (K-quants),
// beside quant_i8_pack.cpp and quant_stack.cpp, which it shares with the AVX-512
// module.
//
// Same packs, same numbers. The tile layouts are quant_i8_pack.cpp's; a tile's 16
// outputs are two 32-byte halves of each 64-byte vector (outputs 0-7, then 8-15),
// and a half runs, lane for lane, the integer and float steps the AVX-512 kernels
// run on its outputs (quant_i8_legacy.cpp, quant_i8_k.cpp), in the same order: the
// integer sums are exact, and each float step is per output. So every output's bits
// equal the AVX-512 integer path's (tests/kernels/test_quant_i8_vnni256.py), and the
// row invariance of quant_i8.h holds here by the same construction.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant_i8.h"

namespace vs::i8::v256 {

constexpr int kHalves = 2 * kGroupTiles;  // 8-output halves per 64-output group
constexpr int kHalfOut = 8;

constexpr int kLegacyMaxRows = 4;  // rows a pass of the 32-weight kernels
// Rows [r0, r0 + rows) of a 32-weight-format group over all `blocks`, into acc
// [n][4 tiles][16] (their rows), which must start at 0.
void legacy_group(int64_t type, const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, int64_t rows,
                  float* acc);
// All n rows of a K-quant group, into acc [n][4 tiles][16], which must start at 0.
void k_group(int64_t type, const uint8_t* gd, int64_t blocks, const Rows& x, float* acc);

// Four int8 values of x as the broadcast operand of VPDPBUSD.
VS_I8_INLINE __m256i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Eight fp16 values, exactly widened.
VS_I8_INLINE __m256 halves8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// Half h (its 32 bits, bytes 4h..4h+3) of a 64-bit fifth-bit mask: 16 in each byte
// whose bit is set, else 0 (what the AVX-512 kernels' masked add of 16 adds).
VS_I8_INLINE __m256i sixteens(const uint8_t* mask, int h) {
  uint32_t bits;
  std::memcpy(&bits, mask + 4 * h, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// The 32 bytes of half h of the 64-byte vector at p.
VS_I8_INLINE __m256i half_of(const uint8_t* p, int h) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h)); }

}  // namespace vs::i8::v256
