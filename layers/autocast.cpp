// Autocast state: one thread-local flag and dtype, so a guard on one thread leaves others alone.
#include "layers/autocast.h"

namespace nl {

namespace {
thread_local bool autocast_enabled = false;
thread_local DType autocast_type = DType::BF16;
}  // namespace

bool is_autocast_enabled() { return autocast_enabled; }
DType autocast_dtype() { return autocast_type; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled)
    : previous_enabled_(autocast_enabled), previous_dtype_(autocast_type) {
    NL_REQUIRE(!enabled || is_half(dtype), "AutocastGuard: expected bf16 or f16, found ", dtype_name(dtype));
    autocast_enabled = enabled;
    if (enabled) autocast_type = dtype;
}

AutocastGuard::~AutocastGuard() {
    autocast_enabled = previous_enabled_;
    autocast_type = previous_dtype_;
}

Var autocast_lower(const Var& x) {
    if (!autocast_enabled || !x.defined()) return x;
    const DType dtype = x.dtype();
    if (!is_floating(dtype) || dtype == DType::F64 || dtype == autocast_type) return x;
    return to(x, autocast_type);
}

Var autocast_f32(const Var& x) {
    if (!autocast_enabled || !x.defined() || !is_half(x.dtype())) return x;
    return to(x, DType::F32);
}

Var autocast_matmul(const Var& a, const Var& b) { return matmul(autocast_lower(a), autocast_lower(b)); }

}  // namespace nl
