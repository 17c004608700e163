// Timing helpers shared by the `normlab bench norms` and `bench torch` jobs: interleaved A/B
// sampling (so drift on a shared machine hits both sides alike) and the median/percentile summary.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"

namespace nl::cli {

// One timing series, in seconds per call.
struct Stats {
    double median = 0, min = 0, max = 0, p25 = 0, p75 = 0;
    int64_t samples = 0;
    int64_t calls_per_sample = 1;
    // Half the interquartile range as a percentage of the median: the "+-" printed next to a median.
    double spread_pct() const { return median > 0 ? 50.0 * (p75 - p25) / median : 0.0; }
};

// Median, quartiles (linear interpolation) and extremes of `samples` (seconds per call).
Stats summarize(std::vector<double> samples);

// A distribution-free confidence interval for the median of independent samples (Conover, "Practical
// Nonparametric Statistics", 3rd ed., section 3.2): the rank-th smallest and rank-th largest sample,
// rank the largest whose coverage 1 - 2 P(Binomial(n, 1/2) < rank) is at least `confidence`. Fewer
// than 6 samples cannot reach 95%: then rank is 1 ([min, max]) and coverage says what it reaches.
struct MedianInterval {
    double lo = 0, hi = 0;
    int64_t rank = 0;     // 1-based, from each end of the sorted samples; 0 when there are none
    int64_t samples = 0;
    double coverage = 0;  // the probability that [lo, hi] holds the true median
};
MedianInterval median_interval(std::vector<double> samples, double confidence = 0.95);

// Wall: elapsed time (what a user waits). Cpu: the process's CPU time (all its threads), which leaves
// out the time other processes hold the cores: the steadier measure on a shared, overloaded machine
// when running one thread (with more threads it also counts OpenMP's spin-waiting).
enum class Clock { Wall, Cpu };

// Seconds per call of `fn`, averaged over `calls` back-to-back calls.
double seconds_per_call(const std::function<void()>& fn, int64_t calls, Clock clock = Clock::Wall);

// How many back-to-back calls make one sample last about min_sample_s (at least 1), from one
// timed call (after a warm-up call made by the caller).
int64_t calls_for(const std::function<void()>& fn, double min_sample_s, Clock clock = Clock::Wall);

// Times `a` and `b` interleaved: reps samples each, A B A B ..., each sample averaging its own
// calibrated number of calls. Both are called twice first as warm-up (first-touch page faults,
// thread start-up, caches).
std::pair<Stats, Stats> time_interleaved(const std::function<void()>& a, const std::function<void()>& b,
                                         int64_t reps, double min_sample_s, Clock clock = Clock::Wall);

// "1.5 MiB"-style.
std::string format_bytes(double bytes);

// std::memcpy split across the OpenMP threads in contiguous chunks (one memcpy below 128 KiB):
// the bandwidth ceiling a streaming kernel on the same threads can hope for.
void parallel_copy(void* dst, const void* src, size_t nbytes);

// Waits for `device`'s queued work (a no-op on the CPU, whose calls return when done): every timed GPU
// call ends with it, so a sample measures the kernels, not their launches.
void device_synchronize(Device device);

}  // namespace nl::cli
