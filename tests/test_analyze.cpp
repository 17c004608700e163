// `normlab analyze` (jobs/analyze.h): every field of analysis.json against transformers
// (tests/reference/analyze/, written by tests/reference/make_analyze.py), against normlab's own
// model run another way, the output directory and plots, and bad input.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "cli_test_util.h"
#include "jobs/analyze.h"
#include "jobs/interop.h"
#include "jobs/sample.h"
#include "jobs/train.h"
#include "layers/loss.h"
#include "test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using nl_test::TempDir;

namespace {

const std::string kFixtures = std::string(NORMLAB_SOURCE_DIR) + "/tests/reference/analyze";

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

void check_near(double ours, double theirs, double tolerance, const std::string& what) {
    INFO(what << ": normlab " << ours << ", transformers " << theirs);
    CHECK(std::abs(ours - theirs) <= tolerance * std::max(1.0, std::abs(theirs)));
}

// transformers' index of channel `c` of a q_norm or k_norm weight of `hd` channels: normlab keeps
// RoPE's interleaved pairs (2i + j), transformers its half split (j hd/2 + i) (jobs/interop.h).
int64_t hf_qk_channel(int64_t c, int64_t hd) { return (c % 2) * (hd / 2) + c / 2; }

// Every field against the expected file (transformers in float64, whose RoPE, RMSNorm and softmax
// are float32: agreement to ~1e-7 relative is what is possible; 1e-5 leaves room for that and none
// for a wrong definition, which moves these values by 1e-2 or more).
void check_against_transformers(const std::string& name, nl::HfArch arch, const std::string& dtype) {
    const json expected = json::parse(nl_test::read_text(kFixtures + "/expected_" + name + ".json"));
    nl::AnalyzeOptions o;
    o.model = kFixtures + "/" + name;
    o.tokens = kFixtures + "/tokens";
    o.windows = expected["windows"].get<int64_t>();
    o.seq_len = expected["seq_len"].get<int64_t>();
    o.dtype = dtype;
    const json a = nl::run_analyze(o).analysis;
    INFO(name << " in " << dtype);
    check_near(a["loss"].get<double>(), expected["loss"].get<double>(), 1e-6, "loss");
    REQUIRE(a["layers"].size() == expected["layers"].size());
    for (size_t l = 0; l < a["layers"].size(); ++l) {
        const json& ours = a["layers"][l];
        const json& theirs = expected["layers"][l];
        const std::string at = "layer " + std::to_string(l) + " ";
        check_near(ours["act_max"].get<double>(), theirs["act_max"].get<double>(), 1e-5, at + "act_max");
        CHECK(ours["act_max_channel"] == theirs["act_max_channel"]);
        check_near(ours["act_kurtosis"].get<double>(), theirs["act_kurtosis"].get<double>(), 1e-5, at + "act_kurtosis");
        check_near(ours["drop_delta_loss"].get<double>(), theirs["drop_delta_loss"].get<double>(), 1e-5,
                   at + "drop_delta_loss");
        REQUIRE(ours["attn_sink"].size() == theirs["attn_sink"].size());
        REQUIRE(ours["attn_entropy"].size() == theirs["attn_entropy"].size());
        for (size_t h = 0; h < ours["attn_sink"].size(); ++h) {
            check_near(ours["attn_sink"][h].get<double>(), theirs["attn_sink"][h].get<double>(), 1e-6,
                       at + "attn_sink head " + std::to_string(h));
            check_near(ours["attn_entropy"][h].get<double>(), theirs["attn_entropy"][h].get<double>(), 1e-6,
                       at + "attn_entropy head " + std::to_string(h));
        }
    }
    REQUIRE(a["norms"].size() == expected["norms"].size());
    for (size_t i = 0; i < a["norms"].size(); ++i) {
        const json& ours = a["norms"][i];
        const json& theirs = expected["norms"][i];
        const std::string ours_name = ours["name"].get<std::string>();
        CHECK(nl::hf_weight_name(ours_name + ".weight", arch) == theirs["hf_name"]);
        check_near(ours["weight_max_abs"].get<double>(), theirs["weight_max_abs"].get<double>(), 1e-7, ours_name);
        check_near(ours["weight_mean_abs"].get<double>(), theirs["weight_mean_abs"].get<double>(), 1e-7, ours_name);
        const bool qk = ours_name.find("q_norm") != std::string::npos || ours_name.find("k_norm") != std::string::npos;
        const int64_t channels = ours["channels"].get<int64_t>();
        REQUIRE(ours["weight_top_channels"].size() == theirs["weight_top_channels"].size());
        for (size_t k = 0; k < ours["weight_top_channels"].size(); ++k) {
            const int64_t c = ours["weight_top_channels"][k].get<int64_t>();
            CHECK((qk ? hf_qk_channel(c, channels) : c) == theirs["weight_top_channels"][k].get<int64_t>());
        }
    }
}

// A small text model trained for a few steps, as a run directory under `dir`.
std::string train_text_run(const TempDir& dir, const std::string& name, const json& model_overrides) {
    const std::string text = dir / "text.txt";
    if (!fs::exists(text))
        write_text(text, "the sink is where attention goes when it has nowhere else to go; the norm decides how far.\n");
    json model = {{"dim", 16}, {"n_layers", 3}, {"n_heads", 4}, {"n_kv_heads", 2}, {"multiple_of", 8}, {"max_seq_len", 16}};
    model.merge_patch(model_overrides);
    nl::TrainJob job;
    job.config = {{"data", {{"source", "text"}, {"path", text}, {"seq_len", 12}, {"eval_sequences", 2}, {"val_fraction", 0.3}}},
                  {"model", model},
                  {"optim", {{"warmup_steps", 0}, {"lr", 0.02}}},
                  {"train", {{"steps", 6}, {"batch_size", 4}, {"eval_every", 0}}}};
    job.config_name = name;
    job.out = dir / name;
    REQUIRE(nl::run_train(job).complete);
    return job.out;
}

// The mean cross-entropy of `model` over windows of ids (N, T + 1), by Transformer::forward.
double mean_loss(nl::Transformer& model, const std::vector<std::vector<int64_t>>& windows) {
    nl::NoGradGuard no_grad;
    double total = 0.0;
    int64_t count = 0;
    for (const auto& w : windows) {
        const int64_t T = static_cast<int64_t>(w.size()) - 1;
        const nl::Tensor ids = nl::from_vector(std::vector<int64_t>(w.begin(), w.end() - 1), {1, T});
        const nl::Tensor targets = nl::from_vector(std::vector<int64_t>(w.begin() + 1, w.end()), {1, T});
        total += nl::cross_entropy_loss(model.forward(ids), targets, -100, nl::Reduction::Sum).item();
        count += T;
    }
    return total / static_cast<double>(count);
}

}  // namespace

TEST_CASE("analyze: every field matches transformers on a Qwen3 with its own head_dim and a planted massive channel (tests/reference/analyze)", "[analyze][reference]") {
    check_against_transformers("qwen3_planted", nl::HfArch::Qwen3, "f64");
    check_against_transformers("qwen3_planted", nl::HfArch::Qwen3, "f32");
    // The planted channel is found: block 1's output and everything after it carry channel 13
    // about 40 times larger than the others, which the kurtosis sees.
    nl::AnalyzeOptions o;
    o.model = kFixtures + "/qwen3_planted";
    o.tokens = kFixtures + "/tokens";
    o.windows = 4;
    o.seq_len = 16;
    const json a = nl::run_analyze(o).analysis;
    CHECK(a["architecture"]["head_dim"] == 16);
    CHECK(a["architecture"]["dim"] == 32);
    for (int l : {1, 2}) {
        CHECK(a["layers"][l]["act_max_channel"] == 13);
        CHECK(a["layers"][l]["act_kurtosis"].get<double>() > 10.0);
    }
    CHECK(a["layers"][0]["act_kurtosis"].get<double>() < 2.0);
}

TEST_CASE("analyze: every field matches transformers on a LLaMA (tests/reference/analyze)", "[analyze][reference]") {
    check_against_transformers("llama", nl::HfArch::Llama, "f64");
    check_against_transformers("llama", nl::HfArch::Llama, "f32");
}

TEST_CASE("analyze: a normlab run's loss, dropped block and sinks agree with the model run another way", "[analyze]") {
    TempDir dir("analyze_run");
    const std::string run = train_text_run(dir, "pre", json::object());
    nl::AnalyzeOptions o;
    o.model = run;
    o.text = dir / "text.txt";
    o.windows = 3;
    o.seq_len = 12;
    o.dtype = "f64";
    const json a = nl::run_analyze(o).analysis;
    CHECK(a["format"] == "normlab");
    CHECK(a["seq_len"] == 12);

    // The same windows by hand: the text's first 3 * 13 characters as the vocab's ids.
    nl::TrainCheckpoint ck = nl::load_train_checkpoint(run);
    ck.model->to(nl::DType::F64);
    const std::vector<int64_t> ids = ck.vocab->encode(nl_test::read_text(dir / "text.txt").substr(0, 39));
    std::vector<std::vector<int64_t>> windows;
    for (int w = 0; w < 3; ++w) windows.emplace_back(ids.begin() + w * 13, ids.begin() + (w + 1) * 13);
    const double loss = mean_loss(*ck.model, windows);
    CHECK(a["loss"].get<double>() == Approx(loss).epsilon(1e-12));

    // Dropping the last block is the same model with two blocks: its weights, minus the last layer's.
    nl::TransformerOptions two = ck.model->options();
    two.n_layers = 2;
    nl::Transformer shorter(two);
    shorter.to(nl::DType::F64);
    nl::NamedTensors weights;
    for (const auto& [name, tensor] : ck.model->state_dict())
        if (name.rfind("layers.2.", 0) != 0) weights.push_back({name, tensor});
    shorter.load_state_dict(weights);
    CHECK(a["layers"][2]["drop_delta_loss"].get<double>() == Approx(mean_loss(shorter, windows) - loss).margin(1e-12));

    // The per-head sinks average to the train probes' sink of the same forward (one window).
    const json one = nl::analyze_windows(*ck.model, {windows[0]});
    ck.model->set_probing(true);
    {
        nl::NoGradGuard no_grad;
        ck.model->forward(nl::from_vector(std::vector<int64_t>(windows[0].begin(), windows[0].end() - 1), {1, 12}));
    }
    ck.model->set_probing(false);
    const nl::Transformer::Probes probes = ck.model->last_probes();
    for (int l = 0; l < 3; ++l) {
        double sink = 0.0, entropy = 0.0;
        for (int h = 0; h < 4; ++h) {
            sink += one["layers"][l]["attn_sink"][h].get<double>() / 4.0;
            entropy += one["layers"][l]["attn_entropy"][h].get<double>() / 4.0;
        }
        CHECK(sink == Approx(probes.attention[l].sink).epsilon(1e-12));
        CHECK(entropy == Approx(probes.attention[l].entropy).epsilon(1e-12));
        CHECK(one["layers"][l]["act_max"].get<double>() == Approx(probes.residual[l].max_abs).epsilon(1e-12));
    }
}

TEST_CASE("analyze: `normlab analyze` writes analysis.json and plots.gp, with the convert check on a LayerNorm model", "[analyze][cli]") {
    TempDir dir("analyze_cli");
    train_text_run(dir, "ln", {{"norm", {{"type", "layernorm"}, {"bias", false}}}});
    nl_test::CliRun r = nl_test::run_normlab_in(dir.path, "analyze ln --text text.txt --windows 2 --seq-len 10 "
                                                          "--convert-check --out az");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.output, Catch::Contains("(normlab, 3 blocks") && Catch::Contains("2 windows of 10 tokens") &&
                             Catch::Contains("convert check: LayerNorm -> RMSNorm"));
    const json a = json::parse(nl_test::read_text(dir / "az/analysis.json"));
    for (const char* key : {"model", "format", "tokens", "windows", "seq_len", "dtype", "architecture", "loss", "layers",
                            "norms", "convert_check", "timing", "seconds"})
        CHECK(a.contains(key));
    CHECK(a["layers"].size() == 3);
    CHECK(a["layers"][0]["attn_sink"].size() == 4);
    CHECK(a["norms"].size() == 7);  // two per block and the final norm
    CHECK(a["norms"][0]["name"] == "layers.0.attention_norm");
    CHECK(a["norms"][0]["type"] == "layernorm");
    // The conversion is exact in exact arithmetic: in f32 the logits agree to rounding.
    CHECK(a["convert_check"]["max_abs_logit_diff"].get<double>() < 1e-4 * a["convert_check"]["max_abs_logit"].get<double>());
    CHECK(std::abs(a["convert_check"]["loss_diff"].get<double>()) < 1e-5);
    const std::string plots = nl_test::read_text(dir / "az/plots.gp");
    CHECK_THAT(plots, Catch::Contains("$layers << EOD") && Catch::Contains("$sink << EOD") &&
                          Catch::Contains("set output 'attn_sink.png'") && Catch::Contains("set output 'drop_block.png'"));
    if (std::system("command -v gnuplot >/dev/null 2>&1") == 0)
        for (const char* png : {"act_max.png", "act_kurtosis.png", "drop_block.png", "attn_sink.png"})
            CHECK(fs::file_size(fs::path(dir / "az") / png) > 1000);
    // The directory exists now: again without --force is refused, with it replaced.
    r = nl_test::run_normlab_in(dir.path, "analyze ln --text text.txt --windows 1 --seq-len 10 --out az");
    CHECK(r.status == 2);
    CHECK_THAT(r.output, Catch::Contains("az exists (--force replaces it)"));
    r = nl_test::run_normlab_in(dir.path, "analyze ln --text text.txt --windows 1 --seq-len 10 --out az --force");
    CHECK(r.status == 0);
    const json again = json::parse(nl_test::read_text(dir / "az/analysis.json"));
    CHECK(again["windows"] == 1);
    CHECK_FALSE(again.contains("convert_check"));
}

TEST_CASE("analyze: mistakes are one line and exit 2, before the weights are read, and write nothing", "[analyze][cli]") {
    TempDir dir("analyze_bad");
    const std::string qwen = kFixtures + "/qwen3_planted", tokens = kFixtures + "/tokens";
    const auto refused = [&](const std::string& args, const std::vector<std::string>& parts) {
        const nl_test::CliRun r = nl_test::run_normlab_in(dir.path, "analyze " + args + " --out az");
        INFO(args << "\n" << r.output);
        CHECK(r.status == 2);
        CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
        for (const std::string& part : parts) CHECK_THAT(r.output, Catch::Contains(part));
        CHECK_FALSE(fs::exists(dir / "az"));
    };
    // A path that holds no model.
    fs::create_directories(dir / "empty");
    refused("empty --tokens " + tokens, {"empty"});
    // Token files shorter than the windows asked: 4 windows of 17 + 7 ids are there, 5 are not.
    refused(qwen + " --tokens " + tokens + " --windows 5 --seq-len 16", {"val.bin", "5 windows of 16 + 1 tokens need 85 ids",
                                                                         "holds 75"});
    // A token id beyond the model's vocabulary (64 ids): id 64 at index 3.
    fs::create_directories(dir / "big");
    {
        std::ofstream out(dir / "big/val.bin", std::ios::binary);
        for (uint16_t id : std::vector<uint16_t>{1, 2, 3, 64, 5, 6}) out.write(reinterpret_cast<const char*>(&id), 2);
    }
    refused(qwen + " --tokens big --windows 1 --seq-len 4", {"id 64 at index 3", "vocab_size 64"});
    // An architecture normlab cannot express: the key is named.
    fs::create_directories(dir / "biased");
    json config = json::parse(nl_test::read_text(qwen + "/config.json"));
    config["attention_bias"] = true;
    write_text(dir / "biased/config.json", config.dump());
    fs::copy_file(qwen + "/model.safetensors", dir / "biased/model.safetensors");
    refused("biased --tokens " + tokens, {"attention_bias"});
    // A safetensors file that lies about its sizes: cut short, its header names bytes it lacks.
    fs::create_directories(dir / "short");
    fs::copy_file(qwen + "/config.json", dir / "short/config.json");
    const std::string weights = nl_test::read_text(qwen + "/model.safetensors");
    write_text(dir / "short/model.safetensors", weights.substr(0, weights.size() - 100));
    refused("short --tokens " + tokens + " --windows 1 --seq-len 8", {"short/model.safetensors"});
    // A GGUF file cut short: its tensor table names bytes the file lacks.
    const std::string gguf = nl_test::read_text(std::string(NORMLAB_SOURCE_DIR) + "/tests/reference/interop/normlab_char.gguf");
    write_text(dir / "short.gguf", gguf.substr(0, gguf.size() - 100));
    refused("short.gguf --tokens " + tokens + " --windows 1 --seq-len 8", {"short.gguf"});
    // --text for a model whose ids are not characters; a sequence longer than the model's context.
    write_text(dir / "t.txt", "some text");
    refused(qwen + " --text t.txt", {"--text needs a model with a character tokenizer"});
    refused(qwen + " --tokens " + tokens + " --seq-len 100", {"--seq-len 100 exceeds the model's max_seq_len 64"});
    refused(qwen + " --tokens " + tokens + " --windows 0", {"--windows must be in [1, 100000], got 0"});
    refused(qwen + " --tokens " + tokens + " --dtype f16", {"--dtype must be f32, bf16 or f64, got 'f16'"});
    refused(qwen + " --tokens " + tokens + " --token-dtype int8", {"--token-dtype must be uint16 or uint32, got 'int8'"});
    // A meta.json whose dtype is not a token dtype names the file and the key.
    fs::create_directories(dir / "meta");
    fs::copy_file(tokens + "/val.bin", dir / "meta/val.bin");
    write_text(dir / "meta/meta.json", "{\"dtype\": 16}");
    refused(qwen + " --tokens meta --windows 1 --seq-len 8", {"meta/meta.json", "/dtype"});
    refused(qwen + " --tokens " + tokens + " --text t.txt", {"exactly one of --tokens DIR and --text FILE"});
    // --convert-check on a model without LayerNorms names the key.
    refused(qwen + " --tokens " + tokens + " --windows 1 --seq-len 8 --convert-check", {"/model/norm/type"});
}
