// The bf16 matmul's shared pieces: the packed weight layout, the instruction set
// chosen at run time, and the two drivers (AMX, AVX-512-BF16) that consume it.
//
// Packed layout (pack() writes it; a quantized pack dequantizes into it, in
// registers and a small L1 buffer, chunk by chunk): [groups of 64 outputs]
// [k tiles of 32][4 tiles of 16 outputs][16 k pairs][16 outputs x 2]. One 64-byte
// row holds, for 16 outputs, the bf16 pair (w[o, 2p], w[o, 2p + 1]): an AMX B-tile
// row and, equally, the b operand of one VDPBF16PS whose lanes are outputs.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

namespace vs {

constexpr int kTileRows = 16;  // rows of x per AMX A tile
constexpr int kTileK = 32;  // bf16 elements of k per k tile
constexpr int kTileOut = 16;  // outputs per tile
constexpr int kGroupTiles = 4;  // tiles per output group
constexpr int64_t kTileElems = kTileRows * kTileK;  // 512 bf16 = 1 KiB
constexpr int64_t kGroupOut = kGroupTiles * kTileOut;  // 64
constexpr int64_t kStepElems = kGroupTiles * kTileElems;  // one k tile of a group: 2048 bf16

enum class Isa : int { none = 0, avx512 = 1, amx = 2 };

// The instruction set every matmul of this process uses (set once by init()):
// all products of one process follow one per-element summation order.
Isa isa();

// The CPU's vendor, read once per process: some kernel choices follow it (quant_i8.h,
// attention_blocks.h).
inline const bool kAmd = [] {
  __builtin_cpu_init();  // this runs among the module's constructors, maybe before libgcc's
  return __builtin_cpu_is("amd") != 0;
}();

// The packed bf16 weights of group g, k tiles [kt0, kt0 + count), laid out as
// [count][4][16][32]: a pointer into a dense pack, or `buf` after dequantizing.
using ChunkFn = std::function<const uint16_t*(int64_t g, int64_t kt0, int64_t count, uint16_t* buf)>;

struct MatmulArgs {
  const uint16_t* x;  // [rows_padded, ldx] bf16, zero past `in` (and past row n)
  int64_t ldx, n, out, groups, k_tiles;
  const float* bias;  // [out] or nullptr
  uint16_t* y;  // [n, out] bf16
  // 0: `chunk` points into a dense pack (any span, no buffer); else it dequantizes
  // into a buffer and wants spans of this many k tiles (the AMX driver asks for all).
  int64_t chunk_tiles;
  int64_t grain;  // groups per parallel task, at least
  float* yf = nullptr;  // where y is null: [n, out] float32 holding the bf16-rounded values
};

// Every y[r, o] is one fp32 accumulator from 0, advanced over k pairs in
// increasing order (one VDPBF16PS / TDPBF16PS step per pair), + bias, rounded
// once to bf16: the bits depend only on x[r, :], W[o, :], bias[o] and the process's
// isa(). The two instructions sum a pair differently (VDPBF16PS: the odd product, then
// the even one, each rounded), so a few outputs in ten thousand differ between the
// paths (tests/kernels/test_kernel_isa.py); a process never mixes them.
void matmul_avx512(const MatmulArgs& args, const ChunkFn& chunk);
void matmul_amx(const MatmulArgs& args, const ChunkFn& chunk);

// Rounds and stores group g's accumulators acc [n][4 tiles][16] (+ bias) into y (or yf).
void store_group(const MatmulArgs& args, int64_t g, const float* acc);

// Quantized packs (quant.cpp): a uint8 tensor with a header.
bool is_quant_pack(const at::Tensor& packed);
void quant_shape(const at::Tensor& packed, int64_t* out, int64_t* in);
ChunkFn quant_chunks(const at::Tensor& packed);

// Group g of a quantized pack: its ggml type and its tile blocks, [block][4 tiles].
struct QuantGroup {
  int64_t type;
  const uint8_t* data;
};
QuantGroup quant_group(const at::Tensor& packed, int64_t g);

// Up to quant_fused_limit(packed) <= kFusedRows rows of a quantized product on
// AVX-512, dequantizing in registers (quant_fused.cpp); the same bits as
// matmul_avx512 over quant_chunks. Only 256-weight K blocks gain from the fused
// pass past 4 rows: a 32-weight block's two tiles are too short a run of bytes
// for its two sweeps (docs/notebook/quant_kernels.md).
constexpr int kFusedRows = 8;
constexpr int64_t fused_rows_for_block(int64_t block) { return block == 256 ? kFusedRows : 4; }
int64_t quant_fused_limit(const at::Tensor& packed);  // set once by pack_quant
void matmul_quant_fused(const MatmulArgs& args, const at::Tensor& packed);

// The integer path's packs (quant_i8.cpp, --weights quant-i8): x rounded to int8
// per 32-block, exact int32 block sums; row-invariant, but not the bf16 path's bits.
bool is_i8_pack(const at::Tensor& packed);
void i8_shape(const at::Tensor& packed, int64_t* out, int64_t* in);
// y [n, out] = x [n, in] (bf16) times an i8 pack, + bias [out] where not null; y is bf16, or
// float32 holding the bf16-rounded values.
void matmul_i8(const at::Tensor& x, const at::Tensor& packed, const float* bias, at::Tensor& y);
// Rows id[0..n) of an i8 pack (ids the caller checked), in bf16, into yp [n, in].
void embedding_i8(const at::Tensor& packed, const int64_t* id, int64_t n, at::BFloat16* yp);

}  // namespace vs
