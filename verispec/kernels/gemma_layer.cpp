// One Gemma 2 / Gemma 3 (text) decoder layer in bf16, as a single call: the
// Llama layer of layer.cpp with Gemma's changes, each as transformers'
// modeling_gemma2/3 computes it:
//   - RMSNorm scales by (1 + w) in float32 and rounds once (the weights come
//     in as float32 1 + w, so the multiply happens before the cast);
//   - Gemma 3 normalizes each q and k head the same way before RoPE;
//   - attention scores are scaled by query_pre_attn_scalar^-0.5 and, for
//     Gemma 2, soft-capped (attention.cpp);
//   - a norm after attention, one before and one after the MLP, each output
//     normed before its residual add;
//   - GeGLU with tanh gelu, rounded to bf16 before the multiply by up.
// Each step is local to a row, so, like the Llama layer, a row's bits depend on
// that row and its visible keys only: plain decoding, verification blocks,
// trees and batches of requests give a position the same bits.
#include <ATen/ATen.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "layer_ops.h"

namespace {

using namespace vs;

// Gemma's RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), all in float32, one rounding.
void gemma_norm_row(const bf16* x, const float* weight, int64_t n, float eps, bf16* out) {
  __m512 acc = _mm512_setzero_ps();
  chunks(n, [&](int64_t i, __mmask16 m) {
    const __m512 v = load_lanes(x + i, m);
    acc = _mm512_fmadd_ps(v, v, acc);
  });
  const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / n + eps));
  chunks(n, [&](int64_t i, __mmask16 m) {
    store_lanes(out + i, _mm512_mul_ps(_mm512_mul_ps(load_lanes(x + i, m), inv), load_lanes(weight + i, m)), m);
  });
}

// gelu_tanh(gate) rounded to bf16, times up: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))).
void gelu_mul_row(const bf16* gate, const bf16* up, int64_t n, bf16* out) {
  const __m512 beta = _mm512_set1_ps(0.7978845608028654f), kappa = _mm512_set1_ps(0.044715f);
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
  chunks(n, [&](int64_t i, __mmask16 m) {
    const __m512 g = load_lanes(gate + i, m);
    const __m512 inner = _mm512_mul_ps(beta, _mm512_fmadd_ps(_mm512_mul_ps(kappa, g), _mm512_mul_ps(g, g), g));
    const __m512 act = round_bf16(_mm512_mul_ps(_mm512_mul_ps(half, g), _mm512_add_ps(one, tanh_lanes(inner))));
    store_lanes(out + i, _mm512_mul_ps(act, load_lanes(up + i, m)), m);
  });
}

const float* f32_data(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), "gemma_layer: norms must be contiguous float32");
  return t.data_ptr<float>();
}

}  // namespace

at::Tensor gemma_layer(const at::Tensor& x_in, const std::vector<at::Tensor>& weights,
                       const std::vector<int64_t>& dims, double eps_d, double scale, double softcap,
                       const at::Tensor& cos, const at::Tensor& sin, const std::vector<at::Tensor>& caches,
                       const at::Tensor& row_cache, const at::Tensor& row_slot, const at::Tensor& row_len,
                       const c10::optional<at::Tensor>& row_index) {
  TORCH_CHECK(weights.size() == 10 && dims.size() == 4, "gemma_layer: 10 weights and 4 dims");
  const float* attn_norm = f32_data(weights[0]);
  const at::Tensor& qkv_packed = weights[1];
  const at::Tensor& qkv_bias = weights[2];  // empty: no bias
  const at::Tensor& qk_norm = weights[3];  // float32 [heads + kv_heads, head_dim] of 1 + w, or empty
  const at::Tensor& o_packed = weights[4];
  const float* post_attn_norm = f32_data(weights[5]);
  const float* pre_ff_norm = f32_data(weights[6]);
  const at::Tensor& gate_up_packed = weights[7];
  const at::Tensor& down_packed = weights[8];
  const float* post_ff_norm = f32_data(weights[9]);
  const int64_t heads = dims[0], kv_heads = dims[1], head_dim = dims[2], inter = dims[3];
  const at::Tensor x = x_in.contiguous();
  check_layer_rows(x, cos, sin, head_dim, caches, row_cache, row_slot);
  const int64_t rows = x.size(0), hidden = x.size(1);
  const int64_t width = (heads + 2 * kv_heads) * head_dim;
  const float eps = static_cast<float>(eps_d);
  const float* qk_w = qk_norm.numel() > 0 ? f32_data(qk_norm) : nullptr;
  const int64_t* cache_of = row_cache.data_ptr<int64_t>();
  const int64_t* slot = row_slot.data_ptr<int64_t>();

  at::Tensor h = at::empty_like(x);
  for_rows(rows, [&](int64_t r) {
    gemma_norm_row(bf16_data(x) + r * hidden, attn_norm, hidden, eps, h.data_ptr<bf16>() + r * hidden);
  });
  c10::optional<at::Tensor> bias;
  if (qkv_bias.defined() && qkv_bias.numel() > 0) bias = qkv_bias;
  at::Tensor qkv = linear(h, qkv_packed, width, bias);  // [rows, (heads + 2 kv) * head_dim]
  bf16* qkv_p = qkv.data_ptr<bf16>();
  for_rows(rows, [&](int64_t r) {
    bf16* row = qkv_p + r * width;
    for (int64_t head = 0; head < heads + kv_heads; ++head) {
      bf16* v = row + head * head_dim;
      if (qk_w) gemma_norm_row(v, qk_w + head * head_dim, head_dim, eps, v);
      rope_head(v, bf16_data(cos) + r * head_dim, bf16_data(sin) + r * head_dim, head_dim);
    }
    store_kv_row(row, heads, kv_heads, head_dim, caches[cache_of[r]], slot[r]);
  });
  at::Tensor attn = at::empty({rows, heads * head_dim}, x.options());
  attend_into(qkv_p, width, rows, heads, head_dim, caches, row_cache, row_len,
              row_index.has_value() ? *row_index : at::Tensor(), attn.data_ptr<bf16>(), scale, softcap);
  at::Tensor o = linear(attn, o_packed, hidden, c10::nullopt);
  at::Tensor x1 = at::empty_like(x);
  at::Tensor h2 = at::empty_like(x);
  for_rows(rows, [&](int64_t r) {
    bf16* o_row = o.data_ptr<bf16>() + r * hidden;
    gemma_norm_row(o_row, post_attn_norm, hidden, eps, o_row);
    add_rows(bf16_data(x) + r * hidden, o_row, hidden, x1.data_ptr<bf16>() + r * hidden);
    gemma_norm_row(bf16_data(x1) + r * hidden, pre_ff_norm, hidden, eps, h2.data_ptr<bf16>() + r * hidden);
  });
  at::Tensor gate_up = linear(h2, gate_up_packed, 2 * inter, c10::nullopt);  // [rows, 2 * inter]
  at::Tensor act = at::empty({rows, inter}, x.options());
  for_rows(rows, [&](int64_t r) {
    const bf16* g = bf16_data(gate_up) + r * 2 * inter;
    gelu_mul_row(g, g + inter, inter, act.data_ptr<bf16>() + r * inter);
  });
  at::Tensor down = linear(act, down_packed, hidden, c10::nullopt);
  at::Tensor out = at::empty_like(x);
  for_rows(rows, [&](int64_t r) {
    bf16* d_row = down.data_ptr<bf16>() + r * hidden;
    gemma_norm_row(d_row, post_ff_norm, hidden, eps, d_row);
    add_rows(bf16_data(x1) + r * hidden, d_row, hidden, out.data_ptr<bf16>() + r * hidden);
  });
  return out;
}
