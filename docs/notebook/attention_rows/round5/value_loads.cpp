// Attention round 5: the value sweep of attend_rows<bf16, 8> (16 keys a block, widened values in L1) alone, cycles
// per head and key: GB heads per sweep, each chunk folded into every head's FMA as a load (main) or loaded once into
// a register for the GB heads ("once"). The clock comes from a dependent IMUL chain.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
alignas(64) float vw[16][8][16];
alignas(64) float p[4][300];
alignas(64) float acc[64][4][8][16];
template <class F> double best(F f) { double b = 1e9; for (int k = 0; k < 9; ++k) { auto a = std::chrono::steady_clock::now(); f(); double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count(); if (s < b) b = s; } return b; }
// kOnce: each key's chunk loaded once into a register for the GB heads (the same FMAs in the same order).
template <int GB, bool kOnce>
__attribute__((noinline)) void block(const float* pp, int stride, int j0, int n, float* accp, bool first) {
  __m512 a[GB][8];
#pragma GCC unroll 4
  for (int g = 0; g < GB; ++g)
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) a[g][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(accp + (g * 8 + c) * 16);
  for (int i = 0; i < n; ++i) {
    __m512 pj[GB];
#pragma GCC unroll 4
    for (int g = 0; g < GB; ++g) pj[g] = _mm512_set1_ps(pp[g * stride + j0 + i]);
    if constexpr (kOnce) {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        __m512 v = _mm512_load_ps(vw[i][c]);
        asm("" : "+v"(v));  // keep it in a register: one load, GB FMAs
#pragma GCC unroll 4
        for (int g = 0; g < GB; ++g) a[g][c] = _mm512_fmadd_ps(pj[g], v, a[g][c]);
      }
    } else {
#pragma GCC unroll 4
      for (int g = 0; g < GB; ++g)
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) a[g][c] = _mm512_fmadd_ps(pj[g], _mm512_load_ps(vw[i][c]), a[g][c]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < GB; ++g)
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) _mm512_storeu_ps(accp + (g * 8 + c) * 16, a[g][c]);
}
int main() {
  for (int i = 0; i < 16; ++i) for (int c = 0; c < 8; ++c) for (int l = 0; l < 16; ++l) vw[i][c][l] = 0.001f * (i + c + l);
  for (int g = 0; g < 4; ++g) for (int i = 0; i < 300; ++i) p[g][i] = 0.01f * (g + 1);
  const long N = 2000000; volatile long sink;
  double chain = best([&] { long x = 3; for (long i = 0; i < N; ++i) asm volatile("imul %0, %0\n imul %0, %0\n imul %0, %0\n imul %0, %0" : "+r"(x)); sink = x; }) / (12.0 * N);
  const int calls = 200000;
  auto run = [&](auto fn, int gb, const char* name) {
    double t = best([&] { for (int k = 0; k < calls; ++k) fn(p[0], 300, (k % 16) * 16, 16, acc[k % 64][0][0], k % 16 == 0); }) / calls;
    printf("%-14s %.2f cycles per head-key (FMA bound 4)\n", name, t / chain / 16 / gb);
  };
  printf("clock %.2f GHz\n", 1e-9 / chain);
  run(block<2, false>, 2, "GB=2 as main");
  run(block<2, true>, 2, "GB=2 once");
  run(block<3, false>, 3, "GB=3 mem");
  run(block<3, true>, 3, "GB=3 once");
}
