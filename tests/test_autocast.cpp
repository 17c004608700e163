// bf16 autocast (layers/autocast.h): under an AutocastGuard a Linear computes on bf16 copies of its
// input and weights and returns bf16, while its parameters stay f32 and get f32 gradients close to
// the f32 ones; outside the guard nothing changes; the transformer runs with f32 residual stream and
// norms; and `normlab train` with "autocast": "bf16" trains, keeps f32 parameters, and its
// checkpoints load (resume and sample).
//
// Tolerance: bf16 keeps 8 significant bits (unit roundoff 2^-9 ~ 0.2%). A Linear's output under
// autocast rounds x, W and the result (about 3 roundings, ~0.6% per product, partly cancelling over
// the sum); its weight gradient also rounds the incoming bf16 gradient. Differences are compared
// against the largest reference element: |autocast - f32| <= 2e-2 * max|f32| elementwise (2%, a few
// bf16 ulps of the largest element; measured worst ~0.5%).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/autograd.h"
#include "cli_test_util.h"
#include "core/allocator.h"
#include "core/safetensors.h"
#include "layers/autocast.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/transformer.h"
#include "test_util.h"

using namespace nl;
namespace fs = std::filesystem;

namespace {

constexpr double kBf16Tolerance = 2e-2;  // relative to the largest reference element (see above)

double max_abs(const Tensor& t) {
    double m = 0.0;
    for (double v : t.to_vector()) m = std::max(m, std::fabs(v));
    return m;
}

// |actual - expected| <= kBf16Tolerance * max|expected| everywhere; both compared as f64.
void check_bf16_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
    INFO(what);
    REQUIRE(actual.shape() == expected.shape());
    const std::vector<double> a = actual.to_vector(), e = expected.to_vector();
    const double scale = max_abs(expected);
    REQUIRE(scale > 0.0);
    double worst = 0.0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - e[i]));
    INFO("worst |difference| " << worst << " = " << worst / scale << " of max|expected| " << scale);
    CHECK(worst <= kBf16Tolerance * scale);
}

// A Linear (in -> out) drawn from gen.
std::shared_ptr<Linear> make_linear(int64_t in, int64_t out, Generator& gen, bool bias = true) {
    LinearOptions options;
    options.in_features = in;
    options.out_features = out;
    options.bias = bias;
    options.generator = &gen;
    return std::make_shared<Linear>(options);
}

struct LinearGrads {
    Tensor y, dx, dw, db;
};

// y = lin(x); loss = sum(y * dy) in f32; backward outside any guard (as a training step does).
LinearGrads run_linear(Linear& lin, const Tensor& x_data, const Tensor& dy, bool autocast) {
    lin.zero_grad();
    Var x(x_data, true);
    Var y;
    {
        AutocastGuard guard(DType::BF16, autocast);
        y = lin.forward(x);
    }
    Var loss = sum(to(y, DType::F32) * Var(dy));
    loss.backward();
    return {y.data(), x.grad().data(), lin.weight().grad().data(), lin.bias().grad().data()};
}

}  // namespace

TEST_CASE("autocast: a Linear under the guard returns bf16, keeps f32 weights with f32 grads close to f32's",
          "[autocast]") {
    Generator gen(7);
    const std::shared_ptr<Linear> linear = make_linear(48, 20, gen);
    Linear& lin = *linear;

    SECTION("contiguous input (B, T, in)") {
        const Tensor x = randn({3, 5, 48}, gen);
        const Tensor dy = randn({3, 5, 20}, gen);
        const LinearGrads ref = run_linear(lin, x, dy, false);
        const LinearGrads amp = run_linear(lin, x, dy, true);
        CHECK(ref.y.dtype() == DType::F32);
        CHECK(amp.y.dtype() == DType::BF16);
        // Parameters and their gradients stay f32; the input's gradient comes back in its dtype.
        CHECK(lin.weight().dtype() == DType::F32);
        CHECK(lin.bias().dtype() == DType::F32);
        CHECK(amp.dw.dtype() == DType::F32);
        CHECK(amp.db.dtype() == DType::F32);
        CHECK(amp.dx.dtype() == DType::F32);
        check_bf16_close(amp.y, ref.y, "output");
        check_bf16_close(amp.dw, ref.dw, "weight grad");
        check_bf16_close(amp.db, ref.db, "bias grad");
        check_bf16_close(amp.dx, ref.dx, "input grad");
        // The bf16 run really is a different computation (not the f32 one relabelled).
        CHECK(max_abs(sub(amp.dw, ref.dw)) > 0.0);
    }
    SECTION("a transposed (non-contiguous) input") {
        const Tensor x = randn({48, 6}, gen).t();  // (6, 48), strides (1, 6)
        REQUIRE_FALSE(x.is_contiguous());
        const Tensor dy = randn({6, 20}, gen);
        const LinearGrads ref = run_linear(lin, x, dy, false);
        const LinearGrads amp = run_linear(lin, x, dy, true);
        CHECK(amp.y.dtype() == DType::BF16);
        check_bf16_close(amp.y, ref.y, "output");
        check_bf16_close(amp.dw, ref.dw, "weight grad");
    }
}

TEST_CASE("autocast: outside the guard nothing changes, and guards nest and restore", "[autocast]") {
    Generator gen(3);
    const std::shared_ptr<Linear> linear = make_linear(16, 8, gen);
    Linear& lin = *linear;
    const Tensor x = randn({4, 16}, gen);

    CHECK_FALSE(is_autocast_enabled());
    const Tensor before = lin.forward(Var(x)).data();
    {
        AutocastGuard outer;
        CHECK(is_autocast_enabled());
        CHECK(autocast_dtype() == DType::BF16);
        CHECK(lin.forward(Var(x)).dtype() == DType::BF16);
        {
            AutocastGuard off(DType::BF16, false);  // a region opting out
            CHECK_FALSE(is_autocast_enabled());
            CHECK(lin.forward(Var(x)).dtype() == DType::F32);
        }
        CHECK(is_autocast_enabled());
    }
    CHECK_FALSE(is_autocast_enabled());
    const Tensor after = lin.forward(Var(x)).data();
    REQUIRE(after.dtype() == DType::F32);
    CHECK(after.to_vector() == before.to_vector());  // bit-identical

    // The helpers are the identity when off.
    Var v(x);
    CHECK(autocast_lower(v).dtype() == DType::F32);
    CHECK(autocast_f32(Var(x.to(DType::BF16))).dtype() == DType::BF16);

    // f64 is left alone (as torch.autocast does), so gradient checks under a guard stay in f64.
    LinearOptions f64 = lin.options();
    f64.dtype = DType::F64;
    Linear lin64(f64);
    {
        AutocastGuard guard;
        CHECK(lin64.forward(Var(x.to(DType::F64))).dtype() == DType::F64);
        CHECK(autocast_f32(Var(x.to(DType::BF16))).dtype() == DType::F32);
        // A mismatched input is still an error naming both dtypes.
        REQUIRE_THROWS_WITH(lin64.forward(Var(x)), Catch::Contains("Linear: expected input of dtype f64"));
    }
    REQUIRE_THROWS_WITH(AutocastGuard(DType::F32), Catch::Contains("AutocastGuard: expected bf16 or f16, found f32"));
}

TEST_CASE("autocast: a cache casts each parameter once for several forwards, with the same bits", "[autocast]") {
    // Two forwards and backwards into the same .grad (a step's two gradient shards): with a cache the
    // weight and bias are cast once and reused, and the outputs and gradients are the bits of two
    // uncached forwards.
    Generator gen(4);
    const std::shared_ptr<Linear> linear = make_linear(24, 10, gen);
    Linear& lin = *linear;
    const Tensor x1 = randn({5, 24}, gen), x2 = randn({5, 24}, gen);
    auto two_shards = [&](AutocastCache* cache) {
        lin.zero_grad();
        std::vector<float> outputs;
        for (const Tensor& x : {x1, x2}) {
            AutocastGuard guard(DType::BF16, true, cache);
            Var y = lin.forward(Var(x));
            for (float v : y.data().to(DType::F32).to_vector()) outputs.push_back(v);
            sum(autocast_f32(y) * autocast_f32(y)).backward();
        }
        return std::make_pair(outputs, lin.weight().grad().data().to_vector());
    };
    const auto plain = two_shards(nullptr);
    AutocastCache cache;
    const auto cached = two_shards(&cache);
    CHECK(cache.casts() == 2);   // weight and bias, once
    CHECK(cache.reuses() == 2);  // by the second forward
    CHECK(cached.first == plain.first);
    CHECK(cached.second == plain.second);
    REQUIRE(lin.bias().grad().defined());
    // Activations are not cached; a parameter given new data is cast again.
    lin.weight().set_data(randn({10, 24}, gen));
    {
        AutocastGuard guard(DType::BF16, true, &cache);
        lin.forward(Var(x1));
    }
    CHECK(cache.casts() == 3);
    CHECK(cache.reuses() == 3);  // the bias
    cache.clear();
    CHECK(cache.casts() == 0);
}

TEST_CASE("autocast: one cast of an input for several Linears gives the bits of a cast per Linear", "[autocast]") {
    // Attention's wq, wk, wv (and SwiGLU's w1, w3) read one bf16 copy of their input (forward_cast);
    // each Linear's node sends its gradient back to the f32 input, where the three are summed.
    Generator gen(11);
    std::vector<std::shared_ptr<Linear>> projections;
    for (int i = 0; i < 3; ++i) projections.push_back(make_linear(24, 8 + 4 * i, gen));
    const Tensor x_data = randn({6, 24}, gen);
    auto run = [&](bool shared) {
        Var x(x_data, true);
        Var h = x * 1.5;  // a non-leaf, as a norm's output is
        std::vector<double> values;
        Var loss;
        {
            AutocastGuard guard(DType::BF16);
            const Tensor h_low = autocast_lower_data(h);
            if (shared) {
                REQUIRE(h_low.defined());
                CHECK(h_low.dtype() == DType::BF16);
            }
            for (int i = 0; i < 3; ++i) {
                Linear& lin = *projections[static_cast<size_t>(i)];
                const Var y = shared ? lin.forward_cast(h, h_low) : lin.forward(h);
                CHECK(y.dtype() == DType::BF16);
                for (double v : y.data().to(DType::F32).to_vector()) values.push_back(v);
                const Var term = sum(autocast_f32(y) * autocast_f32(y)) * (1.0 + i);
                loss = loss.defined() ? loss + term : term;
            }
        }
        for (auto& p : projections) p->zero_grad();
        loss.backward();
        std::vector<double> grads = x.grad().data().to_vector();
        for (auto& p : projections)
            for (double v : p->weight().grad().data().to_vector()) grads.push_back(v);
        return std::make_pair(values, grads);
    };
    const auto per_use = run(false);
    const auto shared = run(true);
    CHECK(shared.first == per_use.first);
    CHECK(shared.second == per_use.second);
    // Outside autocast there is no copy, and forward_cast is forward.
    Var x(x_data, true);
    CHECK_FALSE(autocast_lower_data(x).defined());
    CHECK(projections[0]->forward_cast(x, Tensor()).dtype() == DType::F32);
    // A copy that is not x's autocast copy is refused, naming what was expected and found.
    AutocastGuard guard(DType::BF16);
    CHECK_THROWS_WITH(projections[0]->forward_cast(x, randn({5, 24}, gen).to(DType::BF16)),
                      Catch::Contains("autocast_linear: expected x's autocast copy ([6, 24], bf16), found ([5, 24], bf16)"));
    CHECK_THROWS_WITH(projections[0]->forward_cast(x, x_data.to(DType::F16)),
                      Catch::Contains("expected x's autocast copy ([6, 24], bf16), found ([6, 24], f16)"));
}

TEST_CASE("autocast: cross-entropy of bf16 logits is an f32 loss with the bits of an f32 copy's, without the copy",
          "[autocast]") {
    // torch.autocast computes cross_entropy in f32: a cast of the logits to f32, then the loss. The
    // fused loss reads the bf16 logits as they are; widening is exact, so its loss and its dlogits
    // (rounded to bf16 once, as the cast's backward rounds them) are those of the cast path, bit for bit.
    Generator gen(17);
    const int64_t B = 3, T = 5, V = 37;
    const Tensor logits_low = (randn({B, T, V}, gen) * 3.0).to(DType::BF16);  // (B, T, V) bf16
    std::vector<int64_t> ids(static_cast<size_t>(B * T));
    for (int64_t& id : ids) id = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(V)));
    ids[4] = -100;  // an ignored row
    const Tensor targets = from_vector(ids, {B, T});
    const Tensor upstream = randn({B, T}, gen);  // for Reduction::None
    for (Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
        INFO("reduction " << static_cast<int>(reduction));
        auto run = [&](bool copy) {
            Var logits(logits_low, true);
            Var loss;
            {
                AutocastGuard guard(DType::BF16);
                loss = cross_entropy_loss(copy ? autocast_f32(logits) : logits, targets, -100, reduction);
            }
            CHECK(loss.dtype() == DType::F32);
            if (reduction == Reduction::None) sum(loss * Var(upstream)).backward();
            else loss.backward();
            CHECK(logits.grad().dtype() == DType::BF16);
            return std::make_pair(loss.data().to_vector(), logits.grad().data().to_vector());
        };
        const auto direct = run(false);
        const auto copied = run(true);
        CHECK(direct.first == copied.first);
        CHECK(direct.second == copied.second);
        // The composed loss under autocast runs its log_softmax in f32 too: close to the fused one.
        Var logits(logits_low, true);
        AutocastGuard guard(DType::BF16);
        const Var composed = cross_entropy_loss_composed(logits, targets, -100, reduction);
        CHECK(composed.dtype() == DType::F32);
        const std::vector<double> composed_values = composed.data().to_vector();
        REQUIRE(composed_values.size() == direct.first.size());
        for (size_t i = 0; i < composed_values.size(); ++i) CHECK(composed_values[i] == Approx(direct.first[i]).epsilon(1e-5));
    }
    // Without the copy the loss's peak memory is the bf16 gradient's; the copy path adds an f32 copy
    // of the logits and an f32 gradient, five times as many bytes (normlab's counting allocator).
    {
        const Tensor wide = randn({64, 4096}, gen).to(DType::BF16);  // (rows, vocab) bf16, 512 KiB
        const Tensor wide_targets = zeros({64}, DType::I64);
        auto peak_of = [&](bool copy) {
            reset_peak(Device::cpu());
            const int64_t before = memory_stats(Device::cpu()).current_bytes;
            {
                Var logits(wide, true);
                Var loss;
                {
                    AutocastGuard guard(DType::BF16);
                    loss = cross_entropy_loss(copy ? autocast_f32(logits) : logits, wide_targets);
                }
                loss.backward();
            }
            return memory_stats(Device::cpu()).peak_bytes - before;
        };
        const int64_t direct = peak_of(false), copied = peak_of(true);
        INFO("peak bytes: read as bf16 " << direct << ", through an f32 copy " << copied);
        CHECK(direct >= wide.nbytes());  // the bf16 gradient
        CHECK(direct < wide.nbytes() + wide.nbytes() / 4);
        CHECK(copied >= 4 * wide.nbytes());  // an f32 copy and an f32 gradient at least
    }
    // Outside autocast bf16 logits give a bf16 loss, as PyTorch's F.cross_entropy does.
    CHECK(cross_entropy_loss(Var(logits_low), targets).dtype() == DType::BF16);
    // The kernel's loss dtype is the logits' or, for half logits, f32; other pairs are errors.
    CHECK(cross_entropy_forward(logits_low, targets, -100, Reduction::Mean, DType::F32).loss.dtype() == DType::F32);
    CHECK_THROWS_WITH(cross_entropy_forward(logits_low.to(DType::F32), targets, -100, Reduction::Mean, DType::BF16),
                      Catch::Contains("a loss in bf16 for f32 logits: expected the logits' dtype, or f32 for bf16/f16 logits"));
    CHECK_THROWS_WITH(cross_entropy_forward(logits_low.to(DType::F64), targets, -100, Reduction::Mean, DType::F32),
                      Catch::Contains("a loss in f32 for f64 logits"));
}

TEST_CASE("autocast: a Linear's gradients are the gemms' f32 sums, not bf16 widened back", "[autocast]") {
    // autocast_linear is one node over the f32 input and weight. Its dX = dY W_low and dW = dY^T X_low
    // come straight from f32 sums of bf16 products: compared with an f64 sum of the same bf16 values
    // within the f32 bound (k * 2^-24 * sum|terms|), and not rounded to bf16 (most elements carry more
    // than bf16's 8 significant bits).
    Generator gen(5);
    const std::shared_ptr<Linear> linear = make_linear(40, 24, gen, false);
    Linear& lin = *linear;
    const Tensor x_data = randn({3, 7, 40}, gen);
    const Tensor dy = randn({3, 7, 24}, gen);
    Var x(x_data, true);
    Var h = x * 1.0;  // a non-leaf input
    Var y;
    {
        AutocastGuard guard(DType::BF16);
        y = lin.forward(h);
    }
    REQUIRE(y.grad_fn() != nullptr);
    CHECK(y.grad_fn()->name() == "autocast_linear");
    CHECK(y.dtype() == DType::BF16);
    sum(to(y, DType::F32) * Var(dy)).backward();
    const Tensor dx = x.grad().data(), dw = lin.weight().grad().data();
    REQUIRE(dx.dtype() == DType::F32);
    REQUIRE(dw.dtype() == DType::F32);
    // The bf16 values the products read: dY rounded (y is bf16, so its gradient is), W and x rounded.
    const std::vector<double> g = dy.to(DType::BF16).to_vector(), w = lin.weight().data().to(DType::BF16).to_vector(),
                              xs = x_data.to(DType::BF16).to_vector();
    const int64_t rows = 21, in = 40, out = 24;
    int64_t not_bf16 = 0;
    auto check_sum = [&](double got, const std::vector<double>& terms) {
        double exact = 0.0, magnitude = 0.0;
        for (double t : terms) {
            exact += t;
            magnitude += std::fabs(t);
        }
        CHECK(std::fabs(got - exact) <= static_cast<double>(terms.size()) * std::ldexp(1.0, -24) * magnitude + 1e-30);
        if (static_cast<double>(bf16_to_f32(f32_to_bf16(static_cast<float>(got)))) != got) ++not_bf16;
    };
    const std::vector<double> dx_got = dx.to_vector(), dw_got = dw.to_vector();
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < in; ++i) {
            std::vector<double> terms;
            for (int64_t o = 0; o < out; ++o) terms.push_back(g[r * out + o] * w[o * in + i]);
            check_sum(dx_got[r * in + i], terms);
        }
    for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
            std::vector<double> terms;
            for (int64_t r = 0; r < rows; ++r) terms.push_back(g[r * out + o] * xs[r * in + i]);
            check_sum(dw_got[o * in + i], terms);
        }
    CHECK(not_bf16 > (rows * in + out * in) / 2);
}

TEST_CASE("autocast: matmul with an f32 result keeps bf16 operands' f32 sums, and other pairs are errors",
          "[autocast]") {
    Generator gen(3);
    const Tensor a = randn({9, 33}, gen).to(DType::BF16), b = randn({33, 17}, gen).to(DType::BF16);
    const Tensor c = matmul(a, b, DType::F32);
    REQUIRE(c.dtype() == DType::F32);
    CHECK(c.shape() == Shape{9, 17});
    // The same sums rounded once give the bf16 matmul's bits.
    CHECK(c.to(DType::BF16).to_vector() == matmul(a, b).to_vector());
    // A transposed operand and a batch, as autograd hands them.
    const Tensor at = randn({33, 9}, gen).to(DType::BF16);
    CHECK(matmul(at.t(), b, DType::F32).to(DType::BF16).to_vector() == matmul(at.t(), b).to_vector());
    // The operands' own dtype is plain matmul; anything but f32 for half operands is an error.
    CHECK(matmul(a, b, DType::BF16).to_vector() == matmul(a, b).to_vector());
    const Tensor f = randn({4, 4}, gen);
    CHECK_THROWS_WITH(matmul(f, f, DType::BF16),
                      Catch::Contains("a result in bf16 for f32 operands: expected the operands' dtype, or f32"));
    CHECK_THROWS_WITH(matmul(f.to(DType::F64), f.to(DType::F64), DType::F32), Catch::Contains("for f64 operands"));
}

TEST_CASE("autocast: a second-order backward through an autocast Linear runs on differentiable ops",
          "[autocast]") {
    Generator gen(9);
    const std::shared_ptr<Linear> linear = make_linear(12, 5, gen);
    Linear& lin = *linear;
    Var x(randn({4, 12}, gen), true);
    Var y;
    {
        AutocastGuard guard(DType::BF16);
        y = lin.forward(x * 2.0);
    }
    const Var loss = sum(to(y, DType::F32) * to(y, DType::F32));
    const std::vector<Var> first = gradients(loss, {x}, Var(), true, true);
    REQUIRE(first[0].defined());
    CHECK(first[0].dtype() == DType::F32);
    CHECK(first[0].grad_fn() != nullptr);  // recorded: it can be differentiated again
    const std::vector<Var> second = gradients(sum(first[0] * first[0]), {x});
    REQUIRE(second[0].defined());
    CHECK(second[0].dtype() == DType::F32);
    CHECK(max_abs(second[0].data()) > 0.0);
}

TEST_CASE("autocast: RoPE on bf16 is one node with the bits of widening, rotating in f32 and rounding", "[autocast]") {
    Generator gen(12);
    const RopeTables tables = rope_tables(8, 5, 10000.0, DType::F32);
    const Tensor x_data = randn({2, 5, 3, 8}, gen).to(DType::BF16);
    const Tensor dy = randn({2, 5, 3, 8}, gen).to(DType::BF16);
    auto run = [&](bool direct) {
        Var x(x_data, true);
        const Var y = direct ? apply_rope(x, tables) : to(apply_rope(to(x, DType::F32), tables), DType::BF16);
        if (direct) {
            CHECK(y.grad_fn()->name() == "rope");
            REQUIRE(y.grad_fn()->inputs().size() == 1);
            CHECK(y.grad_fn()->inputs()[0].leaf == x.impl());  // no cast node between
        }
        sum(to(y * Var(dy), DType::F32)).backward();
        CHECK(y.dtype() == DType::BF16);
        CHECK(x.grad().dtype() == DType::BF16);
        return std::make_pair(y.data().to_vector(), x.grad().data().to_vector());
    };
    const auto composed = run(false);
    const auto direct = run(true);
    CHECK(direct.first == composed.first);
    CHECK(direct.second == composed.second);
}

TEST_CASE("autocast: the transformer gives bf16 logits, f32 parameters and grads, a loss close to f32's",
          "[autocast]") {
    TransformerOptions options;
    options.vocab_size = 11;
    options.dim = 32;
    options.n_layers = 2;
    options.n_heads = 4;
    options.n_kv_heads = 2;  // grouped-query attention too
    options.max_seq_len = 16;
    options.seed = 5;
    Transformer model(options);
    Generator gen(9);
    std::vector<int64_t> ids_values, target_values;
    for (int i = 0; i < 2 * 12; ++i) ids_values.push_back(static_cast<int64_t>(gen.next_below(11)));
    for (int i = 0; i < 2 * 12; ++i) target_values.push_back(static_cast<int64_t>(gen.next_below(11)));
    const Tensor ids = from_vector(ids_values, {2, 12});
    const Tensor targets = from_vector(target_values, {2, 12});

    auto step = [&](bool autocast) {
        model.zero_grad();
        Var logits;
        {
            AutocastGuard guard(DType::BF16, autocast);
            logits = model.forward(ids);
            CHECK(logits.dtype() == (autocast ? DType::BF16 : DType::F32));
            logits = autocast_f32(logits);
        }
        Var loss = cross_entropy_loss(logits, targets);
        loss.backward();
        NamedTensors grads;
        for (const auto& [name, p] : model.named_parameters()) {
            INFO(name);
            CHECK(p.dtype() == DType::F32);
            REQUIRE(p.grad().defined());
            CHECK(p.grad().dtype() == DType::F32);
            grads.emplace_back(name, p.grad().data().clone());
        }
        return std::make_pair(loss.item(), grads);
    };
    const auto [loss32, grads32] = step(false);
    const auto [loss16, grads16] = step(true);
    CHECK(loss16 == Approx(loss32).epsilon(kBf16Tolerance));
    CHECK(loss16 != loss32);
    // Whole-model gradients go through many bf16 roundings; compare each parameter's gradient by its
    // norm (a scale bug changes it by far more than 10%) and element by element through the cosine of
    // the two (a flipped sign, a transpose or shuffled elements bring it far below 0.99).
    for (size_t i = 0; i < grads32.size(); ++i) {
        INFO(grads32[i].first);
        REQUIRE(grads16[i].first == grads32[i].first);
        const double n32 = std::sqrt(sum(square(grads32[i].second)).item());
        const double n16 = std::sqrt(sum(square(grads16[i].second)).item());
        REQUIRE(n32 > 0.0);
        CHECK(n16 == Approx(n32).epsilon(0.1));
        const double cosine = sum(mul(grads32[i].second, grads16[i].second)).item() / (n32 * n16);
        INFO("cosine " << cosine);
        CHECK(cosine > 0.99);
    }
}

// ---- `normlab train` with "autocast": "bf16" ----

namespace {

using nl_test::TempDir;

nl_test::CliRun run_in(const TempDir& dir, const std::string& args) {
    return nl_test::run_normlab_env(dir.path.string(), "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive ", args);
}

std::string toy_config() { return nl_test::shell_arg(std::string(NORMLAB_SOURCE_DIR) + "/configs/toy_transformer.json"); }

// A short run, long enough for the loss to fall clearly.
const std::string kShortAutocast =
    " --quiet --set train.steps=30 --set optim.warmup_steps=3 --set train.eval_every=15 --set train.batch_size=16 "
    "--set data.eval_sequences=64 --set train.checkpoint_every=15 --set train.autocast=bf16";

// The train_loss column of metrics.csv.
std::vector<double> train_losses(const std::string& path) { return nl_test::train_losses(path); }

double mean_of(const std::vector<double>& values, size_t from, size_t count) {
    double total = 0.0;
    for (size_t i = from; i < from + count; ++i) total += values[i];
    return total / static_cast<double>(count);
}

}  // namespace

TEST_CASE("autocast: train with autocast bf16 trains, keeps f32 parameters, and its checkpoints load",
          "[autocast]") {
    TempDir dir("autocast_train");
    nl_test::CliRun run = run_in(dir, "train " + toy_config() + " --out run" + kShortAutocast);
    INFO(run.output);
    REQUIRE(run.status == 0);

    const auto resolved = nlohmann::json::parse(nl_test::read_text(dir / "run/config.json"));
    CHECK(resolved["train"]["autocast"] == "bf16");
    const auto summary = nlohmann::json::parse(nl_test::read_text(dir / "run/summary.json"));
    CHECK(summary["autocast"] == "bf16");

    // The loss goes down: the mean of the last 5 steps well below the first 5 (log 11 = 2.4 at start).
    const std::vector<double> losses = train_losses(dir / "run/metrics.csv");
    REQUIRE(losses.size() == 30);
    for (double loss : losses) CHECK(std::isfinite(loss));
    CHECK(mean_of(losses, 25, 5) < mean_of(losses, 0, 5) - 0.2);

    // Every floating tensor of the checkpoint (model weights, AdamW moments) is f32: master weights.
    const SafeTensorsFile checkpoint = load_safetensors(dir / "run/checkpoints/step_00000030.safetensors");
    int64_t floating = 0;
    for (const auto& [name, tensor] : checkpoint.tensors) {
        INFO(name);
        if (tensor.dtype() == DType::I64) continue;
        CHECK(tensor.dtype() == DType::F32);
        ++floating;
    }
    CHECK(floating > 0);

    // The checkpoints load: an interrupted autocast run resumes from one and finishes...
    nl_test::CliRun part = run_in(dir, "train " + toy_config() + " --out part --stop-after 15" + kShortAutocast);
    INFO(part.output);
    REQUIRE(part.status == 0);
    nl_test::CliRun resumed = run_in(dir, "train " + toy_config() + " --out part --resume" + kShortAutocast);
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    CHECK(fs::exists(dir / "part/summary.json"));
    // ... bit-identically to the uninterrupted one (the autocast forward is deterministic too).
    CHECK(train_losses(dir / "part/metrics.csv") == losses);

    // ... and `normlab sample` loads the final one into an f32 model.
    nl_test::CliRun sample = run_in(dir, "sample run --num 4 --temperature 0");
    INFO(sample.output);
    CHECK(sample.status == 0);
    CHECK_THAT(sample.output, Catch::Contains("/4 correct"));
}

TEST_CASE("autocast: a bad autocast value is a config error naming /train/autocast", "[autocast]") {
    TempDir dir("autocast_bad");
    nl_test::CliRun run = run_in(dir, "train " + toy_config() + " --out run --quiet --set train.autocast=fp16");
    INFO(run.output);
    CHECK(run.status == 2);
    CHECK_THAT(run.output, Catch::Contains("toy_transformer.json: /train/autocast: expected one of none, bf16, got \"fp16\""));
    CHECK_FALSE(fs::exists(dir / "run"));
}

TEST_CASE("autocast: the shipped text configs' bf16 loss curves follow their f32 curves", "[autocast][cli]") {
    // The toy transformer's curve is held to 2% of f32's on every bf16 engine in test_bgemm; these
    // are the character-level configs users train, at their own sizes, for 30 steps of each. Their
    // curves measured within 1e-4 of f32's, step by step; the bound is 0.5%.
    TempDir dir("autocast_configs");
    for (const std::string name : {"char_text.json", "shakespeare_char.json"}) {
        INFO(name);
        const std::string cfg = "train " + nl_test::shell_arg(std::string(NORMLAB_SOURCE_DIR) + "/configs/" + name) +
                                " --quiet --set train.steps=30 --set optim.warmup_steps=5 --set train.eval_every=0 "
                                "--set train.checkpoint_every=0";
        const std::string stem = name.substr(0, name.find('.'));
        nl_test::CliRun f32 = run_in(dir, cfg + " --out " + stem + "_f32");
        INFO(f32.output);
        REQUIRE(f32.status == 0);
        nl_test::CliRun bf16 = run_in(dir, cfg + " --out " + stem + "_bf16 --set train.autocast=bf16");
        INFO(bf16.output);
        REQUIRE(bf16.status == 0);
        const std::vector<double> curve_f32 = train_losses(dir / (stem + "_f32/metrics.csv"));
        const std::vector<double> curve_bf16 = train_losses(dir / (stem + "_bf16/metrics.csv"));
        REQUIRE(curve_f32.size() == 30);
        REQUIRE(curve_bf16.size() == 30);
        for (size_t step = 0; step < curve_f32.size(); ++step) {
            INFO("step " << step + 1);
            CHECK(curve_bf16[step] == Approx(curve_f32[step]).epsilon(5e-3));
        }
        // The runs trained: the loss fell from its start (log 65 = 4.17 for char_text's alphabet).
        CHECK(mean_of(curve_bf16, 25, 5) < mean_of(curve_bf16, 0, 5) - 0.3);
        // ... and bf16 is not f32 under another name: some step's loss differs.
        CHECK(curve_bf16 != curve_f32);
    }
}
