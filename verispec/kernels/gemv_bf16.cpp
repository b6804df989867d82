// y[n, O] = x[n, I] @ W[O, I]^T (+ bias) in bf16 on AMX, tuned for the
// few-row regime (decode, verification) where the product is bound by
// streaming W from memory, and still fast for prefill-sized n.
//
// Invariant (the project's lossless law depends on it): the bits of y[r, o]
// depend only on x[r, :], W[o, :] and bias[o]. Every element is computed by
// one thread as: a fp32 accumulator starting at 0, advanced by TDPBF16PS over
// 32-wide k chunks in increasing order (per element a fixed sequence, see
// Intel SDM, TDPBF16PS), then + bias, then one round-to-nearest-even to bf16.
// Rows are always fed as 16-row tiles (zero-padded), so neither n, the other
// rows, the thread count nor the thread split can change a result.
//
// Why AMX and not AVX512-BF16 (VDPBF16PS): on the target Xeon one core retires
// ~1.06e9 VDPBF16PS/s (34 GMAC/s), so the ~135M-MAC default model needs ~4 ms of
// compute per row on a core: compute-bound from n ~= 3. One TDPBF16PS does
// 8192 MACs, so 16 rows cost the same as one and the product stays memory-bound.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace {

constexpr int kTileRows = 16;  // rows of x per A tile (and of y per C tile)
constexpr int kTileK = 32;  // bf16 elements of k per tile row (64 bytes)
constexpr int kTileOut = 16;  // outputs per C tile
constexpr int kGroupTiles = 4;  // C tiles in flight: tmm0..3; A is tmm4; B is tmm5..7
constexpr int64_t kTileElems = kTileRows * kTileK;  // 512 bf16 = 1 KiB
constexpr int64_t kGroupOut = kGroupTiles * kTileOut;
constexpr int64_t kPrefetchSteps = 4;  // k steps (4 KiB each) of weights requested ahead

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void load_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// Round-to-nearest-even with NaN mapped to a quiet NaN: c10::BFloat16's rule,
// so results match torch's fp32 -> bf16 cast bit for bit (denormals kept).
inline __m256i to_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}

// One C tile (16 rows x 16 outputs, fp32) -> rows [0, rows) of y, outputs [0, outs).
void store_tile(const float* c, const float* bias, int rows, int outs, uint16_t* y, int64_t ldy) {
  const __mmask16 mask = (__mmask16)((1u << outs) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) {
    __m512 v = _mm512_load_ps(c + r * kTileOut);
    if (bias) v = _mm512_add_ps(v, b);
    _mm256_mask_storeu_epi16(y + r * ldy, mask, to_bf16(v));
  }
}

// The 4 C tiles of one output group for one 16-row chunk. w points at the
// group's packed weights, [k_tiles][4 tiles][16 pairs][32]: one contiguous stream.
void group(const uint16_t* xa, int64_t k_tiles, const uint16_t* w, float* cbuf) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t lda = k_tiles * kTileK * 2;
  for (int64_t kk = 0; kk < k_tiles; ++kk) {
    const uint16_t* wk = w + kk * kGroupTiles * kTileElems;
    // The packed weights are one linear stream; asking for the 4 KiB that follow
    // kPrefetchSteps steps ahead keeps more DRAM reads in flight than the
    // hardware prefetcher does alone (pages end its streams): measured 22.0 ->
    // 19.2 ms for the default model's matmuls at one row on 2 threads.
    const char* ahead = reinterpret_cast<const char*>(wk + kPrefetchSteps * kGroupTiles * kTileElems);
    for (int line = 0; line < kGroupTiles * kTileElems * 2; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
    _tile_loadd(4, xa + kk * kTileK, lda);
    _tile_loadd(5, wk, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, wk + kTileElems, 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, wk + 2 * kTileElems, 64);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, wk + 3 * kTileElems, 64);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, cbuf, 64);
  _tile_stored(1, cbuf + 256, 64);
  _tile_stored(2, cbuf + 512, 64);
  _tile_stored(3, cbuf + 768, 64);
}

}  // namespace

bool init() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) {
    return false;
  }
  // Linux hands out the 8 KiB tile state only on request (ARCH_REQ_XCOMP_PERM,
  // XFEATURE_XTILEDATA); the grant covers the whole process and is idempotent.
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

// [O, I] row-major -> [ceil(O/64) groups][ceil(I/32)][4 tiles][16 k pairs][16 outputs x 2]:
// each 1 KiB block is one B tile in AMX's pair-interleaved layout, and a group's
// k steps follow each other in memory; zero padding only adds exact zeros.
at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "pack: bf16 [out, in]");
  const at::Tensor w = weight.contiguous();
  const int64_t out = w.size(0), in = w.size(1);
  const int64_t groups = (out + kGroupOut - 1) / kGroupOut, k_tiles = (in + kTileK - 1) / kTileK;
  at::Tensor packed = at::zeros({groups, k_tiles, kGroupTiles * kTileRows, kTileK}, w.options());
  const auto* src = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* dst = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
  at::parallel_for(0, out, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const int64_t g = o / kGroupOut, j = (o % kGroupOut) / kTileOut, col = o % kTileOut;
      for (int64_t k = 0; k < in; ++k) {
        const int64_t kk = k / kTileK, pair = (k % kTileK) / 2;
        dst[(((g * k_tiles + kk) * kGroupTiles + j) * kTileRows + pair) * kTileK + 2 * col + (k % 2)] =
            src[o * in + k];
      }
    }
  });
  return packed;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t out,
                  const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "linear: bf16 x [n, in]");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kGroupTiles * kTileRows &&
              packed.size(3) == kTileK && packed.is_contiguous(),
              "linear: weight must come from pack()");
  const int64_t n = x.size(0), in = x.size(1);
  const int64_t groups = packed.size(0), k_tiles = packed.size(1);
  TORCH_CHECK((in + kTileK - 1) / kTileK == k_tiles && (out + kGroupOut - 1) / kGroupOut == groups,
              "linear: shapes do not match the packed weight");
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == out, "linear: bias size mismatch");
    bias_f = bias->to(at::kFloat).contiguous();
  }
  at::Tensor y = at::empty({n, out}, x.options());
  if (n == 0 || out == 0) return y;
  // x as zero-padded 16-row chunks, [chunks * 16, k_tiles * 32]: whole A tiles.
  const int64_t chunks = (n + kTileRows - 1) / kTileRows, ldx = k_tiles * kTileK;
  std::vector<uint16_t> xa(chunks * kTileRows * ldx, 0);
  const at::Tensor xc = x.contiguous();
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  for (int64_t r = 0; r < n; ++r) std::memcpy(&xa[r * ldx], xp + r * in, in * 2);
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const float* bp = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  // Split so that a thread's share streams >= ~256 KiB, else wake-up costs dominate.
  const int64_t group_bytes = kGroupTiles * k_tiles * kTileElems * 2;
  const int64_t grain = std::max<int64_t>(1, (256 << 10) / group_bytes);
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    load_config();
    alignas(64) float cbuf[kGroupTiles * kTileRows * kTileOut];
    for (int64_t g = g0; g < g1; ++g) {
      // The group's weights (4 * k_tiles KiB) stay cache-hot across row chunks.
      for (int64_t c = 0; c < chunks; ++c) {
        group(&xa[c * kTileRows * ldx], k_tiles, wp + g * k_tiles * kGroupTiles * kTileElems, cbuf);
        const int rows = (int)std::min<int64_t>(kTileRows, n - c * kTileRows);
        for (int j = 0; j < kGroupTiles && g * kGroupOut + j * kTileOut < out; ++j) {
          const int64_t o = g * kGroupOut + j * kTileOut;
          const int outs = (int)std::min<int64_t>(kTileOut, out - o);
          store_tile(cbuf + j * kTileRows * kTileOut, bp ? bp + o : nullptr, rows, outs,
                     yp + c * kTileRows * out + o, out);
        }
      }
    }
    _tile_release();
  });
  return y;
}
