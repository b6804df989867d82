// The stacked pack layout's builder (quant_stack.h) and the embedding's output checks,
// shared by both quantized pack formats and by both integer-path modules (build.py):
// plain C++, no vector code.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "matmul.h"
#include "quant_stack.h"

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

at::Tensor embedding_rows(const at::Tensor& ids, int64_t out, int64_t in) {
  TORCH_CHECK(ids.scalar_type() == at::kLong, "embedding: ids must be int64");
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < ids.numel(); ++r) {
    TORCH_CHECK(id[r] >= 0 && id[r] < out, "embedding: id ", id[r], " out of range [0, ", out, ")");
  }
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(in);
  return at::empty(shape, at::TensorOptions().dtype(at::kBFloat16));
}

}  // namespace vs
