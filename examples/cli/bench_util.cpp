// Timing helpers for the bench jobs: interleaved sampling, summaries, a parallel memory copy, a device sync.
#include "examples/cli/bench_util.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>

#include <fmt/core.h>

#ifdef NORMLAB_HAVE_CUDA
#include "core/cuda/nl_cuda_api.h"
#endif

namespace nl::cli {

namespace {

// The q-quantile of sorted values, interpolating linearly between neighbours (numpy's default).
double quantile(const std::vector<double>& sorted, double q) {
    const double pos = q * static_cast<double>(sorted.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, sorted.size() - 1);
    return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

}  // namespace

Stats summarize(std::vector<double> samples) {
    Stats s;
    if (samples.empty()) return s;
    std::sort(samples.begin(), samples.end());
    s.samples = static_cast<int64_t>(samples.size());
    s.min = samples.front();
    s.max = samples.back();
    s.median = quantile(samples, 0.5);
    s.p25 = quantile(samples, 0.25);
    s.p75 = quantile(samples, 0.75);
    return s;
}

MedianInterval median_interval(std::vector<double> samples, double confidence) {
    MedianInterval out;
    if (samples.empty()) return out;
    std::sort(samples.begin(), samples.end());
    const int64_t n = static_cast<int64_t>(samples.size());
    out.samples = n;
    // P(Binomial(n, 1/2) = i), summed from i = 0: the chance that fewer than rank samples fall below
    // the median. In logs, so a long run's 0.5^n does not underflow.
    auto binomial_half = [n](int64_t i) {
        return std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) - n * std::log(2.0));
    };
    double below = 0;  // P(Binomial < rank)
    out.rank = 1;
    out.coverage = 1.0 - 2.0 * binomial_half(0);
    for (int64_t rank = 1; 2 * rank <= n; ++rank) {
        below += binomial_half(rank - 1);
        const double coverage = 1.0 - 2.0 * below;
        if (coverage < confidence) break;
        out.rank = rank;
        out.coverage = coverage;
    }
    out.lo = samples[static_cast<size_t>(out.rank - 1)];
    out.hi = samples[static_cast<size_t>(n - out.rank)];
    return out;
}

namespace {

double now_seconds(Clock clock) {
    if (clock == Clock::Cpu) {
        timespec ts{};
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

double seconds_per_call(const std::function<void()>& fn, int64_t calls, Clock clock) {
    const double start = now_seconds(clock);
    for (int64_t i = 0; i < calls; ++i) fn();
    return (now_seconds(clock) - start) / static_cast<double>(calls);
}

int64_t calls_for(const std::function<void()>& fn, double min_sample_s, Clock clock) {
    const double once = std::max(seconds_per_call(fn, 1, clock), 1e-9);
    return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(min_sample_s / once)));
}

std::pair<Stats, Stats> time_interleaved(const std::function<void()>& a, const std::function<void()>& b,
                                         int64_t reps, double min_sample_s, Clock clock) {
    for (int warm = 0; warm < 2; ++warm) {
        a();
        b();
    }
    const int64_t calls_a = calls_for(a, min_sample_s, clock);
    const int64_t calls_b = calls_for(b, min_sample_s, clock);
    std::vector<double> ta, tb;
    for (int64_t r = 0; r < reps; ++r) {
        ta.push_back(seconds_per_call(a, calls_a, clock));
        tb.push_back(seconds_per_call(b, calls_b, clock));
    }
    std::pair<Stats, Stats> out{summarize(ta), summarize(tb)};
    out.first.calls_per_sample = calls_a;
    out.second.calls_per_sample = calls_b;
    return out;
}

std::string format_bytes(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int unit = 0;
    while (std::fabs(bytes) >= 1024.0 && unit < 4) {
        bytes /= 1024.0;
        ++unit;
    }
    return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[unit]);
}

void parallel_copy(void* dst, const void* src, size_t nbytes) {
    if (nbytes < (size_t{128} << 10)) {
        std::memcpy(dst, src, nbytes);
        return;
    }
#pragma omp parallel
    {
        const size_t threads = static_cast<size_t>(omp_get_num_threads());
        const size_t t = static_cast<size_t>(omp_get_thread_num());
        const size_t chunk = ((nbytes + threads - 1) / threads + 63) / 64 * 64;  // cache-line multiples
        const size_t begin = std::min(nbytes, t * chunk);
        const size_t end = std::min(nbytes, begin + chunk);
        std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin);
    }
}

void device_synchronize(Device device) {
#ifdef NORMLAB_HAVE_CUDA
    if (device.is_cuda()) cuda_synchronize(device.index);
#else
    (void)device;
#endif
}

}  // namespace nl::cli
