// Autocast, as torch.autocast(dtype=torch.bfloat16): a thread-local switch under which matmuls
// (Linear, attention's scores and values) run on bf16 copies of their inputs while parameters stay
// f32 (the autograd cast node carries each gradient back to f32), and precision-sensitive ops
// (softmax, losses, norm statistics) run in f32. Like NoGradGuard (autograd/grad_mode.h), it only
// changes how the forward is recorded: the backward replays the recorded ops in their dtypes.
#pragma once

#include "autograd/autograd.h"

namespace nl {

// Whether autocast is on for this thread, and its lower-precision dtype (bf16 or f16).
bool is_autocast_enabled();
DType autocast_dtype();

// Turns autocast on with `dtype` (bf16 or f16; nl::Error otherwise) for its lifetime, or off when
// enabled is false, then restores the previous state (guards nest).
class AutocastGuard {
public:
    explicit AutocastGuard(DType dtype = DType::BF16, bool enabled = true);
    ~AutocastGuard();
    AutocastGuard(const AutocastGuard&) = delete;
    AutocastGuard& operator=(const AutocastGuard&) = delete;

private:
    bool previous_enabled_;
    DType previous_dtype_;
};

// The input of a lower-precision op (matmul, Linear): cast to the autocast dtype when autocast is
// on and x is a floating dtype other than f64 (torch.autocast leaves f64 alone); otherwise x itself.
Var autocast_lower(const Var& x);
// The input of an f32 op (softmax, loss, norm statistics): bf16/f16 x cast to f32 when autocast is
// on; otherwise x itself.
Var autocast_f32(const Var& x);
// matmul(a, b) with both inputs through autocast_lower: plain matmul when autocast is off.
Var autocast_matmul(const Var& a, const Var& b);

}  // namespace nl
