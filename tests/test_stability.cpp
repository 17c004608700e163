// `normlab stability`: the seed article's experiment (5.2) replayed from PyTorch's own data and
// initial weights, built with the article's classes at their default eps (tests/reference/article.py),
// must give PyTorch's loss curve for every norm the article defines (f64: every epoch within 1e-6
// relative, fused and composed; f32: the first 30 epochs within 1e-4, the run being chaotic later),
// and the job's outputs, divergence handling, determinism, parallel runs (--jobs), resume after an
// interruption and bad-input errors. Runs the built binary in a temporary directory (and the job in
// this process where a callback interrupts it).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "jobs/stability.h"
#include "tests/cli_test_util.h"

using nl_test::CliRun;
using nl_test::file_exists;
using nl_test::make_temp_dir;
using nl_test::read_text;
using nl_test::run_normlab_env;
using nl_test::run_normlab_in;
using nl_test::shell_arg;

namespace {

const std::string kSource = NORMLAB_SOURCE_DIR;
const std::string kFixtures = kSource + "/tests/reference/fixtures/";

// `normlab stability <config> --set a=b ... --out run --quiet` in a fresh temporary directory.
struct StabilityRun {
    std::string dir;
    CliRun cli;
    std::string run_dir() const { return dir + "/run"; }
};

StabilityRun stability(const std::string& config, const std::vector<std::string>& sets,
                       const std::string& extra = "--out run --quiet") {
    StabilityRun run;
    run.dir = make_temp_dir("stability");
    std::string args = "stability " + shell_arg(config);
    for (const std::string& set : sets) args += " --set " + shell_arg(set);
    run.cli = run_normlab_in(run.dir, args + " " + extra);
    return run;
}

// A column of a CSV file written by the job (empty cells skipped).
std::vector<double> csv_column(const std::string& path, const std::string& column) {
    std::istringstream text(read_text(path));
    std::string line;
    REQUIRE(std::getline(text, line));
    std::vector<std::string> header;
    std::string cell;
    for (std::istringstream row(line); std::getline(row, cell, ',');) header.push_back(cell);
    size_t index = header.size();
    for (size_t i = 0; i < header.size(); ++i)
        if (header[i] == column) index = i;
    REQUIRE(index < header.size());
    std::vector<double> values;
    while (std::getline(text, line)) {
        std::istringstream row(line);
        for (size_t i = 0; i <= index; ++i) std::getline(row, cell, ',');
        if (!cell.empty()) values.push_back(std::stod(cell));
    }
    return values;
}

// `key`: "losses", or "losses_perturbed" (fc1.weight scaled by 1 + 1e-6 before training).
std::vector<double> fixture_losses(const std::string& norm, const std::string& dtype, const std::string& key) {
    nl::SafeTensorsFile file = nl::load_safetensors(kFixtures + "stability_" + norm + "_" + dtype + ".safetensors");
    nl::Tensor losses = file.at(key).to(nl::DType::F64).contiguous();
    return std::vector<double>(losses.data<double>(), losses.data<double>() + losses.numel());
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_text(path)); }

// `value` without its wall-clock fields (every key containing "second", at any depth).
nlohmann::json without_seconds(nlohmann::json value) {
    if (value.is_array())
        for (nlohmann::json& item : value) item = without_seconds(item);
    if (!value.is_object()) return value;
    nlohmann::json out = nlohmann::json::object();
    for (auto it = value.begin(); it != value.end(); ++it)
        if (it.key().find("second") == std::string::npos) out[it.key()] = without_seconds(it.value());
    return out;
}

// A run directory's outputs but their wall-clock fields, by file: every curves/*.csv as written,
// runs.csv without its `seconds` column, summary.json without its seconds fields.
std::map<std::string, std::string> outputs_without_seconds(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir + "/curves"))
        out["curves/" + entry.path().filename().string()] = read_text(entry.path().string());
    std::istringstream runs(read_text(dir + "/runs.csv"));
    std::string line;
    size_t seconds = std::string::npos;
    while (std::getline(runs, line)) {
        std::vector<std::string> cells;
        std::string cell;
        for (std::istringstream row(line + ","); std::getline(row, cell, ',');) cells.push_back(cell);
        if (seconds == std::string::npos)
            seconds = static_cast<size_t>(std::find(cells.begin(), cells.end(), "seconds") - cells.begin());
        REQUIRE(seconds < cells.size());
        cells.erase(cells.begin() + static_cast<std::ptrdiff_t>(seconds));
        for (const std::string& c : cells) out["runs.csv"] += c + ",";
        out["runs.csv"] += "\n";
    }
    out["summary.json"] = without_seconds(read_json(dir + "/summary.json")).dump(1);
    return out;
}

void check_same_outputs(const std::string& dir_a, const std::string& dir_b) {
    const std::map<std::string, std::string> a = outputs_without_seconds(dir_a), b = outputs_without_seconds(dir_b);
    std::set<std::string> names_a, names_b;
    for (const auto& [name, text] : a) names_a.insert(name);
    for (const auto& [name, text] : b) names_b.insert(name);
    REQUIRE(names_a == names_b);
    for (const auto& [name, text] : a) {
        INFO(name << " of " << dir_a << " and " << dir_b);
        CHECK(text == b.at(name));
    }
}

// A small sweep of 8 runs, half of them diverging (lr 100): 2 norms x 2 lrs x 2 seeds, 12 epochs.
const std::vector<std::string> kParallelSets{"epochs=12", "samples=64", "hidden=16", "lrs=[0.001, 100]",
                                             "seeds=[1, 2]", "plots=false"};

// The norms the stability job offers that the article defines (one fixture set each).
const std::vector<std::string> kArticleNorms{"layernorm", "rmsnorm", "rmsnorm_bias", "adaptive_rmsnorm", "hybridnorm"};

std::string norms_list(const std::vector<std::string>& norms) {
    std::string out;
    for (const std::string& norm : norms) out += (out.empty() ? "" : ", ") + ("\"" + norm + "\"");
    return "norms=[" + out + "]";
}

// The default config replaying PyTorch's data and initial weights (one init file per norm).
std::vector<std::string> replay_sets(const std::string& dtype, int epochs, double perturb) {
    return {"dtype=" + dtype,
            "epochs=" + std::to_string(epochs),
            "perturb=" + std::to_string(perturb),
            "plots=false",
            "init_from=" + kFixtures + "stability_init_{norm}.safetensors",
            "data_from=" + kFixtures + "stability_data.safetensors"};
}

// Every epoch's loss within `rtol` of PyTorch's; reports the worst relative error. `perturbed`: the
// sensitivity copy's curve against PyTorch's run with fc1.weight scaled by 1 + 1e-6.
void check_curve(const StabilityRun& run, const std::string& norm, const std::string& dtype, size_t epochs,
                 double rtol, bool perturbed = false) {
    std::vector<double> ours = csv_column(run.run_dir() + "/curves/" + norm + "_d2_lr0.001_s42.csv",
                                          perturbed ? "loss_perturbed" : "loss");
    std::vector<double> torch = fixture_losses(norm, dtype, perturbed ? "losses_perturbed" : "losses");
    REQUIRE(ours.size() == epochs);
    REQUIRE(torch.size() >= epochs);
    double worst = 0.0;
    size_t worst_epoch = 0;
    for (size_t i = 0; i < epochs; ++i) {
        const double rel = std::fabs(ours[i] - torch[i]) / std::fabs(torch[i]);
        if (rel > worst) worst = rel, worst_epoch = i + 1;
    }
    INFO(norm << " " << dtype << (perturbed ? " perturbed" : "") << ": worst relative error " << worst << " at epoch " << worst_epoch << " (ours "
              << ours[worst_epoch ? worst_epoch - 1 : 0] << ", PyTorch " << torch[worst_epoch ? worst_epoch - 1 : 0]
              << "); epoch-1 loss " << ours[0] << " vs " << torch[0]);
    CHECK(worst <= rtol);
}

}  // namespace

TEST_CASE("stability: the default config's f64 replay matches the article's run within 1e-6 at all 100 epochs",
          "[stability]") {
    // The default settings (rmsnorm and layernorm, fused, each norm type's default eps) with the
    // sensitivity copy on: its curve must match PyTorch's perturbed run as well, which checks that
    // the probe perturbs what PyTorch's does (and that the chaos is the model's, not ours).
    StabilityRun run = stability(kSource + "/configs/stability.json", replay_sets("f64", 100, 1e-6));
    INFO(run.cli.output);
    REQUIRE(run.cli.status == 0);
    for (const std::string norm : {"rmsnorm", "layernorm"}) {
        check_curve(run, norm, "f64", 100, 1e-6);
        check_curve(run, norm, "f64", 100, 1e-6, /*perturbed=*/true);
    }
}

TEST_CASE("stability: f64 replay of the article's other norms, fused, within 1e-6 at all 100 epochs", "[stability]") {
    const std::vector<std::string> norms{"rmsnorm_bias", "adaptive_rmsnorm", "hybridnorm"};
    std::vector<std::string> sets = replay_sets("f64", 100, 0.0);
    sets.push_back(norms_list(norms));
    StabilityRun run = stability(kSource + "/configs/stability.json", sets);
    INFO(run.cli.output);
    REQUIRE(run.cli.status == 0);
    for (const std::string& norm : norms) check_curve(run, norm, "f64", 100, 1e-6);
}

TEST_CASE("stability: f64 replay of every article norm, composed, within 1e-6 at all 100 epochs", "[stability]") {
    std::vector<std::string> sets = replay_sets("f64", 100, 0.0);
    sets.push_back(norms_list(kArticleNorms));
    sets.push_back("norm.fused=false");
    StabilityRun run = stability(kSource + "/configs/stability.json", sets);
    INFO(run.cli.output);
    REQUIRE(run.cli.status == 0);
    for (const std::string& norm : kArticleNorms) check_curve(run, norm, "f64", 100, 1e-6);
}

TEST_CASE("stability: f32 replay of every article norm matches PyTorch's within 1e-4 over 30 epochs",
          "[stability]") {
    std::vector<std::string> sets = replay_sets("f32", 30, 0.0);
    sets.push_back(norms_list(kArticleNorms));
    StabilityRun run = stability(kSource + "/configs/stability.json", sets);
    INFO(run.cli.output);
    REQUIRE(run.cli.status == 0);
    for (const std::string& norm : kArticleNorms) check_curve(run, norm, "f32", 30, 1e-4);
}

TEST_CASE("stability: the default config writes the resolved config, curves, runs.csv, plots and summary",
          "[stability]") {
    StabilityRun run = stability(kSource + "/configs/stability.json", {"epochs=4"});
    INFO(run.cli.output);
    REQUIRE(run.cli.status == 0);
    const std::string dir = run.run_dir();

    nlohmann::json config = read_json(dir + "/config.json");
    CHECK(config["epochs"] == 4);
    CHECK(config["hidden"] == 256);
    CHECK(config["lrs"] == nlohmann::json::array({0.001}));
    CHECK(config["norm"]["fused"] == true);
    CHECK_FALSE(config["norm"].contains("eps"));  // each type's own default
    CHECK(config["dtype"] == "f32");

    for (const std::string norm : {"rmsnorm", "layernorm"}) {
        const std::string curve = dir + "/curves/" + norm + "_d2_lr0.001_s42.csv";
        CHECK(csv_column(curve, "loss").size() == 4);
        CHECK(csv_column(curve, "loss_perturbed").size() == 4);
        for (const char* layer : {"grad_norm_total", "grad_norm.fc1", "grad_norm.norm1", "grad_norm.fc2",
                                  "grad_norm.norm2", "grad_norm.fc3"}) {
            std::vector<double> norms = csv_column(curve, layer);
            REQUIRE(norms.size() == 4);
            CHECK(norms[0] > 0.0);
        }
    }
    CHECK(csv_column(dir + "/runs.csv", "final_loss").size() == 2);

    nlohmann::json summary = read_json(dir + "/summary.json");
    REQUIRE(summary["groups"].size() == 2);
    REQUIRE(summary["runs"].size() == 2);
    for (const auto& group : summary["groups"]) {
        CHECK(group["seeds"] == 1);
        CHECK(group["divergence_rate"] == 0.0);
        CHECK(group["final_loss_std"].is_null());  // one seed: unknown, not zero
        // One seed per group: the group's statistics are its one run's numbers.
        const auto run_of_group = std::find_if(summary["runs"].begin(), summary["runs"].end(),
                                               [&](const auto& r) { return r["norm"] == group["norm"]; });
        REQUIRE(run_of_group != summary["runs"].end());
        const double final_loss = (*run_of_group)["final_loss"].get<double>();
        const double perturbed = (*run_of_group)["final_loss_perturbed"].get<double>();
        CHECK(group["final_loss_mean"].get<double>() == final_loss);
        CHECK(group["sensitivity_max"].get<double>() == Approx(std::fabs(perturbed - final_loss) / final_loss));
    }
    for (const auto& r : summary["runs"]) {
        CHECK(r["final_loss"].get<double>() < r["first_loss"].get<double>());  // it trains
        CHECK(r["diverged"] == false);
    }
    // The table is printed, with the sensitivity and the one-seed caveat.
    for (const char* part : {"rmsnorm", "layernorm", "final loss mean +- std", "diverged", "sensitivity",
                             "one seed per row"})
        CHECK_THAT(run.cli.output, Catch::Contains(part));
    CHECK(file_exists(dir + "/plots.gp"));
    if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
        CHECK(summary["plots"] == "losses.png, grad_norms.png");
        CHECK(file_exists(dir + "/losses.png"));
        CHECK(file_exists(dir + "/grad_norms.png"));
    } else {
        CHECK_THAT(summary["plots"].get<std::string>(), Catch::Contains("gnuplot not found"));
    }
}

TEST_CASE("stability: the shipped sweep config runs (shortened) and summarizes norms x depths x lrs over seeds",
          "[stability]") {
    const std::string config = kSource + "/configs/stability_sweep.json";
    nlohmann::json shipped = read_json(config);
    StabilityRun run = stability(config, {"epochs=3", "samples=64", "hidden=16", "plots=false"});
    INFO(run.cli.output);
    REQUIRE(run.cli.status == 0);
    nlohmann::json summary = read_json(run.run_dir() + "/summary.json");
    const size_t groups = shipped["norms"].size() * shipped["depths"].size() * shipped["lrs"].size();
    CHECK(summary["groups"].size() == groups);
    CHECK(summary["runs"].size() == groups * shipped["seeds"].size());
    for (const auto& group : summary["groups"]) {
        if (group["diverged"] == 0) CHECK(group["final_loss_std"].get<double>() > 0.0);  // seeds differ
        // The group's divergence count and rate are its runs'.
        int64_t diverged = 0;
        for (const auto& r : summary["runs"])
            if (r["norm"] == group["norm"] && r["depth"] == group["depth"] && r["lr"] == group["lr"] && r["diverged"] == true)
                ++diverged;
        CHECK(group["diverged"].get<int64_t>() == diverged);
        CHECK(group["divergence_rate"].get<double>() ==
              Approx(static_cast<double>(diverged) / static_cast<double>(shipped["seeds"].size())));
    }
}

TEST_CASE("stability: a diverging run is recorded with its epoch, not a crash", "[stability]") {
    // lr 100 with Adam moves every weight by ~100 per step: the loss explodes within a few epochs.
    StabilityRun run = stability(kSource + "/configs/stability.json",
                                 {"epochs=20", "lrs=[0.001, 100]", "samples=64", "hidden=32", "plots=false"});
    INFO(run.cli.output);
    REQUIRE(run.cli.status == 0);
    nlohmann::json summary = read_json(run.run_dir() + "/summary.json");
    int diverged = 0;
    for (const auto& r : summary["runs"]) {
        if (r["lr"] == 100) {
            REQUIRE(r["diverged"] == true);
            CHECK(r["diverged_epoch"].get<int>() >= 2);
            CHECK(r["epochs_run"] == r["diverged_epoch"]);
            ++diverged;
        } else {
            CHECK(r["diverged"] == false);
            CHECK(r["epochs_run"] == 20);
        }
    }
    CHECK(diverged == 2);
    for (const auto& group : summary["groups"])
        CHECK(group["divergence_rate"] == (group["lr"] == 100 ? 1.0 : 0.0));
    CHECK_THAT(run.cli.output, Catch::Contains("1/1 (100%)"));
}

TEST_CASE("stability: the same config and seed give bit-identical curves, f64 starts from f32's point",
          "[stability]") {
    const std::vector<std::string> sets{"epochs=5", "samples=128", "hidden=32", "seeds=[3, 4]", "plots=false"};
    StabilityRun a = stability(kSource + "/configs/stability.json", sets);
    StabilityRun b = stability(kSource + "/configs/stability.json", sets);
    REQUIRE(a.cli.status == 0);
    REQUIRE(b.cli.status == 0);
    for (const std::string id : {"rmsnorm_d2_lr0.001_s3", "layernorm_d2_lr0.001_s4"}) {
        const std::string curve = "/curves/" + id + ".csv";
        CHECK(read_text(a.run_dir() + curve) == read_text(b.run_dir() + curve));
    }
    // Seeds change the data and the init.
    CHECK(csv_column(a.run_dir() + "/curves/rmsnorm_d2_lr0.001_s3.csv", "loss")[0] !=
          csv_column(a.run_dir() + "/curves/rmsnorm_d2_lr0.001_s4.csv", "loss")[0]);
    // f64 runs draw in f32 and convert, so the first loss agrees with f32's to f32 precision.
    std::vector<std::string> f64 = sets;
    f64.push_back("dtype=f64");
    StabilityRun c = stability(kSource + "/configs/stability.json", f64);
    REQUIRE(c.cli.status == 0);
    const double l32 = csv_column(a.run_dir() + "/curves/rmsnorm_d2_lr0.001_s3.csv", "loss")[0];
    const double l64 = csv_column(c.run_dir() + "/curves/rmsnorm_d2_lr0.001_s3.csv", "loss")[0];
    CHECK(std::fabs(l32 - l64) <= 1e-5 * l64);
    CHECK(l32 != l64);
}

TEST_CASE("stability: bad input is one error line, exit code 2, and no run directory", "[stability]") {
    const std::string config = kSource + "/configs/stability.json";
    struct Case {
        std::string name;
        std::string args;
        std::string expected;
    };
    const std::string dir = make_temp_dir("stability-bad");
    std::ofstream(dir + "/malformed.json") << "{\"epochs\": 3,,}";
    std::ofstream(dir + "/list.json") << "[1, 2]";
    const std::vector<Case> cases{
        {"missing config", "stability no_such.json", "no_such.json: cannot open config file"},
        {"malformed JSON", "stability malformed.json", "malformed.json: malformed JSON at byte"},
        {"not an object", "stability list.json", "list.json"},
        {"unknown key", "stability " + shell_arg(config) + " --set epoch=3", "/epoch: unknown key (did you mean 'epochs'?)"},
        {"wrong type", "stability " + shell_arg(config) + " --set lrs=fast", "/lrs: expected a number"},
        {"out of range", "stability " + shell_arg(config) + " --set epochs=0", "/epochs: expected an integer"},
        {"unknown norm", "stability " + shell_arg(config) + " --set norms=batchnorm", "/norms: expected one of"},
        {"duplicate seed", "stability " + shell_arg(config) + " --set seeds=[1,1]", "/seeds: lists the value 1 twice"},
        {"the moved fused", "stability " + shell_arg(config) + " --set fused=false",
         "/fused: moved: set /norm/fused (--set norm.fused=...)"},
        {"the moved norm_eps", "stability " + shell_arg(config) + " --set norm_eps=1e-6",
         "/norm_eps: moved: set /norm/eps (--set norm.eps=...)"},
        {"a norm type in /norm", "stability " + shell_arg(config) + " --set norm.type=rmsnorm",
         "/norm/type: the norm types of this job are the list /norms"},
        {"a norm option out of range", "stability " + shell_arg(config) + " --set norm.p=0",
         "/norm/p: expected a number in (0, 1], got 0"},
        {"missing init_from", "stability " + shell_arg(config) + " --set init_from=nope.safetensors", "nope.safetensors"},
        {"init_from of the wrong norm",
         "stability " + shell_arg(config) + " --set norms=layernorm --set " +
             shell_arg("init_from=" + kFixtures + "stability_init_rmsnorm.safetensors"),
         "missing key(s) 'norm1.bias' ([256] f32), 'norm2.bias' ([256] f32)"},
        {"init_from of the wrong shape",
         "stability " + shell_arg(config) + " --set hidden=128 --set " +
             shell_arg("init_from=" + kFixtures + "stability_init_{norm}.safetensors"),
         "shape mismatch for 'fc1.weight'"},
        {"data_from of the wrong shape",
         "stability " + shell_arg(config) + " --set samples=500 --set " +
             shell_arg("data_from=" + kFixtures + "stability_data.safetensors"),
         "expected x [500, 100] and y [500, 10]"},
        {"data_from without x", "stability " + shell_arg(config) + " --set " +
                                    shell_arg("data_from=" + kFixtures + "linear.safetensors"),
         "'x'"},
    };
    for (const Case& c : cases) {
        INFO(c.name);
        CliRun run = run_normlab_in(dir, c.args + " --out run");
        INFO(run.output);
        CHECK(run.status == 2);
        CHECK_THAT(run.output, Catch::StartsWith("normlab: error: ") && Catch::Contains(c.expected));
        CHECK(std::count(run.output.begin(), run.output.end(), '\n') == 1);  // one line
        CHECK_FALSE(file_exists(dir + "/run/config.json"));                   // validated before any work
    }
}

TEST_CASE("stability: an existing run directory needs --force", "[stability]") {
    const std::vector<std::string> sets{"epochs=2", "samples=32", "hidden=8", "norms=rmsnorm", "plots=false"};
    StabilityRun first = stability(kSource + "/configs/stability.json", sets);
    REQUIRE(first.cli.status == 0);
    std::string args = "stability " + shell_arg(kSource + "/configs/stability.json");
    for (const std::string& set : sets) args += " --set " + shell_arg(set);
    CliRun again = run_normlab_in(first.dir, args + " --out run --quiet");
    CHECK(again.status == 2);
    CHECK_THAT(again.output, Catch::Contains("already exists") && Catch::Contains("--force"));
    CliRun forced = run_normlab_in(first.dir, args + " --out run --quiet --force");
    INFO(forced.output);
    CHECK(forced.status == 0);
    CHECK(file_exists(first.run_dir() + "/summary.json"));
}

TEST_CASE("stability: --jobs 2 gives --jobs 1's curves, runs.csv and summary bit for bit, with a record per run",
          "[stability]") {
    const std::string config = kSource + "/configs/stability.json";
    // One run at a time on one thread (OMP_NUM_THREADS=1 fixes the governor's count) against two at
    // once, each on one thread: the late epochs' bits depend on the thread count, not on --jobs.
    StabilityRun two = stability(config, kParallelSets, "--out run --jobs 2");
    INFO(two.cli.output);
    REQUIRE(two.cli.status == 0);
    CHECK_THAT(two.cli.output, Catch::Contains("8 runs") && Catch::Contains("2 at once"));
    std::string args = "stability " + shell_arg(config);
    for (const std::string& set : kParallelSets) args += " --set " + shell_arg(set);
    const CliRun single = run_normlab_env(two.dir, "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive ",
                                          args + " --out single --quiet --jobs 1");
    INFO(single.output);
    REQUIRE(single.status == 0);
    check_same_outputs(two.dir + "/single", two.run_dir());
    const nlohmann::json summary = read_json(two.run_dir() + "/summary.json");
    REQUIRE(summary["runs"].size() == 8);
    int diverged = 0;
    for (size_t i = 0; i < 8; ++i) {
        diverged += summary["runs"][i]["diverged"].get<bool>();
        CHECK(file_exists(two.run_dir() + "/runs/" + std::to_string(i) + "/result.json"));
    }
    CHECK(diverged == 4);  // the records carry a diverged run's epoch and curves too
}

TEST_CASE("stability: interrupted after two runs and resumed, the outputs equal an uninterrupted run's",
          "[stability]") {
    const std::string config = kSource + "/configs/stability.json";
    const std::string dir = make_temp_dir("stability-resume");
    // In this process: two runs at once (one thread each); the first epoch of run 2 throws, so the
    // runs in flight (0 and 1) finish with their records and no other run starts.
    nl::StabilityJob job;
    job.config_path = config;
    job.overrides = kParallelSets;
    job.out = dir + "/run";
    job.jobs = 2;
    nl::StabilityCallbacks callbacks;
    const std::set<std::string> first_two{"rmsnorm_d2_lr0.001_s1", "rmsnorm_d2_lr0.001_s2"};
    callbacks.on_epoch = [&](const nl::StabilityEpoch& e) {
        if (!first_two.count(e.run_id)) throw std::runtime_error("interrupted at " + e.run_id);
    };
    // Runs 2 and 3 start side by side once 0 and 1 are done: either may be the first to throw.
    CHECK_THROWS_WITH(nl::run_stability(job, callbacks), Catch::Contains("interrupted at rmsnorm_d2_lr100_s"));
    const std::string run = dir + "/run";
    CHECK_THAT(read_text(run + "/error.txt"), Catch::Contains("interrupted at"));
    CHECK_FALSE(file_exists(run + "/summary.json"));
    REQUIRE(file_exists(run + "/runs/0/result.json"));
    REQUIRE(file_exists(run + "/runs/1/result.json"));
    for (int i = 2; i < 8; ++i) CHECK_FALSE(file_exists(run + "/runs/" + std::to_string(i) + "/result.json"));
    const std::string record0 = read_text(run + "/runs/0/result.json");

    std::string args = "stability " + shell_arg(config);
    for (const std::string& set : kParallelSets) args += " --set " + shell_arg(set);
    // A changed config, --force with --resume, and a directory without a run are refused.
    const CliRun changed = run_normlab_in(dir, args + " --set epochs=13 --out run --resume");
    CHECK(changed.status == 2);
    CHECK_THAT(changed.output, Catch::Contains("--resume: this config differs from"));
    const CliRun forced = run_normlab_in(dir, args + " --out run --resume --force");
    CHECK(forced.status == 2);
    CHECK_THAT(forced.output, Catch::Contains("--resume and --force cannot be combined"));
    const CliRun nothing = run_normlab_in(dir, args + " --out nothing --resume");
    CHECK(nothing.status == 2);
    CHECK_THAT(nothing.output, Catch::Contains("holds no stability run"));
    CHECK_FALSE(file_exists(run + "/summary.json"));

    const CliRun resumed = run_normlab_in(dir, args + " --out run --resume --jobs 2");
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    CHECK_THAT(resumed.output, Catch::Contains("(2 runs already done)"));
    CHECK(read_text(run + "/runs/0/result.json") == record0);  // read back, not run again (its seconds too)
    CHECK_FALSE(file_exists(run + "/error.txt"));
    const CliRun whole = run_normlab_in(dir, args + " --out whole --quiet --jobs 2");
    INFO(whole.output);
    REQUIRE(whole.status == 0);
    check_same_outputs(dir + "/whole", run);
    CHECK(read_text(dir + "/whole/config.json") == read_text(run + "/config.json"));
}
