// Norms: composed forms (autograd ops) and fused forms (one node over core/fused.h's kernel pair).
#include "layers/norms.h"

#include <algorithm>
#include <cmath>

#include "core/fused.h"
#include "layers/norm_registry.h"

namespace nl {

namespace {

// x in its compute dtype (f32 for bf16/f16, f64 stays f64), without a no-op cast node.
Var to_compute(const Var& x) {
    DType cd = compute_dtype(x.dtype());
    return x.dtype() == cd ? x : to(x, cd);
}

Var cast_back(const Var& y, DType dtype) { return y.dtype() == dtype ? y : to(y, dtype); }

void check_norm_args(const char* op, const Var& x, const Var& weight, const Var& bias) {
    NL_REQUIRE(x.defined(), op, ": the input is undefined");
    NL_REQUIRE(is_floating(x.dtype()), op, ": expected a floating dtype, found ", dtype_name(x.dtype()));
    NL_REQUIRE(x.dim() >= 1 && x.size(-1) > 0, op, ": expected an input (..., d) with d > 0, found ",
               shape_str(x.shape()));
    const Shape expected = {x.size(-1)};
    for (const Var* p : {&weight, &bias}) {
        if (!p->defined()) continue;
        const char* what = p == &weight ? "weight" : "bias";
        NL_REQUIRE(p->shape() == expected, op, ": expected ", what, " ", shape_str(expected), " for input ",
                   shape_str(x.shape()), ", found ", shape_str(p->shape()));
        NL_REQUIRE(p->dtype() == x.dtype(), op, ": ", what, " has dtype ", dtype_name(p->dtype()),
                   " but the input has ", dtype_name(x.dtype()), " (convert the module with to(dtype))");
    }
}

// The affine tail shared by the composed forms: y * w + b, skipping what is absent.
Var affine(Var y, const Var& weight, const Var& bias) {
    if (weight.defined()) y = y * weight;
    if (bias.defined()) y = y + bias;
    return y;
}

// One make_result node over norm_forward/norm_backward. Saved: x, (mean,) rstd. The weight is
// referenced by the closure (a parameter, alive anyway), not saved: see norms.h.
Var fused_norm_node(const char* name, const Var& x, const Var& weight, const Var& bias, double eps,
                    bool subtract_mean, int64_t stat_count) {
    Tensor w = weight.defined() ? weight.data() : Tensor();
    Tensor b = bias.defined() ? bias.data() : Tensor();
    NormForward f = norm_forward(x.data(), w, b, eps, subtract_mean, stat_count);
    std::vector<SavedTensor> saved;
    saved.emplace_back("x", x.data());
    if (subtract_mean) saved.emplace_back("mean", f.mean);
    saved.emplace_back("rstd", f.rstd);
    const bool need_dweight = weight.defined() && weight.requires_grad();
    const bool need_dbias = bias.defined() && bias.requires_grad();
    std::string op = name;
    return make_result(
        f.y, name, {x, weight, bias}, std::move(saved),
        [w, op, subtract_mean, stat_count, need_dweight, need_dbias](
            const Var& dy, const std::vector<Var>& saved) -> std::vector<Var> {
            NL_REQUIRE(!is_grad_enabled(), op, " (fused): the fused backward is first-order only; use the "
                       "composed form (fused = false) for backward(create_graph=true)");
            const Tensor& xs = saved.front().data();
            Tensor mean = subtract_mean ? saved[1].data() : Tensor();
            const Tensor& rstd = saved.back().data();
            NormBackward g = norm_backward(dy.data(), xs, w, mean, rstd, subtract_mean, stat_count,
                                           need_dweight, need_dbias);
            return {Var(g.dx), need_dweight ? Var(g.dweight) : Var(), need_dbias ? Var(g.dbias) : Var()};
        });
}

}  // namespace

// ---- functional forms ----

Var layer_norm_composed(const Var& x, const Var& weight, const Var& bias, double eps) {
    check_norm_args("layer_norm", x, weight, bias);
    Var xf = to_compute(x);                             // (..., d)
    Var xc = xf - mean(xf, {-1}, true);                 // centered, two-pass
    Var var_ = mean(square(xc), {-1}, true);            // (..., 1), biased
    Var y = cast_back(xc * rsqrt(var_ + eps), x.dtype());
    return affine(y, weight, bias);
}

Var layer_norm_fused(const Var& x, const Var& weight, const Var& bias, double eps) {
    check_norm_args("layer_norm", x, weight, bias);
    return fused_norm_node("layer_norm", x, weight, bias, eps, true, -1);
}

Var rms_norm_composed(const Var& x, const Var& weight, const Var& bias, double eps, int64_t stat_count) {
    check_norm_args("rms_norm", x, weight, bias);
    const int64_t d = x.size(-1);
    NL_REQUIRE(stat_count == -1 || (stat_count >= 1 && stat_count <= d), "rms_norm: stat_count must be -1 or in [1, ",
               d, "], found ", stat_count);
    Var xf = to_compute(x);                                                     // (..., d)
    Var stat = (stat_count == -1 || stat_count == d) ? xf : narrow(xf, -1, 0, stat_count);  // (..., k)
    Var y = xf * rsqrt(mean(square(stat), {-1}, true) + eps);                   // LLaMA: self._norm(x.float())
    return affine(cast_back(y, x.dtype()), weight, bias);                       // .type_as(x) * self.weight
}

Var rms_norm_fused(const Var& x, const Var& weight, const Var& bias, double eps, int64_t stat_count) {
    check_norm_args("rms_norm", x, weight, bias);
    return fused_norm_node("rms_norm", x, weight, bias, eps, false, stat_count);
}

Var layer_norm(const Var& x, const Var& weight, const Var& bias, double eps, bool fused) {
    return fused ? layer_norm_fused(x, weight, bias, eps) : layer_norm_composed(x, weight, bias, eps);
}

Var rms_norm(const Var& x, const Var& weight, const Var& bias, double eps, bool fused, int64_t stat_count) {
    return fused ? rms_norm_fused(x, weight, bias, eps, stat_count)
                 : rms_norm_composed(x, weight, bias, eps, stat_count);
}

Var adaptive_rms_norm(const Var& x, const Var& weight, const Var& alpha, double eps, bool fused) {
    check_norm_args("adaptive_rms_norm", x, weight, Var());
    NL_REQUIRE(x.size(-1) >= 2, "adaptive_rms_norm: the unbiased std needs d >= 2, found an input ",
               shape_str(x.shape()));
    NL_REQUIRE(alpha.defined() && alpha.shape() == Shape{1}, "adaptive_rms_norm: expected alpha [1], found ",
               alpha.defined() ? shape_str(alpha.shape()) : std::string("an undefined Var"));
    NL_REQUIRE(alpha.dtype() == x.dtype(), "adaptive_rms_norm: alpha has dtype ", dtype_name(alpha.dtype()),
               " but the input has ", dtype_name(x.dtype()));
    Var y = rms_norm(x, weight, Var(), eps, fused);               // (..., d): super().forward(x)
    Var std_ = sqrt(var(to_compute(x), {-1}, 1, true));           // (..., 1): x.std(dim=-1, keepdim=True)
    Var gate = sigmoid(to_compute(alpha) * std_);                 // (..., 1)
    return y * cast_back(gate, x.dtype());
}

Var hybrid_norm(const Var& x, const Var& rms_weight, const Var& ln_weight, const Var& ln_bias, double alpha,
                double eps, bool fused) {
    check_norm_args("hybrid_norm", x, rms_weight, Var());
    Var r = rms_norm(x, rms_weight, Var(), eps, fused);           // (..., d): self.rms_norm(x)
    Var l = layer_norm(x, ln_weight, ln_bias, eps, fused);        // (..., d): self.layer_norm(x)
    return r * alpha + l * (1.0 - alpha);
}

// ---- options, base, factory ----

namespace {

NormOptions with_type(NormOptions options, const char* type) {
    options.type = type;
    return options;
}

bool is_rms_type(const std::string& type) {
    return type == "rmsnorm" || type == "rmsnorm_bias" || type == "prmsnorm";
}

}  // namespace

double NormOptions::resolved_eps() const { return eps ? *eps : find_norm_type(type).default_eps; }

Norm::Norm(NormOptions options) : options_(std::move(options)) {
    find_norm_type(options_.type);  // an unknown type is an error naming the choices
    NL_REQUIRE(options_.dim > 0, options_.type, ": expected dim > 0, found ", options_.dim);
    NL_REQUIRE(options_.resolved_eps() >= 0.0 && std::isfinite(options_.resolved_eps()), options_.type,
               ": expected a finite eps >= 0, found ", options_.resolved_eps());
    NL_REQUIRE(is_floating(options_.dtype), options_.type, ": expected a floating dtype, found ",
               dtype_name(options_.dtype));
}

std::string Norm::type_name() const { return find_norm_type(options_.type).class_name; }

std::string Norm::extra_repr() const {
    return detail::concat(options_.dim, ", eps=", eps(), ", elementwise_affine=",
                          options_.elementwise_affine ? "true" : "false", ", fused=", fused() ? "true" : "false");
}

void Norm::check_input(const Var& x) const {
    NL_REQUIRE(x.defined() && x.dim() >= 1 && x.size(-1) == options_.dim, type_name(), ": expected input (..., ",
               options_.dim, "), found ", x.defined() ? shape_str(x.shape()) : std::string("an undefined Var"));
}

std::shared_ptr<Norm> make_norm(const NormOptions& options) {
    try {
        return find_norm_type(options.type).make(options);
    } catch (const Error& e) {
        throw Error(detail::concat("make_norm: ", e.what()));
    }
}

namespace {

// Depth first; a norm is set as a whole (it sets its own parts) and its children are not visited.
void set_fused_below(Module& module, bool fused, int64_t& count) {
    if (auto* norm = dynamic_cast<Norm*>(&module)) {
        norm->set_fused(fused);
        ++count;
        return;
    }
    for (auto& [name, child] : module.named_children()) set_fused_below(*child, fused, count);
}

}  // namespace

int64_t set_norms_fused(Module& model, bool fused) {
    int64_t count = 0;
    set_fused_below(model, fused, count);
    return count;
}

// ---- LayerNorm ----

LayerNorm::LayerNorm(const NormOptions& options) : Norm(with_type(options, "layernorm")) {
    if (options_.elementwise_affine) {
        register_parameter("weight", Var(ones({options_.dim}, options_.dtype)));
        if (options_.bias) register_parameter("bias", Var(zeros({options_.dim}, options_.dtype)));
    }
}

LayerNorm::LayerNorm(int64_t dim, double eps) : LayerNorm(NormOptions{.type = "layernorm", .dim = dim, .eps = eps}) {}

Var LayerNorm::weight() const { return has_parameter("weight") ? parameter("weight") : Var(); }
Var LayerNorm::bias() const { return has_parameter("bias") ? parameter("bias") : Var(); }

Var LayerNorm::forward(const Var& x) {
    check_input(x);
    return layer_norm(x, weight(), bias(), eps(), fused());
}

// ---- RMSNorm (plain, with bias, partial) ----

RMSNorm::RMSNorm(const NormOptions& options) : Norm(options) {
    NL_REQUIRE(is_rms_type(options_.type), "RMSNorm: expected type rmsnorm, rmsnorm_bias or prmsnorm, found '",
               options_.type, "'");
    if (options_.type == "prmsnorm")
        NL_REQUIRE(options_.p > 0.0 && options_.p <= 1.0, "PRMSNorm: expected p in (0, 1], found ", options_.p);
    if (options_.elementwise_affine) {
        register_parameter("weight", Var(ones({options_.dim}, options_.dtype)));
        if (options_.type == "rmsnorm_bias") register_parameter("bias", Var(zeros({options_.dim}, options_.dtype)));
    }
}

RMSNorm::RMSNorm(int64_t dim, double eps) : RMSNorm(NormOptions{.type = "rmsnorm", .dim = dim, .eps = eps}) {}

Var RMSNorm::weight() const { return has_parameter("weight") ? parameter("weight") : Var(); }
Var RMSNorm::bias() const { return has_parameter("bias") ? parameter("bias") : Var(); }

int64_t RMSNorm::stat_count() const {
    return options_.type == "prmsnorm" ? partial_stat_count(options_.dim, options_.p) : options_.dim;
}

Var RMSNorm::forward(const Var& x) {
    check_input(x);
    return rms_norm(x, weight(), bias(), eps(), fused(), stat_count());
}

// ---- AdaptiveRMSNorm ----

AdaptiveRMSNorm::AdaptiveRMSNorm(const NormOptions& options) : Norm(with_type(options, "adaptive_rmsnorm")) {
    NL_REQUIRE(options_.dim >= 2, "AdaptiveRMSNorm: the unbiased std needs dim >= 2, found ", options_.dim);
    if (options_.elementwise_affine) register_parameter("weight", Var(ones({options_.dim}, options_.dtype)));
    register_parameter("alpha", Var(ones({1}, options_.dtype)));  // nn.Parameter(torch.ones(1))
}

Var AdaptiveRMSNorm::weight() const { return has_parameter("weight") ? parameter("weight") : Var(); }

Var AdaptiveRMSNorm::forward(const Var& x) {
    check_input(x);
    return adaptive_rms_norm(x, weight(), alpha(), eps(), fused());
}

// ---- HybridNorm ----

HybridNorm::HybridNorm(const NormOptions& options) : Norm(with_type(options, "hybridnorm")) {
    NL_REQUIRE(options_.alpha >= 0.0 && options_.alpha <= 1.0, "HybridNorm: expected alpha in [0, 1], found ",
               options_.alpha);
    NormOptions part = options_;
    part.eps = eps();  // RMSNorm(dim, eps) and nn.LayerNorm(dim, eps): both get this norm's eps
    register_module("rms_norm", std::make_shared<RMSNorm>(with_type(part, "rmsnorm")));
    register_module("layer_norm", std::make_shared<LayerNorm>(with_type(part, "layernorm")));
}

std::string HybridNorm::extra_repr() const { return Norm::extra_repr() + detail::concat(", alpha=", alpha()); }

std::shared_ptr<RMSNorm> HybridNorm::rms_norm() const {
    auto norm = std::dynamic_pointer_cast<RMSNorm>(child("rms_norm"));
    NL_REQUIRE(norm != nullptr, "HybridNorm: its rms_norm child is a ", child("rms_norm")->type_name(),
               ", not an RMSNorm");
    return norm;
}

std::shared_ptr<LayerNorm> HybridNorm::layer_norm() const {
    auto norm = std::dynamic_pointer_cast<LayerNorm>(child("layer_norm"));
    NL_REQUIRE(norm != nullptr, "HybridNorm: its layer_norm child is a ", child("layer_norm")->type_name(),
               ", not a LayerNorm");
    return norm;
}

void HybridNorm::set_fused(bool fused) {
    Norm::set_fused(fused);
    rms_norm()->set_fused(fused);
    layer_norm()->set_fused(fused);
}

Var HybridNorm::forward(const Var& x) {
    check_input(x);
    auto rms = rms_norm();
    auto ln = layer_norm();
    // The functional form, so both branches run in this norm's form (the children's flags follow it).
    return hybrid_norm(x, rms->weight(), ln->weight(), ln->bias(), alpha(), eps(), fused());
}

}  // namespace nl
