// Issue 40 round 13: VCVTNEPS2BF16 with a VFPCLASSPS fallback against the integer rule on all
// 2^32 floats, then both timed. g++ -O2 -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mavx512dq
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <chrono>

static inline __m256i narrow_old(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}
static inline __m256i narrow_new(__m512 v) {
  // QNaN 0x01, SNaN 0x80, denormal 0x20
  if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0xA1) != 0, 0)) return narrow_old(v);
  return (__m256i)_mm512_cvtneps_pbh(v);
}
int main() {
  uint64_t bad = 0;
  alignas(64) uint32_t in[16];
  for (uint64_t base = 0; base < (1ull << 32); base += 16) {
    for (int i = 0; i < 16; ++i) in[i] = (uint32_t)(base + i);
    __m512 v = _mm512_load_ps((float*)in);
    __m256i a = narrow_old(v), b = narrow_new(v);
    __mmask16 ne = _mm256_cmpneq_epi16_mask(a, b);
    if (ne) { if (bad < 5) printf("differ at %llx mask %x\n", (unsigned long long)base, ne); bad += __builtin_popcount(ne); }
  }
  printf("differing lanes: %llu\n", (unsigned long long)bad);
  // throughput on ordinary values
  alignas(64) float buf[4096]; alignas(64) uint16_t out[4096];
  for (int i = 0; i < 4096; ++i) buf[i] = (i - 2048) * 0.37f;
  for (int variant = 0; variant < 2; ++variant) {
    auto t0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 100000; ++rep) {
      for (int i = 0; i < 4096; i += 16) {
        __m512 v = _mm512_load_ps(buf + i);
        asm volatile("" : "+v"(v));
        __m256i r = variant ? narrow_new(v) : narrow_old(v);
        _mm256_store_si256((__m256i*)(out + i), r);
      }
      asm volatile("" : : "r"(out) : "memory");
    }
    auto t1 = std::chrono::steady_clock::now();
    printf("%s: %.3f ns per 16 lanes\n", variant ? "new" : "old", std::chrono::duration<double, std::nano>(t1 - t0).count() / (100000.0 * 256));
  }
}
