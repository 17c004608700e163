// The CUDA caching allocator: cudaMalloc underneath (never managed memory), freed blocks kept in a
// per-size cache for reuse, and the same current/peak/allocation counters as the CPU allocator.
// Reusing a block without synchronizing is safe because every kernel and copy runs on the legacy
// default stream: work queued by the next owner runs after the previous owner's work.
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/cuda_common.cuh"
#include "core/cuda/nl_cuda_api.h"

namespace nl {

namespace {

constexpr size_t kSmallGranule = 512;                 // cudaMalloc aligns to 256; 512 limits size classes
constexpr size_t kLargeMin = size_t(1) << 20;         // from 1 MiB on, sizes round to whole 2 MiB
constexpr size_t kLargeGranule = size_t(2) << 20;

class CudaAllocator final : public Allocator {
public:
    explicit CudaAllocator(int index) : index_(index) {}

    void* allocate(size_t nbytes) override {
        const size_t rounded = rounded_size(nbytes);
        void* ptr = take_cached(rounded);
        if (ptr == nullptr) {
            cuda::DeviceGuard guard(index_);
            cudaError_t status = cudaMalloc(&ptr, rounded);
            if (status == cudaErrorMemoryAllocation) {
                cudaGetLastError();  // clear the sticky-free error before retrying
                empty_cache();       // idle cached blocks may be what stands between us and success
                status = cudaMalloc(&ptr, rounded);
            }
            if (status == cudaErrorMemoryAllocation) {
                cudaGetLastError();
                const MemoryStats s = stats();
                throw Error(detail::concat("allocate: out of CUDA memory on cuda:", index_, " allocating ",
                                           nbytes, " bytes (", s.current_bytes, " bytes in use by tensors)"));
            }
            NL_CUDA_CHECK(status);
        }
        std::lock_guard<std::mutex> lock(mutex_);
        ++allocations_;
        current_ += static_cast<int64_t>(nbytes);
        if (current_ > peak_) peak_ = current_;
        return ptr;
    }

    // Never calls CUDA (so never throws): Storage's destructor runs here, possibly at program exit.
    void deallocate(void* ptr, size_t nbytes) override {
        std::lock_guard<std::mutex> lock(mutex_);
        current_ -= static_cast<int64_t>(nbytes);
        cache_.emplace(rounded_size(nbytes), ptr);
    }

    // Frees every idle cached block.
    void empty_cache() {
        std::multimap<size_t, void*> idle;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            idle.swap(cache_);
        }
        cuda::DeviceGuard guard(index_);
        for (auto& entry : idle) NL_CUDA_CHECK(cudaFree(entry.second));
    }

    MemoryStats stats() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        MemoryStats s;
        s.current_bytes = current_;
        s.peak_bytes = peak_;
        s.allocations = allocations_;
        return s;
    }

    void reset_peak() override {
        std::lock_guard<std::mutex> lock(mutex_);
        peak_ = current_;
    }

private:
    // 0 bytes still gets a real block, so an empty tensor has a unique, valid pointer.
    static size_t rounded_size(size_t nbytes) {
        if (nbytes < kLargeMin) {
            const size_t r = (nbytes + kSmallGranule - 1) / kSmallGranule * kSmallGranule;
            return r == 0 ? kSmallGranule : r;
        }
        return (nbytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
    }

    void* take_cached(size_t rounded) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = cache_.find(rounded);
        if (it == cache_.end()) return nullptr;
        void* ptr = it->second;
        cache_.erase(it);
        return ptr;
    }

    int index_;
    mutable std::mutex mutex_;
    std::multimap<size_t, void*> cache_;  // rounded size -> idle block
    int64_t current_ = 0;
    int64_t peak_ = 0;
    int64_t allocations_ = 0;
};

CudaAllocator& allocator_at(int index) {
    const int count = cuda_device_count();
    NL_REQUIRE(index >= 0 && index < count, "cuda:", index, ": no such CUDA device (",
               count == 0 ? std::string("no usable GPU found") : std::to_string(count) + " GPU(s) found",
               ")");
    // Never destroyed: tensors held by static objects may free their storage during exit.
    static std::mutex mutex;
    static auto* allocators = new std::vector<std::unique_ptr<CudaAllocator>>();
    std::lock_guard<std::mutex> lock(mutex);
    if (allocators->empty()) allocators->resize(static_cast<size_t>(count));
    auto& slot = (*allocators)[static_cast<size_t>(index)];
    if (!slot) slot = std::make_unique<CudaAllocator>(index);
    return *slot;
}

}  // namespace

Allocator& cuda_allocator(int index) { return allocator_at(index); }

void cuda_empty_cache(int index) { allocator_at(index).empty_cache(); }

}  // namespace nl
