// Learning-rate schedules: constant, and linear warmup + cosine decay to a minimum (as nanoGPT's
// get_lr). `step` is the index of the update about to be applied: 0 for the first optimizer step.
//
//   warmup (step < warmup_steps):     lr = base_lr * (step + 1) / warmup_steps
//   constant, after warmup:           lr = base_lr
//   cosine, warmup <= step < total:   r = (step - warmup_steps) / (total_steps - warmup_steps)
//                                     lr = min_lr + 0.5 * (1 + cos(pi * r)) * (base_lr - min_lr)
//   cosine, step >= total_steps:      lr = min_lr
#pragma once

#include <cstdint>
#include <string>

namespace nl {

struct LrSchedule {
    enum class Kind { Constant, Cosine };
    Kind kind = Kind::Constant;
    double base_lr = 1e-3;
    int64_t warmup_steps = 0;  // 0: no warmup
    int64_t total_steps = 0;   // cosine: the step at which lr reaches min_lr (> warmup_steps)
    double min_lr = 0.0;       // cosine only

    static LrSchedule constant(double lr, int64_t warmup_steps = 0);
    static LrSchedule warmup_cosine(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr);

    // nl::Error naming the field when the settings make no sense (negative lr, total <= warmup, ...).
    void validate() const;
    double lr_at(int64_t step) const;
    std::string str() const;  // "cosine(base_lr=..., warmup=..., total=..., min_lr=...)"
};

}  // namespace nl
