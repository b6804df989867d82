#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
// Throughput of independent VPDPBUSD zmm / ymm, and of VPMULLD zmm, and the add-chain clock.
template <int N>
static double run_zmm(long iters) {
  __m512i acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x05060708);
  auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    asm volatile("" : "+v"(a), "+v"(b));
  }
  auto t1 = std::chrono::steady_clock::now();
  __m512i s = acc[0];
  for (int i = 1; i < N; ++i) s = _mm512_add_epi32(s, acc[i]);
  volatile int sink = _mm512_reduce_add_epi32(s); (void)sink;
  return std::chrono::duration<double>(t1 - t0).count() / (double(iters) * N);
}
template <int N>
static double run_mullo(long iters) {
  __m512i acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm512_set1_epi32(i + 1);
  __m512i a = _mm512_set1_epi32(3);
  auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i) acc[i] = _mm512_mullo_epi32(acc[i], a);
    asm volatile("" : "+v"(a));
  }
  auto t1 = std::chrono::steady_clock::now();
  __m512i s = acc[0];
  for (int i = 1; i < N; ++i) s = _mm512_add_epi32(s, acc[i]);
  volatile int sink = _mm512_reduce_add_epi32(s); (void)sink;
  return std::chrono::duration<double>(t1 - t0).count() / (double(iters) * N);
}
static double clock_ghz(long iters) {
  uint64_t x = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < iters; ++i) { asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x)); }
  auto t1 = std::chrono::steady_clock::now();
  return 4.0 * iters / std::chrono::duration<double>(t1 - t0).count() / 1e9;
}
int main() {
  long it = 50'000'000;
  for (int rep = 0; rep < 3; ++rep) {
    double ghz = clock_ghz(500'000'000);
    double z12 = run_zmm<12>(it / 4), z16 = run_zmm<16>(it / 4), z8 = run_zmm<8>(it / 4);
    double m12 = run_mullo<12>(it / 8);
    printf("clock %.2f GHz | vpdpbusd zmm per cycle: 8acc %.2f 12acc %.2f 16acc %.2f | vpmulld zmm per cycle 12acc %.2f\n",
           ghz, 1.0 / (z8 * ghz * 1e9), 1.0 / (z12 * ghz * 1e9), 1.0 / (z16 * ghz * 1e9), 1.0 / (m12 * ghz * 1e9));
  }
}
