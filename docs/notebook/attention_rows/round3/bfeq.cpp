// Issue 40 attention round 3: is VDPBF16PS exactly fma(even, fma(odd, acc)) under DAZ and FTZ on this CPU? (g++ -O1 -march=native bfeq.cpp)
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <random>
// Is VDPBF16PS exactly fma(odd) then fma(even) under DAZ/FTZ on this CPU?
__attribute__((target("avx512bf16,avx512f,fma"))) int main() {
  std::mt19937_64 rng(1);
  long diffs = 0, total = 0, diffs_noftz = 0;
  auto rnd_bf16 = [&](int mode) -> uint16_t {
    uint16_t sign = (rng() & 1) << 15;
    int e;
    if (mode == 0) e = 127 + (int)(rng() % 16) - 8;           // ordinary
    else if (mode == 1) e = (int)(rng() % 40);                  // tiny, incl. denormal (e=0)
    else e = 127 + (int)(rng() % 60) - 30;
    uint16_t m = rng() & 0x7F;
    return sign | (uint16_t)(e << 7) | m;
  };
  const unsigned csr = _mm_getcsr();
  for (int it = 0; it < 4000000; ++it) {
    int mode = it % 3;
    alignas(64) uint16_t a[32], b[32];
    alignas(64) float acc0[16];
    for (int i = 0; i < 32; ++i) { a[i] = rnd_bf16(mode); b[i] = rnd_bf16(mode == 1 ? 0 : mode); }
    for (int i = 0; i < 16; ++i) { uint32_t bits = (uint32_t)rnd_bf16(mode) << 16 | (rng() & 0xFFFF); memcpy(&acc0[i], &bits, 4); if (mode == 1 && (rng() & 1)) acc0[i] = 0.0f; }
    __m512 acc = _mm512_load_ps(acc0);
    __m512i va = _mm512_load_si512(a), vb = _mm512_load_si512(b);
    __m512 ref = _mm512_dpbf16_ps(acc, (__m512bh)va, (__m512bh)vb);
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 a_odd = _mm512_castsi512_ps(_mm512_and_si512(va, hi)), b_odd = _mm512_castsi512_ps(_mm512_and_si512(vb, hi));
    __m512 a_even = _mm512_castsi512_ps(_mm512_slli_epi32(va, 16)), b_even = _mm512_castsi512_ps(_mm512_slli_epi32(vb, 16));
    _mm_setcsr(csr | 0x8040);  // FTZ | DAZ
    asm volatile("" : "+v"(acc), "+v"(a_odd), "+v"(a_even) :: "memory");
    __m512 got = _mm512_fmadd_ps(a_even, b_even, _mm512_fmadd_ps(a_odd, b_odd, acc));
    asm volatile("" : "+v"(got) :: "memory");
    _mm_setcsr(csr);
    __m512 acc2 = acc; asm volatile("" : "+v"(acc2), "+v"(b_odd) :: "memory");
    __m512 got2 = _mm512_fmadd_ps(a_even, b_even, _mm512_fmadd_ps(a_odd, b_odd, acc2));
    __mmask16 ne = _mm512_cmpneq_epi32_mask(_mm512_castps_si512(ref), _mm512_castps_si512(got));
    __mmask16 ne2 = _mm512_cmpneq_epi32_mask(_mm512_castps_si512(ref), _mm512_castps_si512(got2));
    diffs += __builtin_popcount(ne); diffs_noftz += __builtin_popcount(ne2); total += 16;
    if (ne && diffs < 5) {
      int i = __builtin_ctz(ne); float r[16], g[16]; _mm512_storeu_ps(r, ref); _mm512_storeu_ps(g, got);
      printf("lane %d mode %d: ref %a got %a acc %a a %04x %04x b %04x %04x\n", i, mode, r[i], g[i], acc0[i], a[2*i], a[2*i+1], b[2*i], b[2*i+1]);
    }
  }
  printf("%ld of %ld lanes differ with DAZ/FTZ; %ld without\n", diffs, total, diffs_noftz);
}
