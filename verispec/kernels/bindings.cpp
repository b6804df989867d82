// Python bindings of the kernels; every call but suffix_lookup (microseconds)
// releases the GIL, so a serving thread can tokenize while a forward runs.
#include <torch/csrc/utils/pybind.h>

#include "kernels.h"

namespace {

// A stream's buffer, checked to be int64 (array('q')); the caller keeps it alive while
// it reads the pointer.
py::buffer_info stream_of(const py::buffer& buffer) {
  py::buffer_info info = buffer.request();
  if (info.ndim != 1 || info.itemsize != 8 || (info.format != "q" && info.format != "l")) {
    throw std::invalid_argument("suffix_lookup: streams must be array('q') of int64");
  }
  return info;
}

py::tuple as_python(const SuffixLookup& found) {
  py::list chains;
  for (const SuffixChain& chain : found.chains) {
    chains.append(py::make_tuple(chain.match_length, py::cast(chain.tokens), py::cast(chain.probs)));
  }
  return py::make_tuple(found.longest, chains);
}

// Both of suffix decoding's lookups in one call (each call costs tens of microseconds
// cold after a target pass): the request's own context, scanned, and a store's index
// (`tokens` None: no store). Holds the GIL: the streams are Python arrays that another
// thread may grow (the caller holds the store's lock), and the lookup takes microseconds.
py::tuple suffix_lookup_py(const py::buffer& context, const py::object& tokens, int64_t offset,
                           int64_t live, const std::vector<int64_t>& heads,
                           const std::vector<py::buffer>& chains, const std::vector<int64_t>& anchors,
                           const std::vector<int64_t>& query, int64_t recent, int64_t store_recent,
                           int64_t k, const std::vector<int64_t>& caps, double min_prob,
                           const std::vector<int64_t>& stop, int64_t tried) {
  if (caps.empty()) throw std::invalid_argument("suffix_lookup: caps is empty");
  const py::buffer_info own = stream_of(context);
  const py::tuple local = as_python(suffix_scan(static_cast<const int64_t*>(own.ptr), own.shape[0], anchors,
                                                query, recent, k, caps, min_prob, stop, tried));
  if (tokens.is_none()) return py::make_tuple(local, py::none());
  const py::buffer_info stream = stream_of(tokens.cast<py::buffer>());
  std::vector<py::buffer_info> held;  // the chains' buffers, alive through the lookup
  std::vector<const int64_t*> links;
  for (const py::buffer& chain : chains) {
    held.push_back(stream_of(chain));
    if (held.back().shape[0] != stream.shape[0]) {
      throw std::invalid_argument("suffix_lookup: a chain is not parallel to the stream");
    }
    links.push_back(static_cast<const int64_t*>(held.back().ptr));
  }
  if (anchors.size() != heads.size() || anchors.size() != links.size()) {
    throw std::invalid_argument("suffix_lookup: anchors, heads and chains differ in length");
  }
  return py::make_tuple(local, as_python(suffix_chains(static_cast<const int64_t*>(stream.ptr),
                                                       stream.shape[0], offset, live, anchors, heads,
                                                       links, query, store_recent, k, caps, min_prob,
                                                       stop, tried)));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("init", &init, "choose the matmul's instruction set: 2 AMX, 1 AVX-512-BF16, 0 none");
  m.def("pack", &pack, "repack a bf16 [out, in] weight into the tile layout",
        py::call_guard<py::gil_scoped_release>());
  m.def("pack_quant", &pack_quant, "repack GGUF block rows (several tensors stacked on out) for the matmul",
        py::arg("raws"), py::arg("types"), py::arg("outs"), py::arg("in_features"),
        py::call_guard<py::gil_scoped_release>());
  m.def("pack_quant_i8", &pack_quant_i8, "repack GGUF block rows for the integer (int8-activation) matmul",
        py::arg("raws"), py::arg("types"), py::arg("outs"), py::arg("in_features"),
        py::call_guard<py::gil_scoped_release>());
  m.def("quant_i8_types", &quant_i8_types, "ggml type ids pack_quant_i8 supports");
  m.def("quant_i8_stream_nta", &quant_i8_stream_nta,
        "whether the integer path requests its weight stream non-temporally (AMD CPUs)");
  m.def("is_quant_i8", &is_quant_i8, "whether a pack came from pack_quant_i8");
  m.def("embedding", &embedding, "bf16 rows of a quantized pack", py::arg("packed"), py::arg("ids"),
        py::call_guard<py::gil_scoped_release>());
  m.def("quant_types", &quant_types, "ggml type ids pack_quant supports");
  m.def("quant_fused_rows", &quant_fused_rows, "largest row count for the fused quantized matmul (set with rows >= 0)",
        py::arg("rows") = -1);
  m.def("quant_shape", &quant_pack_shape, "[out, in] of a quantized pack");
  m.def("linear", &linear, "bf16 x @ W.T (+ bias) from a packed W (dense or quantized); row-invariant",
        py::arg("x"), py::arg("packed"), py::arg("out"), py::arg("bias") = py::none(),
        py::arg("float_out") = false, py::call_guard<py::gil_scoped_release>());
  m.def("attention_dots", &attention_dots, "how bf16 attention scores are summed here: fma or vdpbf16ps");
  m.def("attend", &attend, "row-invariant attention of query rows against per-request caches",
        py::arg("q"), py::arg("caches"), py::arg("row_cache"), py::arg("row_len"),
        py::arg("row_index") = py::none(), py::arg("scale") = 0.0, py::arg("softcap") = 0.0,
        py::call_guard<py::gil_scoped_release>());
  m.def("decoder_layer", &decoder_layer, "one bf16 Llama decoder layer over rows of several requests",
        py::arg("x"), py::arg("weights"), py::arg("dims"), py::arg("eps"), py::arg("cos"), py::arg("sin"),
        py::arg("caches"), py::arg("row_cache"), py::arg("row_slot"), py::arg("row_len"),
        py::arg("row_index") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("gemma_layer", &gemma_layer, "one bf16 Gemma 2/3 decoder layer over rows of several requests",
        py::arg("x"), py::arg("weights"), py::arg("dims"), py::arg("eps"), py::arg("scale"), py::arg("softcap"),
        py::arg("cos"), py::arg("sin"), py::arg("caches"), py::arg("row_cache"), py::arg("row_slot"),
        py::arg("row_len"), py::arg("row_index") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("sampling_probs", &sampling_probs,
        "float32 [rows, vocab] logits -> probabilities under temperature, min_p, top_k and top_p, "
        "or None where a row holds a NaN or no finite logit",
        py::arg("logits"), py::arg("temperature"), py::arg("min_p"), py::arg("top_k"), py::arg("top_p"),
        py::call_guard<py::gil_scoped_release>());
  m.def("sampling_draw", &sampling_draw, "one token per row of float32 [rows, vocab] by inversion of float64 uniforms",
        py::arg("probs"), py::arg("uniforms"), py::call_guard<py::gil_scoped_release>());
  m.def("suffix_lookup", &suffix_lookup_py,
        "suffix decoding's lookups, (context's, store's or None), each (longest match, "
        "[(match length, chain tokens, probabilities)])",
        py::arg("context"), py::arg("tokens"), py::arg("offset"), py::arg("live"), py::arg("heads"),
        py::arg("chains"), py::arg("anchors"), py::arg("query"), py::arg("recent"),
        py::arg("store_recent"), py::arg("k"), py::arg("caps"), py::arg("min_prob"), py::arg("stop"),
        py::arg("tried"));
}
