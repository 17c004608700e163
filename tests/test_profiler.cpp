// The profiler (core/profiler.h): kernels are counted by op and phase with the right FLOPs, nothing
// is collected when it is off, and `normlab train --profile` writes a table whose kernel time fits
// inside the measured step time.
#include <catch2/catch.hpp>

#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "cli_test_util.h"
#include "core/backend.h"
#include "core/ops.h"
#include "core/profiler.h"
#include "layers/loss.h"
#include "layers/norms.h"
#include "layers/transformer.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "kernel_workload.h"
#include "test_util.h"

using namespace nl;

namespace {

// The collected row for (kind, phase), or a row with 0 calls.
profiler::OpStats row_of(const std::string& kind, profiler::Phase phase) {
    for (const profiler::OpStats& row : profiler::collected())
        if (row.kind == kind && row.phase == phase) return row;
    return {};
}

}  // namespace

TEST_CASE("the profiler counts kernels by op and phase, with a matmul's FLOPs", "[profiler]") {
    profiler::reset();
    const Tensor a = ones({3, 4}), b = ones({4, 5});
    {
        profiler::EnableGuard on(true);
        profiler::PhaseGuard forward(profiler::Phase::Forward);
        Tensor c = matmul(a, b);  // (3, 5)
        c = add(c, c);
        CHECK(c.at({0, 0}) == 8.0);
    }
    CHECK_FALSE(profiler::enabled());
    const profiler::OpStats mm = row_of("matmul", profiler::Phase::Forward);
    CHECK(mm.calls == 1);
    CHECK(mm.flops == 2.0 * 3 * 4 * 5);
    CHECK(mm.seconds > 0);
    const profiler::OpStats added = row_of("add", profiler::Phase::Forward);
    CHECK(added.calls == 1);
    CHECK(added.bytes == 3.0 * 15 * 4);  // two f32 operands read, one written

    // Off: nothing more is collected.
    CHECK(matmul(a, b).numel() == 15);
    CHECK(row_of("matmul", profiler::Phase::Forward).calls == 1);

    // The engine counts backward kernels as backward.
    profiler::reset();
    {
        profiler::EnableGuard on(true);
        Var w(ones({4, 5}), true);
        Var y = sum(matmul(Var(a), w));
        y.backward();
    }
    CHECK(row_of("matmul", profiler::Phase::Other).calls == 1);      // the forward, outside any phase guard
    CHECK(row_of("matmul", profiler::Phase::Backward).calls >= 1);   // dW = A^T dY
    profiler::reset();
}

namespace nl::test {

// A transformer with fused RMSNorms, QK-norm, both soft-caps, fused attention, RoPE and SwiGLU (one
// AdamW step on its cross-entropy), a DyT norm (one SGD step), then the ops the model does not call:
// together they reach every row of the kernel table, on `device` (tests/test_cuda.cpp runs it on a GPU).
void kernel_table_workload(Device device) {
    TransformerOptions o;
    o.vocab_size = 11;
    o.dim = 16;
    o.n_layers = 1;
    o.n_heads = 2;
    o.multiple_of = 8;
    o.max_seq_len = 8;
    o.qk_norm = "head";
    o.logit_softcap = 30.0;
    o.attn_softcap = 20.0;
    Transformer model(o);
    model.to(device);
    const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1}, {2, 6}).to(device);
    const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2}, {2, 6}).to(device);
    cross_entropy_loss(model.forward(ids), targets).backward();
    AdamW(model.named_parameters(), AdamOptions{}).step();
    NormOptions n;
    n.type = "dyt";
    n.dim = 4;
    const auto dyt = make_norm(n);
    dyt->to(device);
    Generator gen(1);
    Var a(randn({3, 4}, gen).to(device), true);
    sum(dyt->forward(a)).backward();
    SGD(dyt->named_parameters(), SGDOptions{}).step();
    const Tensor index = from_vector(std::vector<int64_t>{2, 0, 1}, {3, 1}).to(device);
    const Tensor rows = from_vector(std::vector<int64_t>{1, 0, 2}, {3}).to(device);
    Var b(randn({3, 4}, gen).to(device), true);
    sum(add(add(softmax(b, 1), gather(b, 1, index)), index_select(b, 0, rows))).backward();
    const Tensor none = zeros({3, 4}, DType::F32, device);
    const Tensor picked = where(gt(b.data(), none), exp(b.data()), none);
    CHECK(picked.numel() == 12);
}

// Each row of the kernel table with its calls while `workload` ran under the profiler; every row
// must have been called.
void require_every_kernel_called(const std::function<void()>& workload) {
    profiler::reset();
    {
        profiler::EnableGuard on(true);
        workload();
    }
    const auto calls = profiler::kernel_calls();
    REQUIRE(calls.size() == kernel_names().size());
    REQUIRE(calls.size() >= 28);
    for (const auto& [name, count] : calls) {
        INFO("kernel " << name);
        CHECK(count > 0);
    }
    profiler::reset();
    for (const auto& [name, count] : profiler::kernel_calls()) CHECK(count == 0);
}

}  // namespace nl::test

TEST_CASE("the profiler times every row of the kernel table, and a small workload reaches each one", "[profiler]") {
    // kernel_calls is generated from the same table as the Backend's methods: a row missing from the
    // profiler's wrappers could not compile, and one no op reaches shows here as 0 calls.
    test::require_every_kernel_called([] { test::kernel_table_workload(Device::cpu()); });
}

TEST_CASE("train --profile writes a kernel table that fits in the measured step time", "[profiler]") {
    nl_test::TempDir dir("profiler_test");
    const std::string config = std::string(NORMLAB_SOURCE_DIR) + "/configs/toy_transformer.json";
    nl_test::CliRun run = nl_test::run_normlab_env(
        dir.path.string(), "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive ",
        "train " + nl_test::shell_arg(config) +
            " --out run --profile --set train.steps=6 --set optim.warmup_steps=1 --set train.batch_size=16 "
            "--set data.eval_sequences=16 --set train.log_every=100");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::Contains("profile: 6 steps"));
    CHECK_THAT(run.output, Catch::Contains("(outside kernels)"));
    const std::string table = nl_test::read_text(dir / "run/profile.txt");
    CHECK_THAT(run.output, Catch::Contains(table));  // the printed table is the saved one

    // profile.csv: phase,op,calls,total_s,share_of_step,gflop_per_s,gb_per_s,steps,measured_s
    std::ifstream csv(dir / "run/profile.csv");
    std::string line;
    REQUIRE(std::getline(csv, line));
    CHECK(line == "phase,op,calls,total_s,share_of_step,gflop_per_s,gb_per_s,steps,measured_s");
    double kernels = 0, measured = 0;
    std::map<std::string, long long> calls;  // "phase/op" -> calls
    std::map<std::string, double> gflops;
    while (std::getline(csv, line)) {
        std::vector<std::string> cells;
        std::stringstream parts(line);
        for (std::string cell; std::getline(parts, cell, ',');) cells.push_back(cell);
        REQUIRE(cells.size() == 9);
        calls[cells[0] + "/" + cells[1]] = std::stoll(cells[2]);
        gflops[cells[0] + "/" + cells[1]] = std::stod(cells[5]);
        kernels += std::stod(cells[3]);
        CHECK(std::stoll(cells[7]) == 6);
        measured = std::stod(cells[8]);
    }
    INFO("kernels " << kernels << " s of " << measured << " s measured");
    CHECK(calls["forward/matmul"] > 0);
    CHECK(calls["backward/matmul"] > calls["forward/matmul"]);  // two products per forward one
    CHECK(gflops["forward/matmul"] > 0);
    CHECK(calls["optimizer/adamw"] > 0);
    CHECK(calls["forward/cross_entropy"] == 6);
    // The kernels run inside the steps: their sum is part of the measured time, and most of it here
    // (the rest is graph building and allocation; 0.3 leaves room for a loaded machine).
    CHECK(kernels < measured);
    CHECK(kernels > 0.3 * measured);
}

TEST_CASE("train --help documents --profile, sample --help --no-kv-cache", "[profiler]") {
    nl_test::TempDir dir("profiler_help");
    nl_test::CliRun train = nl_test::run_normlab_in(dir.path.string(), "train --help");
    INFO(train.output);
    CHECK(train.status == 0);
    CHECK_THAT(train.output, Catch::Contains("--profile") && Catch::Contains("profile.txt"));
    nl_test::CliRun sample = nl_test::run_normlab_in(dir.path.string(), "sample --help");
    CHECK_THAT(sample.output, Catch::Contains("--no-kv-cache"));
}
