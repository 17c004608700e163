// The CUDA emulator's own checks (tests/cuda/emulator/, built with -DNORMLAB_CUDA_EMULATOR=ON, as CI's
// second build is): a correct block reduction gives the right sum, and the misuses it promises to
// report (a warp shuffle that not every lane reaches, a shuffle partner past the block, a launch past
// 1024 threads, a copy whose pointers contradict its kind or leave their allocation) come back as
// CUDA errors with the emulator's explanation, and a bad NL_EMU_* setting stops the program with a
// message. In other builds this file defines no tests.
#include <catch2/catch.hpp>

#ifdef NORMLAB_CUDA_EMULATOR

#include <string>
#include <vector>

#include "cli_test_util.h"
#include "core/cuda/cuda_common.cuh"

namespace {

// out[0] = sum of threadIdx.x over the block, through cuda::block_sum (warp shuffles + a barrier).
__global__ void block_sum_kernel(float* out) {
    __shared__ float scratch[32];
    const float total = nl::cuda::block_sum(static_cast<float>(threadIdx.x), scratch);
    if (threadIdx.x == 0) out[0] = total;
}

// Lane 5 of every warp leaves before the full-mask shuffle the other lanes wait in.
__global__ void divergent_shuffle_kernel(float* out) {
    float v = static_cast<float>(threadIdx.x);
    if (threadIdx.x % 32 != 5) v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

// A full-mask shuffle with lane offset 16 in a block of 40 threads: lanes 32..39 have no partner.
__global__ void partial_warp_shuffle_kernel(float* out) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<float>(threadIdx.x), 16);
}

__global__ void write_index_kernel(int* out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = static_cast<int>(threadIdx.x);
}

// The launch's error, cleared, and the emulator's explanation of it.
std::pair<cudaError_t, std::string> launch_error() {
    const cudaError_t error = cudaGetLastError();
    return {error, cudaGetErrorString(error)};
}

template <typename T>
T* device_buffer(size_t count) {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, count * sizeof(T)) == cudaSuccess);
    return static_cast<T*>(p);
}

}  // namespace

TEST_CASE("cuda emulator: block_sum over 64 and 1024 threads gives the exact sum", "[cuda_emulator]") {
    float* out = device_buffer<float>(1);
    for (unsigned threads : {64u, 1024u}) {
        NL_LAUNCH(block_sum_kernel, 1, threads)(out);
        REQUIRE(launch_error().first == cudaSuccess);
        float got = 0.0f;
        REQUIRE(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(got == static_cast<float>(threads * (threads - 1) / 2));
    }
    REQUIRE(cudaFree(out) == cudaSuccess);
}

TEST_CASE("cuda emulator: a shuffle that some lanes never reach is a launch failure naming the warp",
          "[cuda_emulator]") {
    float* out = device_buffer<float>(64);
    NL_LAUNCH(divergent_shuffle_kernel, 1, 64)(out);
    const auto [error, why] = launch_error();
    CHECK(error == cudaErrorLaunchFailure);
    CHECK_THAT(why, Catch::Contains("31 of warp 0's 32 lanes wait in a full-mask shuffle"));
    NL_LAUNCH(partial_warp_shuffle_kernel, 1, 40)(out);
    const auto [error2, why2] = launch_error();
    CHECK(error2 == cudaErrorLaunchFailure);
    CHECK_THAT(why2, Catch::Contains("shuffle partner lane") && Catch::Contains("does not exist"));
    REQUIRE(cudaFree(out) == cudaSuccess);
}

TEST_CASE("cuda emulator: launch limits and copies are checked as on a GPU", "[cuda_emulator]") {
    int* out = device_buffer<int>(2048);
    NL_LAUNCH(write_index_kernel, 1, 2048)(out);
    const auto [error, why] = launch_error();
    CHECK(error == cudaErrorInvalidConfiguration);
    CHECK_THAT(why, Catch::Contains("1..1024 threads per block"));
    NL_LAUNCH(write_index_kernel, 2, 1024)(out);
    REQUIRE(launch_error().first == cudaSuccess);
    std::vector<int> host(2048, -1);
    REQUIRE(cudaMemcpy(host.data(), out, 2048 * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(host[0] == 0);
    CHECK(host[1023] == 1023);
    CHECK(host[1024] == 0);
    CHECK(host[2047] == 1023);
    // The copy's kind contradicts its pointers; a range past the allocation.
    CHECK(cudaMemcpy(host.data(), out, sizeof(int), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK_THAT(std::string(cudaGetErrorString(cudaGetLastError())), Catch::Contains("host destination"));
    CHECK(cudaMemcpy(host.data(), out + 2047, 2 * sizeof(int), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
    CHECK_THAT(std::string(cudaGetErrorString(cudaGetLastError())),
               Catch::Contains("not inside one device allocation"));
    REQUIRE(cudaFree(out) == cudaSuccess);
}

TEST_CASE("cuda emulator: a bad NL_EMU_DEVICES or NL_EMU_ORDER stops normlab with a message naming it",
          "[cuda_emulator]") {
    const std::string dir = nl_test::make_temp_dir("emulator-env");
    const nl_test::CliRun order = nl_test::run_normlab_env(dir, "NL_EMU_ORDER=sideways ", "info");
    CHECK(order.status == 2);
    CHECK_THAT(order.output, Catch::Contains("NL_EMU_ORDER: expected forward or reverse, found \"sideways\""));
    const nl_test::CliRun devices = nl_test::run_normlab_env(dir, "NL_EMU_DEVICES=two ", "info");
    CHECK(devices.status == 2);
    CHECK_THAT(devices.output,
               Catch::Contains("NL_EMU_DEVICES: expected a number of GPUs from 0 to 16, found \"two\""));
    const nl_test::CliRun good = nl_test::run_normlab_env(dir, "NL_EMU_DEVICES=2 NL_EMU_ORDER=reverse ", "info");
    CHECK(good.status == 0);
    CHECK_THAT(good.output, Catch::Contains("2 GPU(s)"));
}

#endif  // NORMLAB_CUDA_EMULATOR
