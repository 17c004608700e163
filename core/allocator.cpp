// The CPU allocator (64-byte aligned, counting current/peak bytes with atomics), the per-device
// allocator registry, and Storage.
#include "core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "core/error.h"
#ifdef NORMLAB_HAVE_CUDA
#include "core/cuda/nl_cuda_api.h"
#endif

namespace nl {

namespace {

constexpr size_t kAlignment = 64;
// Blocks of at least this size are cached after free and reused: the C library returns them to the
// OS (munmap), so without a cache every large temporary would page-fault its memory in again on each
// op. Training a small transformer reuses the same 64-256 KiB temporaries every step, and glibc
// trims and re-faults those too, so the cache starts at 64 KiB.
constexpr size_t kCacheMinBytes = size_t(64) << 10;
constexpr size_t kCacheGranule = size_t(64) << 10;      // cached sizes round up to whole 64 KiB
constexpr size_t kCacheMaxBytes = size_t(2) << 30;      // never keep more than 2 GiB idle
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheEnabled = false;  // let AddressSanitizer see every free
#else
constexpr bool kCacheEnabled = true;
#endif

class CpuAllocator final : public Allocator {
public:
    void* allocate(size_t nbytes) override {
        size_t rounded = rounded_size(nbytes);
        void* ptr = take_cached(rounded);
        if (ptr == nullptr) ptr = std::aligned_alloc(kAlignment, rounded);
        if (ptr == nullptr) {
            empty_cache();  // idle cached blocks may be what stands between us and success
            ptr = std::aligned_alloc(kAlignment, rounded);
        }
        NL_REQUIRE(ptr != nullptr, "allocate: out of CPU memory allocating ", nbytes, " bytes");
        allocations_.fetch_add(1, std::memory_order_relaxed);
        int64_t now = current_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
        // Raise peak to at least `now`; the CAS loop keeps it correct under concurrent allocations.
        int64_t peak = peak_.load();
        while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
        }
        return ptr;
    }

    void deallocate(void* ptr, size_t nbytes) override {
        current_.fetch_sub(static_cast<int64_t>(nbytes));
        size_t rounded = rounded_size(nbytes);
        if (kCacheEnabled && rounded >= kCacheMinBytes) {
            std::lock_guard<std::mutex> lock(cache_mutex_);
            if (cached_bytes_ + rounded <= kCacheMaxBytes) {
                cache_.emplace(rounded, ptr);
                cached_bytes_ += rounded;
                return;
            }
        }
        std::free(ptr);
    }

    // Frees every idle cached block back to the C library.
    void empty_cache() {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        for (auto& entry : cache_) std::free(entry.second);
        cache_.clear();
        cached_bytes_ = 0;
    }

    MemoryStats stats() const override {
        MemoryStats s;
        s.current_bytes = current_.load();
        s.peak_bytes = peak_.load();
        s.allocations = allocations_.load();
        return s;
    }

    void reset_peak() override { peak_.store(current_.load()); }

private:
    // aligned_alloc wants a multiple of the alignment; 0 bytes still gets a unique pointer so an
    // empty tensor is defined. Cached sizes round to whole granules so freed blocks are reusable.
    static size_t rounded_size(size_t nbytes) {
        size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
        if (rounded == 0) rounded = kAlignment;
        if (rounded >= kCacheMinBytes) rounded = (rounded + kCacheGranule - 1) / kCacheGranule * kCacheGranule;
        return rounded;
    }

    // An idle cached block of exactly `rounded` bytes, or null.
    void* take_cached(size_t rounded) {
        if (!kCacheEnabled || rounded < kCacheMinBytes) return nullptr;
        std::lock_guard<std::mutex> lock(cache_mutex_);
        auto it = cache_.find(rounded);
        if (it == cache_.end()) return nullptr;
        void* ptr = it->second;
        cache_.erase(it);
        cached_bytes_ -= rounded;
        return ptr;
    }

    std::mutex cache_mutex_;
    std::multimap<size_t, void*> cache_;  // rounded size -> idle block
    size_t cached_bytes_ = 0;
    std::atomic<int64_t> current_{0};
    std::atomic<int64_t> peak_{0};
    std::atomic<int64_t> allocations_{0};
};

}  // namespace

Allocator& allocator_for(Device device) {
    if (device.is_cpu()) {
        // Never destroyed: tensors in other static objects may free their storage at exit.
        static CpuAllocator* cpu = new CpuAllocator();
        return *cpu;
    }
#ifdef NORMLAB_HAVE_CUDA
    return cuda_allocator(device.index);
#else
    throw Error("allocator_for: normlab was built without CUDA (asked for " + device.str() + ")");
#endif
}

MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }

void reset_peak(Device device) { allocator_for(device).reset_peak(); }

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
    data_ = allocator_for(device).allocate(nbytes);
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void()> release)
    : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {
    NL_CHECK(release_ != nullptr, "borrowed storage needs a release function");
}

Storage::~Storage() {
    if (release_) {
        release_();
    } else if (data_) {
        allocator_for(device_).deallocate(data_, nbytes_);
    }
}

}  // namespace nl
