// The integer path's entry points (quant_i8.h says what it computes and why the
// bits are row-invariant): the pack, x rounded to int8 per row, the matmul over
// 64-output groups split across threads, and the embedding lookup.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "kernels.h"
#include "quant_i8.h"

// VPDPBUSD for these files only: the module still loads on a CPU without VNNI, and
// kernels.quant_i8_types() is empty there, so nothing calls into this code.
#pragma GCC target("avx512vnni")

namespace vs {
namespace i8 {
namespace {

__m512 widen_bf16(const uint16_t* p) {  // exact
  const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}

// values [count] (a multiple of 16) of one row -> int8 q, d = max|x| / 127.
float quantize_block(const uint16_t* src, int count, int8_t* dst) {
  __m512 amax = _mm512_setzero_ps();
  for (int i = 0; i < count; i += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(widen_bf16(src + i)));
  const float d = _mm512_reduce_max_ps(amax) / 127.0f;
  const __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  for (int i = 0; i < count; i += 16) {
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(widen_bf16(src + i), inv));  // round to nearest even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtsepi32_epi8(q));
  }
  return d;
}

int32_t sum_of(const int8_t* q, int count) {
  int32_t sum = 0;
  for (int e = 0; e < count; ++e) sum += q[e];
  return sum;
}

}  // namespace

Rows quantize_rows(const uint16_t* x, int64_t n, int64_t in, bool per32, bool per256) {
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
        rows.s32[i] = sum_of(q, 32);
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
      for (int64_t s = 0; s < in / 16; ++s) rows.sum16[r * in / 16 + s] = sum_of(rows.q256.data() + r * in + 16 * s, 16);
      for (int64_t s = 0; s < in / 32; ++s) {
        rows.sum32[r * in / 32 + s] = rows.sum16[r * in / 16 + 2 * s] + rows.sum16[r * in / 16 + 2 * s + 1];
      }
    }
  }
  return rows;
}

}  // namespace i8

bool is_i8_pack(const at::Tensor& packed) { return is_stack<i8::Header>(packed, i8::kMagic); }

void i8_shape(const at::Tensor& packed, int64_t* out, int64_t* in) {
  *out = i8::view(packed).head->out;
  *in = i8::view(packed).head->in;
}

void matmul_i8(const at::Tensor& x, const at::Tensor& packed, const float* bias, at::Tensor& y) {
  const i8::View v = i8::view(packed);
  const int64_t n = x.size(0), in = v.head->in, out = v.head->out;
  const at::Tensor xc = x.contiguous();
  const i8::Rows rows = i8::quantize_rows(reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()), n, in,
                                          v.head->per32, v.head->per256);
  MatmulArgs args{nullptr, in, n, out, v.head->groups, in / kTileK, bias,
                  reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), 0, 0};
  // A thread's share should stream >= ~256 KiB, else wake-up costs dominate.
  const i8::Format* first = i8::find(v.type[0]);
  const int64_t group_bytes = in / first->block * kGroupTiles * first->tile_bytes;
  const int64_t grain = std::max<int64_t>(1, (256 << 10) / group_bytes);
  at::parallel_for(0, args.groups, grain, [&](int64_t g0, int64_t g1) {
    std::vector<float> acc(n * kGroupOut);  // [n][4 tiles][16]
    for (int64_t g = g0; g < g1; ++g) {
      const i8::Format* f = i8::find(v.type[g]);
      const uint8_t* gd = v.data + v.offset[g];
      if (f->block == 256) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        i8::k_group(f->type, gd, in / 256, rows, acc.data());
      } else {
        constexpr int64_t kChunk = 6;  // rows per pass of the 32-weight kernels (quant_i8_legacy.cpp)
        const int64_t chunks = (n + kChunk - 1) / kChunk;
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t r0 = c * n / chunks, count = (c + 1) * n / chunks - r0;
          i8::legacy_group(f->type, gd, in / 32, rows, r0, count, acc.data() + r0 * kGroupOut);
        }
      }
      store_group(args, g, acc.data());
    }
  });
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

std::vector<int64_t> quant_i8_types() {
  int64_t count;
  const vs::i8::Format* all = vs::i8::formats(&count);
  std::vector<int64_t> types;
  for (int64_t i = 0; i < count; ++i) types.push_back(all[i].type);
  return types;
}
