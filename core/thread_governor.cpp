// The thread governor (core/thread_governor.h): /proc/stat and /proc/self/stat, read between steps,
// and /proc/loadavg with this process's /proc/self/task/*/stat for a first decision without a wait.
#include "core/thread_governor.h"

#include <cblas.h>
#include <dirent.h>
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
    if (!enabled_) return;
    // Decided here, before the caller's first parallel region: a team of max_threads built beside a
    // busy core (the model's initialization, say) leaves a worker thread behind for the whole run,
    // and the steps after it run slower than in a process started on one thread. The window of ticks
    // that update() reads next starts now.
    last_time_ = std::chrono::steady_clock::now();
    have_reading_ = read(last_);
    const int others = sample_others_running();
    if (others >= 0) {
        ++decisions_;
        set_threads(threads_for(static_cast<double>(cores_ - others), max_threads_));
    }
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

int ThreadGovernor::others_running(const char* loadavg, int self_running) {
    double one, five, fifteen;
    long long running = 0, total = 0;
    if (std::sscanf(loadavg, "%lf %lf %lf %lld/%lld", &one, &five, &fifteen, &running, &total) != 5) return -1;
    return static_cast<int>(std::max<long long>(0, running - self_running));
}

namespace {

// This process's threads in state R now: the third field of each /proc/self/task/<tid>/stat (after
// the command's closing parenthesis). -1 when the directory cannot be read.
int self_running_threads() {
    DIR* dir = opendir("/proc/self/task");
    if (dir == nullptr) return -1;
    int running = 0;
    while (const dirent* entry = readdir(dir)) {
        if (entry->d_name[0] == '.') continue;
        std::ifstream stat(std::string("/proc/self/task/") + entry->d_name + "/stat");
        std::string line;
        if (!std::getline(stat, line)) continue;  // the thread ended meanwhile
        const size_t close = line.rfind(')');
        if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'R') ++running;
    }
    closedir(dir);
    return running;
}

}  // namespace

int ThreadGovernor::sample_others_running() const {
    // The fewest over a few samples: a task that wakes for a moment (a shell, a daemon) is not a
    // busy core; a busy loop is running in every sample.
    int fewest = -1;
    for (int sample = 0; sample < 4; ++sample) {
        if (sample > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::ifstream file("/proc/loadavg");
        std::string line;
        const int self = self_running_threads();
        if (!std::getline(file, line) || self < 0) return -1;
        const int others = others_running(line.c_str(), self);
        if (others < 0) return -1;
        fewest = fewest < 0 ? others : std::min(fewest, others);
    }
    return fewest;
}

bool ThreadGovernor::read(Reading& out) const {
    std::ifstream stat("/proc/stat"), self("/proc/self/stat");
    std::string cpu_line, self_line;
    if (!std::getline(stat, cpu_line) || !std::getline(self, self_line)) return false;
    return parse(cpu_line.c_str(), self_line.c_str(), out);
}

void ThreadGovernor::set_threads(int threads) {
    if (threads == threads_) return;
    threads_ = threads;
    omp_set_num_threads(threads_);
    openblas_set_num_threads(threads_);
}

int ThreadGovernor::update() {
    if (!enabled_) return threads_;
    auto now = std::chrono::steady_clock::now();
    // The first window is short: 50 ms of /proc's 10 ms ticks already show a busy core, and the
    // snapshot the constructor decided from can have caught a task that ran for a moment.
    const auto window = window_decisions_ == 0 ? first_window_ : interval_;
    if (have_reading_ && now - last_time_ < window) {
        if (decisions_ > 0) return threads_;  // the last decision stands until its window has passed
        // No snapshot (no /proc/loadavg): wait the first window out rather than run a step on a guess.
        std::this_thread::sleep_for(first_window_ - (now - last_time_));
        now = std::chrono::steady_clock::now();
    }
    Reading reading;
    if (!read(reading)) return threads_;  // no /proc: keep what we have
    if (have_reading_) {
        ++decisions_;
        ++window_decisions_;
        const double free_cores = cores_ - others_busy_cores(last_, reading, cores_);
        set_threads(threads_for(free_cores, max_threads_));
    }
    last_ = reading;
    last_time_ = now;
    have_reading_ = true;
    return threads_;
}

}  // namespace nl
