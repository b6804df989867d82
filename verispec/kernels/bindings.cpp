// Python bindings of the kernels; every call releases the GIL, so a serving
// thread can tokenize while a forward runs.
#include <torch/csrc/utils/pybind.h>

#include "kernels.h"

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
  m.def("embedding", &embedding, "bf16 rows of a quantized pack", py::arg("packed"), py::arg("ids"),
        py::call_guard<py::gil_scoped_release>());
  m.def("quant_types", &quant_types, "ggml type ids pack_quant supports");
  m.def("quant_fused_rows", &quant_fused_rows, "largest row count for the fused quantized matmul (set with rows >= 0)",
        py::arg("rows") = -1);
  m.def("quant_shape", &quant_pack_shape, "[out, in] of a quantized pack");
  m.def("linear", &linear, "bf16 x @ W.T (+ bias) from a packed W (dense or quantized); row-invariant",
        py::arg("x"), py::arg("packed"), py::arg("out"), py::arg("bias") = py::none(),
        py::call_guard<py::gil_scoped_release>());
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
}
