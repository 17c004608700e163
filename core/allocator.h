// Per-device allocators that count current and peak bytes, so peak memory is measurable on every
// backend (the CPU's included), and Storage: bytes owned on one device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/device.h"

namespace nl {

struct MemoryStats {
    int64_t current_bytes = 0;  // bytes held by live Storages now
    int64_t peak_bytes = 0;     // highest current_bytes since start or the last reset_peak
    int64_t allocations = 0;    // number of allocate() calls since start
};

class Allocator {
public:
    virtual ~Allocator() = default;
    virtual void* allocate(size_t nbytes) = 0;  // throws nl::Error when out of memory
    virtual void deallocate(void* ptr, size_t nbytes) = 0;
    virtual MemoryStats stats() const = 0;
    virtual void reset_peak() = 0;
};

// The allocator for a device; throws nl::Error for a CUDA device when built without CUDA.
Allocator& allocator_for(Device device);
MemoryStats memory_stats(Device device);
void reset_peak(Device device);

// Bytes on one device. CPU storage is 64-byte aligned so vector loops and BLAS get aligned rows.
// Borrowed storage is memory another owner holds (a NumPy array, a DLPack producer such as a
// PyTorch tensor): tensors read and write it in place, the allocator neither counts nor frees it,
// and `release` runs once, when the last tensor using it is gone.
class Storage {
public:
    Storage(size_t nbytes, Device device);
    Storage(void* data, size_t nbytes, Device device, std::function<void()> release);  // borrowed
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    void* data() const { return data_; }
    size_t nbytes() const { return nbytes_; }
    Device device() const { return device_; }
    bool borrowed() const { return static_cast<bool>(release_); }

private:
    void* data_ = nullptr;
    size_t nbytes_ = 0;
    Device device_;
    std::function<void()> release_;  // borrowed storage only
};

}  // namespace nl
