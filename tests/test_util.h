// Shared test helpers that need nothing from normlab: a scratch directory that cleans up after itself.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

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

}  // namespace nl_test
