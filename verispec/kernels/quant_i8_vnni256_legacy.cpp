// The 32-weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on AVX-VNNI: quant_i8_legacy.cpp's
// per-block steps on 8-output halves of its tiles, in its order per output:
// y += float(isum - off * sum(q_x)) * (d_w * d_x), then for the formats with a
// minimum y += m_w * (d_x * sum(q_x)).

#include "quant_i8_vnni256.h"
#include "quant_i8_dispatch.h"

namespace vs::i8::v256 {
namespace {

// Rows [0, R) x halves [h0, h0 + H) of one group over every block, into acc [R][4][16].
// The R x H integer sums fill half of the 16 vector registers; the float
// accumulators stay in acc (one load and store per 32 weights of an output).
template <int Fi, int R, int H>
void sweep(const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, int h0, float* acc) {
  constexpr Legacy f = kLegacy[Fi];
  constexpr int64_t tb = f.tile_bytes;
  constexpr int quants = f.min ? 64 : 32;  // the quants follow the fp16 scales
  constexpr int masks = quants + 256;  // Q5: after the nibbles
  constexpr int64_t ahead_blocks = ((16 << 10) + kGroupTiles * tb - 1) / (kGroupTiles * tb);
  const int j0 = h0 / 2, j1 = (h0 + H + 1) / 2;  // the tiles this sweep reads
  const int64_t in = x.in;
  const __m256i low4 = _mm256_set1_epi8(15);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t0 = gd + b * kGroupTiles * tb;
    const char* next = reinterpret_cast<const char*>(t0 + ahead_blocks * kGroupTiles * tb);
    for (int64_t line = j0 * tb; line < j1 * tb; line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = x.q32.data() + (r0 + r) * in + b * 32;
    __m256i s[R][H];
    for (int r = 0; r < R; ++r) {
      for (int h = 0; h < H; ++h) s[r][h] = _mm256_setzero_si256();
    }
    // The H halves unpacked first, then each row's broadcast of x feeds H VPDPBUSDs.
    if constexpr (f.four) {
      for (int step = 0; step < 4; ++step) {
        __m256i lo[H], hi[H];
        for (int h = 0; h < H; ++h) {
          const int q = h0 + h;
          const uint8_t* t = t0 + (q / 2) * tb;
          const __m256i v = half_of(t + quants + 64 * step, q % 2);
          lo[h] = _mm256_and_si256(v, low4);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          if constexpr (f.five) {
            lo[h] = _mm256_or_si256(lo[h], sixteens(t + masks + 8 * step, q % 2));
            hi[h] = _mm256_or_si256(hi[h], sixteens(t + masks + 8 * (step + 4), q % 2));
          }
        }
        for (int r = 0; r < R; ++r) {
          const __m256i x_lo = bcast4(xq[r] + 4 * step), x_hi = bcast4(xq[r] + 16 + 4 * step);
          for (int h = 0; h < H; ++h) {
            s[r][h] = _mm256_dpbusd_avx_epi32(s[r][h], lo[h], x_lo);
            s[r][h] = _mm256_dpbusd_avx_epi32(s[r][h], hi[h], x_hi);
          }
        }
      }
    } else {
      for (int step = 0; step < 8; ++step) {
        __m256i v[H];
        for (int h = 0; h < H; ++h) v[h] = half_of(t0 + ((h0 + h) / 2) * tb + quants + 64 * step, (h0 + h) % 2);
        for (int r = 0; r < R; ++r) {
          const __m256i xr = bcast4(xq[r] + 4 * step);
          for (int h = 0; h < H; ++h) s[r][h] = _mm256_dpbusd_avx_epi32(s[r][h], v[h], xr);
        }
      }
    }
    for (int h = 0; h < H; ++h) {
      const int q = h0 + h;
      const uint8_t* tile = t0 + (q / 2) * tb;
      const __m256 dw = halves8(tile + 16 * (q % 2));
      for (int r = 0; r < R; ++r) {
        const int64_t rb = (r0 + r) * blocks + b;
        float* a = acc + r * kGroupOut + kHalfOut * q;
        __m256i isum = s[r][h];
        if constexpr (f.off != 0) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(f.off * x.s32[rb]));
        __m256 c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(x.d32[rb])),
                                   _mm256_loadu_ps(a));
        if constexpr (f.min) c = _mm256_fmadd_ps(halves8(tile + 32 + 16 * (q % 2)), _mm256_set1_ps(x.xs32[rb]), c);
        _mm256_storeu_ps(a, c);
      }
    }
  }
}

// Halves swept at once for R <= 4 rows (a chunk of quant_i8_vnni256.cpp's driver):
// R x H <= 8 integer accumulators beside the 2H unpacked vectors, within the 16
// registers. More rows a chunk, with one half a sweep, measured slower: each
// broadcast of x then feeds a single VPDPBUSD.
constexpr int halves_for(int rows) { return rows == 1 ? 4 : 2; }

template <int Fi, int R>
void group_rows(const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, float* acc) {
  constexpr int H = halves_for(R);
  for (int h0 = 0; h0 < kHalves; h0 += H) sweep<Fi, R, H>(gd, blocks, x, r0, h0, acc);
}

template <int Fi, int R>
struct GroupRows {
  static void run(const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, float* acc) {
    group_rows<Fi, R>(gd, blocks, x, r0, acc);
  }
};

}  // namespace

void legacy_group(int64_t type, const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, int64_t rows,
                  float* acc) {
  legacy_dispatch<GroupRows, kLegacyMaxRows>(type, gd, blocks, x, r0, rows, acc);
}

}  // namespace vs::i8::v256
