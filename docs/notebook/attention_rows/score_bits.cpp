// (Issue 40, ran at attn8 on main 749eff8.) Every raw score of both scoring paths of attention.cpp (block_scores key by key,
// transposed_scores over a shared transposed block) for one query block against
// a key list, so score_bits.py can compare them bit for bit. The kernel's own
// source is included so that its internal (anonymous-namespace) functions are
// the ones compared.
#include <torch/extension.h>

#include "attention.cpp"

template <int CH>
std::vector<at::Tensor> scores_both_ways(const at::Tensor& q, const at::Tensor& keys) {
  using T = at::BFloat16;
  const int64_t heads = q.size(0), n = keys.size(0), head_dim = q.size(1), padded = (n + 15) / 16 * 16;
  at::Tensor by_key = at::zeros({heads, padded}), shared = at::zeros({heads, padded});
  const T* qp = q.data_ptr<T>();
  const T* kp = keys.data_ptr<T>();
  alignas(64) __m512i kt[CH * 8];
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t span = std::min<int64_t>(16, n - j);
    vs::transpose_keys<CH>(kp, head_dim, j, span, kt);
    for (int64_t g = 0; g < heads; ++g) {
      _mm512_storeu_ps(by_key.data_ptr<float>() + g * padded + j,
                       block_scores<T, CH>(qp + g * head_dim, kp, head_dim, RowKeys{n, nullptr}, j));
    }
    for (int64_t g0 = 0; g0 < heads; g0 += 4) {
      const T* qs[4];
      __m512 raw[4];
      const int64_t pairs = std::min<int64_t>(4, heads - g0);
      for (int64_t p = 0; p < pairs; ++p) qs[p] = qp + (g0 + p) * head_dim;
      switch (pairs) {
        case 1: vs::transposed_scores<CH, 1>(kt, qs, raw); break;
        case 2: vs::transposed_scores<CH, 2>(kt, qs, raw); break;
        case 3: vs::transposed_scores<CH, 3>(kt, qs, raw); break;
        default: vs::transposed_scores<CH, 4>(kt, qs, raw); break;
      }
      // Lanes past the last key: block_scores leaves 0 there, the kernel masks both to -inf.
      for (int64_t p = 0; p < pairs; ++p) {
        _mm512_storeu_ps(shared.data_ptr<float>() + (g0 + p) * padded + j,
                         _mm512_maskz_mov_ps((__mmask16)((1u << span) - 1), raw[p]));
      }
    }
  }
  return {by_key, shared};
}

std::vector<at::Tensor> scores_both(const at::Tensor& q, const at::Tensor& keys) {
  switch (q.size(1) / 16) {
    case 2: return scores_both_ways<2>(q, keys);
    case 4: return scores_both_ways<4>(q, keys);
    case 6: return scores_both_ways<6>(q, keys);
    case 8: return scores_both_ways<8>(q, keys);
    case 16: return scores_both_ways<16>(q, keys);
  }
  TORCH_CHECK(false, "head_dim 32, 64, 96, 128 or 256");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scores_both", &scores_both); }
