// The progress line (progress.h).
#include "examples/cli/progress.h"

#include <unistd.h>

#include <cmath>
#include <iostream>

#include <fmt/format.h>

namespace nl::cli {

Progress::Progress(int64_t total, bool quiet, int64_t log_every)
    : total_(total), quiet_(quiet), terminal_(::isatty(STDERR_FILENO) != 0),
      log_every_(log_every < 1 ? 1 : log_every), start_(std::chrono::steady_clock::now()) {}

double Progress::elapsed_seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

static std::string format_duration(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) return "?";
    int64_t s = static_cast<int64_t>(seconds + 0.5);
    return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                     : fmt::format("{}:{:02}", s / 60, s % 60);
}

void Progress::update(int64_t step, const std::string& fields) {
    if (quiet_) return;
    if (first_step_ < 0) first_step_ = step - 1;
    bool last = step >= total_;
    if (!terminal_ && !last && step % log_every_ != 0) return;
    double elapsed = elapsed_seconds();
    double done = static_cast<double>(step - first_step_);
    double eta = done > 0 ? elapsed / done * static_cast<double>(total_ - step) : NAN;
    std::string line = fmt::format("step {}/{} {} | ETA {}", step, total_, fields, format_duration(eta));
    if (terminal_) {
        std::cerr << "\r\033[K" << line << std::flush;
        drew_line_ = true;
    } else {
        std::cerr << line << "\n";
    }
}

void Progress::finish() {
    if (drew_line_) std::cerr << "\n";
    drew_line_ = false;
}

}  // namespace nl::cli
