// The AMX driver of the bf16 matmul (TDPBF16PS on 16-row tiles), and the entry
// points: init (which instruction set this process uses), pack, linear.
//
// Invariant (the project's lossless law depends on it): the bits of y[r, o]
// depend only on x[r, :], W[o, :] and bias[o]. On AMX every element is computed
// by one thread as: a fp32 accumulator starting at 0, advanced by TDPBF16PS over
// 32-wide k chunks in increasing order (per element a fixed sequence, see Intel
// SDM, TDPBF16PS), then + bias, then one round-to-nearest-even to bf16. Rows are
// always fed as 16-row tiles (zero-padded), so neither n, the other rows, the
// thread count nor the thread split can change a result. gemv_avx512.cpp keeps
// the same per-element sequence with VDPBF16PS where the CPU has no AMX.
//
// Why AMX first: on the target Xeon one core retires ~1.06e9 VDPBF16PS/s (34
// GMAC/s), so the ~135M-MAC default model needs ~4 ms of compute per row on a
// core: compute-bound from n ~= 3. One TDPBF16PS does 8192 MACs, so 16 rows cost
// the same as one and the product stays memory-bound.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "matmul.h"
#include "simd.h"

namespace vs {
namespace {

constexpr int64_t kPrefetchSteps = 4;  // k steps (4 KiB each) of weights requested ahead

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// A constant in read-only data, not a stack object filled before LDTILECFG: GCC's
// _tile_loadconfig tells the compiler it reads only the first 8 bytes, so stores to the
// rest of a stack copy may be dropped as dead, leaving a bad configuration and a fault
// at the next tile instruction (llama.cpp's AMX kernels crash this way, its PR #26954).
constexpr TileConfig kTileConfig{};

void load_config() { _tile_loadconfig(&kTileConfig); }

// One C tile (16 rows x 16 outputs, fp32) -> rows [0, rows) of y (or yf) from element `at`,
// outputs [0, outs).
void store_tile(const float* c, const float* bias, int rows, int outs, uint16_t* y, float* yf, int64_t at,
                int64_t ldy) {
  const __mmask16 mask = (__mmask16)((1u << outs) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) {
    __m512 v = _mm512_load_ps(c + r * kTileOut);
    if (bias) v = _mm512_add_ps(v, b);
    store_outputs(y, yf, at + r * ldy, mask, v);
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
    const uint16_t* wk = w + kk * kStepElems;
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


std::atomic<int> g_isa{0};

}  // namespace

Isa isa() { return static_cast<Isa>(g_isa.load(std::memory_order_relaxed)); }

void matmul_amx(const MatmulArgs& a, const ChunkFn& chunk) {
  const int64_t chunks = (a.n + kTileRows - 1) / kTileRows;
  at::parallel_for(0, a.groups, a.grain, [&](int64_t g0, int64_t g1) {
    load_config();
    alignas(64) float cbuf[kGroupTiles * kTileRows * kTileOut];
    std::vector<uint16_t> buf;  // a quantized group dequantized whole (dense packs need none)
    for (int64_t g = g0; g < g1; ++g) {
      if (buf.empty() && a.chunk_tiles > 0) buf.resize(a.k_tiles * kStepElems);
      const uint16_t* w = chunk(g, 0, a.k_tiles, buf.data());
      // The group's weights (4 * k_tiles KiB) stay cache-hot across row chunks.
      for (int64_t c = 0; c < chunks; ++c) {
        group(a.x + c * kTileRows * a.ldx, a.k_tiles, w, cbuf);
        const int rows = (int)std::min<int64_t>(kTileRows, a.n - c * kTileRows);
        for (int j = 0; j < kGroupTiles && g * kGroupOut + j * kTileOut < a.out; ++j) {
          const int64_t o = g * kGroupOut + j * kTileOut;
          const int outs = (int)std::min<int64_t>(kTileOut, a.out - o);
          store_tile(cbuf + j * kTileRows * kTileOut, a.bias ? a.bias + o : nullptr, rows, outs,
                     a.y, a.yf, c * kTileRows * a.out + o, a.out);
        }
      }
    }
    _tile_release();
  });
}

}  // namespace vs

using vs::kGroupOut;
using vs::kGroupTiles;
using vs::kStepElems;
using vs::kTileK;
using vs::kTileOut;
using vs::kTileRows;

// 2: AMX (CPU has AMX-BF16 and the OS granted tile state), 1: AVX-512-BF16, 0: neither.
// VERISPEC_MATMUL=avx512 takes the AVX-512 path on an AMX machine too.
int64_t init() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512bf16")) {
    vs::g_isa = 0;
    return 0;
  }
  const char* force = std::getenv("VERISPEC_MATMUL");
  const bool want_amx = !(force && std::strcmp(force, "avx512") == 0);
  // Linux hands out the 8 KiB tile state only on request (ARCH_REQ_XCOMP_PERM,
  // XFEATURE_XTILEDATA); the grant covers the whole process and is idempotent.
  const bool amx = want_amx && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
                   syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  vs::g_isa = amx ? 2 : 1;
  return vs::g_isa;
}

// [O, I] row-major -> [ceil(O/64) groups][ceil(I/32)][4 tiles][16 k pairs][16 outputs x 2]
// (matmul.h); zero padding only adds exact zeros.
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

namespace {
std::atomic<int64_t> g_fused_rows{vs::kFusedRows};
}  // namespace

int64_t quant_fused_rows(int64_t rows) {
  TORCH_CHECK(rows <= vs::kFusedRows, "quant_fused_rows: at most ", vs::kFusedRows);
  if (rows >= 0) g_fused_rows = rows;
  return g_fused_rows;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t out,
                  const c10::optional<at::Tensor>& bias, bool float_out) {
  TORCH_CHECK(vs::isa() != vs::Isa::none, "linear: kernels not initialised (init() first)");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "linear: bf16 x [n, in]");
  const int64_t n = x.size(0), in = x.size(1);
  const bool i8 = vs::is_i8_pack(packed), quant = !i8 && vs::is_quant_pack(packed);
  int64_t groups, k_tiles;
  if (i8 || quant) {
    int64_t q_out, q_in;
    (i8 ? vs::i8_shape : vs::quant_shape)(packed, &q_out, &q_in);
    TORCH_CHECK(q_out == out && q_in == in, "linear: shapes do not match the quantized weight (",
                q_out, " x ", q_in, ")");
    groups = (out + kGroupOut - 1) / kGroupOut;
    k_tiles = in / kTileK;
  } else {
    TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16 &&
                    packed.size(2) == kGroupTiles * kTileRows && packed.size(3) == kTileK && packed.is_contiguous(),
                "linear: weight must come from pack() or pack_quant()");
    groups = packed.size(0);
    k_tiles = packed.size(1);
    TORCH_CHECK((in + kTileK - 1) / kTileK == k_tiles && (out + kGroupOut - 1) / kGroupOut == groups,
                "linear: shapes do not match the packed weight");
  }
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == out, "linear: bias size mismatch");
    bias_f = bias->to(at::kFloat).contiguous();
  }
  at::Tensor y = at::empty({n, out}, x.options().dtype(float_out ? at::kFloat : at::kBFloat16));
  if (n == 0 || out == 0) return y;
  if (i8) {
    vs::matmul_i8(x, packed, bias_f.defined() ? bias_f.data_ptr<float>() : nullptr, y);
    return y;
  }
  uint16_t* y16 = float_out ? nullptr : reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  float* yf = float_out ? y.data_ptr<float>() : nullptr;
  // x as zero-padded 16-row chunks, [chunks * 16, k_tiles * 32]: whole A tiles.
  const int64_t chunks = (n + kTileRows - 1) / kTileRows, ldx = k_tiles * kTileK;
  std::vector<uint16_t> xa(chunks * kTileRows * ldx, 0);
  const at::Tensor xc = x.contiguous();
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  for (int64_t r = 0; r < n; ++r) std::memcpy(&xa[r * ldx], xp + r * in, in * 2);
  // Split so that a thread's share streams >= ~256 KiB, else wake-up costs dominate.
  const int64_t group_bytes = k_tiles * kStepElems * 2;
  vs::MatmulArgs args{xa.data(), ldx, n, out, groups, k_tiles,
                      bias_f.defined() ? bias_f.data_ptr<float>() : nullptr,
                      y16, 0, std::max<int64_t>(1, (256 << 10) / group_bytes), yf};
  vs::ChunkFn chunk;
  if (quant) {
    chunk = vs::quant_chunks(packed);
    args.chunk_tiles = 8;  // one K-quant super-block, 32 KiB of bf16: stays in L1
    args.grain = std::max<int64_t>(1, args.grain * 3);  // about a third of the bytes per group
  } else {
    const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
    chunk = [wp, k_tiles](int64_t g, int64_t kt0, int64_t, uint16_t*) {
      return wp + (g * k_tiles + kt0) * kStepElems;
    };
  }
  if (vs::isa() == vs::Isa::amx) {
    vs::matmul_amx(args, chunk);
  } else if (quant && n <= std::min(g_fused_rows.load(std::memory_order_relaxed), vs::quant_fused_limit(packed))) {
    vs::matmul_quant_fused(args, packed);
  } else {
    vs::matmul_avx512(args, chunk);
  }
  return y;
}
