// Issue 40 round 9: what a TDPBSUD step costs on AMX with its tile loads, zeroing and TILESTORED (g++ -O2 -march=native seq.cpp).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <sys/syscall.h>
#include <unistd.h>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
__attribute__((noinline)) double clock_ghz(long iters) {
  long v = 3; double t = now();
  for (long i = 0; i < iters; ++i) { asm volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(v)); }
  t = now() - t; return 4.0 * 3 * iters / t / 1e9;
}
struct alignas(64) Cfg { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; };
alignas(64) static int8_t A[4][16 * 64], B[4][16 * 64];
alignas(64) static int32_t C[8][16 * 16];
template <int Mode>
__attribute__((target("amx-tile,amx-int8"), noinline)) double run(long iters, int M, int K) {
  Cfg c{}; c.palette = 1;
  for (int t = 0; t < 2; ++t) { c.rows[t] = M; c.colsb[t] = 64; c.rows[2 + t] = K / 4; c.colsb[2 + t] = 64; c.rows[4 + t] = M; c.colsb[4 + t] = K; }
  _tile_loadconfig(&c);
  _tile_zero(0); _tile_zero(1); _tile_loadd(2, B[0], 64); _tile_loadd(3, B[1], 64); _tile_loadd(4, A[0], K); _tile_loadd(5, A[1], K);
  double t = now();
  for (long i = 0; i < iters; ++i) {
    int k = i & 3;
    if (Mode & 1) { _tile_loadd(2, B[k], 64); _tile_loadd(4, A[k], K); }
    if (Mode & 2) _tile_zero(0);
    if (Mode & 8) _tile_dpbsud(0, 4, 2);
    if (Mode & 4) _tile_stored(0, C[2 * k], 64);
    if (Mode & 1) { _tile_loadd(3, B[k ^ 1], 64); _tile_loadd(5, A[k ^ 1], K); }
    if (Mode & 2) _tile_zero(1);
    if (Mode & 8) _tile_dpbsud(1, 5, 3);
    if (Mode & 4) _tile_stored(1, C[2 * k + 1], 64);
  }
  t = now() - t;
  _tile_release();
  return t / (iters * 2.0);
}
int main() {
  syscall(SYS_arch_prctl, 0x1023, 18);
  memset(A, 1, sizeof A); memset(B, 2, sizeof B);
  double ghz = 0; for (int i = 0; i < 3; ++i) ghz = std::max(ghz, clock_ghz(100000000));
  printf("clock ~%.2f GHz\n", ghz);
  int shapes[][2] = {{16, 64}, {16, 32}, {8, 32}};
  const char* names[] = {"dp only", "zero+dp", "zero+dp+store", "load+zero+dp+store", "load+dp", "store only", "load only"};
  for (auto& s : shapes) {
    double r[7];
    auto best = [&](auto f) { double a = 1e9; for (int i = 0; i < 3; ++i) a = std::min(a, f()); return a * ghz * 1e9; };
    r[0] = best([&] { return run<8>(2000000, s[0], s[1]); });
    r[1] = best([&] { return run<10>(2000000, s[0], s[1]); });
    r[2] = best([&] { return run<14>(2000000, s[0], s[1]); });
    r[3] = best([&] { return run<15>(2000000, s[0], s[1]); });
    r[4] = best([&] { return run<9>(2000000, s[0], s[1]); });
    r[5] = best([&] { return run<4>(2000000, s[0], s[1]); });
    r[6] = best([&] { return run<1>(2000000, s[0], s[1]); });
    for (int i = 0; i < 7; ++i) printf("M=%d K=%d %-22s %.1f cycles per sub-step\n", s[0], s[1], names[i], r[i]);
  }
}
