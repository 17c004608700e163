// The norm registry's table (see norm_registry.h): one entry per norm type, with the f64 loops
// of the formulas the entries' reference forms share.
#include "layers/norm_registry.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/fused.h"

namespace nl {

namespace {

template <typename N>
std::shared_ptr<Norm> make(const NormOptions& options) {
    return std::make_shared<N>(options);
}

using Values = std::vector<std::vector<double>>;

// ---- parameters ----

NormParameter weight_in(const std::string& child) {
    return {child, "weight", ParameterShape::Features, ParameterInit::Ones, ParameterPresence::Affine};
}
NormParameter bias_in(const std::string& child, ParameterPresence presence) {
    return {child, "bias", ParameterShape::Features, ParameterInit::Zeros, presence};
}

// ---- the reference forms' row formulas, in f64 ----

double row_mean(const double* x, int64_t n) {
    double s = 0.0;
    for (int64_t j = 0; j < n; ++j) s += x[j];
    return s / static_cast<double>(n);
}

double row_variance(const double* x, int64_t d) {  // biased: divide by d
    const double mu = row_mean(x, d);
    double s = 0.0;
    for (int64_t j = 0; j < d; ++j) s += (x[j] - mu) * (x[j] - mu);
    return s / static_cast<double>(d);
}

// out = x / sqrt(mean(x[:k]^2) + eps), all d elements.
void rms_normalized(const double* x, int64_t d, int64_t k, double eps, double* out) {
    double ms = 0.0;
    for (int64_t j = 0; j < k; ++j) ms += x[j] * x[j];
    const double scale = 1.0 / std::sqrt(ms / static_cast<double>(k) + eps);
    for (int64_t j = 0; j < d; ++j) out[j] = x[j] * scale;
}

// out = (x - mean(x)) / sqrt(var(x) + eps), var biased.
void layer_normalized(const double* x, int64_t d, double eps, double* out) {
    const double mu = row_mean(x, d);
    const double scale = 1.0 / std::sqrt(row_variance(x, d) + eps);
    for (int64_t j = 0; j < d; ++j) out[j] = (x[j] - mu) * scale;
}

// y = rms_normalized(x) * weight (+ bias): the RMSNorm kernel's family.
void rms_reference(const double* x, int64_t d, int64_t k, double eps, const std::vector<double>& weight,
                   const std::vector<double>* bias, double* y) {
    rms_normalized(x, d, k, eps, y);
    for (int64_t j = 0; j < d; ++j) y[j] = y[j] * weight[j] + (bias ? (*bias)[j] : 0.0);
}

// ---- the entries ----

void add_layer_norms(std::vector<NormType>& types) {
    types.push_back({
        .name = "layernorm",
        .class_name = "LayerNorm",
        .default_eps = kDefaultNormEps,
        .statistic = NormStatistic::Variance,
        .fused = FusedForm::OneKernelNode,
        .parameters = {weight_in(""), bias_in("", ParameterPresence::AffineAndBias)},
        .forward = [](const Var& x, const std::vector<Var>& p, const NormOptions& o, bool fused) {
            return layer_norm(x, p[0], p[1], o.resolved_eps(), fused);
        },
        .reference = [](const double* x, int64_t d, const Values& p, const NormOptions& o, double* y) {
            layer_normalized(x, d, o.resolved_eps(), y);
            for (int64_t j = 0; j < d; ++j) y[j] = y[j] * p[0][j] + p[1][j];
        },
        .gradcheck = {},  // the default options and tolerances
        .help = {.formula = "y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias   (var biased, over the last dim)",
                 .reference = "Ba et al. 2016, Layer Normalization; PyTorch nn.LayerNorm",
                 .fused_form = "one node over the LayerNorm kernel pair (saves x, mean, rstd)"},
        .make = make<LayerNorm>,
    });
}

void add_rms_norms(std::vector<NormType>& types) {
    types.push_back({
        .name = "rmsnorm",
        .class_name = "RMSNorm",
        .default_eps = kDefaultNormEps,
        .statistic = NormStatistic::RootMeanSquare,
        .fused = FusedForm::OneKernelNode,
        .parameters = {weight_in("")},
        .forward = [](const Var& x, const std::vector<Var>& p, const NormOptions& o, bool fused) {
            return rms_norm(x, p[0], Var(), o.resolved_eps(), fused);
        },
        .reference = [](const double* x, int64_t d, const Values& p, const NormOptions& o, double* y) {
            rms_reference(x, d, d, o.resolved_eps(), p[0], nullptr, y);
        },
        .gradcheck = {},  // the default options and tolerances
        .help = {.formula = "y = x / sqrt(mean(x^2) + eps) * weight   (statistics in f32 for half inputs, cast back)",
                 .reference = "Zhang & Sennrich 2019, Root Mean Square Layer Normalization; LLaMA's RMSNorm (the article, 4.2)",
                 .fused_form = "one node over the RMSNorm kernel pair (saves x, rstd)"},
        .make = make<RMSNorm>,
    });
    types.push_back({
        .name = "rmsnorm_bias",
        .class_name = "RMSNormWithBias",
        .default_eps = kDefaultNormEps,
        .statistic = NormStatistic::RootMeanSquare,
        .fused = FusedForm::OneKernelNode,
        .parameters = {weight_in(""), bias_in("", ParameterPresence::Affine)},
        .forward = [](const Var& x, const std::vector<Var>& p, const NormOptions& o, bool fused) {
            return rms_norm(x, p[0], p[1], o.resolved_eps(), fused);
        },
        .reference = [](const double* x, int64_t d, const Values& p, const NormOptions& o, double* y) {
            rms_reference(x, d, d, o.resolved_eps(), p[0], &p[1], y);
        },
        .gradcheck = {},  // the default options and tolerances
        .help = {.formula = "y = x / sqrt(mean(x^2) + eps) * weight + bias",
                 .reference = "the article's RMSNormWithBias (8.2)",
                 .fused_form = "one node over the RMSNorm kernel pair with bias (saves x, rstd)"},
        .make = make<RMSNorm>,
    });
    types.push_back({
        .name = "prmsnorm",
        .class_name = "PRMSNorm",
        .default_eps = kDefaultNormEps,
        .statistic = NormStatistic::RootMeanSquare,
        .partial_row = true,
        .fused = FusedForm::OneKernelNode,
        .parameters = {weight_in("")},
        .forward = [](const Var& x, const std::vector<Var>& p, const NormOptions& o, bool fused) {
            return rms_norm(x, p[0], Var(), o.resolved_eps(), fused, partial_stat_count(o.dim, o.p));
        },
        .reference = [](const double* x, int64_t d, const Values& p, const NormOptions& o, double* y) {
            rms_reference(x, d, partial_stat_count(d, o.p), o.resolved_eps(), p[0], nullptr, y);
        },
        .gradcheck = {.options = {.p = 0.3}},  // 3 of 8 (the default 0.0625 leaves one element)
        .help = {.formula = "y = x / sqrt(mean(x[..., :k]^2) + eps) * weight,  k = ceil(p * d)  (p = 0.0625)",
                 .reference = "Zhang & Sennrich 2019, partial RMSNorm (pRMSNorm)",
                 .fused_form = "one node over the RMSNorm kernel pair with a stat count (saves x, rstd)"},
        .make = make<RMSNorm>,
    });
}

void add_article_norms(std::vector<NormType>& types) {
    types.push_back({
        .name = "adaptive_rmsnorm",
        .class_name = "AdaptiveRMSNorm",
        .default_eps = kDefaultNormEps,
        .statistic = NormStatistic::RootMeanSquare,
        .fused = FusedForm::KernelAndOps,
        .parameters = {weight_in(""), {"", "alpha", ParameterShape::One, ParameterInit::Ones, ParameterPresence::Always}},
        .forward = [](const Var& x, const std::vector<Var>& p, const NormOptions& o, bool fused) {
            return adaptive_rms_norm(x, p[0], p[1], o.resolved_eps(), fused);
        },
        .reference = [](const double* x, int64_t d, const Values& p, const NormOptions& o, double* y) {
            const double std_unbiased = std::sqrt(row_variance(x, d) * d / (d - 1));  // x.std(dim=-1)
            const double gate = 1.0 / (1.0 + std::exp(-p[1][0] * std_unbiased));
            rms_reference(x, d, d, o.resolved_eps(), p[0], nullptr, y);
            for (int64_t j = 0; j < d; ++j) y[j] *= gate;
        },
        .gradcheck = {},  // the default options and tolerances
        .help = {.formula = "y = RMSNorm(x) * sigmoid(alpha * std(x))   (std unbiased, no eps; alpha [1], init 1)",
                 .reference = "the article's AdaptiveRMSNorm (8.2)",
                 .fused_form = "the fused RMSNorm node times a composed per-row gate"},
        .make = make<AdaptiveRMSNorm>,
    });
    types.push_back({
        .name = "hybridnorm",
        .class_name = "HybridNorm",
        .default_eps = kDefaultNormEps,
        .statistic = NormStatistic::Both,
        .fused = FusedForm::KernelAndOps,
        .parameters = {weight_in("rms_norm"), weight_in("layer_norm"), bias_in("layer_norm", ParameterPresence::AffineAndBias)},
        .forward = [](const Var& x, const std::vector<Var>& p, const NormOptions& o, bool fused) {
            return hybrid_norm(x, p[0], p[1], p[2], o.alpha, o.resolved_eps(), fused);
        },
        .reference = [](const double* x, int64_t d, const Values& p, const NormOptions& o, double* y) {
            std::vector<double> ln(d);
            rms_reference(x, d, d, o.resolved_eps(), p[0], nullptr, y);
            layer_normalized(x, d, o.resolved_eps(), ln.data());
            for (int64_t j = 0; j < d; ++j) y[j] = o.alpha * y[j] + (1.0 - o.alpha) * (ln[j] * p[1][j] + p[2][j]);
        },
        .gradcheck = {.options = {.alpha = 0.3}},  // unequal branches
        .help = {.formula = "y = alpha * RMSNorm(x) + (1 - alpha) * LayerNorm(x)   (alpha a fixed float, 0.5)",
                 .reference = "the article's HybridNorm (6.3)",
                 .fused_form = "the fused RMSNorm and LayerNorm nodes, blended by autograd ops"},
        .make = make<HybridNorm>,
    });
}

// Norms without a kernel of their own: the fused form is the composed form.
void add_composed_norms(std::vector<NormType>& types) {
    types.push_back({
        .name = "scalenorm",
        .class_name = "ScaleNorm",
        .default_eps = kDefaultNormEps,
        .statistic = NormStatistic::L2Norm,
        .fused = FusedForm::Composed,
        .parameters = {{"", "g", ParameterShape::One, ParameterInit::SqrtDim, ParameterPresence::Always}},
        .forward = [](const Var& x, const std::vector<Var>& p, const NormOptions& o, bool) {
            return scale_norm(x, p[0], o.resolved_eps());
        },
        .reference = [](const double* x, int64_t d, const Values& p, const NormOptions& o, double* y) {
            double ss = 0.0;
            for (int64_t j = 0; j < d; ++j) ss += x[j] * x[j];
            const double scale = p[0][0] / std::max(std::sqrt(ss), o.resolved_eps());
            for (int64_t j = 0; j < d; ++j) y[j] = x[j] * scale;
        },
        .gradcheck = {},  // the default options and tolerances
        .help = {.formula = "y = g * x / max(||x||_2, eps)   (g a learned [1] scale, init sqrt(d))",
                 .reference = "Nguyen & Salazar 2019, Transformers without Tears (ScaleNorm)",
                 .fused_form = "the composed form (autograd ops; no kernel of its own)"},
        .make = make<RegistryNorm>,
    });
}

// Layers that take a norm's place without a statistic.
void add_norm_replacements(std::vector<NormType>& types) {
    types.push_back({
        .name = "dyt",
        .class_name = "DyT",
        .default_eps = kDefaultNormEps,  // unread: the formula has no eps
        .statistic = NormStatistic::Elementwise,
        .fused = FusedForm::OneKernelNode,
        // The paper's module declares alpha, weight, bias in this order.
        .parameters = {{"", "alpha", ParameterShape::One, ParameterInit::AlphaInit, ParameterPresence::Always},
                       weight_in(""), bias_in("", ParameterPresence::Affine)},
        .forward = [](const Var& x, const std::vector<Var>& p, const NormOptions&, bool fused) {
            return dyt(x, p[0], p[1], p[2], fused);
        },
        .reference = [](const double* x, int64_t d, const Values& p, const NormOptions&, double* y) {
            for (int64_t j = 0; j < d; ++j) y[j] = std::tanh(p[0][0] * x[j]) * p[1][j] + p[2][j];
        },
        .gradcheck = {},  // the default options (alpha_init 0.5) and tolerances
        .help = {.formula = "y = tanh(alpha * x) * weight + bias   (alpha a learned [1] scalar, init alpha_init = 0.5; "
                            "no statistic, eps unread)",
                 .reference = "Zhu, Chen, He, LeCun & Liu 2025, Transformers without Normalization (DyT)",
                 .fused_form = "one node over the DyT kernel pair (saves x)"},
        .make = make<DyT>,
    });
}

std::vector<NormType> build_registry() {
    std::vector<NormType> types;
    add_layer_norms(types);
    add_rms_norms(types);
    add_article_norms(types);
    add_composed_norms(types);
    add_norm_replacements(types);
    return types;
}

}  // namespace

std::string NormParameter::state_name() const { return join_name(child, name); }

const char* norm_statistic_name(NormStatistic statistic) {
    switch (statistic) {
        case NormStatistic::Variance: return "variance";
        case NormStatistic::RootMeanSquare: return "RMS";
        case NormStatistic::Both: return "variance and RMS";
        case NormStatistic::L2Norm: return "L2 norm";
        case NormStatistic::Elementwise: return "none (elementwise)";
    }
    throw Error("norm_statistic_name: unknown statistic");
}

const char* fused_form_name(FusedForm form) {
    switch (form) {
        case FusedForm::OneKernelNode: return "one_kernel_node";
        case FusedForm::KernelAndOps: return "kernel_and_ops";
        case FusedForm::Composed: return "composed";
    }
    throw Error("fused_form_name: unknown form");
}

const char* parameter_init_name(ParameterInit init) {
    switch (init) {
        case ParameterInit::Ones: return "ones";
        case ParameterInit::Zeros: return "zeros";
        case ParameterInit::SqrtDim: return "sqrt_dim";
        case ParameterInit::AlphaInit: return "alpha_init";
    }
    throw Error("parameter_init_name: unknown init");
}

const char* parameter_presence_name(ParameterPresence presence) {
    switch (presence) {
        case ParameterPresence::Always: return "always";
        case ParameterPresence::Affine: return "affine";
        case ParameterPresence::AffineAndBias: return "affine_and_bias";
    }
    throw Error("parameter_presence_name: unknown presence");
}

const std::vector<NormType>& norm_registry() {
    static const std::vector<NormType> types = build_registry();
    return types;
}

std::string norm_type_choices() {
    std::string out;
    for (const NormType& t : norm_registry()) out += (out.empty() ? "" : ", ") + t.name;
    return out;
}

const NormType& find_norm_type(const std::string& name) {
    for (const NormType& t : norm_registry())
        if (t.name == name) return t;
    throw Error(detail::concat("unknown norm type '", name, "' (choices: ", norm_type_choices(), ")"));
}

const std::vector<std::string>& norm_types() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> out;
        for (const NormType& t : norm_registry()) out.push_back(t.name);
        return out;
    }();
    return names;
}

std::vector<std::string> norm_parameter_names(const NormType& type) {
    std::vector<std::string> out;
    for (const NormParameter& p : type.parameters) out.push_back(p.state_name());
    return out;
}

std::vector<double> norm_parameter_init(const NormParameter& parameter, int64_t d, const NormOptions& options) {
    const size_t n = parameter.shape == ParameterShape::Features ? static_cast<size_t>(d) : 1;
    switch (parameter.init) {
        case ParameterInit::Ones: return std::vector<double>(n, 1.0);
        case ParameterInit::Zeros: return std::vector<double>(n, 0.0);
        case ParameterInit::SqrtDim: return std::vector<double>(n, std::sqrt(static_cast<double>(d)));
        case ParameterInit::AlphaInit: return std::vector<double>(n, options.alpha_init);
    }
    throw Error("norm_parameter_init: unknown init");
}

bool norm_parameter_present(const NormParameter& parameter, const NormOptions& options) {
    switch (parameter.presence) {
        case ParameterPresence::Always: return true;
        case ParameterPresence::Affine: return options.elementwise_affine;
        case ParameterPresence::AffineAndBias: return options.elementwise_affine && options.bias;
    }
    throw Error("norm_parameter_present: unknown presence");
}

std::vector<std::string> norm_option_names(const NormType& type) {
    const auto has_presence = [&](ParameterPresence presence) {
        return std::any_of(type.parameters.begin(), type.parameters.end(),
                           [&](const NormParameter& p) { return p.presence == presence; });
    };
    std::vector<std::string> out;
    if (has_presence(ParameterPresence::Affine) || has_presence(ParameterPresence::AffineAndBias))
        out.push_back("elementwise_affine");
    if (has_presence(ParameterPresence::AffineAndBias)) out.push_back("bias");
    if (type.partial_row) out.push_back("p");
    if (type.statistic == NormStatistic::Both) out.push_back("alpha");  // the fixed weight of the RMS branch
    if (std::any_of(type.parameters.begin(), type.parameters.end(),
                    [](const NormParameter& p) { return p.init == ParameterInit::AlphaInit; }))
        out.push_back("alpha_init");  // a learned parameter's initial value (DyT's alpha)
    return out;
}

NormOptions norm_gradcheck_options(const NormType& type, int64_t dim, bool fused) {
    NormOptions options = type.gradcheck.options;
    options.type = type.name;
    options.dim = dim;
    options.fused = fused;
    options.dtype = DType::F64;
    return options;
}

std::vector<Var> norm_gradcheck_inputs(const NormType& type, const Shape& x_shape, Generator& gen) {
    const int64_t d = x_shape.back();
    std::vector<Var> inputs{Var(randn(x_shape, gen, DType::F64) * 1.5 + 0.3, true)};
    for (const NormParameter& p : type.parameters) {
        const std::vector<double> init = norm_parameter_init(p, d, type.gradcheck.options);
        const Shape shape = {static_cast<int64_t>(init.size())};
        inputs.push_back(Var(from_vector(init, shape, DType::F64) + randn(shape, gen, DType::F64) * 0.5, true));
    }
    return inputs;
}

}  // namespace nl
