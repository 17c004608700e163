// Run directories, atomic writes, metrics CSV and the progress line (see run_dir.h).
#include "examples/run_dir.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "core/error.h"

namespace fs = std::filesystem;

namespace nl {

void write_file_atomic(const std::string& path, const std::string& content) {
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        NL_REQUIRE(out.good(), path, ": cannot open for writing");
        out << content;
        out.flush();
        if (!out.good()) {
            out.close();
            std::remove(tmp.c_str());
            throw Error(path + ": write failed (disk full?)");
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw Error(path + ": cannot rename the temporary file into place");
    }
}

RunDir RunDir::create(const std::string& config_path, const std::string& out, bool force, bool resume) {
    RunDir run;
    if (!out.empty()) {
        run.dir_ = out;
    } else {
        std::time_t now = std::time(nullptr);
        char stamp[32];
        std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
        run.dir_ = "runs/" + fs::path(config_path).stem().string() + "-" + stamp;
    }
    std::error_code ec;
    if (fs::exists(run.dir_, ec)) {
        NL_REQUIRE(fs::is_directory(run.dir_, ec), run.dir_, ": exists and is not a directory");
        bool empty = fs::is_empty(run.dir_, ec);
        NL_REQUIRE(empty || force || resume, run.dir_,
                   ": run directory already exists and is not empty (use --force to overwrite, "
                   "--resume to continue it, or --out for another directory)");
    }
    fs::create_directories(run.dir_, ec);
    NL_REQUIRE(!ec, run.dir_, ": cannot create run directory: ", ec.message());
    if (!resume) {
        // A forced re-run must not leave the old run's completion mark behind.
        fs::remove(run.path("summary.json"), ec);
        fs::remove(run.path("error.txt"), ec);
    }
    return run;
}

void RunDir::write_json(const std::string& name, const nlohmann::json& value) const {
    write_file_atomic(path(name), value.dump(2) + "\n");
}

void RunDir::write_text(const std::string& name, const std::string& text) const {
    write_file_atomic(path(name), text);
}

void RunDir::write_summary(const nlohmann::json& summary) const {
    std::error_code ec;
    fs::remove(path("error.txt"), ec);
    write_json("summary.json", summary);
}

void RunDir::write_error(const std::string& message) const {
    std::error_code ec;
    fs::remove(path("summary.json"), ec);
    write_file_atomic(path("error.txt"), message + "\n");
}

CsvWriter::CsvWriter(const std::string& path, const std::vector<std::string>& header, bool append)
    : columns_(header.size()) {
    std::error_code ec;
    bool has_rows = append && fs::exists(path, ec) && fs::file_size(path, ec) > 0;
    out_.open(path, append ? std::ios::app : std::ios::trunc);
    NL_REQUIRE(out_.good(), path, ": cannot open for writing");
    if (!has_rows) row(header);
}

void CsvWriter::row(const std::vector<std::string>& cells) {
    NL_CHECK(cells.size() == columns_, "CSV row has ", cells.size(), " cells, header has ", columns_);
    for (size_t i = 0; i < cells.size(); ++i) out_ << (i ? "," : "") << cells[i];
    out_ << "\n";
    out_.flush();
}

std::string format_number(double value) {
    if (std::isnan(value)) return "nan";
    if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
    return fmt::format("{:.17g}", value);
}

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

}  // namespace nl
