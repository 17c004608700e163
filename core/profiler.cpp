// The profiler (core/profiler.h): a Backend that times each call of the backend it wraps, and the
// table of what it collected.
#include "core/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <utility>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/shape.h"
#ifdef NORMLAB_HAVE_CUDA
#include "core/cuda/nl_cuda_api.h"
#endif

namespace nl::profiler {

bool g_enabled = false;

namespace {

thread_local Phase g_phase = Phase::Other;  // per thread: a sweep's threads each run their own steps
// Keyed by the kind's address: every kind is a string literal of this file, so no string is built
// per kernel call.
std::map<std::pair<const char*, Phase>, OpStats> g_stats;
std::map<std::string, int64_t> g_kernel_calls;  // kernel table row -> calls

const char* binary_name(BinaryOp op) {
    switch (op) {
        case BinaryOp::Add: return "add";
        case BinaryOp::Sub: return "sub";
        case BinaryOp::Mul: return "mul";
        case BinaryOp::Div: return "div";
        case BinaryOp::Pow: return "pow";
        case BinaryOp::Maximum: return "maximum";
        case BinaryOp::Minimum: return "minimum";
        case BinaryOp::Eq: return "eq";
        case BinaryOp::Ne: return "ne";
        case BinaryOp::Lt: return "lt";
        case BinaryOp::Le: return "le";
        case BinaryOp::Gt: return "gt";
        case BinaryOp::Ge: return "ge";
        case BinaryOp::SiluBackward: return "silu_backward";
    }
    return "binary";
}

const char* unary_name(UnaryOp op) {
    switch (op) {
        case UnaryOp::Neg: return "neg";
        case UnaryOp::Exp: return "exp";
        case UnaryOp::Log: return "log";
        case UnaryOp::Sqrt: return "sqrt";
        case UnaryOp::Rsqrt: return "rsqrt";
        case UnaryOp::Abs: return "abs";
        case UnaryOp::Relu: return "relu";
        case UnaryOp::Silu: return "silu";
        case UnaryOp::Sigmoid: return "sigmoid";
        case UnaryOp::Tanh: return "tanh";
        case UnaryOp::Gelu: return "gelu";
        case UnaryOp::Sign: return "sign";
        case UnaryOp::Square: return "square";
    }
    return "unary";
}

const char* reduce_name(ReduceOp op) {
    switch (op) {
        case ReduceOp::Sum: return "sum";
        case ReduceOp::Mean: return "mean";
        case ReduceOp::Max: return "max";
        case ReduceOp::Min: return "min";
        case ReduceOp::Var: return "var";
        case ReduceOp::ArgMax: return "argmax";
        case ReduceOp::SumSquares: return "sum_of_squares";
    }
    return "reduce";
}

// One product over the (query, visible key) pairs of causal attention, 2 * head_dim FLOPs a pair:
// query i (of q_len) sees kv_len - q_len + i + 1 keys.
double attention_pair_flops(const AttentionDims& s) {
    const double t = static_cast<double>(s.q_len), offset = static_cast<double>(s.kv_len - s.q_len);
    const double pairs = static_cast<double>(s.batch * s.heads) * (t * offset + t * (t + 1) / 2);
    return pairs * 2.0 * static_cast<double>(s.head_dim);
}

double bytes_of(DType dtype, int64_t elements) {
    return static_cast<double>(dtype_size(dtype)) * static_cast<double>(elements);
}

// Every method: time the inner call, then add it to its row.
class ProfilingBackend final : public Backend {
public:
    explicit ProfilingBackend(Backend& inner) : inner_(inner) {}
    Device device() const override { return inner_.device(); }

    // Each row of the kernel table: its label, FLOPs and bytes (core/kernels.def), the call timed.
#define NL_KERNEL(name, params, args, profile_label, flops, bytes) \
    void name params override { timed(#name, profile_label, flops, bytes, [&] { inner_.name args; }); }
#include "core/kernels.def"
#undef NL_KERNEL

private:
    template <typename Call>
    void timed(const char* kernel, const char* kind, double flops, double bytes, const Call& call) {
        const auto t0 = std::chrono::steady_clock::now();
        call();
#ifdef NORMLAB_HAVE_CUDA
        if (!device().is_cpu()) cuda_synchronize(device().index);  // the kernel's time, not its launch's
#endif
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        OpStats& row = g_stats[{kind, g_phase}];
        if (row.calls == 0) {
            row.kind = kind;
            row.phase = g_phase;
        }
        ++row.calls;
        ++g_kernel_calls[kernel];
        row.seconds += seconds;
        row.flops += flops;
        row.bytes += bytes;
    }

    Backend& inner_;
};

std::string fixed(double value, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
    return buf;
}

// A rate in G per second, or "-" when the kernel has no such figure.
std::string rate(double amount, double seconds) {
    return amount > 0 && seconds > 0 ? fixed(amount / seconds / 1e9, 1) : "-";
}

std::string pad(const std::string& s, size_t width, bool left) {
    if (s.size() >= width) return s;
    return left ? s + std::string(width - s.size(), ' ') : std::string(width - s.size(), ' ') + s;
}

}  // namespace

const char* phase_name(Phase phase) {
    switch (phase) {
        case Phase::Forward: return "forward";
        case Phase::Backward: return "backward";
        case Phase::Optimizer: return "optimizer";
        case Phase::Other: return "other";
    }
    return "other";
}

void set_enabled(bool on) { g_enabled = on; }
void reset() {
    g_stats.clear();
    g_kernel_calls.clear();
}

std::vector<std::pair<std::string, int64_t>> kernel_calls() {
    std::vector<std::pair<std::string, int64_t>> out;
    for (const char* name : kernel_names()) {
        auto it = g_kernel_calls.find(name);
        out.emplace_back(name, it == g_kernel_calls.end() ? 0 : it->second);
    }
    return out;
}
Phase current_phase() { return g_phase; }

PhaseGuard::PhaseGuard(Phase phase) : previous_(g_phase) { g_phase = phase; }
PhaseGuard::~PhaseGuard() { g_phase = previous_; }

std::vector<OpStats> collected() {
    std::vector<OpStats> rows;
    for (const auto& [key, row] : g_stats) rows.push_back(row);
    std::stable_sort(rows.begin(), rows.end(), [](const OpStats& a, const OpStats& b) { return a.seconds > b.seconds; });
    return rows;
}

std::string format_table(const std::vector<OpStats>& rows, double measured_seconds, int64_t steps) {
    const double per_step = steps > 0 ? measured_seconds / static_cast<double>(steps) : 0.0;
    auto share = [&](double seconds) { return measured_seconds > 0 ? fixed(100.0 * seconds / measured_seconds, 1) : "-"; };
    const std::vector<std::pair<std::string, size_t>> columns = {
        {"phase", 10}, {"op", 24}, {"calls", 8}, {"total ms", 11}, {"ms/step", 9},
        {"% step", 7}, {"avg us", 9}, {"GFLOP/s", 9}, {"GB/s", 8}};
    auto line = [&](const std::vector<std::string>& cells) {
        std::string out;
        for (size_t i = 0; i < cells.size(); ++i) out += pad(cells[i], columns[i].second, i < 2) + (i + 1 < cells.size() ? " " : "");
        return out + "\n";
    };
    auto cells = [&](const std::string& phase, const std::string& op, int64_t calls, double seconds, double flops,
                     double bytes) -> std::vector<std::string> {
        return {phase,
                op,
                std::to_string(calls),
                fixed(1e3 * seconds, 2),
                steps > 0 ? fixed(1e3 * seconds / static_cast<double>(steps), 3) : "-",
                share(seconds),
                calls > 0 ? fixed(1e6 * seconds / static_cast<double>(calls), 1) : "-",
                rate(flops, seconds),
                rate(bytes, seconds)};
    };
    std::string out;
    out += "profile: " + std::to_string(steps) + " steps, " + fixed(measured_seconds, 3) + " s measured (" +
           fixed(1e3 * per_step, 2) + " ms/step); time per backend kernel, by phase and op\n";
    std::vector<std::string> header;
    for (const auto& [name, width] : columns) header.push_back(name);
    const std::string head = line(header);
    out += head + std::string(head.size() - 1, '-') + "\n";
    double kernels = 0;
    std::map<Phase, OpStats> by_phase;
    for (const OpStats& row : rows) {
        out += line(cells(phase_name(row.phase), row.kind, row.calls, row.seconds, row.flops, row.bytes));
        OpStats& total = by_phase[row.phase];
        total.calls += row.calls;
        total.seconds += row.seconds;
        total.flops += row.flops;
        total.bytes += row.bytes;
        kernels += row.seconds;
    }
    out += std::string(head.size() - 1, '-') + "\n";
    int64_t all_calls = 0;
    for (const auto& [phase, total] : by_phase) {
        out += line(cells(phase_name(phase), "(all kernels)", total.calls, total.seconds, 0, 0));
        all_calls += total.calls;
    }
    out += line(cells("all", "(all kernels)", all_calls, kernels, 0, 0));
    out += line({"all", "(outside kernels)", "-", fixed(1e3 * (measured_seconds - kernels), 2),
                 steps > 0 ? fixed(1e3 * (measured_seconds - kernels) / static_cast<double>(steps), 3) : "-",
                 share(measured_seconds - kernels), "-", "-", "-"});
    out += "(outside kernels: graph building, allocation, shape checks and the clock reads of the profiler itself)\n";
    return out;
}

std::string format_csv(const std::vector<OpStats>& rows, double measured_seconds, int64_t steps) {
    std::string out = "phase,op,calls,total_s,share_of_step,gflop_per_s,gb_per_s,steps,measured_s\n";
    for (const OpStats& row : rows) {
        char buf[512];
        std::snprintf(buf, sizeof buf, "%s,%s,%lld,%.9g,%.6g,%.6g,%.6g,%lld,%.9g\n", phase_name(row.phase),
                      row.kind.c_str(), static_cast<long long>(row.calls), row.seconds,
                      measured_seconds > 0 ? row.seconds / measured_seconds : 0.0,
                      row.flops > 0 && row.seconds > 0 ? row.flops / row.seconds / 1e9 : 0.0,
                      row.bytes > 0 && row.seconds > 0 ? row.bytes / row.seconds / 1e9 : 0.0,
                      static_cast<long long>(steps), measured_seconds);
        out += buf;
    }
    return out;
}

Backend& profiled(Backend& inner) {
    static std::map<Backend*, std::unique_ptr<ProfilingBackend>> wrappers;
    std::unique_ptr<ProfilingBackend>& wrapper = wrappers[&inner];
    if (!wrapper) wrapper = std::make_unique<ProfilingBackend>(inner);
    return *wrapper;
}

}  // namespace nl::profiler
