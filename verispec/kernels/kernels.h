// The entry points of verispec's CPU kernels; bindings.cpp exposes them to Python.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

int64_t init();  // 2: AMX, 1: AVX-512-BF16, 0: neither (see gemv_bf16.cpp)
at::Tensor pack(const at::Tensor& weight);
// float_out: float32 y holding the bf16-rounded values (the logits), else bf16 y.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t out,
                  const c10::optional<at::Tensor>& bias, bool float_out = false);
at::Tensor pack_quant(const std::vector<at::Tensor>& raws, const std::vector<int64_t>& types,
                      const std::vector<int64_t>& outs, int64_t in);
at::Tensor embedding(const at::Tensor& packed, const at::Tensor& ids);
std::vector<int64_t> quant_types();
// GGUF block rows for the integer path (quant_i8*.cpp): every format of quant_types().
at::Tensor pack_quant_i8(const std::vector<at::Tensor>& raws, const std::vector<int64_t>& types,
                         const std::vector<int64_t>& outs, int64_t in);
std::vector<int64_t> quant_i8_types();
bool quant_i8_stream_nta();  // whether the integer path requests its weights NTA (quant_i8.h)
bool is_quant_i8(const at::Tensor& packed);  // whether pack_quant_i8 made it
// Row counts up to this take the fused quantized matmul on AVX-512 (0: never);
// rows >= 0 sets it. Returns the value in force.
int64_t quant_fused_rows(int64_t rows);
std::vector<int64_t> quant_pack_shape(const at::Tensor& packed);
at::Tensor attend(const at::Tensor& q, const std::vector<at::Tensor>& caches,
                  const at::Tensor& row_cache, const at::Tensor& row_len,
                  const c10::optional<at::Tensor>& row_index, double scale, double softcap);
// How bf16 attention scores are summed in this process: "fma" or "vdpbf16ps" (attention_blocks.h).
std::string attention_dots();
// attend for bf16 q rows `q_stride` elements apart, writing [rows, heads * head_dim] to out.
void attend_into(const at::BFloat16* q, int64_t q_stride, int64_t rows, int64_t heads, int64_t head_dim,
                 const std::vector<at::Tensor>& caches, const at::Tensor& row_cache,
                 const at::Tensor& row_len, const at::Tensor& row_index, at::BFloat16* out,
                 double scale, double softcap);
at::Tensor decoder_layer(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                         const std::vector<int64_t>& dims, double eps, const at::Tensor& cos,
                         const at::Tensor& sin, const std::vector<at::Tensor>& caches,
                         const at::Tensor& row_cache, const at::Tensor& row_slot,
                         const at::Tensor& row_len, const c10::optional<at::Tensor>& row_index);
// decoder_layer with Gemma 2/3's norms, GeGLU, score scale and soft-cap (gemma_layer.cpp).
at::Tensor gemma_layer(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                       const std::vector<int64_t>& dims, double eps, double scale, double softcap,
                       const at::Tensor& cos, const at::Tensor& sin, const std::vector<at::Tensor>& caches,
                       const at::Tensor& row_cache, const at::Tensor& row_slot, const at::Tensor& row_len,
                       const c10::optional<at::Tensor>& row_index);
// Sampling's host work on CPU (sampling.cpp): a row's probabilities under temperature,
// min_p, top_k and top_p (nullopt where a row holds a NaN or no finite logit), and one
// draw per row by inversion of uniforms [rows] float64.
c10::optional<at::Tensor> sampling_probs(const at::Tensor& logits, double temperature, double min_p,
                                         int64_t top_k, double top_p);
at::Tensor sampling_draw(const at::Tensor& probs, const at::Tensor& uniforms);
// Suffix decoding's lookup over one token stream and its anchor chains (suffix.cpp).
struct SuffixChain {
  int64_t match_length;
  std::vector<int64_t> tokens;  // the likeliest chain at this match length
  std::vector<double> probs;    // each token's share of the occurrences
};
struct SuffixLookup {
  int64_t longest;  // the longest match found (0: none)
  std::vector<SuffixChain> chains;
};
SuffixLookup suffix_chains(const int64_t* tokens, int64_t size, int64_t offset, int64_t live,
                           const std::vector<int64_t>& anchors, const std::vector<int64_t>& heads,
                           const std::vector<const int64_t*>& chains, const std::vector<int64_t>& query,
                           int64_t recent, int64_t k, const std::vector<int64_t>& caps, double min_prob,
                           const std::vector<int64_t>& stop, int64_t tried);
// The same over one request's own context (no index: a scan of it, newest first).
SuffixLookup suffix_scan(const int64_t* context, int64_t size, const std::vector<int64_t>& anchors,
                         const std::vector<int64_t>& query, int64_t recent, int64_t k,
                         const std::vector<int64_t>& caps, double min_prob,
                         const std::vector<int64_t>& stop, int64_t tried);
