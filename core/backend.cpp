// The device -> backend registry (backend_for: one static CpuBackend, the CUDA backends when built
// with CUDA, each behind the profiler's wrapper while it is on).
#include "core/backend.h"

#include "core/cpu/cpu_backend.h"
#include "core/profiler.h"
#ifdef NORMLAB_HAVE_CUDA
#include "core/cuda/nl_cuda_api.h"
#endif

namespace nl {

namespace {

Backend& unprofiled_backend_for(Device device) {
    if (device.is_cpu()) {
        static CpuBackend cpu;
        return cpu;
    }
#ifdef NORMLAB_HAVE_CUDA
    return cuda_backend(device.index);
#else
    throw Error("backend_for: normlab was built without CUDA (asked for " + device.str() + ")");
#endif
}

}  // namespace

Backend& backend_for(Device device) {
    // The profiler's switch (core/profiler.h): one branch when it is off.
    if (profiler::enabled()) return profiler::profiled(unprofiled_backend_for(device));
    return unprofiled_backend_for(device);
}
}  // namespace nl
