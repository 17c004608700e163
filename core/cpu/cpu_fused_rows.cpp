// The streaming-store decision for the fused row kernels (see cpu_fused_rows.h).
#include "core/cpu/cpu_fused_rows.h"

#include <unistd.h>

namespace nl::cpu_rows {

namespace {

// The last-level cache size in bytes, read once; 32 MiB when the system does not say.
int64_t last_level_cache_bytes() {
    static const int64_t bytes = [] {
        const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (l3 > 0) return static_cast<int64_t>(l3);
        const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        return l2 > 0 ? static_cast<int64_t>(l2) : int64_t{32} << 20;
    }();
    return bytes;
}

}  // namespace

bool stream_output(int64_t bytes) { return bytes > last_level_cache_bytes(); }

}  // namespace nl::cpu_rows
