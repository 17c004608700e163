// Run directories, atomic writes and the metrics CSV (see run_dir.h).
#include "jobs/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include "core/error.h"
#include "jobs/config.h"

namespace fs = std::filesystem;

namespace nl {

void write_file_atomic(const std::string& path, const std::string& content) {
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        NL_REQUIRE(out.good(), path, ": cannot open for writing: ", std::strerror(errno));
        out << content;
        out.close();  // close() flushes: a full disk shows here at the latest
        if (out.fail()) {
            std::remove(tmp.c_str());
            throw Error(path + ": write failed (disk full?)");
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        std::remove(tmp.c_str());
        throw Error(path + ": cannot rename the temporary file into place: " + std::strerror(err));
    }
}

std::string run_gnuplot(const std::string& dir) {
    if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) return "gnuplot not found";
    std::string quoted = "'";  // dir in single quotes for the shell, its own quotes escaped
    for (char ch : dir) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    const std::string command = "cd " + quoted + "' && gnuplot plots.gp >/dev/null 2>&1";
    return std::system(command.c_str()) == 0 ? "" : "gnuplot failed on plots.gp";
}

namespace {

// The lock file inside a run directory: held (flock) by the one process using the directory.
constexpr const char* kLockName = ".lock";

// An flock'ed file descriptor; the kernel drops the lock when the process ends, however it ends.
struct DirLock {
    int fd = -1;
    ~DirLock() {
        if (fd >= 0) ::close(fd);
    }
};

// Temporary files of write_file_atomic and save_safetensors: "<name>.tmp.<pid>".
bool is_temp_file(const std::string& name) {
    static const std::regex pattern(".+\\.tmp\\.[0-9]+");
    return std::regex_match(name, pattern);
}

}  // namespace

void require_resumable(const std::string& out, const nlohmann::json& resolved, const std::string& what,
                       const std::string& flag) {
    const std::string stored = out + "/config.json";
    NL_REQUIRE(std::filesystem::is_regular_file(stored), flag, ": ", out, " holds no ", what, " (no config.json)");
    NL_REQUIRE(load_json_file(stored) == resolved, flag, ": this config differs from ", stored,
               "'s; use the config the ", what, " started with");
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
    if (fs::exists(run.dir_, ec))
        NL_REQUIRE(fs::is_directory(run.dir_, ec), run.dir_, ": exists and is not a directory");
    fs::create_directories(run.dir_, ec);
    NL_REQUIRE(!ec, run.dir_, ": cannot create run directory: ", ec.message());

    // One process per run directory: two runs writing one metrics.csv would interleave their rows.
    // The lock is taken before the directory is judged empty, so of two runs started together the
    // second sees either the lock or the first one's files.
    const std::string lock_path = run.path(kLockName);
    auto lock = std::make_shared<DirLock>();
    lock->fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    NL_REQUIRE(lock->fd >= 0, run.dir_, ": cannot create the lock file ", lock_path, ": ", std::strerror(errno));
    if (::flock(lock->fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        NL_REQUIRE(err != EWOULDBLOCK, run.dir_, ": run directory is in use by another normlab process (",
                   lock_path, " is locked); wait for it to finish or use another --out");
        throw Error(detail::concat(run.dir_, ": cannot lock ", lock_path, ": ", std::strerror(err)));
    }
    run.lock_ = lock;

    bool empty = true;
    for (const auto& entry : fs::directory_iterator(run.dir_, ec))
        if (entry.path().filename() != kLockName) empty = false;
    NL_REQUIRE(empty || force || resume, run.dir_,
               ": run directory already exists and is not empty (use --force to overwrite, "
               "--resume to continue it, or --out for another directory)");

    // Under the lock no other process writes here, so any temporary file is left over from a run
    // that was killed between writing it and renaming it into place.
    for (const std::string& sub : {std::string(), std::string("checkpoints")}) {
        const fs::path where = sub.empty() ? fs::path(run.dir_) : fs::path(run.dir_) / sub;
        std::vector<fs::path> stale;
        for (const auto& entry : fs::directory_iterator(where, ec))
            if (is_temp_file(entry.path().filename().string())) stale.push_back(entry.path());
        for (const fs::path& file : stale) fs::remove(file, ec);
    }
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

bool RunDir::write_error(const std::string& message) const noexcept {
    try {
        std::error_code ec;
        fs::remove(path("summary.json"), ec);
        write_file_atomic(path("error.txt"), message + "\n");
        return true;
    } catch (...) {
        return false;  // the caller reports the original error, which matters more
    }
}

CsvWriter::CsvWriter(const std::string& path, const std::vector<std::string>& header, bool append)
    : path_(path), columns_(header.size()) {
    std::error_code ec;
    bool has_rows = append && fs::exists(path, ec) && fs::file_size(path, ec) > 0;
    out_.open(path, append ? std::ios::app : std::ios::trunc);
    NL_REQUIRE(out_.good(), path, ": cannot open for writing: ", std::strerror(errno));
    if (!has_rows) row(header);
}

void CsvWriter::row(const std::vector<std::string>& cells) {
    NL_CHECK(cells.size() == columns_, "CSV row has ", cells.size(), " cells, header has ", columns_);
    for (size_t i = 0; i < cells.size(); ++i) out_ << (i ? "," : "") << cells[i];
    out_ << "\n";
    out_.flush();
    // A row that did not reach the file fails the run: a metrics.csv missing rows must not sit
    // beside a summary.json. The stream stays failed, so later rows fail too.
    NL_REQUIRE(out_.good(), path_, ": write failed (disk full?)");
}

std::string format_number(double value) {
    if (std::isnan(value)) return "nan";
    if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
    return fmt::format("{:.17g}", value);
}

}  // namespace nl
