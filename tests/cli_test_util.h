// Running the built `normlab` program (NORMLAB_BINARY) from tests: in a fresh temporary directory,
// with stdout and stderr captured together and the exit code decoded, plus small file helpers.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "core/cuda/nl_cuda_api.h"
#include "test_util.h"

namespace nl_test {

// GPUs this test run can use: 0 in a build without the CUDA backend.
inline int cuda_devices() {
#ifdef NORMLAB_HAVE_CUDA
    return nl::cuda_device_count();
#else
    return 0;
#endif
}

struct CliRun {
    int status = -1;     // the exit code; -1 when the program did not exit normally
    std::string output;  // stdout and stderr together
};

// A new empty directory /tmp/normlab-<tag>-XXXXXX, removed when the test case passes and kept when
// it fails (a failed test's run directory is worth reading; tests/main.cpp prints its path).
inline std::string make_temp_dir(const std::string& tag) {
    std::string pattern = "/tmp/normlab-" + tag + "-XXXXXX";
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    remove_unless_test_fails(pattern);
    return pattern;
}

// Single-quotes one shell argument.
inline std::string shell_arg(const std::string& text) {
    std::string out = "'";
    for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return out + "'";
}

// Runs the shell command `command` with `dir` as the working directory: its exit code and its
// output (stdout and stderr together).
inline CliRun run_shell_in(const std::string& dir, const std::string& command) {
    const std::string line = "cd " + shell_arg(dir) + " && " + command + " 2>&1";
    CliRun run;
    FILE* pipe = popen(line.c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::array<char, 4096> buffer{};
    size_t n = 0;
    while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) run.output.append(buffer.data(), n);
    const int raw = pclose(pipe);
    run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    return run;
}

// Runs `<env>normlab <args>` with `dir` as the working directory: `env` is shell variable assignments,
// each followed by a space ("OMP_NUM_THREADS=2 "), or empty; args are passed to the shell as is.
inline CliRun run_normlab_env(const std::string& dir, const std::string& env, const std::string& args) {
    return run_shell_in(dir, env + shell_arg(NORMLAB_BINARY) + " " + args);
}

// Runs `normlab <args>` with `dir` as the working directory.
// OpenMP's idle threads wait passively unless the caller chose otherwise: on a shared, oversubscribed
// machine (tests run beside builds) spinning threads made a 2-second run take minutes; these tests
// check results, not speed.
inline CliRun run_normlab_in(const std::string& dir, const std::string& args) {
    const std::string wait_policy = std::getenv("OMP_WAIT_POLICY") ? "" : "OMP_WAIT_POLICY=passive ";
    return run_normlab_env(dir, wait_policy, args);
}

inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

inline bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// `normlab train configs/toy_transformer.json --out run --quiet SETS` in `dir`: for the bad-input tests
// of train's config keys (SETS the --set flags under test).
inline CliRun train_toy_in(const std::string& dir, const std::string& sets) {
    return run_normlab_in(dir, "train '" + std::string(NORMLAB_SOURCE_DIR) + "/configs/toy_transformer.json' --out run "
                               "--quiet " + sets);
}

// A user mistake as the program reports it: exit code 2 and one line on stderr naming each of `parts`,
// and no run directory begun (`dir`/run/config.json absent).
inline void check_one_line_error(const CliRun& r, const std::string& dir, const std::vector<std::string>& parts) {
    INFO(r.output);
    CHECK(r.status == 2);
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
    for (const std::string& part : parts) CHECK_THAT(r.output, Catch::Contains(part));
    CHECK_FALSE(file_exists(dir + "/run/config.json"));
}

// The train_loss column of a run's metrics.csv, one value per logged step.
inline std::vector<double> train_losses(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    REQUIRE(std::getline(in, line));
    std::vector<std::string> header;
    {
        std::stringstream cells(line);
        for (std::string cell; std::getline(cells, cell, ',');) header.push_back(cell);
    }
    const size_t column = static_cast<size_t>(std::find(header.begin(), header.end(), "train_loss") - header.begin());
    REQUIRE(column < header.size());
    std::vector<double> losses;
    while (std::getline(in, line)) {
        std::stringstream cells(line);
        std::string cell;
        for (size_t i = 0; i <= column; ++i) std::getline(cells, cell, ',');
        losses.push_back(std::stod(cell));
    }
    return losses;
}

}  // namespace nl_test
