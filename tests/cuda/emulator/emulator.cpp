// The CPU emulator's runtime (see emulator.h): block scheduling on fibers, barriers and shuffles with
// their misuse reported, device memory as checked host allocations, and cuBLAS's gemm.
// Environment: NL_EMU_DEVICES (GPUs to pretend, 0 to 16, default 1), NL_EMU_ORDER=forward|reverse
// (reverse runs blocks, and the threads between two barriers, last to first: a race between threads
// or blocks then changes results).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cblas.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "cublas_v2.h"
#include "cuda_runtime.h"

namespace nl_emu {

dim3 block_idx, block_dim, grid_dim;

namespace {

constexpr size_t kDeviceMemory = size_t{4} << 30;  // bytes each pretend GPU has
constexpr size_t kFiberStack = 256 << 10;          // bytes of stack per emulated thread
constexpr int kWarpSize = 32;

// ---- errors: the sticky "last error" of the runtime, with the emulator's explanation ----

thread_local cudaError_t last_error = cudaSuccess;
std::string last_message;  // why the last launch failed, for cudaGetErrorString

cudaError_t fail(cudaError_t error, const std::string& why) {
    last_error = error;
    last_message = why;
    std::fprintf(stderr, "normlab CUDA emulator: %s\n", why.c_str());
    return error;
}

// The environment's settings, read and checked once: a value the emulator does not understand ends
// the program (exit code 2) with a message naming what was expected and found, rather than running
// the tests on some default the caller did not ask for.
struct Settings {
    int devices = 1;
    bool reverse = false;
};

[[noreturn]] void bad_setting(const char* name, const char* expected, const char* found) {
    std::fprintf(stderr, "normlab CUDA emulator: %s: expected %s, found \"%s\"\n", name, expected, found);
    std::exit(2);
}

const Settings& settings() {
    static const Settings parsed = [] {
        Settings s;
        if (const char* devices = std::getenv("NL_EMU_DEVICES")) {
            char* end = nullptr;
            const long n = std::strtol(devices, &end, 10);
            if (end == devices || *end != '\0' || n < 0 || n > 16)
                bad_setting("NL_EMU_DEVICES", "a number of GPUs from 0 to 16", devices);
            s.devices = static_cast<int>(n);
        }
        if (const char* order = std::getenv("NL_EMU_ORDER")) {
            const std::string text = order;
            if (text != "forward" && text != "reverse") bad_setting("NL_EMU_ORDER", "forward or reverse", order);
            s.reverse = text == "reverse";
        }
        return s;
    }();
    return parsed;
}

int device_count() { return settings().devices; }

bool reverse_order() { return settings().reverse; }

thread_local int current_device = 0;

// ---- device memory: host allocations, remembered so pointers can be told apart and ranges checked ----

struct Allocation {
    size_t bytes;
    int device;
};
std::mutex memory_mutex;
std::map<uintptr_t, Allocation> allocations;  // by start address
std::vector<size_t> used_bytes;                // per device

// The allocation holding [ptr, ptr + bytes), or null.
const std::pair<const uintptr_t, Allocation>* find_allocation(const void* ptr, size_t bytes) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    auto it = allocations.upper_bound(p);
    if (it == allocations.begin()) return nullptr;
    --it;
    if (p + bytes > it->first + it->second.bytes || (bytes == 0 && p >= it->first + it->second.bytes)) return nullptr;
    return &*it;
}

bool is_device(const void* ptr) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    return find_allocation(ptr, 0) != nullptr;
}

bool inside_allocation(const void* ptr, size_t bytes) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    return find_allocation(ptr, bytes) != nullptr;
}

std::string describe(const void* ptr) {
    char text[64];
    std::snprintf(text, sizeof text, "%p", ptr);
    return text;
}

// A copy's device operand must lie inside one allocation.
cudaError_t check_device_range(const char* what, const void* ptr, size_t bytes) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    if (find_allocation(ptr, bytes) == nullptr)
        return fail(cudaErrorInvalidValue, std::string(what) + ": " + std::to_string(bytes) + " bytes at " +
                                               describe(ptr) + " are not inside one device allocation");
    return cudaSuccess;
}

// ---- fibers: the threads of one block ----

enum class State { Runnable, AtBlockBarrier, AtWarpBarrier, Done };

// switch_stack(&from, to): saves the running context's callee-saved registers on its stack and its stack
// pointer in `from`, then resumes the context whose stack pointer is `to`. (glibc's swapcontext makes a
// system call for the signal mask on every switch, which took 70% of the emulator's time.)
#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is written for x86-64"
#endif
extern "C" void nl_emu_switch_stack(void** from, void* to);
asm(R"(
    .text
    .globl nl_emu_switch_stack
    .type nl_emu_switch_stack, @function
nl_emu_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size nl_emu_switch_stack, .-nl_emu_switch_stack
)");

struct Fiber {
    void* sp = nullptr;  // saved stack pointer while parked
    dim3 index;
    State state = State::Runnable;
};

struct Block {
    std::vector<Fiber> fibers;  // (block_dim.x)
    std::vector<std::unique_ptr<char[]>> stacks;
    std::vector<unsigned char> shuffle_slots;  // (block_dim.x, 8): each thread's value in a shuffle
    void* scheduler_sp = nullptr;
    Fiber* current = nullptr;
    void (*body)(void*) = nullptr;
    void* body_context = nullptr;
    std::string error;  // set by a thread that misused a barrier or shuffle; stops the block
};
Block block;

// Kernels that never reached a barrier or shuffle in their first launch run without fibers from then on:
// each thread is a plain call, one after the other (the elementwise kernels: ~100x faster).
enum class Mode { Unknown, Fibers, Direct };
std::map<const void*, Mode> kernel_modes;
bool direct = false;  // the running launch has no fibers
unsigned parks = 0;   // barriers and shuffles reached in the running block
Fiber direct_thread;  // the running thread in direct mode

// Thrown when a kernel run without fibers reaches a barrier after all: caught by run_kernel.
struct BarrierInDirectMode {};

// A fiber's first code: the thread's whole life, then back to the scheduler for good.
void fiber_main() {
    block.body(block.body_context);
    Fiber* self = block.current;
    self->state = State::Done;
    nl_emu_switch_stack(&self->sp, block.scheduler_sp);
    std::abort();  // unreachable: a finished fiber is never resumed
}

// The initial stack of a fiber, as nl_emu_switch_stack leaves one: six saved registers, then the address
// `ret` jumps to, then a zero return address for fiber_main (so it starts with the stack aligned as
// after a call).
void* initial_stack(char* stack, size_t bytes) {
    uintptr_t top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
    auto* slots = reinterpret_cast<void**>(top) - 8;
    for (int i = 0; i < 6; ++i) slots[i] = nullptr;
    slots[6] = reinterpret_cast<void*>(&fiber_main);
    slots[7] = nullptr;
    return slots;
}

// Called on a thread's fiber: park in `state` until the scheduler resumes it.
void park(State state) {
    if (direct) throw BarrierInDirectMode{};
    ++parks;
    Fiber* self = block.current;
    self->state = state;
    nl_emu_switch_stack(&self->sp, block.scheduler_sp);
}

// A thread found an error: stop the block (this fiber is never resumed).
[[noreturn]] void abort_block(const std::string& why) {
    if (block.error.empty()) block.error = why;
    Fiber* self = block.current;
    self->state = State::Done;
    nl_emu_switch_stack(&self->sp, block.scheduler_sp);
    std::abort();  // unreachable: the scheduler never resumes a stopped block
}

std::string where() {
    char text[96];
    std::snprintf(text, sizeof text, "block %u thread %u of %u", block_idx.x, block.current->index.x, block_dim.x);
    return text;
}

// A block stopped by an error leaves its fibers' frames on their stacks. Under AddressSanitizer their
// redzones stay poisoned, so the next block to use the stacks must clear them first.
bool stacks_abandoned = false;

void reset_abandoned_stacks() {
#if defined(__SANITIZE_ADDRESS__)
    if (stacks_abandoned)
        for (auto& stack : block.stacks) ASAN_UNPOISON_MEMORY_REGION(stack.get(), kFiberStack);
#endif
    stacks_abandoned = false;
}

// The fibers of the current block, run to their end. Returns the error that stopped them, or "".
std::string run_block_fibers() {
    const unsigned n = block_dim.x;
    while (block.stacks.size() < n) block.stacks.push_back(std::make_unique<char[]>(kFiberStack));
    block.fibers.assign(n, Fiber{});
    block.shuffle_slots.assign(size_t{n} * 8, 0);
    block.error.clear();
    for (unsigned t = 0; t < n; ++t) {
        Fiber& f = block.fibers[t];
        f.index = dim3(t);
        f.sp = initial_stack(block.stacks[t].get(), kFiberStack);
    }
    for (;;) {
        // Run every runnable thread until it parks at a barrier or ends.
        for (unsigned i = 0; i < n; ++i) {
            Fiber& f = block.fibers[reverse_order() ? n - 1 - i : i];
            if (f.state != State::Runnable) continue;
            block.current = &f;
            nl_emu_switch_stack(&block.scheduler_sp, f.sp);
            if (!block.error.empty()) return block.error;
        }
        unsigned done = 0, at_block = 0;
        for (const Fiber& f : block.fibers) {
            done += f.state == State::Done;
            at_block += f.state == State::AtBlockBarrier;
        }
        if (done == n) return "";
        // A warp's shuffle goes on when all its lanes are in it; a lane elsewhere never will be.
        bool released = false;
        for (unsigned w = 0; w * kWarpSize < n; ++w) {
            const unsigned first = w * kWarpSize, last = std::min(n, first + kWarpSize);
            unsigned in_shuffle = 0;
            for (unsigned t = first; t < last; ++t) in_shuffle += block.fibers[t].state == State::AtWarpBarrier;
            if (in_shuffle == 0) continue;
            if (in_shuffle != last - first)
                return "block " + std::to_string(block_idx.x) + ": " + std::to_string(in_shuffle) + " of warp " +
                       std::to_string(w) + "'s " + std::to_string(last - first) +
                       " lanes wait in a full-mask shuffle that the others (exited or at __syncthreads) never reach";
            for (unsigned t = first; t < last; ++t) block.fibers[t].state = State::Runnable;
            released = true;
        }
        if (released) continue;
        // __syncthreads: every thread that has not exited is waiting (exited threads count as arrived).
        if (at_block > 0 && at_block + done == n) {
            for (Fiber& f : block.fibers)
                if (f.state == State::AtBlockBarrier) f.state = State::Runnable;
            continue;
        }
        return "block " + std::to_string(block_idx.x) + ": deadlock (" + std::to_string(at_block) +
               " threads at __syncthreads, " + std::to_string(done) + " exited, of " + std::to_string(n) + ")";
    }
}

// Runs every thread of the current block to its end. Returns the error that stopped it, or "".
std::string run_block() {
    reset_abandoned_stacks();
    const std::string error = run_block_fibers();
    stacks_abandoned = !error.empty();
    return error;
}

}  // namespace

const dim3& thread_idx() { return block.current->index; }

void sync_block() { park(State::AtBlockBarrier); }

void shuffle_xor(unsigned mask, const void* value, void* result, int lane_mask, size_t bytes) {
    if (mask != 0xffffffffu)
        abort_block(where() + ": shuffle with a partial mask (the emulator supports full masks only)");
    const unsigned t = block.current->index.x;
    const unsigned partner = (t / kWarpSize) * kWarpSize + ((t % kWarpSize) ^ static_cast<unsigned>(lane_mask));
    if (lane_mask < 0 || lane_mask >= kWarpSize || partner >= block_dim.x)
        abort_block(where() + ": shuffle partner lane " + std::to_string(partner) + " does not exist");
    std::memcpy(&block.shuffle_slots[size_t{t} * 8], value, bytes);
    park(State::AtWarpBarrier);  // every lane has written
    std::memcpy(result, &block.shuffle_slots[size_t{partner} * 8], bytes);
    park(State::AtWarpBarrier);  // every lane has read: the slots may be reused
}

namespace {

// Runs the current block's threads one after the other as plain calls (a kernel without barriers).
void run_block_direct() {
    const unsigned n = block_dim.x;
    block.current = &direct_thread;
    for (unsigned i = 0; i < n; ++i) {
        direct_thread.index = dim3(reverse_order() ? n - 1 - i : i);
        block.body(block.body_context);
    }
}

}  // namespace

void run_kernel(const void* kernel, dim3 grid, dim3 block_shape, void (*thread_body)(void*), void* context) {
    if (block_shape.x < 1 || block_shape.x > 1024 || block_shape.y != 1 || block_shape.z != 1 || grid.x < 1 ||
        grid.x > 0x7fffffffu || grid.y != 1 || grid.z != 1) {
        fail(cudaErrorInvalidConfiguration,
             "launch of " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" + std::to_string(grid.z) +
                 " blocks of " + std::to_string(block_shape.x) + "x" + std::to_string(block_shape.y) + "x" +
                 std::to_string(block_shape.z) +
                 " threads: CUDA allows 1..1024 threads per block (the emulator: 1-D only)");
        return;
    }
    grid_dim = grid;
    block_dim = block_shape;
    block.body = thread_body;
    block.body_context = context;
    Mode& mode = kernel_modes[kernel];
    for (unsigned i = 0; i < grid.x; ++i) {
        block_idx = dim3(reverse_order() ? grid.x - 1 - i : i);
        std::string error;
        if (mode == Mode::Direct) {
            direct = true;
            try {
                run_block_direct();
            } catch (const BarrierInDirectMode&) {
                mode = Mode::Fibers;
                error = "block " + std::to_string(block_idx.x) + " reached a barrier or shuffle that the kernel's "
                        "first launch never did (the emulator ran it without fibers); rerun the test";
            }
            direct = false;
        } else {
            parks = 0;
            error = run_block();
            if (mode == Mode::Unknown) mode = parks == 0 ? Mode::Direct : Mode::Fibers;
        }
        if (!error.empty()) {
            fail(cudaErrorLaunchFailure, "kernel stopped: " + error);
            return;
        }
    }
}

}  // namespace nl_emu

using namespace nl_emu;

// ---- the runtime API ----

cudaError_t cudaGetDeviceCount(int* count) {
    *count = device_count();
    if (*count == 0) return fail(cudaErrorNoDevice, "NL_EMU_DEVICES=0: no device");
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count())
        return fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): no such device");
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (device < 0 || device >= device_count())
        return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(" + std::to_string(device) + "): no such device");
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof prop->name, "normlab CUDA emulator (CPU)");
    prop->totalGlobalMem = kDeviceMemory;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1;
    prop->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
    *version = 13000;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
    *version = 13000;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaGetLastError() {
    const cudaError_t error = last_error;
    last_error = cudaSuccess;
    return error;
}

const char* cudaGetErrorName(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorNoDevice: return "cudaErrorNoDevice";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
    static thread_local std::string text;
    text = error == cudaSuccess ? std::string("no error") : "emulator: " + last_message;
    return text.c_str();
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    *ptr = nullptr;
    std::lock_guard<std::mutex> lock(memory_mutex);
    used_bytes.resize(static_cast<size_t>(device_count()), 0);
    if (bytes > kDeviceMemory - used_bytes[current_device])
        return fail(cudaErrorMemoryAllocation, "cudaMalloc(" + std::to_string(bytes) + "): out of memory on device " +
                                                   std::to_string(current_device));
    void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
    if (p == nullptr) return fail(cudaErrorMemoryAllocation, "cudaMalloc: host allocation failed");
    allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, current_device};
    used_bytes[current_device] += bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
    if (ptr == nullptr) return cudaSuccess;
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto it = allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations.end())
        return fail(cudaErrorInvalidValue, "cudaFree(" + describe(ptr) + "): not an allocation");
    used_bytes[it->second.device] -= it->second.bytes;
    allocations.erase(it);
    std::free(ptr);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
    *attributes = cudaPointerAttributes{};
    std::lock_guard<std::mutex> lock(memory_mutex);
    if (const auto* a = find_allocation(ptr, 0)) {
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = a->second.device;
        attributes->devicePointer = const_cast<void*>(ptr);
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return cudaSuccess;
    const bool dst_device = is_device(dst), src_device = is_device(src);
    const bool want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault && (dst_device != want_dst || src_device != want_src))
        return fail(cudaErrorInvalidValue, "cudaMemcpy kind " + std::to_string(kind) + " with a " +
                                               (dst_device ? "device" : "host") + " destination and a " +
                                               (src_device ? "device" : "host") + " source");
    if (dst_device && check_device_range("cudaMemcpy destination", dst, bytes) != cudaSuccess) return last_error;
    if (src_device && check_device_range("cudaMemcpy source", src, bytes) != cudaSuccess) return last_error;
    std::memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemcpyPeer(void* dst, int dst_device, const void* src, int src_device, size_t bytes) {
    cudaPointerAttributes d{}, s{};
    cudaPointerGetAttributes(&d, dst);
    cudaPointerGetAttributes(&s, src);
    if (d.type != cudaMemoryTypeDevice || s.type != cudaMemoryTypeDevice || d.device != dst_device ||
        s.device != src_device)
        return fail(cudaErrorInvalidValue, "cudaMemcpyPeer: the pointers are not on devices " +
                                               std::to_string(dst_device) + " and " + std::to_string(src_device));
    return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t) {
    if (bytes == 0) return cudaSuccess;
    if (check_device_range("cudaMemsetAsync", ptr, bytes) != cudaSuccess) return last_error;
    std::memset(ptr, value, bytes);
    return cudaSuccess;
}

// ---- cuBLAS ----

struct cublasContext {
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
    *handle = new cublasContext();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t) {
    return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

namespace {

// f32 rounded to TF32's 10 mantissa bits (nearest, ties to even), as the tensor cores read it.
float to_tf32(float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return v;
    u += 0xfffu + ((u >> 13) & 1u);
    u &= ~0x1fffu;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

// C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b], column-major, as cuBLAS defines gemmStridedBatched
// (beta == 0: C is not read, as in BLAS). Operands must lie inside device allocations, as on a GPU.
template <typename T>
cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                    const T* alpha, const T* a, int lda, long long stride_a, const T* b, int ldb, long long stride_b,
                    const T* beta, T* c, int ldc, long long stride_c, int batch) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    const int rows_a = transa == CUBLAS_OP_N ? m : k, cols_a = transa == CUBLAS_OP_N ? k : m;
    const int rows_b = transb == CUBLAS_OP_N ? k : n, cols_b = transb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, rows_a) || ldb < std::max(1, rows_b) ||
        ldc < std::max(1, m)) {
        fail(cudaErrorInvalidValue, "cublas gemm: invalid sizes m " + std::to_string(m) + " n " + std::to_string(n) +
                                        " k " + std::to_string(k) + " lda " + std::to_string(lda) + " ldb " +
                                        std::to_string(ldb) + " ldc " + std::to_string(ldc));
        cudaGetLastError();
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    // The last element each operand's batch touches must still be inside its allocation.
    auto extent = [](int rows, int cols, int ld, long long stride, int count) {
        return (static_cast<size_t>(count - 1) * static_cast<size_t>(stride) + static_cast<size_t>(cols - 1) * ld +
                static_cast<size_t>(rows)) * sizeof(T);
    };
    const bool inside = (k == 0 || (inside_allocation(a, extent(rows_a, cols_a, lda, stride_a, batch)) &&
                                    inside_allocation(b, extent(rows_b, cols_b, ldb, stride_b, batch)))) &&
                        inside_allocation(c, extent(m, n, ldc, stride_c, batch));
    if (!inside) {
        fail(cudaErrorLaunchFailure, "cublas gemm: an operand's strided extent leaves its device allocation");
        cudaGetLastError();
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    // The products through OpenBLAS in column-major order: the same definition, at a usable speed. TF32
    // rounds copies of the inputs first.
    const bool tf32 = std::is_same_v<T, float> && handle->math == CUBLAS_TF32_TENSOR_OP_MATH;
    std::vector<T> rounded_a, rounded_b;
    for (int batch_index = 0; batch_index < batch; ++batch_index) {
        const T* ab = a + batch_index * stride_a;
        const T* bb = b + batch_index * stride_b;
        T* cb = c + batch_index * stride_c;
        if (tf32 && k > 0) {
            rounded_a.assign(ab, ab + static_cast<size_t>(cols_a - 1) * lda + rows_a);
            rounded_b.assign(bb, bb + static_cast<size_t>(cols_b - 1) * ldb + rows_b);
            for (T& v : rounded_a) v = static_cast<T>(to_tf32(static_cast<float>(v)));
            for (T& v : rounded_b) v = static_cast<T>(to_tf32(static_cast<float>(v)));
            ab = rounded_a.data();
            bb = rounded_b.data();
        }
        const CBLAS_TRANSPOSE ta = transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
        const CBLAS_TRANSPOSE tb = transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
        if constexpr (std::is_same_v<T, float>) {
            cblas_sgemm(CblasColMajor, ta, tb, m, n, k, *alpha, ab, lda, bb, ldb, *beta, cb, ldc);
        } else {
            cblas_dgemm(CblasColMajor, ta, tb, m, n, k, *alpha, ab, lda, bb, ldb, *beta, cb, ldc);
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* a, int lda,
                                         long long stride_a, const float* b, int ldb, long long stride_b,
                                         const float* beta, float* c, int ldc, long long stride_c, int batch_count) {
    return gemm(handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                batch_count);
}

cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const double* alpha, const double* a, int lda,
                                         long long stride_a, const double* b, int ldb, long long stride_b,
                                         const double* beta, double* c, int ldc, long long stride_c, int batch_count) {
    return gemm(handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                batch_count);
}
