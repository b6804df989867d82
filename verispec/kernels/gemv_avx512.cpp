// The AVX-512-BF16 driver of the bf16 matmul, for CPUs without AMX (AMD Zen 4
// and 5, Intel Cooper Lake), or with VERISPEC_MATMUL=avx512.
//
// Lanes are outputs: VDPBF16PS(acc[r][j], broadcast(x[r, 2p], x[r, 2p + 1]), row p
// of tile j) adds, for the 16 outputs of tile j, the pair's two products. That is
// one step of the per-element sequence in matmul.h: an fp32 accumulator from 0,
// k pairs in increasing order, + bias, one rounding to bf16.
//
// A pass keeps R <= 6 rows x 4 tiles of accumulators in registers (24 zmm, with 4
// weight rows and a broadcast: 29 of 32). More rows take several passes over one
// k chunk, which stays in L2 (a dense chunk) or L1 (a dequantized one); between
// chunks the accumulators are parked in memory, and a float32 store and reload is
// exact. So DRAM sees each weight once for any row count, and neither the row
// split, the row count nor the thread split can reach a row's bits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "matmul.h"
#include "simd.h"

namespace vs {
namespace {

constexpr int kMaxRows = 6;
constexpr int64_t kDenseSpan = 32;  // k tiles (128 KiB) of a dense group per chunk when several passes run
// k tiles (64 KiB) of a dense stream requested ahead: of 4, 8 and 16, 16 kept the
// most DRAM reads in flight on a Zen 5 core (docs/quant_kernels.md).
constexpr int64_t kAhead = 16;

inline __m512bh pair_of(const uint16_t* p) {
  int32_t bits;
  std::memcpy(&bits, p, 4);
  return (__m512bh)_mm512_set1_epi32(bits);
}

template <int R>
void pass(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k_tiles, float* acc, bool first,
          bool prefetch) {
  __m512 c[R][kGroupTiles];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < kGroupTiles; ++j) {
      c[r][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (r * kGroupTiles + j) * kTileOut);
    }
  }
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    const uint16_t* wk = w + kt * kStepElems;
    const uint16_t* xk = x + kt * kTileK;
    // A dense stream spans pages the hardware prefetcher stops at (see matmul_amx).
    const char* ahead = reinterpret_cast<const char*>(wk + kAhead * kStepElems);
    for (int p = 0; p < kTileK / 2; ++p) {
      if (prefetch) {
        _mm_prefetch(ahead + p * 256, _MM_HINT_T0);
        _mm_prefetch(ahead + p * 256 + 64, _MM_HINT_T0);
        _mm_prefetch(ahead + p * 256 + 128, _MM_HINT_T0);
        _mm_prefetch(ahead + p * 256 + 192, _MM_HINT_T0);
      }
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wk + p * kTileK);
      const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wk + kTileElems + p * kTileK);
      const __m512bh w2 = (__m512bh)_mm512_loadu_si512(wk + 2 * kTileElems + p * kTileK);
      const __m512bh w3 = (__m512bh)_mm512_loadu_si512(wk + 3 * kTileElems + p * kTileK);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m512bh a = pair_of(xk + r * ldx + 2 * p);
        c[r][0] = _mm512_dpbf16_ps(c[r][0], a, w0);
        c[r][1] = _mm512_dpbf16_ps(c[r][1], a, w1);
        c[r][2] = _mm512_dpbf16_ps(c[r][2], a, w2);
        c[r][3] = _mm512_dpbf16_ps(c[r][3], a, w3);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < kGroupTiles; ++j) _mm512_storeu_ps(acc + (r * kGroupTiles + j) * kTileOut, c[r][j]);
  }
}

using PassFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, bool, bool);
constexpr PassFn kPasses[kMaxRows + 1] = {nullptr, pass<1>, pass<2>, pass<3>, pass<4>, pass<5>, pass<6>};

}  // namespace

// Tiles outer, rows inner, the arguments in locals: at eight rows the loop's own
// bookkeeping (the fields reloaded after every store) was most of this function's time.
void store_group(const MatmulArgs& a, int64_t g, const float* acc) {
  const int64_t n = a.n, out = a.out;
  const float* const bias = a.bias;
  uint16_t* const y = a.y;
  float* const yf = a.yf;
  for (int j = 0; j < kGroupTiles && g * kGroupOut + j * kTileOut < out; ++j) {
    const int64_t o = g * kGroupOut + j * kTileOut;
    const __mmask16 mask = tail_mask(std::min<int64_t>(kTileOut, out - o));
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + o) : _mm512_setzero_ps();
    for (int64_t r = 0; r < n; ++r) {
      __m512 v = _mm512_loadu_ps(acc + r * kGroupOut + j * kTileOut);
      if (bias) v = _mm512_add_ps(v, b);  // never + 0: that would turn -0 into +0
      store_outputs(y, yf, r * out + o, mask, v);
    }
  }
}

void matmul_avx512(const MatmulArgs& a, const ChunkFn& chunk) {
  const int64_t passes = (a.n + kMaxRows - 1) / kMaxRows;
  const bool dense = a.chunk_tiles == 0;
  const int64_t span = dense ? (passes == 1 ? a.k_tiles : kDenseSpan) : a.chunk_tiles;
  at::parallel_for(0, a.groups, a.grain, [&](int64_t g0, int64_t g1) {
    std::vector<float> acc(a.n * kGroupOut);  // [n][4 tiles][16]
    std::vector<uint16_t> buf(dense ? 0 : span * kStepElems);
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t kt0 = 0; kt0 < a.k_tiles; kt0 += span) {
        const int64_t count = std::min(span, a.k_tiles - kt0);
        const uint16_t* w = chunk(g, kt0, count, buf.data());
        for (int64_t b = 0; b < passes; ++b) {  // balanced passes of at most kMaxRows rows
          const int64_t r0 = b * a.n / passes, r1 = (b + 1) * a.n / passes;
          kPasses[r1 - r0](a.x + r0 * a.ldx + kt0 * kTileK, a.ldx, w, count, acc.data() + r0 * kGroupOut,
                           kt0 == 0, dense);
        }
      }
      store_group(a, g, acc.data());
    }
  });
}

}  // namespace vs
