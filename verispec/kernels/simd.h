// Small AVX-512 helpers shared by the kernels: exact bf16 widening, torch's
// round-to-nearest-even narrowing, a vector exp.
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstdint>

namespace vs {

constexpr int kLanes = 16;

inline __m512 load_lanes(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load_lanes(const at::BFloat16* p) {
  // bf16 is the top half of a float32: widening is a 16-bit shift, exact.
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline void store_lanes(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

inline __m256i narrow_bf16(__m512 v);

inline void store_lanes(at::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow_bf16(v));
}

// exp on 16 lanes: 2^n * P(r), n = round(x / ln 2), r = x - n ln 2 in two parts
// (Cody-Waite), P a degree-6 Taylor polynomial; a few ulp on [-87, 88]. Below
// -87 the result flushes to 0, above 88 it saturates at exp(88) (finite).
inline __m512 exp_lanes(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(~tiny, p, _mm512_castsi512_ps(e));
}

// tanh on 16 lanes as sign(x) (1 - e) / (1 + e), e = exp(-2|x|): a few ulp of 1
// in absolute error, exactly odd, and the same bits for a lane whatever its
// neighbours (Gemma 2's soft-capping of attention scores).
inline __m512 tanh_lanes(__m512 x) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
  const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(_mm512_set1_epi32((int)0x80000000u), _mm512_castps_si512(x)));
  const __m512 e = exp_lanes(_mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
  const __m512 t = _mm512_div_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), e), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), _mm512_castps_si512(sign)));
}

// Masked variants for a tail of `count` <= 16 lanes.
inline __mmask16 tail_mask(int64_t count) { return (__mmask16)((1u << count) - 1); }

// c10::BFloat16's rule in integer steps: round to nearest even, any NaN to 0x7fc0.
inline __m256i narrow_bf16_exact(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}

// The bf16 bits of 16 lanes by c10::BFloat16's rule, so matmul outputs match torch's
// float32 -> bf16 cast. VCVTNEPS2BF16 rounds to nearest even too, but reads denormals
// as zero and keeps a NaN's payload; a vector holding either (VFPCLASSPS: QNaN, SNaN,
// denormal) takes the integer steps. Checked equal on all 2^32 inputs
// (docs/notebook/quant_i8_kquant.md, round 13); a third of the integer steps' time.
inline __m256i narrow_bf16(__m512 v) {
  if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0xA1) != 0, 0)) return narrow_bf16_exact(v);
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
}

// Up to 16 outputs rounded to bf16 by narrow_bf16, stored at element `at` as bf16 bits in
// y, or (y null) as those values in float32 in yf: what .float() of the bf16 output holds,
// without a second pass over a wide output (the logits).
inline void store_outputs(uint16_t* y, float* yf, int64_t at, __mmask16 m, __m512 v) {
  const __m256i bits = narrow_bf16(v);
  if (y != nullptr) {
    _mm256_mask_storeu_epi16(y + at, m, bits);
  } else {
    _mm512_mask_storeu_ps(yf + at, m, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)));
  }
}

inline __m512 load_lanes(const at::BFloat16* p, __mmask16 m) {
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 load_lanes(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

// The float32 value of v rounded to bf16 (ties to even), for ops that round in
// the model dtype between steps as eager PyTorch does.
inline __m512 round_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                                     _mm512_set1_epi32((int)0xffff0000u));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), nan, v);
}

inline void store_lanes(at::BFloat16* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, narrow_bf16(v));
}

}  // namespace vs
