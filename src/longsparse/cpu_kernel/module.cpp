// The extension module, compiled as one translation unit: the sources of the mapping's row kernel (mappings/csrc/)
// and of the attention kernels (attention/csrc/) are included here and their entry points bound. One unit parses
// torch's headers and compiles the shared row solver once; as separate units the same build took over twice the
// CPU time (torch's binding headers alone take most of a unit's).
#include <torch/extension.h>

#include "../mappings/csrc/entmax_cpu.cpp"
#include "../attention/csrc/scores_cpu.cpp"
#include "../attention/csrc/attention_cpu.cpp"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace longsparse;
  m.def("entmax_forward", &entmax_forward, "α-entmax forward over rows of a contiguous 2-D tensor");
  m.def("entmax_backward", &entmax_backward, "α-entmax backward over rows");
  m.def("entmax_scores_forward", &entmax_scores_forward, "scale + ALiBi + causal mask + α-entmax, in place");
  m.def("entmax_scores_backward", &entmax_scores_backward, "α-entmax backward on attention scores, in place");
  m.def("attention_forward", &attention_forward, "flash-style α-entmax attention: output and row statistics");
  m.def("attention_backward", &attention_backward, "gradients of attention_forward (q, k, v)");
}
