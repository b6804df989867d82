// The integer path's matmul on AVX-512-VNNI (quant_i8.h says what it computes and
// why the bits are row-invariant): x rounded to int8 per row, the matmul over
// 64-output groups split across threads. The pack and the embedding lookup are
// layout code, in quant_i8_pack.cpp.
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

}  // namespace

Rows quantize_rows(const uint16_t* x, int64_t n, int64_t in, bool per32, bool per256) {
  return quantize_rows_by(quantize_block, x, n, in, per32, per256);
}

}  // namespace i8

void matmul_i8(const at::Tensor& x, const at::Tensor& packed, const float* bias, at::Tensor& y) {
  const i8::View v = i8::view(packed);
  const int64_t n = x.size(0), in = v.head->in, out = v.head->out;
  const at::Tensor xc = x.contiguous();
  const i8::Rows rows = i8::quantize_rows(reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()), n, in,
                                          v.head->per32, v.head->per256);
  const bool wide = y.scalar_type() == at::kFloat;
  MatmulArgs args{nullptr, in, n, out, v.head->groups, in / kTileK, bias,
                  wide ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), 0, 0,
                  wide ? y.data_ptr<float>() : nullptr};
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
        const int64_t chunks = (n + i8::kLegacyMaxRows - 1) / i8::kLegacyMaxRows;
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t r0 = c * n / chunks, count = (c + 1) * n / chunks - r0;
          i8::legacy_group(f->type, gd, in / 32, rows, r0, count, acc.data() + r0 * kGroupOut);
        }
      }
      store_group(args, g, acc.data());
    }
  });
}

}  // namespace vs
