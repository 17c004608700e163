// The GPU machine's scripts (tests/cuda/device_check.sh, stage_deps.sh) reject bad arguments before
// doing anything: exit code 2 and a message naming what was expected and what was found. (Their real
// work, a build on a GPU machine and apt downloads, is not run here.) And CMake refuses the CUDA
// emulator together with the real CUDA backend.
#include <catch2/catch.hpp>

#include <string>

#include "cli_test_util.h"

namespace {

// Runs the shell command `command` in a fresh temporary folder; its output and exit code.
nl_test::CliRun run_in_temp_dir(const std::string& command_text) {
    return nl_test::run_shell_in(nl_test::make_temp_dir("device-scripts"), command_text);
}

nl_test::CliRun run_script(const std::string& script, const std::string& args) {
    return run_in_temp_dir("bash " + nl_test::shell_arg(std::string(NORMLAB_SOURCE_DIR) + "/tests/cuda/" + script) +
                           " " + args);
}

}  // namespace

TEST_CASE("device_check.sh and stage_deps.sh reject bad arguments with what was expected and found",
          "[device_scripts]") {
    struct Case {
        std::string script, args, message;
    };
    const Case cases[] = {
        {"device_check.sh", "--device gpu out", "--device: expected cuda or cpu, found \"gpu\""},
        {"device_check.sh", "--deps missing.tar.gz out",
         "--deps: expected an archive made by stage_deps.sh, found no file \"missing.tar.gz\""},
        {"device_check.sh", "--frob 1 out", "unknown option \"--frob\" (expected --deps, --device or --work)"},
        {"device_check.sh", "--work", "--work: expected a value, found none"},
        {"device_check.sh", "", "expected OUT_DIR, found no arguments after the options"},
        {"device_check.sh", "--work out/build out", "--work: expected a folder outside OUT_DIR, found \"out/build\""},
        {"stage_deps.sh", "", "expected one argument, the archive to write, found 0"},
    };
    for (const Case& c : cases) {
        INFO(c.script << " " << c.args);
        const nl_test::CliRun run = run_script(c.script, c.args);
        INFO(run.output);
        CHECK(run.status == 2);
        CHECK_THAT(run.output, Catch::Contains(c.message) && Catch::Contains("usage:"));
        CHECK_THAT(run.output, !Catch::Contains("== "));  // no step ran
    }
}

TEST_CASE("cmake refuses NORMLAB_CUDA_EMULATOR=ON together with NORMLAB_CUDA=ON, naming both", "[device_scripts]") {
    const nl_test::CliRun run = run_in_temp_dir("cmake -S " + nl_test::shell_arg(NORMLAB_SOURCE_DIR) +
                                                " -B build -DNORMLAB_CUDA=ON -DNORMLAB_CUDA_EMULATOR=ON");
    INFO(run.output);
    CHECK(run.status != 0);
    CHECK_THAT(run.output, Catch::Contains("NORMLAB_CUDA_EMULATOR=ON excludes NORMLAB_CUDA=ON"));
}
