// Linear (y = x W^T + b) and Embedding (a lookup table), with PyTorch's parameter names, shapes and
// default initialization, drawn from a Generator so a seed gives the same model every time.
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "layers/module.h"

namespace nl {

// The generator layers draw their initial weights from when their options name none: the
// process-wide default generator (so nl::manual_seed(s) before building a model fixes its init,
// as torch.manual_seed does).
Generator& module_init_generator();

struct LinearOptions {
    int64_t in_features = 0;
    int64_t out_features = 0;
    bool bias = true;
    DType dtype = DType::F32;
    Generator* generator = nullptr;  // null: module_init_generator()
};

// nn.Linear: weight (out_features, in_features), bias (out_features). Init as PyTorch's
// reset_parameters: kaiming_uniform_(a=sqrt(5)) gives bound = gain * sqrt(3 / fan_in) with
// gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), i.e. weight ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the
// bias uses the same bound 1/sqrt(fan_in). The weight is drawn before the bias.
class Linear : public UnaryModule {
public:
    explicit Linear(const LinearOptions& options);
    Linear(int64_t in_features, int64_t out_features, bool bias = true);
    std::string type_name() const override { return "Linear"; }
    std::string extra_repr() const override;

    // x (..., in_features) -> (..., out_features)
    Var forward(const Var& x) override;
    // forward with x's autocast copy already made (x_low = autocast_lower_data(x), layers/autocast.h),
    // so that several Linears reading one x cast it once (attention's wq, wk, wv; SwiGLU's w1, w3).
    Var forward_cast(const Var& x, const Tensor& x_low);
    // Redraws weight and bias in place (the Vars keep their identity).
    void reset_parameters(Generator& generator);

    Var weight() const { return parameter("weight"); }
    Var bias() const;  // undefined when built without bias
    const LinearOptions& options() const { return options_; }

private:
    LinearOptions options_;
};

struct EmbeddingOptions {
    int64_t num_embeddings = 0;
    int64_t embedding_dim = 0;
    DType dtype = DType::F32;
    Generator* generator = nullptr;  // null: module_init_generator()
};

// nn.Embedding: weight (num_embeddings, embedding_dim) ~ N(0, 1) as PyTorch's default.
class Embedding : public Module {
public:
    explicit Embedding(const EmbeddingOptions& options);
    Embedding(int64_t num_embeddings, int64_t embedding_dim);
    std::string type_name() const override { return "Embedding"; }
    std::string extra_repr() const override;

    // ids: i64 of any shape, each in [0, num_embeddings) -> ids.shape + [embedding_dim]
    Var forward(const Tensor& ids);
    Var weight() const { return parameter("weight"); }
    const EmbeddingOptions& options() const { return options_; }

private:
    EmbeddingOptions options_;
};

}  // namespace nl
