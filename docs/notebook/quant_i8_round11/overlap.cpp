// Does a VPDPBUSD loop overlap a PREFETCHT1 stream? One thread walks a 1 GiB buffer 640 bytes
// (10 lines) a step: PREFETCHT1 of the lines 8 KiB ahead, then 10 zmm loads of the step's own
// lines, each the operand of `n / 10` VPDPBUSDs over 16 accumulators. Variants:
//   Mode 0 T1 8K (as above), 1 none (hardware prefetchers only), 2 compute only (the loads from a
//   640-byte buffer, no stream), 3 T0 8K ahead, 4 T1 32K ahead, 5 T1 2K ahead, 6 NTA 8K ahead.
// Prints ns per step, best of 3 passes over the buffer for each variant (results.log).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
using clk = std::chrono::steady_clock;
template <int N, int Mode>
__attribute__((noinline)) double run(const char* buf, size_t bytes, const char* small, __m512i* sink) {
  constexpr int per = N / 10;
  __m512i acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i x = _mm512_set1_epi8(3);
  const size_t steps = (bytes - 16384) / 640;
  auto t = clk::now();
  for (size_t s = 0; s < steps; ++s) {
    const char* p = Mode == 2 ? small : buf + 640 * s;
    if (Mode == 0) for (int l = 0; l < 10; ++l) _mm_prefetch(buf + 640 * s + 8192 + 64 * l, _MM_HINT_T1);
    if (Mode == 3) for (int l = 0; l < 10; ++l) _mm_prefetch(buf + 640 * s + 8192 + 64 * l, _MM_HINT_T0);
    if (Mode == 4) for (int l = 0; l < 10; ++l) _mm_prefetch(buf + 640 * s + 32768 + 64 * l, _MM_HINT_T1);
    if (Mode == 5) for (int l = 0; l < 10; ++l) _mm_prefetch(buf + 640 * s + 2048 + 64 * l, _MM_HINT_T1);
    if (Mode == 6) for (int l = 0; l < 10; ++l) _mm_prefetch(buf + 640 * s + 8192 + 64 * l, _MM_HINT_NTA);
#pragma GCC unroll 10
    for (int l = 0; l < 10; ++l) {
      const __m512i w = _mm512_load_si512(p + 64 * l);
      if (per == 0) { acc[l] = _mm512_add_epi32(acc[l], w); continue; }
#pragma GCC unroll 32
      for (int k = 0; k < per; ++k) acc[(l * per + k) % 16] = _mm512_dpbusd_epi32(acc[(l * per + k) % 16], w, x);
    }
  }
  double ns = std::chrono::duration<double, std::nano>(clk::now() - t).count() / steps;
  for (int i = 1; i < 16; ++i) acc[0] = _mm512_add_epi32(acc[0], acc[i]);
  *sink = acc[0];
  return ns;
}
template <int N> void row(const char* buf, size_t bytes, const char* small, double ghz) {
  __m512i sink; double best[7] = {1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9};
  for (int rep = 0; rep < 3; ++rep) {
    double r[7] = {run<N, 0>(buf, bytes, small, &sink), run<N, 1>(buf, bytes, small, &sink), run<N, 2>(buf, bytes, small, &sink),
                   run<N, 3>(buf, bytes, small, &sink), run<N, 4>(buf, bytes, small, &sink), run<N, 5>(buf, bytes, small, &sink),
                   run<N, 6>(buf, bytes, small, &sink)};
    for (int i = 0; i < 7; ++i) if (r[i] < best[i]) best[i] = r[i];
  }
  printf("n=%3d | compute only %5.1f | T1 8K %5.1f | none %5.1f | T0 8K %5.1f | T1 32K %5.1f | T1 2K %5.1f | NTA 8K %5.1f ns/step (%.2f GHz)\n",
         N, best[2], best[0], best[1], best[3], best[4], best[5], best[6], ghz);
  fflush(stdout);
}
int main() {
  const size_t bytes = size_t(1) << 30;
  char* buf = static_cast<char*>(aligned_alloc(2 << 20, bytes));
  std::memset(buf, 1, bytes);
  alignas(64) static char small[640];
  std::memset(small, 2, sizeof small);
  // clock: dependent IMUL chain, 3 cycles a step
  uint64_t v = 3; auto t = clk::now();
  for (long i = 0; i < 100000000; ++i) asm volatile("imul %0, %0" : "+r"(v));
  const double ghz = 3e8 / std::chrono::duration<double, std::nano>(clk::now() - t).count();
  row<0>(buf, bytes, small, ghz);
  row<40>(buf, bytes, small, ghz);
  row<80>(buf, bytes, small, ghz);
  row<120>(buf, bytes, small, ghz);
  row<160>(buf, bytes, small, ghz);
  row<240>(buf, bytes, small, ghz);
}
