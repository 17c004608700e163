// `normlab bench norms --quick` and `normlab bench torch --quick --skip-torch` run end to end, print
// their tables and write the CSV (no timing assertions: a shared CI machine's timings mean nothing);
// bench norms' "dtypes" key (bf16 counted at 2 bytes per element) and bench torch's --device (a GPU
// this machine lacks is a one-line error, exit code 2). Runs the built binary (NORMLAB_BINARY).
#include <catch2/catch.hpp>

#include <sched.h>

#include <cstdlib>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "core/cpu_runtime.h"
#ifdef NORMLAB_HAVE_CUDA
#endif

namespace {

using BenchRun = nl_test::CliRun;
using nl_test::cuda_devices;
using nl_test::read_text;

std::vector<std::string> split(const std::string& text, char sep) {
    std::vector<std::string> parts;
    std::stringstream in(text);
    std::string part;
    while (std::getline(in, part, sep)) parts.push_back(part);
    return parts;
}

// The CSV's data rows as column name -> value.
std::vector<std::map<std::string, std::string>> csv_rows(const std::string& csv) {
    const std::vector<std::string> lines = split(csv, '\n');
    REQUIRE(!lines.empty());
    const std::vector<std::string> header = split(lines[0], ',');
    std::vector<std::map<std::string, std::string>> rows;
    for (size_t i = 1; i < lines.size(); ++i) {
        const std::vector<std::string> cells = split(lines[i], ',');
        REQUIRE(cells.size() == header.size());
        std::map<std::string, std::string> row;
        for (size_t j = 0; j < header.size(); ++j) row[header[j]] = cells[j];
        rows.push_back(row);
    }
    return rows;
}

// From the source tree (the default config path is relative to it), on two threads.
BenchRun run_bench(const std::string& args) {
    return nl_test::run_normlab_env(NORMLAB_SOURCE_DIR, "OMP_NUM_THREADS=2 ", args);
}

std::filesystem::path fresh_dir(const std::string& name) {
    auto dir = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    nl_test::remove_unless_test_fails(dir);
    return dir;
}

}  // namespace

TEST_CASE("bench norms --quick prints the tables and writes the CSV", "[bench_cli]") {
    const auto dir = fresh_dir("normlab-bench-norms");
    BenchRun run = run_bench("bench norms configs/bench_norms.json --quick --out '" + dir.string() + "'");
    INFO(run.output);
    REQUIRE(run.status == 0);
    for (const char* part : {"forward (8 B/element", "forward+backward (20 B/element", "RMSNorm time / LayerNorm time",
                             "geomean seed", "memory per call", "32x128", "4096x512", "layernorm", "rmsnorm",
                             "kernel", "composed", "x copy"})
        CHECK_THAT(run.output, Catch::Contains(part));

    const std::string csv = read_text(dir / "bench_norms.csv");
    CHECK_THAT(csv, Catch::StartsWith("group,rows,hidden,norm,impl,pass,"));
    // 3 shapes x 2 norms x 4 impls x 2 passes, plus the header.
    CHECK(std::count(csv.begin(), csv.end(), '\n') == 3 * 2 * 4 * 2 + 1);
    CHECK_THAT(csv, Catch::Contains("large,4096,512,rmsnorm,fused,fwd+bwd,f32,3,1,"));

    // The CSV is not overwritten without --force.
    BenchRun again = run_bench("bench norms --quick --out '" + dir.string() + "'");
    CHECK(again.status == 2);
    CHECK_THAT(again.output, Catch::Contains("exists (pass --force"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("bench norms rejects a bad config key or value with the JSON path", "[bench_cli]") {
    BenchRun typo = run_bench("bench norms --quick --set rep=3 --csv /dev/null --force");
    CHECK(typo.status == 2);
    CHECK_THAT(typo.output, Catch::Contains("/rep: unknown key") && Catch::Contains("reps"));
    BenchRun shape = run_bench("bench norms --quick --set 'large_shapes=[\"32768by512\"]' --csv /dev/null --force");
    CHECK(shape.status == 2);
    CHECK_THAT(shape.output, Catch::Contains("/large_shapes") && Catch::Contains("32768by512"));
}

TEST_CASE("bench torch --quick --skip-torch times normlab and says why PyTorch was skipped", "[bench_cli]") {
    BenchRun run = run_bench("bench torch --quick --skip-torch");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::Contains("stability layernorm s/epoch"));
    CHECK_THAT(run.output, Catch::Contains("transformer tokens/s"));
    CHECK_THAT(run.output, Catch::Contains("PyTorch side skipped: --skip-torch was given"));
    CHECK_THAT(run.output, Catch::Contains("model FLOP/s: ") && Catch::Contains("x OpenBLAS sgemm at the model's GEMM shapes"));
    if (nl::sgemm_engine_is_native())  // normlab's engine runs f32 gemms here (measured fastest, or asked for)
        CHECK_THAT(run.output, Catch::Contains("normlab's own gemm engine (normlab "));
    CHECK_THAT(run.output, Catch::Contains("peak memory per training step (normlab's allocator): fused attention"));
}

namespace {
// A stand-in for python3 with torch, written into dir: `-c 'import torch'` succeeds, and running the
// script runs the shell lines `first`, then prints `json` as torch_bench.py --json would. Returns its path.
std::string fake_python(const std::filesystem::path& dir, const std::string& json, const std::string& first = "") {
    std::filesystem::create_directories(dir);
    const std::filesystem::path path = dir / "python";
    {
        std::ofstream out(path);
        out << "#!/bin/sh\nif [ \"$1\" = \"-c\" ]; then exit 0; fi\n" << first << "echo '" << json << "'\n";
    }
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    return path.string();
}

// The JSON's stability rows, then its transformer keys.
std::string torch_json(const std::string& transformer_keys) {
    return R"({"torch_version": "0.0-stub", "threads": 2, "python": "3", "device": "cpu", "stability": )"
           R"({"layernorm": {"median_s": 0.004}, "rmsnorm": {"median_s": 0.005}})" +
           transformer_keys + "}";
}

// The line of `output` that starts with `start` (empty if none).
std::string line_starting(const std::string& output, const std::string& start) {
    for (const std::string& line : split(output, '\n'))
        if (line.rfind(start, 0) == 0) return line;
    return "";
}
}  // namespace

TEST_CASE("bench torch sets normlab beside the faster of PyTorch's two attentions, each also on its own row",
          "[bench_cli]") {
    // configs/toy_transformer.json under --quick: 1,024 tokens a step, so 0.2 s a step is 5,120 tokens/s.
    const auto dir = fresh_dir("normlab-bench-fake-torch");
    const std::string both = fake_python(dir / "both", torch_json(R"(, "transformer": {"median_s": 0.4}, )"
                                                                  R"("transformer_sdpa": {"median_s": 0.2})"));
    BenchRun run = run_bench("bench torch --quick --python '" + both + "'");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(line_starting(run.output, "transformer tokens/s"), Catch::Contains("5120 tok/s [5120, 5120]"));
    CHECK_THAT(line_starting(run.output, "  PyTorch, matmul + softmax"), Catch::Contains("2560 tok/s [2560, 2560]"));
    CHECK_THAT(line_starting(run.output, "  PyTorch, SDPA"), Catch::Contains("5120 tok/s [5120, 5120]"));
    CHECK_THAT(run.output, Catch::Contains("the faster of its two attentions"));

    // When LLaMA's attention is the faster (bf16 on some CPUs), the row follows it.
    const std::string llama_faster = fake_python(dir / "llama", torch_json(R"(, "transformer": {"median_s": 0.1}, )"
                                                                           R"("transformer_sdpa": {"median_s": 0.2})"));
    run = run_bench("bench torch --quick --python '" + llama_faster + "'");
    REQUIRE(run.status == 0);
    CHECK_THAT(line_starting(run.output, "transformer tokens/s"), Catch::Contains("10240 tok/s [10240, 10240]"));

    // A script that times one attention only gives that row alone.
    const std::string one = fake_python(dir / "one", torch_json(R"(, "transformer": {"median_s": 0.4})"));
    run = run_bench("bench torch --quick --python '" + one + "'");
    REQUIRE(run.status == 0);
    CHECK_THAT(line_starting(run.output, "transformer tokens/s"), Catch::Contains("2560 tok/s [2560, 2560]"));
    CHECK(line_starting(run.output, "  PyTorch, SDPA").empty());

    // None: one line naming the keys it looked for, exit code 2.
    const std::string none = fake_python(dir / "none", torch_json(""));
    run = run_bench("bench torch --quick --python '" + none + "'");
    CHECK(run.status == 2);
    CHECK_THAT(run.output, Catch::Contains("reported no transformer timing (expected JSON key transformer or "
                                           "transformer_sdpa)"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("bench torch holds a distribution-free 95% interval of the rounds' median ratio against --target",
          "[bench_cli]") {
    // PyTorch's stand-in takes a fixed time a step; normlab's own steps vary from round to round, so
    // the ratios differ, and the interval is read back from the sorted ratios the bench prints.
    const auto dir = fresh_dir("normlab-bench-torch-interval");
    const std::string args = " --epochs 2 --steps 2 --warmup 1";
    auto sorted_ratios = [](const std::string& output) {
        const std::string prefix = "transformer ours/theirs per round, sorted:";
        const std::string line = line_starting(output, prefix);
        std::vector<std::string> values;
        for (const std::string& v : split(line.substr(std::min(line.size(), prefix.size())), ' '))
            if (!v.empty()) values.push_back(v);
        return values;
    };
    // 9 rounds: the 2nd and 8th of the sorted ratios, 1 - 2 (1 + 9) / 2^9 = 96.1% (Binomial(9, 1/2)).
    // PyTorch a microsecond a step: normlab is slower, the interval below --target 1.
    const std::string fast = fake_python(dir / "fast", torch_json(R"(, "transformer": {"median_s": 0.000001})"));
    BenchRun run = run_bench("bench torch --rounds 9 --target 1 --python '" + fast + "'" + args);
    INFO(run.output);
    REQUIRE(run.status == 0);
    std::vector<std::string> v = sorted_ratios(run.output);
    REQUIRE(v.size() == 9);
    CHECK_THAT(run.output, Catch::Contains("95% interval for the median [" + v[1] + ", " + v[7] +
                                           "]: rounds 2 and 8 of 9 sorted (96.1%, distribution-free"));
    CHECK_THAT(run.output, Catch::Contains("against --target 1.00: below it, the whole interval"));

    // 6 rounds: [min, max] at 1 - 2 / 2^6 = 96.9%; PyTorch 1,000 s a step: above --target 2.5.
    const std::string slow = fake_python(dir / "slow", torch_json(R"(, "transformer": {"median_s": 1000})"));
    run = run_bench("bench torch --rounds 6 --target 2.5 --python '" + slow + "'" + args);
    REQUIRE(run.status == 0);
    v = sorted_ratios(run.output);
    REQUIRE(v.size() == 6);
    CHECK_THAT(run.output, Catch::Contains("[" + v[0] + ", " + v[5] + "]: rounds 1 and 6 of 6 sorted (96.9%"));
    CHECK_THAT(run.output, Catch::Contains("against --target 2.50: above it, the whole interval"));

    // 5 rounds cannot reach 95% (1 - 2 / 2^5 = 93.8%): no verdict, however far the ratios are from it.
    run = run_bench("bench torch --rounds 5 --python '" + slow + "'" + args);
    REQUIRE(run.status == 0);
    v = sorted_ratios(run.output);
    REQUIRE(v.size() == 5);
    CHECK_THAT(run.output, Catch::Contains("[min, max] = [" + v[0] + ", " + v[4] + "] holds the true median with "
                                           "93.8% only: 6 rounds or more give a 95% interval; against --target "
                                           "1.00: not decided"));

    // --skip-torch has no ratios to summarize; a target of 0 is refused before any work.
    run = run_bench("bench torch --quick --skip-torch");
    CHECK_THAT(run.output, !Catch::Contains("per round, sorted"));
    run = run_bench("bench torch --skip-torch --target 0");
    CHECK(run.status == 2);
    CHECK_THAT(run.output, Catch::Contains("--target must be a ratio above 0, found 0"));
    CHECK_THAT(run.output, !Catch::Contains("timing normlab"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("bench torch runs PyTorch with the user's environment, not the settings normlab made for itself",
          "[bench_cli]") {
    // normlab restarts itself with GOMP_SPINCOUNT=10000 where the user set no wait policy
    // (examples/cli/main.cpp); PyTorch's libgomp must see what the user gave, as PyTorch's users get.
    const auto dir = fresh_dir("normlab-bench-torch-env");
    const std::string seen = (dir / "seen.txt").string();
    const std::string python = fake_python(
        dir, torch_json(R"(, "transformer": {"median_s": 0.4})"),
        "echo \"GOMP_SPINCOUNT=${GOMP_SPINCOUNT-unset} NORMLAB_SET_SPINCOUNT=${NORMLAB_SET_SPINCOUNT-unset}\" > '" +
            seen + "'\n");
    const std::string bench = "bench torch --quick --python '" + python + "'";
    nl_test::CliRun run = nl_test::run_normlab_env(NORMLAB_SOURCE_DIR, "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT ", bench);
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK(nl_test::read_text(seen) == "GOMP_SPINCOUNT=unset NORMLAB_SET_SPINCOUNT=unset\n");
    CHECK_THAT(run.output, Catch::Contains("idle OpenMP threads: normlab GOMP_SPINCOUNT=10000, set by normlab; "
                                           "PyTorch the runtime's default wait policy"));
    run = nl_test::run_normlab_env(NORMLAB_SOURCE_DIR, "env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=123 ", bench);
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK(nl_test::read_text(seen) == "GOMP_SPINCOUNT=123 NORMLAB_SET_SPINCOUNT=unset\n");
    CHECK_THAT(run.output, Catch::Contains("idle OpenMP threads: normlab GOMP_SPINCOUNT=123; PyTorch GOMP_SPINCOUNT=123"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("bench torch runs PyTorch on the CPUs normlab was given, also where OMP_PROC_BIND binds normlab's thread",
          "[bench_cli]") {
    // With OMP_PROC_BIND set, normlab's OpenMP runtime binds its main thread to one CPU, and a child
    // started from that thread would inherit the one-CPU mask: PyTorch's threads would share one CPU.
    cpu_set_t mine;
    CPU_ZERO(&mine);
    REQUIRE(sched_getaffinity(0, sizeof(mine), &mine) == 0);
    const int cpus = CPU_COUNT(&mine);
    const auto dir = fresh_dir("normlab-bench-torch-cpus");
    const std::string seen = (dir / "seen.txt").string();
    const std::string python =
        fake_python(dir, torch_json(R"(, "transformer": {"median_s": 0.4})"), "nproc > '" + seen + "'\n");
    for (const char* bind : {"", "OMP_PROC_BIND=true ", "OMP_PROC_BIND=close OMP_PLACES=cores "}) {
        INFO("environment: " << bind);
        const nl_test::CliRun run = nl_test::run_normlab_env(NORMLAB_SOURCE_DIR, std::string("env ") + bind,
                                                             "bench torch --quick --python '" + python + "'");
        INFO(run.output);
        REQUIRE(run.status == 0);
        CHECK(nl_test::read_text(seen) == std::to_string(cpus) + "\n");
    }
    std::filesystem::remove_all(dir);
}

TEST_CASE("bench torch --autocast bf16 trains both sides under autocast and times the bf16 GEMM engines",
          "[bench_cli]") {
    BenchRun run = run_bench("bench torch --quick --skip-torch --autocast bf16");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::Contains("bf16 autocast on both sides"));
    CHECK_THAT(run.output, Catch::Contains("transformer tokens/s"));
    CHECK_THAT(run.output, Catch::Contains("bf16 GEMMs at the same shapes") && Catch::Contains("normlab bf16 engine f32 "));
    // An engine on a bf16 instruction is set beside that instruction's register-loop peak.
    for (const std::string& engine : nl::bgemm_kernels_this_cpu_runs()) {
        if (engine == "avx512bf16")
            CHECK_THAT(run.output, Catch::Contains("vdpbf16ps peak: ") && Catch::Contains("the avx512bf16 engine runs at "));
        if (engine == "amx") CHECK_THAT(run.output, Catch::Contains("AMX peak: ") && Catch::Contains("the amx engine runs at "));
    }
    BenchRun bad = run_bench("bench torch --quick --skip-torch --autocast f16");
    CHECK(bad.status == 2);
    CHECK_THAT(bad.output, Catch::Contains("--autocast"));
}

TEST_CASE("bench torch --load alternates the default and 1 thread beside a busy loop, one ratio per round",
          "[bench_cli]") {
    BenchRun run = run_bench("bench torch --skip-torch --load --rounds 2 --epochs 2 --steps 2 --warmup 1");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::Contains("under load (a busy loop on one core), transformer tokens/s, medians over 2 "
                                           "rounds that alternate which setting goes first"));
    CHECK_THAT(run.output, Catch::Contains("under load, round 2/2"));
    const size_t at = run.output.find("  normlab, default threads (");
    REQUIRE(at != std::string::npos);
    const std::string line = run.output.substr(at, run.output.find('\n', at) - at);
    CHECK_THAT(line, Catch::Matches("  normlab, default threads \\([0-9]+ at the end\\): [0-9]+ tok/s    normlab, 1 "
                                    "thread: [0-9]+ tok/s    default / 1 thread: [0-9.]+ \\[[0-9.]+, [0-9.]+\\]"));
    CHECK_THAT(run.output, !Catch::Contains("PyTorch, default threads"));  // --skip-torch
}

TEST_CASE("bench torch --set changes the model, and fused attention needs less memory than composed at T 128",
          "[bench_cli]") {
    BenchRun run = run_bench("bench torch --quick --skip-torch --config configs/char_text.json --set model.n_layers=1 "
                             "--set data.seq_len=128 --set train.batch_size=2");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::Contains("1 layers") && Catch::Contains("batch 2 x seq 128"));
    const std::string marker = "fused attention ";
    const size_t at = run.output.find(marker);
    REQUIRE(at != std::string::npos);
    const double fused = std::stod(run.output.substr(at + marker.size()));
    const size_t composed_at = run.output.find("composed attention ", at);
    REQUIRE(composed_at != std::string::npos);
    const double composed = std::stod(run.output.substr(composed_at + std::string("composed attention ").size()));
    CHECK(fused < composed);
    BenchRun bad = run_bench("bench torch --quick --skip-torch --set model.dimm=3");
    CHECK(bad.status == 2);
    CHECK_THAT(bad.output, Catch::Contains("model.dimm") || Catch::Contains("/model/dimm"));
}

TEST_CASE("bench torch rejects a zero --rounds or --steps before any work", "[bench_cli]") {
    BenchRun rounds = run_bench("bench torch --rounds 0 --skip-torch");
    INFO(rounds.output);
    CHECK(rounds.status == 2);
    CHECK_THAT(rounds.output, Catch::Contains("--rounds must be at least 1") && Catch::Contains("found 100, 30, 0, 3"));
    CHECK_THAT(rounds.output, !Catch::Contains("timing normlab"));
    BenchRun steps = run_bench("bench torch --steps 0 --skip-torch");
    CHECK(steps.status == 2);
    CHECK_THAT(steps.output, Catch::Contains("found 100, 0, 3, 3"));
}

TEST_CASE("bench norms runs every case in each of its dtypes, counting bytes by element size", "[bench_cli]") {
    const auto dir = fresh_dir("normlab-bench-dtypes");
    BenchRun run = run_bench("bench norms --quick --set 'dtypes=[\"f32\",\"bf16\"]' --out '" + dir.string() + "'");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::Contains("normlab bench norms: f32, bf16 on cpu"));
    for (const char* part : {"forward (8 B/element moved by a fused kernel), f32",
                             "forward+backward (20 B/element moved by a fused kernel), f32",
                             "forward (4 B/element moved by a fused kernel), bf16",
                             "forward+backward (10 B/element moved by a fused kernel), bf16",
                             "RMSNorm time / LayerNorm time, f32", "RMSNorm time / LayerNorm time, bf16",
                             "memory per call, f32", "memory per call, bf16"})
        CHECK_THAT(run.output, Catch::Contains(part));

    const std::vector<std::map<std::string, std::string>> rows = csv_rows(read_text(dir / "bench_norms.csv"));
    // 3 shapes x 2 norms x 4 impls x 2 passes, in each of the 2 dtypes.
    CHECK(rows.size() == 2 * 3 * 2 * 4 * 2);
    std::map<std::string, int> per_dtype;
    for (const auto& row : rows) per_dtype[row.at("dtype")] += 1;
    CHECK(per_dtype == std::map<std::string, int>{{"bf16", 48}, {"f32", 48}});
    // The bytes column: elements x (2 for fwd, 5 for fwd+bwd) x element size (4 for f32, 2 for bf16).
    const double n = 4096.0 * 512.0;
    int checked = 0;
    for (const auto& row : rows) {
        if (row.at("rows") != "4096" || row.at("norm") != "rmsnorm" || row.at("impl") != "kernel") continue;
        const double per_element = (row.at("pass") == "fwd" ? 2.0 : 5.0) * (row.at("dtype") == "bf16" ? 2.0 : 4.0);
        INFO(row.at("pass") << " " << row.at("dtype"));
        CHECK(std::stod(row.at("bytes")) == per_element * n);
        CHECK(std::stod(row.at("gbs")) > 0);
        CHECK(row.at("device") == "cpu");
        ++checked;
    }
    CHECK(checked == 4);
    std::filesystem::remove_all(dir);
}

TEST_CASE("bench norms rejects a bad dtypes value with the file and JSON path", "[bench_cli]") {
    BenchRun bad = run_bench("bench norms configs/bench_norms.json --quick --set 'dtypes=[\"f32\",\"fp8\"]' "
                             "--csv /dev/null --force");
    CHECK(bad.status == 2);
    CHECK_THAT(bad.output, Catch::Contains("configs/bench_norms.json: /dtypes") && Catch::Contains("fp8") &&
                               Catch::Contains("bf16"));
    BenchRun twice = run_bench("bench norms --quick --set 'dtypes=[\"bf16\",\"bf16\"]' --csv /dev/null --force");
    CHECK(twice.status == 2);
    CHECK_THAT(twice.output, Catch::Contains("(defaults): /dtypes") && Catch::Contains("at most once"));
    BenchRun number = run_bench("bench norms --quick --set dtypes=16 --csv /dev/null --force");
    CHECK(number.status == 2);
    CHECK_THAT(number.output, Catch::Contains("/dtypes"));
}

TEST_CASE("bench torch --device: cpu runs, cuda needs a GPU and a CUDA build", "[bench_cli]") {
    BenchRun cpu = run_bench("bench torch --device cpu --quick --skip-torch");
    INFO(cpu.output);
    REQUIRE(cpu.status == 0);
    CHECK_THAT(cpu.output, Catch::Contains("normlab vs PyTorch on cpu"));
    CHECK_THAT(cpu.output, Catch::Contains("transformer tokens/s"));

    BenchRun malformed = run_bench("bench torch --device gpu --quick --skip-torch");
    CHECK(malformed.status == 2);
    CHECK(std::count(malformed.output.begin(), malformed.output.end(), '\n') == 1);
    CHECK_THAT(malformed.output, Catch::Contains("bench torch: --device") && Catch::Contains("\"gpu\""));

    if (cuda_devices() == 0) {
        WARN("device branch: no CUDA device here (cuda_device_count() == 0 or a build without CUDA): checking that "
             "bench torch --device cuda is refused before any work");
        BenchRun cuda = run_bench("bench torch --device cuda --quick --skip-torch");
        INFO(cuda.output);
        CHECK(cuda.status == 2);
        CHECK(std::count(cuda.output.begin(), cuda.output.end(), '\n') == 1);
        CHECK_THAT(cuda.output, Catch::StartsWith("normlab: error: bench torch: --device: \"cuda:0\" asks for a GPU"));
        CHECK_THAT(cuda.output, Catch::Contains("use \"cpu\""));
    } else {
        WARN("device branch: " << cuda_devices() << " CUDA device(s): running bench torch --device cuda");
        BenchRun cuda = run_bench("bench torch --device cuda --quick --skip-torch");
        INFO(cuda.output);
        CHECK(cuda.status == 0);
        CHECK_THAT(cuda.output, Catch::Contains("normlab vs PyTorch on cuda:0"));
        CHECK_THAT(cuda.output, Catch::Contains("transformer tokens/s"));
        BenchRun past = run_bench("bench torch --device cuda:" + std::to_string(cuda_devices()) + " --quick --skip-torch");
        CHECK(past.status == 2);
        CHECK_THAT(past.output, Catch::Contains("asks for GPU " + std::to_string(cuda_devices())));
    }
}
