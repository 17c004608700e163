// Models that travel (jobs/interop.h): the name table and the RoPE row permutation, round trips
// normlab -> transformers -> normlab and normlab -> GGUF -> normlab (bit-identical), normlab's
// import of a model transformers made against transformers' logits and of a GGUF normlab exported
// against llama.cpp's logits and greedy tokens (tests/reference/interop/, written by
// tests/reference/make_interop.py; no Python here), each refusal with its message, `model.init_from`
// in the train job, `normlab sample` on both formats, and `normlab export`'s command line.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "cli_test_util.h"
#include "core/error.h"
#include "core/gguf.h"
#include "core/safetensors.h"
#include "jobs/config.h"
#include "jobs/export.h"
#include "jobs/interop.h"
#include "jobs/sample.h"
#include "jobs/train.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nl_test::TempDir;
using nlohmann::json;

namespace {

const std::string kFixtures = std::string(NORMLAB_SOURCE_DIR) + "/tests/reference/interop";

nl::TransformerOptions tiny_options() {
    nl::TransformerOptions o;
    o.vocab_size = 19;
    o.dim = 16;
    o.n_layers = 2;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.multiple_of = 8;
    o.rope_theta = 500.0;
    o.max_seq_len = 24;
    o.norm.eps = 1e-6;
    o.seed = 7;
    return o;
}

// A model whose norms are not all ones, so a swapped norm would show.
std::unique_ptr<nl::Transformer> tiny_model(const nl::TransformerOptions& o = tiny_options()) {
    auto model = std::make_unique<nl::Transformer>(o);
    nl::Generator gen(11);
    for (auto& [name, p] : model->named_parameters())
        if (name.find("norm") != std::string::npos) {
            float* w = p.data().data<float>();
            gen.fill_normal(w, p.numel());
            for (int64_t i = 0; i < p.numel(); ++i) w[i] = 1.0f + 0.25f * w[i];
        }
    return model;
}

// tiny_options() as Qwen3 (pre-norm, QK-norm per head) and OLMo 2 (output norms, QK-norm over the
// whole q and k) are.
nl::TransformerOptions qwen3_options() {
    nl::TransformerOptions o = tiny_options();
    o.qk_norm = "head";
    return o;
}
nl::TransformerOptions olmo2_options() {
    nl::TransformerOptions o = tiny_options();
    o.norm_placement = "output";
    o.qk_norm = "full";
    return o;
}

void require_same_state(const nl::NamedTensors& a, const nl::NamedTensors& b) {
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].first);
        REQUIRE(a[i].first == b[i].first);
        REQUIRE(a[i].second.shape() == b[i].second.shape());
        const nl::Tensor x = a[i].second.to(nl::DType::F32).contiguous(), y = b[i].second.to(nl::DType::F32).contiguous();
        CHECK(std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.numel()) * 4) == 0);
    }
}

nl::Tensor logits_of(nl::Transformer& model, const nl::Tensor& ids) {
    nl::NoGradGuard no_grad;
    return model.forward(ids).data().to(nl::DType::F32).contiguous();
}

// max |a - b| / max |b|: the fixtures' relative measure.
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

std::unique_ptr<nl::Transformer> model_of(const nl::PretrainedModel& p) {
    auto model = std::make_unique<nl::Transformer>(p.options);
    model->load_state_dict(p.weights);
    return model;
}

// The tokens after greedy's first 4 as normlab's sampler at temperature 0 continues them (`normlab
// sample`'s greedy path, through the KV cache), for comparison with another tool's greedy tokens.
std::vector<double> greedy_continuation(nl::Transformer& model, const std::vector<double>& greedy, int64_t context) {
    std::vector<std::vector<int64_t>> tokens = {{}};
    for (int i = 0; i < 4; ++i) tokens[0].push_back(int64_t(greedy[size_t(i)]));
    nl::Generator gen(0);
    nl::GenerateOptions options;
    options.context = context;
    options.temperature = 0.0;
    nl::generate(model, tokens, int64_t(greedy.size()) - 4, options, gen);
    return std::vector<double>(tokens[0].begin(), tokens[0].end());
}

// Two safetensors files hold the same tensors under the same names, bit for bit.
void require_same_tensors(const std::string& ours_path, const std::string& theirs_path) {
    const nl::SafeTensorsFile ours = nl::load_safetensors(ours_path);
    const nl::SafeTensorsFile theirs = nl::load_safetensors(theirs_path);
    CHECK(ours.tensors.size() == theirs.tensors.size());
    for (const auto& [name, t] : theirs.tensors) {
        INFO(name);
        REQUIRE(ours.contains(name));
        CHECK(ours.at(name).to_vector() == t.to_vector());
    }
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

}  // namespace

TEST_CASE("interop: the name table maps every weight kind three ways", "[interop]") {
    CHECK(nl::kWeightNames.size() == 12);
    CHECK(nl::hf_weight_name("tok_embeddings.weight") == "model.embed_tokens.weight");
    CHECK(nl::hf_weight_name("output.weight") == "lm_head.weight");
    CHECK(nl::hf_weight_name("layers.11.attention.wk.weight") == "model.layers.11.self_attn.k_proj.weight");
    CHECK(nl::hf_weight_name("layers.0.feed_forward.w2.weight") == "model.layers.0.mlp.down_proj.weight");
    CHECK(nl::hf_weight_name("layers.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight");
    CHECK(nl::gguf_weight_name("layers.2.feed_forward.w3.weight") == "blk.2.ffn_up.weight");
    CHECK(nl::gguf_weight_name("norm.weight") == "output_norm.weight");
    CHECK(nl::gguf_weight_name("layers.0.attention_norm.weight") == "blk.0.attn_norm.weight");
    CHECK_THROWS_WITH(nl::hf_weight_name("layers.0.attention.bias"), Catch::Contains("'layers.0.attention.bias' has no name"));
    CHECK_THROWS_WITH(nl::gguf_weight_name("layers.01.ffn_norm.weight"), Catch::Contains("has no name"));
    // Every parameter of a model has a name both ways.
    for (const auto& [name, t] : tiny_model()->state_dict()) {
        CHECK_NOTHROW(nl::hf_weight_name(name));
        CHECK_NOTHROW(nl::gguf_weight_name(name));
    }
}

TEST_CASE("interop: Qwen3 adds q_norm and k_norm to LLaMA's names, OLMo 2 names its output norms", "[interop]") {
    using nl::HfArch;
    CHECK(nl::hf_weight_names(HfArch::Qwen3).size() == 14);
    CHECK(nl::hf_weight_names(HfArch::Olmo2).size() == 14);
    CHECK(nl::hf_weight_name("layers.1.attention.q_norm.weight", HfArch::Qwen3) == "model.layers.1.self_attn.q_norm.weight");
    CHECK(nl::hf_weight_name("layers.0.attention.k_norm.weight", HfArch::Olmo2) == "model.layers.0.self_attn.k_norm.weight");
    CHECK(nl::hf_weight_name("layers.0.ffn_norm.weight", HfArch::Qwen3) == "model.layers.0.post_attention_layernorm.weight");
    // OLMo 2's post_attention_layernorm is the attention's output norm, not the feed-forward's input norm.
    CHECK(nl::hf_weight_name("layers.2.attention_out_norm.weight", HfArch::Olmo2) ==
          "model.layers.2.post_attention_layernorm.weight");
    CHECK(nl::hf_weight_name("layers.2.ffn_out_norm.weight", HfArch::Olmo2) ==
          "model.layers.2.post_feedforward_layernorm.weight");
    CHECK_THROWS_WITH(nl::hf_weight_name("layers.0.ffn_norm.weight", HfArch::Olmo2),
                      Catch::Contains("has no name in the Olmo2ForCausalLM weight table"));
    CHECK_THROWS_WITH(nl::hf_weight_name("layers.0.attention.q_norm.weight"),
                      Catch::Contains("has no name in the LlamaForCausalLM weight table"));
    CHECK_THROWS_WITH(nl::gguf_weight_name("layers.0.attention.q_norm.weight"), Catch::Contains("has no name in the LLaMA"));
    CHECK(nl::hf_architecture(tiny_options()) == HfArch::Llama);
    CHECK(nl::hf_architecture(qwen3_options()) == HfArch::Qwen3);
    CHECK(nl::hf_architecture(olmo2_options()) == HfArch::Olmo2);
    for (const nl::TransformerOptions& o : {qwen3_options(), olmo2_options()})
        for (const auto& [name, t] : tiny_model(o)->state_dict()) CHECK_NOTHROW(nl::hf_weight_name(name, nl::hf_architecture(o)));
}

TEST_CASE("interop: the RoPE rows go from interleaved pairs to halves and back", "[interop]") {
    // 2 heads of 4 dims, rows numbered: head h's interleaved rows (x0, x1, x2, x3) = pairs (0,1),
    // (2,3) become (x0, x2, x1, x3): the first of each pair, then the second.
    std::vector<float> rows;
    for (int r = 0; r < 8; ++r) rows.insert(rows.end(), {float(r), float(10 * r)});
    const nl::Tensor w = nl::from_vector(rows, {8, 2});
    const nl::Tensor split = nl::permute_rope_rows(w, 2, true);
    std::vector<double> first_column;
    for (int r = 0; r < 8; ++r) first_column.push_back(split.to_vector()[size_t(2 * r)]);
    CHECK(first_column == std::vector<double>{0, 2, 1, 3, 4, 6, 5, 7});
    const nl::Tensor back = nl::permute_rope_rows(split, 2, false);
    CHECK(back.to_vector() == w.to_vector());
    CHECK_THROWS_WITH(nl::permute_rope_rows(w, 3, true), Catch::Contains("expected (n_heads * even head_dim, dim)"));
}

TEST_CASE("interop: normlab -> transformers -> normlab and normlab -> GGUF -> normlab are bit-identical", "[interop]") {
    TempDir dir("interop_round");
    auto model = tiny_model();
    const std::vector<uint32_t> chars = {'\n', ' ', '!', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l',
                                         'm', 'n', 0xE9, 0x4E2D};  // "é" and "中" too
    nl::ExportOptions hf{"hf", dir / "hf"};
    nl::export_model(*model, chars, hf);
    const nl::PretrainedModel from_hf = nl::load_pretrained(dir / "hf");
    CHECK(from_hf.format == "hf");
    require_same_state(model->state_dict(), from_hf.weights);
    CHECK(from_hf.char_vocab == chars);
    CHECK(from_hf.options.max_seq_len == 24);
    CHECK(from_hf.options.rope_theta == 500.0);
    CHECK(from_hf.options.n_kv_heads == 2);
    CHECK(nl::swiglu_hidden_dim(from_hf.options.ffn_hidden_dim, from_hf.options.multiple_of) ==
          nl::swiglu_hidden_dim(4 * 16, 8));
    // The same logits from the model read back.
    const nl::Tensor ids = nl::from_vector(std::vector<int64_t>{1, 5, 18, 3, 0, 7, 2, 9}, {2, 4});
    auto again = model_of(from_hf);
    CHECK(relative_difference(logits_of(*again, ids), logits_of(*model, ids)) == 0.0);
    // The config transformers reads.
    const json config = nl::load_json_file(dir / "hf/config.json");
    CHECK(config["architectures"] == json{"LlamaForCausalLM"});
    CHECK(config["intermediate_size"] == nl::swiglu_hidden_dim(64, 8));
    CHECK(config["num_key_value_heads"] == 2);
    CHECK(config["rms_norm_eps"] == 1e-6);
    CHECK(config["tie_word_embeddings"] == false);
    const json tokenizer = nl::load_json_file(dir / "hf/tokenizer.json");
    CHECK(tokenizer["model"]["vocab"]["\xe4\xb8\xad"] == 18);
    CHECK(tokenizer["model"]["vocab"]["\n"] == 0);

    nl::ExportOptions gguf{"gguf", dir / "m.gguf"};
    nl::export_model(*model, chars, gguf);
    const nl::PretrainedModel from_gguf = nl::load_pretrained(dir / "m.gguf");
    CHECK(from_gguf.format == "gguf");
    require_same_state(model->state_dict(), from_gguf.weights);
    CHECK(from_gguf.char_vocab == chars);
    CHECK(*from_gguf.options.norm.eps == 1e-6);  // stored as a float, read back as written
    CHECK(from_gguf.options.rope_theta == 500.0);
    const nl::GgufFile file = nl::load_gguf(dir / "m.gguf");
    CHECK(file.string_at("general.architecture") == "llama");
    CHECK(file.uint_at("llama.attention.head_count_kv") == 2);
    CHECK(file.uint_at("llama.feed_forward_length") == uint64_t(nl::swiglu_hidden_dim(64, 8)));
    CHECK(file.find("tokenizer.ggml.tokens")->texts[1] == "\xe2\x96\x81");  // the space as SentencePiece's U+2581
    CHECK(file.tensor("blk.1.attn_k.weight").shape() == nl::Shape{8, 16});

    // Exported again from what was read: the same bytes.
    nl::ExportOptions gguf2{"gguf", dir / "again.gguf"};
    nl::export_model(*model_of(from_gguf), from_gguf.char_vocab, gguf2);
    CHECK(nl_test::read_text(dir / "again.gguf") == nl_test::read_text(dir / "m.gguf"));

    // Half precision: the weights rounded once (norms stay f32 in GGUF, as llama.cpp's converter writes).
    for (const char* dtype : {"f16", "bf16"}) {
        INFO(dtype);
        nl::ExportOptions half{"gguf", dir / (std::string(dtype) + ".gguf"), nl::dtype_from_name(dtype)};
        nl::export_model(*model, {}, half);
        const nl::GgufFile h = nl::load_gguf(half.out);
        CHECK(h.tensor("blk.0.ffn_up.weight").dtype() == half.dtype);
        CHECK(h.tensor("blk.0.ffn_norm.weight").dtype() == nl::DType::F32);
        CHECK(h.string_at("tokenizer.ggml.model") == "none");  // no characters: ids only
        const nl::PretrainedModel read = nl::load_pretrained(half.out);
        CHECK(read.char_vocab.empty());
        const nl::Tensor w = model->state_dict()[1].second;  // layers.0.attention.wq.weight
        CHECK(read.weights[1].second.to_vector() == w.to(half.dtype).to(nl::DType::F32).to_vector());
        nl::ExportOptions half_hf{"hf", dir / (std::string(dtype) + "_hf"), nl::dtype_from_name(dtype)};
        nl::export_model(*model, {}, half_hf);
        CHECK(nl::load_json_file(half_hf.out + "/config.json")["dtype"] == (half.dtype == nl::DType::F16 ? "float16" : "bfloat16"));
        CHECK_FALSE(fs::exists(half_hf.out + "/tokenizer.json"));
        const nl::SafeTensorsFile st = nl::load_safetensors(half_hf.out + "/model.safetensors");
        CHECK(st.at("model.layers.0.mlp.up_proj.weight").dtype() == half.dtype);
    }
}

TEST_CASE("interop: Qwen3- and OLMo 2-shaped models go to transformers and back bit-identically", "[interop]") {
    TempDir dir("interop_round_qk");
    const nl::Tensor ids = nl::from_vector(std::vector<int64_t>{1, 5, 18, 3, 0, 7, 2, 9}, {2, 4});
    for (const nl::TransformerOptions& o : {qwen3_options(), olmo2_options()}) {
        const bool qwen3 = o.qk_norm == "head";
        INFO((qwen3 ? "qwen3" : "olmo2"));
        auto model = tiny_model(o);
        const std::string out = dir / (qwen3 ? "qwen3" : "olmo2");
        nl::export_model(*model, {}, {"hf", out});
        const json config = nl::load_json_file(out + "/config.json");
        CHECK(config["architectures"] == json{qwen3 ? "Qwen3ForCausalLM" : "Olmo2ForCausalLM"});
        CHECK(config["model_type"] == (qwen3 ? "qwen3" : "olmo2"));
        CHECK(config["attention_bias"] == false);
        CHECK(config["tie_word_embeddings"] == false);
        if (qwen3) {
            CHECK(config["head_dim"] == 4);
            CHECK(config["use_sliding_window"] == false);
            CHECK(config["layer_types"] == json{"full_attention", "full_attention"});
        } else {
            CHECK_FALSE(config.contains("head_dim"));
        }
        // transformers' names, and the QK-norm weights in its RoPE layout: per head (4 dims) for
        // Qwen3, over the whole projection (4 heads of q, 2 of k) for OLMo 2.
        const nl::SafeTensorsFile st = nl::load_safetensors(out + "/model.safetensors");
        CHECK(st.tensors.size() == model->state_dict().size());
        CHECK(st.contains("model.layers.0.input_layernorm.weight") == qwen3);
        CHECK(st.contains("model.layers.1.post_feedforward_layernorm.weight") == !qwen3);
        for (const char* which : {"q_norm", "k_norm"}) {
            INFO(which);
            const std::string ours = std::string("layers.1.attention.") + which + ".weight";
            nl::Tensor w;
            for (const auto& [name, t] : model->state_dict())
                if (name == ours) w = t;
            REQUIRE(w.defined());
            const std::vector<double> a = w.to_vector();
            const std::vector<double> b = st.at(std::string("model.layers.1.self_attn.") + which + ".weight").to_vector();
            REQUIRE(a.size() == b.size());
            CHECK(a.size() == size_t(qwen3 ? 4 : (which[0] == 'q' ? 16 : 8)));
            // Element h*4 + 2i + j of normlab's interleaved pairs is h*4 + j*2 + i of transformers' halves.
            for (size_t h = 0; h < a.size() / 4; ++h)
                for (size_t i = 0; i < 2; ++i)
                    for (size_t j = 0; j < 2; ++j) CHECK(b[h * 4 + j * 2 + i] == a[h * 4 + 2 * i + j]);
        }
        const nl::PretrainedModel back = nl::load_pretrained(out);
        CHECK(back.options.qk_norm == o.qk_norm);
        CHECK(back.options.norm_placement == o.norm_placement);
        require_same_state(model->state_dict(), back.weights);
        CHECK(relative_difference(logits_of(*model_of(back), ids), logits_of(*model, ids)) == 0.0);
        // Exported again from what was read: the same bytes.
        nl::export_model(*model_of(back), {}, {"hf", out + "_again"});
        CHECK(nl_test::read_text(out + "_again/model.safetensors") == nl_test::read_text(out + "/model.safetensors"));
        CHECK(nl_test::read_text(out + "_again/config.json") == nl_test::read_text(out + "/config.json"));
        // llama.cpp's "llama" holds neither.
        CHECK_THROWS_WITH(nl::export_model(*model, {}, {"gguf", dir / "m.gguf"}),
                          Catch::Contains("export --to gguf: model.") && Catch::Contains("has no form in llama.cpp's \"llama\""));
    }
}

TEST_CASE("interop: what transformers and llama.cpp cannot hold is refused by name, and leaves nothing", "[interop]") {
    TempDir dir("interop_refuse");
    // The option is named, with what transformers' classes (or llama.cpp's llama) have instead.
    const std::string classes = "(LLaMA: pre; Qwen3: pre with qk_norm head; OLMo 2: output with qk_norm full)";
    const auto refused = [&](nl::TransformerOptions o, const std::string& option, const std::string& hf_reason) {
        INFO(option);
        nl::Transformer model(o);
        nl::ExportOptions hf{"hf", dir / "out_hf"};
        CHECK_THROWS_WITH(nl::export_model(model, {}, hf),
                          Catch::StartsWith("export --to hf: " + option + " has no Hugging Face architecture " + hf_reason));
        CHECK_FALSE(fs::exists(hf.out));
        nl::ExportOptions gguf{"gguf", dir / "out.gguf"};
        CHECK_THROWS_WITH(nl::export_model(model, {}, gguf),
                          Catch::StartsWith("export --to gguf: ") && Catch::Contains("has no form in llama.cpp's \"llama\""));
        CHECK_FALSE(fs::exists(gguf.out));
    };
    nl::TransformerOptions o = tiny_options();
    o.norm.type = "layernorm";
    refused(o, "model.norm.type \"layernorm\"", "(LLaMA, Qwen3 and OLMo 2: RMSNorm only)");
    o.qk_norm = "head";  // QK-norm with LayerNorm: the norm type is what is missing
    refused(o, "model.norm.type \"layernorm\"", "(LLaMA, Qwen3 and OLMo 2: RMSNorm only)");
    o = tiny_options();
    o.norm.type = "prmsnorm";
    refused(o, "model.norm.type \"prmsnorm\"", "(LLaMA, Qwen3 and OLMo 2: RMSNorm only)");
    o.norm.type = "dyt";
    refused(o, "model.norm.type \"dyt\"", "(LLaMA, Qwen3 and OLMo 2: RMSNorm only)");
    o = tiny_options();
    o.norm.elementwise_affine = false;
    refused(o, "model.norm.elementwise_affine false", "(LLaMA, Qwen3 and OLMo 2: RMSNorm always with a learned weight)");
    for (const char* placement : {"post", "peri", "mix", "deepnorm", "none"}) {
        o = tiny_options();
        o.norm_placement = placement;
        refused(o, "model.norm_placement \"" + std::string(placement) + "\"", classes);
    }
    o = tiny_options();
    o.norm_scaling = "depth";
    refused(o, "model.norm_scaling \"depth\"", "(LLaMA, Qwen3 and OLMo 2: no LayerNorm Scaling)");
    o = qwen3_options();
    o.logit_softcap = 30.0;
    refused(o, "model.logit_softcap 30", "(LLaMA, Qwen3 and OLMo 2: no soft-capping)");
    o = olmo2_options();
    o.attn_softcap = 50.0;
    refused(o, "model.attn_softcap 50", "(LLaMA, Qwen3 and OLMo 2: no soft-capping)");
    // QK-norm and placement together: Qwen3's per-head QK-norm is pre-norm, OLMo 2's is over the
    // whole projection with output norms, and OLMo 2 always has one.
    const std::vector<std::pair<const char*, const char*>> pairs = {{"full", "pre"}, {"head", "output"}, {"none", "output"}};
    for (const auto& [qk, placement] : pairs) {
        o = tiny_options();
        o.qk_norm = qk;
        o.norm_placement = placement;
        refused(o, "model.qk_norm \"" + std::string(qk) + "\" with model.norm_placement \"" + placement + "\"", classes);
    }
    // llama.cpp's llama: LLaMA's options only.
    for (const nl::TransformerOptions& qk : {qwen3_options(), olmo2_options()}) {
        nl::Transformer model(qk);
        CHECK_THROWS_WITH(nl::export_model(model, {}, {"gguf", dir / "qk.gguf"}),
                          Catch::StartsWith(qk.qk_norm == "head" ? "export --to gguf: model.qk_norm \"head\" has no form"
                                                                 : "export --to gguf: model.norm_placement \"output\" has no form"));
        CHECK_FALSE(fs::exists(dir / "qk.gguf"));
    }

    // An existing output is kept unless --force; with it, replaced whole.
    auto model = tiny_model();
    nl::ExportOptions e{"hf", dir / "hf"};
    fs::create_directories(e.out);
    write_text(e.out + "/keep.txt", "mine");
    CHECK_THROWS_WITH(nl::export_model(*model, {}, e), Catch::Contains("already exists (--force replaces it)"));
    CHECK(fs::exists(e.out + "/keep.txt"));
    e.force = true;
    nl::export_model(*model, {}, e);
    CHECK_FALSE(fs::exists(e.out + "/keep.txt"));
    CHECK(fs::exists(e.out + "/model.safetensors"));
    // A failure halfway (the parent does not exist) leaves no temporary directory behind.
    nl::ExportOptions nowhere{"hf", dir / "missing/parent/hf"};
    CHECK_THROWS(nl::export_model(*model, {}, nowhere));
    for (const auto& entry : fs::directory_iterator(dir.path))
        CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("interop: a transformers config.json: every key LlamaForCausalLM may hold and normlab cannot is refused", "[interop]") {
    const json good = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 40},
                       {"hidden_size", 32}, {"intermediate_size", 45}, {"num_hidden_layers", 2},
                       {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
                       {"rms_norm_eps", 1e-5}, {"rope_parameters", {{"rope_theta", 5000.0}, {"rope_type", "default"}}},
                       {"tie_word_embeddings", true}, {"hidden_act", "silu"}};
    const nl::HfConfig c = nl::read_hf_config(good, "config.json");
    CHECK(c.tied);
    CHECK(c.options.rope_theta == 5000.0);
    CHECK(*c.options.norm.eps == 1e-5);
    // An odd intermediate size is held exactly.
    CHECK(nl::swiglu_hidden_dim(c.options.ffn_hidden_dim, c.options.multiple_of) == 45);
    for (int64_t h : {1, 2, 44, 11008, 14336}) {
        json j = good;
        j["intermediate_size"] = h;
        const nl::HfConfig r = nl::read_hf_config(j, "config.json");
        CHECK(nl::swiglu_hidden_dim(r.options.ffn_hidden_dim, r.options.multiple_of) == h);
    }
    const auto refused = [&](const std::string& key, const json& value, const std::string& message) {
        json j = good;
        j[key] = value;
        INFO(key << " = " << value.dump());
        CHECK_THROWS_WITH(nl::read_hf_config(j, "dir/config.json"),
                          Catch::StartsWith("dir/config.json: /" + key + ": ") && Catch::Contains(message));
    };
    refused("model_type", "mistral", "expected \"llama\"");
    refused("architectures", {"LlamaForSequenceClassification"}, "expected [\"LlamaForCausalLM\"]");
    refused("attention_bias", true, "no biases");
    refused("mlp_bias", true, "no biases");
    refused("hidden_act", "gelu", "expected \"silu\"");
    refused("rope_scaling", {{"type", "linear"}, {"factor", 2.0}}, "RoPE scaling is not supported");
    refused("head_dim", 7, "expected an even head size (RoPE rotates pairs), got 7");
    refused("attention_dropout", 0.1, "no dropout");
    refused("pretraining_tp", 2, "expected 1");
    refused("num_attention_heads", 5, "a divisor of hidden_size = 32 (there is no head_dim), got 5");
    refused("num_key_value_heads", 3, "divisor of num_attention_heads = 4");
    refused("hidden_size", 1 << 20, "expected an integer in [2, 65536]");
    refused("vocab_size", "40", "expected an integer");
    refused("vocab_size", -1, "expected an integer in [1,");
    refused("num_hidden_layers", 18446744073709551615ull, "expected an integer in [0, 1024]");
    refused("rms_norm_eps", "tiny", "expected a number");
    json no_size = good;
    no_size.erase("hidden_size");
    CHECK_THROWS_WITH(nl::read_hf_config(no_size, "c.json"), Catch::Contains("c.json: /hidden_size: missing"));
    json bad_rope = good;
    bad_rope["rope_parameters"]["rope_type"] = "yarn";
    CHECK_THROWS_WITH(nl::read_hf_config(bad_rope, "c.json"), Catch::Contains("/rope_parameters: /rope_type: only \"default\""));
    CHECK_THROWS_WITH(nl::read_hf_config(json::array(), "c.json"), Catch::Contains("expected a JSON object"));

    // Qwen3 and OLMo 2: their class's placement and QK-norm; what normlab lacks is named by key.
    json qwen3 = good;
    qwen3["model_type"] = "qwen3";
    qwen3["architectures"] = {"Qwen3ForCausalLM"};
    qwen3["head_dim"] = 8;
    qwen3["use_sliding_window"] = false;
    qwen3["sliding_window"] = nullptr;
    qwen3["layer_types"] = {"full_attention", "full_attention"};
    const nl::HfConfig q = nl::read_hf_config(qwen3, "config.json");
    CHECK(q.arch == nl::HfArch::Qwen3);
    CHECK(q.options.qk_norm == "head");
    CHECK(q.options.norm_placement == "pre");
    json olmo2 = good;
    olmo2["model_type"] = "olmo2";
    olmo2["architectures"] = {"Olmo2ForCausalLM"};
    olmo2.erase("rms_norm_eps");
    const nl::HfConfig ol = nl::read_hf_config(olmo2, "config.json");
    CHECK(ol.arch == nl::HfArch::Olmo2);
    CHECK(ol.options.qk_norm == "full");
    CHECK(ol.options.norm_placement == "output");
    CHECK(*ol.options.norm.eps == 1e-5);  // Olmo2Config's default
    const auto refused_in = [&](json j, const std::string& key, const json& value, const std::string& message) {
        if (value.is_null()) {
            j.erase(key);
        } else {
            j[key] = value;
        }
        INFO(j["model_type"] << ": " << key << " = " << value.dump());
        CHECK_THROWS_WITH(nl::read_hf_config(j, "dir/config.json"),
                          Catch::StartsWith("dir/config.json: /" + key + ": ") && Catch::Contains(message));
    };
    refused_in(qwen3, "attention_bias", true, "no biases");
    refused_in(qwen3, "use_sliding_window", true, "no sliding window");
    refused_in(qwen3, "layer_types", {"full_attention", "sliding_attention"}, "\"full_attention\" in every layer");
    // A head size of its own (Qwen3-0.6B's 128 at hidden 1024 with 16 heads): model.head_dim; the
    // default (hidden / heads) stays 0, as a normlab config leaves it.
    json wide = qwen3;
    wide["head_dim"] = 16;
    CHECK(nl::read_hf_config(wide, "config.json").options.head_dim == 16);
    CHECK(nl::read_hf_config(qwen3, "config.json").options.head_dim == 0);
    wide.erase("head_dim");
    CHECK(nl::read_hf_config(wide, "config.json").options.head_dim == 128);  // Qwen3Config's default
    json odd_heads = good;
    odd_heads["num_attention_heads"] = 3;
    odd_heads["num_key_value_heads"] = 3;
    odd_heads["head_dim"] = 10;
    CHECK(nl::read_hf_config(odd_heads, "config.json").options.head_dim == 10);  // 32 / 3 heads: head_dim says
    refused_in(qwen3, "head_dim", 7, "expected an even head size (RoPE rotates pairs), got 7");
    odd_heads.erase("head_dim");
    refused_in(odd_heads, "num_attention_heads", 3, "a divisor of hidden_size = 32 (there is no head_dim), got 3");
    refused_in(olmo2, "head_dim", 16, "Olmo2ForCausalLM's heads are hidden_size / num_attention_heads = 32 / 4, got 16");
    refused_in(qwen3, "architectures", {"LlamaForCausalLM"}, "expected [\"Qwen3ForCausalLM\"] (model_type \"qwen3\")");
    refused_in(qwen3, "rope_scaling", {{"rope_type", "yarn"}}, "RoPE scaling is not supported");
    refused_in(olmo2, "attention_bias", true, "no biases");
    refused_in(olmo2, "hidden_act", "relu", "expected \"silu\"");
    refused_in(olmo2, "architectures", {"OlmoForCausalLM"}, "expected [\"Olmo2ForCausalLM\"]");
    refused_in(good, "model_type", "olmo", "\"qwen3\" (Qwen3ForCausalLM) or \"olmo2\" (Olmo2ForCausalLM), got \"olmo\"");
}

TEST_CASE("interop: strangers' model directories: shards outside it, links, missing and extra tensors are named", "[interop]") {
    TempDir dir("interop_strangers");
    auto model = tiny_model();
    nl::export_model(*model, {}, {"hf", dir / "hf"});
    const nl::SafeTensorsFile st = nl::load_safetensors(dir / "hf/model.safetensors");

    // Sharded: two files and an index, as transformers writes them.
    const auto sharded = [&](const std::string& name, const std::function<void(json&)>& edit) {
        const std::string d = dir / name;
        fs::create_directories(d);
        fs::copy_file(dir / "hf/config.json", d + "/config.json");
        std::vector<std::pair<std::string, nl::Tensor>> a, b;
        json map = json::object();
        for (size_t i = 0; i < st.tensors.size(); ++i) {
            const bool first = i < st.tensors.size() / 2;
            (first ? a : b).push_back(st.tensors[i]);
            map[st.tensors[i].first] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
        }
        nl::save_safetensors(d + "/model-00001-of-00002.safetensors", a);
        nl::save_safetensors(d + "/model-00002-of-00002.safetensors", b);
        json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", map}};
        edit(index);
        write_text(d + "/model.safetensors.index.json", index.dump());
        return d;
    };
    require_same_state(model->state_dict(), nl::load_pretrained(sharded("ok", [](json&) {})).weights);
    CHECK(nl::is_pretrained_model(dir / "ok"));

    const auto fails = [&](const std::string& name, const std::function<void(json&)>& edit, const std::string& message) {
        INFO(name);
        CHECK_THROWS_WITH(nl::load_pretrained(sharded(name, edit)), Catch::Contains(message));
    };
    fails("up", [](json& i) { i["weight_map"]["lm_head.weight"] = "../model-00002-of-00002.safetensors"; },
          "is not a file name inside the model directory");
    fails("abs", [](json& i) { i["weight_map"]["lm_head.weight"] = "/etc/passwd"; }, "is not a file name inside");
    fails("dotdot", [](json& i) { i["weight_map"]["lm_head.weight"] = ".."; }, "is not a file name inside");
    fails("moved", [](json& i) { i["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"; },
          "tensor 'model.norm.weight' is mapped to 'model-00001-of-00002.safetensors'");
    fails("ghost", [](json& i) { i["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"; },
          "'model.layers.9.mlp.up_proj.weight' is mapped to 'model-00001-of-00002.safetensors', which does not hold it");
    fails("nomap", [](json& i) { i.erase("weight_map"); }, "/weight_map: expected an object");
    fails("numbers", [](json& i) { i["weight_map"]["lm_head.weight"] = 3; }, "expected a shard file name");

    // A shard that is a link is refused, even to a file inside.
    const std::string linked = sharded("linked", [](json&) {});
    fs::rename(linked + "/model-00002-of-00002.safetensors", linked + "/real.safetensors");
    fs::create_symlink("real.safetensors", linked + "/model-00002-of-00002.safetensors");
    CHECK_THROWS_WITH(nl::load_pretrained(linked), Catch::Contains("is a symbolic link"));

    // One file: a missing, an extra, a misshapen and a duplicate (in two shards) tensor.
    const auto one_file = [&](const std::string& name, std::vector<std::pair<std::string, nl::Tensor>> tensors) {
        const std::string d = dir / name;
        fs::create_directories(d);
        fs::copy_file(dir / "hf/config.json", d + "/config.json");
        nl::save_safetensors(d + "/model.safetensors", tensors);
        return d;
    };
    auto tensors = st.tensors;
    tensors.erase(tensors.begin());
    const std::string missing_name = st.tensors.front().first;
    CHECK_THROWS_WITH(nl::load_pretrained(one_file("missing", tensors)), Catch::Contains("missing tensor '" + missing_name + "'"));
    tensors = st.tensors;
    tensors.push_back({"model.layers.0.self_attn.q_proj.bias", nl::zeros({16})});
    CHECK_THROWS_WITH(nl::load_pretrained(one_file("extra", tensors)),
                      Catch::Contains("unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"));
    tensors = st.tensors;
    tensors.push_back({"model.layers.2.mlp.up_proj.weight", nl::zeros({4, 4})});
    CHECK_THROWS_WITH(nl::load_pretrained(one_file("layer2", tensors)),
                      Catch::Contains("unexpected tensor 'model.layers.2.mlp.up_proj.weight' (the architecture has 2 layers)"));
    tensors = st.tensors;
    for (auto& [name, t] : tensors)
        if (name == "model.norm.weight") t = nl::zeros({17});
    CHECK_THROWS_WITH(nl::load_pretrained(one_file("shape", tensors)),
                      Catch::Contains("tensor 'model.norm.weight': expected shape [16] for this architecture, found [17]"));
    tensors = st.tensors;
    for (auto& [name, t] : tensors)
        if (name == "model.norm.weight") t = nl::zeros({16}, nl::DType::I64);
    CHECK_THROWS_WITH(nl::load_pretrained(one_file("ints", tensors)), Catch::Contains("expected F32, F16 or BF16, found i64"));

    CHECK_THROWS_WITH(nl::load_pretrained(dir / "nothing"), Catch::Contains("no such file or directory"));
    fs::create_directories(dir / "empty");
    CHECK_THROWS_WITH(nl::load_pretrained(dir / "empty"), Catch::Contains("a directory without config.json"));
    write_text(dir / "weights.bin", "not a model");
    CHECK_THROWS_WITH(nl::load_pretrained(dir / "weights.bin"), Catch::Contains("no 'GGUF' magic"));
}

TEST_CASE("interop: a GGUF of another architecture, or with a quantized tensor, is refused by name", "[interop]") {
    TempDir dir("interop_gguf_refuse");
    auto model = tiny_model();
    nl::export_model(*model, {}, {"gguf", dir / "m.gguf"});
    nl::GgufFile file = nl::load_gguf(dir / "m.gguf");
    const auto rewritten = [&](const std::string& name, const std::function<void(nl::GgufMetadata&)>& edit) {
        nl::GgufMetadata m = file.metadata;
        edit(m);
        nl::save_gguf(dir / name, m, file.tensors);
        return dir / name;
    };
    const auto set = [](nl::GgufMetadata& m, const std::string& key, const nl::GgufValue& v) {
        for (auto& [k, value] : m)
            if (k == key) value = v;
    };
    CHECK_THROWS_WITH(nl::load_pretrained(rewritten("qwen.gguf", [&](nl::GgufMetadata& m) {
                          set(m, "general.architecture", nl::GgufValue::string("qwen2"));
                      })),
                      Catch::Contains("'general.architecture': expected \"llama\", found \"qwen2\""));
    CHECK_THROWS_WITH(nl::load_pretrained(rewritten("heads.gguf", [&](nl::GgufMetadata& m) {
                          set(m, "llama.attention.head_count_kv", nl::GgufValue::u32(3));
                      })),
                      Catch::Contains("does not divide llama.attention.head_count 4"));
    CHECK_THROWS_WITH(nl::load_pretrained(rewritten("big.gguf", [&](nl::GgufMetadata& m) {
                          set(m, "llama.embedding_length", nl::GgufValue::u64(uint64_t(1) << 40));
                      })),
                      Catch::Contains("'llama.embedding_length': expected an integer in [2, 65536]"));
    CHECK_THROWS_WITH(nl::load_pretrained(rewritten("rope.gguf", [&](nl::GgufMetadata& m) {
                          set(m, "llama.rope.dimension_count", nl::GgufValue::u32(2));
                      })),
                      Catch::Contains("'llama.rope.dimension_count': normlab rotates whole heads (4 dims), found 2"));
    // A head size of its own (llama.attention.key_length): even, the values' too, and the weights'.
    CHECK_THROWS_WITH(nl::load_pretrained(rewritten("odd_head.gguf", [&](nl::GgufMetadata& m) {
                          m.push_back({"llama.attention.key_length", nl::GgufValue::u32(5)});
                      })),
                      Catch::Contains("'llama.attention.key_length': expected an even head size (RoPE rotates pairs), found 5"));
    CHECK_THROWS_WITH(nl::load_pretrained(rewritten("values.gguf", [&](nl::GgufMetadata& m) {
                          m.push_back({"llama.attention.key_length", nl::GgufValue::u32(4)});
                          m.push_back({"llama.attention.value_length", nl::GgufValue::u32(8)});
                      })),
                      Catch::Contains("'llama.attention.value_length' 8: normlab's values have the keys' head size, "
                                      "llama.attention.key_length 4"));
    CHECK_THROWS_WITH(nl::load_pretrained(rewritten("wide.gguf", [&](nl::GgufMetadata& m) {
                          m.push_back({"llama.attention.key_length", nl::GgufValue::u32(6)});
                          set(m, "llama.rope.dimension_count", nl::GgufValue::u32(6));
                      })),
                      Catch::Contains("attn_q.weight"));

    // A quantized tensor: the type byte of blk.0.attn_q.weight's info set to Q4_0 (2).
    std::string bytes = nl_test::read_text(dir / "m.gguf");
    const std::string name = "blk.0.attn_q.weight";
    const size_t at = bytes.find(name);
    REQUIRE(at != std::string::npos);
    const size_t type_at = at + name.size() + 4 + 2 * 8;  // n_dims, two ne
    REQUIRE(bytes[type_at] == 0);                            // F32
    bytes[type_at] = 2;
    write_text(dir / "q4.gguf", bytes);
    CHECK_THROWS_WITH(nl::load_pretrained(dir / "q4.gguf"), Catch::Contains("Q4_0"));
}

TEST_CASE("interop: `model.init_from` starts training from a transformers directory or a GGUF file", "[interop][train]") {
    TempDir dir("interop_init");
    const std::string text = dir / "text.txt";
    write_text(text, "hello world, hello normlab. hello again, world; the end.\n");
    json base = {{"data", {{"source", "text"}, {"path", text}, {"seq_len", 8}, {"eval_sequences", 4}, {"val_fraction", 0.3}}},
                 {"model", {{"dim", 16}, {"n_layers", 1}, {"n_heads", 2}, {"multiple_of", 8}, {"max_seq_len", 16},
                            {"rope_theta", 300.0}, {"norm", {{"eps", 1e-6}}}}},
                 {"optim", {{"warmup_steps", 0}, {"lr", 0.01}}},
                 {"train", {{"steps", 3}, {"batch_size", 4}, {"eval_every", 0}}}};
    nl::TrainJob job;
    job.config = base;
    job.config_name = "init";
    job.out = dir / "first";
    REQUIRE(nl::run_train(job).complete);
    const nl::TrainCheckpoint first = nl::load_train_checkpoint(dir / "first");
    nl::export_model(*first.model, first.vocab->codepoints(), {"hf", dir / "hf"});
    nl::export_model(*first.model, first.vocab->codepoints(), {"gguf", dir / "m.gguf"});

    for (const std::string& source : {dir / "hf", dir / "m.gguf"}) {
        INFO(source);
        // The architecture comes from the file: none of it is given here.
        json config = {{"data", base["data"]}, {"model", {{"init_from", source}}}, {"optim", {{"warmup_steps", 0}, {"lr", 0.0}, {"min_lr", 0.0}, {"weight_decay", 0.0}}},
                       {"train", {{"steps", 1}, {"batch_size", 4}, {"eval_every", 0}}}};
        job.config = config;
        job.out = dir / ("from_" + fs::path(source).filename().string());
        const nl::TrainResult r = nl::run_train(job);
        REQUIRE(r.complete);
        const nl::TrainCheckpoint ck = nl::load_train_checkpoint(job.out);
        // lr 0: the weights are the file's, unchanged.
        require_same_state(first.model->state_dict(), ck.model->state_dict());
        const json& model = ck.config.resolved["model"];
        CHECK(model["dim"] == 16);
        CHECK(model["rope_theta"] == 300.0);
        CHECK(model["max_seq_len"] == 16);
        CHECK(model["vocab_size"] == first.vocab->size());
        CHECK(model["init_from"] == source);
        // sample reads the checkpoint alone.
        nl::SampleJob sample;
        sample.checkpoint = job.out;
        sample.prompt = "hello";
        sample.temperature = 0.0;
        sample.max_new_tokens = 6;
        nl::SampleJob direct = sample;
        direct.checkpoint = source;
        CHECK(nl::run_sample(sample).text == nl::run_sample(direct).text);
    }

    // Every key given explicitly that differs from the file is named, in one error.
    json differ = {{"data", base["data"]},
                   {"model", {{"init_from", dir / "hf"}, {"dim", 32}, {"n_heads", 2}, {"rope_theta", 10000.0}, {"norm", {{"type", "layernorm"}}}}},
                   {"optim", {{"warmup_steps", 0}}},
                   {"train", {{"steps", 1}}}};
    job.config = differ;
    job.out = dir / "differ";
    CHECK_THROWS_WITH(nl::run_train(job), Catch::Contains("the config's architecture differs from the file's") &&
                                              Catch::Contains("/model/dim is 32 here, 16 in the file") &&
                                              Catch::Contains("/model/rope_theta is 10000 here, 300 in the file") &&
                                              Catch::Contains("/model/norm/type is \"layernorm\" here") &&
                                              !Catch::Contains("/model/n_heads"));
    // Text whose characters are not the file's.
    write_text(dir / "other.txt", "zzzz yyyy xxxx wwww vvvv uuuu tttt ssss rrrr qqqq\n");
    json other = {{"data", {{"source", "text"}, {"path", dir / "other.txt"}, {"seq_len", 8}, {"eval_sequences", 2}, {"val_fraction", 0.3}}},
                  {"model", {{"init_from", dir / "m.gguf"}}},
                  {"optim", {{"warmup_steps", 0}}},
                  {"train", {{"steps", 1}}}};
    job.config = other;
    job.out = dir / "other";
    CHECK_THROWS_WITH(nl::run_train(job), Catch::Contains("characters are not the text's"));
    other["model"]["init_from"] = dir / "nowhere";
    job.config = other;
    CHECK_THROWS_WITH(nl::run_train(job), Catch::Contains("nowhere: no such file or directory"));
}

TEST_CASE("model.head_dim: a head size of its own trains, reloads, exports and starts another run", "[interop][train]") {
    TempDir dir("interop_head_dim_train");
    // 3 heads of 6 at width 16: no head size divides the width.
    const json data = {{"source", "synthetic"}, {"task", "reverse"}, {"length", 4}, {"eval_sequences", 8}};
    nl::TrainJob job;
    job.config = {{"data", data},
                  {"model", {{"dim", 16}, {"n_layers", 1}, {"n_heads", 3}, {"head_dim", 6}, {"multiple_of", 8},
                             {"max_seq_len", 16}}},
                  {"optim", {{"warmup_steps", 0}, {"lr", 0.01}}},
                  {"train", {{"steps", 2}, {"batch_size", 4}, {"eval_every", 0}}}};
    job.config_name = "head_dim";
    job.out = dir / "first";
    REQUIRE(nl::run_train(job).complete);
    const nl::TrainCheckpoint first = nl::load_train_checkpoint(dir / "first");
    CHECK(first.config.resolved["model"]["head_dim"] == 6);
    CHECK(first.model->options().head_dim == 6);
    CHECK(first.model->state_dict()[1].second.shape() == nl::Shape{18, 16});  // wq: 3 x 6, 16
    CHECK(first.model->state_dict()[4].second.shape() == nl::Shape{16, 18});  // wo: 16, 3 x 6
    // A config without the key keeps config.json as it was: no head_dim there.
    nl::TrainJob plain = job;
    plain.config["model"].erase("head_dim");
    plain.config["model"]["n_heads"] = 2;
    plain.out = dir / "plain";
    REQUIRE(nl::run_train(plain).complete);
    CHECK_FALSE(nl::load_train_checkpoint(dir / "plain").config.resolved["model"].contains("head_dim"));

    nl::export_model(*first.model, {}, {"hf", dir / "hf"});
    CHECK(nl::load_json_file(dir / "hf/config.json")["head_dim"] == 6);
    job.config = {{"data", data}, {"model", {{"init_from", dir / "hf"}}},
                  {"optim", {{"warmup_steps", 0}, {"lr", 0.0}, {"min_lr", 0.0}, {"weight_decay", 0.0}}},
                  {"train", {{"steps", 1}, {"batch_size", 4}, {"eval_every", 0}}}};
    job.out = dir / "from_hf";
    REQUIRE(nl::run_train(job).complete);
    const nl::TrainCheckpoint again = nl::load_train_checkpoint(dir / "from_hf");
    CHECK(again.config.resolved["model"]["head_dim"] == 6);
    require_same_state(first.model->state_dict(), again.model->state_dict());
    // A config that names another head size than the file's is told so.
    job.config["model"]["head_dim"] = 8;
    job.out = dir / "differ";
    CHECK_THROWS_WITH(nl::run_train(job), Catch::Contains("/model/head_dim is 8 here, 6 in the file"));

    // Bad input: one line, exit 2, naming the key.
    const std::string cli = nl_test::make_temp_dir("head_dim_errors");
    for (const auto& [sets, parts] : std::vector<std::pair<std::string, std::vector<std::string>>>{
             {"--set model.head_dim=7", {"/model/head_dim", "even", "7"}},
             {"--set model.head_dim=0", {"/model/head_dim", "0"}},
             {"--set model.n_heads=3 --set model.n_kv_heads=3", {"/model/n_heads", "dividing dim=64", "/model/head_dim"}}}) {
        INFO(sets);
        nl_test::check_one_line_error(nl_test::train_toy_in(cli, sets), cli, parts);
    }
    CHECK(nl_test::train_toy_in(cli, "--set model.n_heads=3 --set model.n_kv_heads=3 --set model.head_dim=8 "
                                     "--set train.steps=2 --set optim.warmup_steps=1").status == 0);
    // The C++ options name the head size they cannot take.
    nl::TransformerOptions odd;
    odd.vocab_size = 8;
    odd.head_dim = 5;
    CHECK_THROWS_WITH(odd.validate(), Catch::Contains("head dim = head_dim = 5 must be even"));
    odd.head_dim = -2;
    CHECK_THROWS_WITH(odd.validate(), Catch::Contains("head_dim must be >= 0 (0: dim / n_heads), found -2"));
}

TEST_CASE("interop: `model.init_from` of a Qwen3 or OLMo 2 directory takes its QK-norm and norm placement", "[interop][train]") {
    TempDir dir("interop_init_qk");
    const std::string text = dir / "text.txt";
    write_text(text, "hello world, hello normlab. hello again, world; the end.\n");
    const json data = {{"source", "text"}, {"path", text}, {"seq_len", 8}, {"eval_sequences", 4}, {"val_fraction", 0.3}};
    for (const json& arch : {json{{"qk_norm", "head"}}, json{{"qk_norm", "full"}, {"norm_placement", "output"}}}) {
        INFO(arch.dump());
        json model = {{"dim", 16}, {"n_layers", 1}, {"n_heads", 2}, {"multiple_of", 8}, {"max_seq_len", 16}};
        model.update(arch);
        nl::TrainJob job;
        job.config = {{"data", data}, {"model", model}, {"optim", {{"warmup_steps", 0}, {"lr", 0.01}}},
                      {"train", {{"steps", 2}, {"batch_size", 4}, {"eval_every", 0}}}};
        job.config_name = "init_qk";
        job.out = dir / "first";
        fs::remove_all(job.out);
        REQUIRE(nl::run_train(job).complete);
        const nl::TrainCheckpoint first = nl::load_train_checkpoint(dir / "first");
        const std::string hf = dir / ("hf_" + arch["qk_norm"].get<std::string>());
        nl::export_model(*first.model, first.vocab->codepoints(), {"hf", hf});

        job.config = {{"data", data}, {"model", {{"init_from", hf}}},
                      {"optim", {{"warmup_steps", 0}, {"lr", 0.0}, {"min_lr", 0.0}, {"weight_decay", 0.0}}},
                      {"train", {{"steps", 1}, {"batch_size", 4}, {"eval_every", 0}}}};
        job.out = dir / ("from_" + arch["qk_norm"].get<std::string>());
        REQUIRE(nl::run_train(job).complete);
        const nl::TrainCheckpoint ck = nl::load_train_checkpoint(job.out);
        require_same_state(first.model->state_dict(), ck.model->state_dict());
        CHECK(ck.config.resolved["model"]["qk_norm"] == arch["qk_norm"]);
        CHECK(ck.config.resolved["model"]["norm_placement"] == arch.value("norm_placement", "pre"));
        CHECK(ck.config.model.qk_norm == arch["qk_norm"].get<std::string>());

        // A placement or QK-norm given that is not the file's is named.
        job.config["model"]["norm_placement"] = "peri";
        job.config["model"]["qk_norm"] = "none";
        job.out = dir / "differ";
        CHECK_THROWS_WITH(nl::run_train(job), Catch::Contains("/model/norm_placement is \"peri\" here, \"" +
                                                              arch.value("norm_placement", "pre") + "\" in the file") &&
                                                  Catch::Contains("/model/qk_norm is \"none\" here, " + arch["qk_norm"].dump() +
                                                                  " in the file"));
    }
}

TEST_CASE("interop: normlab reads transformers' tiny LLaMA and gives its logits (tests/reference/interop)", "[interop][reference]") {
    const nl::SafeTensorsFile fixture = nl::load_safetensors(kFixtures + "/hf_tiny_logits.safetensors");
    const nl::Tensor& ids = fixture.at("ids");
    for (const char* name : {"hf_tiny", "hf_tiny_sharded"}) {
        INFO(name);
        const nl::PretrainedModel p = nl::load_pretrained(kFixtures + "/" + name);
        CHECK(p.options.n_kv_heads == 2);
        CHECK(p.options.rope_theta == 5000.0);
        auto model = model_of(p);
        const double rel = relative_difference(logits_of(*model, ids), fixture.at("logits"));
        INFO("max relative difference " << rel);
        CHECK(rel < 1e-5);
        // Greedy tokens as transformers' generate().
        const std::vector<double> greedy = fixture.at("greedy").to_vector();
        CHECK(greedy_continuation(*model, greedy, p.options.max_seq_len) == greedy);
    }
    const nl::PretrainedModel tied = nl::load_pretrained(kFixtures + "/hf_tiny_tied");
    CHECK(relative_difference(logits_of(*model_of(tied), ids), fixture.at("logits_tied")) < 1e-5);

    // Exported again, the tensors are transformers' own, bit for bit, under its names.
    TempDir dir("interop_hf_again");
    const nl::PretrainedModel p = nl::load_pretrained(kFixtures + "/hf_tiny");
    nl::export_model(*model_of(p), {}, {"hf", dir / "hf"});
    require_same_tensors(dir / "hf/model.safetensors", kFixtures + "/hf_tiny/model.safetensors");
}

TEST_CASE("interop: normlab reads transformers' tiny Qwen3 and OLMo 2 and gives their logits (tests/reference/interop)", "[interop][reference]") {
    const nl::SafeTensorsFile fixture = nl::load_safetensors(kFixtures + "/hf_tiny_qwen3_olmo2_logits.safetensors");
    const nl::Tensor& ids = fixture.at("ids");
    for (const std::string arch : {"qwen3", "olmo2"}) {
        INFO(arch);
        const nl::PretrainedModel p = nl::load_pretrained(kFixtures + "/hf_tiny_" + arch);
        CHECK(p.options.qk_norm == (arch == "qwen3" ? "head" : "full"));
        CHECK(p.options.norm_placement == (arch == "qwen3" ? "pre" : "output"));
        CHECK(p.options.n_kv_heads == 2);
        CHECK(p.options.rope_theta == 5000.0);
        CHECK(nl::swiglu_hidden_dim(p.options.ffn_hidden_dim, p.options.multiple_of) == 45);
        auto model = model_of(p);
        const double rel = relative_difference(logits_of(*model, ids), fixture.at("logits_" + arch));
        INFO("max relative difference " << rel);
        CHECK(rel < 1e-5);
        // Greedy tokens as transformers' generate(do_sample=False), through normlab's sampler at
        // temperature 0 (`normlab sample`'s greedy path).
        const std::vector<double> greedy = fixture.at("greedy_" + arch).to_vector();
        CHECK(greedy_continuation(*model, greedy, p.options.max_seq_len) == greedy);

        // Exported again, the tensors are transformers' own, bit for bit, under its names.
        TempDir dir("interop_" + arch + "_again");
        nl::export_model(*model, {}, {"hf", dir / "hf"});
        require_same_tensors(dir / "hf/model.safetensors", kFixtures + "/hf_tiny_" + arch + "/model.safetensors");
        const json config = nl::load_json_file(dir / "hf/config.json");
        CHECK(config["model_type"] == arch);
    }
}

TEST_CASE("interop: a Qwen3 whose head_dim is not hidden / heads gives transformers' logits, and goes back bit for bit",
          "[interop][reference]") {
    const nl::SafeTensorsFile fixture = nl::load_safetensors(kFixtures + "/hf_tiny_qwen3_head_dim_logits.safetensors");
    const nl::PretrainedModel p = nl::load_pretrained(kFixtures + "/hf_tiny_qwen3_head_dim");
    REQUIRE(p.options.head_dim == 16);
    CHECK(p.options.dim == 32);
    CHECK(p.options.n_heads == 4);
    auto model = model_of(p);
    const auto attention = model->layer(0)->attention();
    CHECK(attention->head_dim() == 16);
    CHECK(attention->named_parameters()[0].second.shape() == nl::Shape{64, 32});  // wq: heads x head_dim, dim
    const double rel = relative_difference(logits_of(*model, fixture.at("ids")), fixture.at("logits"));
    INFO("max relative difference " << rel);
    CHECK(rel < 1e-5);
    const std::vector<double> greedy = fixture.at("greedy").to_vector();
    CHECK(greedy_continuation(*model, greedy, p.options.max_seq_len) == greedy);  // through the KV cache

    // Exported to transformers: its tensors bit for bit, head_dim in config.json.
    TempDir dir("interop_head_dim");
    nl::export_model(*model, {}, {"hf", dir / "hf"});
    require_same_tensors(dir / "hf/model.safetensors", kFixtures + "/hf_tiny_qwen3_head_dim/model.safetensors");
    CHECK(nl::load_json_file(dir / "hf/config.json")["head_dim"] == 16);

    // GGUF: llama.cpp's key and value lengths carry it; read back, the same weights and head size.
    nl::TransformerOptions llama = p.options;
    llama.qk_norm = "none";  // llama.cpp's "llama" has no QK-norm
    nl::Transformer plain(llama);
    nl::export_model(plain, {}, {"gguf", dir / "m.gguf"});
    const nl::GgufFile file = nl::load_gguf(dir / "m.gguf");
    CHECK(file.uint_at("llama.attention.key_length") == 16);
    CHECK(file.uint_at("llama.attention.value_length") == 16);
    CHECK(file.uint_at("llama.rope.dimension_count") == 16);
    const nl::PretrainedModel from_gguf = nl::load_pretrained(dir / "m.gguf");
    CHECK(from_gguf.options.head_dim == 16);
    require_same_state(plain.state_dict(), from_gguf.weights);

    // OLMo 2 has no head size of its own: refused by name.
    nl::TransformerOptions olmo = p.options;
    olmo.norm_placement = "output";
    olmo.qk_norm = "full";
    CHECK_THROWS_WITH(nl::hf_architecture(olmo), Catch::Contains("model.head_dim 16") && Catch::Contains("Olmo2ForCausalLM"));
}

TEST_CASE("interop: llama.cpp on a GGUF normlab exported: its logits and greedy tokens are normlab's", "[interop][reference]") {
    const nl::SafeTensorsFile fixture = nl::load_safetensors(kFixtures + "/llamacpp_logits.safetensors");
    const nl::PretrainedModel p = nl::load_pretrained(kFixtures + "/normlab_char.gguf");
    REQUIRE_FALSE(p.char_vocab.empty());
    auto model = model_of(p);
    const double rel = relative_difference(logits_of(*model, fixture.at("ids")), fixture.at("logits"));
    INFO("max relative difference " << rel);
    CHECK(rel < 1e-5);
    const std::vector<double> greedy = fixture.at("greedy").to_vector();
    CHECK(greedy_continuation(*model, greedy, p.options.max_seq_len) == greedy);
    // llama.cpp's tokenizer and transformers' on the exported tokenizer give normlab's ids.
    nl::TextVocab vocab{json(p.char_vocab)};
    const std::string text = fixture.metadata.at("text");
    const std::vector<double> expected = fixture.at("text_ids").to_vector();
    const std::vector<int64_t> ours = vocab.encode(text);
    CHECK(std::vector<double>(ours.begin(), ours.end()) == expected);
    if (fixture.contains("hf_text_ids")) CHECK(fixture.at("hf_text_ids").to_vector() == expected);
}

TEST_CASE("interop: `normlab export` and `normlab sample` on the command line, mistakes as one line and exit 2", "[interop][cli]") {
    TempDir dir("interop_cli");
    auto model = tiny_model();
    nl::save_checkpoint(dir / "bare.safetensors", *model);  // no train config: not a train checkpoint
    nl_test::CliRun r = nl_test::run_normlab_in(dir.path, "export bare.safetensors --to hf out");
    CHECK(r.status == 2);
    CHECK_THAT(r.output, Catch::StartsWith("normlab: error: ") && Catch::Contains("not a normlab train checkpoint"));
    CHECK_FALSE(fs::exists(dir / "out"));

    nl::export_model(*model, {}, {"hf", dir / "hf"});
    r = nl_test::run_normlab_in(dir.path, "export hf --to gguf m.gguf --dtype f16");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.output, Catch::Contains("-> m.gguf (GGUF, llama.cpp's llama, ") && Catch::Contains(" parameters in f16"));
    CHECK(nl::load_gguf(dir / "m.gguf").tensor("token_embd.weight").dtype() == nl::DType::F16);
    nl::export_model(*tiny_model(olmo2_options()), {}, {"hf", dir / "olmo2"});
    r = nl_test::run_normlab_in(dir.path, "export olmo2 --to hf olmo2_again");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.output, Catch::Contains("-> olmo2_again (transformers Olmo2ForCausalLM, "));
    r = nl_test::run_normlab_in(dir.path, "export olmo2 --to gguf olmo2.gguf");
    CHECK(r.status == 2);
    CHECK_THAT(r.output, Catch::Contains("export --to gguf: model.norm_placement \"output\" has no form in llama.cpp's"));
    r = nl_test::run_normlab_in(dir.path, "export hf --to gguf m.gguf");
    CHECK(r.status == 2);
    CHECK_THAT(r.output, Catch::Contains("m.gguf: already exists (--force replaces it)"));
    r = nl_test::run_normlab_in(dir.path, "export hf --to onnx m.onnx");
    CHECK(r.status == 2);
    CHECK_THAT(r.output, Catch::Contains("--to must be hf or gguf, got 'onnx'"));
    r = nl_test::run_normlab_in(dir.path, "export hf --to gguf x.gguf --dtype f64");
    CHECK(r.status == 2);
    CHECK_THAT(r.output, Catch::Contains("--dtype must be f32, f16 or bf16, got 'f64'"));
    r = nl_test::run_normlab_in(dir.path, "export hf --to gguf");
    CHECK(r.status == 2);

    r = nl_test::run_normlab_in(dir.path, "sample m.gguf --prompt '1 2 3' --max-new-tokens 5 --temperature 0");
    INFO(r.output);
    REQUIRE(r.status == 0);
    nl_test::CliRun hf = nl_test::run_normlab_in(dir.path, "sample hf --prompt '1 2 3' --max-new-tokens 5 --temperature 0");
    REQUIRE(hf.status == 0);
    CHECK(r.output.substr(0, r.output.find('\n')).rfind("1 2 3 ", 0) == 0);
    r = nl_test::run_normlab_in(dir.path, "sample hf --prompt '1 19'");
    CHECK(r.status == 2);
    CHECK_THAT(r.output, Catch::Contains("token id 19 is outside the model's vocab [0, 19)"));
}
