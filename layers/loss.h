// Losses: MSE (mean) and cross-entropy over logits with ignore_index, optionally with PaLM's z-loss.
// Cross-entropy exists fused (one node over core/fused.h's cross_entropy kernels: saves logits +
// per-row logsumexp) and composed (log_softmax + gather + masked mean from autograd ops) so tests can
// check they agree.
#pragma once

#include <cstdint>

#include "core/fused.h"
#include "layers/module.h"

namespace nl {

// F.mse_loss(input, target) with reduction='mean': mean((input - target)^2) over every element;
// shapes must match exactly (no silent broadcasting, a classic bug).
Var mse_loss(const Var& input, const Var& target);

// F.cross_entropy with the class dim LAST: logits (..., C), targets (...) of i64. Rows whose
// target == ignore_index contribute nothing; Mean divides by the non-ignored count (NaN when all
// rows are ignored, as PyTorch). The fused node's backward is a kernel; under
// backward(create_graph=true) it is the composed form's autograd (autograd/fused_node.h), so the
// loss is twice differentiable (Hessian-vector products) in either form.
// Under autocast (layers/autocast.h) bf16/f16 logits give an f32 loss, as torch.autocast's
// cross_entropy does: the fused kernel reads them as they are, without an f32 copy.
Var cross_entropy_loss(const Var& logits, const Tensor& targets, int64_t ignore_index = -100,
                       Reduction reduction = Reduction::Mean);
// The same loss from autograd ops: -gather(log_softmax(logits), target), masked, reduced.
Var cross_entropy_loss_composed(const Var& logits, const Tensor& targets, int64_t ignore_index = -100,
                                Reduction reduction = Reduction::Mean);

// Cross-entropy plus PaLM's z-loss (Chowdhery et al. 2022, section 5; Wortsman et al. 2023, "Small-scale
// proxies for large-scale Transformer training instabilities"): each scored row's loss gains
// z_loss * lse^2, lse = logsumexp(logits row), which keeps the softmax's normalizer near 1 (lse near 0)
// and the output logits from drifting. Mean adds z_loss * mean(lse^2) over the non-ignored rows, Sum
// z_loss * sum(lse^2), None z_loss * lse^2 per row.
struct CrossEntropyTerms {
    Var loss;       // cross-entropy + the z term: what to differentiate
    Tensor z_loss;  // the z term alone, loss's shape and dtype, no grad (a metrics column; loss - z_loss
                    // is the cross-entropy); zeros when z_loss == 0
};
// z_loss (the coefficient c) must be finite and >= 0. The fused form is one node over the kernels
// (the z term from the lse they compute anyway; first-order only); with z_loss == 0 its loss is
// cross_entropy_loss's, the same bits and speed.
CrossEntropyTerms cross_entropy_z_loss(const Var& logits, const Tensor& targets, double z_loss,
                                       int64_t ignore_index = -100, Reduction reduction = Reduction::Mean);
// The same from autograd ops (lse = m + log(sum(exp(logits - m))), m the rows' max, held constant):
// twice differentiable.
CrossEntropyTerms cross_entropy_z_loss_composed(const Var& logits, const Tensor& targets, double z_loss,
                                                int64_t ignore_index = -100, Reduction reduction = Reduction::Mean);

class MSELoss : public Module {
public:
    std::string type_name() const override { return "MSELoss"; }
    Var forward(const Var& input, const Var& target) { return mse_loss(input, target); }
};

struct CrossEntropyOptions {
    int64_t ignore_index = -100;
    Reduction reduction = Reduction::Mean;
    bool fused = true;
    double z_loss = 0.0;  // the z-loss coefficient (cross_entropy_z_loss); 0: off
};

class CrossEntropyLoss : public Module {
public:
    explicit CrossEntropyLoss(const CrossEntropyOptions& options = {}) : options_(options) {}
    std::string type_name() const override { return "CrossEntropyLoss"; }
    std::string extra_repr() const override;
    // The loss (with the z term when options().z_loss > 0).
    Var forward(const Var& logits, const Tensor& targets);
    // The loss and the z term apart (for logging).
    CrossEntropyTerms forward_terms(const Var& logits, const Tensor& targets);
    void set_fused(bool fused) { options_.fused = fused; }
    const CrossEntropyOptions& options() const { return options_; }

private:
    CrossEntropyOptions options_;
};

}  // namespace nl
