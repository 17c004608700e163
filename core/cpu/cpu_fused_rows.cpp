// The streaming-store decision for the fused row kernels (see cpu_fused_rows.h).
#include "core/cpu/cpu_fused_rows.h"

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>

namespace nl::cpu_rows {

namespace {

// Outputs above this many bytes stream; negative: last_level_cache_bytes().
std::atomic<int64_t> stream_threshold_bytes{-1};

}  // namespace

// The size in bytes of one last-level cache (the one this CPU's cores share), read once; 32 MiB when
// the system does not say. Linux's sysfs gives the size of one cache instance; sysconf
// (_SC_LEVEL3_CACHE_SIZE) may instead report the sum over all instances of a socket (384 MiB for twelve
// 32 MiB caches on an AMD EPYC), which would keep outputs that cannot stay in cache from streaming.
int64_t last_level_cache_bytes() {
    static const int64_t bytes = [] {
        int64_t best_level = 0, best_bytes = 0;
        for (int index = 0; index < 16; ++index) {
            const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
            std::ifstream level_file(dir + "level"), size_file(dir + "size"), type_file(dir + "type");
            int64_t level = 0, size = 0;
            std::string type, unit;
            if (!(level_file >> level) || !(size_file >> size) || !(type_file >> type)) continue;
            size_file.clear();
            size_file >> unit;  // "32768K": the number, then its unit
            if (unit == "K") size <<= 10;
            if (unit == "M") size <<= 20;
            if (type != "Instruction" && level > best_level && size > 0) best_level = level, best_bytes = size;
        }
        if (best_bytes > 0) return best_bytes;
        const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (l3 > 0) return static_cast<int64_t>(l3);
        const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        return l2 > 0 ? static_cast<int64_t>(l2) : int64_t{32} << 20;
    }();
    return bytes;
}

bool stream_output(int64_t bytes) {
    const int64_t threshold = stream_threshold_bytes.load(std::memory_order_relaxed);
    return bytes > (threshold < 0 ? last_level_cache_bytes() : threshold);
}

void set_stream_threshold_bytes(int64_t bytes) { stream_threshold_bytes.store(bytes, std::memory_order_relaxed); }

}  // namespace nl::cpu_rows
