// The AVX-VNNI integer-path module's entry points (quant_i8_vnni256.h): x rounded
// to int8 per row, the matmul over 64-output groups split across threads, the
// rounding to bf16, and the Python bindings. The packs are the AVX-512 module's
// (quant_i8_pack.cpp), so either module takes the other's.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <vector>

#include "kernels.h"
#include "quant_i8_vnni256.h"

namespace vs::i8::v256 {
namespace {

__m256 widen_bf16(const uint16_t* p) {  // exact
  const __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
}

// quant_i8.cpp's quantize_block, 8 values a step: the max is exact in any order, and
// each value's product and rounding (to nearest even) are the same operations.
float quantize_block(const uint16_t* src, int count, int8_t* dst) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < count; i += 8) amax = _mm256_max_ps(amax, _mm256_and_ps(widen_bf16(src + i), magnitude));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float d = _mm_cvtss_f32(m) / 127.0f;
  const __m256 inv = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  for (int i = 0; i < count; i += 8) {
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(widen_bf16(src + i), inv));  // |q| <= 127
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i), _mm_packs_epi16(words, words));
  }
  return d;
}

// The bf16 bits of 8 lanes by c10::BFloat16's rule (round to nearest even, any NaN
// to 0x7fc0), as simd.h's narrow_bf16 rounds 16.
__m128i narrow_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// Group g's accumulators acc [n][4 tiles][16] + bias, rounded once, into y [n, out].
void store_group(int64_t n, int64_t out, int64_t g, const float* acc, const float* bias, uint16_t* y) {
  for (int64_t r = 0; r < n; ++r) {
    for (int q = 0; q < kHalves && g * kGroupOut + q * kHalfOut < out; ++q) {
      const int64_t o = g * kGroupOut + q * kHalfOut;
      const int64_t lanes = std::min<int64_t>(kHalfOut, out - o);
      alignas(32) float b[kHalfOut] = {};
      if (bias) std::copy(bias + o, bias + o + lanes, b);
      __m256 v = _mm256_loadu_ps(acc + r * kGroupOut + q * kHalfOut);
      if (bias) v = _mm256_add_ps(v, _mm256_load_ps(b));
      alignas(16) uint16_t bits[kHalfOut];
      _mm_store_si128(reinterpret_cast<__m128i*>(bits), narrow_bf16(v));
      std::copy(bits, bits + lanes, y + r * out + o);
    }
  }
}

void matmul(const at::Tensor& x, const at::Tensor& packed, const float* bias, at::Tensor& y) {
  const View v = view(packed);
  const int64_t n = x.size(0), in = v.head->in, out = v.head->out;
  const at::Tensor xc = x.contiguous();
  const Rows rows = quantize_rows_by(quantize_block, reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()),
                                     n, in, v.head->per32, v.head->per256);
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  // A thread's share should stream >= ~256 KiB, else wake-up costs dominate.
  const Format* first = find(v.type[0]);
  const int64_t group_bytes = in / first->block * kGroupTiles * first->tile_bytes;
  const int64_t grain = std::max<int64_t>(1, (256 << 10) / group_bytes);
  at::parallel_for(0, v.head->groups, grain, [&](int64_t g0, int64_t g1) {
    std::vector<float> acc(n * kGroupOut);  // [n][4 tiles][16]
    for (int64_t g = g0; g < g1; ++g) {
      const Format* f = find(v.type[g]);
      const uint8_t* gd = v.data + v.offset[g];
      std::fill(acc.begin(), acc.end(), 0.0f);
      if (f->block == 256) {
        v256::k_group(f->type, gd, in / 256, rows, acc.data());
      } else {
        const int64_t chunks = (n + v256::kLegacyMaxRows - 1) / v256::kLegacyMaxRows;
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t r0 = c * n / chunks, count = (c + 1) * n / chunks - r0;
          v256::legacy_group(f->type, gd, in / 32, rows, r0, count, acc.data() + r0 * kGroupOut);
        }
      }
      store_group(n, out, g, acc.data(), bias, yp);
    }
  });
}

}  // namespace
}  // namespace vs::i8::v256

namespace {

bool cpu_has_avx_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("avxvnni");
}

int64_t quant_shape(const at::Tensor& packed, int64_t* in) {
  TORCH_CHECK(vs::is_i8_pack(packed), "the weight must come from pack_quant_i8()");
  int64_t out;
  vs::i8_shape(packed, &out, in);
  return out;
}

at::Tensor linear_i8(const at::Tensor& x, const at::Tensor& packed, int64_t out,
                     const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "linear: bf16 x [n, in]");
  int64_t in;
  const int64_t q_out = quant_shape(packed, &in);
  TORCH_CHECK(q_out == out && in == x.size(1), "linear: shapes do not match the quantized weight (", q_out, " x ",
              in, ")");
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == out, "linear: bias size mismatch");
    bias_f = bias->to(at::kFloat).contiguous();
  }
  at::Tensor y = at::empty({x.size(0), out}, x.options());
  if (x.size(0) == 0 || out == 0) return y;
  vs::i8::v256::matmul(x, packed, bias_f.defined() ? bias_f.data_ptr<float>() : nullptr, y);
  return y;
}

at::Tensor embedding_i8(const at::Tensor& packed, const at::Tensor& ids_in) {
  int64_t in;
  const int64_t out = quant_shape(packed, &in);
  const at::Tensor ids = ids_in.contiguous();
  at::Tensor y = vs::embedding_rows(ids, out, in);
  vs::embedding_i8(packed, ids.data_ptr<int64_t>(), ids.numel(), y.data_ptr<at::BFloat16>());
  return y;
}

std::vector<int64_t> shape_of(const at::Tensor& packed) {
  int64_t in;
  const int64_t out = quant_shape(packed, &in);
  return {out, in};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("init", &cpu_has_avx_vnni, "whether the CPU has AVX2, FMA and AVX-VNNI (this module's instructions)");
  m.def("pack_quant_i8", &pack_quant_i8, "repack GGUF block rows for the integer (int8-activation) matmul",
        py::arg("raws"), py::arg("types"), py::arg("outs"), py::arg("in_features"),
        py::call_guard<py::gil_scoped_release>());
  m.def("quant_i8_types", &quant_i8_types, "ggml type ids pack_quant_i8 supports");
  m.def("quant_i8_stream_nta", &quant_i8_stream_nta,
        "whether the integer path requests its weight stream non-temporally (AMD CPUs)");
  m.def("is_quant_i8", &is_quant_i8, "whether a pack came from pack_quant_i8");
  m.def("embedding", &embedding_i8, "bf16 rows of an integer-path pack", py::arg("packed"), py::arg("ids"),
        py::call_guard<py::gil_scoped_release>());
  m.def("quant_shape", &shape_of, "[out, in] of an integer-path pack");
  m.def("linear", &linear_i8, "bf16 x @ W.T (+ bias) on the integer path, AVX-VNNI; row-invariant",
        py::arg("x"), py::arg("packed"), py::arg("out"), py::arg("bias") = py::none(),
        py::call_guard<py::gil_scoped_release>());
}
