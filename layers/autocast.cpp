// Autocast state: one thread-local flag and dtype, so a guard on one thread leaves others alone.
#include "layers/autocast.h"

namespace nl {

namespace {
thread_local bool autocast_enabled = false;
thread_local DType autocast_type = DType::BF16;
thread_local AutocastCache* autocast_cache = nullptr;

// A cast node over an existing copy `cast` of x: the node `to` records, without computing the copy.
Var cast_node(const Var& x, const Tensor& cast) {
    return make_result(cast, "to", {x}, {},
                       [in = x.dtype()](const Var& g, const std::vector<Var>&) -> std::vector<Var> { return {to(g, in)}; });
}
}  // namespace

void AutocastCache::clear() {
    entries_.clear();
    casts_ = 0;
    reuses_ = 0;
}

bool is_autocast_enabled() { return autocast_enabled; }
DType autocast_dtype() { return autocast_type; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled, AutocastCache* cache)
    : previous_enabled_(autocast_enabled), previous_dtype_(autocast_type), previous_cache_(autocast_cache) {
    NL_REQUIRE(!enabled || is_half(dtype), "AutocastGuard: expected bf16 or f16, found ", dtype_name(dtype));
    autocast_enabled = enabled;
    if (enabled) autocast_type = dtype;
    autocast_cache = enabled ? cache : nullptr;
}

AutocastGuard::~AutocastGuard() {
    autocast_enabled = previous_enabled_;
    autocast_type = previous_dtype_;
    autocast_cache = previous_cache_;
}

DType autocast_compute_dtype(DType d) {
    return autocast_enabled && is_floating(d) && d != DType::F64 ? autocast_type : d;
}

Tensor autocast_lower_data(const Var& x) {
    if (!x.defined() || autocast_compute_dtype(x.dtype()) == x.dtype()) return Tensor();
    AutocastCache* cache = autocast_cache;
    if (cache == nullptr || !x.is_leaf() || !x.requires_grad()) return x.data().to(autocast_type);
    for (const AutocastCache::Entry& e : cache->entries_) {
        if (e.param == x.impl() && e.source == x.data().data_ptr() && e.cast.dtype() == autocast_type &&
            e.cast.shape() == x.shape()) {
            ++cache->reuses_;
            return e.cast;
        }
    }
    Tensor cast = x.data().to(autocast_type);
    cache->entries_.push_back({x.impl(), x.data().data_ptr(), cast});
    ++cache->casts_;
    return cast;
}

Var autocast_lower(const Var& x) {
    const Tensor cast = autocast_lower_data(x);
    return cast.defined() ? cast_node(x, cast) : x;
}

Var autocast_linear(const Var& x, const Tensor& x_low, const Var& weight) {
    if (!x_low.defined()) return linear(autocast_lower(x), autocast_lower(weight));
    NL_REQUIRE(x_low.shape() == x.shape() && x_low.dtype() == autocast_type,
               "autocast_linear: expected x's autocast copy (", shape_str(x.shape()), ", ", dtype_name(autocast_type),
               "), found (", shape_str(x_low.shape()), ", ", dtype_name(x_low.dtype()), ")");
    const Tensor w_low = autocast_lower_data(weight);
    NL_REQUIRE(w_low.defined() && weight.dim() == 2 && x.size(-1) == weight.size(1),
               "autocast_linear: expected a ", dtype_name(x.dtype()), " weight (out, ", x.size(-1), "), found ",
               dtype_name(weight.dtype()), " ", shape_str(weight.shape()));
    const bool gx = x.requires_grad(), gw = weight.requires_grad();
    std::vector<SavedTensor> saved;  // dX = dY W needs W's copy; dW = dY^T X needs x's
    saved.emplace_back("weight_low", w_low);
    saved.emplace_back("x_low", x_low);
    return make_result(
        matmul(x_low, w_low.t()), "autocast_linear", {x, weight}, std::move(saved),
        [gx, gw, x_dtype = x.dtype(), w_dtype = weight.dtype()](const Var& g, const std::vector<Var>& s) -> std::vector<Var> {
            const Tensor& w_low = s[0].data();  // (out, in)
            const Tensor& x_low = s[1].data();  // (..., in)
            const int64_t in = x_low.size(-1), out = g.size(-1), rows = x_low.numel() / std::max<int64_t>(in, 1);
            if (is_grad_enabled()) {  // a second-order backward: the composed ops, differentiable
                const Var dx = gx ? to(matmul(g, Var(w_low)), x_dtype) : Var();
                const Var dw = gw ? to(matmul(transpose(reshape(g, {rows, out}), 0, 1), Var(x_low.reshape({rows, in}))),
                                       w_dtype)
                                  : Var();
                return {dx, dw};
            }
            // The f32 sums as they are, in the inputs' own dtypes (f32 under autocast).
            auto in_dtype = [](Tensor sums, DType d) { return Var(d == DType::F32 ? sums : sums.to(d)); };
            Var dx, dw;
            if (gx) dx = in_dtype(matmul(g.data(), w_low, DType::F32), x_dtype);  // (..., out) @ (out, in)
            if (gw)  // (out, rows) @ (rows, in), contiguous (out, in) as the weight is
                dw = in_dtype(matmul(g.data().reshape({rows, out}).t(), x_low.reshape({rows, in}), DType::F32), w_dtype);
            return {dx, dw};
        });
}

bool autocast_widens(DType dtype) { return autocast_enabled && is_half(dtype); }

Var autocast_f32(const Var& x) {
    if (!x.defined() || !autocast_widens(x.dtype())) return x;
    return to(x, DType::F32);
}

Var autocast_matmul(const Var& a, const Var& b) { return matmul(autocast_lower(a), autocast_lower(b)); }

}  // namespace nl
