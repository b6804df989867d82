// The integer path's K-quants (Q4_K, Q5_K, Q6_K), with x per 256 values as llama.cpp's
// Q8_K: one super-block's whole dot product is exact in int32, and only two float
// steps follow it.
//
//   Q4_K / Q5_K: w = (d * sc_s) * q - dmin * m_s over 8 sub-blocks of 32, so
//     y += float(sum_s sc_s * I_s) * (d * d_x), then y -= float(sum_s m_s * X_s) * (dmin * d_x),
//   Q6_K: w = (d * sc_s) * (q - 32) over 16 sub-blocks of 16, so
//     y += float(sum_s sc_s * I_s - 32 * sum_s sc_s * X_s) * (d * d_x),
// where I_s = sum q * q_x over the sub-block (VPDPBUSD: unsigned weights, signed x)
// and X_s = sum q_x (from Rows). |sum_s sc_s * I_s| < 2^31 for every format: at most
// 8 * 63 * 32 * 31 * 127 (Q5_K) and 16 * 128 * 16 * 63 * 127 (Q6_K).
//
// Loop order: super-blocks outer, then the group's tiles T at a time, then the rows
// in chunks of at most kMaxRows. A super-block of a group (9-13 KiB) is read from
// DRAM once and stays in L1 for every chunk and sweep; each tile is unpacked once per
// chunk, and the float accumulators live in acc between super-blocks.

#include "quant_i8.h"
#include "quant_i8_dispatch.h"

#pragma GCC target("avx512vnni")

namespace vs::i8 {
namespace {

constexpr int kMaxRows = 8;
VS_I8_INLINE __mmask64 mask64(const uint8_t* p) {
  uint64_t m;
  std::memcpy(&m, p, 8);
  return m;
}

VS_I8_INLINE __m512i load(const uint8_t* p) { return _mm512_loadu_si512(p); }
VS_I8_INLINE __m512 halves(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// A super-block's integer sums, R x T vectors, kept in L1 rather than in registers:
// the R x T sub-block sums already fill the 32 vector registers from 8 rows, and the
// compiler, given both sets as values, spilled them inside the VPDPBUSD loop
// (docs/notebook/quant_i8_kquant.md, round 3). Here they cost one load and one store
// per sub-block.
template <int R, int T>
struct Totals {
  alignas(64) int32_t sums[R][T][16];
  VS_I8_INLINE void add(bool first, int r, int j, __m512i v) {
    auto* p = reinterpret_cast<__m512i*>(sums[r][j]);
    _mm512_store_si512(p, first ? v : _mm512_add_epi32(_mm512_load_si512(p), v));
  }
  VS_I8_INLINE __m512i at(int r, int j) const { return _mm512_load_si512(reinterpret_cast<const __m512i*>(sums[r][j])); }
};

// Q4_K / Q5_K tile: d @0, dmin @32, sc [8][16] @64, m pairs [4][16][2] @192,
// nibbles (32 vectors) @320, Q5_K's fifth bits (64 masks) @2368.
template <bool kFive, int R, int T, class Ahead>
void q45k(const uint8_t* t0, const XBlock<R>& x, float* acc, const Ahead& ahead, int64_t sweep) {
  constexpr int64_t tb = kFive ? 2880 : 2368;
  const __m512i low4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
  Totals<R, T> totals;
  for (int s = 0; s < 8; ++s) {
    ahead.issue(8 * sweep + s);
    __m512i part[R][T];
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < T; ++j) part[r][j] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      __m512i lo[T], hi[T];
      for (int j = 0; j < T; ++j) {
        const uint8_t* t = t0 + j * tb;
        const __m512i w = load(t + 320 + 64 * (4 * s + v));
        lo[j] = _mm512_and_si512(w, low4);
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
        if constexpr (kFive) {
          lo[j] = _mm512_mask_add_epi8(lo[j], mask64(t + 2368 + 8 * (8 * s + v)), lo[j], sixteen);
          hi[j] = _mm512_mask_add_epi8(hi[j], mask64(t + 2368 + 8 * (8 * s + 4 + v)), hi[j], sixteen);
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m512i x_lo = bcast4(x.q[r] + 32 * s + 4 * v), x_hi = bcast4(x.q[r] + 32 * s + 16 + 4 * v);
        for (int j = 0; j < T; ++j) {
          part[r][j] = _mm512_dpbusd_epi32(part[r][j], lo[j], x_lo);
          part[r][j] = _mm512_dpbusd_epi32(part[r][j], hi[j], x_hi);
        }
      }
    }
    for (int j = 0; j < T; ++j) {
      const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t0 + j * tb + 64 + 16 * s)));
      for (int r = 0; r < R; ++r) totals.add(s == 0, r, j, _mm512_mullo_epi32(part[r][j], sc));
    }
  }
  // Each row's x broadcasts serve the T tiles, and y is loaded and stored once for
  // both float steps (their order as above).
  __m512i mins[T][4];
  __m512 dw[T], dmin[T];
  for (int j = 0; j < T; ++j) {
    const uint8_t* t = t0 + j * tb;
    for (int p = 0; p < 4; ++p) mins[j][p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 192 + 32 * p)));
    dw[j] = halves(t);
    dmin[j] = halves(t + 32);
  }
  for (int r = 0; r < R; ++r) {
    __m512i xs[4];
    for (int p = 0; p < 4; ++p) xs[p] = bcast4(x.sums[r] + 2 * p);
    const __m512 dx = _mm512_set1_ps(x.d[r]);
    for (int j = 0; j < T; ++j) {
      __m512i msum = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) msum = _mm512_dpwssd_epi32(msum, mins[j][p], xs[p]);
      float* a = acc + r * kGroupOut + j * kTileOut;
      const __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(totals.at(r, j)), _mm512_mul_ps(dw[j], dx), _mm512_loadu_ps(a));
      _mm512_storeu_ps(a, _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin[j], dx), y));
    }
  }
}

// Q6_K tile: d @0, sc pairs [8][16][2] (int8) @32, low nibbles (32 vectors) @288,
// high 2 bits (16 vectors, one per sub-block) @2336.
template <int R, int T, class Ahead>
void q6k(const uint8_t* t0, const XBlock<R>& x, float* acc, const Ahead& ahead, int64_t sweep) {
  constexpr int64_t tb = 3360;
  const __m512i low4 = _mm512_set1_epi8(15), top2 = _mm512_set1_epi8(0x30);
  const auto pairs = [](const uint8_t* t, int g) {  // (sc_2g, sc_2g+1) per output, int16
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32 + 32 * g)));
  };
  Totals<R, T> totals;
  for (int s = 0; s < 16; ++s) {
    ahead.issue(16 * sweep + s);
    const int g = s / 2, h = s % 2;
    __m512i part[R][T];
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < T; ++j) part[r][j] = _mm512_setzero_si512();
    }
    for (int i = 0; i < 4; ++i) {
      __m512i q[T];
      for (int j = 0; j < T; ++j) {
        const uint8_t* t = t0 + j * tb;
        const __m512i w = load(t + 288 + 64 * (4 * g + i));
        const __m512i low = h ? _mm512_and_si512(_mm512_srli_epi16(w, 4), low4) : _mm512_and_si512(w, low4);
        // bits [2i + 1 : 2i] of each byte to [5:4]; what a 16-bit shift moves in
        // from the neighbouring byte lands outside [5:4], and the mask drops it.
        const __m512i hv = load(t + 2336 + 64 * s);
        const __m512i high = i == 0 ? _mm512_slli_epi16(hv, 4) : i == 1 ? _mm512_slli_epi16(hv, 2)
                                    : i == 2 ? hv : _mm512_srli_epi16(hv, 2);
        q[j] = _mm512_ternarylogic_epi32(low, high, top2, 0xF8);  // low | (high & 0x30)
      }
      for (int r = 0; r < R; ++r) {
        const __m512i xq = bcast4(x.q[r] + 16 * s + 4 * i);
        for (int j = 0; j < T; ++j) part[r][j] = _mm512_dpbusd_epi32(part[r][j], q[j], xq);
      }
    }
    for (int j = 0; j < T; ++j) {
      const __m512i both = pairs(t0 + j * tb, g);
      const __m512i sc = h ? _mm512_srai_epi32(both, 16) : _mm512_srai_epi32(_mm512_slli_epi32(both, 16), 16);
      for (int r = 0; r < R; ++r) totals.add(s == 0, r, j, _mm512_mullo_epi32(part[r][j], sc));
    }
  }
  // sum_s sc_s * X_s per row, its x broadcasts serving the T tiles; then y += float(...)
  // * (d * d_x), y loaded and stored once.
  __m512i sc[T][8];
  __m512 dw[T];
  for (int j = 0; j < T; ++j) {
    for (int g = 0; g < 8; ++g) sc[j][g] = pairs(t0 + j * tb, g);
    dw[j] = halves(t0 + j * tb);
  }
  for (int r = 0; r < R; ++r) {
    __m512i xs[8];
    for (int g = 0; g < 8; ++g) xs[g] = bcast4(x.sums[r] + 2 * g);
    const __m512 dx = _mm512_set1_ps(x.d[r]);
    for (int j = 0; j < T; ++j) {
      __m512i offset = _mm512_setzero_si512();
      for (int g = 0; g < 8; ++g) offset = _mm512_dpwssd_epi32(offset, sc[j][g], xs[g]);
      const __m512i total = _mm512_sub_epi32(totals.at(r, j), _mm512_slli_epi32(offset, 5));
      float* a = acc + r * kGroupOut + j * kTileOut;
      _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(dw[j], dx), _mm512_loadu_ps(a)));
    }
  }
}

// Tiles swept at once for R rows. The R x T sub-block accumulators and T unpacked
// vectors stay in registers (the super-block sums live in L1, Totals). One or two
// rows take a tile at a time: the group's super-block is then read front to back,
// one 2.3-3.4 KiB tile after another, where four tiles at once read four streams
// 2-3 KiB apart and ran 10-20% behind the read stream from DRAM. From 3 rows two
// tiles cost less than one, where each broadcast of x feeds a single VPDPBUSD
// (docs/notebook/quant_i8_kquant.md, rounds 3 and 5).
constexpr int tiles_for(int rows) { return rows <= 2 ? 1 : 2; }

template <int Type, int R>
void chunk(const uint8_t* block, const Rows& x, int64_t r0, int64_t b, float* acc, const char* next) {
  constexpr int T = tiles_for(R);
  constexpr int64_t tb = k_tile_bytes(Type);
  constexpr int64_t steps = (kGroupTiles / T) * (Type == 14 ? 16 : 8);
  const Ahead<(kGroupTiles * tb / 64 + steps - 1) / steps> ahead{next};
  XBlock<R> xb;
  const int64_t in = x.in, blocks = in / 256;
  for (int r = 0; r < R; ++r) {
    xb.q[r] = x.q256.data() + (r0 + r) * in + b * 256;
    xb.sums[r] = Type == 14 ? x.sum16.data() + (r0 + r) * (in / 16) + b * 16
                            : x.sum32.data() + (r0 + r) * (in / 32) + b * 8;
    xb.d[r] = x.d256[(r0 + r) * blocks + b];
  }
  for (int j0 = 0; j0 < kGroupTiles; j0 += T) {
    float* a = acc + r0 * kGroupOut + j0 * kTileOut;
    if constexpr (Type == 14) {
      q6k<R, T>(block + j0 * tb, xb, a, ahead, j0 / T);
    } else {
      q45k<Type == 13, R, T>(block + j0 * tb, xb, a, ahead, j0 / T);
    }
  }
}

template <int Type, int R>
struct Chunk {
  static void run(const uint8_t* block, const Rows& x, int64_t r0, int64_t b, float* acc, const char* next) {
    chunk<Type, R>(block, x, r0, b, acc, next);
  }
};

}  // namespace

void k_group(int64_t type, const uint8_t* gd, int64_t blocks, const Rows& x, float* acc) {
  k_dispatch<Chunk, kMaxRows>(type, gd, blocks, x, acc);
}

}  // namespace vs::i8
