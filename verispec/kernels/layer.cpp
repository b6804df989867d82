// One Llama-family decoder layer in bf16, as a single call: RMSNorm, fused QKV
// (AMX), optional per-head q/k RMSNorm (Qwen3), RoPE, the key/value write into
// each request's cache, row-invariant attention, output projection, residual,
// RMSNorm, fused gate/up (AMX), SiLU * up, down projection, residual.
//
// Why: at one to a few rows per forward, eager PyTorch spends more time
// dispatching ~20 small ops per layer (RMSNorm alone decomposes into six) than
// the memory-bound matmuls take. Here the elementwise work is a few loops.
//
// Numerics follow eager bf16 PyTorch op for op (as models/llama.py does): the
// norm is computed in float32, rounded to bf16, then multiplied by the weight
// and rounded; RoPE's two products round separately before their sum; SiLU
// rounds before the multiply; every residual add rounds. Every step is local to
// a row, so the layer inherits the matmul and attention kernels' invariant: a
// row's bits depend on that row (and its visible keys) only.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "layer_ops.h"

namespace {

using namespace vs;

void rms_norm_row(const bf16* x, const bf16* weight, int64_t n, float eps, bf16* out) {
  __m512 acc = _mm512_setzero_ps();
  chunks(n, [&](int64_t i, __mmask16 m) {
    const __m512 v = load_lanes(x + i, m);
    acc = _mm512_fmadd_ps(v, v, acc);
  });
  const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / n + eps));
  chunks(n, [&](int64_t i, __mmask16 m) {
    const __m512 y = round_bf16(_mm512_mul_ps(load_lanes(x + i, m), inv));
    store_lanes(out + i, _mm512_mul_ps(y, load_lanes(weight + i, m)), m);
  });
}

void silu_mul_row(const bf16* gate, const bf16* up, int64_t n, bf16* out) {
  chunks(n, [&](int64_t i, __mmask16 m) {
    const __m512 g = load_lanes(gate + i, m);
    const __m512 act = round_bf16(_mm512_div_ps(
        g, _mm512_add_ps(_mm512_set1_ps(1.0f), vs::exp_lanes(_mm512_sub_ps(_mm512_setzero_ps(), g)))));
    store_lanes(out + i, _mm512_mul_ps(act, load_lanes(up + i, m)), m);
  });
}

}  // namespace

at::Tensor decoder_layer(const at::Tensor& x_in, const std::vector<at::Tensor>& weights,
                         const std::vector<int64_t>& dims, double eps_d, const at::Tensor& cos,
                         const at::Tensor& sin, const std::vector<at::Tensor>& caches,
                         const at::Tensor& row_cache, const at::Tensor& row_slot,
                         const at::Tensor& row_len, const c10::optional<at::Tensor>& row_index) {
  TORCH_CHECK(weights.size() == 8 && dims.size() == 4, "decoder_layer: 8 weights and 4 dims");
  const at::Tensor& attn_norm = weights[0];
  const at::Tensor& qkv_packed = weights[1];
  const at::Tensor& qkv_bias = weights[2];  // undefined or empty: no bias
  const at::Tensor& qk_norm = weights[3];  // [heads + kv_heads, head_dim], or empty
  const at::Tensor& o_packed = weights[4];
  const at::Tensor& mlp_norm = weights[5];
  const at::Tensor& gate_up_packed = weights[6];
  const at::Tensor& down_packed = weights[7];
  const int64_t heads = dims[0], kv_heads = dims[1], head_dim = dims[2], inter = dims[3];
  const at::Tensor x = x_in.contiguous();
  check_layer_rows(x, cos, sin, head_dim, caches, row_cache, row_slot);
  const int64_t rows = x.size(0), hidden = x.size(1);
  const int64_t width = (heads + 2 * kv_heads) * head_dim;
  const float eps = static_cast<float>(eps_d);
  const bool has_qk_norm = qk_norm.defined() && qk_norm.numel() > 0;
  const int64_t* cache_of = row_cache.data_ptr<int64_t>();
  const int64_t* slot = row_slot.data_ptr<int64_t>();

  at::Tensor h = at::empty_like(x);
  for_rows(rows, [&](int64_t r) {
    rms_norm_row(bf16_data(x) + r * hidden, bf16_data(attn_norm), hidden, eps, h.data_ptr<bf16>() + r * hidden);
  });
  c10::optional<at::Tensor> bias;
  if (qkv_bias.defined() && qkv_bias.numel() > 0) bias = qkv_bias;
  at::Tensor qkv = linear(h, qkv_packed, width, bias);  // [rows, (heads + 2 kv) * head_dim]
  bf16* qkv_p = qkv.data_ptr<bf16>();
  for_rows(rows, [&](int64_t r) {
    bf16* row = qkv_p + r * width;
    for (int64_t head = 0; head < heads + kv_heads; ++head) {
      bf16* v = row + head * head_dim;
      if (has_qk_norm) rms_norm_row(v, bf16_data(qk_norm) + head * head_dim, head_dim, eps, v);
      rope_head(v, bf16_data(cos) + r * head_dim, bf16_data(sin) + r * head_dim, head_dim);
    }
    store_kv_row(row, heads, kv_heads, head_dim, caches[cache_of[r]], slot[r]);
  });
  at::Tensor attn = at::empty({rows, heads * head_dim}, x.options());
  attend_into(qkv_p, width, rows, heads, head_dim, caches, row_cache, row_len,
              row_index.has_value() ? *row_index : at::Tensor(), attn.data_ptr<bf16>(), 0.0, 0.0);
  at::Tensor o = linear(attn, o_packed, hidden, c10::nullopt);
  at::Tensor x1 = at::empty_like(x);
  at::Tensor h2 = at::empty_like(x);
  for_rows(rows, [&](int64_t r) {
    add_rows(bf16_data(x) + r * hidden, bf16_data(o) + r * hidden, hidden, x1.data_ptr<bf16>() + r * hidden);
    rms_norm_row(bf16_data(x1) + r * hidden, bf16_data(mlp_norm), hidden, eps, h2.data_ptr<bf16>() + r * hidden);
  });
  at::Tensor gate_up = linear(h2, gate_up_packed, 2 * inter, c10::nullopt);  // [rows, 2 * inter]
  at::Tensor act = at::empty({rows, inter}, x.options());
  for_rows(rows, [&](int64_t r) {
    const bf16* g = bf16_data(gate_up) + r * 2 * inter;
    silu_mul_row(g, g + inter, inter, act.data_ptr<bf16>() + r * inter);
  });
  at::Tensor down = linear(act, down_packed, hidden, c10::nullopt);
  at::Tensor out = at::empty_like(x);
  for_rows(rows, [&](int64_t r) {
    add_rows(bf16_data(x1) + r * hidden, bf16_data(down) + r * hidden, hidden, out.data_ptr<bf16>() + r * hidden);
  });
  return out;
}
