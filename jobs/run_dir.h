// A run's output directory and the small pieces every job shares: atomic file writes and a streaming
// metrics CSV.
// A run directory counts as complete only once summary.json exists (written last, atomically); a
// failed run leaves error.txt instead, so nothing half-done looks complete. Every write is checked:
// a row or file that could not be written fails the run. One process at a time uses a run
// directory (an flock on <dir>/.lock, held until the RunDir and its copies are gone).
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nl {

// Writes `content` to path.tmp.<pid> then renames it over `path` (so readers never see half a file).
void write_file_atomic(const std::string& path, const std::string& content);

// Runs `gnuplot plots.gp` in `dir` (the PNGs every job's plots.gp draws): "" when it ran, else why
// not ("gnuplot not found", "gnuplot failed on plots.gp").
std::string run_gnuplot(const std::string& dir);

class RunDir {
public:
    // `out` empty: runs/<config file stem>-<YYYYmmdd-HHMMSS>. An existing non-empty directory is an
    // nl::Error unless `force` (then the files the run writes are replaced; others are kept) or
    // `resume` (the run continues in it). Creates parent directories. Locks the directory (an
    // nl::Error naming it when another process holds the lock), then removes temporary files
    // ("*.tmp.<pid>", here and in checkpoints/) that a killed run left behind.
    static RunDir create(const std::string& config_path, const std::string& out, bool force,
                         bool resume = false);

    const std::string& dir() const { return dir_; }
    std::string path(const std::string& name) const { return dir_ + "/" + name; }
    void write_json(const std::string& name, const nlohmann::json& value) const;
    void write_text(const std::string& name, const std::string& text) const;
    // summary.json, written last: the mark of a complete run (error.txt is removed if present).
    void write_summary(const nlohmann::json& summary) const;
    // error.txt with the message: the mark of a failed run. Never throws: false when even error.txt
    // could not be written (a full disk), so the caller still reports the original error.
    bool write_error(const std::string& message) const noexcept;

private:
    std::string dir_;
    std::shared_ptr<void> lock_;  // the directory's lock, released with the last copy
};

// For --resume: `out` must hold a run of this job (its config.json) and that run's resolved config must
// equal `resolved`; else an nl::Error naming both. `what` names the run ("stability run", "sweep");
// `flag` the option that continues it (a sweep's --shard joins its directory the same way).
void require_resumable(const std::string& out, const nlohmann::json& resolved, const std::string& what,
                       const std::string& flag = "--resume");

// metrics.csv-style streaming writer: a header row, then one row per call, flushed each row so a
// crash loses at most one line.
class CsvWriter {
public:
    CsvWriter() = default;
    // append: keep existing rows (a resumed run); the header is written only to a new/empty file.
    CsvWriter(const std::string& path, const std::vector<std::string>& header, bool append = false);
    void row(const std::vector<std::string>& cells);
    bool is_open() const { return out_.is_open(); }

private:
    std::ofstream out_;
    std::string path_;
    size_t columns_ = 0;
};

// Formats a number for CSV/JSON text with full round-trip precision ("%.9g" for f32 data is not
// enough for f64 runs, so always 17 significant digits).
std::string format_number(double value);

}  // namespace nl
