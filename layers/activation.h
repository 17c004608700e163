// Activation modules (ReLU, SiLU, GELU) and Dropout with its own seeded Generator, so a run's
// dropout masks are reproducible and can be checkpointed (the generator's state is two integers).
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "layers/module.h"

namespace nl {

class ReLU : public UnaryModule {
public:
    std::string type_name() const override { return "ReLU"; }
    Var forward(const Var& x) override { return relu(x); }
};

class SiLU : public UnaryModule {
public:
    std::string type_name() const override { return "SiLU"; }
    Var forward(const Var& x) override { return silu(x); }
};

// The exact (erf) GELU, PyTorch's default approximate='none'.
class GELU : public UnaryModule {
public:
    std::string type_name() const override { return "GELU"; }
    Var forward(const Var& x) override { return gelu(x); }
};

// Soft-capping (Gemma 2, Gemma Team 2024; Grok-1): cap * tanh(x / cap), which bounds x to (-cap, cap)
// smoothly and leaves small values nearly as they are (slope 1 at 0); Gemma 2 caps its final logits at
// 30. cap must be finite and >= 0; 0 returns x itself (off). fused (the default): one node over
// core/fused.h's softcap_forward/softcap_backward (one pass each way; the backward from the output), whose
// create_graph backward differentiates the composed form; else the composed form itself,
// tanh(x / cap) * cap in autograd ops. Either way twice differentiable.
Var softcap(const Var& x, double cap, bool fused = true);

// Inverted dropout (as PyTorch): in training each element is kept with probability 1 - p and
// scaled by 1 / (1 - p); p = 1 zeroes everything. The mask is drawn from `generator` in row-major
// order (uniform u, keep when u >= p). Outside training, or when p == 0, x is returned as is.
Var dropout(const Var& x, double p, bool training, Generator& generator);

class Dropout : public UnaryModule {
public:
    explicit Dropout(double p = 0.5, uint64_t seed = 0);
    std::string type_name() const override { return "Dropout"; }
    std::string extra_repr() const override;
    Var forward(const Var& x) override;

    double p() const { return p_; }
    Generator& generator() { return generator_; }  // e.g. set_state() when resuming a run

private:
    double p_;
    Generator generator_;
};

}  // namespace nl
