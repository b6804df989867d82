// Quantized packs: GGUF block rows repacked into tile blocks (quant_formats.h),
// dequantized chunk by chunk into the dense packed layout inside the matmul,
// so a quantized product runs the dense product's exact per-element sequence.
//
// A pack is one uint8 tensor: a header, a per-group table (format, byte offset),
// then each 64-output group's tile blocks, [block along k][4 tiles]. Several
// tensors of one in_features may share a pack (fused q/k/v, gate/up), each with
// its own format, when all but the last have a multiple of 64 rows: a group
// then never straddles two of them.
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

namespace vs {
namespace {

constexpr int64_t kMagic = 0x314b435051535656;  // "VVSQPCK1"

struct Header {
  int64_t magic, out, in, groups, k_tiles, data_offset, fused_rows, reserved;
};

struct View {
  const Header* head;
  const int64_t* type;  // [groups]
  const int64_t* offset;  // [groups], bytes from data start
  const uint8_t* data;
};

View view(const at::Tensor& packed) {
  const uint8_t* base = packed.data_ptr<uint8_t>();
  const auto* head = reinterpret_cast<const Header*>(base);
  const auto* table = reinterpret_cast<const int64_t*>(base + sizeof(Header));
  return View{head, table, table + head->groups, base + head->data_offset};
}

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

bool is_quant_pack(const at::Tensor& packed) {
  return packed.scalar_type() == at::kByte && packed.dim() == 1 && packed.is_contiguous() &&
         packed.numel() >= static_cast<int64_t>(sizeof(Header)) &&
         reinterpret_cast<const Header*>(packed.data_ptr<uint8_t>())->magic == kMagic;
}

void quant_shape(const at::Tensor& packed, int64_t* out, int64_t* in) {
  const View v = view(packed);
  *out = v.head->out;
  *in = v.head->in;
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
  TORCH_CHECK(!raws.empty() && raws.size() == types.size() && raws.size() == outs.size(),
              "pack_quant: one ggml type and out_features per raw tensor");
  const size_t parts = raws.size();
  std::vector<const vs::quant::Format*> fmt(parts);
  std::vector<int64_t> start(parts + 1, 0);
  for (size_t s = 0; s < parts; ++s) {
    fmt[s] = vs::quant::find(types[s]);
    TORCH_CHECK(fmt[s], "pack_quant: ggml type ", types[s], " has no kernel (supported: ", vs::supported(), ")");
    TORCH_CHECK(in > 0 && in % fmt[s]->block == 0, "pack_quant: in_features ", in, " is not a multiple of ",
                fmt[s]->name, "'s block of ", fmt[s]->block);
    const int64_t want = outs[s] * (in / fmt[s]->block) * fmt[s]->raw_bytes;
    TORCH_CHECK(raws[s].scalar_type() == at::kByte && raws[s].is_contiguous() && raws[s].numel() == want,
                "pack_quant: ", fmt[s]->name, " [", outs[s], ", ", in, "] needs ", want,
                " contiguous uint8 bytes, got ", raws[s].numel());
    TORCH_CHECK(outs[s] > 0 && (s + 1 == parts || outs[s] % kGroupOut == 0),
                "pack_quant: every tensor but the last needs a multiple of 64 rows (pack it alone)");
    start[s + 1] = start[s] + outs[s];
  }
  const int64_t out = start[parts], groups = (out + kGroupOut - 1) / kGroupOut;
  std::vector<int64_t> part_of(groups), offset(groups);
  int64_t bytes = 0;
  for (int64_t g = 0; g < groups; ++g) {
    part_of[g] = std::upper_bound(start.begin(), start.end(), g * kGroupOut) - start.begin() - 1;
    const vs::quant::Format* f = fmt[part_of[g]];
    offset[g] = bytes;
    bytes += (in / f->block) * kGroupTiles * f->tile_bytes;
  }
  const int64_t data_offset = (sizeof(vs::Header) + 16 * groups + 63) / 64 * 64;
  at::Tensor packed = at::empty({data_offset + bytes}, at::TensorOptions().dtype(at::kByte));
  uint8_t* base = packed.data_ptr<uint8_t>();
  std::memset(base, 0, data_offset);
  int64_t fused_rows = vs::kFusedRows;
  for (const vs::quant::Format* f : fmt) fused_rows = std::min(fused_rows, vs::fused_rows_for_block(f->block));
  vs::Header head{vs::kMagic, out, in, groups, in / kTileK, data_offset, fused_rows, 0};
  std::memcpy(base, &head, sizeof(head));
  auto* table = reinterpret_cast<int64_t*>(base + sizeof(vs::Header));
  for (int64_t g = 0; g < groups; ++g) {
    table[g] = fmt[part_of[g]]->type;
    table[groups + g] = offset[g];
  }
  static const uint8_t zeros[256] = {};  // a padding output's block: all scales 0
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t s = part_of[g];
      const vs::quant::Format* f = fmt[s];
      const int64_t blocks = in / f->block, row_bytes = blocks * f->raw_bytes;
      const uint8_t* raw = raws[s].data_ptr<uint8_t>();
      uint8_t* dst = base + data_offset + offset[g];
      for (int64_t b = 0; b < blocks; ++b) {
        for (int j = 0; j < kGroupTiles; ++j) {
          const uint8_t* rows[16];
          for (int i = 0; i < 16; ++i) {
            const int64_t o = g * kGroupOut + j * 16 + i;
            rows[i] = o < start[s + 1] ? raw + (o - start[s]) * row_bytes + b * f->raw_bytes : zeros;
          }
          f->repack(rows, dst + (b * kGroupTiles + j) * f->tile_bytes);
        }
      }
    }
  });
  return packed;
}

at::Tensor embedding(const at::Tensor& packed, const at::Tensor& ids_in) {
  TORCH_CHECK(ids_in.scalar_type() == at::kLong, "embedding: ids must be int64");
  if (vs::is_i8_pack(packed)) return vs::embedding_i8(packed, ids_in);
  TORCH_CHECK(vs::is_quant_pack(packed), "embedding: the weight must come from pack_quant()");
  TORCH_CHECK(ids_in.scalar_type() == at::kLong, "embedding: ids must be int64");
  const at::Tensor ids = ids_in.contiguous();
  const vs::View v = vs::view(packed);
  const int64_t n = ids.numel(), in = v.head->in, out = v.head->out, k_tiles = v.head->k_tiles;
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(id[r] >= 0 && id[r] < out, "embedding: id ", id[r], " out of range [0, ", out, ")");
  }
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(in);
  at::Tensor y = at::empty(shape, at::TensorOptions().dtype(at::kBFloat16));
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
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
