// The integer path of a quantized product (--weights quant-i8), shared between its
// files: quant_i8_pack.cpp (the tile layouts, the pack, the embedding), quant_i8.cpp
// (activations, the driver), quant_i8_legacy.cpp (32-weight blocks), quant_i8_k.cpp
// (256-weight K-quant super-blocks); and with the AVX-VNNI module's
// (quant_i8_vnni256.h), which reads the same packs with the same bits.
//
// Each row of x is rounded to int8 on its own, as llama.cpp rounds its activations:
// per 32 values for the 32-weight formats (its Q8_0 / Q8_1), per 256 for the
// K-quants (its Q8_K), with the integer sums of the values that the zero points
// and the K-quants' minimums need. Every block's dot product is then exact in
// int32 by VPDPBUSD (AVX-512-VNNI): 64 multiply-adds an instruction, and a 4-bit
// weight costs a mask or a shift, no conversion. Only the block scales are float.
//
// Row invariance by construction: a vector lane is one output, no sum runs across
// lanes or rows, and a thread takes whole outputs (never a share of k). Each
// y[r, o] is one fp32 accumulator from 0, advanced block by block in increasing
// order by the same float operations on x[r, :] and W[o, :] alone, + bias, rounded
// once to bf16. So the bits do not depend on the row count, the other rows, the
// chunking or the thread count, and speculation on this path is bit-exact against
// plain decoding on it. The logits are not the bf16 path's (docs/quant_kernels.md).
//
// A tile holds 16 outputs x one block, [scales][quants]; the quants as bytes in
// VPDPBUSD's order, one 64-byte "step" per 4 values of k: byte 4o + j of step c is
// output o at k = 4c + j. Two 4-bit steps share one 64-byte vector, in its low and
// high nibbles. The layouts per format are in quant_i8_pack.cpp.
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "matmul.h"
#include "quant_stack.h"

namespace vs::i8 {

constexpr int64_t kMagic = 0x324138505153564c;  // "LVSQP8A2"

struct Header {
  int64_t magic, out, in, groups, data_offset;
  int64_t per32, per256;  // whether some group's format wants x per 32 / per 256 values
  int64_t reserved;
};
using View = StackView<Header>;
inline View view(const at::Tensor& packed) { return stack_view<Header>(packed); }

struct Format {
  int64_t type;
  const char* name;
  int64_t block;  // weights per raw block along k: 32, or 256 (K-quants)
  int64_t raw_bytes;  // one raw block
  int64_t tile_bytes;  // 16 outputs x one block
  void (*repack)(const uint8_t* const* rows, uint8_t* dst);
  // Output o's weight at k of a tile, as gguf.quants.dequantize computes it in
  // float32 (the embedding's values, equal to the bf16 path's).
  float (*weight)(const uint8_t* tile, int o, int k);
};
const Format* find(int64_t type);  // nullptr when the integer path lacks it
const Format* formats(int64_t* count);

// x's rows on the integer path. A row's values are q = round_even(x / d) with
// d = max|x| / 127 over the block (0 for an all-zero block).
struct Rows {
  int64_t n = 0, in = 0;
  // Per 32 values (the 32-weight formats): q [n][in], d and d * sum(q) [n][in / 32],
  // sum(q) [n][in / 32].
  std::vector<int8_t> q32;
  std::vector<float> d32, xs32;
  std::vector<int32_t> s32;
  // Per 256 values (K-quants): q [n][in], d [n][in / 256], and the sums of q over
  // each 16 and each 32 values, [n][in / 16] and [n][in / 32] (|sum| <= 32 * 127).
  std::vector<int8_t> q256;
  std::vector<float> d256;
  std::vector<int16_t> sum16, sum32;
};
Rows quantize_rows(const uint16_t* x, int64_t n, int64_t in, bool per32, bool per256);

// The sum of 16 int8 values, exactly: q ^ 0x80 is q + 128 as an unsigned byte, and
// PSADBW adds 8 unsigned bytes at a time (SSE2, so both modules' instruction sets).
inline int32_t sum16_of(const int8_t* q) {
  const __m128i biased = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), _mm_set1_epi8(-128));
  const __m128i halves = _mm_sad_epu8(biased, _mm_setzero_si128());
  return _mm_cvtsi128_si32(halves) + _mm_cvtsi128_si32(_mm_srli_si128(halves, 8)) - 16 * 128;
}

// quantize_rows' frame, shared by both integer-path modules (build.py): each block of
// `count` values of a row goes through quantize_block(src, count, dst) -> d, the
// module's vector code for the one rule above; the sums are exact integers.
template <class Block>
Rows quantize_rows_by(Block quantize_block, const uint16_t* x, int64_t n, int64_t in, bool per32,
                      bool per256) {
  Rows rows;
  rows.n = n;
  rows.in = in;
  if (per32) {
    const int64_t blocks = in / 32;
    rows.q32.resize(n * in);
    rows.d32.resize(n * blocks);
    rows.xs32.resize(n * blocks);
    rows.s32.resize(n * blocks);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        int8_t* q = rows.q32.data() + r * in + b * 32;
        const int64_t i = r * blocks + b;
        rows.d32[i] = quantize_block(x + r * in + b * 32, 32, q);
        rows.s32[i] = sum16_of(q) + sum16_of(q + 16);
        rows.xs32[i] = rows.d32[i] * static_cast<float>(rows.s32[i]);
      }
    }
  }
  if (per256) {
    const int64_t blocks = in / 256;
    rows.q256.resize(n * in);
    rows.d256.resize(n * blocks);
    rows.sum16.resize(n * in / 16);
    rows.sum32.resize(n * in / 32);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        rows.d256[r * blocks + b] = quantize_block(x + r * in + b * 256, 256, rows.q256.data() + r * in + b * 256);
      }
      for (int64_t s = 0; s < in / 16; ++s) rows.sum16[r * in / 16 + s] = sum16_of(rows.q256.data() + r * in + 16 * s);
      for (int64_t s = 0; s < in / 32; ++s) {
        rows.sum32[r * in / 32 + s] = rows.sum16[r * in / 16 + 2 * s] + rows.sum16[r * in / 16 + 2 * s + 1];
      }
    }
  }
  return rows;
}

// The 32-weight formats as both modules' kernels read their tiles: w = d * (q - off)
// (+ m), q as the tile stores it (Q8_0: q + 128, off 128).
struct Legacy {
  int64_t type;
  int64_t tile_bytes;
  int off;
  bool min;  // + m per output (Q4_1, Q5_1)
  bool four;  // 4-bit quants, two steps a vector
  bool five;  // plus a fifth bit per value, masks after the nibbles
};

constexpr Legacy kLegacy[] = {{2, 288, 8, false, true, false},
                              {3, 320, 0, true, true, false},
                              {6, 352, 16, false, true, true},
                              {7, 384, 0, true, true, true},
                              {8, 544, 128, false, false, false}};

// Rows [r0, r0 + rows) of the 64-output group gd (its tiles [block][4]) in a
// 32-weight format, over all `blocks`, into acc [n][4 tiles][16] (their rows);
// rows <= kLegacyMaxRows (the driver splits more into balanced chunks).
constexpr int kLegacyPassRows = 8;  // the most rows a pass is compiled for
void legacy_group(int64_t type, const uint8_t* gd, int64_t blocks, const Rows& x, int64_t r0, int64_t rows,
                  float* acc);
// All n rows of a K-quant group, into acc [n][4 tiles][16], which must start at 0.
void k_group(int64_t type, const uint8_t* gd, int64_t blocks, const Rows& x, float* acc);

#define VS_I8_INLINE inline __attribute__((always_inline))

// ---- The K-quant kernels' shared pieces (both modules) ----

// Of the stream, requested ahead of the unpacking: 8 KiB beat 4, 12, 16 and 32 at one row
// with NTA requests on Zen 5, and matched 16 with T0 requests on an Intel Xeon
// (docs/notebook/quant_i8_kquant.md, rounds 7 and 8).
constexpr int64_t kAheadBytes = 8 << 10;

// How the weight stream is requested, decided once per process by the CPU's vendor. On AMD
// (Zen 5), non-temporally (NTA), since each weight line is used once a step: faster than T0
// there. On an Intel Xeon (Emerald Rapids) NTA requests were far slower than T0, most of all
// on a model that T0 keeps in L3 from one step to the next; so every other CPU requests the
// K-quants into L2 (T1, faster than T0 there at one and eight rows) and the 32-weight
// formats into L1 (T0, faster than T1 on the default model) (docs/notebook/quant_i8_kquant.md,
// rounds 7 and 8).
inline const bool kStreamNta = kAmd;

// Rows of a 32-weight group in one pass. Seven and eight take one tile at a time: on the
// AMD EPYC that ran slower than two chunks of four, on an Intel Xeon faster
// (docs/notebook/quant_i8_kquant.md, rounds 4 and 9). So AMD takes at most six rows a
// pass, and every other CPU eight.
inline const int64_t kLegacyMaxRows = kAmd ? 6 : kLegacyPassRows;

// The prefetches of the super-block kAheadBytes ahead, spread over the sub-blocks of
// the first chunk's sweeps: issued all at once before a super-block, they stalled the
// unpacking behind the load queue and the stream stopped while the VPDPBUSDs ran
// (docs/notebook/quant_i8_kquant.md, round 3). `next` is null for later chunks.
template <int64_t Lines>  // per sub-block; a constant, so the requests unroll
struct Ahead {
  const char* next = nullptr;
  VS_I8_INLINE void issue(int64_t step) const {
    if (next == nullptr) return;
    if (kStreamNta) {
      for (int64_t l = 0; l < Lines; ++l) _mm_prefetch(next + 64 * (step * Lines + l), _MM_HINT_NTA);
    } else {
      for (int64_t l = 0; l < Lines; ++l) _mm_prefetch(next + 64 * (step * Lines + l), _MM_HINT_T1);
    }
  }
};

// One chunk's rows at one super-block: their int8 values, sums and scale.
template <int R>
struct XBlock {
  const int8_t* q[R];  // the super-block's 256 values
  const int16_t* sums[R];  // its sums per 32 (Q4_K, Q5_K) or per 16 (Q6_K)
  float d[R];
};

// Four int8 values of x as the broadcast operand of VPDPBUSD.
VS_I8_INLINE __m512i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

}  // namespace vs::i8
