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

Var autocast_lower(const Var& x) {
    if (!autocast_enabled || !x.defined()) return x;
    const DType dtype = x.dtype();
    if (!is_floating(dtype) || dtype == DType::F64 || dtype == autocast_type) return x;
    AutocastCache* cache = autocast_cache;
    if (cache == nullptr || !x.is_leaf() || !x.requires_grad()) return to(x, autocast_type);
    for (const AutocastCache::Entry& e : cache->entries_) {
        if (e.param == x.impl() && e.source == x.data().data_ptr() && e.cast.dtype() == autocast_type &&
            e.cast.shape() == x.shape()) {
            ++cache->reuses_;
            return cast_node(x, e.cast);
        }
    }
    Var y = to(x, autocast_type);
    cache->entries_.push_back({x.impl(), x.data().data_ptr(), y.data()});
    ++cache->casts_;
    return y;
}

std::vector<Var> autocast_lower_uses(const Var& x, int uses) {
    NL_REQUIRE(uses >= 1, "autocast_lower_uses: expected at least 1 use, found ", uses);
    std::vector<Var> inputs{autocast_lower(x)};
    const bool cast = x.defined() && inputs[0].dtype() != x.dtype();
    for (int i = 1; i < uses; ++i) inputs.push_back(cast ? cast_node(x, inputs[0].data()) : x);
    return inputs;
}

Var autocast_f32(const Var& x) {
    if (!autocast_enabled || !x.defined() || !is_half(x.dtype())) return x;
    return to(x, DType::F32);
}

Var autocast_matmul(const Var& a, const Var& b) { return matmul(autocast_lower(a), autocast_lower(b)); }

}  // namespace nl
