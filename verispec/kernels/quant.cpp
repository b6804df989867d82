// Quantized packs: GGUF block rows repacked into tile blocks (quant_formats.h),
// dequantized chunk by chunk into the dense packed layout inside the matmul,
// so a quantized product runs the dense product's exact per-element sequence.
//
// A pack is one uint8 tensor laid out as quant_stack.h says: several tensors of
// one in_features may share it (fused q/k/v, gate/up), each in its own format.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"
#include "matmul.h"
#include "quant_formats.h"
#include "quant_stack.h"

namespace vs {
namespace {

constexpr int64_t kMagic = 0x314b435051535656;  // "VVSQPCK1"

struct Header {
  int64_t magic, out, in, groups, k_tiles, data_offset, fused_rows, reserved;
};

using View = StackView<Header>;
View view(const at::Tensor& packed) { return stack_view<Header>(packed); }

std::string supported() {
  int64_t count;
  const quant::Format* all = quant::formats(&count);
  std::string names;
  for (int64_t i = 0; i < count; ++i) names += std::string(i ? ", " : "") + all[i].name;
  return names;
}

// Quant bytes requested ahead of the dequantization: a chunk or so, which stays
// in L1 beside the 32 KiB dequantized chunk.
constexpr int64_t kAheadBytes = 8 << 10;

// Tiles [j0, j1) of group g, blocks [b0, b1), into the packed layout at buf (k tile
// b0 * bt first). Blocks outer, tiles inner: the group's bytes are read in order.
void dequant_blocks(const View& v, int64_t g, int j0, int j1, int64_t b0, int64_t b1, uint16_t* buf) {
  const quant::Format* f = quant::find(v.type[g]);
  const int64_t bt = f->block / kTileK;
  const uint8_t* gd = v.data + v.offset[g];
  for (int64_t b = b0; b < b1; ++b) {
    for (int j = j0; j < j1; ++j) {
      const uint8_t* src = gd + (b * kGroupTiles + j) * f->tile_bytes;
      for (int64_t line = 0; line < f->tile_bytes; line += 64) _mm_prefetch(reinterpret_cast<const char*>(src + kAheadBytes + line), _MM_HINT_T0);
      f->dequant(src, buf + (b - b0) * bt * kStepElems + j * kTileElems);
    }
  }
}

}  // namespace

bool is_quant_pack(const at::Tensor& packed) { return is_stack<Header>(packed, kMagic); }

void quant_shape(const at::Tensor& packed, int64_t* out, int64_t* in) {
  *out = view(packed).head->out;
  *in = view(packed).head->in;
}

int64_t quant_fused_limit(const at::Tensor& packed) { return view(packed).head->fused_rows; }

QuantGroup quant_group(const at::Tensor& packed, int64_t g) {
  const View v = view(packed);
  return QuantGroup{v.type[g], v.data + v.offset[g]};
}

ChunkFn quant_chunks(const at::Tensor& packed) {
  const View v = view(packed);
  return [v](int64_t g, int64_t kt0, int64_t count, uint16_t* buf) {
    const int64_t bt = quant::find(v.type[g])->block / kTileK;
    TORCH_CHECK(kt0 % bt == 0 && count % bt == 0, "quant chunk not aligned to its blocks");
    dequant_blocks(v, g, 0, kGroupTiles, kt0 / bt, (kt0 + count) / bt, buf);
    return static_cast<const uint16_t*>(buf);
  };
}

}  // namespace vs

using vs::kGroupOut;
using vs::kGroupTiles;
using vs::kTileK;

at::Tensor pack_quant(const std::vector<at::Tensor>& raws, const std::vector<int64_t>& types,
                      const std::vector<int64_t>& outs, int64_t in) {
  std::vector<vs::StackPart> parts;
  int64_t fused_rows = vs::kFusedRows;
  for (int64_t type : types) {
    const vs::quant::Format* f = vs::quant::find(type);
    TORCH_CHECK(f, "pack_quant: ggml type ", type, " has no kernel (supported: ", vs::supported(), ")");
    parts.push_back({f->name, f->type, f->block, f->raw_bytes, f->tile_bytes, f->repack});
    fused_rows = std::min(fused_rows, vs::fused_rows_for_block(f->block));
  }
  vs::Stacked st = vs::pack_stack("pack_quant", raws, parts, outs, in, sizeof(vs::Header));
  const vs::Header head{vs::kMagic, st.out, in, st.groups, in / kTileK, st.data_offset, fused_rows, 0};
  std::memcpy(st.packed.data_ptr<uint8_t>(), &head, sizeof(head));
  return st.packed;
}

at::Tensor embedding(const at::Tensor& packed, const at::Tensor& ids_in) {
  const bool i8 = vs::is_i8_pack(packed);
  TORCH_CHECK(i8 || vs::is_quant_pack(packed), "embedding: the weight must come from pack_quant()");
  const at::Tensor ids = ids_in.contiguous();
  int64_t out, in;
  (i8 ? vs::i8_shape : vs::quant_shape)(packed, &out, &in);
  at::Tensor y = vs::embedding_rows(ids, out, in);
  const int64_t n = ids.numel();
  const int64_t* id = ids.data_ptr<int64_t>();
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  if (i8) {
    vs::embedding_i8(packed, id, n, y.data_ptr<at::BFloat16>());
    return y;
  }
  const vs::View v = vs::view(packed);
  const int64_t k_tiles = v.head->k_tiles;
  at::parallel_for(0, n, 8, [&](int64_t r0, int64_t r1) {
    std::vector<uint16_t> buf(k_tiles * vs::kStepElems);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t g = id[r] / kGroupOut, j = (id[r] % kGroupOut) / 16, col = id[r] % 16;
      const int64_t blocks = in / vs::quant::find(v.type[g])->block;
      vs::dequant_blocks(v, g, static_cast<int>(j), static_cast<int>(j) + 1, 0, blocks, buf.data());
      for (int64_t k = 0; k < in; ++k) {
        yp[r * in + k] = buf[(k / kTileK) * vs::kStepElems + j * vs::kTileElems + ((k % kTileK) / 2) * kTileK +
                             2 * col + k % 2];
      }
    }
  });
  return y;
}

std::vector<int64_t> quant_pack_shape(const at::Tensor& packed) {
  int64_t out, in;
  if (vs::is_i8_pack(packed)) {
    vs::i8_shape(packed, &out, &in);
    return {out, in};
  }
  TORCH_CHECK(vs::is_quant_pack(packed), "quant_shape: the weight must come from pack_quant()");
  vs::quant_shape(packed, &out, &in);
  return {out, in};
}

std::vector<int64_t> quant_types() {
  int64_t count;
  const vs::quant::Format* all = vs::quant::formats(&count);
  std::vector<int64_t> types;
  for (int64_t i = 0; i < count; ++i) types.push_back(all[i].type);
  return types;
}
