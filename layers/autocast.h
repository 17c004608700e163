// Autocast, as torch.autocast(dtype=torch.bfloat16): a thread-local switch under which matmuls
// (Linear, attention's scores and values) run on bf16 copies of their inputs while parameters stay
// f32 (the autograd cast node carries each gradient back to f32), and precision-sensitive ops
// (softmax, losses, norm statistics) run in f32. Like NoGradGuard (autograd/grad_mode.h), it only
// changes how the forward is recorded: the backward replays the recorded ops in their dtypes.
#pragma once

#include <memory>
#include <vector>

#include "autograd/autograd.h"

namespace nl {

// Whether autocast is on for this thread, and its lower-precision dtype (bf16 or f16).
bool is_autocast_enabled();
DType autocast_dtype();

// The casts of the parameters for one optimizer step (torch.autocast's weight cast cache). Under a
// guard that holds one, autocast_lower casts a parameter (a leaf that requires grad) once and reuses
// the copy in every later forward of the step, such as the trainer's gradient shards; each use still
// records its own cast node, which carries the gradient back to the parameter's dtype. One cache
// serves one step: the optimizer changes the weights, so make a new one (or clear()) after it.
class AutocastCache {
public:
    void clear();
    int64_t casts() const { return casts_; }    // parameters cast since made or cleared
    int64_t reuses() const { return reuses_; }  // uses served from the cache

private:
    friend Tensor autocast_lower_data(const Var& x);
    struct Entry {
        std::shared_ptr<VarImpl> param;  // kept, so its address is not reused while cached
        const void* source;              // the parameter's data when cast: a replaced tensor misses
        Tensor cast;                     // (param's shape) in the autocast dtype
    };
    std::vector<Entry> entries_;  // a model's parameters: a few hundred at most, searched in order
    int64_t casts_ = 0, reuses_ = 0;
};

// Turns autocast on with `dtype` (bf16 or f16; nl::Error otherwise) for its lifetime, or off when
// enabled is false, then restores the previous state (guards nest). With a `cache`, parameters are
// cast once per cache (above).
class AutocastGuard {
public:
    explicit AutocastGuard(DType dtype = DType::BF16, bool enabled = true, AutocastCache* cache = nullptr);
    ~AutocastGuard();
    AutocastGuard(const AutocastGuard&) = delete;
    AutocastGuard& operator=(const AutocastGuard&) = delete;

private:
    bool previous_enabled_;
    DType previous_dtype_;
    AutocastCache* previous_cache_;
};

// The input of a lower-precision op (matmul, Linear): cast to the autocast dtype when autocast is
// on and x is a floating dtype other than f64 (torch.autocast leaves f64 alone); otherwise x itself.
// A parameter's cast comes from the guard's cache where it has one.
Var autocast_lower(const Var& x);
// The dtype autocast_lower gives a tensor of dtype d: the autocast dtype when autocast is on and d is
// a floating dtype other than f64; otherwise d.
DType autocast_compute_dtype(DType d);
// autocast_lower's copy of x as data, with no node recorded: x's data cast to the autocast dtype (a
// parameter's from the guard's cache), or an undefined Tensor where autocast_lower returns x itself
// (autocast off; x not floating, f64, or already in the autocast dtype).
Tensor autocast_lower_data(const Var& x);
// A Linear's product x @ weight^T, (..., in) @ (out, in)^T. Where autocast casts x (x_low, from
// autocast_lower_data(x), defined) it runs on x_low and the weight's autocast copy and returns the
// autocast dtype, as linear(autocast_lower(x), autocast_lower(weight)) does, as one node whose inputs
// are x and weight themselves: its backward writes dX and dW in their own dtype straight from the
// gemms' f32 sums (matmul's out_dtype), where a cast node per input would round each to bf16 and widen
// it back (torch.autocast's way: the same products with one rounding less per gradient, and no
// widening pass). One x_low serves every Linear that reads x (attention's wq, wk, wv; SwiGLU's w1, w3),
// so x is cast once. Otherwise linear(autocast_lower(x), autocast_lower(weight)).
Var autocast_linear(const Var& x, const Tensor& x_low, const Var& weight);
// True when autocast is on and `dtype` is bf16 or f16: an f32 op (softmax, loss, norm statistics)
// then computes such an input in f32, as torch.autocast's fp32 list does.
bool autocast_widens(DType dtype);
// The input of an f32 op: bf16/f16 x cast to f32 when autocast_widens its dtype; otherwise x itself.
// (The fused cross-entropy reads half logits as they are instead: cross_entropy_loss, layers/loss.h.)
Var autocast_f32(const Var& x);
// matmul(a, b) with both inputs through autocast_lower: plain matmul when autocast is off.
Var autocast_matmul(const Var& a, const Var& b);

}  // namespace nl
