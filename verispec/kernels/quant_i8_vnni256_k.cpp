// The K-quants (Q4_K, Q5_K, Q6_K) on AVX-VNNI: quant_i8_k.cpp's super-block steps on
// 8-output halves of its tiles, in its order per output (that file's comment has the
// sums): the sub-block sums and their scaled total are exact int32, then
//   Q4_K / Q5_K: y += float(total) * (d * d_x), y -= float(sum_s m_s * X_s) * (dmin * d_x),
//   Q6_K: y += float(total - 32 * sum_s sc_s * X_s) * (d * d_x).
// Loop order as there: super-blocks outer, then the group's halves H at a time, then
// the rows in chunks of at most kMaxRows; a super-block of a group stays in L1.

#include "quant_i8_vnni256.h"
#include "quant_i8_dispatch.h"

namespace vs::i8::v256 {
namespace {

constexpr int kMaxRows = 4;

// A super-block's integer sums per row and half, in L1: the sub-block sums and the
// unpacked weights fill the 16 vector registers.
template <int R, int H>
struct Totals {
  alignas(32) int32_t sums[R][H][kHalfOut];
  VS_I8_INLINE void add(bool first, int r, int h, __m256i v) {
    auto* p = reinterpret_cast<__m256i*>(sums[r][h]);
    _mm256_store_si256(p, first ? v : _mm256_add_epi32(_mm256_load_si256(p), v));
  }
  VS_I8_INLINE __m256i get(int r, int h) const { return _mm256_load_si256(reinterpret_cast<const __m256i*>(sums[r][h])); }
};

// Half q of a group's super-block t0: its tile and which 8 of the tile's 16 outputs.
struct Half {
  const uint8_t* t;
  int side;
};
template <int Type>
VS_I8_INLINE Half half_at(const uint8_t* t0, int q) { return {t0 + (q / 2) * k_tile_bytes(Type), q % 2}; }

// y += float(total) * (d_w * d_x) for half q of R rows (acc: the chunk's rows, stride 64).
VS_I8_INLINE void scale_into(float* a, __m256i total, __m256 dw, float dx) {
  const __m256 step = _mm256_mul_ps(dw, _mm256_set1_ps(dx));
  _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), step, _mm256_loadu_ps(a)));
}

// Q4_K / Q5_K tile: d @0, dmin @32, sc [8][16] @64, m pairs [4][16][2] @192,
// nibbles (32 vectors) @320, Q5_K's fifth bits (64 masks) @2368.
template <bool kFive, int R, int H, class Ahead>
void q45k(const uint8_t* t0, int h0, const XBlock<R>& x, float* acc, const Ahead& ahead, int64_t sweep) {
  constexpr int Type = kFive ? 13 : 12;
  const __m256i low4 = _mm256_set1_epi8(15);
  Totals<R, H> totals;
  for (int s = 0; s < 8; ++s) {
    ahead.issue(8 * sweep + s);
    __m256i part[R][H];
    for (int r = 0; r < R; ++r) {
      for (int h = 0; h < H; ++h) part[r][h] = _mm256_setzero_si256();
    }
    for (int v = 0; v < 4; ++v) {
      __m256i lo[H], hi[H];
      for (int h = 0; h < H; ++h) {
        const Half at = half_at<Type>(t0, h0 + h);
        const __m256i w = half_of(at.t + 320 + 64 * (4 * s + v), at.side);
        lo[h] = _mm256_and_si256(w, low4);
        hi[h] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
        if constexpr (kFive) {
          lo[h] = _mm256_or_si256(lo[h], sixteens(at.t + 2368 + 8 * (8 * s + v), at.side));
          hi[h] = _mm256_or_si256(hi[h], sixteens(at.t + 2368 + 8 * (8 * s + 4 + v), at.side));
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m256i x_lo = bcast4(x.q[r] + 32 * s + 4 * v), x_hi = bcast4(x.q[r] + 32 * s + 16 + 4 * v);
        for (int h = 0; h < H; ++h) {
          part[r][h] = _mm256_dpbusd_avx_epi32(part[r][h], lo[h], x_lo);
          part[r][h] = _mm256_dpbusd_avx_epi32(part[r][h], hi[h], x_hi);
        }
      }
    }
    for (int h = 0; h < H; ++h) {
      const Half at = half_at<Type>(t0, h0 + h);
      const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at.t + 64 + 16 * s + 8 * at.side)));
      for (int r = 0; r < R; ++r) totals.add(s == 0, r, h, _mm256_mullo_epi32(part[r][h], sc));
    }
  }
  for (int h = 0; h < H; ++h) {
    const Half at = half_at<Type>(t0, h0 + h);
    const __m256 dw = halves8(at.t + 16 * at.side);
    for (int r = 0; r < R; ++r) scale_into(acc + r * kGroupOut + kHalfOut * (h0 + h), totals.get(r, h), dw, x.d[r]);
  }
  for (int h = 0; h < H; ++h) {
    const Half at = half_at<Type>(t0, h0 + h);
    __m256i mins[4];
    for (int p = 0; p < 4; ++p) {
      mins[p] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at.t + 192 + 32 * p + 16 * at.side)));
    }
    const __m256 dmin = halves8(at.t + 32 + 16 * at.side);
    for (int r = 0; r < R; ++r) {
      __m256i msum = _mm256_setzero_si256();
      for (int p = 0; p < 4; ++p) msum = _mm256_dpwssd_avx_epi32(msum, mins[p], bcast4(x.sums[r] + 2 * p));
      float* a = acc + r * kGroupOut + kHalfOut * (h0 + h);
      const __m256 step = _mm256_mul_ps(dmin, _mm256_set1_ps(x.d[r]));
      _mm256_storeu_ps(a, _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), step, _mm256_loadu_ps(a)));
    }
  }
}

// Q6_K tile: d @0, sc pairs [8][16][2] (int8) @32, low nibbles (32 vectors) @288,
// high 2 bits (16 vectors, one per sub-block) @2336.
template <int R, int H, class Ahead>
void q6k(const uint8_t* t0, int h0, const XBlock<R>& x, float* acc, const Ahead& ahead, int64_t sweep) {
  const __m256i low4 = _mm256_set1_epi8(15), top2 = _mm256_set1_epi8(0x30);
  const auto pairs = [](const Half& at, int g) {  // (sc_2g, sc_2g+1) per output, int16
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at.t + 32 + 32 * g + 16 * at.side)));
  };
  Totals<R, H> totals;
  for (int s = 0; s < 16; ++s) {
    ahead.issue(16 * sweep + s);
    const int g = s / 2, odd = s % 2;
    __m256i part[R][H];
    for (int r = 0; r < R; ++r) {
      for (int h = 0; h < H; ++h) part[r][h] = _mm256_setzero_si256();
    }
    for (int i = 0; i < 4; ++i) {
      __m256i q[H];
      for (int h = 0; h < H; ++h) {
        const Half at = half_at<14>(t0, h0 + h);
        const __m256i w = half_of(at.t + 288 + 64 * (4 * g + i), at.side);
        const __m256i low = odd ? _mm256_and_si256(_mm256_srli_epi16(w, 4), low4) : _mm256_and_si256(w, low4);
        // bits [2i + 1 : 2i] of each byte to [5:4]; what a 16-bit shift moves in
        // from the neighbouring byte lands outside [5:4], and the mask drops it.
        const __m256i hv = half_of(at.t + 2336 + 64 * s, at.side);
        const __m256i high = i == 0 ? _mm256_slli_epi16(hv, 4) : i == 1 ? _mm256_slli_epi16(hv, 2)
                                    : i == 2 ? hv : _mm256_srli_epi16(hv, 2);
        q[h] = _mm256_or_si256(low, _mm256_and_si256(high, top2));
      }
      for (int r = 0; r < R; ++r) {
        const __m256i xr = bcast4(x.q[r] + 16 * s + 4 * i);
        for (int h = 0; h < H; ++h) part[r][h] = _mm256_dpbusd_avx_epi32(part[r][h], q[h], xr);
      }
    }
    for (int h = 0; h < H; ++h) {
      const __m256i both = pairs(half_at<14>(t0, h0 + h), g);
      const __m256i sc = odd ? _mm256_srai_epi32(both, 16) : _mm256_srai_epi32(_mm256_slli_epi32(both, 16), 16);
      for (int r = 0; r < R; ++r) totals.add(s == 0, r, h, _mm256_mullo_epi32(part[r][h], sc));
    }
  }
  for (int h = 0; h < H; ++h) {
    const Half at = half_at<14>(t0, h0 + h);
    __m256i sc[8];
    for (int g = 0; g < 8; ++g) sc[g] = pairs(at, g);
    const __m256 dw = halves8(at.t + 16 * at.side);
    for (int r = 0; r < R; ++r) {
      __m256i offset = _mm256_setzero_si256();  // sum_s sc_s * X_s
      for (int g = 0; g < 8; ++g) offset = _mm256_dpwssd_avx_epi32(offset, sc[g], bcast4(x.sums[r] + 2 * g));
      const __m256i total = _mm256_sub_epi32(totals.get(r, h), _mm256_slli_epi32(offset, 5));
      scale_into(acc + r * kGroupOut + kHalfOut * (h0 + h), total, dw, x.d[r]);
    }
  }
}

// Halves swept at once for R <= kMaxRows rows: R x H <= 8 sub-block accumulators
// beside the 2H unpacked vectors, within the 16 registers (8 rows of one half a
// sweep measured slower than two chunks of 4: a broadcast of x fed one VPDPBUSD).
constexpr int halves_for(int rows) { return rows == 1 ? 4 : 2; }

template <int Type, int R>
void chunk(const uint8_t* block, const Rows& x, int64_t r0, int64_t b, float* acc, const char* next) {
  constexpr int H = halves_for(R);
  constexpr int64_t steps = (kHalves / H) * (Type == 14 ? 16 : 8);
  const Ahead<(kGroupTiles * k_tile_bytes(Type) / 64 + steps - 1) / steps> ahead{next};
  XBlock<R> xb;
  const int64_t in = x.in, blocks = in / 256;
  for (int r = 0; r < R; ++r) {
    xb.q[r] = x.q256.data() + (r0 + r) * in + b * 256;
    xb.sums[r] = Type == 14 ? x.sum16.data() + (r0 + r) * (in / 16) + b * 16
                            : x.sum32.data() + (r0 + r) * (in / 32) + b * 8;
    xb.d[r] = x.d256[(r0 + r) * blocks + b];
  }
  float* a = acc + r0 * kGroupOut;
  for (int h0 = 0; h0 < kHalves; h0 += H) {
    if constexpr (Type == 14) {
      q6k<R, H>(block, h0, xb, a, ahead, h0 / H);
    } else {
      q45k<Type == 13, R, H>(block, h0, xb, a, ahead, h0 / H);
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

}  // namespace vs::i8::v256
