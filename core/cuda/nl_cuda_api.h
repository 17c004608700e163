// The CUDA backend's entry points (core/cuda/*.cu), declared only when normlab is built with CUDA so
// the CPU build never references them. Named nl_cuda_api.h so that it is never taken for the CUDA
// toolkit's <cuda_runtime.h>.
#pragma once

#ifdef NORMLAB_HAVE_CUDA

#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/backend.h"

namespace nl {

// The counting allocator for CUDA device `index`; throws nl::Error when no such GPU is present.
Allocator& cuda_allocator(int index);
// The backend for CUDA device `index`; throws nl::Error when no such GPU is present.
Backend& cuda_backend(int index);

// Number of usable GPUs: 0 when there is no driver or no device (never throws).
int cuda_device_count();
// One line per GPU: "cuda:0: NVIDIA H200, sm_90, 139.8 GiB, 132 SMs"; empty without a usable GPU.
std::vector<std::string> cuda_device_descriptions();

// What `normlab info` reports: the runtime's and the driver's versions (CUDA's encoding,
// 1000 * major + 10 * minor; 0 when unknown), the GPUs found, and why none is usable when
// cudaGetDeviceCount failed (empty when it succeeded). Never throws.
struct CudaRuntimeInfo {
    int runtime_version = 0;
    int driver_version = 0;
    int device_count = 0;
    std::string error;
};
CudaRuntimeInfo cuda_runtime_info();

// GPU `index`'s properties; name "(properties unavailable)" when the runtime cannot tell.
struct CudaDeviceInfo {
    std::string name;
    int major = 0, minor = 0;    // compute capability
    double memory_bytes = 0.0;   // global memory
    int multiprocessors = 0;
};
CudaDeviceInfo cuda_device_info(int index);
// Waits until every queued kernel and copy on GPU `index` has finished (for timing).
void cuda_synchronize(int index);
// Returns GPU `index`'s idle cached blocks to the driver (cudaFree); live tensors are untouched.
void cuda_empty_cache(int index);
// f32 gemm on TF32 tensor cores (faster, ~1e-3 relative error) instead of exact f32: off by default.
void set_cuda_tf32(bool allow);
bool cuda_tf32();

}  // namespace nl

#endif  // NORMLAB_HAVE_CUDA
