// Bindings of normlab's fused CPU kernels on plain tensors (the norms, SwiGLU, attention), for normlab.torch.
#include "bindings.h"

namespace nl::py {

void bind_kernels(nb::module_& m) {}

}  // namespace nl::py
