// Issue 40 round 13: round_bf16 (float result) by VCVTNEPS2BF16 and a widening, against the
// integer steps: equal on all 2^32 floats, and slower, so not used. Same flags as narrow_exhaustive.cpp.
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <chrono>
static inline __m512 round_old(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                                     _mm512_set1_epi32((int)0xffff0000u));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), nan, v);
}
static inline __m512 round_new(__m512 v) {
  if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0xA1) != 0, 0)) return round_old(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}
template <class F> double run(F f) {
  alignas(64) static float buf[4096]; alignas(64) static float out[4096];
  for (int i = 0; i < 4096; ++i) buf[i] = (i - 2048) * 0.37f;
  auto t0 = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 50000; ++rep) {
    for (int i = 0; i < 4096; i += 16) _mm512_store_ps(out + i, f(_mm512_load_ps(buf + i)));
    asm volatile("" : : "r"(out), "r"(buf) : "memory");
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (50000.0 * 256);
}
int main() {
  uint64_t bad = 0;
  alignas(64) uint32_t in[16];
  for (uint64_t base = 0; base < (1ull << 32); base += 16) {
    for (int i = 0; i < 16; ++i) in[i] = (uint32_t)(base + i);
    __m512 v = _mm512_load_ps((float*)in);
    __mmask16 ne = _mm512_cmpneq_epi32_mask(_mm512_castps_si512(round_old(v)), _mm512_castps_si512(round_new(v)));
    bad += __builtin_popcount(ne);
  }
  printf("round: differing lanes %llu\n", (unsigned long long)bad);
  for (int k = 0; k < 3; ++k) printf("old %.3f new %.3f\n", run(round_old), run(round_new));
}
