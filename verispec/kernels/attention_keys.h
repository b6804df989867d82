// Scores of many (row, query head) pairs against one 16-key block, sharing the
// work of laying the keys out.
//
// attention.cpp scores a (row, head) one key at a time: 16 lanes of VDPBF16PS
// partial sums per key, then a transpose-and-add tree (sum_each) that turns 16
// such vectors into 16 scores. Here the keys are transposed instead, once per
// block for every pair that sees them: lane i of kt[c * 16 + l] is the bf16
// pair l of chunk c of key j0 + i. A pair then computes lane l of every key's
// partial sums as one vector (the same VDPBF16PS on the same operands, chunks in
// the same order) and adds those 16 vectors with the pairing of sum_each's tree:
// ((l0 + l2) + (l1 + l3)) inside each group of four, then (g0 + g1) + (g2 + g3).
// So every score has the bits sum_each gives it; only the data movement changed,
// and it is paid once per block instead of once per pair.
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace vs {

// kt[c * 16 + l] for the CH / 2 chunks of 32 bf16: keys j0 .. j0 + n - 1 of a
// prefix (row r of the block is key j0 + r), zero lanes past n.
template <int CH>
inline void transpose_keys(const at::BFloat16* keys, int64_t key_stride, int64_t j0, int64_t n, __m512i* kt) {
  for (int c = 0; c < CH / 2; ++c) {
    __m512i r[16], t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      r[i] = i < n ? _mm512_loadu_si512(keys + (j0 + i) * key_stride + c * 32) : _mm512_setzero_si512();
    }
    // In each 128-bit quarter q: t[2k], t[2k + 1] interleave dwords of keys 2k, 2k + 1;
    // u[4k + m] holds dword 4q + m of keys 4k .. 4k + 3.
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      u[4 * k + 0] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
      u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
      u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
      u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    // Quarter k of dword (4q + m) = quarter q of u[4k + m]: a 4 x 4 transpose of quarters.
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
      const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44);
      const __m512i v1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xEE);
      const __m512i v2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44);
      const __m512i v3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xEE);
      kt[c * 16 + 0 + m] = _mm512_shuffle_i32x4(v0, v2, 0x88);
      kt[c * 16 + 4 + m] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
      kt[c * 16 + 8 + m] = _mm512_shuffle_i32x4(v1, v3, 0x88);
      kt[c * 16 + 12 + m] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
  }
}

// acc + the bf16 pairs of k times the pair `dword` of q in every lane (operands as
// partial_dot has them: the product of two bf16 is exact, so their order is free).
inline __m512 dot_pair(__m512 acc, __m512bh k, const at::BFloat16* q, int dword) {
  int32_t bits;
  std::memcpy(&bits, q + 2 * dword, sizeof bits);
  return _mm512_dpbf16_ps(acc, k, (__m512bh)_mm512_set1_epi32(bits));
}

// sum[p] = lanes 4 quarter .. 4 quarter + 3 of every key's partial sums, added as
// ((l0 + l2) + (l1 + l3)), for P pairs at once so that each kt vector is loaded once.
// Not inlined: one quarter's 4 P accumulators fill the registers, and the compiler,
// given all four quarters at once, interleaves them and spills.
template <int CH, int P>
__attribute__((noinline)) void quarter_sums(const __m512i* kt, const at::BFloat16* const* q, int quarter,
                                            __m512* sum) {
  __m512 acc[P][4];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) acc[p][m] = _mm512_setzero_ps();
  }
#pragma GCC unroll 8
  for (int c = 0; c < CH / 2; ++c) {
    __m512bh k[4];
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) k[m] = (__m512bh)_mm512_load_si512(kt + c * 16 + 4 * quarter + m);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
#pragma GCC unroll 4
      for (int m = 0; m < 4; ++m) {
        acc[p][m] = dot_pair(acc[p][m], k[m], q[p], c * 16 + 4 * quarter + m);
      }
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    sum[p] = _mm512_add_ps(_mm512_add_ps(acc[p][0], acc[p][2]), _mm512_add_ps(acc[p][1], acc[p][3]));
  }
}

// out[p] = the 16 raw scores (before scale) of query q[p] against the block kt,
// lane i for key j0 + i: the quarters added as (q0 + q1) + (q2 + q3).
template <int CH, int P>
inline void transposed_scores(const __m512i* kt, const at::BFloat16* const* q, __m512* out) {
  __m512 sums[4][P];
  for (int quarter = 0; quarter < 4; ++quarter) quarter_sums<CH, P>(kt, q, quarter, sums[quarter]);
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    out[p] = _mm512_add_ps(_mm512_add_ps(sums[0][p], sums[1][p]), _mm512_add_ps(sums[2][p], sums[3][p]));
  }
}

}  // namespace vs
