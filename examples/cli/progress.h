// The normlab program's progress line on stderr: redrawn in place on a terminal, a plain line every
// `log_every` updates (and on the last) otherwise. The jobs report progress through callbacks; this
// is how the program shows it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace nl::cli {

// "step 120/1000 loss 1.2345 | 5.1k tok/s | ETA 0:42" on stderr: redrawn in place on a terminal,
// a plain line every `log_every` updates (and on the last) otherwise; nothing when quiet.
class Progress {
public:
    Progress(int64_t total, bool quiet, int64_t log_every = 10);
    // `fields` is the text after "step N/total "; the rate and ETA are added from elapsed time.
    void update(int64_t step, const std::string& fields);
    void finish();
    double elapsed_seconds() const;

private:
    int64_t total_;
    bool quiet_;
    bool terminal_;
    int64_t log_every_;
    int64_t first_step_ = -1;
    std::chrono::steady_clock::time_point start_;
    bool drew_line_ = false;
};

}  // namespace nl::cli
