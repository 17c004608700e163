// `normlab sweep` (jobs/sweep.h) through the real program on a tiny transformer: runs.csv's columns,
// a run's files equal to a standalone `normlab train` of its config, the learning-rate sensitivity,
// the per-lr intervals and the paired differences to a baseline recomputed from runs.csv, a diverging
// lr recorded (not an error), bad input refused before any run, a sweep killed with SIGKILL then
// resumed equal to an uninterrupted one, and a sweep run as two concurrent shards then resumed equal
// to one run whole.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "jobs/sweep.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace nl_test;

namespace {

// A tiny train config: 1 block of dim 16 on 4-symbol reversal, `steps` steps of batch 8, probes
// every 5 steps.
json tiny_base(int64_t steps) {
    return json{{"seed", 0},
                {"data", {{"source", "synthetic"}, {"task", "reverse"}, {"length", 4}, {"symbols", 6}, {"eval_sequences", 32}}},
                {"model", {{"dim", 16}, {"n_layers", 1}, {"n_heads", 2}, {"multiple_of", 16}, {"max_seq_len", 16}}},
                {"optim", {{"lr", 0.003}, {"min_lr", 0.0003}, {"warmup_steps", 2}}},
                {"train", {{"steps", steps}, {"batch_size", 8}, {"eval_every", 0}, {"probe_every", 5}, {"log_every", 1000}}}};
}

template <typename Json>
void write_json(const std::string& path, const Json& value) {
    std::ofstream out(path);
    out << value.dump(2) << "\n";
    REQUIRE(out.good());
}

struct Csv {
    std::vector<std::string> header;
    std::vector<std::vector<std::string>> rows;
    size_t column(const std::string& name) const {
        const size_t at = static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
        INFO(name);
        REQUIRE(at < header.size());
        return at;
    }
    std::vector<std::string> column_values(const std::string& name) const {
        std::vector<std::string> out;
        for (const auto& row : rows) out.push_back(row[column(name)]);
        return out;
    }
};

std::vector<std::string> split(const std::string& line) {
    std::vector<std::string> cells;
    std::stringstream in(line);
    for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    return cells;
}

Csv read_csv(const std::string& path) {
    std::ifstream in(path);
    REQUIRE(in.good());
    Csv csv;
    std::string line;
    REQUIRE(std::getline(in, line));
    csv.header = split(line);
    while (std::getline(in, line)) {
        csv.rows.push_back(split(line));
        REQUIRE(csv.rows.back().size() == csv.header.size());
    }
    return csv;
}

// t_{0.975, 1}, from the published tables: the 95% interval of two seeds is mean -+ t * s / sqrt(2).
constexpr double kT975Df1 = 12.706204736174707;

// The largest grad_norm of a run's metrics.csv.
double max_grad_norm_of(const std::string& metrics_csv) {
    const Csv metrics = read_csv(metrics_csv);
    double m = -INFINITY;
    for (const std::string& cell : metrics.column_values("grad_norm")) m = std::max(m, std::stod(cell));
    return m;
}

// The CSV's text without the named columns (wall-clock columns), for exact comparison.
std::string without_columns(const Csv& csv, const std::set<std::string>& drop) {
    std::string out;
    for (size_t r = 0; r <= csv.rows.size(); ++r) {
        const auto& row = r == 0 ? csv.header : csv.rows[r - 1];
        for (size_t i = 0; i < row.size(); ++i)
            if (!drop.count(csv.header[i])) out += row[i] + ",";
        out += "\n";
    }
    return out;
}

}  // namespace

TEST_CASE("sweep: lr_sensitivity is the mean of min(L, L_init) - min L over the lrs", "[sweep]") {
    // L = (2, 1, 5) with L_init 3: (min(2,3) - 1 + min(1,3) - 1 + min(5,3) - 1) / 3 = (1 + 0 + 2) / 3.
    CHECK(nl::lr_sensitivity({2.0, 1.0, 5.0}, 3.0) == Approx(1.0));
    CHECK(nl::lr_sensitivity({1.5}, 3.0) == 0.0);  // one lr: nothing to be sensitive to
    // The formula as written: when no lr gets below L_init, min L > L_init and the terms are negative.
    CHECK(nl::lr_sensitivity({4.0, 5.0}, 3.0) == Approx(-1.0));
    CHECK(std::isnan(nl::lr_sensitivity({}, 3.0)));
}

TEST_CASE("sweep: runs.csv, summary.json and the run files of a grid with a diverging lr", "[sweep][cli]") {
    const std::string dir = make_temp_dir("sweep");
    write_json(dir + "/base.json", tiny_base(20));
    // Written in this key order (nlohmann::json would sort the grid's keys).
    write_json(dir + "/sweep.json",
               nlohmann::ordered_json{{"base", "base.json"},
                                      {"grid", {{"optim.lr", {0.003, 10.0}},
                                                {"model.qk_norm", {"none", "head"}},
                                                {"model.norm.type", {"rmsnorm"}}}},
                                      {"seeds", {0, 1}},
                                      {"baseline", "model.qk_norm=none"}});
    const CliRun run = run_normlab_in(dir, "sweep sweep.json --out out --jobs 2");
    INFO(run.output);
    REQUIRE(run.status == 0);

    // runs.csv: the grid keys in the file's order (optim.lr before model.qk_norm), the last key then
    // the seeds fastest.
    const Csv csv = read_csv(dir + "/out/runs.csv");
    const std::vector<std::string> fixed = {"index", "optim.lr", "model.qk_norm", "model.norm.type", "seed", "init_loss",
                                            "final_train_loss", "final_val_loss", "diverged", "diverged_at_step",
                                            "loss_spikes", "max_grad_norm", "seconds", "probe_step",
                                            "attn_score_max.block0", "residual_rms.block0", "act_max.block0",
                                            "act_kurtosis.block0", "attn_entropy.block0", "attn_sink.block0",
                                            "logsumexp_mean", "logsumexp_max"};
    REQUIRE(csv.header.size() > fixed.size());
    CHECK(std::vector<std::string>(csv.header.begin(), csv.header.begin() + fixed.size()) == fixed);
    REQUIRE(csv.rows.size() == 8);
    CHECK(csv.column_values("index") == std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7"});
    CHECK(csv.column_values("optim.lr") == std::vector<std::string>{"0.003", "0.003", "0.003", "0.003", "10.0", "10.0", "10.0", "10.0"});
    CHECK(csv.column_values("model.qk_norm") == std::vector<std::string>{"none", "none", "head", "head", "none", "none", "head", "head"});
    CHECK(csv.column_values("seed") == std::vector<std::string>{"0", "1", "0", "1", "0", "1", "0", "1"});
    for (size_t i = 0; i < 8; ++i) {
        const bool huge = i >= 4;
        INFO("run " << i);
        // lr 10 diverges (recorded, the sweep still exits 0); lr 0.003 trains all 20 steps.
        CHECK(csv.rows[i][csv.column("diverged")] == (huge ? "1" : "0"));
        const int64_t at = std::stoll(csv.rows[i][csv.column("diverged_at_step")]);
        CHECK((huge ? at >= 1 && at <= 20 : at == 0));
        CHECK(csv.rows[i][csv.column("final_val_loss")].empty() == huge);
        CHECK(file_exists(dir + "/out/runs/" + std::to_string(i) + "/result.json"));
        CHECK(file_exists(dir + "/out/runs/" + std::to_string(i) + "/summary.json") == !huge);
        if (!huge) CHECK(std::stod(csv.rows[i][csv.column("final_val_loss")]) < std::stod(csv.rows[i][csv.column("init_loss")]));
        // 20 steps fill no more than the first window: nothing is judged a spike yet.
        CHECK(csv.rows[i][csv.column("loss_spikes")] == "0");
        // The largest pre-clip gradient norm of metrics.csv (a finished run's every step is there).
        if (!huge)
            CHECK(std::stod(csv.rows[i][csv.column("max_grad_norm")]) ==
                  max_grad_norm_of(dir + "/out/runs/" + std::to_string(i) + "/metrics.csv"));
    }

    // summary.json: one variant per qk_norm; lr_sensitivity recomputed here from runs.csv alone:
    // mean over lrs of min(L(lr), L_init) - min_lr L(lr), L = mean val loss over seeds with a
    // diverged run as L_init, L_init = the variant's mean init_loss.
    const json summary = json::parse(read_text(dir + "/out/summary.json"));
    REQUIRE(summary["variants"].size() == 2);
    CHECK(summary["baseline"] == "model.qk_norm=none");
    // qk_norm -> lr -> seed -> the final val loss as counted (a diverged run as its variant's L_init).
    std::map<std::string, std::map<std::string, std::map<std::string, double>>> counted;
    for (const json& v : summary["variants"]) {
        const std::string qk = v["grid"]["model.qk_norm"].get<std::string>();
        CHECK(!v["grid"].contains("optim.lr"));
        double init_sum = 0.0;
        int init_n = 0;
        for (const auto& row : csv.rows)
            if (row[csv.column("model.qk_norm")] == qk) init_sum += std::stod(row[csv.column("init_loss")]), ++init_n;
        const double init = init_sum / init_n;
        std::map<std::string, std::pair<double, int>> by_lr;
        for (const auto& row : csv.rows) {
            if (row[csv.column("model.qk_norm")] != qk) continue;
            const double loss = row[csv.column("diverged")] == "1" ? init : std::stod(row[csv.column("final_val_loss")]);
            by_lr[row[csv.column("optim.lr")]].first += loss;
            by_lr[row[csv.column("optim.lr")]].second += 1;
            counted[qk][row[csv.column("optim.lr")]][row[csv.column("seed")]] = loss;
        }
        double best = INFINITY, sum = 0.0;
        for (const auto& [lr, acc] : by_lr) best = std::min(best, acc.first / acc.second);
        for (const auto& [lr, acc] : by_lr) sum += std::min(acc.first / acc.second, init) - best;
        INFO(qk);
        CHECK(v["lr_sensitivity"].get<double>() == Approx(sum / by_lr.size()).epsilon(1e-12));
        CHECK(v["lr_sensitivity"].get<double>() > 0.0);  // lr 10 costs its variant
        CHECK(v["best_lr"].get<double>() == 0.003);
        CHECK(v["divergence_rate"].get<double>() == 0.5);
        CHECK(v["lrs"].size() == 2);

        // per_lr: the mean over the 2 seeds and its Student-t 95% interval, mean -+ t_{0.975,1} |a - b| / 2.
        REQUIRE(v["per_lr"].size() == 2);
        for (const json& p : v["per_lr"]) {
            const std::string lr = p["lr"].get<double>() == 0.003 ? "0.003" : "10.0";
            const double a = counted[qk][lr]["0"], b = counted[qk][lr]["1"];
            INFO("lr " << lr);
            CHECK(p["final_val_loss_mean"].get<double>() == Approx((a + b) / 2).epsilon(1e-12));
            const double half = kT975Df1 * std::fabs(a - b) / 2.0;
            REQUIRE(p["final_val_loss_ci95"].is_array());
            CHECK(p["final_val_loss_ci95"][0].get<double>() == Approx((a + b) / 2 - half).epsilon(1e-9));
            CHECK(p["final_val_loss_ci95"][1].get<double>() == Approx((a + b) / 2 + half).epsilon(1e-9));
            CHECK(p.contains("baseline_diff_mean") == (qk != "none"));  // the baseline is not compared with itself
        }
    }
    // The paired differences head - none, seed with seed: at lr 0.003 two trained runs each; at lr 10
    // every run diverged, so each difference is the difference of the variants' L_init, the same for
    // both seeds: a zero-width interval.
    for (const json& v : summary["variants"]) {
        if (v["name"] != "model.qk_norm=head") continue;
        for (const json& p : v["per_lr"]) {
            const std::string lr = p["lr"].get<double>() == 0.003 ? "0.003" : "10.0";
            const double d0 = counted["head"][lr]["0"] - counted["none"][lr]["0"];
            const double d1 = counted["head"][lr]["1"] - counted["none"][lr]["1"];
            INFO("lr " << lr);
            CHECK(p["baseline_pairs"] == 2);
            CHECK(p["baseline_diff_mean"].get<double>() == Approx((d0 + d1) / 2).epsilon(1e-12));
            const double half = kT975Df1 * std::fabs(d0 - d1) / 2.0;
            CHECK(p["baseline_diff_ci95"][0].get<double>() == Approx((d0 + d1) / 2 - half).epsilon(1e-9).margin(1e-12));
            CHECK(p["baseline_diff_ci95"][1].get<double>() == Approx((d0 + d1) / 2 + half).epsilon(1e-9).margin(1e-12));
            if (lr == "10.0") CHECK(p["baseline_diff_ci95"][0] == p["baseline_diff_ci95"][1]);
            else CHECK(p["baseline_diff_ci95"][0] != p["baseline_diff_ci95"][1]);
        }
    }
    CHECK(file_exists(dir + "/out/plots.gp"));
    const std::string plots = read_text(dir + "/out/plots.gp");
    CHECK(plots.find("$attn") != std::string::npos);
    // Two seeds: each variant's loss curve has its interval as a band; the baseline gives a difference plot.
    CHECK(plots.find("$loss0 using 1:3:4 with filledcurves") != std::string::npos);
    CHECK(plots.find("$loss1 using 1:3:4 with filledcurves") != std::string::npos);
    CHECK(plots.find("set output 'val_loss_diff_vs_lr.png'") != std::string::npos);
    CHECK(plots.find("title 'model.qk_norm=head - model.qk_norm=none'") != std::string::npos);
    // A variant is named by the keys that vary: model.norm.type has one value, so no title names it.
    CHECK(plots.find("title 'model.qk_norm=head'") != std::string::npos);
    CHECK(plots.find("model.norm.type=") == std::string::npos);
    CHECK(run.output.find("diverged at step") != std::string::npos);

    // The bits: run 2 (qk_norm head, seed 0) trained standalone from its config.json writes the same
    // config.json, metrics.csv (but its wall-clock columns) and probes.csv.
    const std::string r2 = dir + "/out/runs/2";
    const CliRun alone = run_normlab_in(dir, "train out/runs/2/config.json --out alone --quiet");
    INFO(alone.output);
    REQUIRE(alone.status == 0);
    CHECK(read_text(dir + "/alone/config.json") == read_text(r2 + "/config.json"));
    CHECK(read_text(dir + "/alone/probes.csv") == read_text(r2 + "/probes.csv"));
    const std::set<std::string> timing = {"tokens_per_s", "elapsed_s"};
    CHECK(without_columns(read_csv(dir + "/alone/metrics.csv"), timing) ==
          without_columns(read_csv(r2 + "/metrics.csv"), timing));
    CHECK(json::parse(read_text(r2 + "/config.json"))["train"]["threads"] == 1);
}

TEST_CASE("sweep: runs.csv takes each probe family's last measured row when probes and sharpness differ in cadence",
          "[sweep][cli][sharpness]") {
    const std::string dir = make_temp_dir("sweep_sharpness");
    json base = tiny_base(4);
    base["train"]["probe_every"] = 2;
    base["train"]["sharpness_every"] = 3;
    base["train"]["sharpness_iters"] = 4;
    write_json(dir + "/base.json", base);
    write_json(dir + "/sweep.json", json{{"base", "base.json"}, {"grid", {{"optim.lr", {0.003}}}}, {"seeds", {0}}});
    const CliRun run = run_normlab_in(dir, "sweep sweep.json --out out");
    INFO(run.output);
    REQUIRE(run.status == 0);
    const Csv runs = read_csv(dir + "/out/runs.csv");
    const Csv probes = read_csv(dir + "/out/runs/0/probes.csv");  // rows at steps 2, 3 and 4
    REQUIRE(probes.column_values("step") == std::vector<std::string>{"2", "3", "4"});
    REQUIRE(runs.rows.size() == 1);
    CHECK(runs.rows[0][runs.column("probe_step")] == "4");
    // The probes of step 4, the sharpness of step 3 (step 4's sharpness cells are empty).
    CHECK(probes.rows[2][probes.column("sharpness")].empty());
    for (const char* name : {"act_max.block0", "residual_rms.block0"})
        CHECK(std::stod(runs.rows[0][runs.column(name)]) == Approx(std::stod(probes.rows[2][probes.column(name)])));
    for (const char* name : {"sharpness", "sharpness_adam", "sharpness_adam_threshold"}) {
        INFO(name);
        REQUIRE(!runs.rows[0][runs.column(name)].empty());
        CHECK(std::stod(runs.rows[0][runs.column(name)]) == Approx(std::stod(probes.rows[1][probes.column(name)])));
    }
}

TEST_CASE("sweep: bad input is one line, exit 2, before any directory is made", "[sweep][cli]") {
    const std::string dir = make_temp_dir("sweep-bad");
    write_json(dir + "/base.json", tiny_base(4));
    struct Case {
        json config;
        std::string message;
    };
    const std::vector<Case> cases = {
        {{{"base", "base.json"}, {"grid", {{"optim.lrr", {0.1}}}}}, "/grid/optim.lrr: not a train config key (did you mean 'optim.lr'"},
        {{{"base", "base.json"}, {"grid", {{"optim.lr", json::array()}}}}, "/grid/optim.lr: expected a non-empty list"},
        {{{"base", "base.json"}, {"grid", {{"optim.lr", {0.1, 0.2, "x"}}}}}, "/grid/optim.lr/2: expected a number, found \"x\""},
        {{{"base", "base.json"}, {"grid", {{"model.n_layers", {1, 1.5}}}}}, "/grid/model.n_layers/1: expected an integer"},
        {{{"base", "missing.json"}}, "/base: no train config file"},
        {{{"base", "base.json"}, {"seeds", {0, -1}}}, "/seeds"},
        {{{"base", "base.json"}, {"seeds", {3, 3}}}, "/seeds: lists the value 3 twice"},
        {{{"base", "base.json"}, {"grid", {{"optim.lr", {-1.0}}}}}, "run 0 (optim.lr=-1.0 seed=0): /optim/lr"},
        {{{"grid", {{"optim.lr", {0.1}}}}}, "/base: required"},
        {{{"base", "base.json"}, {"grid", {{"model.qk_norm", {"none", "head"}}, {"optim.lr", {0.003}}}}, {"baseline", "model.qk_norm=rms"}},
         "/baseline: expected one of the grid's variants (\"model.qk_norm=none\", \"model.qk_norm=head\"), found "
         "\"model.qk_norm=rms\""},
        {{{"base", "base.json"}, {"baseline", "model.qk_norm=none"}}, "/baseline: expected one of the grid's variants (\"base\")"},
    };
    for (size_t i = 0; i < cases.size(); ++i) {
        const std::string name = "bad" + std::to_string(i) + ".json";
        write_json(dir + "/" + name, cases[i].config);
        const CliRun run = run_normlab_in(dir, "sweep " + name + " --out out" + std::to_string(i));
        INFO(name << ": " << run.output);
        CHECK(run.status == 2);
        CHECK(run.output.find(cases[i].message) != std::string::npos);
        CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
        CHECK(!fs::exists(dir + "/out" + std::to_string(i)));
    }
    // Flags: a negative --jobs, --resume without the directory it continues, a --shard that is not K/N
    // with 0 <= K < N, or without the shared --out, or with --force.
    write_json(dir + "/good.json", json{{"base", "base.json"}, {"grid", {{"optim.lr", {0.003}}}}});
    const std::string shard_expected = "sweep: --shard: expected K/N, integers with N >= 1 and 0 <= K < N (K counts from 0), found ";
    const std::vector<std::pair<std::string, std::string>> flags = {
        {"--jobs -1 --out outj", "sweep: --jobs must be >= 0, found -1"},
        {"--resume", "sweep: --resume needs --out naming the sweep directory"},
        {"--shard 2/2 --out outj", shard_expected + "\"2/2\""},
        {"--shard 0/0 --out outj", shard_expected + "\"0/0\""},
        {"--shard 1/x --out outj", shard_expected + "\"1/x\""},
        {"--shard 3 --out outj", shard_expected + "\"3\""},
        {"--shard 0/2", "sweep: --shard needs --out naming the sweep directory the shards share"},
        {"--shard 0/2 --out outj --force", "sweep: --shard and --force cannot be combined"}};
    for (const auto& [args, message] : flags) {
        const CliRun run = run_normlab_in(dir, "sweep good.json " + args);
        INFO(args << ": " << run.output);
        CHECK(run.status == 2);
        CHECK(run.output.find(message) != std::string::npos);
        CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
    }
    CHECK(!fs::exists(dir + "/outj"));
    CHECK(!fs::exists(dir + "/runs"));  // nor the default directory
}

TEST_CASE("sweep: --set base.<key> reaches a base given as a file, its paths still beside it", "[sweep][cli]") {
    const std::string dir = make_temp_dir("sweep_base_set");
    std::filesystem::create_directories(dir + "/configs");
    std::filesystem::create_directories(dir + "/data");
    {
        std::ofstream text(dir + "/data/text.txt");
        for (int i = 0; i < 40; ++i) text << "the quick brown fox jumps over the lazy dog. ";
    }
    json base = tiny_base(20);
    base["data"] = {{"source", "text"}, {"path", "../data/text.txt"}, {"seq_len", 8}, {"eval_sequences", 4}};
    write_json(dir + "/configs/base.json", base);
    write_json(dir + "/configs/sweep.json", json{{"base", "base.json"}, {"grid", {{"optim.lr", {0.003}}}}});
    // Run from the sweep's folder's parent: the base's data path is beside the base, not the cwd.
    const CliRun run = run_normlab_in(dir, "sweep configs/sweep.json --out out --set base.train.steps=3");
    INFO(run.output);
    REQUIRE(run.status == 0);
    const json config = json::parse(read_text(dir + "/out/runs/0/config.json"));
    CHECK(config["train"]["steps"] == 3);
    CHECK(config["data"]["path"] == "data/text.txt");
    const Csv csv = read_csv(dir + "/out/runs.csv");
    REQUIRE(csv.rows.size() == 1);
    CHECK(csv.rows[0][csv.column("diverged")] == "0");
}

TEST_CASE("sweep: killed with SIGKILL and resumed, runs.csv equals an uninterrupted sweep's", "[sweep][cli]") {
    const std::string dir = make_temp_dir("sweep-resume");
    write_json(dir + "/base.json", tiny_base(150));
    write_json(dir + "/sweep.json", json{{"base", "base.json"}, {"grid", {{"optim.lr", {0.003, 0.01, 0.03}}}}, {"seeds", {0, 1}}});
    // In the background: its pid, then SIGKILL once two runs have their result.json.
    const CliRun started = run_shell_in(dir, "OMP_WAIT_POLICY=passive " + shell_arg(NORMLAB_BINARY) +
                                                  " sweep sweep.json --out killed --jobs 1 >killed.log 2>&1 & echo $!");
    REQUIRE(started.status == 0);
    const pid_t pid = static_cast<pid_t>(std::stol(started.output));
    auto finished = [&] {
        int n = 0;
        for (int i = 0; i < 6; ++i) n += fs::exists(dir + "/killed/runs/" + std::to_string(i) + "/result.json");
        return n;
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (finished() < 2 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(kill(pid, SIGKILL) == 0);
    const int done_at_kill = finished();
    INFO("runs finished at the kill: " << done_at_kill);
    REQUIRE(done_at_kill >= 2);
    CHECK(done_at_kill < 6);  // something is left to resume
    while (kill(pid, 0) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // reaped by the shell
    CHECK(!fs::exists(dir + "/killed/runs.csv"));

    const CliRun resumed = run_normlab_in(dir, "sweep sweep.json --out killed --resume --jobs 2");
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    CHECK(resumed.output.find("already done") != std::string::npos);
    const CliRun whole = run_normlab_in(dir, "sweep sweep.json --out whole --jobs 2 --quiet");
    REQUIRE(whole.status == 0);

    const Csv a = read_csv(dir + "/killed/runs.csv"), b = read_csv(dir + "/whole/runs.csv");
    CHECK(a.rows.size() == 6);
    CHECK(without_columns(a, {"seconds"}) == without_columns(b, {"seconds"}));
    CHECK(json::parse(read_text(dir + "/killed/summary.json"))["variants"] ==
          json::parse(read_text(dir + "/whole/summary.json"))["variants"]);
    // Every run's metrics.csv has exactly its 150 steps (a half-written run was started over), and
    // loss_spikes is the count over its train losses (steps 21..150 judged).
    for (int i = 0; i < 6; ++i) {
        const Csv metrics = read_csv(dir + "/killed/runs/" + std::to_string(i) + "/metrics.csv");
        CHECK(metrics.rows.size() == 150);
        std::vector<double> losses;
        for (const std::string& cell : metrics.column_values("train_loss")) losses.push_back(std::stod(cell));
        CHECK(a.rows[static_cast<size_t>(i)][a.column("loss_spikes")] == std::to_string(nl::count_loss_spikes(losses)));
    }

    // --resume refuses a folder that holds no sweep, and a config other than the one the sweep started with.
    fs::create_directories(dir + "/empty");
    write_json(dir + "/other.json", json{{"base", "base.json"}, {"grid", {{"optim.lr", {0.003, 0.01}}}}, {"seeds", {0, 1}}});
    const std::vector<std::pair<std::string, std::string>> refused = {
        {"sweep sweep.json --out empty --resume", "--resume: empty holds no sweep (no config.json)"},
        {"sweep other.json --out whole --resume", "--resume: this config differs from whole/config.json's"}};
    for (const auto& [args, message] : refused) {
        const CliRun run = run_normlab_in(dir, args);
        INFO(args << ": " << run.output);
        CHECK(run.status == 2);
        CHECK(run.output.find(message) != std::string::npos);
        CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);
    }
    CHECK(read_csv(dir + "/whole/runs.csv").rows.size() == 6);  // the refused resume left the sweep as it was
}

TEST_CASE("sweep: two concurrent --shard runs then --resume give an unsharded sweep's runs.csv", "[sweep][cli]") {
    const std::string dir = make_temp_dir("sweep-shard");
    write_json(dir + "/base.json", tiny_base(30));
    // 5 runs: shard 0/2 takes runs 0, 2, 4 and shard 1/2 runs 1, 3.
    write_json(dir + "/sweep.json", json{{"base", "base.json"},
                                         {"grid", {{"optim.lr", {0.003, 0.01, 0.03, 0.1, 0.3}}}},
                                         {"seeds", {0}}});
    // Both shards at once, as a job array's tasks start, sharing the directory neither has made yet.
    const std::string normlab = "OMP_WAIT_POLICY=passive " + shell_arg(NORMLAB_BINARY);
    const CliRun shards = run_shell_in(
        dir, "{ (" + normlab + " sweep sweep.json --out sharded --jobs 1 --shard 0/2 >s0.log 2>&1; echo $? >s0.rc) & (" +
                 normlab + " sweep sweep.json --out sharded --jobs 1 --shard 1/2 >s1.log 2>&1; echo $? >s1.rc) & wait; }");
    REQUIRE(shards.status == 0);
    for (int k = 0; k < 2; ++k) {
        const std::string log = read_text(dir + "/s" + std::to_string(k) + ".log");
        INFO("shard " << k << ": " << log);
        CHECK(read_text(dir + "/s" + std::to_string(k) + ".rc") == "0\n");
        CHECK(log.find("shard " + std::to_string(k) + "/2: " + (k == 0 ? "3" : "2") + " of them") != std::string::npos);
        CHECK(log.find("shard " + std::to_string(k) + "/2 done") != std::string::npos);
    }
    for (int i = 0; i < 5; ++i) CHECK(file_exists(dir + "/sharded/runs/" + std::to_string(i) + "/result.json"));
    // The shards write no tables: those need every shard's runs.
    CHECK(!fs::exists(dir + "/sharded/runs.csv"));
    CHECK(!fs::exists(dir + "/sharded/summary.json"));

    // A shard with another config is refused before it runs anything.
    write_json(dir + "/other.json", json{{"base", "base.json"}, {"grid", {{"optim.lr", {0.003}}}}});
    const CliRun other = run_normlab_in(dir, "sweep other.json --out sharded --shard 0/2");
    INFO(other.output);
    CHECK(other.status == 2);
    CHECK(other.output.find("--shard: this config differs from sharded/config.json's") != std::string::npos);
    CHECK(std::count(other.output.begin(), other.output.end(), '\n') == 1);

    const CliRun resumed = run_normlab_in(dir, "sweep sweep.json --out sharded --resume");
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    CHECK(resumed.output.find("(5 runs already done)") != std::string::npos);
    CHECK(resumed.output.find("sweep: run ") == std::string::npos);  // nothing ran again
    const CliRun whole = run_normlab_in(dir, "sweep sweep.json --out whole --jobs 2 --quiet");
    REQUIRE(whole.status == 0);
    const Csv a = read_csv(dir + "/sharded/runs.csv"), b = read_csv(dir + "/whole/runs.csv");
    CHECK(a.rows.size() == 5);
    CHECK(without_columns(a, {"seconds"}) == without_columns(b, {"seconds"}));
    CHECK(json::parse(read_text(dir + "/sharded/summary.json"))["variants"] ==
          json::parse(read_text(dir + "/whole/summary.json"))["variants"]);
}
