// A profiler users can read: when enabled, every backend kernel call (matmul, add, rms_norm, adam,
// copy, ...) is timed and counted per op kind and per phase of the step (forward, backward,
// optimizer), with the FLOPs (matmuls) or bytes moved (memory-bound kernels) it implies, and
// summarized as a table like torch.profiler's key_averages(). Time spent outside kernels (graph
// building, allocation, shape checks) shows as the gap between the kernels' total and the measured
// step time.
//
// Cost when off: one branch on a global in backend_for (core/backend.cpp). When on,
// backend_for hands out a wrapper backend that reads the clock around each call (and on a GPU
// synchronizes after it, so the time is the kernel's, not its launch). Meant for one thread driving
// the kernels (the train loop); the kernels' own OpenMP threads are inside the timed call.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nl {

class Backend;

namespace profiler {

enum class Phase { Forward, Backward, Optimizer, Other };
const char* phase_name(Phase phase);  // "forward", "backward", "optimizer", "other"

// Read on every kernel dispatch; change it only through set_enabled.
extern bool g_enabled;
inline bool enabled() { return g_enabled; }
void set_enabled(bool on);
void reset();  // forget everything collected

// Enables the profiler for a scope (e.g. one train step), restoring the previous setting after.
class EnableGuard {
public:
    // Writes the flag only when it changes, so threads that all run unprofiled (a sweep's) share it
    // without a data race.
    explicit EnableGuard(bool on) : previous_(g_enabled) {
        if (on != previous_) set_enabled(on);
    }
    ~EnableGuard() {
        if (g_enabled != previous_) set_enabled(previous_);
    }
    EnableGuard(const EnableGuard&) = delete;
    EnableGuard& operator=(const EnableGuard&) = delete;

private:
    bool previous_;
};

// The phase kernels are counted under until the guard ends (the engine sets Backward; train sets
// Forward and Optimizer).
Phase current_phase();
class PhaseGuard {
public:
    explicit PhaseGuard(Phase phase);
    ~PhaseGuard();
    PhaseGuard(const PhaseGuard&) = delete;
    PhaseGuard& operator=(const PhaseGuard&) = delete;

private:
    Phase previous_;
};

// One row: an op kind in a phase.
struct OpStats {
    std::string kind;  // "matmul", "add", "rms_norm", "rms_norm_backward", "adam", "copy", ...
    Phase phase = Phase::Other;
    int64_t calls = 0;
    double seconds = 0.0;
    double flops = 0.0;  // floating-point operations, for matmuls (2 m n k per product); else 0
    double bytes = 0.0;  // bytes read + written, for memory-bound kernels (broadcast operands
                         // counted in full); else 0
};

// What has been collected, the slowest row first.
std::vector<OpStats> collected();
// Calls per kernel of the kernel table (core/kernels.def) since the last reset, in the table's order,
// 0 for a kernel not called: which kernels a workload reaches.
std::vector<std::pair<std::string, int64_t>> kernel_calls();

// The table (fixed-width text) and the same rows as CSV. `measured_seconds` is the time the caller
// measured over `steps` steps (the denominator of "% of step"); the table also shows the kernels'
// total per phase and the time outside kernels.
std::string format_table(const std::vector<OpStats>& rows, double measured_seconds, int64_t steps);
std::string format_csv(const std::vector<OpStats>& rows, double measured_seconds, int64_t steps);

// The timing wrapper around `inner` (one per backend, kept for the process's life).
Backend& profiled(Backend& inner);

}  // namespace profiler
}  // namespace nl
