// Losses: MSE (mean) and cross-entropy over logits with ignore_index. Cross-entropy exists fused
// (one node over core/fused.h's cross_entropy kernels: saves logits + per-row logsumexp) and
// composed (log_softmax + gather + masked mean from autograd ops) so tests can check they agree.
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

class MSELoss : public Module {
public:
    std::string type_name() const override { return "MSELoss"; }
    Var forward(const Var& input, const Var& target) { return mse_loss(input, target); }
};

struct CrossEntropyOptions {
    int64_t ignore_index = -100;
    Reduction reduction = Reduction::Mean;
    bool fused = true;
};

class CrossEntropyLoss : public Module {
public:
    explicit CrossEntropyLoss(const CrossEntropyOptions& options = {}) : options_(options) {}
    std::string type_name() const override { return "CrossEntropyLoss"; }
    std::string extra_repr() const override;
    Var forward(const Var& logits, const Tensor& targets);
    void set_fused(bool fused) { options_.fused = fused; }
    const CrossEntropyOptions& options() const { return options_; }

private:
    CrossEntropyOptions options_;
};

}  // namespace nl
