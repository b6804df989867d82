// The integer path of a quantized product (--weights quant-i8): each row of x is
// rounded to int8 per 32-element block, as llama.cpp's Q8_0 / Q8_1 activations are,
// and every block's dot product is exact in int32 by VPDPBUSD (AVX-512-VNNI), 64
// multiply-adds an instruction against VDPBF16PS's 32 and with no dequantization
// to float: a 4-bit weight costs a mask or a shift. Only the block scales are
// float.
//
// Exactness: y[r, o] is one fp32 accumulator from 0, advanced block by block in
// increasing order by fma(float(isum - off * sx), d_w * dx) (and, Q4_1, by
// fma(m_w, dx * sx)), + bias, rounded once to bf16. The integer sums are exact and
// every float operation's operands depend on x[r, :] and W[o, :] alone, so the
// bits are the same for any row count, row chunk and thread split: speculation
// on this path is bit-exact against plain decoding on it. The logits differ from
// the bf16 path's by the activations' rounding (docs/quant_kernels.md).
//
// Pack: laid out as quant_stack.h says. A tile block holds 16 outputs x one
// 32-weight block: the fp16 scales d[16] (and Q4_1's m[16]), then the quants as
// unsigned bytes in VPDPBUSD's order: 64-byte step c holds, at byte 4o + j, output
// o's quant at k = 4c + j. The 4-bit formats store steps c and c + 4 in one step's
// low and high nibbles; Q8_0 stores q + 128.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <vector>

#include "kernels.h"
#include "matmul.h"
#include "quant_stack.h"

// VPDPBUSD for this file only: the module still loads on a CPU without VNNI, and
// kernels.quant_i8_types() is empty there, so nothing calls into this code.
#pragma GCC target("avx512vnni")

namespace vs {
namespace {

constexpr int64_t kMagicI8 = 0x314138505153564c;  // "LVSQP8A1"
constexpr int kBlock = 32;
constexpr int kRowsPerSweep = 6;  // more rows take balanced chunks of at most this

struct HeaderI8 {
  int64_t magic, out, in, groups, blocks, data_offset, reserved0, reserved1;
};

// The ggml formats with an integer path: quants q in [0, 2^bits), w = d * (q - off) + m.
struct FormatI8 {
  int64_t type;
  const char* name;
  int64_t raw_bytes;  // one raw 32-weight block
  int64_t tile_bytes;  // 16 outputs x one block
  int off;  // the quant's zero point (the byte stored is q; w = d * (q - off))
  bool min;  // Q4_1: + m per output
  bool four;  // 4-bit quants, two steps a byte
};

// Q4_0: d, qs[16] (q - 8). Q4_1: d, m, qs[16]. Q8_0: d, qs[32] int8, stored + 128.
constexpr FormatI8 kFormats[] = {{2, "Q4_0", 18, 32 + 256, 8, false, true},
                                 {3, "Q4_1", 20, 64 + 256, 0, true, true},
                                 {8, "Q8_0", 34, 32 + 512, 128, false, false}};

static_assert(std::size(kFormats) == 3, "group_any dispatches three formats");

const FormatI8* find_i8(int64_t type) {
  for (const FormatI8& f : kFormats) {
    if (f.type == type) return &f;
  }
  return nullptr;
}

int scales_bytes(const FormatI8& f) { return f.min ? 64 : 32; }

// Quant e (0..31) of a raw block, as the unsigned byte the tile stores.
int raw_quant(const FormatI8& f, const uint8_t* block, int e) {
  if (f.four) {
    const uint8_t* qs = block + (f.min ? 4 : 2);
    return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
  }
  return static_cast<int8_t>(block[2 + e]) + 128;
}

void repack_tile(const FormatI8& f, const uint8_t* const* rows, uint8_t* dst) {
  for (int o = 0; o < 16; ++o) {
    std::memcpy(dst + 2 * o, rows[o], 2);
    if (f.min) std::memcpy(dst + 32 + 2 * o, rows[o] + 2, 2);
  }
  uint8_t* q = dst + scales_bytes(f);
  for (int o = 0; o < 16; ++o) {
    for (int j = 0; j < 4; ++j) {
      if (f.four) {
        for (int c = 0; c < 4; ++c) {
          q[64 * c + 4 * o + j] = raw_quant(f, rows[o], 4 * c + j) | (raw_quant(f, rows[o], 16 + 4 * c + j) << 4);
        }
      } else {
        for (int c = 0; c < 8; ++c) q[64 * c + 4 * o + j] = raw_quant(f, rows[o], 4 * c + j);
      }
    }
  }
}

using View = StackView<HeaderI8>;
View view(const at::Tensor& packed) { return stack_view<HeaderI8>(packed); }

// x's rows as int8 blocks: q = round_even(x / dx), dx = max|x| / 127 (0 for a zero
// block); sx = sum(q) (the zero point's and the minimum's term), xs = dx * sx.
struct QuantRows {
  std::vector<int8_t> q;  // [n][in]
  std::vector<float> dx, xs;  // [n][blocks]
  std::vector<int32_t> sx;  // [n][blocks]
};

QuantRows quantize_rows(const uint16_t* x, int64_t n, int64_t in) {
  const int64_t blocks = in / kBlock;
  QuantRows out{std::vector<int8_t>(n * in), std::vector<float>(n * blocks), std::vector<float>(n * blocks),
                std::vector<int32_t>(n * blocks)};
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const uint16_t* src = x + r * in + b * kBlock;
      const auto widen = [](const uint16_t* p) {  // bf16 -> fp32, exact
        const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
      };
      const __m512 lo = widen(src), hi = widen(src + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
      const float d = amax / 127.0f;
      const __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
      const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
      const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
      int8_t* dst = out.q.data() + r * in + b * kBlock;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(qlo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtsepi32_epi8(qhi));
      int32_t sum = 0;
      for (int e = 0; e < kBlock; ++e) sum += dst[e];
      out.dx[r * blocks + b] = d;
      out.sx[r * blocks + b] = sum;
      out.xs[r * blocks + b] = d * static_cast<float>(sum);
    }
  }
  return out;
}

#define VS_INLINE inline __attribute__((always_inline))

VS_INLINE __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows [0, R) x tiles [j0, j0 + T) of one group over every block, into acc [R][4][16].
template <int Fi, int R, int T>
void sweep(const uint8_t* gd, int64_t blocks, const QuantRows& x, int64_t r0, int64_t in,
           int j0, float* acc) {
  constexpr FormatI8 f = kFormats[Fi];
  constexpr int64_t tb = f.tile_bytes;
  constexpr int sb = f.min ? 64 : 32;
  constexpr int64_t ahead_blocks = ((16 << 10) + kGroupTiles * tb - 1) / (kGroupTiles * tb);
  __m512 c[R][T];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < T; ++j) c[r][j] = _mm512_setzero_ps();
  }
  const __m512i low4 = _mm512_set1_epi8(15);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t0 = gd + (b * kGroupTiles + j0) * tb;
    // This sweep's tiles of a block some 16 KiB ahead (whole blocks: a sweep of
    // T < 4 tiles reads T of each block's 4).
    const char* next = reinterpret_cast<const char*>(t0 + ahead_blocks * kGroupTiles * tb);
    for (int64_t line = 0; line < T * tb; line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = x.q.data() + (r0 + r) * in + b * kBlock;
    __m512i s[R][T];
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < T; ++j) s[r][j] = _mm512_setzero_si512();
    }
    if constexpr (f.four) {
      for (int step = 0; step < 4; ++step) {
        for (int j = 0; j < T; ++j) {
          const __m512i v = _mm512_loadu_si512(t0 + j * tb + sb + 64 * step);
          const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
          for (int r = 0; r < R; ++r) {
            s[r][j] = _mm512_dpbusd_epi32(s[r][j], lo, bcast4(xq[r] + 4 * step));
            s[r][j] = _mm512_dpbusd_epi32(s[r][j], hi, bcast4(xq[r] + 16 + 4 * step));
          }
        }
      }
    } else {
      for (int step = 0; step < 8; ++step) {
        for (int j = 0; j < T; ++j) {
          const __m512i v = _mm512_loadu_si512(t0 + j * tb + sb + 64 * step);
          for (int r = 0; r < R; ++r) s[r][j] = _mm512_dpbusd_epi32(s[r][j], v, bcast4(xq[r] + 4 * step));
        }
      }
    }
    for (int j = 0; j < T; ++j) {
      const uint8_t* tile = t0 + j * tb;
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile)));
      for (int r = 0; r < R; ++r) {
        const int64_t rb = (r0 + r) * blocks + b;
        __m512i isum = s[r][j];
        if constexpr (f.off != 0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(f.off * x.sx[rb]));
        c[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(x.dx[rb])), c[r][j]);
      }
      if constexpr (f.min) {
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 32)));
        for (int r = 0; r < R; ++r) c[r][j] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.xs[(r0 + r) * blocks + b]), c[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < T; ++j) _mm512_storeu_ps(acc + (r * kGroupTiles + j0 + j) * kTileOut, c[r][j]);
  }
}

// Up to six rows in one pass over the group: R x T tiles of integer and float
// accumulators must fit the 32 registers, so more rows sweep fewer tiles at a
// time; each weight is still unpacked once, and the later sweeps read from L1.
// (One tile at a time, for 7-8 rows, measured slower than two chunks.)
template <int Fi, int R>
void group_rows(const uint8_t* gd, int64_t blocks, const QuantRows& x, int64_t r0, int64_t in, float* acc) {
  constexpr int T = R <= 3 ? 4 : 2;
  for (int j0 = 0; j0 < kGroupTiles; j0 += T) sweep<Fi, R, T>(gd, blocks, x, r0, in, j0, acc);
}

template <int Fi>
void group_chunk(const uint8_t* gd, int64_t blocks, const QuantRows& x, int64_t r0, int64_t rows, int64_t in,
                 float* acc) {
  switch (rows) {
    case 1: group_rows<Fi, 1>(gd, blocks, x, r0, in, acc); break;
    case 2: group_rows<Fi, 2>(gd, blocks, x, r0, in, acc); break;
    case 3: group_rows<Fi, 3>(gd, blocks, x, r0, in, acc); break;
    case 4: group_rows<Fi, 4>(gd, blocks, x, r0, in, acc); break;
    case 5: group_rows<Fi, 5>(gd, blocks, x, r0, in, acc); break;
    default: group_rows<Fi, 6>(gd, blocks, x, r0, in, acc); break;
  }
}

// Rows [r0, r0 + rows) of group data gd in format `type`, specialised per format.
void group_any(int64_t type, const uint8_t* gd, int64_t blocks, const QuantRows& x, int64_t r0, int64_t rows,
               int64_t in, float* acc) {
  switch (type) {
    case kFormats[0].type: group_chunk<0>(gd, blocks, x, r0, rows, in, acc); break;
    case kFormats[1].type: group_chunk<1>(gd, blocks, x, r0, rows, in, acc); break;
    default: group_chunk<2>(gd, blocks, x, r0, rows, in, acc); break;
  }
}

}  // namespace

bool is_i8_pack(const at::Tensor& packed) { return is_stack<HeaderI8>(packed, kMagicI8); }

void i8_shape(const at::Tensor& packed, int64_t* out, int64_t* in) {
  *out = view(packed).head->out;
  *in = view(packed).head->in;
}

void matmul_i8(const at::Tensor& x, const at::Tensor& packed, const float* bias, at::Tensor& y) {
  const View v = view(packed);
  const int64_t n = x.size(0), in = v.head->in, out = v.head->out, blocks = v.head->blocks;
  const at::Tensor xc = x.contiguous();
  const QuantRows rows = quantize_rows(reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()), n, in);
  MatmulArgs args{nullptr, in, n, out, v.head->groups, in / kTileK, bias,
                  reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), 0, 0};
  // A thread's share should stream >= ~256 KiB, else wake-up costs dominate.
  const int64_t group_bytes = blocks * kGroupTiles * find_i8(v.type[0])->tile_bytes;
  const int64_t grain = std::max<int64_t>(1, (256 << 10) / group_bytes);
  at::parallel_for(0, args.groups, grain, [&](int64_t g0, int64_t g1) {
    std::vector<float> acc(n * kGroupOut);  // [n][4 tiles][16]
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t chunks = (n + kRowsPerSweep - 1) / kRowsPerSweep;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t r0 = c * n / chunks, rows_now = (c + 1) * n / chunks - r0;
        group_any(v.type[g], v.data + v.offset[g], blocks, rows, r0, rows_now, in, acc.data() + r0 * kGroupOut);
      }
      store_group(args, g, acc.data());
    }
  });
}

void embedding_i8(const at::Tensor& packed, const int64_t* id, int64_t n, at::BFloat16* yp) {
  const View v = view(packed);
  const int64_t in = v.head->in, blocks = v.head->blocks;
  const auto half = [](const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
  };
  at::parallel_for(0, n, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t g = id[r] / kGroupOut, j = (id[r] % kGroupOut) / kTileOut, o = id[r] % kTileOut;
      const FormatI8& f = *find_i8(v.type[g]);
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* tile = v.data + v.offset[g] + (b * kGroupTiles + j) * f.tile_bytes;
        const float d = half(tile + 2 * o), m = f.min ? half(tile + 32 + 2 * o) : 0.0f;
        const uint8_t* q = tile + scales_bytes(f);
        for (int e = 0; e < kBlock; ++e) {
          const int c = f.four ? (e % 16) / 4 : e / 4, byte = q[64 * c + 4 * o + e % 4];
          const int quant = f.four ? (e < 16 ? byte & 15 : byte >> 4) : byte;
          // gguf's dequantization in float32: the product is exact, so the one
          // rounding (of + m) matches the bf16 path's fma bit for bit.
          const float w = d * static_cast<float>(quant - f.off);
          yp[r * in + b * kBlock + e] = c10::BFloat16(f.min ? w + m : w);  // no + 0: keeps -0
        }
      }
    }
  });
}

}  // namespace vs

at::Tensor pack_quant_i8(const std::vector<at::Tensor>& raws, const std::vector<int64_t>& types,
                         const std::vector<int64_t>& outs, int64_t in) {
  using namespace vs;
  std::vector<StackPart> parts;
  for (int64_t type : types) {
    const FormatI8* f = find_i8(type);
    TORCH_CHECK(f, "pack_quant_i8: ggml type ", type, " has no integer kernel (Q4_0, Q4_1, Q8_0)");
    parts.push_back({f->name, f->type, kBlock, f->raw_bytes, f->tile_bytes,
                     [f](const uint8_t* const* rows, uint8_t* dst) { repack_tile(*f, rows, dst); }});
  }
  Stacked st = pack_stack("pack_quant_i8", raws, parts, outs, in, sizeof(HeaderI8));
  const HeaderI8 head{kMagicI8, st.out, in, st.groups, in / kBlock, st.data_offset, 0, 0};
  std::memcpy(st.packed.data_ptr<uint8_t>(), &head, sizeof(head));
  return st.packed;
}

std::vector<int64_t> quant_i8_types() {
  std::vector<int64_t> types;
  for (const vs::FormatI8& f : vs::kFormats) types.push_back(f.type);
  return types;
}
