// Sampling's per-token host work on CPU: the tempered softmax with min_p, top_k and
// top_p (the rules of verispec.step.sampling.torch_probs), and the draw by inversion
// (sampling.sample's, bit for bit). As torch calls these were about ten passes over a
// vocabulary-wide row per emitted token, and top_p's torch.topk alone cost as much as
// the rest together (docs/notebook/sampling.md). Here the nucleus is found among the
// tokens above a falling threshold, which at a useful temperature holds a few tokens,
// and a draw skips the zeros that top_k and top_p leave.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace {

using vs::kLanes;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Rules {
  float temperature;
  float min_p;
  int64_t top_k;  // 0: off
  double top_p;   // 1: off
};

struct Candidate {
  float logit;   // as given, before the temperature
  float weight;  // exp((logit - max) / T), the unnormalized probability
  int32_t index;
};

// The lanes of a 16-wide step at i that lie inside a row of `size`.
inline __mmask16 lanes_at(int64_t i, int64_t size) {
  const int64_t left = size - i;
  return left >= kLanes ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

// top_p's first cut: a token whose weight is under 2^-10 of the top one's is in a
// peaked row's nucleus only when the nucleus is hundreds of tokens wide.
constexpr float kFirstCut = 0x1p-10f;

// The tokens whose lanes `pick(i, lanes)` sets, for the 16-wide steps at i, in index order.
template <class Pick>
void collect(int64_t size, std::vector<int32_t>& index, Pick pick) {
  index.resize(size);
  int64_t n = 0;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t i = 0; i < size; i += kLanes) {
    const __mmask16 in = pick(i, lanes_at(i, size));
    _mm512_mask_compressstoreu_epi32(index.data() + n, in, _mm512_add_epi32(lane, _mm512_set1_epi32(i)));
    n += __builtin_popcount(in);
  }
  index.resize(n);
}

// The lanes of weights at i that reach `cut`.
inline __mmask16 reach(const float* weights, int64_t i, __mmask16 m, float cut) {
  return _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, weights + i), _mm512_set1_ps(cut), _CMP_GE_OQ);
}

// The k-th largest logit among the tokens of positive weight, or -inf where fewer than k
// have weight: a min-heap of the k largest, fed only the lanes above its least.
float kth_logit(const float* logits, const float* weights, int64_t size, int64_t k, std::vector<float>& heap) {
  heap.clear();
  float least = kNegInf;
  for (int64_t i = 0; i < size; i += kLanes) {
    const __mmask16 m = lanes_at(i, size);
    __mmask16 in = reach(weights, i, m, std::numeric_limits<float>::denorm_min());
    in &= _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(m, logits + i), _mm512_set1_ps(least), _CMP_GT_OQ);
    while (in) {
      const float value = logits[i + __builtin_ctz(in)];
      in &= in - 1;
      if (static_cast<int64_t>(heap.size()) == k) {
        if (!(value > heap.front())) continue;
        std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
        heap.back() = value;
      } else {
        heap.push_back(value);
      }
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
      if (static_cast<int64_t>(heap.size()) == k) least = heap.front();
    }
  }
  return static_cast<int64_t>(heap.size()) == k ? heap.front() : kNegInf;
}

// One row: logits -> probabilities in `out`. False where the row holds a NaN or no
// finite maximum: the caller takes torch's path, whose answer (NaN) is then the same.
bool probs_row(const float* logits, int64_t size, const Rules& rules, float* out, std::vector<int32_t>& index,
               std::vector<float>& heap, std::vector<Candidate>& candidates) {
  __m512 high = _mm512_set1_ps(kNegInf);
  __mmask16 nan = 0;
  for (int64_t i = 0; i < size; i += kLanes) {
    const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), lanes_at(i, size), logits + i);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    high = _mm512_max_ps(high, x);
  }
  const float top = _mm512_reduce_max_ps(high);
  if (nan || !std::isfinite(top)) return false;

  // Weights exp((x - top) / T) into `out` (the top one is exactly 1), cut by min_p (a
  // probability under min_p times the top one's is a weight under min_p), and their total.
  const __m512 scale = _mm512_set1_ps(1.0f / rules.temperature), shift = _mm512_set1_ps(top);
  const __m512 floor = _mm512_set1_ps(rules.min_p);
  __m512d total_lo = _mm512_setzero_pd(), total_hi = _mm512_setzero_pd();
  for (int64_t i = 0; i < size; i += kLanes) {
    const __mmask16 m = lanes_at(i, size);
    // (x - max) / T: the top token's difference is exactly 0 (a product then a
    // difference would be contracted into one FMA, which leaves its rounding error).
    __m512 w = vs::exp_lanes(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, logits + i), shift), scale));
    w = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(w, floor, _CMP_GE_OQ) & m, w);
    _mm512_mask_storeu_ps(out + i, m, w);
    total_lo = _mm512_add_pd(total_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(w)));
    total_hi = _mm512_add_pd(total_hi, _mm512_cvtps_pd(_mm256_castsi256_ps(
                                           _mm512_extracti64x4_epi64(_mm512_castps_si512(w), 1))));
  }
  const double total = _mm512_reduce_add_pd(_mm512_add_pd(total_lo, total_hi));

  const bool by_k = rules.top_k > 0 && rules.top_k < size;
  const bool by_p = rules.top_p < 1.0;
  if (!by_k && !by_p) {
    const __m512 normal = _mm512_set1_ps(static_cast<float>(1.0 / total));
    for (int64_t i = 0; i < size; i += kLanes) {
      const __mmask16 m = lanes_at(i, size);
      _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, out + i), normal));
    }
    return true;
  }

  // The candidates: top_k's kept tokens, or else the tokens above a cut that falls
  // from kFirstCut by 16x until they hold top_p's mass, with a margin for the sums'
  // rounding (every token outside then has that mass before it); the last resort is
  // every token of positive weight.
  if (by_k) {
    // Ties with the k-th logit are kept, as torch's `logits < kth` drop keeps them.
    const __m512 kth = _mm512_set1_ps(kth_logit(logits, out, size, rules.top_k, heap));
    collect(size, index, [&](int64_t i, __mmask16 m) {
      return reach(out, i, m, std::numeric_limits<float>::denorm_min()) &
             _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(m, logits + i), kth, _CMP_GE_OQ);
    });
  } else {
    for (float cut = kFirstCut;; cut *= 0x1p-4f) {
      if (cut < 0x1p-126f) cut = std::numeric_limits<float>::denorm_min();
      collect(size, index, [&](int64_t i, __mmask16 m) { return reach(out, i, m, cut); });
      double mass = 0.0;
      for (const int32_t i : index) mass += out[i];
      if (mass >= rules.top_p * total * (1.0 + 1e-6) || cut == std::numeric_limits<float>::denorm_min()) break;
    }
  }
  candidates.resize(index.size());
  for (size_t j = 0; j < index.size(); ++j) {
    candidates[j] = {logits[index[j]], out[index[j]], index[j]};
  }
  // Descending logits (T > 0 keeps their order); the order among ties is free (as
  // with a sort), fixed by index.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.index < b.index);
  });

  // kept_total ends as the kept tokens' sum in their sorted order: top_k's candidates
  // whole, or top_p's running sum where its rule stops.
  size_t kept = candidates.size();
  double kept_total = 0.0;
  if (by_k) {
    for (const Candidate& c : candidates) kept_total += c.weight;
  }
  if (by_p) {
    // A token is dropped once the mass strictly before it reaches top_p; the first is kept.
    const double limit = rules.top_p * (by_k ? kept_total : total);
    double before = candidates[0].weight;
    size_t j = 1;
    while (j < kept && before < limit) before += candidates[j++].weight;
    kept = j;
    kept_total = before;
  }
  std::memset(out, 0, sizeof(float) * size);
  for (size_t j = 0; j < kept; ++j) {
    out[candidates[j].index] = static_cast<float>(candidates[j].weight / kept_total);
  }
  return true;
}

// One draw: the first token whose float64 cumulative mass exceeds u times the row's
// total, the last token of positive mass where u * total rounds up to the total, the
// last token where none has mass. The running sum adds the row's values in order, as
// sample()'s torch cumsum does; a sparse row (top_k's or top_p's) skips its exact
// zeros, which would add nothing, so every partial sum, and the token, is the same.
int64_t draw_row(const float* probs, int64_t size, double uniform, std::vector<int32_t>& index,
                 std::vector<double>& cumulative) {
  collect(size, index, [&](int64_t i, __mmask16 m) {
    return _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, probs + i), _mm512_setzero_ps(), _CMP_NEQ_UQ);
  });
  const bool dense = static_cast<int64_t>(index.size()) > size / 8;
  const int64_t count = dense ? size : static_cast<int64_t>(index.size());
  const auto position = [&](int64_t j) { return dense ? j : static_cast<int64_t>(index[j]); };
  cumulative.resize(count);
  double running = 0.0;
  for (int64_t j = 0; j < count; ++j) cumulative[j] = running += static_cast<double>(probs[position(j)]);
  const double target = uniform * running;
  const auto first = std::upper_bound(cumulative.begin(), cumulative.end(), target);
  if (first != cumulative.end()) return position(first - cumulative.begin());
  for (int64_t j = count - 1; j >= 0; --j) {
    if (probs[position(j)] > 0) return position(j);
  }
  return size - 1;
}

// Scratch kept per thread: a vocabulary-wide vector allocated per call is a fresh
// mapping whose pages fault in on every emitted token.
struct Scratch {
  std::vector<float> heap;
  std::vector<Candidate> candidates;
  std::vector<int32_t> index;
  std::vector<double> cumulative;
};

Scratch& scratch() {
  thread_local Scratch kept;
  return kept;
}

}  // namespace

c10::optional<at::Tensor> sampling_probs(const at::Tensor& logits, double temperature, double min_p,
                                         int64_t top_k, double top_p) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous(),
              "sampling_probs: logits must be contiguous float32 [rows, vocab]");
  TORCH_CHECK(temperature > 0 && top_k >= 0 && top_p > 0 && top_p <= 1 && min_p >= 0 && min_p <= 1,
              "sampling_probs: temperature > 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1]");
  const int64_t rows = logits.size(0), size = logits.size(1);
  TORCH_CHECK(size > 0 && size < (int64_t{1} << 31), "sampling_probs: vocabulary of 1 to 2^31 - 1 tokens");
  at::Tensor out = at::empty_like(logits);
  const Rules rules{static_cast<float>(temperature), static_cast<float>(min_p), top_k, top_p};
  Scratch& work = scratch();
  for (int64_t r = 0; r < rows; ++r) {
    if (!probs_row(logits.data_ptr<float>() + r * size, size, rules, out.data_ptr<float>() + r * size,
                   work.index, work.heap, work.candidates)) {
      return c10::nullopt;
    }
  }
  return out;
}

at::Tensor sampling_draw(const at::Tensor& probs, const at::Tensor& uniforms) {
  TORCH_CHECK(probs.dim() == 2 && probs.scalar_type() == at::kFloat && probs.is_contiguous(),
              "sampling_draw: probs must be contiguous float32 [rows, vocab]");
  TORCH_CHECK(uniforms.dim() == 1 && uniforms.scalar_type() == at::kDouble && uniforms.size(0) == probs.size(0),
              "sampling_draw: uniforms must be float64 [rows]");
  const int64_t rows = probs.size(0), size = probs.size(1);
  TORCH_CHECK(size > 0 && size < (int64_t{1} << 31), "sampling_draw: vocabulary of 1 to 2^31 - 1 tokens");
  at::Tensor drawn = at::empty({rows}, at::kLong);
  const at::Tensor u = uniforms.contiguous();
  Scratch& work = scratch();
  for (int64_t r = 0; r < rows; ++r) {
    drawn.data_ptr<int64_t>()[r] = draw_row(probs.data_ptr<float>() + r * size, size, u.data_ptr<double>()[r],
                                            work.index, work.cumulative);
  }
  return drawn;
}
