// The sharpness probe: Lanczos (autograd/functional.h) on explicit symmetric matrices and
// tridiagonals with known eigenvalues, Adam's preconditioner from an optimizer state
// (jobs/sharpness.h), and train.sharpness_every in the train job: probes.csv's rows and empty
// cells, the threshold, the objective summed over gradient shards, and bad input. Against PyTorch's
// eigenvalues of whole Hessians: tests/test_train_replay.cpp's sharpness cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/functional.h"
#include "cli_test_util.h"
#include "core/ops.h"
#include "core/rng.h"
#include "jobs/sharpness.h"
#include "jobs/train.h"
#include "test_util.h"

using namespace nl;

namespace {

// A = Q diag(eigenvalues) Q^T with Q orthogonal (Gram-Schmidt of a random matrix), row-major (n, n).
std::vector<double> symmetric_with_eigenvalues(const std::vector<double>& eigenvalues, uint64_t seed) {
    const size_t n = eigenvalues.size();
    std::vector<double> q(n * n);  // (n, n) column j is the j-th eigenvector
    Generator gen(seed);
    gen.fill_normal(q.data(), static_cast<int64_t>(n * n));
    for (size_t j = 0; j < n; ++j) {
        for (size_t k = 0; k < j; ++k) {
            double d = 0.0;
            for (size_t i = 0; i < n; ++i) d += q[i * n + j] * q[i * n + k];
            for (size_t i = 0; i < n; ++i) q[i * n + j] -= d * q[i * n + k];
        }
        double norm = 0.0;
        for (size_t i = 0; i < n; ++i) norm += q[i * n + j] * q[i * n + j];
        for (size_t i = 0; i < n; ++i) q[i * n + j] /= std::sqrt(norm);
    }
    std::vector<double> a(n * n, 0.0);
    for (size_t r = 0; r < n; ++r)
        for (size_t c = 0; c < n; ++c)
            for (size_t k = 0; k < n; ++k) a[r * n + c] += q[r * n + k] * eigenvalues[k] * q[c * n + k];
    return a;
}

SymmetricOperator matrix_operator(const std::vector<double>& a, size_t n, int64_t* products = nullptr) {
    return [&a, n, products](const std::vector<double>& in, std::vector<double>& out) {
        out.assign(n, 0.0);
        for (size_t r = 0; r < n; ++r)
            for (size_t c = 0; c < n; ++c) out[r] += a[r * n + c] * in[c];
        if (products) ++*products;
    };
}

std::vector<std::vector<std::string>> csv_rows(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::vector<std::string>> rows;
    for (std::string line; std::getline(in, line);) {
        std::vector<std::string> cells;
        std::stringstream s(line);
        for (std::string cell; std::getline(s, cell, ',');) cells.push_back(cell);
        if (!line.empty() && line.back() == ',') cells.emplace_back();
        rows.push_back(cells);
    }
    return rows;
}

nlohmann::json sharpness_config() {
    return {{"data", {{"source", "synthetic"}, {"task", "reverse"}, {"length", 4}, {"eval_sequences", 8}}},
            {"model", {{"dim", 8}, {"n_layers", 1}, {"n_heads", 2}, {"multiple_of", 4}, {"max_seq_len", 16}}},
            {"optim", {{"lr", 0.02}, {"warmup_steps", 1}}},
            {"train",
             {{"steps", 4}, {"batch_size", 4}, {"eval_every", 0}, {"threads", 1}, {"probe_every", 3},
              {"sharpness_every", 2}, {"sharpness_iters", 30}, {"z_loss", 1e-3}}}};
}

std::vector<TrainStep> train(const nlohmann::json& config, const std::string& out) {
    TrainJob job;
    job.config = config;
    job.config_name = "sharpness";
    job.out = out;
    return run_train(job).history;
}

double probe(const TrainStep& t, const std::string& column) {
    for (const auto& [name, value] : t.probes)
        if (name == column) return value;
    FAIL("no column " << column << " at step " << t.step);
    return NAN;
}

}  // namespace

TEST_CASE("lanczos: the largest algebraic eigenvalue of a symmetric matrix, not the largest in magnitude",
          "[sharpness][lanczos]") {
    // The most negative eigenvalue has the largest |value|: power iteration would find -40.
    const std::vector<double> eigenvalues = {-40.0, -3.0, -1.0, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 6.0, 7.25};
    const size_t n = eigenvalues.size();
    const std::vector<double> a = symmetric_with_eigenvalues(eigenvalues, 3);
    int64_t products = 0;
    const LanczosResult full = lanczos_max_eigenvalue(matrix_operator(a, n, &products), int64_t(n), int64_t(n), 11);
    CHECK(full.max_eigenvalue == Approx(7.25).epsilon(1e-12));
    CHECK(products == full.iterations);
    CHECK(full.iterations <= int64_t(n));
    // Fewer iterations: a Ritz value, at or below the true one, rising with the iterations.
    double previous = -INFINITY;
    for (int64_t m : {1, 2, 3, 5, 8}) {
        const double estimate = lanczos_max_eigenvalue(matrix_operator(a, n), int64_t(n), m, 11).max_eigenvalue;
        INFO("iterations " << m);
        CHECK(estimate <= 7.25 + 1e-12);
        CHECK(estimate >= previous - 1e-12);
        previous = estimate;
    }
    // The same seed gives the same bits; another seed the same eigenvalue.
    CHECK(lanczos_max_eigenvalue(matrix_operator(a, n), int64_t(n), 5, 11).max_eigenvalue ==
          lanczos_max_eigenvalue(matrix_operator(a, n), int64_t(n), 5, 11).max_eigenvalue);
    CHECK(lanczos_max_eigenvalue(matrix_operator(a, n), int64_t(n), int64_t(n), 12).max_eigenvalue ==
          Approx(7.25).epsilon(1e-12));
}

TEST_CASE("lanczos: stops on an invariant subspace with the exact eigenvalue, and refuses bad arguments",
          "[sharpness][lanczos]") {
    // 60 dimensions, three distinct eigenvalues: the Krylov space is 3-dimensional.
    const size_t n = 60;
    std::vector<double> a(n * n, 0.0);
    for (size_t i = 0; i < n; ++i) a[i * n + i] = i % 3 == 0 ? -9.0 : (i % 3 == 1 ? 0.5 : 2.0);
    int64_t products = 0;
    const LanczosResult r = lanczos_max_eigenvalue(matrix_operator(a, n, &products), int64_t(n), 40, 5);
    CHECK(r.iterations == 3);
    CHECK(products == 3);
    CHECK(r.max_eigenvalue == Approx(2.0).epsilon(1e-13));
    CHECK_THROWS_WITH(lanczos_max_eigenvalue(matrix_operator(a, n), int64_t(n), 0, 5),
                      Catch::Contains("at least 1 iteration, found 0"));
    CHECK_THROWS_WITH(lanczos_max_eigenvalue(matrix_operator(a, n), 0, 3, 5), Catch::Contains("n = 0"));
}

TEST_CASE("tridiagonal_max_eigenvalue: bisection against the closed form of tridiag(-1, 2, -1)", "[sharpness][lanczos]") {
    for (size_t m : {1u, 2u, 7u, 50u}) {
        INFO("m = " << m);
        const std::vector<double> d(m, 2.0), e(m - 1, -1.0);
        const double expected = 2.0 - 2.0 * std::cos(M_PI * double(m) / double(m + 1));
        CHECK(tridiagonal_max_eigenvalue(d, e) == Approx(expected).epsilon(1e-14));
    }
    // A zero off-diagonal splits the matrix: the largest of the blocks' largest.
    CHECK(tridiagonal_max_eigenvalue({1.0, 3.0, -2.0}, {0.0, 0.0}) == Approx(3.0).epsilon(1e-15));
    CHECK_THROWS_WITH(tridiagonal_max_eigenvalue({1.0, 2.0}, {}), Catch::Contains("m - 1 entries"));
}

TEST_CASE("adam_inverse_sqrt_preconditioner: 1 / sqrt(sqrt(v / (1 - beta2^t)) + eps), 0 without state",
          "[sharpness]") {
    std::vector<Var> params = {Var(zeros({2}, DType::F32), true), Var(zeros({3}, DType::F32), true)};
    OptimizerState state;
    state.tensors.emplace_back("a.exp_avg_sq", from_vector(std::vector<double>{4e-4, 1e-2}, {2}, DType::F32));
    state.tensors.emplace_back("a.step", from_vector(std::vector<int64_t>{3}, Shape{}, DType::I64));
    const double beta2 = 0.95, eps = 1e-8;
    const std::vector<double> scale = adam_inverse_sqrt_preconditioner(state, {"a", "b"}, params, beta2, eps);
    REQUIRE(scale.size() == 5);
    const double correction = 1.0 - std::pow(beta2, 3.0);
    CHECK(scale[0] == Approx(1.0 / std::sqrt(std::sqrt(double(4e-4f) / correction) + eps)).epsilon(1e-12));
    CHECK(scale[1] == Approx(1.0 / std::sqrt(std::sqrt(double(1e-2f) / correction) + eps)).epsilon(1e-12));
    CHECK(scale[2] == 0.0);
    CHECK(scale[4] == 0.0);
    CHECK(adam_sharpness_threshold(0.9, 0.01) == Approx(3800.0).epsilon(1e-14));
}

TEST_CASE("train.sharpness_every: probes.csv rows, empty cells, the threshold, and the objective over shards",
          "[sharpness][train]") {
    nl_test::TempDir dir("sharpness");
    const std::vector<TrainStep> steps = train(sharpness_config(), dir / "run");
    REQUIRE(steps.size() == 4);
    // Rows at steps 2, 3 and 4: the sharpness every 2 steps, the probes every 3.
    CHECK(steps[0].probes.empty());
    const std::vector<std::vector<std::string>> rows = csv_rows(dir / "run/probes.csv");
    REQUIRE(rows.size() == 4);
    const std::vector<std::string>& header = rows[0];
    const size_t sharp = static_cast<size_t>(std::find(header.begin(), header.end(), "sharpness") - header.begin());
    REQUIRE(sharp + 3 == header.size());  // the last three columns
    CHECK(header[sharp + 1] == "sharpness_adam");
    CHECK(header[sharp + 2] == "sharpness_adam_threshold");
    CHECK(rows[1][0] == "2");
    CHECK(rows[2][0] == "3");
    CHECK(rows[3][0] == "4");
    for (size_t r = 1; r < rows.size(); ++r) REQUIRE(rows[r].size() == header.size());
    CHECK(rows[1][1].empty());    // step 2: no probes
    CHECK(!rows[2][1].empty());   // step 3: probes
    CHECK(rows[2][sharp].empty());  // and no sharpness
    CHECK(!rows[1][sharp].empty());
    CHECK(std::isnan(probe(steps[1], "act_max.block0")));
    for (int s : {1, 3}) {
        INFO("step " << s + 1);
        const double plain = probe(steps[s], "sharpness"), adam = probe(steps[s], "sharpness_adam");
        CHECK(plain > 0.0);  // a cross-entropy's Hessian at a point this far from a minimum has positive curvature
        CHECK(adam > plain);  // P^{-1} with sqrt(v) far below 1 magnifies it
        CHECK(probe(steps[s], "sharpness_adam_threshold") == Approx(38.0 / steps[s].lr).epsilon(1e-12));
        CHECK(std::stod(rows[s == 1 ? 1 : 3][sharp]) == Approx(plain).epsilon(1e-12));
    }

    // The same run in two gradient shards: the objective is the shards' weighted sum, so the same
    // sharpness up to f32 rounding (a share left out would halve it).
    nlohmann::json sharded = sharpness_config();
    sharded["train"]["grad_shards"] = 2;
    const std::vector<TrainStep> two = train(sharded, dir / "sharded");
    for (int s : {1, 3}) {
        INFO("step " << s + 1);
        CHECK(probe(two[s], "sharpness") == Approx(probe(steps[s], "sharpness")).epsilon(1e-3));
        CHECK(probe(two[s], "sharpness_adam") == Approx(probe(steps[s], "sharpness_adam")).epsilon(1e-3));
    }

    // The sharpness alone: only its columns, on its steps.
    nlohmann::json alone = sharpness_config();
    alone["train"]["probe_every"] = 0;
    const std::vector<TrainStep> only = train(alone, dir / "alone");
    const std::vector<std::vector<std::string>> alone_rows = csv_rows(dir / "alone/probes.csv");
    REQUIRE(alone_rows.size() == 3);
    CHECK(alone_rows[0] == std::vector<std::string>{"step", "sharpness", "sharpness_adam", "sharpness_adam_threshold"});
    CHECK(only[2].probes.empty());
    // The probes do not change the sharpness: the same value with and without them.
    CHECK(probe(only[1], "sharpness") == probe(steps[1], "sharpness"));
}

TEST_CASE("train.sharpness_every and sharpness_iters refuse bad input in one line", "[sharpness][train]") {
    const std::string dir = nl_test::make_temp_dir("sharpness_errors");
    auto run = [&](const std::string& sets) { return nl_test::train_toy_in(dir, sets); };
    auto check_error = [&](const nl_test::CliRun& r, const std::vector<std::string>& parts) {
        nl_test::check_one_line_error(r, dir, parts);
    };
    check_error(run("--set train.sharpness_every=1 --set train.sharpness_iters=0"), {"/train/sharpness_iters", "0"});
    check_error(run("--set train.sharpness_every=-2"), {"/train/sharpness_every", "-2"});
    check_error(run("--set train.sharpness_every=1 --set train.sharpness_iters=20000"),
                {"/train/sharpness_iters", "20000"});
}
