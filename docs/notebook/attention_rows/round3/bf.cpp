// Issue 40 attention round 3: VDPBF16PS and FMA latency (one chain) and issue rate (12 chains) on this core (g++ -O2 -march=native bf.cpp).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <algorithm>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
__attribute__((noinline)) double clock_ghz(long iters) {
  long v = 3; double t = now();
  for (long i = 0; i < iters; ++i) { asm volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(v)); }
  t = now() - t; return 4.0 * 3 * iters / t / 1e9;
}
template <int N>
__attribute__((target("avx512bf16,avx512f"), noinline)) double tp(long iters) {
  __m512 a[N]; for (int i = 0; i < N; ++i) a[i] = _mm512_set1_ps(i);
  __m512bh w = (__m512bh)_mm512_set1_epi32(0x3f803f80), x = w;
  double t = now();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i) a[i] = _mm512_dpbf16_ps(a[i], w, x);
    asm volatile("" : "+v"(w));
  }
  t = now() - t;
  __m512 s = a[0]; for (int i = 1; i < N; ++i) s = _mm512_add_ps(s, a[i]);
  volatile float sink = _mm512_reduce_add_ps(s); (void)sink;
  return t / (iters * (double)N);
}
template <int N>
__attribute__((target("avx512f,fma"), noinline)) double fma(long iters) {
  __m512 a[N]; for (int i = 0; i < N; ++i) a[i] = _mm512_set1_ps(i);
  __m512 w = _mm512_set1_ps(1.0001f), x = w;
  double t = now();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i) a[i] = _mm512_fmadd_ps(a[i], w, x);
    asm volatile("" : "+v"(w));
  }
  t = now() - t;
  __m512 s = a[0]; for (int i = 1; i < N; ++i) s = _mm512_add_ps(s, a[i]);
  volatile float sink = _mm512_reduce_add_ps(s); (void)sink;
  return t / (iters * (double)N);
}
int main() {
  double ghz = 0; for (int i = 0; i < 3; ++i) ghz = std::max(ghz, clock_ghz(100000000));
  printf("clock ~%.2f GHz\n", ghz);
  auto c = [&](double s) { return s * ghz * 1e9; };
  printf("VDPBF16PS chain 1: %.2f cycles; 12 chains: %.2f cycles each\n", c(tp<1>(50000000)), c(tp<12>(10000000)));
  printf("VFMADD chain 1: %.2f cycles; 12 chains: %.2f cycles each\n", c(fma<1>(50000000)), c(fma<12>(10000000)));
}
