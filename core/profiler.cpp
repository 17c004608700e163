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

    void copy(const Shape& shape, const StridedArg& dst, const StridedArg& src) override {
        const int64_t n = shape_numel(shape);
        timed("copy", 0, bytes_of(dst.dtype, n) + bytes_of(src.dtype, n), [&] { inner_.copy(shape, dst, src); });
    }
    void fill(const Shape& shape, const StridedArg& dst, double value) override {
        timed("fill", 0, bytes_of(dst.dtype, shape_numel(shape)), [&] { inner_.fill(shape, dst, value); });
    }
    void binary(BinaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& a,
                const StridedArg& b) override {
        timed(binary_name(op), 0, 3 * bytes_of(out.dtype, shape_numel(shape)),
              [&] { inner_.binary(op, shape, out, a, b); });
    }
    void unary(UnaryOp op, const Shape& shape, const StridedArg& out, const StridedArg& in) override {
        timed(unary_name(op), 0, 2 * bytes_of(out.dtype, shape_numel(shape)), [&] { inner_.unary(op, shape, out, in); });
    }
    void where(const Shape& shape, const StridedArg& out, const StridedArg& cond, const StridedArg& a,
               const StridedArg& b) override {
        const int64_t n = shape_numel(shape);
        timed("where", 0, 3 * bytes_of(out.dtype, n) + bytes_of(cond.dtype, n),
              [&] { inner_.where(shape, out, cond, a, b); });
    }
    void reduce(ReduceOp op, DType dtype, const void* in, void* out, int64_t outer, int64_t len, int64_t inner,
                int64_t correction) override {
        timed(reduce_name(op), 0, bytes_of(dtype, outer * len * inner + outer * inner),
              [&] { inner_.reduce(op, dtype, in, out, outer, len, inner, correction); });
    }
    void softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t cols, bool log) override {
        timed(log ? "log_softmax" : "softmax", 0, 2 * bytes_of(dtype, rows * cols),
              [&] { inner_.softmax_forward(dtype, x, y, rows, cols, log); });
    }
    void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols,
                          bool log) override {
        timed(log ? "log_softmax_backward" : "softmax_backward", 0, 3 * bytes_of(dtype, rows * cols),
              [&] { inner_.softmax_backward(dtype, y, dy, dx, rows, cols, log); });
    }
    void gemm(DType dtype, DType c_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const void* a,
              int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, double beta, void* c,
              int64_t ldc, int64_t stride_c, int64_t batch) override {
        const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
                             static_cast<double>(batch);
        timed("matmul", flops, 0, [&] {
            inner_.gemm(dtype, c_dtype, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                        stride_c, batch);
        });
    }
    void index_select(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer,
                      int64_t src_size, int64_t inner, int64_t n) override {
        timed("index_select", 0, 2 * bytes_of(dtype, outer * n * inner),
              [&] { inner_.index_select(dtype, src, index, out, outer, src_size, inner, n); });
    }
    void index_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer, int64_t dst_size,
                   int64_t inner, int64_t n) override {
        timed("index_add", 0, 3 * bytes_of(dtype, outer * n * inner),
              [&] { inner_.index_add(dtype, dst, index, src, outer, dst_size, inner, n); });
    }
    void gather(DType dtype, const void* src, const int64_t* index, void* out, int64_t outer, int64_t src_size,
                int64_t inner, int64_t n) override {
        timed("gather", 0, 2 * bytes_of(dtype, outer * n * inner),
              [&] { inner_.gather(dtype, src, index, out, outer, src_size, inner, n); });
    }
    void scatter_add(DType dtype, void* dst, const int64_t* index, const void* src, int64_t outer, int64_t dst_size,
                     int64_t inner, int64_t n) override {
        timed("scatter_add", 0, 3 * bytes_of(dtype, outer * n * inner),
              [&] { inner_.scatter_add(dtype, dst, index, src, outer, dst_size, inner, n); });
    }
    void norm_forward(const NormForwardArgs& a) override {
        timed(a.subtract_mean ? "layer_norm" : "rms_norm", 0, 2 * bytes_of(a.dtype, a.rows * a.d),
              [&] { inner_.norm_forward(a); });
    }
    void norm_backward(const NormBackwardArgs& a) override {
        timed(a.subtract_mean ? "layer_norm_backward" : "rms_norm_backward", 0, 3 * bytes_of(a.dtype, a.rows * a.d),
              [&] { inner_.norm_backward(a); });
    }
    void dyt_forward(const DytForwardArgs& a) override {
        timed("dyt", 0, 2 * bytes_of(a.dtype, a.rows * a.d), [&] { inner_.dyt_forward(a); });
    }
    void dyt_backward(const DytBackwardArgs& a) override {
        timed("dyt_backward", 0, 3 * bytes_of(a.dtype, a.rows * a.d), [&] { inner_.dyt_backward(a); });
    }
    void cross_entropy_forward(const CrossEntropyForwardArgs& a) override {
        timed("cross_entropy", 0, bytes_of(a.dtype, a.rows * a.classes), [&] { inner_.cross_entropy_forward(a); });
    }
    void cross_entropy_backward(const CrossEntropyBackwardArgs& a) override {
        timed("cross_entropy_backward", 0, 2 * bytes_of(a.dtype, a.rows * a.classes),
              [&] { inner_.cross_entropy_backward(a); });
    }
    void adam_step(const AdamStepArgs& a) override {
        // param, exp_avg, exp_avg_sq read and written, grad read (AMSGrad's max too).
        const int64_t accesses = a.max_exp_avg_sq ? 9 : 7;
        timed(a.decoupled ? "adamw" : "adam", 0, accesses * bytes_of(a.dtype, a.n), [&] { inner_.adam_step(a); });
    }
    void sgd_step(const SgdStepArgs& a) override {
        const int64_t accesses = a.momentum_buffer ? 5 : 3;
        timed("sgd", 0, accesses * bytes_of(a.dtype, a.n), [&] { inner_.sgd_step(a); });
    }
    void rope(DType dtype, const void* x, const void* cos, const void* sin, void* out, int64_t batch, int64_t seq,
              int64_t heads, int64_t head_dim, bool inverse) override {
        timed(inverse ? "rope_backward" : "rope", 0, 2 * bytes_of(dtype, batch * seq * heads * head_dim),
              [&] { inner_.rope(dtype, x, cos, sin, out, batch, seq, heads, head_dim, inverse); });
    }
    void swiglu_forward(DType dtype, const void* a, const void* b, void* out, int64_t n) override {
        timed("swiglu", 0, 3 * bytes_of(dtype, n), [&] { inner_.swiglu_forward(dtype, a, b, out, n); });
    }
    void swiglu_backward(DType dtype, const void* a, const void* b, const void* dout, void* da, void* db,
                         int64_t n) override {
        timed("swiglu_backward", 0, 5 * bytes_of(dtype, n), [&] { inner_.swiglu_backward(dtype, a, b, dout, da, db, n); });
    }
    void softcap_forward(DType dtype, const void* x, void* y, int64_t n, double cap) override {
        timed("softcap", 0, 2 * bytes_of(dtype, n), [&] { inner_.softcap_forward(dtype, x, y, n, cap); });
    }
    void softcap_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t n, double cap) override {
        timed("softcap_backward", 0, 3 * bytes_of(dtype, n),
              [&] { inner_.softcap_backward(dtype, y, dy, dx, n, cap); });
    }
    // FLOPs: each (query, visible key) pair costs 2 * head_dim per product; the forward does two
    // products (q k, p v), the backward five (s, dp, dv, dk, dq).
    void attention_forward(const AttentionForwardArgs& a) override {
        timed("attention", 2 * attention_pair_flops(a.dims), 0, [&] { inner_.attention_forward(a); });
    }
    void attention_backward(const AttentionBackwardArgs& a) override {
        timed("attention_backward", 5 * attention_pair_flops(a.dims), 0, [&] { inner_.attention_backward(a); });
    }

private:
    template <typename Call>
    void timed(const char* kind, double flops, double bytes, const Call& call) {
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
void reset() { g_stats.clear(); }
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
