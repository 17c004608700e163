// Checkpoints: model + optimizer + RNG + step round trips (and resume bit-identically), the file's
// PyTorch names, and clear errors for mismatched or corrupt files.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "core/safetensors.h"
#include "layers/checkpoint.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/norms.h"
#include "layers/transformer.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "test_util.h"

using namespace nl;
namespace fs = std::filesystem;

namespace {

using nl_test::TempDir;

TransformerOptions tiny_options(uint64_t seed, int64_t n_layers = 1, int64_t dim = 8) {
    TransformerOptions o;
    o.vocab_size = 11;
    o.dim = dim;
    o.n_layers = n_layers;
    o.n_heads = 2;
    o.n_kv_heads = 1;
    o.multiple_of = 4;
    o.max_seq_len = 8;
    o.seed = seed;
    return o;
}

// One training step of next-token prediction on fixed ids.
void train_step(Transformer& model, Optimizer& opt) {
    const Tensor ids = from_vector(std::vector<int64_t>{1, 4, 2, 7, 3, 3, 9, 0, 5, 6, 10, 2}, {2, 6});
    const Tensor targets = from_vector(std::vector<int64_t>{4, 2, 7, 3, 3, 9, 5, 6, 10, 2, 1, 8}, {2, 6});
    opt.zero_grad();
    Var loss = cross_entropy_loss(model.forward(ids), targets);
    loss.backward();
    opt.step();
}

void require_same_params(const Module& a, const Module& b) {
    const NamedTensors sa = a.state_dict(), sb = b.state_dict();
    REQUIRE(sa.size() == sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
        INFO(sa[i].first);
        REQUIRE(sa[i].first == sb[i].first);
        REQUIRE(max_abs_diff(sa[i].second, sb[i].second) == 0.0);
    }
}

}  // namespace

TEST_CASE("checkpoint round trip: model, optimizer, rng, step and metadata, training resumes exactly",
          "[checkpoint]") {
    TempDir tmp("ckpt_roundtrip");
    const std::string path = tmp.file("ckpt.safetensors");
    Transformer model(tiny_options(1));
    AdamW opt(model.named_parameters(), adamw_defaults());
    opt.set_lr(0.01);
    Generator rng(1234);
    rand({5}, rng);  // advance the offset
    for (int i = 0; i < 2; ++i) train_step(model, opt);
    save_checkpoint(path, model, &opt, &rng, 2, {{"run", "test"}, {"note", "ünïcode ok"}});

    Transformer restored(tiny_options(2));  // other weights until loaded
    AdamW restored_opt(restored.named_parameters(), adamw_defaults());
    Generator restored_rng(0);
    const CheckpointInfo info = load_checkpoint(path, restored, &restored_opt, &restored_rng);
    CHECK(info.step == 2);
    CHECK(info.has_optimizer);
    CHECK(info.has_rng);
    CHECK(info.metadata.at("run") == "test");
    CHECK(info.metadata.at("note") == "ünïcode ok");
    CHECK(info.metadata.size() == 2);
    CHECK(restored_rng.seed() == 1234);
    CHECK(restored_rng.offset() == rng.offset());
    CHECK(restored_opt.lr() == 0.01);
    CHECK(restored_opt.step_count() == 2);
    CHECK(restored_opt.options().weight_decay == 1e-2);
    require_same_params(model, restored);

    // Continuing both gives bit-identical parameters.
    for (int i = 0; i < 2; ++i) {
        train_step(model, opt);
        train_step(restored, restored_opt);
    }
    require_same_params(model, restored);
    CHECK(max_abs_diff(rand({4}, rng), rand({4}, restored_rng)) == 0.0);

    const CheckpointInfo peek = read_checkpoint_info(path);
    CHECK(peek.step == 2);
    CHECK(peek.rng_offset == rng.offset() - 4);
}

TEST_CASE("checkpoint files use PyTorch names for the model and optim.<name> for the optimizer",
          "[checkpoint]") {
    TempDir tmp("ckpt_names");
    const std::string path = tmp.file("ckpt.safetensors");
    Transformer model(tiny_options(3));
    Adam opt(model.named_parameters(), AdamOptions{});
    train_step(model, opt);
    save_checkpoint(path, model, &opt, nullptr, 1);
    const SafeTensorsFile f = load_safetensors(path);
    for (const char* name : {"tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.attention.wk.weight",
                             "layers.0.feed_forward.w1.weight", "layers.0.attention_norm.weight",
                             "layers.0.ffn_norm.weight", "norm.weight", "output.weight",
                             "optim.layers.0.attention.wq.weight.exp_avg", "optim.output.weight.exp_avg_sq",
                             "optim.output.weight.step"}) {
        INFO(name);
        CHECK(f.contains(name));
    }
    CHECK(f.at("layers.0.attention.wk.weight").shape() == Shape{4, 8});  // n_kv_heads 1 x head_dim 4
    CHECK(f.metadata.at("normlab.format") == "checkpoint-v1");
    CHECK(f.metadata.at("normlab.optim.type") == "Adam");
    CHECK(f.metadata.at("normlab.optim.step") == "1");
    CHECK(f.metadata.at("normlab.optim.lr") == "0.001");
    CHECK(f.metadata.count("normlab.rng.seed") == 0);
    // The model part alone is a plain state_dict, loadable as weights.
    const std::string weights = tmp.file("weights.safetensors");
    save_safetensors(weights, model.state_dict());
    Transformer other(tiny_options(4));
    const CheckpointInfo info = load_checkpoint(weights, other);
    CHECK_FALSE(info.has_optimizer);
    CHECK(info.step == 0);
    require_same_params(model, other);
}

TEST_CASE("checkpoint mismatches are errors naming the key, the shapes and the file", "[checkpoint]") {
    TempDir tmp("ckpt_mismatch");
    const std::string path = tmp.file("ckpt.safetensors");
    Transformer model(tiny_options(5));
    SGDOptions so;
    so.momentum = 0.9;
    SGD opt(model.named_parameters(), so);
    train_step(model, opt);
    save_checkpoint(path, model, &opt, nullptr, 1);

    SECTION("missing keys") {
        Transformer bigger(tiny_options(5, 2));
        const Tensor before = bigger.state_dict()[0].second.clone();
        REQUIRE_THROWS_WITH(load_checkpoint(path, bigger),
                            Catch::Contains(path) && Catch::Contains("missing key(s) 'layers.1.attention.wq.weight'"));
        CHECK(max_abs_diff(bigger.state_dict()[0].second, before) == 0.0);  // untouched
    }
    SECTION("unexpected keys") {
        Transformer smaller(tiny_options(5, 0));
        REQUIRE_THROWS_WITH(load_checkpoint(path, smaller),
                            Catch::Contains(path) && Catch::Contains("unexpected key(s) 'layers.0.") &&
                                Catch::Contains("'layers.0.attention.wq.weight'"));
    }
    SECTION("shapes") {
        Transformer wider(tiny_options(5, 1, 12));
        REQUIRE_THROWS_WITH(load_checkpoint(path, wider),
                            Catch::Contains(path) && Catch::Contains("'tok_embeddings.weight' has shape [11, 8]") &&
                                Catch::Contains("[11, 12]"));
    }
    SECTION("dtypes") {
        Transformer f64(tiny_options(5));
        f64.to(DType::F64);
        REQUIRE_THROWS_WITH(load_checkpoint(path, f64), Catch::Contains("dtype f32 in the file") &&
                                                            Catch::Contains("model's is f64"));
    }
    SECTION("optimizer of another type, or none in the file, or no rng") {
        Transformer same(tiny_options(6));
        Adam adam(same.named_parameters(), AdamOptions{});
        REQUIRE_THROWS_WITH(load_checkpoint(path, same, &adam),
                            Catch::Contains(path) && Catch::Contains("from a SGD optimizer, expected Adam"));
        const std::string weights_only = tmp.file("weights_only.safetensors");
        save_checkpoint(weights_only, model);
        SGD sgd(same.named_parameters(), so);
        REQUIRE_THROWS_WITH(load_checkpoint(weights_only, same, &sgd), Catch::Contains("holds none"));
        Generator gen;
        REQUIRE_THROWS_WITH(load_checkpoint(path, same, nullptr, &gen), Catch::Contains("generator state"));
        // Model weights load without the optimizer.
        load_checkpoint(path, same);
        require_same_params(model, same);
    }
    SECTION("reserved metadata") {
        REQUIRE_THROWS_WITH(save_checkpoint(tmp.file("x.safetensors"), model, nullptr, nullptr, 0,
                                            {{"normlab.step", "3"}}),
                            Catch::Contains("reserved prefix"));
    }
}

TEST_CASE("corrupt checkpoints are clear errors, never crashes", "[checkpoint]") {
    TempDir tmp("ckpt_corrupt");
    const std::string path = tmp.file("ckpt.safetensors");
    Transformer model(tiny_options(7));
    Adam opt(model.named_parameters(), AdamOptions{});
    train_step(model, opt);
    Generator rng(3);
    save_checkpoint(path, model, &opt, &rng, 5);
    std::string bytes;
    {
        std::ifstream in(path, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    auto write = [&](const std::string& name, const std::string& content) {
        const std::string p = tmp.file(name);
        std::ofstream out(p, std::ios::binary);
        out.write(content.data(), static_cast<std::streamsize>(content.size()));
        return p;
    };
    Transformer target(tiny_options(8));
    Adam target_opt(target.named_parameters(), AdamOptions{});
    const Tensor before = target.state_dict()[0].second.clone();
    SECTION("truncated data") {
        const std::string p = write("truncated.safetensors", bytes.substr(0, bytes.size() - 10));
        REQUIRE_THROWS_AS(load_checkpoint(p, target, &target_opt), Error);
        REQUIRE_THROWS_WITH(load_checkpoint(p, target, &target_opt), Catch::Contains(p));
    }
    SECTION("truncated header") {
        const std::string p = write("header.safetensors", bytes.substr(0, 20));
        REQUIRE_THROWS_WITH(load_checkpoint(p, target), Catch::Contains(p));
    }
    SECTION("bad step metadata") {
        std::string edited = bytes;
        const size_t at = edited.find("\"normlab.step\":\"5\"");
        REQUIRE(at != std::string::npos);
        edited.replace(at, 18, "\"normlab.step\":\"x\"");
        const std::string p = write("badstep.safetensors", edited);
        REQUIRE_THROWS_WITH(load_checkpoint(p, target), Catch::Contains(p) &&
                                                            Catch::Contains("'normlab.step' should be a non-negative integer") &&
                                                            Catch::Contains("found 'x'"));
    }
    SECTION("missing file") {
        REQUIRE_THROWS_WITH(load_checkpoint(tmp.file("nope.safetensors"), target),
                            Catch::Contains("cannot open " + tmp.file("nope.safetensors")) &&
                                Catch::Contains("No such file or directory"));
    }
    CHECK(max_abs_diff(target.state_dict()[0].second, before) == 0.0);
    CHECK(target_opt.step_count() == 0);
}

TEST_CASE("save_checkpoint replaces a file atomically and reports unwritable paths", "[checkpoint]") {
    TempDir tmp("ckpt_atomic");
    const std::string path = tmp.file("ckpt.safetensors");
    Transformer model(tiny_options(9));
    save_checkpoint(path, model, nullptr, nullptr, 1);
    save_checkpoint(path, model, nullptr, nullptr, 2);
    CHECK(read_checkpoint_info(path).step == 2);
    int files = 0;
    for (const auto& entry : fs::directory_iterator(tmp.path)) {
        (void)entry;
        ++files;
    }
    CHECK(files == 1);  // no temp files left behind
    REQUIRE_THROWS_WITH(save_checkpoint(tmp.file("no/such/dir/ckpt.safetensors"), model),
                        Catch::Contains("cannot create " + tmp.file("no/such/dir/ckpt.safetensors")) &&
                            Catch::Contains("No such file or directory"));
    REQUIRE_THROWS_WITH(save_checkpoint(path, model, nullptr, nullptr, -1), Catch::Contains("step must be >= 0"));
}
