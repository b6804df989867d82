// The score sweep of attend_rows<bf16, 8> alone: 16 widened keys in L1, per query head the
// pair_dots of both halves, the transpose-and-add tree, the 16 scores stored. Cycles per
// (head, 16-key block).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstdint>
constexpr int CH = 8, kLanes = 16;
alignas(64) float kw[16][CH][kLanes];
alignas(64) float qs[48][CH][kLanes];
alignas(64) float scores[48][16 * 16];
template <class F> double best(F f) { double b = 1e9; for (int k = 0; k < 9; ++k) { auto a = std::chrono::steady_clock::now(); f(); double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count(); if (s < b) b = s; } return b; }
inline __m512 sum_half(const __m512* a) {
  __m512 s[4];
  for (int i = 0; i < 4; ++i) s[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  const __m512 t0 = _mm512_add_ps(_mm512_shuffle_ps(s[0], s[1], 0x44), _mm512_shuffle_ps(s[0], s[1], 0xEE));
  const __m512 t1 = _mm512_add_ps(_mm512_shuffle_ps(s[2], s[3], 0x44), _mm512_shuffle_ps(s[2], s[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD));
}
inline __m512 join_halves(__m512 w0, __m512 w1) { return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD)); }
// kTree: the kernel's transpose-and-add tree; else a plain add chain over the accumulators.
template <bool kTree>
__attribute__((noinline)) void head_block(int hq, int j) {
  __m512 qw[CH];
  for (int c = 0; c < CH; ++c) qw[c] = _mm512_load_ps(qs[hq][c]);
  __m512 w[2];
  for (int h = 0; h < 2; ++h) {
    __m512 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int c = 0; c < CH; ++c)
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) acc[i] = _mm512_fmadd_ps(qw[c], _mm512_load_ps(kw[8 * h + i][c]), acc[i]);
    if constexpr (kTree) {
      w[h] = sum_half(acc);
    } else {
      w[h] = acc[0];
      for (int i = 1; i < 8; ++i) w[h] = _mm512_add_ps(w[h], acc[i]);
    }
  }
  _mm512_store_ps(scores[hq] + j, kTree ? join_halves(w[0], w[1]) : _mm512_add_ps(w[0], w[1]));
}
int main() {
  for (int i = 0; i < 16; ++i) for (int c = 0; c < CH; ++c) for (int l = 0; l < 16; ++l) kw[i][c][l] = 0.01f * (i - c + l);
  for (int h = 0; h < 48; ++h) for (int c = 0; c < CH; ++c) for (int l = 0; l < 16; ++l) qs[h][c][l] = 0.02f * (h + c - l);
  const long N = 2000000; volatile long sink;
  double chain = best([&] { long x = 3; for (long i = 0; i < N; ++i) asm volatile("imul %0, %0\n imul %0, %0\n imul %0, %0\n imul %0, %0" : "+r"(x)); sink = x; }) / (12.0 * N);
  const int calls = 100000;
  double t = best([&] { for (int k = 0; k < calls; ++k) head_block<true>(k % 48, (k / 48 % 16) * 16); }) / calls;
  double f = best([&] { for (int k = 0; k < calls; ++k) head_block<false>(k % 48, (k / 48 % 16) * 16); }) / calls;
  printf("clock %.2f GHz; one head x 16 keys: %.1f cycles with the tree, %.1f with a plain add chain (128 FMAs: 64 at 2 a cycle)\n", 1e-9 / chain, t / chain, f / chain);
}
