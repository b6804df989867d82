// The integer path's 32-weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), with x per 32
// values: per block, y += float(isum - off * sum(q_x)) * (d_w * d_x), and for the
// formats with a minimum also + m_w * (d_x * sum(q_x)), in that order.

#include "quant_i8.h"
#include "quant_i8_dispatch.h"

#pragma GCC target("avx512vnni")

namespace vs::i8 {
namespace {

VS_I8_INLINE __mmask64 mask64(const uint8_t* p) {
  uint64_t m;
  std::memcpy(&m, p, 8);
  return m;
}

// Rows [0, R) x tiles [j0, j0 + T) of one group over every block, into acc [R][4][16].
template <int Fi, int R, int T>
void sweep(const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, int j0, float* acc) {
  constexpr Legacy f = kLegacy[Fi];
  constexpr int64_t tb = f.tile_bytes;
  constexpr int quants = f.min ? 64 : 32;  // the quants follow the fp16 scales
  constexpr int masks = quants + 256;  // Q5: after the nibbles
  // A sweep of whole blocks (one to three rows) requests the stream as the K-quants do
  // (kStreamNta's hint, kAheadBytes ahead); half blocks (four rows and more) keep T0 at
  // 16 KiB, which was faster there on Zen 5 (docs/notebook/quant_i8_kquant.md, round 7).
  constexpr bool kWhole = T == kGroupTiles;
  constexpr int64_t ahead_blocks = ((kWhole ? kAheadBytes : 16 << 10) + kGroupTiles * tb - 1) / (kGroupTiles * tb);
  const bool nta = kWhole && kStreamNta;
  const int64_t in = x.in;
  __m512 c[R][T];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < T; ++j) c[r][j] = _mm512_setzero_ps();
  }
  const __m512i low4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t0 = gd + (b * kGroupTiles + j0) * tb;
    // This sweep's tiles of a block ahead (whole blocks: a sweep of T < 4 tiles reads T
    // of each block's 4).
    const char* next = reinterpret_cast<const char*>(t0 + ahead_blocks * kGroupTiles * tb);
    if (nta) {
      for (int64_t line = 0; line < T * tb; line += 64) _mm_prefetch(next + line, _MM_HINT_NTA);
    } else {
      for (int64_t line = 0; line < T * tb; line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
    }
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = x.q32.data() + (r0 + r) * in + b * 32;
    __m512i s[R][T];
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < T; ++j) s[r][j] = _mm512_setzero_si512();
    }
    if constexpr (f.four) {
      for (int step = 0; step < 4; ++step) {
        for (int j = 0; j < T; ++j) {
          const uint8_t* t = t0 + j * tb;
          const __m512i v = _mm512_loadu_si512(t + quants + 64 * step);
          __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
          if constexpr (f.five) {
            lo = _mm512_mask_add_epi8(lo, mask64(t + masks + 8 * step), lo, sixteen);
            hi = _mm512_mask_add_epi8(hi, mask64(t + masks + 8 * (step + 4)), hi, sixteen);
          }
          for (int r = 0; r < R; ++r) {
            s[r][j] = _mm512_dpbusd_epi32(s[r][j], lo, bcast4(xq[r] + 4 * step));
            s[r][j] = _mm512_dpbusd_epi32(s[r][j], hi, bcast4(xq[r] + 16 + 4 * step));
          }
        }
      }
    } else {
      for (int step = 0; step < 8; ++step) {
        for (int j = 0; j < T; ++j) {
          const __m512i v = _mm512_loadu_si512(t0 + j * tb + quants + 64 * step);
          for (int r = 0; r < R; ++r) s[r][j] = _mm512_dpbusd_epi32(s[r][j], v, bcast4(xq[r] + 4 * step));
        }
      }
    }
    for (int j = 0; j < T; ++j) {
      const uint8_t* tile = t0 + j * tb;
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile)));
      for (int r = 0; r < R; ++r) {
        const int64_t rb = (r0 + r) * blocks + b;
        __m512i isum = s[r][j];
        if constexpr (f.off != 0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(f.off * x.s32[rb]));
        c[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(x.d32[rb])), c[r][j]);
      }
      if constexpr (f.min) {
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 32)));
        for (int r = 0; r < R; ++r) c[r][j] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.xs32[(r0 + r) * blocks + b]), c[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < T; ++j) _mm512_storeu_ps(acc + (r * kGroupTiles + j0 + j) * kTileOut, c[r][j]);
  }
}

// Up to eight rows in one pass over the group: R x T tiles of integer and float
// accumulators must fit the 32 registers, so more rows sweep fewer tiles at a
// time; each weight is still unpacked once, and the later sweeps read from L1.
// (Seven and eight rows, one tile at a time, only where kLegacyMaxRows allows.)
template <int Fi, int R>
void group_rows(const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, float* acc) {
  constexpr int T = R <= 3 ? 4 : R <= 6 ? 2 : 1;
  for (int j0 = 0; j0 < kGroupTiles; j0 += T) sweep<Fi, R, T>(gd, blocks, x, r0, j0, acc);
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
  legacy_dispatch<GroupRows, kLegacyPassRows>(type, gd, blocks, x, r0, rows, acc);
}

}  // namespace vs::i8
