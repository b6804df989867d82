// Throughput of VPDPBUSD zmm (independent chains) and of AMX TDPBSUD on this core.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
__attribute__((target("avx512vnni,avx512f"))) double vnni(long iters) {
  __m512i a[12]; for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  double t = now();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
    asm volatile("" : "+v"(w));
  }
  t = now() - t;
  __m512i s = a[0]; for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, a[i]);
  volatile int sink = _mm512_reduce_add_epi32(s); (void)sink;
  return t / (iters * 12.0);
}
// chain of dependent adds: one per cycle, gives the clock
__attribute__((noinline)) double clock_ghz(long iters) {
  long v = 3; double t = now();
  for (long i = 0; i < iters; ++i) { asm volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(v)); }
  t = now() - t; return 4.0 * 3 * iters / t / 1e9;
}
struct alignas(64) Cfg { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; };
__attribute__((target("amx-tile,amx-int8"))) double amx(long iters, int M, int K) {
  Cfg c{}; c.palette = 1;
  for (int t = 0; t < 4; ++t) { c.rows[t] = M; c.colsb[t] = 64; }  // C tiles: M x 16 int32
  c.rows[4] = M; c.colsb[4] = K;  // A: M x K bytes
  c.rows[5] = K / 4; c.colsb[5] = 64;  // B: K/4 x 64
  _tile_loadconfig(&c);
  alignas(64) static int8_t a[16 * 64], b[16 * 64];
  memset(a, 1, sizeof a); memset(b, 2, sizeof b);
  _tile_loadd(4, a, 64); _tile_loadd(5, b, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  double t = now();
  for (long i = 0; i < iters; ++i) { _tile_dpbsud(0, 4, 5); _tile_dpbsud(1, 4, 5); _tile_dpbsud(2, 4, 5); _tile_dpbsud(3, 4, 5); }
  t = now() - t;
  _tile_release();
  return t / (iters * 4.0);
}
int main() {
  syscall(SYS_arch_prctl, 0x1023, 18);  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  double ghz = 0; for (int i = 0; i < 3; ++i) ghz = std::max(ghz, clock_ghz(200000000));
  printf("clock ~%.2f GHz\n", ghz);
  double v = 1e9; for (int i = 0; i < 3; ++i) v = std::min(v, vnni(20000000));
  printf("VPDPBUSD zmm: %.3f ns = %.2f cycles each, %.1f MAC/cycle\n", v * 1e9, v * ghz * 1e9, 64 / (v * ghz * 1e9));
  int shapes[][2] = {{16, 64}, {8, 64}, {8, 32}, {16, 32}, {4, 32}};
  for (auto& s : shapes) {
    double a = 1e9; for (int i = 0; i < 3; ++i) a = std::min(a, amx(2000000, s[0], s[1]));
    double macs = s[0] * 16.0 * s[1];
    printf("TDPBSUD M=%d K=%d: %.2f cycles each, %.0f MAC/cycle\n", s[0], s[1], a * ghz * 1e9, macs / (a * ghz * 1e9));
  }
}
