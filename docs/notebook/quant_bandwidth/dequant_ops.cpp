#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <vector>
#include <ctime>
// Variants of the Q4_K row dequantization of verispec/kernels/quant_blocks.h, one row
// (R = 1) x 4 tiles, on an L2-resident group: GB/s of tile-block bytes.
//   g++ -O3 -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -o dequant_ops dequant_ops.cpp
//   ./dequant_ops 4 8 200      # V0..V7 (see row<V>)
//   ./dequant_ops 4 8 100 r    # microseconds per group set for R rows x T tiles per sweep
// The weights are arbitrary bytes (the values do not matter to the timing).
#define VI inline __attribute__((always_inline))
VI __m512 halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
VI __m512 u8_lanes(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p))); }
VI void spread(__m512 v, __m512* a, __m512* b) {
  *a = _mm512_permutexvar_ps(_mm512_set_epi32(7,7,6,6,5,5,4,4,3,3,2,2,1,1,0,0), v);
  *b = _mm512_permutexvar_ps(_mm512_set_epi32(15,15,14,14,13,13,12,12,11,11,10,10,9,9,8,8), v);
}
VI __m512 ramp(float f){return _mm512_setr_ps(f,f+1,f+2,f+3,f+4,f+5,f+6,f+7,f+8,f+9,f+10,f+11,f+12,f+13,f+14,f+15);}
struct S4 { __m512 a,b,oa,ob; };
VI S4 seg(const uint8_t* t, int s) {
  S4 r; spread(_mm512_mul_ps(halves(t), u8_lanes(t + 64 + 16 * s)), &r.a, &r.b);
  spread(_mm512_mul_ps(halves(t + 32), u8_lanes(t + 192 + 16 * s)), &r.oa, &r.ob); return r;
}
template<int V> VI __m512i row(const uint8_t* t, const S4& s, int p) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(t + 320 + 16 * p)));
  __m512 lo, hi;
  if (V == 0) { lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))); hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)); }
  if (V == 1) { lo = _mm512_permutexvar_ps(v, ramp(0)); hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), ramp(0)); }
  if (V == 2) { lo = _mm512_permutexvar_ps(v, ramp(0)); hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)); }
  if (V == 3) { lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))); hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), ramp(0)); }
  if (V == 4) { lo = _mm512_permutexvar_ps(v, ramp(0)); hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
    return _mm512_castps_si512(_mm512_add_ps(_mm512_fmsub_ps(s.b, hi, s.ob), _mm512_fmsub_ps(s.a, lo, s.oa))); }
  if (V == 5) { lo = _mm512_permutexvar_ps(v, ramp(0)); hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }
  if (V == 6) { return v; }
  if (V == 7) { lo = _mm512_permutexvar_ps(v, ramp(0)); hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
    __m256bh l = _mm512_cvtneps_pbh(_mm512_fmsub_ps(s.a, lo, s.oa)); __m256bh h = _mm512_cvtneps_pbh(_mm512_fmsub_ps(s.b, hi, s.ob));
    return _mm512_inserti64x4(_mm512_castsi256_si512((__m256i)l), (__m256i)h, 1); }
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_fmsub_ps(s.b, hi, s.ob), _mm512_fmsub_ps(s.a, lo, s.oa));
}
constexpr int TB = 2368;
template<int V, int R, int T = 4>
void tiles(const uint8_t* gd, int64_t blocks, const uint16_t* x, float* acc, int j0 = 0) {
  __m512 c[R][T];
  for (int r=0;r<R;++r) for (int j=0;j<T;++j) c[r][j]=_mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t = gd + b * 4 * TB + j0 * TB;
    const uint16_t* xb = x + b * 256;
    for (int s = 0; s < 8; ++s) {
      S4 sc[T];
#pragma GCC unroll 4
      for (int j=0;j<T;++j) sc[j] = seg(t + j*TB, s);
      for (int p = s*16; p < (s+1)*16; ++p) {
#pragma GCC unroll 4
        for (int j=0;j<T;++j) {
          __m512bh w = (__m512bh)row<V>(t + j*TB, sc[j], p);
#pragma GCC unroll 8
          for (int r=0;r<R;++r) { int32_t bits; memcpy(&bits, xb + r*4096 + 2*p, 4);
            c[r][j] = _mm512_dpbf16_ps(c[r][j], (__m512bh)_mm512_set1_epi32(bits), w); }
        }
      }
    }
  }
  for (int r=0;r<R;++r) for (int j=0;j<T;++j) _mm512_storeu_ps(acc + (r*4+j+j0)*16, c[r][j]);
}
double now(){ timespec ts; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); return ts.tv_sec + ts.tv_nsec*1e-9; }
extern float gacc[64*8];
template<int V> double run(const uint8_t* w, int groups, int64_t blocks, const uint16_t* x, int reps) {
  float* acc = gacc; double best = 1e9;
  for (int k = 0; k < 5; ++k) { double t0 = now();
    for (int i = 0; i < reps; ++i) for (int g = 0; g < groups; ++g) tiles<V,1>(w + g * blocks * 4 * TB, blocks, x, acc);
    double dt = (now() - t0); if (dt < best) best = dt; asm volatile("" ::: "memory"); }
  return (double)groups * blocks * 4 * TB * reps / best / 1e9;
}
int main2(int, int64_t, int);
int main(int argc, char** argv) {
  int groups = atoi(argv[1]); int64_t blocks = atoi(argv[2]); int reps = atoi(argv[3]);
  if (argc > 4) return main2(groups, blocks, reps);
  std::vector<uint8_t> w(groups * blocks * 4 * TB);
  for (size_t i = 0; i < w.size(); ++i) w[i] = (i * 2654435761u) >> 13;
  for (int64_t i = 0; i < groups * blocks * 4; ++i) { for (int j = 0; j < 64; j += 2) { uint16_t h = 0x2000 + (i % 97); memcpy(&w[i*TB + j], &h, 2);} }
  std::vector<uint16_t> x(8 * 4096, 0x3f80);
  printf("V7 (2x cvtneps + insert) %.1f\n", run<7>(w.data(), groups, blocks, x.data(), reps));
  printf("V4(no cvtbf, +add) %.1f V5 (no fmsub) %.1f V6 (dp only) %.1f\n", run<4>(w.data(), groups, blocks, x.data(), reps), run<5>(w.data(), groups, blocks, x.data(), reps), run<6>(w.data(), groups, blocks, x.data(), reps));
  printf("V0 %.1f V1 %.1f V2 %.1f V3 %.1f GB/s\n", run<0>(w.data(), groups, blocks, x.data(), reps), run<1>(w.data(), groups, blocks, x.data(), reps),
         run<2>(w.data(), groups, blocks, x.data(), reps), run<3>(w.data(), groups, blocks, x.data(), reps));
}

float gacc[64*8];
template<int R, int T> double runR(const uint8_t* w, int groups, int64_t blocks, const uint16_t* x, int reps) {
  float* acc = gacc; double best = 1e9;
  for (int k = 0; k < 5; ++k) { double t0 = now();
    for (int i = 0; i < reps; ++i) for (int g = 0; g < groups; ++g) for (int j0 = 0; j0 < 4; j0 += T) tiles<2,R,T>(w + g * blocks * 4 * TB, blocks, x, acc, j0);
    double dt = (now() - t0); if (dt < best) best = dt; asm volatile("" ::: "memory"); }
  return best / reps * 1e6;
}
int main2(int groups, int64_t blocks, int reps) {
  std::vector<uint8_t> w(groups * blocks * 4 * TB);
  for (size_t i = 0; i < w.size(); ++i) w[i] = (i * 2654435761u) >> 13;
  std::vector<uint16_t> x(8 * 4096, 0x3f80);
  printf("us: R1T4 %.1f R4T4 %.1f R5T2 %.1f R5T4 %.1f R8T2 %.1f R8T4 %.1f R8T1 %.1f R6T4 %.1f\n", runR<1,4>(w.data(),groups,blocks,x.data(),reps), runR<4,4>(w.data(),groups,blocks,x.data(),reps),
    runR<5,2>(w.data(),groups,blocks,x.data(),reps), runR<5,4>(w.data(),groups,blocks,x.data(),reps), runR<8,2>(w.data(),groups,blocks,x.data(),reps), runR<8,4>(w.data(),groups,blocks,x.data(),reps), runR<8,1>(w.data(),groups,blocks,x.data(),reps), runR<6,4>(w.data(),groups,blocks,x.data(),reps));
  return 0;
}
