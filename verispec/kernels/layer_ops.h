// Row-local pieces of the fused decoder layers (layer.cpp: Llama family,
// gemma_layer.cpp: Gemma 2/3). Each touches one row only, which is what keeps
// the layers' row invariance: a row's bits depend on that row and its visible keys.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"

namespace vs {

using bf16 = at::BFloat16;

// Calls f(offset, mask) for 16-lane chunks covering [0, n).
template <typename F>
inline void chunks(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) f(i, (__mmask16)0xffff);
  if (i < n) f(i, tail_mask(n - i));
}

// x * cos + swap_halves(x) * sin_signed for one head, in place; the two products
// round to bf16 separately before their sum, as eager bf16 PyTorch does.
inline void rope_head(bf16* x, const bf16* cos, const bf16* sin, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  chunks(half, [&](int64_t i, __mmask16 m) {
    const __m512 lo = load_lanes(x + i, m), hi = load_lanes(x + half + i, m);
    const __m512 new_lo = _mm512_add_ps(round_bf16(_mm512_mul_ps(lo, load_lanes(cos + i, m))),
                                        round_bf16(_mm512_mul_ps(hi, load_lanes(sin + i, m))));
    const __m512 new_hi = _mm512_add_ps(round_bf16(_mm512_mul_ps(hi, load_lanes(cos + half + i, m))),
                                        round_bf16(_mm512_mul_ps(lo, load_lanes(sin + half + i, m))));
    store_lanes(x + i, new_lo, m);
    store_lanes(x + half + i, new_hi, m);
  });
}

inline void add_rows(const bf16* a, const bf16* b, int64_t n, bf16* out) {
  chunks(n, [&](int64_t i, __mmask16 m) {
    store_lanes(out + i, _mm512_add_ps(load_lanes(a + i, m), load_lanes(b + i, m)), m);
  });
}

// Elementwise work over rows: small blocks run inline, large ones split by rows.
template <typename F>
inline void for_rows(int64_t rows, F&& f) {
  at::parallel_for(0, rows, 32, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) f(r);
  });
}

inline const bf16* bf16_data(const at::Tensor& t) { return t.data_ptr<bf16>(); }

// One row's new key and value (the k and v parts of its qkv row) into its cache slot.
inline void store_kv_row(const bf16* row, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         const at::Tensor& kv, int64_t slot) {
  bf16* base = kv.data_ptr<bf16>() + slot * kv.stride(2);
  for (int64_t head = 0; head < kv_heads; ++head) {
    std::memcpy(base + head * kv.stride(1), row + (heads + head) * head_dim, head_dim * sizeof(bf16));
    std::memcpy(base + kv.stride(0) + head * kv.stride(1), row + (heads + kv_heads + head) * head_dim,
                head_dim * sizeof(bf16));
  }
}

// Checks shared by the fused layers' arguments.
inline void check_layer_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             int64_t head_dim, const std::vector<at::Tensor>& caches,
                             const at::Tensor& row_cache, const at::Tensor& row_slot) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "layer: bf16 x [rows, hidden]");
  const int64_t rows = x.size(0);
  TORCH_CHECK(head_dim % 2 == 0 && cos.size(0) == rows && cos.size(1) == head_dim && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16,
              "layer: cos/sin must be contiguous bf16 [rows, head_dim]");
  TORCH_CHECK(row_slot.scalar_type() == at::kLong && row_slot.numel() == rows && row_slot.is_contiguous(),
              "layer: row_slot must be int64 [rows]");
  const int64_t* cache_of = row_cache.data_ptr<int64_t>();
  const int64_t* slot = row_slot.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(cache_of[r] >= 0 && cache_of[r] < static_cast<int64_t>(caches.size()) && slot[r] >= 0 &&
                    slot[r] < caches[cache_of[r]].size(2),
                "layer: row cache or slot out of range");
  }
}

}  // namespace vs
