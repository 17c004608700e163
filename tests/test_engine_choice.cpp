// Gemm engines chosen by measurement (core/cpu/cpu_engine_choice.h): the rule on injected rates (the
// fastest wins, by a margin over the preferred; an engine this CPU lacks never does), the per-machine
// cache (its rates decide, a cache of another machine is measured again, processes that start
// together measure once), `normlab info` naming the choice, its rates and their source, and the
// variables that still force an engine.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/cpu/cpu_engine_choice.h"
#include "core/cpu/cpu_sgemm.h"
#include "core/cpu_runtime.h"

using nlohmann::json;
using nl::EngineRate;

namespace {

// The line of `normlab info` that starts with `label` ("f32 gemm", "bf16 gemm").
std::string info_line(const std::string& output, const std::string& label) {
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);)
        if (line.find(label) != std::string::npos) return line;
    return "";
}

std::vector<std::string> f32_engines() {
    std::vector<std::string> keys = nl::sgemm_kernels_this_cpu_runs();
    keys.push_back("openblas");
    return keys;
}

// A cache entry for this machine with every engine at 1 GFLOP/s but `fastest` at 1000.
json entry(const std::vector<std::string>& engines, const std::string& fastest, const std::string& machine) {
    json rates = json::object();
    for (const std::string& key : engines) rates[key] = key == fastest ? 1000.0 : 1.0;
    return {{"machine", machine}, {"engines", engines}, {"rates", rates}, {"chosen", fastest}};
}

}  // namespace

TEST_CASE("engine choice: the fastest engine this CPU runs wins, by a margin over the preferred one", "[engines]") {
    using Rates = std::vector<EngineRate>;
    CHECK(nl::fastest_engine(Rates{{"avx512", "", 200.0}, {"openblas", "", 150.0}}) == 0);
    CHECK(nl::fastest_engine(Rates{{"avx512", "", 100.0}, {"openblas", "", 150.0}}) == 1);
    // Within the margin (10%) the earlier, preferred engine stays: measurement noise does not flip it.
    CHECK(nl::fastest_engine(Rates{{"avx512", "", 100.0}, {"openblas", "", 109.0}}) == 0);
    CHECK(nl::fastest_engine(Rates{{"avx512", "", 100.0}, {"openblas", "", 111.0}}) == 1);
    // An engine this CPU lacks is never chosen, whatever its rate says.
    CHECK(nl::fastest_engine(Rates{{"amx", "this CPU lacks AMX-BF16", 1e6}, {"avx512bf16", "", 200.0}, {"f32", "", 110.0}}) == 1);
    CHECK(nl::fastest_engine(Rates{{"amx", "", 1000.0}, {"avx512bf16", "", 200.0}, {"f32", "", 110.0}}) == 0);
    REQUIRE_THROWS_WITH(nl::fastest_engine(Rates{{"amx", "this CPU lacks AMX-BF16", 1.0}}),
                        Catch::Contains("no gemm engine runs on this CPU: amx (this CPU lacks AMX-BF16)"));
}

TEST_CASE("engine choice: bf16 attention takes vdpbf16ps where it beats the widened engine by the margin",
          "[engines][attention]") {
    using Rates = std::vector<EngineRate>;
    // A Zen 4 EPYC measured vdpbf16ps at twice the widened engine; near even (or a Sapphire Rapids
    // Xeon's half) keeps attention widened.
    CHECK(nl::engine_beats(Rates{{"amx", "this CPU lacks AMX-BF16"}, {"avx512bf16", "", 201.5}, {"f32", "", 107.4}},
                           "avx512bf16", "f32"));
    CHECK_FALSE(nl::engine_beats(Rates{{"amx", "", 900.0}, {"avx512bf16", "", 110.0}, {"f32", "", 105.0}},
                                 "avx512bf16", "f32"));
    CHECK_FALSE(nl::engine_beats(Rates{{"avx512bf16", "", 109.0}, {"f32", "", 100.0}}, "avx512bf16", "f32"));
    CHECK(nl::engine_beats(Rates{{"avx512bf16", "", 111.0}, {"f32", "", 100.0}}, "avx512bf16", "f32"));
    // An engine this CPU lacks never wins, whatever its rate says.
    CHECK_FALSE(nl::engine_beats(Rates{{"avx512bf16", "this CPU lacks AVX512-BF16", 1e6}, {"f32", "", 100.0}},
                                 "avx512bf16", "f32"));
}

TEST_CASE("engine choice: the cached rates decide, a forced engine wins, and another machine's cache is measured again",
          "[engines][cli]") {
    const std::string dir = nl_test::make_temp_dir("engines");
    const std::string cache = dir + "/engines.json";
    const std::string env = "NORMLAB_ENGINE_CACHE=" + nl_test::shell_arg(cache) + " ";
    const std::vector<std::string> bf16 = nl::bgemm_kernels_this_cpu_runs();
    // Injected rates: OpenBLAS fastest for f32, the widened engine for bf16.
    std::ofstream(cache) << json{{"f32", entry(f32_engines(), "openblas", nl::engine_cache_machine())},
                                 {"bf16", entry(bf16, "f32", nl::engine_cache_machine())}}
                                .dump();
    const nl_test::CliRun cached = nl_test::run_normlab_env(dir, env, "info");
    INFO(cached.output);
    REQUIRE(cached.status == 0);
    const std::string f32_line = info_line(cached.output, "f32 gemm"), bf16_line = info_line(cached.output, "bf16 gemm");
    CHECK_THAT(f32_line, Catch::Contains("openblas (auto: the fastest measured here") &&
                             Catch::Contains("openblas 1000.0 GFLOP/s") && Catch::Contains("measured earlier, kept in " + cache));
    CHECK_THAT(bf16_line, Catch::Contains("bf16 widened to f32") && Catch::Contains("f32 1000.0 GFLOP/s"));

    // The variables force an engine over the cache's choice.
    for (const std::string& kernel : nl::sgemm_kernels_this_cpu_runs()) {
        const nl_test::CliRun forced = nl_test::run_normlab_env(dir, env + "NORMLAB_GEMM=" + kernel + " ", "info");
        CHECK_THAT(info_line(forced.output, "f32 gemm"), Catch::Contains("normlab " + kernel) &&
                                                             Catch::Contains("(NORMLAB_GEMM=" + kernel));
    }
    for (const std::string& engine : bf16) {
        const nl_test::CliRun forced = nl_test::run_normlab_env(dir, env + "NORMLAB_GEMM_BF16=" + engine + " ", "info");
        CHECK_THAT(info_line(forced.output, "bf16 gemm"), Catch::Contains("(NORMLAB_GEMM_BF16=" + engine + ")"));
    }

    // A cache made on another machine (or for other engines) is measured again and rewritten.
    std::ofstream(cache) << json{{"f32", entry(f32_engines(), "openblas", "another CPU | AVX2 | normlab 0.0.1")},
                                 {"bf16", entry({"f32"}, "f32", nl::engine_cache_machine())}}
                                .dump();
    const nl_test::CliRun measured = nl_test::run_normlab_env(dir, env, "info");
    INFO(measured.output);
    CHECK_THAT(info_line(measured.output, "f32 gemm"), Catch::Contains("measured now, kept in " + cache));
    if (bf16 != std::vector<std::string>{"f32"})
        CHECK_THAT(info_line(measured.output, "bf16 gemm"), Catch::Contains("measured now, kept in " + cache));
    const json rewritten = json::parse(nl_test::read_text(cache));
    CHECK(rewritten["f32"]["machine"] == nl::engine_cache_machine());
    CHECK(rewritten["f32"]["engines"] == json(f32_engines()));
    for (const std::string& key : f32_engines()) CHECK(rewritten["f32"]["rates"][key].get<double>() > 0.0);
    CHECK(rewritten["bf16"]["engines"] == json(bf16));

    // A cache that is not JSON (a crash mid-write elsewhere, a hand edit) is measured again, not an error.
    std::ofstream(cache) << "{\"f32\": [1, 2";
    const nl_test::CliRun broken = nl_test::run_normlab_env(dir, env, "info");
    INFO(broken.output);
    CHECK(broken.status == 0);
    CHECK_THAT(info_line(broken.output, "f32 gemm"), Catch::Contains("measured now, kept in " + cache));
    CHECK(json::parse(nl_test::read_text(cache))["f32"]["machine"] == nl::engine_cache_machine());
}

TEST_CASE("engine choice: processes that start together measure once and choose alike", "[engines][cli]") {
    const std::string dir = nl_test::make_temp_dir("engines-together");
    const std::string cache = dir + "/engines.json";
    const std::string info = "NORMLAB_ENGINE_CACHE=" + nl_test::shell_arg(cache) + " OMP_WAIT_POLICY=passive " +
                             nl_test::shell_arg(NORMLAB_BINARY) + " info";
    const nl_test::CliRun both = nl_test::run_shell_in(dir, "(" + info + " > a.txt & " + info + " > b.txt; wait)");
    REQUIRE(both.status == 0);
    const std::string a = nl_test::read_text(dir + "/a.txt"), b = nl_test::read_text(dir + "/b.txt");
    INFO(a << "\n" << b);
    for (const std::string label : {"f32 gemm", "bf16 gemm"}) {
        const std::string line_a = info_line(a, label), line_b = info_line(b, label);
        const int measured = int(line_a.find("measured now") != std::string::npos) +
                             int(line_b.find("measured now") != std::string::npos);
        CHECK(measured == 1);
        // The same engine and the same rates: one measurement, read by the other process.
        CHECK(line_a.substr(0, line_a.find("; measured")) == line_b.substr(0, line_b.find("; measured")));
    }
    // Without a cache every process measures for itself.
    const nl_test::CliRun off = nl_test::run_normlab_env(dir, "NORMLAB_ENGINE_CACHE=off ", "info");
    CHECK_THAT(info_line(off.output, "f32 gemm"), Catch::Contains("measured now; no cache (NORMLAB_ENGINE_CACHE=off)"));
}
