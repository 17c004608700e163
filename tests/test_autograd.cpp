// Autograd engine tests: leaf/non-leaf grads, accumulation, retain_graph and freed graphs, no-grad
// mode, memory returned after backward, create_graph, gradients(), make_result and error messages.
#include <catch2/catch.hpp>

#include "autograd/autograd.h"

using namespace nl;

namespace {

Tensor rnd(const Shape& shape, uint64_t seed, DType dtype = DType::F64) {
    Generator gen(seed);
    return randn(shape, gen, dtype);
}

int64_t cpu_bytes() { return memory_stats(Device::cpu()).current_bytes; }

}  // namespace

TEST_CASE("autograd: leaf gets .grad, non-leaf only with retain_grad", "[autograd]") {
    Var x(from_vector(std::vector<double>{1, 2, 3}, {3}, DType::F64), true);
    Var y = x * 2.0;
    Var z = y * y;  // 4 x^2
    REQUIRE(x.is_leaf());
    REQUIRE_FALSE(y.is_leaf());
    REQUIRE(y.grad_fn()->name() == "mul");
    y.retain_grad();
    sum(z).backward();
    REQUIRE(x.grad().data().to_vector() == std::vector<double>{8, 16, 24});  // 8x
    REQUIRE(y.grad().data().to_vector() == std::vector<double>{4, 8, 12});   // 2y
    REQUIRE_FALSE(z.grad().defined());  // not retained
}

TEST_CASE("autograd: gradients accumulate across two backward calls, zero_grad clears", "[autograd]") {
    Var x(rnd({2, 3}, 1), true);
    Var w(rnd({3}, 2), true);
    sum(x * w).backward();
    Tensor first = x.grad().data().clone();
    sum(x * w).backward();
    REQUIRE(allclose(x.grad().data(), mul(first, 2.0)));
    REQUIRE(allclose(w.grad().data(), mul(sum(x.data(), {0}), 2.0)));
    x.zero_grad();
    REQUIRE_FALSE(x.grad().defined());
}

TEST_CASE("autograd: a tensor's gradients from several consumers are summed in one buffer", "[autograd]") {
    // y feeds `consumers` products; each product's backward makes one gradient for y, and the
    // engine sums them into the first (no further buffer per sum) unless create_graph records them.
    auto run = [](int consumers, bool create_graph, std::vector<double>* x_grad) {
        Var x(rnd({64, 32}, 21), true);
        Var y = x * 2.0;
        Var total;
        for (int c = 0; c < consumers; ++c) {
            Var term = sum(y * static_cast<double>(c + 1));
            total = total.defined() ? total + term : term;
        }
        const int64_t before = memory_stats(Device::cpu()).allocations;
        total.backward(Var(), false, create_graph);
        if (x_grad) *x_grad = x.grad().data().to_vector();
        return memory_stats(Device::cpu()).allocations - before;
    };
    std::vector<double> grad2, grad6, grad6_graph;
    const int64_t two = run(2, false, &grad2), six = run(6, false, &grad6);
    const int64_t six_graph = run(6, true, &grad6_graph);
    // d total / dx = 2 * (1 + 2 + ... + consumers) everywhere, exactly in f64.
    REQUIRE(grad2 == std::vector<double>(64 * 32, 2.0 * 3));
    REQUIRE(grad6 == std::vector<double>(64 * 32, 2.0 * 21));
    REQUIRE(grad6_graph == grad6);
    // Four more consumers: each adds its own backward's allocations, the same every time, and the
    // out-of-place sums under create_graph add one more buffer each.
    // Four more consumers add their own backwards' allocations, the same for each. Recording the
    // graph (create_graph) changes nothing else here but the five sums, each then a new buffer.
    REQUIRE((six - two) % 4 == 0);
    CHECK(six_graph - six == 5);
}

TEST_CASE("autograd: a gradient handed to two leaves is not aliased", "[autograd]") {
    Var a(rnd({4}, 3), true), b(rnd({4}, 4), true);
    sum(a + b).backward();
    REQUIRE(a.grad().data().storage() != b.grad().data().storage());
    a.grad().data().fill_(5.0);  // an optimizer scaling one grad in place
    REQUIRE(b.grad().data().to_vector() == std::vector<double>(4, 1.0));
}

TEST_CASE("autograd: a gradient nobody else holds becomes .grad without a copy", "[autograd]") {
    const Device cpu = Device::cpu();
    Var x(rnd({256, 64}, 9), true);
    const int64_t grad_bytes = x.data().nbytes();
    Var y = x * 3.0;
    Var dy(rnd({256, 64}, 10));
    const int64_t before = cpu_bytes();
    reset_peak(cpu);
    y.backward(dy);
    // mul's backward makes one fresh dy * 3 (plus the scalar 3 as a tensor); x.grad is that tensor,
    // not a second copy of it, so the peak stays below two gradients.
    const int64_t peak = memory_stats(cpu).peak_bytes - before;
    REQUIRE(peak >= grad_bytes);
    REQUIRE(peak < grad_bytes + 1024);
    REQUIRE(allclose(x.grad().data(), mul(dy.data(), 3.0)));

    // A gradient the caller still holds (add's backward passes dy itself on) is copied: changing
    // the .grad leaves the caller's tensor alone.
    Var a(rnd({4}, 11), true);
    Var d(rnd({4}, 12));
    const std::vector<double> d_values = d.data().to_vector();
    (a + 1.0).backward(d);
    REQUIRE(a.grad().data().storage() != d.data().storage());
    a.grad().data().fill_(7.0);
    REQUIRE(d.data().to_vector() == d_values);
}

TEST_CASE("autograd: NoGradGuard records nothing", "[autograd]") {
    Var x(rnd({3, 4}, 5), true);
    Var w(rnd({4}, 6), true);
    {
        NoGradGuard guard;
        REQUIRE_FALSE(is_grad_enabled());
        Var y = softmax(x * w + 1.0, -1);
        Var z = matmul(y, transpose(x, 0, 1));
        REQUIRE_FALSE(y.requires_grad());
        REQUIRE_FALSE(z.requires_grad());
        REQUIRE(y.grad_fn() == nullptr);
        REQUIRE(z.grad_fn() == nullptr);
        REQUIRE(z.is_leaf());
        REQUIRE_THROWS_WITH(sum(z).backward(), Catch::Contains("does not require grad"));
    }
    REQUIRE(is_grad_enabled());
    REQUIRE((x * w).requires_grad());
}

TEST_CASE("autograd: detach cuts the graph, constants get no grad", "[autograd]") {
    Var x(rnd({3}, 7), true);
    Var c(rnd({3}, 8));  // requires_grad false
    Var y = x.detach() * x + c * x;
    REQUIRE(y.requires_grad());
    sum(y).backward();
    // d/dx [stop(x) x + c x] = stop(x) + c
    REQUIRE(allclose(x.grad().data(), add(x.data(), c.data())));
    REQUIRE_FALSE(c.grad().defined());
}

TEST_CASE("autograd: after backward the saved tensors are freed (allocator current bytes)", "[autograd]") {
    Var x(rnd({64, 96}, 9), true);
    Var w(rnd({96}, 10), true);
    Var b(rnd({96}, 11), true);
    const int64_t before = cpu_bytes();
    int64_t forward_bytes = 0, saved_bytes = 0;
    {
        Var mu = mean(x, {-1}, true);
        Var y = (x - mu) * rsqrt(var(x, {-1}, 0, true) + 1e-5) * w + b;
        Var loss = sum(tanh(y));
        saved_bytes = graph_saved_bytes(loss);
        forward_bytes = cpu_bytes() - before;
        REQUIRE(saved_bytes > 0);
        // The saved tensors that are not leaves (x and w were allocated before `before`) are
        // part of what the forward allocated.
        REQUIRE(forward_bytes >= saved_bytes - (64 * 96 + 96) * 8);
        loss.backward();
        REQUIRE(graph_saved_bytes(loss) == 0);
        const int64_t grads = static_cast<int64_t>(x.grad().data().storage()->nbytes() +
                                                   w.grad().data().storage()->nbytes() +
                                                   b.grad().data().storage()->nbytes());
        REQUIRE(grads == (64 * 96 + 96 + 96) * 8);
        // Still alive: the grads, the root's own value, and the intermediate Vars held by this
        // scope (mu, y). Everything the graph had saved beyond those is gone.
        const int64_t held = static_cast<int64_t>(loss.data().storage()->nbytes() + mu.data().storage()->nbytes() +
                                                  y.data().storage()->nbytes());
        REQUIRE(cpu_bytes() - before == grads + held);
    }
    const int64_t grads = (64 * 96 + 96 + 96) * 8;
    REQUIRE(cpu_bytes() - before == grads);
}

TEST_CASE("autograd: retain_graph allows a second backward, without it the graph is freed", "[autograd]") {
    Var x(rnd({5, 4}, 12), true);
    Var loss = sum(exp(x) * x);
    loss.backward(Var(), /*retain_graph=*/true);
    Tensor first = x.grad().data().clone();
    x.zero_grad();
    loss.backward();  // frees
    REQUIRE(allclose(x.grad().data(), first, 0, 0));
    // d/dx x e^x = e^x (1 + x)
    REQUIRE(allclose(first, mul(exp(x.data()), add(x.data(), 1.0)), 1e-12, 1e-12));
    REQUIRE_THROWS_WITH(loss.backward(), Catch::Contains("graph was freed") && Catch::Contains("retain_graph=true"));
}

TEST_CASE("autograd: backward error messages", "[autograd]") {
    Var x(rnd({2, 3}, 13), true);
    SECTION("non-scalar output without a gradient") {
        REQUIRE_THROWS_WITH((x * 2.0).backward(),
                            Catch::Contains("single-element") && Catch::Contains("[2, 3]"));
    }
    SECTION("given gradient of the wrong shape") {
        REQUIRE_THROWS_WITH((x * 2.0).backward(Var(ones({3}, DType::F64))),
                            Catch::Contains("[3]") && Catch::Contains("[2, 3]"));
    }
    SECTION("add_grad: a backward returning the wrong shape names the node and both shapes") {
        Var y = make_result(x.data().clone(), "bad_op", {x}, {},
                            [](const Var& g, const std::vector<Var>&) -> std::vector<Var> {
                                return {Var(ones({3}, DType::F64))};
                            });
        REQUIRE_THROWS_WITH(sum(y).backward(), Catch::Contains("backward of bad_op") && Catch::Contains("[3]") &&
                                                   Catch::Contains("[2, 3]"));
    }
    SECTION("a backward returning the wrong number of gradients") {
        Var y = make_result(x.data().clone(), "two_grads", {x}, {},
                            [](const Var& g, const std::vector<Var>&) -> std::vector<Var> { return {g, g}; });
        REQUIRE_THROWS_WITH(sum(y).backward(), Catch::Contains("two_grads") && Catch::Contains("2 gradients for 1"));
    }
    SECTION("requires_grad only on floating leaves") {
        Var ids(from_vector(std::vector<int64_t>{1, 2}, {2}));
        REQUIRE_THROWS_WITH(ids.set_requires_grad(true), Catch::Contains("i64"));
        Var y = x * 2.0;
        REQUIRE_THROWS_WITH(y.set_requires_grad(false), Catch::Contains("only leaves"));
    }
    SECTION("set_grad checks the shape") {
        REQUIRE_THROWS_WITH(x.set_grad(Var(ones({2}, DType::F64))), Catch::Contains("[2, 3]") && Catch::Contains("[2]"));
    }
}

TEST_CASE("autograd: make_result builds a fused node with named saved tensors", "[autograd]") {
    // A "fused" x^2 * w that saves x and w only: one node in the graph.
    Var x(rnd({4, 3}, 14), true);
    Var w(rnd({3}, 15), true);
    Tensor out = mul(square(x.data()), w.data());
    Var y = make_result(out, "fused_sq", {x, w}, {{"x", x}, {"w", w.data()}},
                        [](const Var& g, const std::vector<Var>& s) -> std::vector<Var> {
                            const Var& x = s[0];
                            const Var& w = s[1];
                            return {g * x * w * 2.0, sum_to(g * square(x), w.shape())};
                        });
    REQUIRE(y.grad_fn()->name() == "fused_sq");
    REQUIRE(y.grad_fn()->saved().size() == 2);
    REQUIRE(y.grad_fn()->saved()[0].name == "x");
    REQUIRE(y.grad_fn()->saved_bytes() == (12 + 3) * 8);
    std::vector<SavedInfo> info = saved_info(*y.grad_fn());
    REQUIRE(info[1].name == "w");
    REQUIRE(info[1].shape == Shape{3});
    REQUIRE(graph_nodes(y).size() == 1);
    sum(y).backward();
    REQUIRE(allclose(x.grad().data(), mul(mul(x.data(), w.data()), 2.0), 1e-12, 1e-12));
    REQUIRE(allclose(w.grad().data(), sum(square(x.data()), {0}), 1e-12, 1e-12));
    // An absent (undefined) input, such as a missing bias, is allowed and gets no gradient.
    Var z = make_result(x.data().clone(), "optional", {x, Var()}, {},
                        [](const Var& g, const std::vector<Var>&) -> std::vector<Var> { return {g, Var()}; });
    REQUIRE(z.requires_grad());
}

TEST_CASE("autograd: create_graph gives Hessian-vector products, gradients() leaves .grad alone", "[autograd]") {
    Var x(from_vector(std::vector<double>{0.5, -1.0, 2.0}, {3}, DType::F64), true);
    Var y = sum(x * x * x);  // dy/dx = 3x^2, d2y/dx2 = 6x
    std::vector<Var> g = gradients(y, {x}, Var(), false, /*create_graph=*/true);
    REQUIRE(g[0].requires_grad());
    REQUIRE(allclose(g[0].data(), mul(square(x.data()), 3.0), 1e-12, 1e-12));
    REQUIRE_FALSE(x.grad().defined());
    Var v(from_vector(std::vector<double>{1.0, 2.0, 3.0}, {3}, DType::F64));
    sum(g[0] * v).backward();  // Hessian-vector product: 6 x * v
    REQUIRE(allclose(x.grad().data(), mul(mul(x.data(), v.data()), 6.0), 1e-12, 1e-12));

    // Without create_graph nothing is recorded in the backward pass.
    Var x2(rnd({3}, 16), true);
    std::vector<Var> g2 = gradients(sum(exp(x2)), {x2});
    REQUIRE_FALSE(g2[0].requires_grad());
    REQUIRE(g2[0].grad_fn() == nullptr);

    // backward(create_graph) keeps a differentiable .grad too.
    Var x3(from_vector(std::vector<double>{1.5}, {1}, DType::F64), true);
    sum(x3 * x3 * x3).backward(Var(), false, true);
    Var first = x3.grad();
    REQUIRE(first.requires_grad());
    std::vector<Var> second = gradients(sum(first), {x3});
    REQUIRE(second[0].item() == Approx(9.0));  // 6 x
    // A create_graph .grad holds a graph that holds the leaf (a cycle, as in PyTorch): clearing the
    // grad breaks it (the sanitizer build checks nothing leaks).
    first = Var();
    x3.zero_grad();
}

TEST_CASE("autograd: gradients() for an unused input is undefined and requires grad inputs", "[autograd]") {
    Var x(rnd({2}, 17), true), unused(rnd({2}, 18), true), c(rnd({2}, 19));
    std::vector<Var> g = gradients(sum(x * 3.0), {x, unused});
    REQUIRE(allclose(g[0].data(), full({2}, 3.0, DType::F64)));
    REQUIRE_FALSE(g[1].defined());
    REQUIRE_THROWS_WITH(gradients(sum(x * 3.0), {c}), Catch::Contains("input 0 does not require grad"));
}

TEST_CASE("autograd: shared subgraph (diamond) accumulates both paths once", "[autograd]") {
    Var x(rnd({3}, 20), true);
    Var h = exp(x);
    Var y = sum(h * 2.0 + h * h);  // d/dx = (2 + 2h) h
    y.backward();
    Tensor hd = exp(x.data());
    REQUIRE(allclose(x.grad().data(), mul(add(mul(hd, 2.0), 2.0), hd), 1e-12, 1e-12));
    REQUIRE(graph_nodes(y).front() == y.grad_fn());
}

TEST_CASE("autograd: dtype casts carry gradients back in the input's dtype", "[autograd]") {
    Var x(rnd({4}, 21, DType::F32), true);
    Var y = to(x, DType::F64) * 3.0;
    REQUIRE(y.dtype() == DType::F64);
    sum(y).backward();
    REQUIRE(x.grad().dtype() == DType::F32);
    REQUIRE(allclose(x.grad().data(), full({4}, 3.0)));
    Var half = x.to(DType::BF16);
    REQUIRE(half.requires_grad());
    REQUIRE_FALSE(to(x, DType::I64).requires_grad());
}

TEST_CASE("autograd: a long chain does not overflow the stack", "[autograd]") {
    Var x(rnd({2}, 22), true);
    Var y = x;
    for (int i = 0; i < 200000; ++i) y = y * 1.0;
    sum(y).backward();
    REQUIRE(allclose(x.grad().data(), ones({2}, DType::F64)));
    // A graph dropped without backward, whose nodes also save their inputs as Vars.
    Var w(ones({2}, DType::F64), true);
    Var z = x;
    for (int i = 0; i < 200000; ++i) z = z * w;
    REQUIRE(graph_nodes(z).size() == 200000);
}
