// The norm registry's table (see norm_registry.h). One entry per norm type.
#include "layers/norm_registry.h"

#include "core/error.h"

namespace nl {

namespace {

template <typename N>
std::shared_ptr<Norm> make(const NormOptions& options) {
    return std::make_shared<N>(options);
}

std::vector<NormType> build_registry() {
    std::vector<NormType> types;
    types.push_back({
        .name = "layernorm",
        .class_name = "LayerNorm",
        .default_eps = 1e-5,
        .parameters = {"weight", "bias"},
        .formula = "y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias   (var biased, over the last dim)",
        .reference = "Ba et al. 2016, Layer Normalization; PyTorch nn.LayerNorm",
        .fused_form = "one node over the LayerNorm kernel pair (saves x, mean, rstd)",
        .make = make<LayerNorm>,
        .gradcheck_param_sizes = {0, 0},
        .gradcheck_composed = [](const std::vector<Var>& v) { return layer_norm_composed(v[0], v[1], v[2], 1e-5); },
    });
    types.push_back({
        .name = "rmsnorm",
        .class_name = "RMSNorm",
        .default_eps = 1e-5,
        .parameters = {"weight"},
        .formula = "y = x / sqrt(mean(x^2) + eps) * weight   (statistics in f32 for half inputs, cast back)",
        .reference = "Zhang & Sennrich 2019, Root Mean Square Layer Normalization; LLaMA's RMSNorm (the article, 4.2)",
        .fused_form = "one node over the RMSNorm kernel pair (saves x, rstd)",
        .make = make<RMSNorm>,
        .gradcheck_param_sizes = {0},
        .gradcheck_composed = [](const std::vector<Var>& v) { return rms_norm_composed(v[0], v[1], Var(), 1e-5); },
    });
    types.push_back({
        .name = "rmsnorm_bias",
        .class_name = "RMSNormWithBias",
        .default_eps = 1e-5,
        .parameters = {"weight", "bias"},
        .formula = "y = x / sqrt(mean(x^2) + eps) * weight + bias",
        .reference = "the article's RMSNormWithBias (8.2)",
        .fused_form = "one node over the RMSNorm kernel pair with bias (saves x, rstd)",
        .make = make<RMSNorm>,
        .gradcheck_param_sizes = {0, 0},
        .gradcheck_composed = [](const std::vector<Var>& v) { return rms_norm_composed(v[0], v[1], v[2], 1e-5); },
    });
    types.push_back({
        .name = "prmsnorm",
        .class_name = "PRMSNorm",
        .default_eps = 1e-5,
        .parameters = {"weight"},
        .formula = "y = x / sqrt(mean(x[..., :k]^2) + eps) * weight,  k = ceil(p * d)  (p = 0.0625)",
        .reference = "Zhang & Sennrich 2019, partial RMSNorm (pRMSNorm)",
        .fused_form = "one node over the RMSNorm kernel pair with a stat count (saves x, rstd)",
        .make = make<RMSNorm>,
        .gradcheck_param_sizes = {0},
        .gradcheck_composed = [](const std::vector<Var>& v) { return rms_norm_composed(v[0], v[1], Var(), 1e-5, 3); },
    });
    types.push_back({
        .name = "adaptive_rmsnorm",
        .class_name = "AdaptiveRMSNorm",
        .default_eps = 1e-5,
        .parameters = {"weight", "alpha"},
        .formula = "y = RMSNorm(x) * sigmoid(alpha * std(x))   (std unbiased, no eps; alpha [1], init 1)",
        .reference = "the article's AdaptiveRMSNorm (8.2)",
        .fused_form = "the fused RMSNorm node times a composed per-row gate",
        .make = make<AdaptiveRMSNorm>,
        .gradcheck_param_sizes = {0, 1},
        .gradcheck_composed = [](const std::vector<Var>& v) { return adaptive_rms_norm(v[0], v[1], v[2], 1e-5, false); },
    });
    types.push_back({
        .name = "hybridnorm",
        .class_name = "HybridNorm",
        .default_eps = 1e-5,
        .parameters = {"rms_norm.weight", "layer_norm.weight", "layer_norm.bias"},
        .formula = "y = alpha * RMSNorm(x) + (1 - alpha) * LayerNorm(x)   (alpha a fixed float, 0.5)",
        .reference = "the article's HybridNorm (6.3)",
        .fused_form = "the fused RMSNorm and LayerNorm nodes, blended by autograd ops",
        .make = make<HybridNorm>,
        .gradcheck_param_sizes = {0, 0, 0},
        .gradcheck_composed = [](const std::vector<Var>& v) { return hybrid_norm(v[0], v[1], v[2], v[3], 0.3, 1e-5, false); },
    });
    return types;
}

}  // namespace

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

}  // namespace nl
