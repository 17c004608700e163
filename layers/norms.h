// Normalization layers, each in two forms selectable per module (options.fused / set_fused):
//   composed: built from autograd ops, so autograd derives the backward (and double backward);
//   fused:    one node over core/fused.h norm_forward/norm_backward, the closed-form backward,
//             saving only x and rstd (plus mean for LayerNorm) for backward.
// All normalize over the last dim. Statistics are computed in f32 for bf16/f16 inputs (f64 stays
// f64) and the result is cast back to the input dtype, as LLaMA's RMSNorm does.
//
// What the fused node keeps: its saved tensors are exactly x, rstd (and mean); DyT's, x alone. The weight, which
// the backward also needs, is a parameter that is alive anyway; the closure holds a reference to
// it instead of saving it, so graph inspection counts activation memory only. Both forms support
// double backward: the fused node is a make_fused_result (autograd/fused_node.h) whose first-order
// backward is the kernel and whose backward under create_graph is the composed form's autograd,
// re-run on the saved x (PyTorch's nn.RMSNorm and nn.LayerNorm allow double backward too).
//
// Checks: the functional forms below are the op boundary. Each checks its arguments once (x
// defined, floating, (..., d) with d > 0; each parameter's shape, dtype and device against x; eps
// finite and >= 0) and names what it expected and what it found. A module checks its options when
// it is built (type, dim, dtype, p, alpha, alpha_init) and, on forward, only what the op cannot know: that x's
// last dim is the module's dim. Each module's forward is its registry entry's functional form
// (layers/norm_registry.h) over the module's parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/module.h"

namespace nl {

// A norm's eps where none is given, for every type: PyTorch's nn.LayerNorm default and LLaMA's
// ModelArgs.norm_eps.
inline constexpr double kDefaultNormEps = 1e-5;

// ---- functional forms (weight/bias: undefined Var for none, else shape [d] with x's dtype) ----

// LayerNorm (Ba et al. 2016; PyTorch F.layer_norm): y = (x - mean) / sqrt(var + eps) * w + b,
// biased variance, two-pass.
Var layer_norm_composed(const Var& x, const Var& weight, const Var& bias, double eps);
Var layer_norm_fused(const Var& x, const Var& weight, const Var& bias, double eps);
// RMSNorm (Zhang & Sennrich 2019), LLaMA's exact form:
//   norm(x) = x * rsqrt(mean(x^2, -1, keepdim) + eps) in f32 (f64 stays f64), cast back to x's
//   dtype, then * weight (+ bias for the biased variant).
// stat_count k: the mean of squares uses the first k elements of each row (pRMSNorm; -1 = all d).
// Note on half inputs: the composed form rounds to x's dtype before multiplying by the weight (as
// LLaMA); the fused kernel multiplies in f32 and rounds once. They agree to the dtype's precision.
Var rms_norm_composed(const Var& x, const Var& weight, const Var& bias, double eps, int64_t stat_count = -1);
Var rms_norm_fused(const Var& x, const Var& weight, const Var& bias, double eps, int64_t stat_count = -1);
Var layer_norm(const Var& x, const Var& weight, const Var& bias, double eps, bool fused);
Var rms_norm(const Var& x, const Var& weight, const Var& bias, double eps, bool fused,
             int64_t stat_count = -1);
// AdaptiveRMSNorm (see the class below): rms_norm(x, weight) * sigmoid(alpha * std(x)), std the
// unbiased standard deviation over the last dim without eps; alpha a [1] Var of x's dtype.
Var adaptive_rms_norm(const Var& x, const Var& weight, const Var& alpha, double eps, bool fused);
// HybridNorm (see the class below): alpha * rms_norm(x, rms_weight) + (1 - alpha) *
// layer_norm(x, ln_weight, ln_bias), each branch with its own affine parameters.
Var hybrid_norm(const Var& x, const Var& rms_weight, const Var& ln_weight, const Var& ln_bias, double alpha,
                double eps, bool fused);
// ScaleNorm (Nguyen & Salazar 2019, Transformers without Tears): y = g * x / max(||x||_2, eps) over
// the last dim, g a [1] Var of x's dtype. Composed from autograd ops (it has no kernel of its own),
// as x * rsqrt(max(sum(x^2), eps^2)): the same value, with a zero gradient instead of 0 * inf for
// a row of zeros. The L2 norm in f32 for half inputs, cast back, then * g.
Var scale_norm(const Var& x, const Var& g, double eps);
// DyT, Dynamic Tanh (Zhu, Chen, He, LeCun & Liu 2025, Transformers without Normalization): a layer in
// a norm's place with no statistic, y = tanh(alpha * x) * weight + bias, alpha a [1] Var of x's dtype
// (required), weight and bias [d] or undefined. The composed form takes tanh in f32 for half inputs and
// casts back before the affine (as RMSNorm's); the fused form is one node over core/fused.h's
// dyt_forward/dyt_backward that saves x only (alpha and weight referenced, as the norms' weight).
// Under backward(create_graph=true) the fused node computes its gradients with autograd ops, so DyT is
// twice differentiable in both forms.
Var dyt(const Var& x, const Var& alpha, const Var& weight, const Var& bias, bool fused);

// ---- options and the factory ----

struct NormOptions {
    // A name from the norm registry (layers/norm_registry.h): "layernorm", "rmsnorm", ...
    std::string type = "rmsnorm";
    int64_t dim = 0;
    // Unset: the type's default from the registry, the article's classes' 1e-5 for every type
    // (nn.LayerNorm's default too). LLaMA's configs pass norm_eps explicitly.
    std::optional<double> eps = std::nullopt;
    bool fused = true;
    bool elementwise_affine = true;  // learnable weight (and bias where the norm has one)
    bool bias = true;                // layernorm and hybridnorm only (nn.LayerNorm's bias=True)
    double p = 0.0625;               // prmsnorm: the fraction of each row its RMS is computed over
    double alpha = 0.5;              // hybridnorm: the (fixed) weight of the RMSNorm branch
    double alpha_init = 0.5;         // dyt: the initial value of its learnable scalar alpha (Zhu et al. 2025), finite
    DType dtype = DType::F32;

    double resolved_eps() const;     // eps, or the type's default
};

// The accepted NormOptions::type values, in the registry's order.
const std::vector<std::string>& norm_types();

struct NormType;

// Every norm: a one-input module over the last dim with a fused/composed switch.
class Norm : public UnaryModule {
public:
    explicit Norm(NormOptions options);
    // The registry's PyTorch class name of options().type ("RMSNorm", "RMSNormWithBias", ...).
    std::string type_name() const override;
    const NormType& norm_type() const { return *type_; }  // options().type's registry entry
    const NormOptions& options() const { return options_; }
    int64_t dim() const { return options_.dim; }
    double eps() const { return options_.resolved_eps(); }
    virtual bool fused() const { return options_.fused; }
    virtual void set_fused(bool fused) { options_.fused = fused; }
    std::string extra_repr() const override;
    // The registry entry's functional form over this module's parameters, in this module's form.
    Var forward(const Var& x) override;
    // The parameters in the registry entry's order, an absent one as an undefined Var.
    std::vector<Var> norm_parameters() const;
    // Probing (the train job's norm_input_rms probe, which DyT's alpha is compared with: Zhu et al.
    // 2025, Fig. 8): while on, every forward records the RMS of its whole input, in f64.
    void set_probing(bool on) { probing_ = on; }
    double last_input_rms() const { return last_input_rms_; }

protected:
    void probe_input(const Var& x);  // records x's RMS while probing
    // Registers the entry's own parameters (not its children's) present under options(), at their init.
    void register_norm_parameters();
    NormOptions options_;

private:
    const NormType* type_;
    bool probing_ = false;
    double last_input_rms_ = 0.0;
};

// Builds the norm named by options.type through the registry; an unknown type is an nl::Error
// listing the choices.
std::shared_ptr<Norm> make_norm(const NormOptions& options);

// Switches every norm in `model` (at any depth) to the fused or composed form; returns how many
// norms it set. A norm made of norms (HybridNorm, a monitored norm) counts once: it sets its parts.
int64_t set_norms_fused(Module& model, bool fused);

// A norm that is its registry entry and nothing more: it registers the entry's parameters at their
// init, and its forward is the entry's functional form. The module of the entries that need no
// accessors or option checks of their own (scalenorm: ScaleNorm, whose parameter is "g").
class RegistryNorm : public Norm {
public:
    explicit RegistryNorm(const NormOptions& options);
};

// nn.LayerNorm(dim, eps, elementwise_affine, bias): weight ones, bias zeros.
class LayerNorm : public Norm {
public:
    explicit LayerNorm(const NormOptions& options);
    explicit LayerNorm(int64_t dim, double eps = kDefaultNormEps);
    Var weight() const;  // undefined without elementwise_affine
    Var bias() const;    // undefined without elementwise_affine or bias
};

// LLaMA's RMSNorm as the article writes it (type "rmsnorm", RMSNorm(dim, eps=1e-5)), with a bias
// (type "rmsnorm_bias", the article's RMSNormWithBias: y = RMSNorm(x) + b, bias zeros), or partial
// (type "prmsnorm": the RMS over the first partial_stat_count(d, p) elements of each row, the
// paper's pRMSNorm, normalizing all d). Weight ones. It serves every registry type whose statistic
// is the RMS in one kernel node; the entry says whether it has a bias and a partial row. The
// article's StableRMSNorm (x * rsqrt(mean(x^2) + eps) * weight, without the f32 upcast) is this
// same function for f32 and f64 inputs.
class RMSNorm : public Norm {
public:
    explicit RMSNorm(const NormOptions& options);
    explicit RMSNorm(int64_t dim, double eps = kDefaultNormEps);
    Var weight() const;
    Var bias() const;                 // defined where the entry lists a bias (rmsnorm_bias)
    int64_t stat_count() const;       // d, or partial_stat_count(d, p) for a partial row (prmsnorm)
};

// The article's AdaptiveRMSNorm (section 8.2): y = RMSNorm(x) * sigmoid(alpha * x.std(dim=-1,
// keepdim=True)), std PyTorch's default: UNBIASED (divide by d - 1) and without eps, so it needs
// d >= 2, and a constant row has an infinite gate gradient, as in PyTorch. alpha is a learnable
// parameter ("alpha", shape [1], initialised to 1, as nn.Parameter(torch.ones(1))) next to the
// RMSNorm weight ("weight"). Fused form: the fused RMSNorm node times the gate, which stays composed
// from autograd ops (a per-row scalar: it adds only row-sized saved tensors plus its own use of x).
class AdaptiveRMSNorm : public Norm {
public:
    explicit AdaptiveRMSNorm(const NormOptions& options);
    Var weight() const;
    Var alpha() const { return parameter("alpha"); }
};

// DyT (Zhu, Chen, He, LeCun & Liu 2025, "Transformers without Normalization"; type "dyt"): y =
// tanh(alpha * x) * weight + bias in a norm's place. alpha is a learnable [1] parameter starting at
// options.alpha_init (the paper's 0.5; it must be finite), weight ones and bias zeros (both with
// elementwise_affine), in the paper's order: alpha, weight, bias. eps is not read.
class DyT : public Norm {
public:
    explicit DyT(const NormOptions& options);
    std::string extra_repr() const override;  // dim, alpha_init, elementwise_affine, fused (no eps)
    Var alpha() const { return parameter("alpha"); }
    Var weight() const;  // undefined without elementwise_affine
    Var bias() const;    // undefined without elementwise_affine
    double alpha_init() const { return options_.alpha_init; }
};

// The article's HybridNorm (section 6.3): y = alpha * rms_norm(x) + (1 - alpha) * layer_norm(x),
// two child modules with their own parameters: "rms_norm" (an RMSNorm: rms_norm.weight) and
// "layer_norm" (a LayerNorm: layer_norm.weight, layer_norm.bias when options.bias), both with
// this norm's eps. alpha is a plain float (options.alpha in [0, 1], not learned), as the article's.
// The children follow this norm's fused/composed form (set_fused sets both).
class HybridNorm : public Norm {
public:
    explicit HybridNorm(const NormOptions& options);
    std::string extra_repr() const override;
    void set_fused(bool fused) override;
    double alpha() const { return options_.alpha; }
    std::shared_ptr<RMSNorm> rms_norm() const;       // read through child(), so replacements are seen
    std::shared_ptr<LayerNorm> layer_norm() const;
};

}  // namespace nl
