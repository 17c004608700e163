// The train job's stability probes (jobs/probes.h).
#include "jobs/probes.h"

#include <cmath>

#include "core/ops.h"
#include "layers/norms.h"

namespace nl {

namespace {

// Each DyT norm's alpha parameter, with the norm's dotted name.
std::vector<std::pair<std::string, Var>> dyt_alphas(Transformer& model) {
    std::vector<std::pair<std::string, Var>> out;
    for (const auto& [name, module] : model.named_modules()) {
        const auto* norm = dynamic_cast<const Norm*>(module);
        if (norm != nullptr && norm->options().type == "dyt" && norm->has_parameter("alpha"))
            out.emplace_back(name, norm->parameter("alpha"));
    }
    return out;
}

// Every norm the probes read, with its dotted name: the outermost ones (a HybridNorm's or a monitor's
// own forward reads the input, not its parts'), in named_modules order (a module before its children).
std::vector<std::pair<std::string, Norm*>> probed_norms(Transformer& model) {
    std::vector<std::pair<std::string, Norm*>> out;
    for (const auto& [name, module] : model.named_modules()) {
        auto* norm = dynamic_cast<Norm*>(module);
        if (norm == nullptr) continue;
        const bool inside_a_norm = !out.empty() && name.rfind(out.back().first + ".", 0) == 0;
        if (!inside_a_norm) out.emplace_back(name, norm);
    }
    return out;
}

double l2_norm(const Tensor& x) { return std::sqrt(sum_of_squares(x.to(DType::F64)).item()); }

}  // namespace

double tensor_rms(const Tensor& x) {
    if (!x.defined() || x.numel() == 0) return 0.0;
    return std::sqrt(sum_of_squares(x.to(DType::F64)).item() / static_cast<double>(x.numel()));
}

std::vector<std::string> probe_columns(Transformer& model) {
    std::vector<std::string> columns;
    for (int64_t i = 0; i < model.n_layers(); ++i) {
        columns.push_back("attn_score_max.block" + std::to_string(i));
        columns.push_back("residual_rms.block" + std::to_string(i));
        columns.push_back("act_max.block" + std::to_string(i));
        columns.push_back("act_kurtosis.block" + std::to_string(i));
        columns.push_back("attn_entropy.block" + std::to_string(i));
        columns.push_back("attn_sink.block" + std::to_string(i));
    }
    columns.push_back("logsumexp_mean");
    columns.push_back("logsumexp_max");
    for (const auto& [name, param] : model.named_parameters()) {
        columns.push_back("grad_rms." + name);
        columns.push_back("update_ratio." + name);
    }
    for (const auto& [name, alpha] : dyt_alphas(model)) columns.push_back("dyt_alpha." + name);
    for (const auto& [name, norm] : probed_norms(model)) columns.push_back("norm_input_rms." + name);
    return columns;
}

StepProbe::StepProbe(Transformer& model) : model_(&model) {}

void StepProbe::begin() {
    model_->set_probing(true);
    for (const auto& [name, norm] : probed_norms(*model_)) norm->set_probing(true);
}

void StepProbe::end_forward() {
    activations_ = model_->last_probes();
    model_->set_probing(false);
    norm_input_rms_.clear();
    for (const auto& [name, norm] : probed_norms(*model_)) {
        norm_input_rms_.push_back(norm->last_input_rms());
        norm->set_probing(false);
    }
}

void StepProbe::gradients() {
    grad_rms_.clear();
    for (const Var& p : model_->parameters()) grad_rms_.push_back(p.grad().defined() ? tensor_rms(p.grad().data()) : 0.0);
}

void StepProbe::before_update() {
    before_.clear();
    // A copy in f64: to() returns the tensor itself when it is f64 already, and the update is in place.
    for (const Var& p : model_->parameters()) before_.push_back(p.data().to(DType::F64).clone());
}

ProbeValues StepProbe::values() {
    ProbeValues row;
    for (int64_t i = 0; i < model_->n_layers(); ++i) {
        const std::string block = ".block" + std::to_string(i);
        const AttentionProbe& attention = activations_.attention[static_cast<size_t>(i)];
        const ResidualProbe& residual = activations_.residual[static_cast<size_t>(i)];
        row.emplace_back("attn_score_max" + block, attention.max_score);
        row.emplace_back("residual_rms" + block, residual.rms);
        row.emplace_back("act_max" + block, residual.max_abs);
        row.emplace_back("act_kurtosis" + block, residual.kurtosis);
        row.emplace_back("attn_entropy" + block, attention.entropy);
        row.emplace_back("attn_sink" + block, attention.sink);
    }
    row.emplace_back("logsumexp_mean", activations_.logsumexp_mean);
    row.emplace_back("logsumexp_max", activations_.logsumexp_max);
    size_t index = 0;
    for (const auto& [name, param] : model_->named_parameters()) {
        const Tensor& old = before_[index];
        const double weight = l2_norm(old);
        const double update = l2_norm(param.data().to(DType::F64) - old);
        row.emplace_back("grad_rms." + name, grad_rms_[index]);
        row.emplace_back("update_ratio." + name, weight > 0.0 ? update / weight : NAN);
        ++index;
    }
    for (const auto& [name, alpha] : dyt_alphas(*model_)) row.emplace_back("dyt_alpha." + name, alpha.data().item());
    index = 0;
    for (const auto& [name, norm] : probed_norms(*model_)) row.emplace_back("norm_input_rms." + name, norm_input_rms_[index++]);
    return row;
}

}  // namespace nl
