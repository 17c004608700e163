// Bindings of the jobs from Python (train, sample, stability, checkpoints), with the GIL released while they run.
#include "bindings.h"

namespace nl::py {

void bind_jobs(nb::module_& m) {}

}  // namespace nl::py
