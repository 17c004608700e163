// A CPU emulator of the small part of CUDA that core/cuda/*.cu uses, so their kernels run and are tested
// on a machine without a GPU (-DNORMLAB_CUDA_EMULATOR=ON; see docs/cuda.md). Not a GPU model: it runs
// each block's threads as cooperative fibers on one host thread, one block after another, and checks
// what a GPU would not forgive (a __syncthreads or full-mask shuffle that not every thread reaches, a
// copy whose pointers contradict its kind, a launch past CUDA's limits). It says nothing about speed.
// The fake <cuda_runtime.h>, <cuda_bf16.h>, <cuda_fp16.h> and <cublas_v2.h> beside this file include it.
#pragma once

#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// CUDA's qualifiers mean nothing on the host. __shared__ becomes a function-local static: one copy per
// kernel, shared by every thread of the block, which is right because one block runs at a time.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace nl_emu {

// The running launch: one block at a time.
extern dim3 block_idx, block_dim, grid_dim;
// The running fiber's thread index.
const dim3& thread_idx();
// __syncthreads(): waits until every thread of the block has arrived (exited threads count as arrived).
void sync_block();
// Full-mask warp shuffle: lane i gets the value of lane i ^ lane_mask; every lane of the warp must call it.
void shuffle_xor(unsigned mask, const void* value, void* result, int lane_mask, size_t bytes);
// Runs `thread_body(context)` as every thread of every block of `kernel` (its identity); launch errors
// go to cudaGetLastError().
void run_kernel(const void* kernel, dim3 grid, dim3 block, void (*thread_body)(void*), void* context);

// NL_LAUNCH(kernel, blocks, threads)(args...) under the emulator: the arguments are converted to the
// kernel's parameter types once, and every thread calls the kernel with its own copy of them.
template <typename... Params>
struct Launcher {
    dim3 grid, block;
    void (*kernel)(Params...);

    template <typename... Args>
    void operator()(Args&&... args) const {
        struct Context {
            void (*kernel)(Params...);
            std::tuple<std::decay_t<Params>...> args;
        } context{kernel, std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)};
        run_kernel(reinterpret_cast<const void*>(kernel), grid, block, [](void* p) {
            auto* c = static_cast<Context*>(p);
            std::apply(c->kernel, c->args);  // by value: each thread gets its own copies
        }, &context);
    }
};

template <typename... Params>
Launcher<Params...> launcher(dim3 grid, dim3 block, void (*kernel)(Params...)) {
    return {grid, block, kernel};
}

}  // namespace nl_emu

#define threadIdx (::nl_emu::thread_idx())
#define blockIdx (::nl_emu::block_idx)
#define blockDim (::nl_emu::block_dim)
#define gridDim (::nl_emu::grid_dim)

inline void __syncthreads() { nl_emu::sync_block(); }

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move at most 8 bytes");
    T result;
    nl_emu::shuffle_xor(mask, &value, &result, lane_mask, sizeof(T));
    return result;
}

inline double __longlong_as_double(long long bits) {
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
}
