// Linear and Embedding: PyTorch's parameters, shapes and default initialization.
#include "layers/linear.h"

#include <cmath>

#include "layers/autocast.h"

namespace nl {

Generator& module_init_generator() { return default_generator(); }

// ---- Linear ----

Linear::Linear(const LinearOptions& options) : options_(options) {
    NL_REQUIRE(options.in_features > 0 && options.out_features > 0,
               "Linear: expected positive in_features and out_features, found ", options.in_features, " and ",
               options.out_features);
    NL_REQUIRE(is_floating(options.dtype), "Linear: expected a floating dtype, found ",
               dtype_name(options.dtype));
    // weight (out_features, in_features), bias (out_features)
    register_parameter("weight", Var(zeros({options.out_features, options.in_features}, options.dtype)));
    if (options.bias) register_parameter("bias", Var(zeros({options.out_features}, options.dtype)));
    reset_parameters(options.generator ? *options.generator : module_init_generator());
    options_.generator = nullptr;  // not kept: the caller's generator may not outlive the module
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Linear(LinearOptions{in_features, out_features, bias}) {}

void Linear::reset_parameters(Generator& generator) {
    // kaiming_uniform_(a=sqrt(5)): bound = sqrt(2/(1+5)) * sqrt(3/fan_in) = 1/sqrt(fan_in);
    // the bias bound is 1/sqrt(fan_in) too (torch/nn/modules/linear.py reset_parameters).
    const double bound = 1.0 / std::sqrt(static_cast<double>(options_.in_features));
    NoGradGuard no_grad;
    Var w = weight();
    w.data().copy_(uniform(w.shape(), -bound, bound, generator, w.dtype()));
    if (options_.bias) {
        Var b = bias();
        b.data().copy_(uniform(b.shape(), -bound, bound, generator, b.dtype()));
    }
}

Var Linear::bias() const { return has_parameter("bias") ? parameter("bias") : Var(); }

std::string Linear::extra_repr() const {
    return detail::concat("in_features=", options_.in_features, ", out_features=", options_.out_features,
                          ", bias=", options_.bias ? "true" : "false");
}

Var Linear::forward(const Var& x) { return forward_cast(x, autocast_lower_data(x)); }

Var Linear::forward_cast(const Var& x, const Tensor& x_low) {
    NL_REQUIRE(x.defined() && x.dim() >= 1 && x.size(-1) == options_.in_features,
               "Linear: expected input (..., ", options_.in_features, "), found ",
               x.defined() ? shape_str(x.shape()) : std::string("an undefined Var"));
    // Under autocast (layers/autocast.h) the product runs on bf16 copies of x, W and b and returns
    // bf16; W and b stay f32, and x, W and b receive gradients in their own dtypes (autocast_linear's
    // node for x and W, a cast node for b). Off, these are x, W and b.
    const DType w_compute = autocast_compute_dtype(weight().dtype());
    NL_REQUIRE(autocast_compute_dtype(x.dtype()) == w_compute, "Linear: expected input of dtype ", dtype_name(w_compute),
               is_autocast_enabled() ? " (the autocast dtype)" : " (the weight's)", ", found ",
               dtype_name(x.dtype()));
    Var y = autocast_linear(x, x_low, weight());  // (..., out)
    if (options_.bias) y = y + autocast_lower(bias());
    return y;
}

// ---- Embedding ----

Embedding::Embedding(const EmbeddingOptions& options) : options_(options) {
    NL_REQUIRE(options.num_embeddings > 0 && options.embedding_dim > 0,
               "Embedding: expected positive num_embeddings and embedding_dim, found ", options.num_embeddings,
               " and ", options.embedding_dim);
    NL_REQUIRE(is_floating(options.dtype), "Embedding: expected a floating dtype, found ",
               dtype_name(options.dtype));
    Generator& gen = options.generator ? *options.generator : module_init_generator();
    // weight (num_embeddings, embedding_dim) ~ N(0, 1): nn.Embedding.reset_parameters
    register_parameter("weight",
                       Var(normal({options.num_embeddings, options.embedding_dim}, 0.0, 1.0, gen, options.dtype)));
    options_.generator = nullptr;
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : Embedding(EmbeddingOptions{num_embeddings, embedding_dim}) {}

std::string Embedding::extra_repr() const {
    return detail::concat(options_.num_embeddings, ", ", options_.embedding_dim);
}

Var Embedding::forward(const Tensor& ids) {
    NL_REQUIRE(ids.defined() && ids.dtype() == DType::I64, "Embedding: expected i64 token ids, found ",
               ids.defined() ? dtype_name(ids.dtype()) : "an undefined tensor");
    return embedding(weight(), ids);
}

}  // namespace nl
