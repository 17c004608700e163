// `normlab gradcheck`: checks the analytic backward of every norm (fused and composed; the composed
// forms also to second order) and of every layer and loss against central differences in f64
// (jobs/gradcheck.h), and prints one table row per check with its worst error. Exits 1 when any
// check fails.
#include "examples/cli/commands.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "jobs/gradcheck.h"

namespace nl::cli {

namespace {

struct Options {
    std::string filter;
    bool list = false;
};

void run_gradcheck(const Options& opt) {
    const std::vector<GradcheckCase> selected = list_gradchecks(opt.filter);
    NL_REQUIRE(!selected.empty(), "gradcheck: no check matches --filter '", opt.filter, "'");
    if (opt.list) {
        for (const GradcheckCase& check : selected) fmt::print("{:<18} {:<9} {}\n", check.name, check.form, check.order);
        return;
    }
    fmt::print("{:<18} {:<9} {:<5} {:>13} {:>13}  {}\n", "check", "form", "order", "max abs err", "its rel err",
               "result");
    std::vector<std::string> failures;
    run_gradchecks(opt.filter, [&failures](const GradcheckOutcome& out) {
        const GradcheckCase& check = out.check;
        fmt::print("{:<18} {:<9} {:<5} {:>13.3e} {:>13.3e}  {}\n", check.name, check.form, check.order,
                   out.max_abs_error, out.rel_error_at_max, out.ok ? "ok" : "FAILED");
        std::fflush(stdout);
        if (!out.ok) failures.push_back(check.name + " " + check.form + " " + check.order + ": " + out.message);
    });
    fmt::print("\n{} of {} checks passed (f64 central differences, eps 1e-6; an element passes when "
               "|analytic - numeric| <= atol + rtol |numeric|, 1e-5 and 1e-3 unless a norm's registry entry "
               "says otherwise)\n",
               selected.size() - failures.size(), selected.size());
    for (const std::string& failure : failures) fmt::print("FAILED {}\n", failure);
    if (!failures.empty()) throw CLI::RuntimeError(1);  // exit code 1; main.cpp prints nothing more
}

}  // namespace

void register_gradcheck(CLI::App& app) {
    auto opt = std::make_shared<Options>();
    CLI::App* cmd = app.add_subcommand(
        "gradcheck", "Check every norm's (fused and composed) and layer's backward against f64 central differences");
    cmd->add_option("--filter", opt->filter, "only the checks whose name contains this text");
    cmd->add_flag("--list", opt->list, "list the checks without running them");
    cmd->callback([opt] { run_gradcheck(*opt); });
}

}  // namespace nl::cli
