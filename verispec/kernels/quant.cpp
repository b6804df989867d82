// Quantized packs: GGUF block rows repacked into tile blocks (quant_formats.h),
// dequantized chunk by chunk into the dense packed layout inside the matmul,
// so a quantized product runs the dense product's exact per-element sequence.
//
// A pack is one uint8 tensor laid out as quant_stack.h says: several tensors of
// one in_features may share it (fused q/k/v, gate/up), each in its own format.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/mman.h>

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

namespace vs {

void advise_huge_pages(void* data, int64_t bytes) {
  constexpr uintptr_t kHuge = 2 << 20;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
}

Stacked pack_stack(const char* who, const std::vector<at::Tensor>& raws, const std::vector<StackPart>& parts,
                   const std::vector<int64_t>& outs, int64_t in, size_t header_bytes) {
  const size_t count = parts.size();
  TORCH_CHECK(count > 0 && raws.size() == count && outs.size() == count,
              who, ": one ggml type and out_features per raw tensor");
  std::vector<int64_t> start(count + 1, 0);
  for (size_t s = 0; s < count; ++s) {
    const StackPart& f = parts[s];
    TORCH_CHECK(in > 0 && in % f.block == 0, who, ": in_features ", in, " is not a multiple of ", f.name,
                "'s block of ", f.block);
    const int64_t want = outs[s] * (in / f.block) * f.raw_bytes;
    TORCH_CHECK(raws[s].scalar_type() == at::kByte && raws[s].is_contiguous() && raws[s].numel() == want,
                who, ": ", f.name, " [", outs[s], ", ", in, "] needs ", want, " contiguous uint8 bytes, got ",
                raws[s].numel());
    TORCH_CHECK(outs[s] > 0 && (s + 1 == count || outs[s] % kGroupOut == 0),
                who, ": every tensor but the last needs a multiple of 64 rows (pack it alone)");
    start[s + 1] = start[s] + outs[s];
  }
  const int64_t out = start[count], groups = (out + kGroupOut - 1) / kGroupOut;
  std::vector<int64_t> part_of(groups), offset(groups);
  int64_t bytes = 0;
  for (int64_t g = 0; g < groups; ++g) {
    part_of[g] = std::upper_bound(start.begin(), start.end(), g * kGroupOut) - start.begin() - 1;
    offset[g] = bytes;
    bytes += (in / parts[part_of[g]].block) * kGroupTiles * parts[part_of[g]].tile_bytes;
  }
  const int64_t data_offset = (static_cast<int64_t>(header_bytes) + 16 * groups + 63) / 64 * 64;
  at::Tensor packed = at::empty({data_offset + bytes}, at::TensorOptions().dtype(at::kByte));
  uint8_t* base = packed.data_ptr<uint8_t>();
  advise_huge_pages(base, packed.numel());  // before the first touch
  std::memset(base, 0, data_offset);
  auto* table = reinterpret_cast<int64_t*>(base + header_bytes);
  for (int64_t g = 0; g < groups; ++g) {
    table[g] = parts[part_of[g]].type;
    table[groups + g] = offset[g];
  }
  static const uint8_t zeros[256] = {};  // a padding output's block: all scales 0
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t s = part_of[g];
      const StackPart& f = parts[s];
      const int64_t blocks = in / f.block, row_bytes = blocks * f.raw_bytes;
      const uint8_t* raw = raws[s].data_ptr<uint8_t>();
      uint8_t* dst = base + data_offset + offset[g];
      for (int64_t b = 0; b < blocks; ++b) {
        for (int j = 0; j < kGroupTiles; ++j) {
          const uint8_t* rows[16];
          for (int i = 0; i < 16; ++i) {
            const int64_t o = g * kGroupOut + j * 16 + i;
            rows[i] = o < start[s + 1] ? raw + (o - start[s]) * row_bytes + b * f.raw_bytes : zeros;
          }
          f.repack(rows, dst + (b * kGroupTiles + j) * f.tile_bytes);
        }
      }
    }
  });
  return Stacked{packed, out, groups, data_offset};
}

}  // namespace vs

at::Tensor embedding(const at::Tensor& packed, const at::Tensor& ids_in) {
  const bool i8 = vs::is_i8_pack(packed);
  TORCH_CHECK(i8 || vs::is_quant_pack(packed), "embedding: the weight must come from pack_quant()");
  TORCH_CHECK(ids_in.scalar_type() == at::kLong, "embedding: ids must be int64");
  const at::Tensor ids = ids_in.contiguous();
  int64_t out, in;
  (i8 ? vs::i8_shape : vs::quant_shape)(packed, &out, &in);
  const int64_t n = ids.numel();
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(id[r] >= 0 && id[r] < out, "embedding: id ", id[r], " out of range [0, ", out, ")");
  }
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(in);
  at::Tensor y = at::empty(shape, at::TensorOptions().dtype(at::kBFloat16));
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
