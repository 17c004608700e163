// Software prefetch of a block of rows in equal shares, for kernels that know what they read next:
// asked for a share at a time while other work runs, the rows are in cache when a pack reaches them
// (operands come cold from memory in a training step, and a pack that waits on every row's first
// touch runs at memory latency rather than bandwidth).
#pragma once

#include <algorithm>
#include <cstdint>

namespace nl::cpu_prefetch {

// `rows` rows of `row_bytes` bytes each, `ld_bytes` apart from `first`: every 64-byte line of each
// row (its start, then every 64 bytes, and its last byte, which may lie in one more line), asked for
// in `shares` equal shares. The walk keeps a row and a line, no division.
class RowLines {
public:
    RowLines() = default;
    RowLines(const void* first, int64_t ld_bytes, int64_t rows, int64_t row_bytes, int64_t shares)
        : row_(static_cast<const char*>(first)), ld_(ld_bytes), last_(row_bytes - 1),
          per_row_((row_bytes + 63) / 64 + 1), left_(rows * per_row_),
          per_share_(shares > 0 ? (left_ + shares - 1) / shares : left_) {}
    // Asks for the next share of lines (nothing once all are asked for).
    void share() {
        for (int64_t n = std::min(per_share_, left_); n > 0; --n, --left_) {
            __builtin_prefetch(row_ + (line_ + 1 == per_row_ ? last_ : line_ * 64));
            if (++line_ == per_row_) line_ = 0, row_ += ld_;
        }
    }

private:
    const char* row_ = nullptr;  // the row being walked
    int64_t ld_ = 0, last_ = 0, per_row_ = 1, line_ = 0;
    int64_t left_ = 0, per_share_ = 0;  // lines still to ask for; per share() call
};

}  // namespace nl::cpu_prefetch
