// The train job's stability probes (train.probe_every): what the literature watches to see why a
// transformer is or is not stable. Per block the largest attention score (q k^T / sqrt(hd) before
// softmax: Wortsman et al. 2023's attention-logit growth), the attention's entropy and its weight on
// the first token (Xiao et al. 2023's attention sink), and of the residual stream after the block its
// RMS (growth with depth: Xiong et al. 2020, Sun et al. 2025), its largest |h| (Sun et al. 2024's
// massive activations) and its channels' kurtosis (He et al. 2024's outlier features); the mean and
// max of the output logsumexp (Wortsman's output-logit drift, what the z-loss holds near 0); for every
// parameter tensor the RMS of its gradient and the size of its update relative to its weight,
// ||update|| / ||weight||; each DyT norm's alpha (Zhu et al. 2025) and every norm's input RMS, which
// that alpha is compared with. One row per probed step in the run directory's probes.csv; the
// formulas are layers/transformer.h's attention_probe and residual_probe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/transformer.h"

namespace nl {

// (name, value) in probes.csv's column order after "step".
using ProbeValues = std::vector<std::pair<std::string, double>>;

// The probes.csv columns of `model` after "step": for each block i attn_score_max.block<i>,
// residual_rms.block<i>, act_max.block<i>, act_kurtosis.block<i>, attn_entropy.block<i> and
// attn_sink.block<i>; logsumexp_mean, logsumexp_max; grad_rms.<param> and update_ratio.<param> for
// each parameter in named_parameters order; dyt_alpha.<norm> for each DyT norm; norm_input_rms.<norm>
// for every norm (QK-norms included; a norm made of norms counts once), in named_modules order.
std::vector<std::string> probe_columns(Transformer& model);

// One probed step, on the activations of the step's first gradient shard (the whole batch with
// train.grad_shards 1 on one process), every position. Call begin() before the step's forward (it
// turns the model's probing on), then
// after the forward end_forward() (probing off again: one forward's activations are probed), after
// the backward (and the gradient's sum over ranks) gradients(), before the optimizer step
// before_update() (it copies the weights), and after it values().
class StepProbe {
public:
    explicit StepProbe(Transformer& model);
    void begin();
    void end_forward();
    void gradients();      // reads each parameter's .grad
    void before_update();  // copies each parameter
    ProbeValues values();  // the row, in probe_columns' order

private:
    Transformer* model_;
    Transformer::Probes activations_;
    std::vector<double> norm_input_rms_;  // (norms,) in probe_columns' order
    std::vector<double> grad_rms_;    // (parameters,)
    std::vector<Tensor> before_;      // (parameters,) copies of the weights before the update
};

// The RMS of a tensor's elements, sqrt(mean(x^2)), in f64; 0 for an undefined tensor.
double tensor_rms(const Tensor& x);

}  // namespace nl
