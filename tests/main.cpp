// Catch2 entry point for normlab_tests, and the listener that tidies the test cases' run folders.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cstdio>
#include <system_error>

#include "test_util.h"

namespace {

// After each test case: the run folders it made (nl_test::remove_unless_test_fails) are removed if
// it passed, and named on stderr if it failed, so a failure's files stay to read and a passing
// suite leaves nothing behind in /tmp.
struct RunFolderListener : Catch::TestEventListenerBase {
    using TestEventListenerBase::TestEventListenerBase;
    void testCaseEnded(const Catch::TestCaseStats& stats) override {
        const bool passed = stats.totals.assertions.failed == 0 && stats.totals.testCases.failed == 0;
        for (const std::filesystem::path& folder : nl_test::run_folders_of_this_test()) {
            std::error_code ignored;
            if (passed) {
                std::filesystem::remove_all(folder, ignored);
            } else if (std::filesystem::exists(folder, ignored)) {
                std::fprintf(stderr, "kept the failed test's run folder %s\n", folder.c_str());
            }
        }
        nl_test::run_folders_of_this_test().clear();
    }
};

}  // namespace

CATCH_REGISTER_LISTENER(RunFolderListener)
