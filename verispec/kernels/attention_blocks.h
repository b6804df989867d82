// The pieces of attention.cpp's keys-outer sweeps: 16 keys (or values) of a block are
// widened to float32 once, into L1, and every row and head of the block that sees them
// reads them there; and the FMA spelling of VDPBF16PS that lets bf16 scores use them.
// Nothing here changes a result's bits: widening is exact, and each (row, head) still
// runs its own fixed sequence (attention.cpp states the invariant).
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "matmul.h"
#include "simd.h"

namespace vs::attn {

using vs::kLanes;
using vs::load_lanes;
constexpr int kWideChunks = 16;  // head_dim 256 (Gemma 2 and 3), the widest

struct RowKeys {
  int64_t count;
  const int64_t* index;  // nullptr: the prefix [0, count)
  int64_t key(int64_t j) const { return index ? index[j] : j; }
};

// How bf16 scores are summed, decided once per process, so a row's bits never depend on
// which ran: VDPBF16PS, or its spelling as FMAs (pair_dots), which gives the same bits on
// an Intel Xeon (docs/notebook/attention_rows.md, round 3). VDPBF16PS issued at under
// half the FMAs' rate there, and one widened key serves every row and head of a block,
// so every CPU but AMD's takes the FMAs; AMD keeps
// VDPBF16PS, neither timed nor compared against the FMAs on its cores.
// VERISPEC_ATTN_DOTS=vdpbf16ps or fma overrides the choice (for tests).
inline const bool kPairFma = [] {
  const char* force = std::getenv("VERISPEC_ATTN_DOTS");
  if (force != nullptr && std::strcmp(force, "vdpbf16ps") == 0) return false;
  if (force != nullptr && std::strcmp(force, "fma") == 0) return true;
  return !vs::kAmd;
}();

// q . k for keys 8h .. 8h + 7 of a block widened as pairs, zero from the n-th: VDPBF16PS's
// own sequence spelled as FMAs, per lane and chunk by chunk the odd product of the pair
// and then the even one, each rounded once; under DAZ and FTZ, VDPBF16PS's rules, which
// the score phase sets. Chunks outer, so eight independent chains are in flight.
template <int CH>
inline void pair_dots(const __m512* qw, const float (*k)[CH][kLanes], int h, int64_t n, __m512* acc) {
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
  const int live = static_cast<int>(std::clamp<int64_t>(n - 8 * h, 0, 8));
  if (live == 8) {
#pragma GCC unroll 16
    for (int c = 0; c < CH; ++c) {
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) acc[i] = _mm512_fmadd_ps(qw[c], _mm512_load_ps(k[8 * h + i][c]), acc[i]);
    }
  } else {
    for (int i = 0; i < live; ++i) {
#pragma GCC unroll 16
      for (int c = 0; c < CH; ++c) acc[i] = _mm512_fmadd_ps(qw[c], _mm512_load_ps(k[8 * h + i][c]), acc[i]);
    }
  }
}

// A query head's (or a key's) pairs split as pair_dots reads them: [2c] odd, [2c + 1] even, per chunk c
// of 32 bf16 values (exact: a bf16 is the top half of its float32).
template <int CH>
inline void split_pairs(const at::BFloat16* x, __m512* out) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
#pragma GCC unroll 8
  for (int c = 0; c < CH / 2; ++c) {
    const __m512i v = _mm512_loadu_si512(x + 2 * c * kLanes);
    out[2 * c] = _mm512_castsi512_ps(_mm512_and_si512(v, top));
    out[2 * c + 1] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
}

// 16 keys or values of a block widened to float32 once, for every row and head that sees
// them: [key][chunk][lane]. Pairs: a key's chunks as split_pairs lays them out; else
// values, 16 consecutive dimensions a chunk.
template <bool kPairs, typename T, int CH>
void widen(const T* rows, int64_t stride, RowKeys seen, int64_t j0, int64_t n, float (*out)[CH][kLanes]) {
  for (int64_t i = 0; i < n; ++i) {
    const T* src = rows + seen.key(j0 + i) * stride;
    if constexpr (kPairs) {
      __m512 split[CH];
      split_pairs<CH>(src, split);
#pragma GCC unroll 16
      for (int c = 0; c < CH; ++c) _mm512_store_ps(out[i][c], split[c]);
    } else {
#pragma GCC unroll 16
      for (int c = 0; c < CH; ++c) _mm512_store_ps(out[i][c], load_lanes(src + c * kLanes));
    }
  }
}

// A thread's buffers for its blocks of rows.
struct Scratch {
  std::vector<__m512> peaks;  // [rows][groups]
  std::vector<float> acc;  // value accumulators [rows][groups][CH][kLanes]
  alignas(64) float shared[kLanes * kWideChunks * kLanes];  // the block's prefix keys or values
  alignas(64) float own[kLanes * kWideChunks * kLanes];  // one index row's
  template <int CH>
  static float (*as(float* buffer))[CH][kLanes] {
    return reinterpret_cast<float(*)[CH][kLanes]>(buffer);
  }
};

// Keys (or values) j0 .. j0 + n - 1 as row `job` sees them, widened: a prefix row's are
// widened once per block for all prefix rows (up to the longest), an index row's alone.
template <bool kPairs, typename T, int CH>
struct BlockKeys {
  const T* rows;
  int64_t stride, prefix;  // the longest prefix row's key count
  Scratch* scratch;
  int64_t ready = -1;  // the block `shared` holds
  const float (*get(RowKeys seen, int64_t j0, int64_t n))[CH][kLanes] {
    if (seen.index != nullptr) {
      widen<kPairs, T, CH>(rows, stride, seen, j0, n, Scratch::as<CH>(scratch->own));
      return Scratch::as<CH>(scratch->own);
    }
    if (ready != j0) {
      widen<kPairs, T, CH>(rows, stride, RowKeys{prefix, nullptr}, j0, std::min<int64_t>(kLanes, prefix - j0),
                           Scratch::as<CH>(scratch->shared));
      ready = j0;
    }
    return Scratch::as<CH>(scratch->shared);
  }
};

// acc[g] (+)= sum over keys j0 .. j0 + n - 1 of p[g][j] v_j for GB heads: key by key in
// order, one FMA chain a lane, the accumulators in registers for the block. kWidened: the
// values come from a widened block in L1, and each chunk is loaded once for the GB heads;
// left to itself the compiler folded it into every head's FMA, and the loads, not the
// FMAs, set the pace. The row-by-row sweep widens as it reads, and that order measured
// slower there at one row (docs/notebook/attention_rows.md, round 5). Either way the
// FMAs and their order are the same.
template <int CH, int GB, bool kWidened, class Value>
inline void weigh_block(const float* p, int64_t stride, int64_t j0, int64_t n, Value v, float* acc, bool first) {
  __m512 a[GB][CH];
#pragma GCC unroll 4
  for (int g = 0; g < GB; ++g) {
#pragma GCC unroll 16
    for (int c = 0; c < CH; ++c) a[g][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (g * CH + c) * kLanes);
  }
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (kWidened) {
      __m512 pj[GB];
#pragma GCC unroll 4
      for (int g = 0; g < GB; ++g) pj[g] = _mm512_set1_ps(p[g * stride + j0 + i]);
#pragma GCC unroll 16
      for (int c = 0; c < CH; ++c) {
        __m512 value = v(i, c);
        asm("" : "+v"(value));  // a register operand for every head: one load
#pragma GCC unroll 4
        for (int g = 0; g < GB; ++g) a[g][c] = _mm512_fmadd_ps(pj[g], value, a[g][c]);
      }
    } else {
#pragma GCC unroll 4
      for (int g = 0; g < GB; ++g) {
        const __m512 pj = _mm512_set1_ps(p[g * stride + j0 + i]);
#pragma GCC unroll 16
        for (int c = 0; c < CH; ++c) a[g][c] = _mm512_fmadd_ps(pj, v(i, c), a[g][c]);
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < GB; ++g) {
#pragma GCC unroll 16
    for (int c = 0; c < CH; ++c) _mm512_storeu_ps(acc + (g * CH + c) * kLanes, a[g][c]);
  }
}

}  // namespace vs::attn
