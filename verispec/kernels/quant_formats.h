// GGUF block formats, repacked once at load for dequantization in registers.
//
// ggml stores a row as blocks along k: 32 weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)
// or 256 (the K-quants), each with its own scales. A repacked "tile block" holds
// one block for 16 outputs: their scale fields side by side, then per k pair P
// the 16 outputs' two quants in the order of one packed row of matmul.h
// (output-major, k pair inner), so that a load, a convert and a scale give it. It is the raw block bytes rearranged (K-quants: 6-bit
// scales unpacked to bytes, +4 bytes per 256 weights), not dequantized.
//
// Exactness: a weight's value is computed as gguf.quants.dequantize does, in
// float32 with the same operations; every product there is exact (an fp16 scale
// has 11 significant bits, a 6-bit sub-scale 6, a quant at most 8: at most 24
// bits), so the one rounding left (Q4_1, Q5_1, Q4_K, Q5_K: a product plus or
// minus an offset) is the same in a fused multiply-add. Then round to nearest
// even to bf16, as torch's cast of the reference does.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "matmul.h"

namespace vs::quant {

// ggml type ids (gguf.GGMLQuantizationType).
enum Type : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

struct Format {
  int64_t type;
  const char* name;
  int64_t block;  // weights per raw block along k
  int64_t raw_bytes;  // bytes per raw block
  int64_t tile_bytes;  // bytes per tile block (16 outputs x one block)
  // rows[i]: output i's raw block (16 of them; a padding output points at zeros).
  void (*repack)(const uint8_t* const* rows, uint8_t* dst);
  // Writes pair P of the tile at dst + (P / 16) * kStepElems + (P % 16) * 32 (bf16).
  void (*dequant)(const uint8_t* src, uint16_t* dst);
};

const Format* find(int64_t type);  // nullptr when unsupported
const Format* formats(int64_t* count);

// The entry of a format table (this path's or the integer path's) for a ggml type, or nullptr.
template <class F, size_t N>
const F* find_type(const F (&table)[N], int64_t type) {
  for (const F& f : table) {
    if (f.type == type) return &f;
  }
  return nullptr;
}

// ---- raw block access (byte layouts as in ggml-common.h / gguf/quants.py) ----

inline uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 4-bit quants of a 32-weight block: elements 0..15 in the low nibbles, 16..31 high.
inline int nib32(const uint8_t* qs, int e) { return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4; }

// 4-bit quants of a 256-weight K block: 64-element chunks of 32 bytes, low then high nibbles.
inline int nib256(const uint8_t* qs, int e) { return (qs[(e / 64) * 32 + e % 32] >> (4 * ((e % 64) / 32))) & 15; }

// The fifth bit of element e of a Q5_0 / Q5_1 block (qh: its u32 of high bits).
inline int q5_high(const uint8_t* qh, int e) { return (u32(qh) >> e) & 1; }

// The fifth bit of element e of a Q5_K block (b: the block).
inline int q5k_high(const uint8_t* b, int e) { return (b[16 + e % 32] >> (e / 32)) & 1; }

// Q6_K element e's low 4 bits (from ql) and high 2 bits (from qh) (b: the block).
inline int q6_low(const uint8_t* b, int e) {
  const int h = e / 128, r = e % 128;
  return (b[h * 64 + r % 64] >> (4 * (r / 64))) & 15;
}
inline int q6_high(const uint8_t* b, int e) {
  const int h = e / 128, r = e % 128;
  return (b[128 + h * 32 + r % 32] >> (2 * (r / 32))) & 3;
}

// Q4_K / Q5_K 6-bit sub-block scale and min (gguf Q4_K.get_scale_min).
inline void scale_min(const uint8_t* s, int i, int* sc, int* m) {
  if (i < 4) {
    *sc = s[i] & 63;
    *m = s[i + 4] & 63;
  } else {
    *sc = (s[i + 4] & 15) | ((s[i - 4] >> 2) & 0x30);
    *m = (s[i + 4] >> 4) | ((s[i] >> 2) & 0x30);
  }
}

// ---- register helpers ----

inline __m512 halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 u8_lanes(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))); }
inline __m512 i8_lanes(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))); }

// 16 bytes (byte t: low nibble = lane t of half a, high nibble = lane t of half b)
// -> int32 lanes: half a in bits [3:0], half b in bits [7:4].
inline __m512i nibble_bytes(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m512i high_nibbles(__m512i v) { return _mm512_srli_epi32(v, 4); }
inline __m512 lanes(__m512i q) { return _mm512_cvtepi32_ps(q); }

// Small integers as float32 by table: VPERMPS reads only bits [3:0] of each index
// lane, so one instruction does a nibble's mask, its conversion and any offset
// folded into the table (q - 8, q - 16): the same exact float the integer path
// gives. A clean high nibble (no offset) converts as fast as it permutes, and
// mixing the two kinds of instruction measured faster than either alone (Zen 5).
inline __m512 ramp(float first) {
  return _mm512_setr_ps(first, first + 1, first + 2, first + 3, first + 4, first + 5, first + 6, first + 7,
                        first + 8, first + 9, first + 10, first + 11, first + 12, first + 13, first + 14,
                        first + 15);
}
inline __m512 lut16(__m512i index, __m512 table) { return _mm512_permutexvar_ps(index, table); }
// Five bits: [3:0] of `index`, bit 4 from `high` (a Q5 fifth-bit mask).
inline __m512 lut32(__m512i index, __mmask16 high, __m512 low_table, __m512 high_table) {
  return _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(index, low_table), high, index, high_table);
}

inline __mmask16 mask16(const uint8_t* p) {
  uint16_t m;
  std::memcpy(&m, p, 2);
  return m;
}

// One 64-byte row of the packed layout from two 16-lane halves: lane t of `a` is
// output t / 2 at k = 2P + t % 2, lane t of `b` output 8 + t / 2 (the repack lays
// the quants out in this order, so no shuffle is needed). VCVTNE2PS2BF16 rounds
// to nearest even; no value here is an fp32 denormal (all are multiples of 2^-24).
inline __m512i pairs(__m512 a, __m512 b) { return (__m512i)_mm512_cvtne2ps_pbh(b, a); }

// A per-output vector (lane i: output i) -> the two halves' lane order above.
inline void spread(__m512 v, __m512* a, __m512* b) {
  *a = _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0), v);
  *b = _mm512_permutexvar_ps(_mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8), v);
}

// Repack side of the same order: lane t of half h holds (output, k) = (8h + t / 2, 2P + t % 2).
inline int lane_output(int t, int half) { return 8 * half + t / 2; }
inline int lane_k(int t, int p) { return 2 * p + t % 2; }

inline void put(uint16_t* dst, int P, __m512i v) {
  _mm512_storeu_si512(dst + (P / 16) * kStepElems + (P % 16) * kTileK, v);
}

}  // namespace vs::quant
