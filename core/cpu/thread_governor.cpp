// The thread governor (core/cpu/thread_governor.h): /proc/stat and /proc/self/stat, read between steps.
#include "core/cpu/thread_governor.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace nl {

ThreadGovernor::ThreadGovernor(int max_threads, bool enabled)
    : max_threads_(std::max(1, max_threads)), enabled_(enabled), threads_(std::max(1, max_threads)) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    cores_ = online > 0 ? static_cast<int>(online) : max_threads_;
    last_time_ = std::chrono::steady_clock::now();
    if (enabled_) have_reading_ = read(last_);  // the first decision comes after a short first interval
}

bool ThreadGovernor::parse(const char* cpu_line, const char* self_stat, Reading& out) {
    // "cpu  user nice system idle iowait irq softirq steal guest guest_nice"
    long long user, nice, system, idle, iowait, irq, softirq, steal = 0;
    if (std::sscanf(cpu_line, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &user, &nice, &system, &idle, &iowait,
                    &irq, &softirq, &steal) < 7)
        return false;
    // /proc/self/stat: "pid (comm) state ..." with utime and stime the 14th and 15th fields; comm may
    // hold spaces and parentheses, so count from the last ')'.
    const char* close = std::strrchr(self_stat, ')');
    if (close == nullptr) return false;
    std::istringstream rest(close + 1);
    std::string field;
    long long utime = -1, stime = -1;
    for (int index = 3; index <= 15 && (rest >> field); ++index) {  // field 3 is the state
        if (index == 14) utime = std::atoll(field.c_str());
        if (index == 15) stime = std::atoll(field.c_str());
    }
    if (utime < 0 || stime < 0) return false;
    out.busy = user + nice + system + irq + softirq + steal;
    out.total = out.busy + idle + iowait;
    out.self = utime + stime;
    return true;
}

double ThreadGovernor::others_busy_cores(const Reading& before, const Reading& after, int cores) {
    const double total = static_cast<double>(after.total - before.total);
    if (total <= 0) return 0.0;
    const double others = static_cast<double>((after.busy - before.busy) - (after.self - before.self));
    return std::clamp(others / total * cores, 0.0, static_cast<double>(cores));
}

int ThreadGovernor::threads_for(double free_cores, int max_threads) {
    return std::clamp(static_cast<int>(std::floor(free_cores + 0.25)), 1, std::max(1, max_threads));
}

bool ThreadGovernor::read(Reading& out) const {
    std::ifstream stat("/proc/stat"), self("/proc/self/stat");
    std::string cpu_line, self_line;
    if (!std::getline(stat, cpu_line) || !std::getline(self, self_line)) return false;
    return parse(cpu_line.c_str(), self_line.c_str(), out);
}

int ThreadGovernor::update() {
    if (!enabled_) return threads_;
    auto now = std::chrono::steady_clock::now();
    if (decisions_ == 0 && have_reading_ && now - last_time_ < first_window_) {
        // Not put off to a later step: a step on too many threads beside a busy core costs far more
        // than the wait (the header's measurement: 4x for the toy transformer).
        std::this_thread::sleep_for(first_window_ - (now - last_time_));
        now = std::chrono::steady_clock::now();
    }
    if (have_reading_ && decisions_ > 0 && now - last_time_ < interval_) return threads_;
    Reading reading;
    if (!read(reading)) return threads_;  // no /proc: keep what we have
    if (have_reading_) {
        ++decisions_;
        const double free_cores = cores_ - others_busy_cores(last_, reading, cores_);
        const int wanted = threads_for(free_cores, max_threads_);
        if (wanted != threads_) {
            threads_ = wanted;
            omp_set_num_threads(threads_);
            openblas_set_num_threads(threads_);
        }
    }
    last_ = reading;
    last_time_ = now;
    have_reading_ = true;
    return threads_;
}

}  // namespace nl
