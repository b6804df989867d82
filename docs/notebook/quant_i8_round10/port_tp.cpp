#include <immintrin.h>
#include <chrono>
#include <cstdio>
template <class F> double t(F f) { double best = 1e9; for (int k = 0; k < 7; ++k) { auto a = std::chrono::steady_clock::now(); f(); double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count(); if (s < best) best = s; } return best; }
#define R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define BODY(OP) asm volatile( \
  OP " %%zmm16, %%zmm17, %%zmm0\n" OP " %%zmm16, %%zmm17, %%zmm1\n" OP " %%zmm16, %%zmm17, %%zmm2\n" OP " %%zmm16, %%zmm17, %%zmm3\n" \
  OP " %%zmm16, %%zmm17, %%zmm4\n" OP " %%zmm16, %%zmm17, %%zmm5\n" OP " %%zmm16, %%zmm17, %%zmm6\n" OP " %%zmm16, %%zmm17, %%zmm7\n" \
  OP " %%zmm16, %%zmm17, %%zmm8\n" OP " %%zmm16, %%zmm17, %%zmm9\n" OP " %%zmm16, %%zmm17, %%zmm10\n" OP " %%zmm16, %%zmm17, %%zmm11\n" \
  OP " %%zmm16, %%zmm17, %%zmm12\n" OP " %%zmm16, %%zmm17, %%zmm13\n" OP " %%zmm16, %%zmm17, %%zmm14\n" OP " %%zmm16, %%zmm17, %%zmm15\n" \
  ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15")
int main() {
  const long N = 10000000;
  volatile long sink;
  double chain = t([&] { long x = 3; for (long i = 0; i < N; ++i) asm volatile("imul %0, %0\n imul %0, %0\n imul %0, %0\n imul %0, %0" : "+r"(x)); sink = x; }) / (12.0 * N);
  double dp = t([&] { for (long i = 0; i < N; ++i) BODY("vpdpbusd"); }) / (16.0 * N) / chain;
  double pa = t([&] { for (long i = 0; i < N; ++i) BODY("vpaddd"); }) / (16.0 * N) / chain;
  double ml = t([&] { for (long i = 0; i < N; ++i) BODY("vpmulld"); }) / (16.0 * N) / chain;
  double fm = t([&] { for (long i = 0; i < N; ++i) BODY("vfmadd231ps"); }) / (16.0 * N) / chain;
  printf("clock %.2f GHz; cycles per instr: vpdpbusd %.2f vpaddd %.2f vpmulld %.2f vfmadd231ps %.2f\n", 1e-9 / chain, dp, pa, ml, fm);
}
