// Learning-rate schedules: the formulas are in schedule.h.
#include "optim/schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace nl {

LrSchedule LrSchedule::constant(double lr, int64_t warmup_steps) {
    LrSchedule s;
    s.kind = Kind::Constant;
    s.base_lr = lr;
    s.warmup_steps = warmup_steps;
    s.validate();
    return s;
}

LrSchedule LrSchedule::warmup_cosine(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr) {
    LrSchedule s;
    s.kind = Kind::Cosine;
    s.base_lr = base_lr;
    s.warmup_steps = warmup_steps;
    s.total_steps = total_steps;
    s.min_lr = min_lr;
    s.validate();
    return s;
}

void LrSchedule::validate() const {
    NL_REQUIRE(base_lr >= 0.0, "LrSchedule: base_lr must be >= 0, found ", base_lr);
    NL_REQUIRE(warmup_steps >= 0, "LrSchedule: warmup_steps must be >= 0, found ", warmup_steps);
    if (kind == Kind::Cosine) {
        NL_REQUIRE(total_steps > warmup_steps, "LrSchedule: cosine total_steps must be > warmup_steps, found total ",
                   total_steps, " and warmup ", warmup_steps);
        NL_REQUIRE(min_lr >= 0.0 && min_lr <= base_lr, "LrSchedule: min_lr must be in [0, base_lr = ", base_lr,
                   "], found ", min_lr);
    }
}

double LrSchedule::lr_at(int64_t step) const {
    NL_REQUIRE(step >= 0, "LrSchedule::lr_at: step must be >= 0, found ", step);
    if (step < warmup_steps) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (kind == Kind::Constant) return base_lr;
    if (step >= total_steps) return min_lr;
    const double ratio = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));  // 1 -> 0
    return min_lr + coeff * (base_lr - min_lr);
}

std::string LrSchedule::str() const {
    if (kind == Kind::Constant)
        return detail::concat("constant(lr=", base_lr, ", warmup=", warmup_steps, ")");
    return detail::concat("cosine(base_lr=", base_lr, ", warmup=", warmup_steps, ", total=", total_steps,
                          ", min_lr=", min_lr, ")");
}

}  // namespace nl
