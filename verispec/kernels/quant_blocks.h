// Each GGUF block format's dequantization as two inline steps, shared by the
// buffered dequantization (quant_formats.cpp) and the fused matmul
// (quant_fused.cpp), so both produce the same bf16 row from the same operations:
//
//   Seg seg(tile, s)     the per-output scales of segment s (kPairs k pairs that
//                        share them), spread to the lane order of quant_formats.h;
//   __m512i row(tile, seg, p)   k pair p's packed row (16 outputs x 2 bf16).
//
// `tile` is one tile block: 16 outputs x one raw block (quant_formats.h).
#pragma once
#include "quant_formats.h"

namespace vs::quant {

#define VS_INLINE inline __attribute__((always_inline))

struct Scale2 {
  __m512 a, b;
};
struct Scale4 {
  __m512 a, b, oa, ob;
};

VS_INLINE Scale2 spread2(__m512 v) {
  Scale2 s;
  spread(v, &s.a, &s.b);
  return s;
}

VS_INLINE Scale4 spread4(__m512 v, __m512 o) {
  Scale4 s;
  spread(v, &s.a, &s.b);
  spread(o, &s.oa, &s.ob);
  return s;
}

// Q8_0: d, qs[32] int8; w = q * d. Tile: d[16], per pair 16 bytes per half.
struct BlockQ8_0 {
  static constexpr int kBlock = 32, kPairs = 16, kTileBytes = 544;
  using Seg = Scale2;
  static VS_INLINE Seg seg(const uint8_t* t, int) { return spread2(halves(t)); }
  static VS_INLINE __m512i row(const uint8_t* t, const Seg& s, int p) {
    return pairs(_mm512_mul_ps(i8_lanes(t + 32 + 32 * p), s.a), _mm512_mul_ps(i8_lanes(t + 48 + 32 * p), s.b));
  }
};

// Q4_0: d, qs[16]; w = d * (q - 8). Tile: d[16], nibbles.
struct BlockQ4_0 {
  static constexpr int kBlock = 32, kPairs = 16, kTileBytes = 288;
  using Seg = Scale2;
  static VS_INLINE Seg seg(const uint8_t* t, int) { return spread2(halves(t)); }
  static VS_INLINE __m512i row(const uint8_t* t, const Seg& s, int p) {
    const __m512i v = nibble_bytes(t + 32 + 16 * p);
    const __m512 table = ramp(-8);
    return pairs(_mm512_mul_ps(s.a, lut16(v, table)), _mm512_mul_ps(s.b, lut16(high_nibbles(v), table)));
  }
};

// Q4_1: d, m, qs[16]; w = d * q + m. Tile: d[16], m[16], nibbles.
struct BlockQ4_1 {
  static constexpr int kBlock = 32, kPairs = 16, kTileBytes = 320;
  using Seg = Scale4;
  static VS_INLINE Seg seg(const uint8_t* t, int) { return spread4(halves(t), halves(t + 32)); }
  static VS_INLINE __m512i row(const uint8_t* t, const Seg& s, int p) {
    const __m512i v = nibble_bytes(t + 64 + 16 * p);
    return pairs(_mm512_fmadd_ps(s.a, lut16(v, ramp(0)), s.oa), _mm512_fmadd_ps(s.b, lanes(high_nibbles(v)), s.ob));
  }
};

// Q5_0: d, qh (u32), qs[16]; w = d * ((q | h << 4) - 16). Tile: d[16], nibbles, masks.
struct BlockQ5_0 {
  static constexpr int kBlock = 32, kPairs = 16, kTileBytes = 352;
  using Seg = Scale2;
  static VS_INLINE Seg seg(const uint8_t* t, int) { return spread2(halves(t)); }
  static VS_INLINE __m512i row(const uint8_t* t, const Seg& s, int p) {
    const __m512i v = nibble_bytes(t + 32 + 16 * p);
    const __m512 low = ramp(-16), high = ramp(0);
    return pairs(_mm512_mul_ps(s.a, lut32(v, mask16(t + 288 + 4 * p), low, high)),
                 _mm512_mul_ps(s.b, lut32(high_nibbles(v), mask16(t + 290 + 4 * p), low, high)));
  }
};

// Q5_1: d, m, qh, qs[16]; w = d * (q | h << 4) + m. Tile: d[16], m[16], nibbles, masks.
struct BlockQ5_1 {
  static constexpr int kBlock = 32, kPairs = 16, kTileBytes = 384;
  using Seg = Scale4;
  static VS_INLINE Seg seg(const uint8_t* t, int) { return spread4(halves(t), halves(t + 32)); }
  static VS_INLINE __m512i row(const uint8_t* t, const Seg& s, int p) {
    const __m512i v = nibble_bytes(t + 64 + 16 * p);
    const __m512 low = ramp(0), high = ramp(16);
    return pairs(_mm512_fmadd_ps(s.a, lut32(v, mask16(t + 320 + 4 * p), low, high), s.oa),
                 _mm512_fmadd_ps(s.b, lut32(high_nibbles(v), mask16(t + 322 + 4 * p), low, high), s.ob));
  }
};

// Q4_K / Q5_K: d, dmin, scales[12], (qh[32],) qs[128]; sub-block s of 32:
// w = (d * sc_s) * q - dmin * m_s. Tile: d[16], dmin[16], sc[8][16], m[8][16]
// (bytes), nibbles (128 pairs), then for Q5_K masks (128 pairs x 4 bytes).
template <bool kFive>
struct BlockK {
  static constexpr int kBlock = 256, kPairs = 16, kTileBytes = kFive ? 2880 : 2368;
  using Seg = Scale4;
  static VS_INLINE Seg seg(const uint8_t* t, int s) {
    return spread4(_mm512_mul_ps(halves(t), u8_lanes(t + 64 + 16 * s)),
                   _mm512_mul_ps(halves(t + 32), u8_lanes(t + 192 + 16 * s)));
  }
  static VS_INLINE __m512i row(const uint8_t* t, const Seg& s, int p) {
    const __m512i v = nibble_bytes(t + 320 + 16 * p);
    __m512 lo, hi;
    if constexpr (kFive) {
      lo = lut32(v, mask16(t + 2368 + 4 * p), ramp(0), ramp(16));
      hi = lut32(high_nibbles(v), mask16(t + 2370 + 4 * p), ramp(0), ramp(16));
    } else {
      lo = lut16(v, ramp(0));
      hi = lanes(high_nibbles(v));
    }
    return pairs(_mm512_fmsub_ps(s.a, lo, s.oa), _mm512_fmsub_ps(s.b, hi, s.ob));
  }
};
using BlockQ4_K = BlockK<false>;
using BlockQ5_K = BlockK<true>;

// Q6_K: ql[128], qh[64], scales[16] int8, d; sub-block s of 16: w = (d * sc_s) * (q - 32).
// Tile: d[16], sc[16][16], nibbles, then per pair two u32 (halves a, b) of 2-bit
// fields (bits 2t, 2t + 1: lane t).
struct BlockQ6_K {
  static constexpr int kBlock = 256, kPairs = 8, kTileBytes = 3360;
  using Seg = Scale2;
  static VS_INLINE Seg seg(const uint8_t* t, int s) { return spread2(_mm512_mul_ps(halves(t), i8_lanes(t + 32 + 16 * s))); }
  static VS_INLINE __m512i row(const uint8_t* t, const Seg& s, int p) {
    const __m512i shifts = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    // q - 32 = low nibble + (16 * high2 - 32), both parts by table and their sum exact.
    // A high-bits lane keeps the next lanes' bits above bit 1; VPERMPS reads bits
    // [3:0], so that table repeats every four entries.
    const __m512 low = ramp(0);
    const __m512 high = _mm512_setr_ps(-32, -16, 0, 16, -32, -16, 0, 16, -32, -16, 0, 16, -32, -16, 0, 16);
    const __m512i v = nibble_bytes(t + 288 + 16 * p);
    const __m512i hl = _mm512_srlv_epi32(_mm512_set1_epi32(u32(t + 2336 + 8 * p)), shifts);
    const __m512i hh = _mm512_srlv_epi32(_mm512_set1_epi32(u32(t + 2340 + 8 * p)), shifts);
    const __m512 lo = _mm512_add_ps(lut16(v, low), lut16(hl, high));
    const __m512 hi = _mm512_add_ps(lanes(high_nibbles(v)), lut16(hh, high));
    return pairs(_mm512_mul_ps(s.a, lo), _mm512_mul_ps(s.b, hi));
  }
};

// One tile block dequantized into the dense packed layout (pair P at
// dst + (P / 16) * kStepElems + (P % 16) * 32).
template <class B>
void dequant_tile(const uint8_t* t, uint16_t* dst) {
  for (int s = 0; s < B::kBlock / 2 / B::kPairs; ++s) {
    const typename B::Seg sc = B::seg(t, s);
    for (int p = s * B::kPairs; p < (s + 1) * B::kPairs; ++p) put(dst, p, B::row(t, sc, p));
  }
}

// Calls f.template operator()<B>() with the block type of a ggml type id.
template <class F>
void with_block(int64_t type, F&& f) {
  switch (type) {
    case Q8_0: f.template operator()<BlockQ8_0>(); break;
    case Q4_0: f.template operator()<BlockQ4_0>(); break;
    case Q4_1: f.template operator()<BlockQ4_1>(); break;
    case Q5_0: f.template operator()<BlockQ5_0>(); break;
    case Q5_1: f.template operator()<BlockQ5_1>(); break;
    case Q4_K: f.template operator()<BlockQ4_K>(); break;
    case Q5_K: f.template operator()<BlockQ5_K>(); break;
    case Q6_K: f.template operator()<BlockQ6_K>(); break;
    default: break;
  }
}

}  // namespace vs::quant
