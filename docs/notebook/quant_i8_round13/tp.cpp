// Issue 40 round 13: ns per 16 lanes of the narrowing steps alone (store to L1). Same flags as
// narrow_exhaustive.cpp.
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <chrono>
template <class F> double run(F f) {
  alignas(64) static float buf[4096]; alignas(64) static uint16_t out[4096];
  for (int i = 0; i < 4096; ++i) buf[i] = (i - 2048) * 0.37f;
  auto t0 = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 100000; ++rep) {
    for (int i = 0; i < 4096; i += 16) {
      __m512 v = _mm512_load_ps(buf + i);
      _mm256_store_si256((__m256i*)(out + i), f(v));
    }
    asm volatile("" : : "r"(out), "r"(buf) : "memory");
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (100000.0 * 256);
}
int main() {
  for (int k = 0; k < 3; ++k) {
  printf("copy-narrow (vpmovdw of bits): %.3f\n", run([](__m512 v) { return _mm512_cvtepi32_epi16(_mm512_castps_si512(v)); }));
  printf("cvtneps only: %.3f\n", run([](__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }));
  printf("cvtneps+fpclass: %.3f\n", run([](__m512 v) { if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0xA1) != 0, 0)) return _mm256_setzero_si256(); return (__m256i)_mm512_cvtneps_pbh(v); }));
  printf("old: %.3f\n", run([](__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r); }));
  }
}
