// Standalone copy of the Q4_K integer kernel's inner structure, for A/B of register use.
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#define INL inline __attribute__((always_inline))
constexpr int kGroupOut = 64, kTileOut = 16, kGroupTiles = 4;
constexpr int64_t tb = 2368;
template <int R> struct XBlock { const int8_t* q[R]; const int16_t* sums[R]; float d[R]; };
INL __m512i bcast4(const void* p) { int32_t v; std::memcpy(&v, p, 4); return _mm512_set1_epi32(v); }
INL __m512i load(const uint8_t* p) { return _mm512_loadu_si512(p); }
INL __m512 halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
INL __m512i dp_mem(__m512i acc, __m512i w, const void* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t*)p));
  return acc;
}
template <int R, int T>
INL void scale_into(const uint8_t* t0, const __m512i (&total)[R][T], const XBlock<R>& x, float* acc) {
  for (int j = 0; j < T; ++j) {
    const __m512 dw = halves(t0 + j * tb);
    for (int r = 0; r < R; ++r) {
      float* a = acc + r * kGroupOut + j * kTileOut;
      const __m512 step = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[r]));
      _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[r][j]), step, _mm512_loadu_ps(a)));
    }
  }
}
template <int R, int T>
INL void mins_into(const uint8_t* t0, const XBlock<R>& x, float* acc) {
  for (int j = 0; j < T; ++j) {
    const uint8_t* t = t0 + j * tb;
    __m512i mins[4];
    for (int p = 0; p < 4; ++p) mins[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(t + 192 + 32 * p)));
    const __m512 dmin = halves(t + 32);
    for (int r = 0; r < R; ++r) {
      __m512i msum = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) msum = _mm512_dpwssd_epi32(msum, mins[p], bcast4(x.sums[r] + 2 * p));
      float* a = acc + r * kGroupOut + j * kTileOut;
      const __m512 step = _mm512_mul_ps(dmin, _mm512_set1_ps(x.d[r]));
      _mm512_storeu_ps(a, _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), step, _mm512_loadu_ps(a)));
    }
  }
}
// V0: as in the repo.
template <int R, int T>
void v0(const uint8_t* t0, const XBlock<R>& x, float* acc) {
  const __m512i low4 = _mm512_set1_epi8(15);
  __m512i total[R][T];
  for (int s = 0; s < 8; ++s) {
    __m512i part[R][T];
    for (int r = 0; r < R; ++r) for (int j = 0; j < T; ++j) part[r][j] = _mm512_setzero_si512();
    for (int v = 0; v < 4; ++v) {
      for (int j = 0; j < T; ++j) {
        const uint8_t* t = t0 + j * tb;
        const __m512i w = load(t + 320 + 64 * (4 * s + v));
        __m512i lo = _mm512_and_si512(w, low4), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
        for (int r = 0; r < R; ++r) {
          part[r][j] = _mm512_dpbusd_epi32(part[r][j], lo, bcast4(x.q[r] + 32 * s + 4 * v));
          part[r][j] = _mm512_dpbusd_epi32(part[r][j], hi, bcast4(x.q[r] + 32 * s + 16 + 4 * v));
        }
      }
    }
    for (int j = 0; j < T; ++j) {
      const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(t0 + j * tb + 64 + 16 * s)));
      for (int r = 0; r < R; ++r) {
        const __m512i scaled = _mm512_mullo_epi32(part[r][j], sc);
        total[r][j] = s == 0 ? scaled : _mm512_add_epi32(total[r][j], scaled);
      }
    }
  }
  scale_into<R, T>(t0, total, x, acc);
  mins_into<R, T>(t0, x, acc);
}
// V1: super-block totals in memory; embedded broadcasts (MEM) or not.
template <int R, int T, bool MEM>
void v1(const uint8_t* t0, const XBlock<R>& x, float* acc, const char* pf = nullptr, int per_s = 0) {
  const __m512i low4 = _mm512_set1_epi8(15);
  alignas(64) int32_t tot[R][T][16];
  for (int s = 0; s < 8; ++s) {
    if (pf) for (int l = 0; l < per_s; ++l) _mm_prefetch(pf + 64 * (s * per_s + l), _MM_HINT_T0);
    __m512i part[R][T];
    for (int r = 0; r < R; ++r) for (int j = 0; j < T; ++j) part[r][j] = _mm512_setzero_si512();
    for (int v = 0; v < 4; ++v) {
      __m512i lo[T], hi[T];
      for (int j = 0; j < T; ++j) {
        const __m512i w = load(t0 + j * tb + 320 + 64 * (4 * s + v));
        lo[j] = _mm512_and_si512(w, low4); hi[j] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* p0 = x.q[r] + 32 * s + 4 * v; const int8_t* p1 = p0 + 16;
        if constexpr (MEM) {
          for (int j = 0; j < T; ++j) { part[r][j] = dp_mem(part[r][j], lo[j], p0); part[r][j] = dp_mem(part[r][j], hi[j], p1); }
        } else {
          const __m512i b0 = bcast4(p0), b1 = bcast4(p1);
          for (int j = 0; j < T; ++j) { part[r][j] = _mm512_dpbusd_epi32(part[r][j], lo[j], b0); part[r][j] = _mm512_dpbusd_epi32(part[r][j], hi[j], b1); }
        }
      }
    }
    for (int j = 0; j < T; ++j) {
      const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(t0 + j * tb + 64 + 16 * s)));
      for (int r = 0; r < R; ++r) {
        const __m512i scaled = _mm512_mullo_epi32(part[r][j], sc);
        __m512i* tp = (__m512i*)tot[r][j];
        _mm512_store_si512(tp, s == 0 ? scaled : _mm512_add_epi32(_mm512_load_si512(tp), scaled));
      }
    }
  }
  __m512i total[R][T];
  for (int r = 0; r < R; ++r) for (int j = 0; j < T; ++j) total[r][j] = _mm512_load_si512((__m512i*)tot[r][j]);
  scale_into<R, T>(t0, total, x, acc);
  mins_into<R, T>(t0, x, acc);
}
template <int V, int R, int T>
double bench(const uint8_t* tiles, const XBlock<R>& xb, float* acc, long iters) {
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < iters; ++i) {
    for (int j0 = 0; j0 < kGroupTiles; j0 += T) {
      if constexpr (V == 0) v0<R, T>(tiles + j0 * tb, xb, acc + j0 * kTileOut);
      else if constexpr (V == 1) v1<R, T, false>(tiles + j0 * tb, xb, acc + j0 * kTileOut);
      else v1<R, T, true>(tiles + j0 * tb, xb, acc + j0 * kTileOut);
    }
    asm volatile("" ::: "memory");
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count() / iters;  // per 64 x 256 weights
}

constexpr int64_t kBlockBytes = 4 * tb;
// Stream a big pack: blocks of 4 tiles, each swept by R rows (V: kernel variant; PF: prefetch scheme).
template <int PF>
double stream_2x4(const uint8_t* pack, int64_t blocks, const XBlock<4>& xa, const XBlock<4>& xb, float* acc, int64_t ahead) {
  constexpr int T = 2, sweeps = 2;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = pack + b * kBlockBytes;
    const char* next = (const char*)(block + ahead);
    if constexpr (PF == 3) {
      constexpr int per_s = (kBlockBytes / 64 + 8 * sweeps - 1) / (8 * sweeps);
      for (int j0 = 0; j0 < 4; j0 += T) v1<4, T, false>(block + j0 * tb, xa, acc + j0 * kTileOut, next + (j0 / T) * 8 * per_s * 64, per_s);
      for (int j0 = 0; j0 < 4; j0 += T) v1<4, T, false>(block + j0 * tb, xb, acc + 256 + j0 * kTileOut);
    } else {
      constexpr int per_s = (kBlockBytes / 64 + 16 * sweeps - 1) / (16 * sweeps);
      for (int j0 = 0; j0 < 4; j0 += T) v1<4, T, false>(block + j0 * tb, xa, acc + j0 * kTileOut, next + (j0 / T) * 8 * per_s * 64, per_s);
      for (int j0 = 0; j0 < 4; j0 += T) v1<4, T, false>(block + j0 * tb, xb, acc + 256 + j0 * kTileOut, next + (2 + j0 / T) * 8 * per_s * 64, per_s);
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count() * 4.0e9 / (blocks * 16384.0);
}
template <int V, int R, int T, int PF>
double stream(const uint8_t* pack, int64_t blocks, const XBlock<R>& xb, float* acc, int64_t ahead) {
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = pack + b * kBlockBytes;
    if constexpr (PF == 1) {
      const char* next = (const char*)(block + ahead);
      for (int64_t line = 0; line < kBlockBytes; line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
    } else if constexpr (PF == 2) {
      const char* next = (const char*)(block + ahead);
      for (int64_t line = 0; line < kBlockBytes; line += 64) _mm_prefetch(next + line, _MM_HINT_T1);
    }
    constexpr int sweeps = kGroupTiles / T, per_s = (kBlockBytes / 64 + 8 * sweeps - 1) / (8 * sweeps);
    for (int j0 = 0; j0 < kGroupTiles; j0 += T) {
      if constexpr (V == 0) v0<R, T>(block + j0 * tb, xb, acc + j0 * kTileOut);
      else if constexpr (PF == 3) v1<R, T, false>(block + j0 * tb, xb, acc + j0 * kTileOut, (const char*)(block + ahead) + (j0 / T) * 8 * per_s * 64, per_s);
      else v1<R, T, false>(block + j0 * tb, xb, acc + j0 * kTileOut);
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count() * 4.0e9 / (blocks * 16384.0);
}
static double read_stream(const uint8_t* pack, int64_t bytes) {
  auto t0 = std::chrono::steady_clock::now();
  __m512i s = _mm512_setzero_si512();
  for (int64_t i = 0; i < bytes; i += 256) {
    s = _mm512_add_epi32(s, _mm512_loadu_si512(pack + i)); s = _mm512_add_epi32(s, _mm512_loadu_si512(pack + i + 64));
    s = _mm512_add_epi32(s, _mm512_loadu_si512(pack + i + 128)); s = _mm512_add_epi32(s, _mm512_loadu_si512(pack + i + 192));
  }
  auto t1 = std::chrono::steady_clock::now();
  volatile int sink = _mm512_reduce_add_epi32(s); (void)sink;
  return std::chrono::duration<double>(t1 - t0).count() * 4.0e9 / (bytes / double(kBlockBytes) * 16384.0);
}
int main() {
  const int64_t blocks = 20000;  // 190 MB
  uint8_t* pack = (uint8_t*)aligned_alloc(64, blocks * kBlockBytes);
  for (int64_t i = 0; i < blocks * kBlockBytes; ++i) pack[i] = (uint8_t)(i * 2654435761u >> 13);
  for (int64_t b = 0; b < blocks * 4; ++b) { uint16_t h = 0x2000; for (int i = 0; i < 32; ++i) memcpy(pack + b * tb + 2 * i, &h, 2); }
  static int8_t xq[16][256]; static int16_t sums[16][8];
  for (auto& r : xq) for (auto& v : r) v = rand() % 255 - 127;
  for (auto& r : sums) for (auto& v : r) v = rand() % 1000;
  alignas(64) static float acc[16 * 64] = {};
  XBlock<8> x8; XBlock<1> x1; XBlock<4> x4, x4b;
  for (int r = 0; r < 4; ++r) { x4b.q[r] = xq[4 + r]; x4b.sums[r] = sums[4 + r]; x4b.d[r] = 1; }
  for (int r = 0; r < 4; ++r) { x4.q[r] = xq[r]; x4.sums[r] = sums[r]; x4.d[r] = 1; }
  for (int r = 0; r < 8; ++r) { x8.q[r] = xq[r]; x8.sums[r] = sums[r]; x8.d[r] = 1; }
  x1.q[0] = xq[0]; x1.sums[0] = sums[0]; x1.d[0] = 1;
  for (int rep = 0; rep < 3; ++rep) {
    printf("read stream c/w %.4f\n", read_stream(pack, blocks * kBlockBytes));
    for (int64_t ahead : {8 << 10, 16 << 10}) {
      printf("ahead %3ldK | R1 pf3 %.4f | R4 pf3 %.4f | R8 pf3 %.4f | 2xR4 first %.4f both %.4f\n", ahead >> 10,
        stream<1,1,4,3>(pack, blocks, x1, acc, ahead), stream<1,4,2,3>(pack, blocks, x4, acc, ahead),
        stream<1,8,2,3>(pack, blocks, x8, acc, ahead), stream_2x4<3>(pack, blocks, x4, x4b, acc, ahead), stream_2x4<4>(pack, blocks, x4, x4b, acc, ahead));
    }
  }
  printf("%f\n", acc[5]);
}
