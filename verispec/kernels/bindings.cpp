// Python bindings of the kernels; every call releases the GIL, so a serving
// thread can tokenize while a forward runs.
#include <torch/csrc/utils/pybind.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("init", &init, "CPU has AMX-BF16 and the OS granted tile state");
  m.def("pack", &pack, "repack a bf16 [out, in] weight into AMX B tiles",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear", &linear, "bf16 x @ W.T (+ bias) from a packed W; row-invariant",
        py::arg("x"), py::arg("packed"), py::arg("out"), py::arg("bias") = py::none(),
        py::call_guard<py::gil_scoped_release>());
  m.def("attend", &attend, "row-invariant attention of query rows against per-request caches",
        py::arg("q"), py::arg("caches"), py::arg("row_cache"), py::arg("row_len"),
        py::arg("row_index") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("decoder_layer", &decoder_layer, "one bf16 Llama decoder layer over rows of several requests",
        py::arg("x"), py::arg("weights"), py::arg("dims"), py::arg("eps"), py::arg("cos"), py::arg("sin"),
        py::arg("caches"), py::arg("row_cache"), py::arg("row_slot"), py::arg("row_len"),
        py::arg("row_index") = py::none(), py::call_guard<py::gil_scoped_release>());
}
