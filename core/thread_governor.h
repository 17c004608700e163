// The thread count a training loop uses when the user has not fixed one: the cores that other
// processes leave free. OpenMP's parallel regions end in barriers, so a team of N threads on a
// machine where another process keeps a core busy waits, at every region, for the thread that the
// scheduler put beside it, and a step slows to the pace of the shared core (docs/benchmarks.md has it
// measured). Linux's /proc/stat says how busy all cores were and /proc/self/stat how much of that was
// this process; the difference is the others'.
// Before a window of those ticks has passed, /proc/loadavg's count of running threads, less this
// process's own, says how many other threads are running at that moment.
// Results do not depend on the thread count (every reduction sums in fixed chunks and a fixed
// order), so changing it between steps changes speed, not bits.
#pragma once

#include <chrono>
#include <cstdint>

namespace nl {

class ThreadGovernor {
public:
    // Up to max_threads (OpenMP's count when the program started). enabled = false: a fixed count,
    // update() does nothing. Enabled, it decides at once, from the other processes' threads that are
    // running right now (others_running: the fewest of a few samples a millisecond apart), and sets
    // OpenMP's and OpenBLAS's count before the caller builds anything in parallel.
    ThreadGovernor(int max_threads, bool enabled);

    // Between steps: re-reads the load and sets the thread count to the free cores (at least 1, at
    // most max_threads). Returns the count in force. The first window of /proc/stat's ticks is 50 ms
    // from construction (long enough to see a busy core), the later ones 0.5 s; within a window the
    // last decision stands. Without /proc/loadavg the first call waits the first window out.
    int update();
    int threads() const { return threads_; }
    int max_threads() const { return max_threads_; }
    bool enabled() const { return enabled_; }
    int64_t decisions() const { return decisions_; }  // readings compared so far

    // Cores busy with other processes between two readings, from the two files' contents (exposed
    // for tests). cpu_line: /proc/stat's first line; self_stat: /proc/self/stat. Returns false when
    // either does not parse.
    struct Reading {
        int64_t busy = 0, total = 0, self = 0;  // clock ticks: all cores' busy and total, this process's
    };
    static bool parse(const char* cpu_line, const char* self_stat, Reading& out);
    static double others_busy_cores(const Reading& before, const Reading& after, int cores);
    // The thread count for a number of free cores: floor(free + 0.25), within [1, max_threads], so a
    // core that others keep 80% busy or more is not counted.
    static int threads_for(double free_cores, int max_threads);
    // Other processes' threads running or ready to run now: /proc/loadavg's fourth field ("running/
    // total") less this process's own threads in state R (self_running). -1 when loadavg does not
    // parse. (Exposed for tests.)
    static int others_running(const char* loadavg, int self_running);

private:
    bool read(Reading& out) const;
    int sample_others_running() const;  // the fewest of a few samples; -1 without /proc
    void set_threads(int threads);       // OpenMP's and OpenBLAS's count

    int max_threads_;
    bool enabled_;
    int threads_;
    int cores_;
    bool have_reading_ = false;
    int64_t decisions_ = 0;         // the snapshot's and the windows'
    int64_t window_decisions_ = 0;  // from /proc/stat windows
    Reading last_;
    std::chrono::steady_clock::time_point last_time_;
    std::chrono::milliseconds interval_{500};
    std::chrono::milliseconds first_window_{50};
};

}  // namespace nl
