// The train job in f64 against PyTorch step for step (tests/reference/fixtures/train_replay_f64.safetensors,
// made by make_fixtures.py's fixture_train_replay with examples/python/torch_replay.py): every case
// trains in normlab and every step's loss and grad norm, and every probe of the probed steps, must
// equal PyTorch's to 1e-9 relative. Also
// the replayable run's files (train.save_initial, train.save_batches), optim.decay and
// weight_decay_mode, and train.dtype's bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/safetensors.h"
#include "jobs/data.h"
#include "jobs/probes.h"
#include "jobs/train.h"
#include "jobs/train_config.h"
#include "layers/checkpoint.h"
#include "layers/transformer.h"
#include "optim/adam.h"
#include "core/ops.h"
#include "test_util.h"

using namespace nl;

namespace {

const SafeTensorsFile& replays() {
    static const SafeTensorsFile f =
        load_safetensors(std::string(NORMLAB_SOURCE_DIR) + "/tests/reference/fixtures/train_replay_f64.safetensors");
    return f;
}

std::vector<std::string> replay_cases() {
    std::vector<std::string> out;
    std::stringstream in(replays().metadata.at("cases"));
    for (std::string item; std::getline(in, item, ',');) out.push_back(item);
    return out;
}

nlohmann::json case_config(const std::string& name) {
    return nlohmann::json::parse(replays().metadata.at("config." + name));
}

// Trains `config` in a fresh run directory under `dir`; returns every step.
std::vector<TrainStep> train(const nlohmann::json& config, const nl_test::TempDir& dir, const std::string& name) {
    TrainJob job;
    job.config = config;
    job.config_name = name;
    job.out = dir / name;
    return run_train(job).history;
}

double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

std::vector<std::string> split(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) out.push_back(item);
    return out;
}

// The worst relative difference of a normlab probes row against PyTorch's (the fixture's columns),
// by torch_replay.py's compare_probes rule: a parameter whose PyTorch gradient RMS is below 1e-6 of
// the step's largest has a gradient of rounding noise (0 in exact arithmetic), so its grad_rms is
// compared against that floor and its update_ratio not at all. Every column must be on both sides.
double worst_probe_difference(const ProbeValues& normlab, const std::vector<std::string>& columns,
                              const double* torch, std::string& where) {
    std::map<std::string, double> ours(normlab.begin(), normlab.end());
    REQUIRE(ours.size() == columns.size());
    double largest_grad = 0.0;
    for (size_t c = 0; c < columns.size(); ++c)
        if (columns[c].rfind("grad_rms.", 0) == 0) largest_grad = std::max(largest_grad, torch[c]);
    const double floor = 1e-6 * largest_grad;
    std::set<std::string> noise;
    for (size_t c = 0; c < columns.size(); ++c)
        if (columns[c].rfind("grad_rms.", 0) == 0 && std::abs(torch[c]) < floor) noise.insert(columns[c].substr(9));
    double worst = 0.0;
    for (size_t c = 0; c < columns.size(); ++c) {
        const std::string& name = columns[c];
        INFO("probe " << name);
        REQUIRE(ours.count(name) == 1);
        const double a = ours[name], b = torch[c];
        double d = 0.0;
        if (name.rfind("grad_rms.", 0) == 0 && noise.count(name.substr(9)))
            d = std::abs(a - b) / floor;
        else if (name.rfind("update_ratio.", 0) == 0 && noise.count(name.substr(13)))
            continue;
        else if (std::isnan(a) || std::isnan(b))
            d = std::isnan(a) && std::isnan(b) ? 0.0 : INFINITY;
        else
            d = b != 0.0 ? relative(a, b) : std::abs(a);
        if (d >= worst) {
            worst = d;
            where = name;
        }
    }
    return worst;
}

}  // namespace

TEST_CASE("f64 training equals PyTorch's replay of the same run to 1e-9 at every step", "[train][replay]") {
    const std::vector<std::string> cases = replay_cases();
    REQUIRE(cases.size() >= 6);
    nl_test::TempDir dir("train_replay");
    for (const std::string& name : cases) {
        INFO("case " << name << ": " << case_config(name).dump());
        const std::vector<TrainStep> steps = train(case_config(name), dir, name);
        const Tensor& loss = replays().at(name + ".loss");
        const Tensor& grad_norm = replays().at(name + ".grad_norm");
        REQUIRE(static_cast<int64_t>(steps.size()) == loss.numel());
        double worst_loss = 0.0, worst_norm = 0.0;
        for (size_t i = 0; i < steps.size(); ++i) {
            worst_loss = std::max(worst_loss, relative(steps[i].train_loss, loss.data<double>()[i]));
            worst_norm = std::max(worst_norm, relative(steps[i].grad_norm, grad_norm.data<double>()[i]));
        }
        INFO("worst relative difference: loss " << worst_loss << ", grad norm " << worst_norm);
        CHECK(worst_loss <= 1e-9);
        CHECK(worst_norm <= 1e-9);
        // The probes (train.probe_every 3): every column of steps 3, 6 and 9 against PyTorch's.
        const std::vector<std::string> columns = split(replays().metadata.at("probes." + name));
        const std::vector<std::string> probe_steps = split(replays().metadata.at("probe_steps." + name));
        const Tensor& probes = replays().at(name + ".probes");  // (probed steps, columns)
        REQUIRE(probes.shape() == Shape{static_cast<int64_t>(probe_steps.size()), static_cast<int64_t>(columns.size())});
        REQUIRE(!probe_steps.empty());
        for (size_t r = 0; r < probe_steps.size(); ++r) {
            const int64_t step = std::stoll(probe_steps[r]);
            INFO("probed step " << step);
            std::string where;
            const double worst = worst_probe_difference(steps[static_cast<size_t>(step - 1)].probes, columns,
                                                        probes.data<double>() + r * columns.size(), where);
            INFO("worst probe difference " << worst << " (" << where << ")");
            CHECK(worst <= 1e-9);
        }
        // The run learned something: the comparison is of a moving trajectory, not of ten equal steps.
        CHECK(loss.data<double>()[loss.numel() - 1] < loss.data<double>()[0]);
    }
}

TEST_CASE("the same runs in f32 miss PyTorch's f64 losses by more than 1e-9", "[train][replay]") {
    // The f64 test above can fail: f32 rounding alone moves the loss past its tolerance.
    nl_test::TempDir dir("train_replay_f32");
    const std::string name = replay_cases().front();
    nlohmann::json config = case_config(name);
    config["train"]["dtype"] = "f32";
    const std::vector<TrainStep> steps = train(config, dir, name);
    const Tensor& loss = replays().at(name + ".loss");
    double worst = 0.0;
    for (size_t i = 0; i < steps.size(); ++i) worst = std::max(worst, relative(steps[i].train_loss, loss.data<double>()[i]));
    CHECK(worst > 1e-9);
    CHECK(worst < 1e-4);  // and it is the same run: the f32 run starts from the same weights
}

TEST_CASE("save_initial writes step 0's weights and save_batches every step's batch", "[train][replay]") {
    nl_test::TempDir dir("train_replay_files");
    nlohmann::json config = case_config(replay_cases().front());
    const std::vector<TrainStep> steps = train(config, dir, "run");
    const std::string run = dir / "run";

    // The initial checkpoint holds, in f64, the weights the f32 run of the same seed starts from.
    const TrainConfig parsed = read_train_config(config, "config");
    TransformerOptions options = parsed.model;
    REQUIRE(options.dtype == DType::F64);
    options.dtype = DType::F32;
    options.vocab_size = SyntheticTask(parsed.data).vocab_size();
    Transformer fresh(options);
    const SafeTensorsFile initial = load_safetensors(checkpoint_path(run, 0));
    for (const auto& [name, p] : fresh.named_parameters()) {
        INFO(name);
        const Tensor& saved = initial.at(name);
        REQUIRE(saved.dtype() == DType::F64);
        REQUIRE(saved.numel() == p.numel());
        const Tensor expected = p.data().contiguous();
        for (int64_t i = 0; i < saved.numel(); ++i)
            REQUIRE(saved.data<double>()[i] == static_cast<double>(expected.data<float>()[i]));
    }
    CHECK(read_checkpoint_info(checkpoint_path(run, 0)).step == 0);

    // The batches: [steps, batch, T] int64, the data stream's batches in order, -100 where ignored.
    const SafeTensorsFile batches = load_safetensors(run + "/" + kSavedBatchesFile);
    const Tensor& inputs = batches.at("inputs");
    const Tensor& targets = batches.at("targets");
    const int64_t B = config["train"]["batch_size"], S = config["train"]["steps"];
    REQUIRE(inputs.dtype() == DType::I64);
    REQUIRE(inputs.shape() == Shape{S, B, data_seq_len(parsed.data)});
    REQUIRE(targets.shape() == inputs.shape());
    SyntheticTask task(parsed.data);
    Generator gen(training_stream_seed(parsed.data));
    int64_t ignored = 0;
    for (int64_t s = 0; s < S; ++s) {
        const Batch batch = task.train_batch(B, gen);
        const int64_t n = batch.inputs.numel();
        for (int64_t i = 0; i < n; ++i) {
            REQUIRE(inputs.data<int64_t>()[s * n + i] == batch.inputs.data<int64_t>()[i]);
            REQUIRE(targets.data<int64_t>()[s * n + i] == batch.targets.data<int64_t>()[i]);
            ignored += targets.data<int64_t>()[s * n + i] == -100;
        }
    }
    CHECK(ignored > 0);  // the reversal task scores the answer only
    CHECK(steps.size() == static_cast<size_t>(S));
}

TEST_CASE("optim.decay matrices leaves vectors undecayed, and weight_decay_mode independent divides by the peak lr",
          "[train][replay]") {
    OptimConfig optim;
    optim.lr = 0.01;
    optim.weight_decay = 0.1;
    CHECK(parameter_weight_decay(optim, 1) == 0.1);
    CHECK(parameter_weight_decay(optim, 2) == 0.1);
    optim.decay = "matrices";
    CHECK(parameter_weight_decay(optim, 1) == 0.0);
    CHECK(parameter_weight_decay(optim, 2) == 0.1);
    optim.weight_decay_mode = "independent";
    CHECK(parameter_weight_decay(optim, 2) == 0.1 / 0.01);
    CHECK(parameter_weight_decay(optim, 1) == 0.0);
    optim.lr = 0.0;  // nothing moves at lr 0, the decay included
    CHECK(parameter_weight_decay(optim, 2) == 0.0);


    // AdamW's per-parameter decay: with a zero gradient only the decay moves a parameter, so the one
    // named in weight_decay_of with 0 keeps its value and the other shrinks by 1 - lr * wd.
    Var decayed(from_vector(std::vector<double>{2.0, -4.0}, Shape{2}, DType::F64), true);
    Var kept(from_vector(std::vector<double>{2.0, -4.0}, Shape{2}, DType::F64), true);
    AdamOptions options;
    options.lr = 0.1;
    options.weight_decay = 0.5;
    options.weight_decay_of["kept"] = 0.0;
    AdamW adamw({{"decayed", decayed}, {"kept", kept}}, options);
    decayed.set_grad(Var(zeros({2}, DType::F64)));
    kept.set_grad(Var(zeros({2}, DType::F64)));
    adamw.step();
    CHECK(decayed.data().data<double>()[0] == 2.0 * (1.0 - 0.1 * 0.5));
    CHECK(kept.data().data<double>()[0] == 2.0);
    CHECK(kept.data().data<double>()[1] == -4.0);
}

TEST_CASE("train.dtype, save_batches, optim.decay and weight_decay_mode refuse bad input in one line", "[train][replay]") {
    const std::string dir = nl_test::make_temp_dir("replay_errors");
    auto run = [&](const std::string& sets) { return nl_test::train_toy_in(dir, sets); };
    auto check_error = [&](const nl_test::CliRun& r, const std::vector<std::string>& parts) {
        nl_test::check_one_line_error(r, dir, parts);
    };
    check_error(run("--set train.dtype=f64 --set train.autocast=bf16"), {"/train/dtype", "autocast", "bf16"});
    check_error(run("--set train.dtype=f16"), {"/train/dtype", "f16", "f32", "f64"});
    check_error(run("--set train.dtype=f64 --set train.grad_shards=2"), {"/train/dtype", "grad_shards 2"});
    check_error(run("--set train.dtype=f64 --set device=cuda"), {"/train/dtype", "CPU", "cuda"});
    check_error(run("--set optim.decay=some"), {"/optim/decay", "some", "matrices"});
    check_error(run("--set optim.weight_decay_mode=lrx"), {"/optim/weight_decay_mode", "lrx", "independent"});
    check_error(run("--set train.save_batches=true --set train.steps=100000000 --set train.batch_size=64"),
                {"/train/save_batches", "MiB", "/train/steps"});
}

TEST_CASE("train.dtype f64 holds for a model started from a transformers checkpoint", "[train][replay]") {
    // /model/init_from takes the file's architecture; the dtype stays the config's, the weights widened.
    nl_test::TempDir dir("train_replay_init_from");
    nlohmann::json config = case_config(replay_cases().front());
    config["model"] = {{"init_from", std::string(NORMLAB_SOURCE_DIR) + "/tests/reference/interop/hf_tiny"}};
    config["train"]["steps"] = 3;
    config["optim"]["warmup_steps"] = 1;
    const std::vector<TrainStep> steps = train(config, dir, "run");
    const SafeTensorsFile initial = load_safetensors(checkpoint_path(dir / "run", 0));
    const Tensor& wq = initial.at("layers.0.attention.wq.weight");
    REQUIRE(wq.dtype() == DType::F64);
    // Widened from the file's f32 values: each is a float exactly.
    for (int64_t i = 0; i < wq.numel(); ++i)
        REQUIRE(static_cast<double>(static_cast<float>(wq.data<double>()[i])) == wq.data<double>()[i]);
    // The losses are f64 computations: not all of them are floats.
    bool any_not_float = false;
    for (const TrainStep& t : steps)
        any_not_float = any_not_float || static_cast<double>(static_cast<float>(t.train_loss)) != t.train_loss;
    CHECK(any_not_float);
}
