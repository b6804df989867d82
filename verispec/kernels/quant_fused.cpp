// The quantized matmul for a few rows on AVX-512-BF16: each k pair's packed row
// is dequantized in registers (quant_blocks.h) and goes straight into
// VDPBF16PS, with no buffer in between. With one to four rows the buffered path
// (quant.cpp's chunks, then gemv_avx512.cpp's passes) spends more time storing
// and reloading the dequantized chunk than multiplying it.
//
// Exactness: the row a pair produces is the one dequant_tile writes, and every
// accumulator follows matmul.h's sequence (fp32 from 0, k pairs in increasing
// order, + bias, one rounding), so the bits equal the buffered and the dense
// paths' for any row count and thread split. Tiles are interleaved per pair, not
// run one after another, so that four (times the rows) accumulator chains hide
// the VDPBF16PS latency.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "matmul.h"
#include "quant_blocks.h"

namespace vs {
namespace {

// Bytes of the stream requested ahead of the dequantization.
constexpr int64_t kAheadBytes = 16 << 10;

VS_INLINE __m512bh x_pair(const uint16_t* p) {
  int32_t bits;
  std::memcpy(&bits, p, 4);
  return (__m512bh)_mm512_set1_epi32(bits);
}

// Rows [0, R) x tiles [j0, j0 + T) of one group over the whole k range.
template <class B, int R, int T>
void fused_tiles(const uint8_t* gd, int64_t blocks, const uint16_t* x, int64_t ldx, int j0, float* acc) {
  constexpr int64_t tb = B::kTileBytes;
  constexpr int segs = B::kBlock / 2 / B::kPairs;
  constexpr int64_t seg_bytes = T * tb / segs;
  // A sweep of T < 4 tiles reads T of every 4 tile blocks: it requests its own
  // tiles of a block whole blocks ahead, not the bytes that follow it.
  constexpr int64_t block_bytes = kGroupTiles * tb;
  constexpr int64_t ahead = (kAheadBytes + block_bytes - 1) / block_bytes * block_bytes;
  __m512 c[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) c[r][j] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t = gd + (b * kGroupTiles + j0) * tb;
    const uint16_t* xb = x + b * B::kBlock;
    for (int s = 0; s < segs; ++s) {
      const char* next = reinterpret_cast<const char*>(t + ahead + s * seg_bytes);
      for (int64_t line = 0; line < seg_bytes; line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
      typename B::Seg sc[T];
#pragma GCC unroll 4
      for (int j = 0; j < T; ++j) sc[j] = B::seg(t + j * tb, s);
      for (int p = s * B::kPairs; p < (s + 1) * B::kPairs; ++p) {
#pragma GCC unroll 4
        for (int j = 0; j < T; ++j) {
          const __m512bh w = (__m512bh)B::row(t + j * tb, sc[j], p);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) c[r][j] = _mm512_dpbf16_ps(c[r][j], x_pair(xb + r * ldx + 2 * p), w);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) _mm512_storeu_ps(acc + (r * kGroupTiles + j0 + j) * kTileOut, c[r][j]);
  }
}


// R rows x 4 tiles of accumulators fit the 32 registers up to R = 4; 5..8 rows
// (K blocks only: fused_rows_for_block) sweep the group's tiles two at a time,
// and each weight is still dequantized once.
template <class B, int R>
void fused_group(const uint8_t* gd, int64_t blocks, const uint16_t* x, int64_t ldx, float* acc) {
  constexpr int T = R <= 4 ? 4 : 2;
  for (int j0 = 0; j0 < kGroupTiles; j0 += T) fused_tiles<B, R, T>(gd, blocks, x, ldx, j0, acc);
}

template <class B, int... Rs>
void fused_rows(const uint8_t* gd, int64_t blocks, const uint16_t* x, int64_t ldx, int64_t n, float* acc,
                std::integer_sequence<int, Rs...>) {
  ((n == Rs + 1 ? fused_group<B, Rs + 1>(gd, blocks, x, ldx, acc) : void()), ...);
}

}  // namespace

void matmul_quant_fused(const MatmulArgs& a, const at::Tensor& packed) {
  TORCH_CHECK(a.n >= 1 && a.n <= quant_fused_limit(packed), "matmul_quant_fused: too many rows for this pack");
  at::parallel_for(0, a.groups, a.grain, [&](int64_t g0, int64_t g1) {
    alignas(64) float acc[kFusedRows * kGroupOut];
    for (int64_t g = g0; g < g1; ++g) {
      const QuantGroup q = quant_group(packed, g);
      quant::with_block(q.type, [&]<class B>() {
        fused_rows<B>(q.data, a.k_tiles * kTileK / B::kBlock, a.x, a.ldx, a.n, acc,
                      std::make_integer_sequence<int, kFusedRows>());
      });
      store_group(a, g, acc);
    }
  });
}

}  // namespace vs
