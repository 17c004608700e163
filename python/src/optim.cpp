// Bindings of the optimizers from Python (SGD, Adam, AdamW), gradient clipping and the learning-rate schedules.
#include "bindings.h"

namespace nl::py {

void bind_optim(nb::module_& m) {}

}  // namespace nl::py
