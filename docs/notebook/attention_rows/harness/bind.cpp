// Issue 40, ran at attn8 on main 749eff8: the binding of the harness's standalone attention modules.
#include <torch/extension.h>
#include <chrono>
#include "kernels.h"

// Median-free raw timing: calls attend_into `reps` times, returns seconds per call.
double attend_repeat(const at::Tensor& q, const std::vector<at::Tensor>& caches, const at::Tensor& row_cache,
                     const at::Tensor& row_len, const c10::optional<at::Tensor>& row_index, int64_t reps) {
  const int64_t rows = q.size(0), heads = q.size(1), hd = q.size(2);
  at::Tensor out = at::empty({rows, heads * hd}, q.options());
  at::Tensor ix = row_index.has_value() ? *row_index : at::Tensor();
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < reps; ++i)
    attend_into(q.data_ptr<at::BFloat16>(), heads * hd, rows, heads, hd, caches, row_cache, row_len, ix,
                out.data_ptr<at::BFloat16>(), 0.0, 0.0);
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count() / reps;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attend", &attend);
  m.def("attend_repeat", &attend_repeat);
}
