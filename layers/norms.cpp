// Norms: composed forms (autograd ops) and fused forms (one node over core/fused.h's kernel pair).
#include "layers/norms.h"

#include <algorithm>
#include <cmath>

#include "autograd/fused_node.h"
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

// ---- the op boundary's checks (each functional form runs them once) ----

void check_input(const char* op, const Var& x, double eps) {
    NL_REQUIRE(x.defined(), op, ": expected an input (..., d), found an undefined Var");
    NL_REQUIRE(is_floating(x.dtype()), op, ": expected a floating dtype, found ", dtype_name(x.dtype()));
    NL_REQUIRE(x.dim() >= 1 && x.size(-1) > 0, op, ": expected an input (..., d) with d > 0, found ",
               shape_str(x.shape()));
    NL_REQUIRE(std::isfinite(eps) && eps >= 0.0, op, ": expected a finite eps >= 0, found ", eps);
}

// A parameter of `shape` with x's dtype and device. An undefined one is absent, which only a
// required parameter may not be.
void check_parameter(const char* op, const char* name, const Var& param, const Shape& shape, const Var& x,
                     bool required) {
    if (!param.defined()) {
        NL_REQUIRE(!required, op, ": expected ", name, " ", shape_str(shape), ", found an undefined Var");
        return;
    }
    NL_REQUIRE(param.shape() == shape, op, ": expected ", name, " ", shape_str(shape), " for input ",
               shape_str(x.shape()), ", found ", shape_str(param.shape()));
    NL_REQUIRE(param.dtype() == x.dtype(), op, ": ", name, " has dtype ", dtype_name(param.dtype()),
               " but the input has ", dtype_name(x.dtype()), " (convert the module with to(dtype))");
    NL_REQUIRE(param.device() == x.device(), op, ": ", name, " is on ", param.device().str(),
               " but the input is on ", x.device().str());
}

// x, and an optional weight and bias of shape [d].
void check_affine_args(const char* op, const Var& x, const Var& weight, const Var& bias, double eps) {
    check_input(op, x, eps);
    const Shape features = {x.size(-1)};
    check_parameter(op, "weight", weight, features, x, false);
    check_parameter(op, "bias", bias, features, x, false);
}

// The affine tail shared by the composed forms: y * w + b, skipping what is absent.
Var affine(Var y, const Var& weight, const Var& bias) {
    if (weight.defined()) y = y * weight;
    if (bias.defined()) y = y + bias;
    return y;
}

Var layer_norm_unchecked(const Var& x, const Var& weight, const Var& bias, double eps, bool fused);
Var rms_norm_unchecked(const Var& x, const Var& weight, const Var& bias, double eps, bool fused, int64_t stat_count);

// One node over norm_forward/norm_backward (make_fused_result: the kernel backward for first order,
// the composed form's autograd under create_graph). Saved: x (as a Var: the same storage, so the
// twin can differentiate through it), (mean,) rstd. The weight and bias are held by the node
// (parameters, alive anyway), not saved: see norms.h.
Var fused_norm_node(const char* name, const Var& x, const Var& weight, const Var& bias, double eps,
                    bool subtract_mean, int64_t stat_count) {
    Tensor w = weight.defined() ? weight.data() : Tensor();
    Tensor b = bias.defined() ? bias.data() : Tensor();
    NormForward f = norm_forward(x.data(), w, b, eps, subtract_mean, stat_count);
    std::vector<SavedTensor> saved;
    saved.emplace_back("x", x);
    if (subtract_mean) saved.emplace_back("mean", f.mean);
    saved.emplace_back("rstd", f.rstd);
    const bool need_dweight = weight.defined() && weight.requires_grad();
    const bool need_dbias = bias.defined() && bias.requires_grad();
    return make_fused_result(
        f.y, name, {x, weight, bias}, std::move(saved), {0, -1, -1},
        [w, subtract_mean, stat_count, need_dweight, need_dbias](
            const Var& dy, const std::vector<Var>& saved) -> std::vector<Var> {
            const Tensor& xs = saved.front().data();
            Tensor mean = subtract_mean ? saved[1].data() : Tensor();
            const Tensor& rstd = saved.back().data();
            NormBackward g = norm_backward(dy.data(), xs, w, mean, rstd, subtract_mean, stat_count,
                                           need_dweight, need_dbias);
            return {Var(g.dx), need_dweight ? Var(g.dweight) : Var(), need_dbias ? Var(g.dbias) : Var()};
        },
        [eps, subtract_mean, stat_count](const std::vector<Var>& in) {
            return subtract_mean ? layer_norm_unchecked(in[0], in[1], in[2], eps, false)
                                 : rms_norm_unchecked(in[0], in[1], in[2], eps, false, stat_count);
        });
}

// DyT's gradients from autograd ops, for backward(create_graph=true) through its fused node: the
// closed form of core/backend.h's DytBackwardArgs, with t recomputed, in x's compute dtype. x is the
// saved Var; alpha, weight and bias the node's inputs. Returns {dx, dalpha, dweight, dbias}.
std::vector<Var> dyt_gradients_composed(const Var& dy, const Var& x, const Var& alpha, const Var& weight,
                                        const Var& bias) {
    const DType dtype = x.dtype();
    const Shape features = {x.size(-1)};
    Var dyf = to_compute(dy), xf = to_compute(x), af = to_compute(alpha);  // (..., d), (..., d), (1)
    Var t = tanh(af * xf);                                                  // (..., d)
    Var g = weight.defined() ? dyf * to_compute(weight) : dyf;              // (..., d)
    Var dt = g * rsub(1.0, square(t));                                      // d loss / d (alpha x)
    return {cast_back(dt * af, dtype), alpha.requires_grad() ? cast_back(sum_to(dt * xf, {1}), dtype) : Var(),
            weight.defined() && weight.requires_grad() ? cast_back(sum_to(dyf * t, features), dtype) : Var(),
            bias.defined() && bias.requires_grad() ? cast_back(sum_to(dyf, features), dtype) : Var()};
}

// One make_result node over dyt_forward/dyt_backward, as fused_norm_node. Saved: x alone (as a Var, so
// that the create_graph path differentiates through it). alpha and weight are referenced by the
// closure (parameters, alive anyway), not saved.
Var fused_dyt_node(const Var& x, const Var& alpha, const Var& weight, const Var& bias) {
    Tensor w = weight.defined() ? weight.data() : Tensor();
    Tensor b = bias.defined() ? bias.data() : Tensor();
    Tensor y = dyt_forward(x.data(), alpha.data(), w, b);
    std::vector<SavedTensor> saved;
    saved.emplace_back("x", x);
    const bool need_dalpha = alpha.requires_grad();
    const bool need_dweight = weight.defined() && weight.requires_grad();
    const bool need_dbias = bias.defined() && bias.requires_grad();
    return make_result(
        y, "dyt", {x, alpha, weight, bias}, std::move(saved),
        [alpha, weight, bias, need_dalpha, need_dweight, need_dbias](
            const Var& dy, const std::vector<Var>& saved) -> std::vector<Var> {
            // backward(create_graph=true): the same gradients from autograd ops, differentiable again.
            if (is_grad_enabled()) return dyt_gradients_composed(dy, saved.front(), alpha, weight, bias);
            const Tensor w = weight.defined() ? weight.data() : Tensor();
            DytBackward g = dyt_backward(dy.data(), saved.front().data(), alpha.data(), w, need_dalpha, need_dweight,
                                         need_dbias);
            return {Var(g.dx), need_dalpha ? Var(g.dalpha) : Var(), need_dweight ? Var(g.dweight) : Var(),
                    need_dbias ? Var(g.dbias) : Var()};
        });
}

// The forms without checks, for the public forms below (which check first) to share.
Var layer_norm_unchecked(const Var& x, const Var& weight, const Var& bias, double eps, bool fused) {
    if (fused) return fused_norm_node("layer_norm", x, weight, bias, eps, true, -1);
    Var xf = to_compute(x);                             // (..., d)
    Var xc = xf - mean(xf, {-1}, true);                 // centered, two-pass
    Var var_ = mean(square(xc), {-1}, true);            // (..., 1), biased
    Var y = cast_back(xc * rsqrt(var_ + eps), x.dtype());
    return affine(y, weight, bias);
}

Var rms_norm_unchecked(const Var& x, const Var& weight, const Var& bias, double eps, bool fused, int64_t stat_count) {
    if (fused) return fused_norm_node("rms_norm", x, weight, bias, eps, false, stat_count);
    const int64_t d = x.size(-1);
    Var xf = to_compute(x);                                                     // (..., d)
    Var stat = (stat_count == -1 || stat_count == d) ? xf : narrow(xf, -1, 0, stat_count);  // (..., k)
    Var y = xf * rsqrt(mean(square(stat), {-1}, true) + eps);                   // LLaMA: self._norm(x.float())
    return affine(cast_back(y, x.dtype()), weight, bias);                       // .type_as(x) * self.weight
}

}  // namespace

// ---- functional forms ----

Var layer_norm(const Var& x, const Var& weight, const Var& bias, double eps, bool fused) {
    check_affine_args("layer_norm", x, weight, bias, eps);
    return layer_norm_unchecked(x, weight, bias, eps, fused);
}

Var layer_norm_composed(const Var& x, const Var& weight, const Var& bias, double eps) {
    return layer_norm(x, weight, bias, eps, false);
}

Var layer_norm_fused(const Var& x, const Var& weight, const Var& bias, double eps) {
    return layer_norm(x, weight, bias, eps, true);
}

Var rms_norm(const Var& x, const Var& weight, const Var& bias, double eps, bool fused, int64_t stat_count) {
    check_affine_args("rms_norm", x, weight, bias, eps);
    const int64_t d = x.size(-1);
    NL_REQUIRE(stat_count == -1 || (stat_count >= 1 && stat_count <= d), "rms_norm: expected stat_count -1 or in [1, ",
               d, "] for input ", shape_str(x.shape()), ", found ", stat_count);
    return rms_norm_unchecked(x, weight, bias, eps, fused, stat_count);
}

Var rms_norm_composed(const Var& x, const Var& weight, const Var& bias, double eps, int64_t stat_count) {
    return rms_norm(x, weight, bias, eps, false, stat_count);
}

Var rms_norm_fused(const Var& x, const Var& weight, const Var& bias, double eps, int64_t stat_count) {
    return rms_norm(x, weight, bias, eps, true, stat_count);
}

Var adaptive_rms_norm(const Var& x, const Var& weight, const Var& alpha, double eps, bool fused) {
    const char* op = "adaptive_rms_norm";
    check_input(op, x, eps);
    NL_REQUIRE(x.size(-1) >= 2, op, ": the unbiased std needs d >= 2, found an input ", shape_str(x.shape()));
    check_parameter(op, "weight", weight, {x.size(-1)}, x, false);
    check_parameter(op, "alpha", alpha, {1}, x, true);
    Var y = rms_norm_unchecked(x, weight, Var(), eps, fused, -1);  // (..., d): super().forward(x)
    Var std_ = sqrt(var(to_compute(x), {-1}, 1, true));           // (..., 1): x.std(dim=-1, keepdim=True)
    Var gate = sigmoid(to_compute(alpha) * std_);                 // (..., 1)
    return y * cast_back(gate, x.dtype());
}

Var hybrid_norm(const Var& x, const Var& rms_weight, const Var& ln_weight, const Var& ln_bias, double alpha,
                double eps, bool fused) {
    const char* op = "hybrid_norm";
    check_input(op, x, eps);
    const Shape features = {x.size(-1)};
    check_parameter(op, "rms_weight", rms_weight, features, x, false);
    check_parameter(op, "ln_weight", ln_weight, features, x, false);
    check_parameter(op, "ln_bias", ln_bias, features, x, false);
    Var r = rms_norm_unchecked(x, rms_weight, Var(), eps, fused, -1);  // (..., d): self.rms_norm(x)
    Var l = layer_norm_unchecked(x, ln_weight, ln_bias, eps, fused);   // (..., d): self.layer_norm(x)
    return r * alpha + l * (1.0 - alpha);
}

Var scale_norm(const Var& x, const Var& g, double eps) {
    const char* op = "scale_norm";
    check_input(op, x, eps);
    check_parameter(op, "g", g, {1}, x, true);
    Var xf = to_compute(x);                                               // (..., d)
    Var sum_of_squares = maximum(sum(square(xf), {-1}, true), eps * eps);  // (..., 1): max(||x||, eps)^2
    return cast_back(xf * rsqrt(sum_of_squares), x.dtype()) * g;
}

Var dyt(const Var& x, const Var& alpha, const Var& weight, const Var& bias, bool fused) {
    const char* op = "dyt";
    check_input(op, x, 0.0);  // no eps
    check_parameter(op, "alpha", alpha, {1}, x, true);
    const Shape features = {x.size(-1)};
    check_parameter(op, "weight", weight, features, x, false);
    check_parameter(op, "bias", bias, features, x, false);
    if (fused) return fused_dyt_node(x, alpha, weight, bias);
    Var t = tanh(to_compute(alpha) * to_compute(x));  // (..., d): torch.tanh(self.alpha * x)
    return affine(cast_back(t, x.dtype()), weight, bias);  // x * self.weight + self.bias
}

// ---- options, base, factory ----

namespace {

NormOptions with_type(NormOptions options, const char* type) {
    options.type = type;
    return options;
}

}  // namespace

double NormOptions::resolved_eps() const { return eps ? *eps : find_norm_type(type).default_eps; }

// The options every entry reads; a module checks the ones only its norm reads (alpha, a dim >= 2).
Norm::Norm(NormOptions options) : options_(std::move(options)), type_(&find_norm_type(options_.type)) {
    NL_REQUIRE(options_.dim > 0, options_.type, ": expected dim > 0, found ", options_.dim);
    NL_REQUIRE(options_.resolved_eps() >= 0.0 && std::isfinite(options_.resolved_eps()), options_.type,
               ": expected a finite eps >= 0, found ", options_.resolved_eps());
    NL_REQUIRE(is_floating(options_.dtype), options_.type, ": expected a floating dtype, found ",
               dtype_name(options_.dtype));
    if (type_->partial_row)
        NL_REQUIRE(options_.p > 0.0 && options_.p <= 1.0, type_->class_name, ": expected p in (0, 1], found ",
                   options_.p);
}

std::string Norm::type_name() const { return type_->class_name; }

std::string Norm::extra_repr() const {
    return detail::concat(options_.dim, ", eps=", eps(), ", elementwise_affine=",
                          options_.elementwise_affine ? "true" : "false", ", fused=", fused() ? "true" : "false");
}

Var Norm::forward(const Var& x) {
    // The module's one check: its dim, which the op cannot know. The op checks the rest of x
    // (an undefined or 0-dim x included).
    if (x.defined() && x.dim() >= 1)
        NL_REQUIRE(x.size(-1) == options_.dim, type_name(), ": expected input (..., ", options_.dim, "), found ",
                   shape_str(x.shape()));
    probe_input(x);
    return type_->forward(x, norm_parameters(), options_, fused());
}

void Norm::probe_input(const Var& x) {
    if (!probing_ || !x.defined() || x.numel() == 0) return;
    last_input_rms_ = std::sqrt(mean(square(x.data().to(Device::cpu()).to(DType::F64))).item());
}

std::vector<Var> Norm::norm_parameters() const {
    std::vector<Var> out;
    for (const NormParameter& p : type_->parameters) {
        Var found;
        if (p.child.empty()) {
            if (has_parameter(p.name)) found = parameter(p.name);
        } else {  // through named_parameters, so a child that wraps its norm (a monitor) is read too
            for (const auto& [name, param] : child(p.child)->named_parameters())
                if (name == p.name) found = param;
        }
        out.push_back(found);
    }
    return out;
}

void Norm::register_norm_parameters() {
    for (const NormParameter& p : type_->parameters) {
        if (!p.child.empty() || !norm_parameter_present(p, options_)) continue;  // a child registers its own
        const std::vector<double> init = norm_parameter_init(p, options_.dim, options_);
        register_parameter(p.name, Var(from_vector(init, {static_cast<int64_t>(init.size())}, options_.dtype)));
    }
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

// ---- RegistryNorm ----

RegistryNorm::RegistryNorm(const NormOptions& options) : Norm(options) { register_norm_parameters(); }

// ---- LayerNorm ----

LayerNorm::LayerNorm(const NormOptions& options) : Norm(with_type(options, "layernorm")) { register_norm_parameters(); }

LayerNorm::LayerNorm(int64_t dim, double eps) : LayerNorm(NormOptions{.type = "layernorm", .dim = dim, .eps = eps}) {}

Var LayerNorm::weight() const { return has_parameter("weight") ? parameter("weight") : Var(); }
Var LayerNorm::bias() const { return has_parameter("bias") ? parameter("bias") : Var(); }

// ---- RMSNorm (plain, with bias, partial) ----

namespace {

// The registry types the RMSNorm module serves: an RMS statistic in one kernel node.
bool is_rms_kernel_type(const NormType& type) {
    return type.statistic == NormStatistic::RootMeanSquare && type.fused == FusedForm::OneKernelNode;
}

std::string rms_kernel_type_choices() {
    std::string out;
    for (const NormType& t : norm_registry())
        if (is_rms_kernel_type(t)) out += (out.empty() ? "" : ", ") + t.name;
    return out;
}

}  // namespace

RMSNorm::RMSNorm(const NormOptions& options) : Norm(options) {
    NL_REQUIRE(is_rms_kernel_type(norm_type()), "RMSNorm: expected type ", rms_kernel_type_choices(), ", found '",
               options_.type, "'");
    register_norm_parameters();
}

RMSNorm::RMSNorm(int64_t dim, double eps) : RMSNorm(NormOptions{.type = "rmsnorm", .dim = dim, .eps = eps}) {}

Var RMSNorm::weight() const { return has_parameter("weight") ? parameter("weight") : Var(); }
Var RMSNorm::bias() const { return has_parameter("bias") ? parameter("bias") : Var(); }

int64_t RMSNorm::stat_count() const {
    return norm_type().partial_row ? partial_stat_count(options_.dim, options_.p) : options_.dim;
}

// ---- AdaptiveRMSNorm ----

AdaptiveRMSNorm::AdaptiveRMSNorm(const NormOptions& options) : Norm(with_type(options, "adaptive_rmsnorm")) {
    NL_REQUIRE(options_.dim >= 2, "AdaptiveRMSNorm: the unbiased std needs dim >= 2, found ", options_.dim);
    register_norm_parameters();  // weight, and alpha as nn.Parameter(torch.ones(1))
}

Var AdaptiveRMSNorm::weight() const { return has_parameter("weight") ? parameter("weight") : Var(); }

// ---- DyT ----

DyT::DyT(const NormOptions& options) : Norm(with_type(options, "dyt")) {
    NL_REQUIRE(std::isfinite(options_.alpha_init), "DyT: expected a finite alpha_init, found ", options_.alpha_init);
    register_norm_parameters();  // alpha = alpha_init, then weight ones and bias zeros
}

std::string DyT::extra_repr() const {
    return detail::concat(options_.dim, ", alpha_init=", options_.alpha_init, ", elementwise_affine=",
                          options_.elementwise_affine ? "true" : "false", ", fused=", fused() ? "true" : "false");
}

Var DyT::weight() const { return has_parameter("weight") ? parameter("weight") : Var(); }
Var DyT::bias() const { return has_parameter("bias") ? parameter("bias") : Var(); }

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

}  // namespace nl
