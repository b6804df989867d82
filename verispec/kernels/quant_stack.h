// GGUF tensors stacked along out (fused q/k/v, gate/up) as both quantized pack
// formats lay them out (quant.cpp: the bf16 path's; quant_i8.cpp: the integer
// path's): a header, a per-group table (ggml type [groups], then byte offset
// [groups] from the data start), then each 64-output group's tile blocks,
// [block along k][4 tiles]. A group never straddles two tensors, so all but the
// last need a multiple of 64 rows; each keeps its own format.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace vs {

struct StackPart {
  const char* name;  // the format's, for messages
  int64_t type, block, raw_bytes, tile_bytes;
  // rows[i]: output i's raw block (16 of them; a padding output's points at zeros).
  std::function<void(const uint8_t* const* rows, uint8_t* dst)> repack;
};

struct Stacked {
  at::Tensor packed;  // header bytes zeroed for the caller to fill
  int64_t out, groups, data_offset;
};

// A stacked pack read back. H is the format's header: int64 fields, the first
// four magic, out, in, groups, and data_offset among the rest.
template <class H>
struct StackView {
  const H* head;
  const int64_t* type;  // [groups]
  const int64_t* offset;  // [groups], bytes from data start
  const uint8_t* data;
};

template <class H>
StackView<H> stack_view(const at::Tensor& packed) {
  const uint8_t* base = packed.data_ptr<uint8_t>();
  const auto* head = reinterpret_cast<const H*>(base);
  const auto* table = reinterpret_cast<const int64_t*>(base + sizeof(H));
  return StackView<H>{head, table, table + head->groups, base + head->data_offset};
}

template <class H>
bool is_stack(const at::Tensor& packed, int64_t magic) {
  return packed.scalar_type() == at::kByte && packed.dim() == 1 && packed.is_contiguous() &&
         packed.numel() >= static_cast<int64_t>(sizeof(H)) &&
         reinterpret_cast<const H*>(packed.data_ptr<uint8_t>())->magic == magic;
}

// Asks Linux for 2 MiB pages over the whole 2 MiB spans of [data, data + bytes),
// before their first touch. A weight pack is one long read stream per product: on
// 4 KiB pages the hardware prefetcher stops at every page and the TLB misses
// every few blocks.
void advise_huge_pages(void* data, int64_t bytes);

// Checks raws against parts and outs (`who` names the caller in errors), then
// lays out and repacks every tile block.
Stacked pack_stack(const char* who, const std::vector<at::Tensor>& raws, const std::vector<StackPart>& parts,
                   const std::vector<int64_t>& outs, int64_t in, size_t header_bytes);

// An embedding's output for `ids` (int64, contiguous, each checked to be in [0, out)):
// an empty bf16 [*ids.shape, in].
at::Tensor embedding_rows(const at::Tensor& ids, int64_t out, int64_t in);

}  // namespace vs
