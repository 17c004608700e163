// The LayerNorm -> RMSNorm conversion (jobs/convert.h, Jiang et al. 2023): the converted pre-norm
// model gives the LayerNorm model's logits to f64 rounding in f64, to f32 rounding in f32, and the same
// greedy tokens; `normlab convert` on a trained run writes a checkpoint that `normlab sample` and
// `normlab export` read and that samples the same text; each refusal names what it refuses.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "cli_test_util.h"
#include "core/error.h"
#include "core/ops.h"
#include "jobs/convert.h"
#include "jobs/generate.h"
#include "jobs/sample.h"
#include "jobs/train.h"
#include "jobs/train_config.h"
#include "layers/checkpoint.h"
#include "layers/migrate.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nl_test::TempDir;
using nlohmann::json;

namespace {

// Several layers, grouped-query attention, a LayerNorm without bias.
nl::TransformerOptions layernorm_options(nl::DType dtype) {
    nl::TransformerOptions o;
    o.vocab_size = 23;
    o.dim = 32;
    o.n_layers = 3;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.multiple_of = 8;
    o.max_seq_len = 32;
    o.rope_theta = 500.0;
    o.norm.type = "layernorm";
    o.norm.bias = false;
    o.norm.eps = 1e-5;
    o.dtype = dtype;
    o.seed = 3;
    return o;
}

// A model the conversion has work to do on: norm weights 1 + 0.5 N(0, 1) (some negative), and a
// mean added to every embedding row and every column of wo and w2, so the residual stream is far
// from zero-mean and an RMSNorm put in without re-centering computes something else.
std::unique_ptr<nl::Transformer> layernorm_model(const nl::TransformerOptions& o) {
    auto model = std::make_unique<nl::Transformer>(o);
    nl::Generator gen(17);
    nl::NamedTensors state;
    for (const auto& [name, t] : model->state_dict()) {
        std::vector<double> v = t.to_vector();
        std::vector<double> noise(v.size());
        gen.fill_normal(noise.data(), int64_t(noise.size()));
        const bool norm = name.find("norm") != std::string::npos;
        const bool writer = name == "tok_embeddings.weight" || name.find("wo.weight") != std::string::npos ||
                            name.find("w2.weight") != std::string::npos;
        for (size_t i = 0; i < v.size(); ++i) {
            if (norm) v[i] = 1.0 + 0.5 * noise[i];
            if (writer) v[i] += 0.5 + 0.1 * noise[i];
        }
        state.push_back({name, nl::from_vector(v, t.shape(), t.dtype())});
    }
    model->load_state_dict(state);
    return model;
}

// The same weights in another dtype.
std::unique_ptr<nl::Transformer> in_dtype(const nl::Transformer& model, nl::DType dtype) {
    nl::TransformerOptions o = model.options();
    o.dtype = dtype;
    auto out = std::make_unique<nl::Transformer>(o);
    nl::NamedTensors state;
    for (const auto& [name, t] : model.state_dict()) state.push_back({name, t.to(dtype)});
    out->load_state_dict(state);
    return out;
}

nl::Tensor some_ids(int64_t batch, int64_t length, int64_t vocab) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < batch * length; ++i) ids.push_back((7 * i + 3 * (i / length) + 1) % vocab);
    return nl::from_vector(ids, {batch, length});
}

nl::Tensor logits_of(nl::Transformer& model, const nl::Tensor& ids) {
    nl::NoGradGuard no_grad;
    return model.forward(ids).data().to(nl::DType::F64).contiguous();
}

// max |a - b| / max |b|.
double relative_difference(const nl::Tensor& a, const nl::Tensor& b) {
    REQUIRE(a.shape() == b.shape());
    const std::vector<double> x = a.to_vector(), y = b.to_vector();
    double diff = 0, scale = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        diff = std::max(diff, std::abs(x[i] - y[i]));
        scale = std::max(scale, std::abs(y[i]));
    }
    return diff / scale;
}

// Greedy continuations of a few prompts.
std::vector<std::vector<int64_t>> greedy(nl::Transformer& model) {
    std::vector<std::vector<int64_t>> tokens = {{1, 2, 3}, {5, 20, 9}, {22, 0, 14}, {11, 11, 4}};
    nl::Generator gen(0);
    nl::GenerateOptions options;
    options.context = model.options().max_seq_len;
    options.temperature = 0.0;
    nl::generate(model, tokens, 16, options, gen);
    return tokens;
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

// A tiny character-level run of `steps` steps with a LayerNorm model: its run directory.
std::string train_run(const TempDir& dir, const std::string& name, const json& model_overrides, int64_t steps = 4) {
    const std::string text = dir / "text.txt";
    if (!fs::exists(text))
        write_text(text, "hello world, hello normlab. the layer norm becomes an rms norm; hello again, world.\n");
    json model = {{"dim", 16}, {"n_layers", 2}, {"n_heads", 4}, {"n_kv_heads", 2}, {"multiple_of", 8},
                  {"max_seq_len", 16}, {"norm", {{"type", "layernorm"}, {"bias", false}}}};
    model.merge_patch(model_overrides);
    nl::TrainJob job;
    job.config = {{"data", {{"source", "text"}, {"path", text}, {"seq_len", 12}, {"eval_sequences", 2}, {"val_fraction", 0.3}}},
                  {"model", model},
                  {"optim", {{"warmup_steps", 0}, {"lr", 0.02}}},
                  {"train", {{"steps", steps}, {"batch_size", 4}, {"eval_every", 0}}}};
    job.config_name = name;
    job.out = dir / name;
    REQUIRE(nl::run_train(job).complete);
    return job.out;
}

// What `normlab sample` printed before its speed line ("sample: N tokens in ...", on stderr after
// the text).
std::string sampled_text(const std::string& output) {
    const size_t speed = output.rfind("sample: ");
    REQUIRE(speed != std::string::npos);
    return output.substr(0, speed);
}

// One line on stderr, "normlab: error: ...", exit 2.
void require_one_line_error(const nl_test::CliRun& r, const std::string& contains) {
    INFO(r.output);
    CHECK(r.status == 2);
    CHECK_THAT(r.output, Catch::StartsWith("normlab: error: ") && Catch::Contains(contains));
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
}

}  // namespace

TEST_CASE("convert: a pre-norm LayerNorm model becomes an RMSNorm model with the same logits in f64", "[convert]") {
    auto ln = layernorm_model(layernorm_options(nl::DType::F64));
    const nl::NamedTensors before = ln->state_dict();
    std::vector<std::vector<double>> before_values;
    for (const auto& [name, t] : before) before_values.push_back(t.to_vector());

    auto rms = nl::convert_to_rmsnorm(*ln);
    CHECK(rms->options().norm.type == "rmsnorm");
    CHECK(rms->options().norm.resolved_eps() == 1e-5);
    CHECK(rms->options().dtype == nl::DType::F64);
    CHECK(rms->layer(0)->attention_norm()->type_name() == "RMSNorm");
    CHECK(rms->layer(2)->ffn_norm()->type_name() == "RMSNorm");
    // The writers are re-centered: every embedding row and every column of wo and w2 has mean 0;
    // every other weight, the norms' included, is the LayerNorm model's, and no bias is left.
    const nl::NamedTensors after = rms->state_dict();
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) {
        const auto& [name, t] = after[i];
        INFO(name);
        REQUIRE(name == before[i].first);
        const int64_t axis = name == "tok_embeddings.weight" ? 1
                             : (name.find(".wo.") != std::string::npos || name.find(".w2.") != std::string::npos) ? 0
                                                                                                                  : -1;
        if (axis < 0) {
            CHECK(t.to_vector() == before_values[i]);
            continue;
        }
        CHECK(nl::max(nl::abs(nl::mean(t, {axis}))).item() < 1e-15);
        CHECK(t.to_vector() != before_values[i]);
    }

    const nl::Tensor ids = some_ids(3, 20, 23);
    const nl::Tensor expected = logits_of(*ln, ids);
    const double rel = relative_difference(logits_of(*rms, ids), expected);
    INFO("max relative difference " << rel);
    CHECK(rel < 1e-10);
    // The input model is unchanged.
    for (size_t i = 0; i < before.size(); ++i) CHECK(ln->state_dict()[i].second.to_vector() == before_values[i]);
    // Swapping the norms without re-centering (the article's migration) is not the same function:
    // the comparison above can fail.
    auto swapped = layernorm_model(layernorm_options(nl::DType::F64));
    nl::migrate_layernorm_to_rmsnorm(*swapped);
    CHECK(relative_difference(logits_of(*swapped, ids), expected) > 1e-2);
    // And the same greedy tokens, through the KV cache.
    CHECK(greedy(*rms) == greedy(*ln));
}

TEST_CASE("convert: a LayerNorm without weight becomes an RMSNorm without weight, and an all-zero bias is dropped", "[convert]") {
    const nl::Tensor ids = some_ids(2, 16, 23);
    nl::TransformerOptions o = layernorm_options(nl::DType::F64);
    o.norm.elementwise_affine = false;
    auto ln = layernorm_model(o);
    auto rms = nl::convert_to_rmsnorm(*ln);
    CHECK_FALSE(rms->options().norm.elementwise_affine);
    for (const auto& [name, t] : rms->state_dict()) CHECK(name.find("norm") == std::string::npos);
    CHECK(relative_difference(logits_of(*rms, ids), logits_of(*ln, ids)) < 1e-10);

    // bias true, at its init (zeros): LN(x) = RMSNorm(x) without it.
    o = layernorm_options(nl::DType::F64);
    o.norm.bias = true;
    ln = layernorm_model(o);  // its biases are norm parameters: set them to 0 again
    nl::NamedTensors zero_bias;
    for (const auto& [name, t] : ln->state_dict())
        zero_bias.push_back({name, name.find("bias") != std::string::npos ? nl::zeros_like(t) : t});
    ln->load_state_dict(zero_bias);
    rms = nl::convert_to_rmsnorm(*ln);
    CHECK(rms->state_dict().size() == ln->state_dict().size() - (2 * 3 + 1));
    CHECK(relative_difference(logits_of(*rms, ids), logits_of(*ln, ids)) < 1e-10);
}

TEST_CASE("convert: in f32 the converted model is as close to the f64 LayerNorm model as the f32 LayerNorm model is", "[convert]") {
    // The f64 LayerNorm model is the reference; both f32 models carry f32 rounding. The conversion adds
    // the rounding of the re-centered weights (half an ulp each) and the stream's leftover mean: the
    // f32 sums that make the stream are zero-mean only to about u * sqrt(dim) of its RMS (u = 2^-24,
    // the unit roundoff), which a LayerNorm would subtract and an RMSNorm keeps, at each of the 2L + 1
    // norms. Here that is 2^-24 * sqrt(32) * 7 ~ 2.4e-6 of the logits' scale at most, so 1e-5 bounds
    // it with room, while a wrong conversion is off by 1e-2 or more (the f64 test's swapped norms).
    auto ln64 = layernorm_model(layernorm_options(nl::DType::F64));
    auto ln32 = in_dtype(*ln64, nl::DType::F32);
    auto rms32 = nl::convert_to_rmsnorm(*ln32);
    CHECK(rms32->options().dtype == nl::DType::F32);
    const nl::Tensor ids = some_ids(3, 20, 23);
    const nl::Tensor reference = logits_of(*ln64, ids);
    const double ln_error = relative_difference(logits_of(*ln32, ids), reference);
    const double rms_error = relative_difference(logits_of(*rms32, ids), reference);
    INFO("f32 LayerNorm vs f64: " << ln_error << ", f32 converted vs f64: " << rms_error);
    CHECK(rms_error < 1e-5);
    CHECK(ln_error < 1e-5);
    // The re-centering is computed in f64 and rounded once: converting the f32 weights widened to f64
    // and rounding the result gives the same bits.
    auto via64 = in_dtype(*nl::convert_to_rmsnorm(*in_dtype(*ln32, nl::DType::F64)), nl::DType::F32);
    const nl::NamedTensors a = rms32->state_dict(), b = via64->state_dict();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].first);
        CHECK(a[i].second.to_vector() == b[i].second.to_vector());
    }
    CHECK(greedy(*rms32) == greedy(*ln32));
}

TEST_CASE("convert: refusals name what the conversion does not cover", "[convert]") {
    nl::TransformerOptions o = layernorm_options(nl::DType::F64);
    o.n_layers = 2;
    o.norm_placement = "post";
    CHECK_THROWS_WITH(nl::convert_to_rmsnorm(nl::Transformer(o)),
                      Catch::Contains("/model/norm_placement is \"post\"") && Catch::Contains("pre-norm"));
    o.norm_placement = "pre";
    o.norm.type = "rmsnorm";
    CHECK_THROWS_WITH(nl::check_convertible_to_rmsnorm(o),
                      Catch::Contains("/model/norm/type is \"rmsnorm\" (already RMSNorm)"));
    o.norm.type = "scalenorm";
    CHECK_THROWS_WITH(nl::convert_to_rmsnorm(nl::Transformer(o)),
                      Catch::Contains("/model/norm/type is \"scalenorm\";") && Catch::Contains("\"layernorm\""));
    // A LayerNorm bias that is not zero: the tensor is named.
    o.norm.type = "layernorm";
    o.norm.bias = true;
    nl::Transformer biased(o);
    nl::NamedTensors state = biased.state_dict();
    for (auto& [name, t] : state)
        if (name == "layers.1.ffn_norm.bias") t = nl::full_like(t, 0.25);
    biased.load_state_dict(state);
    CHECK_THROWS_WITH(nl::convert_to_rmsnorm(biased),
                      Catch::Contains("layers.1.ffn_norm.bias is nonzero (max |bias| = 0.25)") &&
                          Catch::Contains("/model/norm/bias false"));
}

TEST_CASE("convert: `normlab convert` on a trained run: `normlab sample` gives the same text, export reads it, mistakes are one line", "[convert][cli]") {
    TempDir dir("convert_cli");
    const std::string run = train_run(dir, "ln", json::object());
    nl_test::CliRun r = nl_test::run_normlab_in(dir.path, "convert ln --to rmsnorm rms.safetensors");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.output, Catch::StartsWith("convert: ") && Catch::Contains("(step 4) -> rms.safetensors") &&
                             Catch::Contains("5 LayerNorms as RMSNorms, 5 weights re-centered"));

    // The checkpoint is a train checkpoint of an RMSNorm model: the config says so (without the bias
    // option), the step, vocab and trained sequence length are the run's.
    const nl::TrainCheckpoint source = nl::load_train_checkpoint(run);
    const nl::TrainCheckpoint converted = nl::load_train_checkpoint(dir / "rms.safetensors");
    CHECK(converted.config.model.norm.type == "rmsnorm");
    CHECK(converted.config.model.norm.resolved_eps() == source.config.model.norm.resolved_eps());
    const json written = json::parse(converted.info.metadata.at("config"));
    CHECK(written["model"]["norm"]["type"] == "rmsnorm");
    CHECK_FALSE(written["model"]["norm"].contains("bias"));
    CHECK(written["model"]["norm"]["eps"] == source.config.resolved["model"]["norm"]["eps"]);
    CHECK(written["model"]["norm_placement"] == "pre");
    CHECK(converted.info.step == 4);
    CHECK_FALSE(converted.info.has_optimizer);
    CHECK(converted.info.metadata.at("vocab") == source.info.metadata.at("vocab"));
    CHECK(converted.info.metadata.at(nl::kTrainedSeqLenKey) == source.info.metadata.at(nl::kTrainedSeqLenKey));
    CHECK(converted.context == source.context);
    const nl::Tensor ids = some_ids(2, 12, source.config.model.vocab_size);
    CHECK(relative_difference(logits_of(*converted.model, ids), logits_of(*source.model, ids)) < 1e-5);
    // The same text, greedy, from the run and from the converted file.
    const std::string sample = " --prompt 'hello' --temperature 0 --max-new-tokens 40";
    const nl_test::CliRun from_run = nl_test::run_normlab_in(dir.path, "sample ln" + sample);
    const nl_test::CliRun from_file = nl_test::run_normlab_in(dir.path, "sample rms.safetensors" + sample);
    REQUIRE(from_run.status == 0);
    REQUIRE(from_file.status == 0);
    const std::string text = sampled_text(from_run.output);
    CHECK_THAT(text, Catch::StartsWith("hello"));
    CHECK(text.size() > 40);
    CHECK(sampled_text(from_file.output) == text);
    // An RMSNorm pre-norm model is what transformers' LlamaForCausalLM holds: export takes it.
    r = nl_test::run_normlab_in(dir.path, "export rms.safetensors --to hf hf");
    CHECK(r.status == 0);
    CHECK(fs::exists(dir / "hf/model.safetensors"));

    // Mistakes: one line, exit 2, nothing written.
    require_one_line_error(nl_test::run_normlab_in(dir.path, "convert ln --to rmsnorm rms.safetensors"),
                           "rms.safetensors: already exists (--force replaces it)");
    r = nl_test::run_normlab_in(dir.path, "convert ln --to rmsnorm rms.safetensors --force");
    CHECK(r.status == 0);
    require_one_line_error(nl_test::run_normlab_in(dir.path, "convert missing.safetensors --to rmsnorm out.safetensors"),
                           "missing.safetensors: no such checkpoint file");
    require_one_line_error(nl_test::run_normlab_in(dir.path, "convert rms.safetensors --to rmsnorm again.safetensors"),
                           "/model/norm/type is \"rmsnorm\" (already RMSNorm)");
    require_one_line_error(nl_test::run_normlab_in(dir.path, "convert ln --to layernorm out.safetensors"),
                           "--to must be rmsnorm, got 'layernorm'");
    require_one_line_error(nl_test::run_normlab_in(dir.path, "convert ln --to rmsnorm hf"), "hf: is a directory");
    require_one_line_error(nl_test::run_normlab_in(dir.path, "convert ln --to rmsnorm"), "--to");
    train_run(dir, "post", {{"pre_norm", false}}, 1);
    require_one_line_error(nl_test::run_normlab_in(dir.path, "convert post --to rmsnorm out.safetensors"),
                           "/model/norm_placement is \"post\"");
    // Trained with a LayerNorm bias, which training has made nonzero: the first one is named.
    train_run(dir, "biased", {{"norm", {{"bias", true}}}}, 2);
    require_one_line_error(nl_test::run_normlab_in(dir.path, "convert biased --to rmsnorm out.safetensors"),
                           "layers.0.attention_norm.bias is nonzero");
    CHECK_FALSE(fs::exists(dir / "out.safetensors"));
    CHECK_FALSE(fs::exists(dir / "again.safetensors"));
}
