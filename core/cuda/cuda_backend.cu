// The CUDA backend registry (one CudaBackend per GPU), device discovery and descriptions, the TF32
// setting, and the host-side collapse of strided loops shared by the elementwise kernels.
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"
#include "core/cuda/nl_cuda_api.h"

namespace nl {

namespace {
std::atomic<bool> tf32_allowed{false};
}  // namespace

int cuda_device_count() {
    // Counted once: the set of GPUs a process sees does not change while it runs.
    static const int count = [] {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
            cudaGetLastError();  // no driver / no device: clear the error, report none
            return 0;
        }
        return n;
    }();
    return count;
}

std::vector<std::string> cuda_device_descriptions() {
    std::vector<std::string> lines;
    for (int i = 0; i < cuda_device_count(); ++i) {
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
            cudaGetLastError();
            lines.push_back("cuda:" + std::to_string(i) + ": (properties unavailable)");
            continue;
        }
        char line[512];
        std::snprintf(line, sizeof line, "cuda:%d: %s, sm_%d%d, %.1f GiB, %d SMs", i, prop.name, prop.major,
                      prop.minor, static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0),
                      prop.multiProcessorCount);
        lines.emplace_back(line);
    }
    return lines;
}

CudaRuntimeInfo cuda_runtime_info() {
    CudaRuntimeInfo info;
    cudaRuntimeGetVersion(&info.runtime_version);
    cudaDriverGetVersion(&info.driver_version);
    const cudaError_t status = cudaGetDeviceCount(&info.device_count);
    if (status != cudaSuccess) {
        info.error = cudaGetErrorString(status);
        info.device_count = 0;
        cudaGetLastError();  // clear it: the CPU backend still works
    }
    return info;
}

CudaDeviceInfo cuda_device_info(int index) {
    CudaDeviceInfo info;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
        cudaGetLastError();
        info.name = "(properties unavailable)";
        return info;
    }
    info.name = prop.name;
    info.major = prop.major;
    info.minor = prop.minor;
    info.memory_bytes = static_cast<double>(prop.totalGlobalMem);
    info.multiprocessors = prop.multiProcessorCount;
    return info;
}

Backend& cuda_backend(int index) {
    const int count = cuda_device_count();
    NL_REQUIRE(index >= 0 && index < count, "cuda:", index, ": no such CUDA device (",
               count == 0 ? std::string("no usable GPU found") : std::to_string(count) + " GPU(s) found",
               ")");
    // Never destroyed, like the allocators: static tensors may still launch frees during exit.
    static std::mutex mutex;
    static auto* backends = new std::vector<std::unique_ptr<CudaBackend>>();
    std::lock_guard<std::mutex> lock(mutex);
    if (backends->empty()) backends->resize(static_cast<size_t>(count));
    auto& slot = (*backends)[static_cast<size_t>(index)];
    if (!slot) slot = std::make_unique<CudaBackend>(index);
    return *slot;
}

void cuda_synchronize(int index) {
    cuda_backend(index);  // validates the index
    cuda::DeviceGuard guard(index);
    NL_CUDA_CHECK(cudaDeviceSynchronize());
}

void set_cuda_tf32(bool allow) { tf32_allowed.store(allow); }
bool cuda_tf32() { return tf32_allowed.load(); }

namespace cuda {

StridedLoop collapse(const Shape& shape, std::initializer_list<const StridedArg*> args) {
    StridedLoop loop;
    const int nargs = static_cast<int>(args.size());
    NL_CHECK(nargs <= kMaxArgs);
    for (const StridedArg* arg : args) NL_CHECK(arg->strides.size() == shape.size(), shape_str(shape));
    loop.numel = shape_numel(shape);
    int nd = 0;
    // Outermost to innermost, skipping size-1 dims (their strides never matter).
    for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] == 1) continue;
        bool merge = nd > 0;
        int k = 0;
        for (const StridedArg* arg : args) {
            // the previous (outer) dim must step exactly over this whole dim
            merge = merge && loop.strides[k][nd - 1] == arg->strides[d] * shape[d];
            ++k;
        }
        if (merge) {
            loop.sizes[nd - 1] *= shape[d];
            k = 0;
            for (const StridedArg* arg : args) loop.strides[k++][nd - 1] = arg->strides[d];
            continue;
        }
        NL_REQUIRE(nd < kMaxDims, "cuda: strided operands with more than ", kMaxDims,
                   " non-mergeable dims are not supported (shape ", shape_str(shape), ")");
        loop.sizes[nd] = shape[d];
        k = 0;
        for (const StridedArg* arg : args) loop.strides[k++][nd] = arg->strides[d];
        ++nd;
    }
    if (nd == 0) {  // a scalar, or all dims of size 1
        loop.sizes[0] = 1;
        for (int k = 0; k < nargs; ++k) loop.strides[k][0] = 0;
        nd = 1;
    }
    loop.ndim = nd;
    return loop;
}

}  // namespace cuda

}  // namespace nl
