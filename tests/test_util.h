// Shared test helpers that need nothing from normlab: a scratch directory that cleans up after itself,
// and run folders kept only when their test case fails.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace nl_test {

// A fresh, empty directory <system temp>/normlab_<name>_<pid>_<n>, removed (with its contents) when
// the test ends. The pid and a per-process counter keep parallel test processes and repeated names
// within one process apart.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& name) {
        static int counter = 0;
        path = std::filesystem::temp_directory_path() /
               ("normlab_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    // The path of `name` inside the directory.
    std::string file(const std::string& name) const { return (path / name).string(); }
    std::string operator/(const std::string& name) const { return file(name); }
};

// Folders the running test case wrote for CLI runs: tests/main.cpp's listener removes them when the
// test case passes and names them, kept for reading, when it fails.
inline std::vector<std::filesystem::path>& run_folders_of_this_test() {
    static std::vector<std::filesystem::path> folders;
    return folders;
}
inline void remove_unless_test_fails(const std::filesystem::path& folder) {
    run_folders_of_this_test().push_back(folder);
}

}  // namespace nl_test
