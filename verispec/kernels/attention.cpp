// Attention whose result for a query row depends on nothing but that row.
//
// out[r] = softmax(cap(q[r] . K_r^T * scale)) . V_r, where K_r, V_r are the keys and
// values row r may see: a prefix [0, len[r]) of its request's cache, or an
// explicit ascending list of cache indices (a token-tree node: the context plus
// its ancestors). Rows of one call may belong to different requests (caches).
//
// Invariant (the lossless law depends on it): every (row, kv head) pair is
// computed by one thread in one fixed sequence: scores key by key in list order,
// each a dot product over head_dim in 16-lane chunks in increasing order with a
// fixed horizontal reduction (bf16 chunks by VDPBF16PS or its FMA spelling, one
// per process: attention_blocks.h); the max, the exp and the sum over a scores buffer
// whose lane layout depends only on the key count; then values accumulated key
// by key. So a row's bits are the same alone (plain decoding), inside a
// verification block, inside a tree, or inside a batch of other requests, and
// independent of the thread count. SDPA picks its blocking from the shapes, which
// is exactly what changes greedy outputs in half precision.
//
// scale defaults to head_dim^-0.5 (Gemma passes query_pre_attn_scalar^-0.5);
// cap(s) = tanh(s / c) * c where a soft-cap c > 0 is given (Gemma 2), else s.
//
// Math is float32 throughout; bf16 inputs are widened exactly and the result is
// rounded once (round to nearest even, torch's rule).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "attention_blocks.h"
#include "simd.h"

namespace {

using vs::kLanes;
using vs::load_lanes;
using vs::store_lanes;
using vs::exp_lanes;
using namespace vs::attn;
constexpr int kMaxChunks = 8;  // head_dim <= 128, or exactly 256 (Gemma 2 and 3)
constexpr int kMaxGroups = 16;  // query heads per key/value head

// Lane i of join_halves(sum_half(a), sum_half(a + 8)) = the sum of the 16 lanes of
// a[i]: a fixed transpose-and-add tree (in-lane unpacks, then shuffles across 128-bit
// lanes), ~3 ops a key instead of a full horizontal reduction per key. Built 8 keys at
// a time so that their accumulators and the tree's temporaries fit in registers; the
// pairing is the one the whole tree had, so the bits are too.
inline __m512 sum_half(const __m512* a) {
  __m512 s[4];
  for (int i = 0; i < 4; ++i) {
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  const __m512 t0 = _mm512_add_ps(_mm512_shuffle_ps(s[0], s[1], 0x44), _mm512_shuffle_ps(s[0], s[1], 0xEE));
  const __m512 t1 = _mm512_add_ps(_mm512_shuffle_ps(s[2], s[3], 0x44), _mm512_shuffle_ps(s[2], s[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD));
}

inline __m512 join_halves(__m512 w0, __m512 w1) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}

// 16 lanes of partial products q . k over head_dim (CH chunks of 16), in a fixed
// chunk order. bf16 with an even CH uses VDPBF16PS (exact bf16 products added in
// pairs, no widening); everything else widens to float32 and uses FMA. CH is a
// template parameter so that every accumulator lives in a register.
template <typename T, int CH>
inline __m512 partial_dot(const T* q, const T* k) {
  if constexpr (std::is_same_v<T, at::BFloat16> && CH % 2 == 0) {
    __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int c = 0; c < CH / 2; ++c) {
      acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + c * 2 * kLanes),
                             (__m512bh)_mm512_loadu_si512(k + c * 2 * kLanes));
    }
    return acc;
  } else {
    __m512 acc = _mm512_mul_ps(load_lanes(q), load_lanes(k));
#pragma GCC unroll 8
    for (int c = 1; c < CH; ++c) acc = _mm512_fmadd_ps(load_lanes(q + c * kLanes), load_lanes(k + c * kLanes), acc);
    return acc;
  }
}

// Scores of keys j0 .. j0 + 15, 8 keys at a time so that 8 accumulators and the tree's
// temporaries stay in registers; dots(h, acc) gives keys j0 + 8h .. j0 + 8h + 7's 16
// lanes of partial products (zero past the row's last key).
template <class Dots>
inline __m512 block_scores(Dots dots) {
  __m512 w[2];
  for (int h = 0; h < 2; ++h) {
    __m512 acc[8];
    dots(h, acc);
    w[h] = sum_half(acc);
  }
  return join_halves(w[0], w[1]);
}

// One row's visible keys and where its query and output live.
template <typename T>
struct RowJob {
  const T* q;  // [groups, head_dim] of this kv head
  T* out;
  RowKeys seen;
  float* scores;  // [groups][padded + kLanes]: scores, then probabilities, then 1/sum
  int64_t padded;
};

constexpr int64_t kRowBlock = 8;  // rows of one request sharing a key sweep

// A block of rows of one request against one kv head. Both sweeps run keys-outer: a
// 16-key block is read once from L2, widened once into L1 and reused by every row and
// head of the group; each (row, head) still sees its own keys in its own fixed order,
// which is all the invariant needs.
template <typename T, int CH>
void attend_rows(RowJob<T>* jobs, int64_t count, int64_t groups, float scale, float softcap,
                 const T* keys, const T* values, int64_t key_stride, Scratch& scratch) {
  constexpr int64_t head_dim = CH * kLanes;
  constexpr bool kPairs = std::is_same_v<T, at::BFloat16> && CH % 2 == 0;
  const __m512 scale_v = _mm512_set1_ps(scale);
  const __m512 cap_v = _mm512_set1_ps(softcap), inv_cap_v = _mm512_set1_ps(softcap > 0 ? 1.0f / softcap : 0.0f);
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  int64_t widest = 0, prefix = 0;
  for (int64_t b = 0; b < count; ++b) {
    widest = std::max(widest, jobs[b].padded);
    if (jobs[b].seen.index == nullptr) prefix = std::max(prefix, jobs[b].seen.count);
  }
  scratch.peaks.assign(count * groups, minus_inf);
  __m512* peaks = scratch.peaks.data();
  auto finish = [&](int64_t b, int64_t g, int64_t j, __m512 raw) {
    const RowJob<T>& job = jobs[b];
    const int64_t valid = std::min<int64_t>(kLanes, job.seen.count - j);
    __m512 block = _mm512_mul_ps(raw, scale_v);
    if (softcap > 0) block = _mm512_mul_ps(vs::tanh_lanes(_mm512_mul_ps(block, inv_cap_v)), cap_v);
    if (valid < kLanes) block = _mm512_mask_mov_ps(minus_inf, (__mmask16)((1u << valid) - 1), block);
    _mm512_storeu_ps(job.scores + g * (job.padded + kLanes) + j, block);
    peaks[b * groups + g] = _mm512_max_ps(peaks[b * groups + g], block);
  };
  // The FMA spelling of VDPBF16PS runs under DAZ and FTZ, VDPBF16PS's own rules: the
  // whole score phase, and only it.
  const bool fma = kPairs && kPairFma;
  const unsigned csr = _mm_getcsr();
  if (fma) _mm_setcsr(csr | 0x8040);
  BlockKeys<kPairs, T, CH> key_block{keys, key_stride, prefix, &scratch};
  for (int64_t j = 0; j < widest; j += kLanes) {
    for (int64_t b = 0; b < count; ++b) {
      const RowJob<T>& job = jobs[b];
      if (j >= job.padded) continue;
      const int64_t n = std::min<int64_t>(kLanes, job.seen.count - j);
      if constexpr (kPairs) {
        if (fma) {
          const float(*kw)[CH][kLanes] = key_block.get(job.seen, j, n);
          for (int64_t g = 0; g < groups; ++g) {
            __m512 qw[CH];
            split_pairs<CH>(job.q + g * head_dim, qw);
            finish(b, g, j, block_scores([&](int h, __m512* acc) { pair_dots<CH>(qw, kw, h, n, acc); }));
          }
          continue;
        }
      }
      for (int64_t g = 0; g < groups; ++g) {
        const T* q = job.q + g * head_dim;
        finish(b, g, j, block_scores([&](int h, __m512* acc) {
          for (int i = 0; i < 8; ++i) {
            acc[i] = 8 * h + i < n ? partial_dot<T, CH>(q, keys + job.seen.key(j + 8 * h + i) * key_stride)
                                   : _mm512_setzero_ps();
          }
        }));
      }
    }
  }
  if (fma) _mm_setcsr(csr);
  for (int64_t b = 0; b < count; ++b) {
    const RowJob<T>& job = jobs[b];
    for (int64_t g = 0; g < groups; ++g) {
      float* s = job.scores + g * (job.padded + kLanes);
      const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(peaks[b * groups + g]));
      __m512 total = _mm512_setzero_ps();
      for (int64_t j = 0; j < job.padded; j += kLanes) {
        const __m512 e = exp_lanes(_mm512_sub_ps(_mm512_loadu_ps(s + j), top));
        _mm512_storeu_ps(s + j, e);
        total = _mm512_add_ps(total, e);
      }
      _mm512_storeu_ps(s + job.padded, _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total)));
    }
  }
  // Heads per value sweep: as many as keep GB * CH accumulators in registers.
  constexpr int kWide = CH <= 4 ? 3 : (CH <= 8 ? 2 : 1);
  scratch.acc.resize(count * groups * head_dim);
  // Keys [j, j + n) of row b into its accumulators, values read through value(i, c).
  const auto weigh = [&](int64_t b, int64_t j, int64_t n, auto widened, auto value) {
    constexpr bool kWidened = decltype(widened)::value;
    const RowJob<T>& job = jobs[b];
    const int64_t stride = job.padded + kLanes;
    float* acc = scratch.acc.data() + b * groups * head_dim;
    int64_t g = 0;
    for (; g + kWide <= groups; g += kWide) {
      weigh_block<CH, kWide, kWidened>(job.scores + g * stride, stride, j, n, value, acc + g * head_dim, j == 0);
    }
    for (; g < groups; ++g) weigh_block<CH, 1, kWidened>(job.scores + g * stride, stride, j, n, value, acc + g * head_dim, j == 0);
  };
  if (fma && count > 1) {
    // Keys outer, each 16-value block widened once for every row. Only where the scores
    // take the FMAs: with VDPBF16PS's scores (AMD) it was not measured on its own.
    BlockKeys<false, T, CH> value_block{values, key_stride, prefix, &scratch};
    for (int64_t j = 0; j < widest; j += kLanes) {
      for (int64_t b = 0; b < count; ++b) {
        if (j >= jobs[b].seen.count) continue;
        const int64_t n = std::min<int64_t>(kLanes, jobs[b].seen.count - j);
        const float(*vw)[CH][kLanes] = value_block.get(jobs[b].seen, j, n);
        weigh(b, j, n, std::true_type(), [&](int64_t i, int c) { return _mm512_load_ps(vw[i][c]); });
      }
    }
  } else {
    // Row by row, every key in one sweep with the accumulators in registers, each value
    // widened as the FMAs read it.
    for (int64_t b = 0; b < count; ++b) {
      const RowKeys seen = jobs[b].seen;
      weigh(b, 0, seen.count, std::false_type(), [&](int64_t i, int c) { return load_lanes(values + seen.key(i) * key_stride + c * kLanes); });
    }
  }
  for (int64_t b = 0; b < count; ++b) {
    const RowJob<T>& job = jobs[b];
    const float* acc = scratch.acc.data() + b * groups * head_dim;
    for (int64_t g = 0; g < groups; ++g) {
      const __m512 norm = _mm512_set1_ps(job.scores[g * (job.padded + kLanes) + job.padded]);
#pragma GCC unroll 16
      for (int c = 0; c < CH; ++c) {
        store_lanes(job.out + g * head_dim + c * kLanes, _mm512_mul_ps(_mm512_loadu_ps(acc + (g * CH + c) * kLanes), norm));
      }
    }
  }
}

// q rows may be strided (the q part of a fused qkv row); out is [rows, heads * head_dim].
template <typename T>
void run(const T* qp, int64_t q_stride, int64_t rows, int64_t heads, int64_t head_dim,
         const std::vector<at::Tensor>& caches, const at::Tensor& row_cache,
         const at::Tensor& row_len, const at::Tensor& row_index, T* op, float scale, float softcap) {
  const int64_t kv_heads = caches[0].size(1), groups = heads / kv_heads;
  if (scale <= 0) scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t* cache_of = row_cache.data_ptr<int64_t>();
  const int64_t* len = row_len.data_ptr<int64_t>();
  const int64_t* index = row_index.defined() ? row_index.data_ptr<int64_t>() : nullptr;
  const int64_t index_stride = row_index.defined() ? row_index.size(1) : 0;
  // Blocks of up to kRowBlock consecutive rows of the same request, a run split
  // evenly (9 rows: 5 + 4, not 8 + 1, so that both share their key sweeps).
  std::vector<int64_t> block_start;
  for (int64_t r = 0, run_end; r < rows; r = run_end) {
    for (run_end = r + 1; run_end < rows && cache_of[run_end] == cache_of[r];) ++run_end;
    const int64_t run = run_end - r, parts = (run + kRowBlock - 1) / kRowBlock;
    for (int64_t i = 0; i < parts; ++i) block_start.push_back(r + run * i / parts);
  }
  const int64_t blocks = static_cast<int64_t>(block_start.size());
  block_start.push_back(rows);
  at::parallel_for(0, blocks * kv_heads, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores;
    Scratch scratch;
    RowJob<T> jobs[kRowBlock];
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t blk = w / kv_heads, h = w % kv_heads;
      const int64_t r0 = block_start[blk], count = block_start[blk + 1] - r0;
      const at::Tensor& kv = caches[cache_of[r0]];  // [2, kv_heads, capacity, head_dim]
      const T* keys = kv.data_ptr<T>() + h * kv.stride(1);
      int64_t need = 0;
      for (int64_t b = 0; b < count; ++b) need += groups * ((len[r0 + b] + kLanes - 1) / kLanes * kLanes + kLanes);
      if (static_cast<int64_t>(scores.size()) < need) scores.resize(need);
      float* next = scores.data();
      for (int64_t b = 0; b < count; ++b) {
        const int64_t r = r0 + b;
        const int64_t* ix = index && index[r * index_stride] >= 0 ? index + r * index_stride : nullptr;
        const int64_t padded = (len[r] + kLanes - 1) / kLanes * kLanes;
        jobs[b] = RowJob<T>{qp + r * q_stride + h * groups * head_dim, op + (r * heads + h * groups) * head_dim,
                            RowKeys{len[r], ix}, next, padded};
        next += groups * (padded + kLanes);
      }
      switch (head_dim / kLanes) {
        case 1: attend_rows<T, 1>(jobs, count, groups, scale, softcap, keys, keys + kv.stride(0), kv.stride(2), scratch); break;
        case 2: attend_rows<T, 2>(jobs, count, groups, scale, softcap, keys, keys + kv.stride(0), kv.stride(2), scratch); break;
        case 3: attend_rows<T, 3>(jobs, count, groups, scale, softcap, keys, keys + kv.stride(0), kv.stride(2), scratch); break;
        case 4: attend_rows<T, 4>(jobs, count, groups, scale, softcap, keys, keys + kv.stride(0), kv.stride(2), scratch); break;
        case 5: attend_rows<T, 5>(jobs, count, groups, scale, softcap, keys, keys + kv.stride(0), kv.stride(2), scratch); break;
        case 6: attend_rows<T, 6>(jobs, count, groups, scale, softcap, keys, keys + kv.stride(0), kv.stride(2), scratch); break;
        case 7: attend_rows<T, 7>(jobs, count, groups, scale, softcap, keys, keys + kv.stride(0), kv.stride(2), scratch); break;
        case 8: attend_rows<T, 8>(jobs, count, groups, scale, softcap, keys, keys + kv.stride(0), kv.stride(2), scratch); break;
        default: attend_rows<T, kWideChunks>(jobs, count, groups, scale, softcap, keys, keys + kv.stride(0), kv.stride(2), scratch); break;
      }
    }
  });
}

}  // namespace

void check_rows(int64_t rows, int64_t heads, int64_t head_dim, at::ScalarType dtype,
                const std::vector<at::Tensor>& caches, const at::Tensor& row_cache,
                const at::Tensor& row_len, const at::Tensor& index) {
  TORCH_CHECK(!caches.empty(), "attend: no caches");
  TORCH_CHECK((head_dim % kLanes == 0 && head_dim <= kLanes * kMaxChunks) || head_dim == kLanes * kWideChunks,
              "attend: head_dim must be a multiple of 16, at most 128, or 256");
  for (const at::Tensor& kv : caches) {
    TORCH_CHECK(kv.dim() == 4 && kv.size(0) == 2 && kv.size(3) == head_dim && kv.stride(3) == 1 &&
                    kv.scalar_type() == dtype,
                "attend: each cache must be [2, kv_heads, capacity, head_dim] of q's dtype");
    TORCH_CHECK(kv.size(1) == caches[0].size(1) && heads % kv.size(1) == 0 &&
                    heads / kv.size(1) <= kMaxGroups,
                "attend: kv_heads mismatch (or more than 16 query heads per kv head)");
  }
  TORCH_CHECK(row_cache.scalar_type() == at::kLong && row_len.scalar_type() == at::kLong &&
                  row_cache.numel() == rows && row_len.numel() == rows && row_cache.is_contiguous() &&
                  row_len.is_contiguous(),
              "attend: row_cache and row_len must be int64 [rows]");
  if (index.defined()) {
    TORCH_CHECK(index.scalar_type() == at::kLong && index.dim() == 2 && index.size(0) == rows &&
                    index.is_contiguous(),
                "attend: row_index must be int64 [rows, width]; a row starting with -1 sees a prefix");
  }
  const int64_t* lp = row_len.data_ptr<int64_t>();
  const int64_t* cp = row_cache.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(cp[r] >= 0 && cp[r] < static_cast<int64_t>(caches.size()), "attend: bad cache index");
    TORCH_CHECK(lp[r] >= 1 && lp[r] <= caches[cp[r]].size(2), "attend: a row must see 1..capacity keys");
    if (index.defined() && index.data_ptr<int64_t>()[r * index.size(1)] >= 0) {
      TORCH_CHECK(lp[r] <= index.size(1), "attend: row_len exceeds row_index width");
      const int64_t* ix = index.data_ptr<int64_t>() + r * index.size(1);
      for (int64_t j = 0; j < lp[r]; ++j) {
        TORCH_CHECK(ix[j] >= 0 && ix[j] < caches[cp[r]].size(2), "attend: key index out of range");
      }
    }
  }
}

void attend_into(const at::BFloat16* q, int64_t q_stride, int64_t rows, int64_t heads, int64_t head_dim,
                 const std::vector<at::Tensor>& caches, const at::Tensor& row_cache,
                 const at::Tensor& row_len, const at::Tensor& row_index, at::BFloat16* out, double scale,
                 double softcap) {
  check_rows(rows, heads, head_dim, at::kBFloat16, caches, row_cache, row_len, row_index);
  run<at::BFloat16>(q, q_stride, rows, heads, head_dim, caches, row_cache, row_len, row_index, out,
                    static_cast<float>(scale), static_cast<float>(softcap));
}

at::Tensor attend(const at::Tensor& q, const std::vector<at::Tensor>& caches,
                  const at::Tensor& row_cache, const at::Tensor& row_len,
                  const c10::optional<at::Tensor>& row_index, double scale, double softcap) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "attend: q must be contiguous [rows, heads, head_dim]");
  const int64_t rows = q.size(0), heads = q.size(1), head_dim = q.size(2);
  at::Tensor index = row_index.has_value() ? *row_index : at::Tensor();
  check_rows(rows, heads, head_dim, q.scalar_type(), caches, row_cache, row_len, index);
  at::Tensor out = at::empty({rows, heads * head_dim}, q.options());
  if (q.scalar_type() == at::kBFloat16) {
    run<at::BFloat16>(q.data_ptr<at::BFloat16>(), heads * head_dim, rows, heads, head_dim, caches, row_cache,
                      row_len, index, out.data_ptr<at::BFloat16>(), static_cast<float>(scale),
                      static_cast<float>(softcap));
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "attend: bf16 or float32 only");
    run<float>(q.data_ptr<float>(), heads * head_dim, rows, heads, head_dim, caches, row_cache, row_len,
               index, out.data_ptr<float>(), static_cast<float>(scale), static_cast<float>(softcap));
  }
  return out;
}

std::string attention_dots() { return vs::attn::kPairFma ? "fma" : "vdpbf16ps"; }
