// The integer path's tile layouts (quant_i8.h): one repack per format, done once at
// load, each format's weight as gguf computes it, and the entry points that are
// layout code (the pack, its shape, the embedding lookup). Plain C++, no vector code:
// both integer-path modules compile this file (build.py).
//
// Quant bytes, in VPDPBUSD's order (byte 4o + j of step c: output o at k = 4c + j):
//   4-bit: 64-byte vector v holds steps 8 (v / 4) + v % 4 (low nibbles) and
//          8 (v / 4) + 4 + v % 4 (high nibbles): one 32-value sub-block is 4 vectors,
//          its first 16 values in the low nibbles, the last 16 in the high ones.
//   fifth bit (Q5_*): a 64-bit mask per step, bit 4o + j.
//   Q6_K's high 2 bits: vector 2g + h holds, in bits [2i + 1 : 2i] of byte 4o + j,
//          output o at k = 32g + 16h + 4i + j: the 16-value sub-block 2g + h whole.
//   Q8_0: one step a vector, q + 128.
// Scales: fp16 d (and m or dmin) per output; K-quant sub-scales one byte per output,
// Q4_K / Q5_K mins (and Q6_K's scales) as pairs [pair p][output][2] so that one
// widening gives VPDPWSSD's int16 pairs.
//
// Sizes per 16 outputs x one block, against the raw file: Q4_0 288 (= raw), Q4_1 320
// (=), Q5_0 352 (=), Q5_1 384 (=), Q8_0 544 (=), Q4_K 2368 (+2.8%), Q5_K 2880
// (+2.3%), Q6_K 3360 (=).
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <iterator>

#include "kernels.h"
#include "quant_formats.h"
#include "quant_i8.h"

namespace vs::i8 {
namespace {

using quant::nib256;
using quant::nib32;
using quant::q5_high;
using quant::q5k_high;
using quant::q6_high;
using quant::q6_low;
using quant::scale_min;

void copy_halves(const uint8_t* const* rows, int field, uint8_t* dst) {
  for (int o = 0; o < 16; ++o) std::memcpy(dst + 2 * o, rows[o] + field, 2);
}

// 4-bit quants get(block, e) into `vectors` nibble vectors (layout above).
template <typename Get>
void pack_nibbles(const uint8_t* const* rows, int vectors, Get get, uint8_t* dst) {
  for (int v = 0; v < vectors; ++v) {
    const int k0 = 32 * (v / 4) + 4 * (v % 4);
    for (int o = 0; o < 16; ++o) {
      for (int j = 0; j < 4; ++j) dst[64 * v + 4 * o + j] = get(rows[o], k0 + j) | (get(rows[o], k0 + 16 + j) << 4);
    }
  }
}

// One bit get(block, e) per value into 64-bit masks, one per step.
template <typename Get>
void pack_bits(const uint8_t* const* rows, int steps, Get get, uint8_t* dst) {
  for (int c = 0; c < steps; ++c) {
    uint64_t mask = 0;
    for (int o = 0; o < 16; ++o) {
      for (int j = 0; j < 4; ++j) mask |= static_cast<uint64_t>(get(rows[o], 4 * c + j)) << (4 * o + j);
    }
    std::memcpy(dst + 8 * c, &mask, 8);
  }
}

// Nibble vector and byte of output o at k (4-bit layout), and which nibble.
struct NibbleAt {
  int offset, shift;
};
NibbleAt nibble_at(int o, int k) {
  const int r = k % 32;
  return {64 * (4 * (k / 32) + (r % 16) / 4) + 4 * o + k % 4, r < 16 ? 0 : 4};
}
int nibble(const uint8_t* q, int o, int k) {
  const NibbleAt at = nibble_at(o, k);
  return (q[at.offset] >> at.shift) & 15;
}
int bit(const uint8_t* masks, int o, int k) { return (masks[8 * (k / 4) + (4 * o + k % 4) / 8] >> ((4 * o + k % 4) % 8)) & 1; }

// ---- 32-weight formats: w = d * (q - off) (+ m) ----

// Q4_0: d, qs[16]; w = d * (q - 8). Tile: d[16], nibbles.
void repack_q4_0(const uint8_t* const* rows, uint8_t* dst) {
  copy_halves(rows, 0, dst);
  pack_nibbles(rows, 4, [](const uint8_t* b, int e) { return nib32(b + 2, e); }, dst + 32);
}
float weight_q4_0(const uint8_t* t, int o, int k) { return half_at(t + 2 * o) * static_cast<float>(nibble(t + 32, o, k) - 8); }

// Q4_1: d, m, qs[16]; w = d * q + m. Tile: d[16], m[16], nibbles.
void repack_q4_1(const uint8_t* const* rows, uint8_t* dst) {
  copy_halves(rows, 0, dst);
  copy_halves(rows, 2, dst + 32);
  pack_nibbles(rows, 4, [](const uint8_t* b, int e) { return nib32(b + 4, e); }, dst + 64);
}
float weight_q4_1(const uint8_t* t, int o, int k) {
  const float dq = half_at(t + 2 * o) * static_cast<float>(nibble(t + 64, o, k));  // exact
  return dq + half_at(t + 32 + 2 * o);
}

// Q5_0: d, qh, qs[16]; w = d * ((q | h << 4) - 16). Tile: d[16], nibbles, masks.
void repack_q5_0(const uint8_t* const* rows, uint8_t* dst) {
  copy_halves(rows, 0, dst);
  pack_nibbles(rows, 4, [](const uint8_t* b, int e) { return nib32(b + 6, e); }, dst + 32);
  pack_bits(rows, 8, [](const uint8_t* b, int e) { return q5_high(b + 2, e); }, dst + 288);
}
float weight_q5_0(const uint8_t* t, int o, int k) {
  return half_at(t + 2 * o) * static_cast<float>((nibble(t + 32, o, k) | bit(t + 288, o, k) << 4) - 16);
}

// Q5_1: d, m, qh, qs[16]; w = d * (q | h << 4) + m. Tile: d[16], m[16], nibbles, masks.
void repack_q5_1(const uint8_t* const* rows, uint8_t* dst) {
  copy_halves(rows, 0, dst);
  copy_halves(rows, 2, dst + 32);
  pack_nibbles(rows, 4, [](const uint8_t* b, int e) { return nib32(b + 8, e); }, dst + 64);
  pack_bits(rows, 8, [](const uint8_t* b, int e) { return q5_high(b + 4, e); }, dst + 320);
}
float weight_q5_1(const uint8_t* t, int o, int k) {
  const float dq = half_at(t + 2 * o) * static_cast<float>(nibble(t + 64, o, k) | bit(t + 320, o, k) << 4);
  return dq + half_at(t + 32 + 2 * o);
}

// Q8_0: d, qs[32] int8; w = d * q. Tile: d[16], 8 steps of q + 128.
void repack_q8_0(const uint8_t* const* rows, uint8_t* dst) {
  copy_halves(rows, 0, dst);
  for (int c = 0; c < 8; ++c) {
    for (int o = 0; o < 16; ++o) {
      for (int j = 0; j < 4; ++j) dst[32 + 64 * c + 4 * o + j] = static_cast<int8_t>(rows[o][2 + 4 * c + j]) + 128;
    }
  }
}
float weight_q8_0(const uint8_t* t, int o, int k) {
  return half_at(t + 2 * o) * static_cast<float>(t[32 + 64 * (k / 4) + 4 * o + k % 4] - 128);
}

// ---- K-quants ----

// Q4_K / Q5_K: d, dmin, scales[12], (qh[32],) qs[128]; sub-block s of 32:
// w = (d * sc_s) * q - dmin * m_s. Tile: d[16], dmin[16], sc[8][16], m as pairs
// [4][16][2], nibbles (32 vectors), then for Q5_K the fifth bits (64 masks).
void k_scales(const uint8_t* const* rows, uint8_t* dst) {
  copy_halves(rows, 0, dst);
  copy_halves(rows, 2, dst + 32);
  for (int s = 0; s < 8; ++s) {
    for (int o = 0; o < 16; ++o) {
      int sc, m;
      scale_min(rows[o] + 4, s, &sc, &m);
      dst[64 + 16 * s + o] = static_cast<uint8_t>(sc);
      dst[192 + 32 * (s / 2) + 2 * o + s % 2] = static_cast<uint8_t>(m);
    }
  }
}
void repack_q4_k(const uint8_t* const* rows, uint8_t* dst) {
  k_scales(rows, dst);
  pack_nibbles(rows, 32, [](const uint8_t* b, int e) { return nib256(b + 16, e); }, dst + 320);
}
void repack_q5_k(const uint8_t* const* rows, uint8_t* dst) {
  k_scales(rows, dst);
  pack_nibbles(rows, 32, [](const uint8_t* b, int e) { return nib256(b + 48, e); }, dst + 320);
  pack_bits(rows, 64, q5k_high, dst + 2368);
}
template <bool kFive>
float weight_k(const uint8_t* t, int o, int k) {
  const int s = k / 32;
  const int q = nibble(t + 320, o, k) | (kFive ? bit(t + 2368, o, k) << 4 : 0);
  const float scale = half_at(t + 2 * o) * static_cast<float>(t[64 + 16 * s + o]);  // exact
  const float min = half_at(t + 32 + 2 * o) * static_cast<float>(t[192 + 32 * (s / 2) + 2 * o + s % 2]);  // exact
  const float dq = scale * static_cast<float>(q);  // exact: the one rounding is the subtraction
  return dq - min;
}

// Q6_K: ql[128], qh[64], scales[16] int8, d; sub-block s of 16: w = (d * sc_s) * (q - 32),
// q = low 4 bits | high 2 bits << 4. Tile: d[16], sc as pairs [8][16][2] (int8), low
// nibbles (32 vectors), high 2 bits (16 vectors).
void repack_q6_k(const uint8_t* const* rows, uint8_t* dst) {
  copy_halves(rows, 208, dst);
  for (int s = 0; s < 16; ++s) {
    for (int o = 0; o < 16; ++o) dst[32 + 32 * (s / 2) + 2 * o + s % 2] = rows[o][192 + s];
  }
  pack_nibbles(rows, 32, q6_low, dst + 288);
  for (int v = 0; v < 16; ++v) {
    for (int o = 0; o < 16; ++o) {
      for (int j = 0; j < 4; ++j) {
        int byte = 0;
        for (int i = 0; i < 4; ++i) byte |= q6_high(rows[o], 16 * v + 4 * i + j) << (2 * i);
        dst[2336 + 64 * v + 4 * o + j] = static_cast<uint8_t>(byte);
      }
    }
  }
}
float weight_q6_k(const uint8_t* t, int o, int k) {
  const int s = k / 16, i = (k % 16) / 4;
  const int high = (t[2336 + 64 * s + 4 * o + k % 4] >> (2 * i)) & 3;
  const int q = nibble(t + 288, o, k) | high << 4;
  const float scale = half_at(t + 2 * o) * static_cast<float>(static_cast<int8_t>(t[32 + 32 * (s / 2) + 2 * o + s % 2]));
  return scale * static_cast<float>(q - 32);
}

const Format kFormats[] = {
    {2, "Q4_0", 32, 18, 288, repack_q4_0, weight_q4_0},
    {3, "Q4_1", 32, 20, 320, repack_q4_1, weight_q4_1},
    {6, "Q5_0", 32, 22, 352, repack_q5_0, weight_q5_0},
    {7, "Q5_1", 32, 24, 384, repack_q5_1, weight_q5_1},
    {8, "Q8_0", 32, 34, 544, repack_q8_0, weight_q8_0},
    {12, "Q4_K", 256, 144, 2368, repack_q4_k, weight_k<false>},
    {13, "Q5_K", 256, 176, 2880, repack_q5_k, weight_k<true>},
    {14, "Q6_K", 256, 210, 3360, repack_q6_k, weight_q6_k},
};

}  // namespace

const Format* formats(int64_t* count) {
  *count = std::size(kFormats);
  return kFormats;
}

const Format* find(int64_t type) { return quant::find_type(kFormats, type); }

}  // namespace vs::i8

namespace vs {

bool is_i8_pack(const at::Tensor& packed) { return is_stack<i8::Header>(packed, i8::kMagic); }

void i8_shape(const at::Tensor& packed, int64_t* out, int64_t* in) {
  *out = i8::view(packed).head->out;
  *in = i8::view(packed).head->in;
}

void embedding_i8(const at::Tensor& packed, const int64_t* id, int64_t n, at::BFloat16* yp) {
  const i8::View v = i8::view(packed);
  const int64_t in = v.head->in;
  at::parallel_for(0, n, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t g = id[r] / kGroupOut, j = (id[r] % kGroupOut) / kTileOut;
      const int o = static_cast<int>(id[r] % kTileOut);
      const i8::Format& f = *i8::find(v.type[g]);
      for (int64_t b = 0; b < in / f.block; ++b) {
        const uint8_t* tile = v.data + v.offset[g] + (b * kGroupTiles + j) * f.tile_bytes;
        for (int k = 0; k < f.block; ++k) yp[r * in + b * f.block + k] = c10::BFloat16(f.weight(tile, o, k));
      }
    }
  });
}

}  // namespace vs

at::Tensor pack_quant_i8(const std::vector<at::Tensor>& raws, const std::vector<int64_t>& types,
                         const std::vector<int64_t>& outs, int64_t in) {
  using namespace vs;
  std::vector<StackPart> parts;
  bool per32 = false, per256 = false;
  for (int64_t type : types) {
    const i8::Format* f = i8::find(type);
    TORCH_CHECK(f, "pack_quant_i8: ggml type ", type, " has no integer kernel");
    parts.push_back({f->name, f->type, f->block, f->raw_bytes, f->tile_bytes, f->repack});
    (f->block == 256 ? per256 : per32) = true;
  }
  Stacked st = pack_stack("pack_quant_i8", raws, parts, outs, in, sizeof(i8::Header));
  const i8::Header head{i8::kMagic, st.out, in, st.groups, st.data_offset, per32, per256, 0};
  std::memcpy(st.packed.data_ptr<uint8_t>(), &head, sizeof(head));
  return st.packed;
}

bool is_quant_i8(const at::Tensor& packed) { return vs::is_i8_pack(packed); }

bool quant_i8_stream_nta() { return vs::i8::kStreamNta; }

std::vector<int64_t> quant_i8_types() {
  int64_t count;
  const vs::i8::Format* all = vs::i8::formats(&count);
  std::vector<int64_t> types;
  for (int64_t i = 0; i < count; ++i) types.push_back(all[i].type);
  return types;
}
