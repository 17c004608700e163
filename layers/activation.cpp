// Soft-capping, and inverted dropout with a mask drawn from a seeded Generator.
#include "layers/activation.h"

#include <cmath>

#include "autograd/fused_node.h"
#include "core/fused.h"

namespace nl {

Var softcap(const Var& x, double cap, bool fused) {
    NL_REQUIRE(std::isfinite(cap) && cap >= 0.0, "softcap: cap must be finite and >= 0 (0: off), found ", cap);
    if (cap == 0.0) return x;
    auto composed = [cap](const Var& v) { return tanh(v / cap) * cap; };
    if (!fused) return composed(x);
    // The kernel backward needs only the output y. x is saved for the composed twin (create_graph); a model's
    // loss keeps the capped logits y alive anyway, so x is the one extra tensor, as tanh's saved
    // output is in the composed form.
    std::vector<SavedTensor> saved;
    saved.emplace_back("x", x);
    saved.push_back(SavedTensor::output("y"));
    return make_fused_result(softcap_forward(x.data(), cap), "softcap", {x}, std::move(saved), {0},
                             [cap](const Var& dy, const std::vector<Var>& s) -> std::vector<Var> {
                                 return {Var(softcap_backward(dy.data(), s[1].data(), cap))};
                             },
                             [composed](const std::vector<Var>& in) { return composed(in[0]); });
}

Var dropout(const Var& x, double p, bool training, Generator& generator) {
    NL_REQUIRE(p >= 0.0 && p <= 1.0, "dropout: expected p in [0, 1], found ", p);
    if (!training || p == 0.0) return x;
    NL_REQUIRE(is_floating(x.dtype()), "dropout: expected a floating dtype, found ", dtype_name(x.dtype()));
    if (p == 1.0) return x * 0.0;
    // u ~ U[0, 1) drawn in f32 (f64 for f64 x); keep where u >= p, scaled so E[y] = x.
    DType draw = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
    Tensor u = rand(x.shape(), generator, draw);                  // x's shape
    Tensor mask = ge(u, full_like(u, p)) * (1.0 / (1.0 - p));     // 0 or 1/(1-p)
    return x * Var(mask.to(x.dtype()).to(x.device()));
}

Dropout::Dropout(double p, uint64_t seed) : p_(p), generator_(seed) {
    NL_REQUIRE(p >= 0.0 && p <= 1.0, "Dropout: expected p in [0, 1], found ", p);
}

std::string Dropout::extra_repr() const { return detail::concat("p=", p_); }

Var Dropout::forward(const Var& x) { return dropout(x, p_, is_training(), generator_); }

}  // namespace nl
