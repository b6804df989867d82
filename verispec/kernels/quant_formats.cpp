// Repack of each GGUF block format into tile blocks (see quant_formats.h for the
// tile-block idea and why the values are exact); the in-register dequantization
// of each lives in quant_blocks.h.
#include <iterator>

#include "quant_blocks.h"
#include "quant_formats.h"

namespace vs::quant {
namespace {

// Output i of a 32-weight block: its fp16 fields at `field` -> 16 x 2 bytes.
void copy_field(const uint8_t* const* rows, int field, uint8_t* dst) {
  for (int i = 0; i < 16; ++i) std::memcpy(dst + 2 * i, rows[i] + field, 2);
}

// q of lane t of half h at pair p (quant_formats.h's lane order).
template <typename Get>
int lane_q(const uint8_t* const* rows, Get get, int t, int half, int p) {
  return get(rows[lane_output(t, half)], lane_k(t, p));
}

// Per pair: byte t = q(lane t of half a) | q(lane t of half b) << 4, for 4-bit `get`.
template <typename Get>
void pack_nibbles(const uint8_t* const* rows, int pairs_count, Get get, uint8_t* dst) {
  for (int p = 0; p < pairs_count; ++p) {
    for (int t = 0; t < 16; ++t) dst[16 * p + t] = lane_q(rows, get, t, 0, p) | (lane_q(rows, get, t, 1, p) << 4);
  }
}

// Per pair: two 16-bit masks (halves a, b), bit t = the fifth bit of lane t.
template <typename Get>
void pack_bits(const uint8_t* const* rows, int pairs_count, Get get, uint8_t* dst) {
  for (int p = 0; p < pairs_count; ++p) {
    uint16_t lo = 0, hi = 0;
    for (int t = 0; t < 16; ++t) {
      lo |= lane_q(rows, get, t, 0, p) << t;
      hi |= lane_q(rows, get, t, 1, p) << t;
    }
    std::memcpy(dst + 4 * p, &lo, 2);
    std::memcpy(dst + 4 * p + 2, &hi, 2);
  }
}

// Q4_0: d, qs[16]; w = d * (q - 8). Tile: d[16], nibbles.
void repack_q4_0(const uint8_t* const* rows, uint8_t* dst) {
  copy_field(rows, 0, dst);
  pack_nibbles(rows, 16, [](const uint8_t* b, int e) { return nib32(b + 2, e); }, dst + 32);
}

// Q4_1: d, m, qs[16]; w = d * q + m. Tile: d[16], m[16], nibbles.
void repack_q4_1(const uint8_t* const* rows, uint8_t* dst) {
  copy_field(rows, 0, dst);
  copy_field(rows, 2, dst + 32);
  pack_nibbles(rows, 16, [](const uint8_t* b, int e) { return nib32(b + 4, e); }, dst + 64);
}

// Q5_0: d, qh (u32), qs[16]; w = d * ((q | h << 4) - 16). Tile: d[16], nibbles, masks.
void repack_q5_0(const uint8_t* const* rows, uint8_t* dst) {
  copy_field(rows, 0, dst);
  pack_nibbles(rows, 16, [](const uint8_t* b, int e) { return nib32(b + 6, e); }, dst + 32);
  pack_bits(rows, 16, [](const uint8_t* b, int e) { return q5_high(b + 2, e); }, dst + 288);
}

// Q5_1: d, m, qh, qs[16]; w = d * (q | h << 4) + m. Tile: d[16], m[16], nibbles, masks.
void repack_q5_1(const uint8_t* const* rows, uint8_t* dst) {
  copy_field(rows, 0, dst);
  copy_field(rows, 2, dst + 32);
  pack_nibbles(rows, 16, [](const uint8_t* b, int e) { return nib32(b + 8, e); }, dst + 64);
  pack_bits(rows, 16, [](const uint8_t* b, int e) { return q5_high(b + 4, e); }, dst + 320);
}

// Q8_0: d, qs[32] int8; w = q * d. Tile: d[16], per pair 16 bytes per half.
void repack_q8_0(const uint8_t* const* rows, uint8_t* dst) {
  copy_field(rows, 0, dst);
  for (int p = 0; p < 16; ++p) {
    for (int t = 0; t < 16; ++t) {
      dst[32 + 32 * p + t] = rows[lane_output(t, 0)][2 + lane_k(t, p)];
      dst[48 + 32 * p + t] = rows[lane_output(t, 1)][2 + lane_k(t, p)];
    }
  }
}

// Q4_K: d, dmin, scales[12], qs[128]; sub-block s of 32: w = (d * sc_s) * q - dmin * m_s.
// Tile: d[16], dmin[16], sc[8][16], m[8][16] (bytes), nibbles (128 pairs).
void k_scales(const uint8_t* const* rows, uint8_t* dst) {
  copy_field(rows, 0, dst);
  copy_field(rows, 2, dst + 32);
  for (int s = 0; s < 8; ++s) {
    for (int i = 0; i < 16; ++i) {
      int sc, m;
      scale_min(rows[i] + 4, s, &sc, &m);
      dst[64 + 16 * s + i] = static_cast<uint8_t>(sc);
      dst[192 + 16 * s + i] = static_cast<uint8_t>(m);
    }
  }
}
void repack_q4_k(const uint8_t* const* rows, uint8_t* dst) {
  k_scales(rows, dst);
  pack_nibbles(rows, 128, [](const uint8_t* b, int e) { return nib256(b + 16, e); }, dst + 320);
}

// Q5_K: d, dmin, scales[12], qh[32], qs[128]: Q4_K's layout plus a fifth bit, bit
// e / 32 of qh[e % 32]. Tile: Q4_K's, then masks (128 pairs x 4 bytes).
void repack_q5_k(const uint8_t* const* rows, uint8_t* dst) {
  k_scales(rows, dst);
  pack_nibbles(rows, 128, [](const uint8_t* b, int e) { return nib256(b + 48, e); }, dst + 320);
  pack_bits(rows, 128, q5k_high, dst + 2368);
}

// Q6_K: ql[128], qh[64], scales[16] int8, d; sub-block s of 16: w = (d * sc_s) * (q - 32),
// q = low 4 bits from ql | 2 bits from qh << 4. Tile: d[16], sc[16][16], nibbles,
// then per pair two u32 (halves a, b) of 2-bit fields (bits 2t, 2t + 1: lane t).
void repack_q6_k(const uint8_t* const* rows, uint8_t* dst) {
  copy_field(rows, 208, dst);
  for (int s = 0; s < 16; ++s) {
    for (int i = 0; i < 16; ++i) dst[32 + 16 * s + i] = rows[i][192 + s];
  }
  pack_nibbles(rows, 128, q6_low, dst + 288);
  for (int p = 0; p < 128; ++p) {
    uint32_t lo = 0, hi = 0;
    for (int t = 0; t < 16; ++t) {
      lo |= static_cast<uint32_t>(lane_q(rows, q6_high, t, 0, p)) << (2 * t);
      hi |= static_cast<uint32_t>(lane_q(rows, q6_high, t, 1, p)) << (2 * t);
    }
    std::memcpy(dst + 2336 + 8 * p, &lo, 4);
    std::memcpy(dst + 2340 + 8 * p, &hi, 4);
  }
}

const Format kFormats[] = {
    {Q8_0, "Q8_0", 32, 34, 544, repack_q8_0, dequant_tile<BlockQ8_0>},
    {Q4_0, "Q4_0", 32, 18, 288, repack_q4_0, dequant_tile<BlockQ4_0>},
    {Q4_1, "Q4_1", 32, 20, 320, repack_q4_1, dequant_tile<BlockQ4_1>},
    {Q5_0, "Q5_0", 32, 22, 352, repack_q5_0, dequant_tile<BlockQ5_0>},
    {Q5_1, "Q5_1", 32, 24, 384, repack_q5_1, dequant_tile<BlockQ5_1>},
    {Q4_K, "Q4_K", 256, 144, 2368, repack_q4_k, dequant_tile<BlockQ4_K>},
    {Q5_K, "Q5_K", 256, 176, 2880, repack_q5_k, dequant_tile<BlockQ5_K>},
    {Q6_K, "Q6_K", 256, 210, 3360, repack_q6_k, dequant_tile<BlockQ6_K>},
};

}  // namespace

const Format* formats(int64_t* count) {
  *count = std::size(kFormats);
  return kFormats;
}

const Format* find(int64_t type) { return find_type(kFormats, type); }

}  // namespace vs::quant
