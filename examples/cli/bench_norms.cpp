// `normlab bench norms [CONFIG]`: LayerNorm vs RMSNorm (and DyT where `norms` lists it), fused vs composed,
// forward and forward+backward,
// in each dtype asked for (f32 by default; bf16, f16), at the seed article's shapes (hidden 128..2048 x
// batch 32..128, 100 repetitions) and at large shapes. Reports the median time (and its spread), GB/s
// counted as the bytes a fused kernel must move (fwd 2 x element size per element: read x, write y, so
// 8 B in f32 and 4 B in bf16; fwd+bwd 5 x element size: that plus read x and dy, write dx), the ratio
// to a memory copy of the same bytes timed interleaved with each case (A B A B ...), the
// RMSNorm/LayerNorm time ratio per implementation, peak memory per call and the bytes each norm saves
// for backward. Prints tables and writes a CSV.
//
// Four implementations, from the bare kernel up to what a model runs:
//   kernel:   the backend's norm_forward/norm_backward (dyt_forward/dyt_backward) on preallocated buffers
//             (no allocation at all)
//   op:       core/fused.h norm_forward/norm_backward (dyt_forward/dyt_backward; allocates its outputs, as
//             tensor ops do)
//   fused:    make_norm({fused = true}) through autograd (one node, closed-form backward)
//   composed: make_norm({fused = false}) through autograd (primitive ops, derived backward)
// The modules are nn.LayerNorm-like (weight and bias) and LLaMA's RMSNorm (weight only), the pair the
// seed article compares, and DyT (alpha 0.5, weight and bias; Zhu et al. 2025), which moves the same bytes
// with no statistic. "device": "cuda" runs every case on the GPU: the inputs are drawn on the
// host (the same numbers on every device) and moved, the copy is a device-to-device tensor copy,
// each timed call ends with a device synchronize, and peak memory is the GPU allocator's. In bf16/f16 the
// modules are built in that dtype and the kernels read and write it themselves (statistics in f32).
#include "examples/cli/commands.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "autograd/autograd.h"
#include "core/allocator.h"
#include "core/backend.h"
#include "core/fused.h"
#include "core/tensor.h"
#include "examples/cli/bench_util.h"
#include "jobs/config.h"
#include "jobs/run_dir.h"
#include "layers/norms.h"

namespace nl::cli {

namespace {

struct Shape2 {
    int64_t rows = 0;    // batch (seed shapes) or tokens (large shapes)
    int64_t hidden = 0;  // the normalized dim d
    bool large = false;
};

// The benchmark's settings: every field is read from the config, absent keys taking the schema's
// defaults (jobs/config_schema.cpp, docs/configs.md).
struct NormsBenchConfig {
    int64_t reps = 0;                        // samples per case at the seed shapes
    std::vector<int64_t> hidden;             // seed shapes: hidden sizes, each crossed with every batch
    std::vector<int64_t> batch;              // seed shapes: rows
    std::vector<std::string> large_shapes;   // "ROWSxHIDDEN"
    int64_t large_reps = 0;                  // samples per case at the large shapes
    std::vector<std::string> norms;          // "layernorm", "rmsnorm", "dyt"
    std::vector<std::string> impls;          // "kernel", "op", "fused", "composed"
    std::vector<std::string> passes;         // "fwd", "fwd+bwd"
    std::vector<std::string> dtypes;         // every case runs in each
    double min_sample_ms = 0.0;  // a sample averages enough back-to-back calls to last this long
    int64_t threads = 0;         // 0: OpenMP's default
    std::string clock;           // "wall" or "cpu" (process CPU time; see examples/cli/bench_util.h)
    uint64_t seed = 0;
    Device device;               // "cpu" or "cuda[:N]"

    std::vector<Shape2> shapes() const;
};

std::vector<Shape2> NormsBenchConfig::shapes() const {
    std::vector<Shape2> out;
    for (int64_t h : hidden)
        for (int64_t b : batch) out.push_back({b, h, false});
    for (const std::string& s : large_shapes) {
        const size_t x = s.find('x');
        out.push_back({std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1)), true});
    }
    return out;
}

// "32768x512" -> true when both parts are positive integers.
bool valid_shape_text(const std::string& s) {
    const size_t x = s.find('x');
    if (x == std::string::npos || x == 0 || x + 1 == s.size()) return false;
    for (size_t i = 0; i < s.size(); ++i)
        if (i != x && (s[i] < '0' || s[i] > '9')) return false;
    return std::stoll(s.substr(0, x)) > 0 && std::stoll(s.substr(x + 1)) > 0;
}

NormsBenchConfig read_config(const json& root, const std::string& file) {
    ConfigReader r(root, file, config_schema("bench_norms"));
    NormsBenchConfig c;
    c.reps = r.get_int("reps");
    c.hidden = r.get_int_list("hidden");
    c.batch = r.get_int_list("batch");
    c.large_shapes = r.get_string_list("large_shapes");
    for (const std::string& s : c.large_shapes)
        if (!valid_shape_text(s))
            r.fail("large_shapes", "expected shapes written ROWSxHIDDEN with positive integers (e.g. \"32768x512\"), got \"" + s + "\"");
    c.large_reps = r.get_int("large_reps");
    c.norms = r.get_string_list("norms");
    c.impls = r.get_string_list("impls");
    c.passes = r.get_string_list("passes");
    c.dtypes = r.get_string_list("dtypes");
    for (const std::string& dtype : c.dtypes)
        if (std::count(c.dtypes.begin(), c.dtypes.end(), dtype) > 1)
            r.fail("dtypes", "expected each dtype at most once, got \"" + dtype + "\" twice");
    c.min_sample_ms = r.get_double("min_sample_ms");
    c.threads = r.get_int("threads");
    c.clock = r.get_string("clock");
    c.seed = static_cast<uint64_t>(r.get_int("seed"));
    c.device = read_device(r);
    r.finish();
    require_device_available(c.device, r.where("device"));
    if (c.norms.empty()) r.fail("norms", "expected at least one norm");
    if (c.impls.empty()) r.fail("impls", "expected at least one implementation");
    if (c.passes.empty()) r.fail("passes", "expected at least one pass");
    if (c.dtypes.empty()) r.fail("dtypes", "expected at least one dtype");
    return c;
}

// --quick: a smoke run that still exercises every code path (not a measurement).
void make_quick(NormsBenchConfig& c) {
    c.reps = 5;
    c.hidden = {128, 1024};
    c.batch = {32};
    c.large_shapes = {"4096x512"};
    c.large_reps = 3;
    c.min_sample_ms = 0.2;
}

// One measured case.
struct Result {
    Shape2 shape;
    std::string norm, impl, pass;
    std::string dtype;         // "f32", "bf16", "f16": of x, y, dy, dx, the parameters and the copy
    Stats ours, copy;
    double bytes = 0;          // bytes a fused kernel must move (the GB/s numerator for every impl)
    int64_t peak_bytes = -1;   // peak allocator bytes above the inputs during one call; -1: not measured
    int64_t saved_bytes = -1;  // bytes saved for backward by the graph; -1: no graph (kernel, op)
    std::string device;        // "cpu", "cuda:0"

    double gbs() const { return bytes / ours.median * 1e-9; }
    double copy_gbs() const { return bytes / copy.median * 1e-9; }
    double vs_copy() const { return copy.median / ours.median; }
};

// The f32 inputs of one shape, drawn on the host once (in this order whatever the device and the
// dtypes, so every device and dtype sees the same numbers, rounded). x, dy ~ N(0, 1); weight, bias ~
// 1 + N(0, 0.1) so the affine part does real work (ones and zeros could be special-cased by nobody,
// but it is cheap).
struct HostInputs {
    Tensor x, dy, weight, bias;  // (rows, d), (rows, d), (d), (d)
    Tensor copy_src;             // (rows * d): the copy's source

    HostInputs(const Shape2& s, Generator& gen) {
        const Shape xs = {s.rows, s.hidden};
        x = randn(xs, gen);
        dy = randn(xs, gen);
        weight = normal({s.hidden}, 1.0, 0.1, gen);
        bias = normal({s.hidden}, 0.0, 0.1, gen);
        copy_src = randn({s.rows * s.hidden}, gen);
    }
};

// The inputs and preallocated buffers of one shape in one dtype on the device. The statistics are f32
// whatever the dtype (core/backend.h NormForwardArgs).
struct ShapeData {
    DType dtype = DType::F32;
    Tensor x, dy, weight, bias;                 // (rows, d), (rows, d), (d), (d); dtype
    Tensor alpha;                               // (1), dtype: DyT's alpha, its default 0.5
    Tensor y, dx, dweight, dbias, mean, rstd;   // kernel outputs: (rows, d) x2, (d) x2 in dtype; (rows) x2 f32
    Tensor dalpha;                              // (1), dtype: DyT's kernel output
    Tensor copy_src, copy_dst;                  // (rows * d) each, dtype: the copy's buffers

    ShapeData(const HostInputs& h, DType type, Device device) : dtype(type) {
        const Shape xs = h.x.shape();
        const int64_t rows = xs[0], hidden = xs[1];
        x = h.x.to(dtype).to(device);
        dy = h.dy.to(dtype).to(device);
        weight = h.weight.to(dtype).to(device);
        bias = h.bias.to(dtype).to(device);
        alpha = full({1}, NormOptions{}.alpha_init, dtype, device);
        y = zeros(xs, dtype, device);
        dx = zeros(xs, dtype, device);
        dweight = zeros({hidden}, dtype, device);
        dbias = zeros({hidden}, dtype, device);
        dalpha = zeros({1}, dtype, device);
        mean = zeros({rows}, DType::F32, device);
        rstd = zeros({rows}, DType::F32, device);
        copy_src = h.copy_src.to(dtype).to(device);
        copy_dst = zeros({rows * hidden}, dtype, device);
    }
};

// Bytes a fused kernel must move per element: fwd reads x and writes y (2 elements); fwd+bwd adds
// reading x and dy and writing dx (5 in all). The parameters and statistics (O(d + rows)) are left out.
double bytes_per_element(const std::string& pass, DType dtype) {
    return (pass == "fwd" ? 2.0 : 5.0) * static_cast<double>(dtype_size(dtype));
}

// Moves `bytes` (read + written) with parallel memcpy between the copy buffers (of the case's dtype):
// whole passes over them and a partial last one, so a fwd+bwd case (5 elements' bytes per element)
// copies 2.5 tensors' worth. On a GPU the copy is a device-to-device tensor copy of the same bytes.
void copy_bytes(const ShapeData& d, double bytes) {
    const size_t buffer = static_cast<size_t>(d.copy_src.nbytes());
    size_t left = static_cast<size_t>(bytes / 2);  // each copied byte is read once and written once
    const bool cpu = d.copy_src.device().is_cpu();
    while (left > 0) {
        const size_t n = std::min(left, buffer);
        if (cpu) {
            parallel_copy(d.copy_dst.data_ptr(), d.copy_src.data_ptr(), n);
        } else {
            const int64_t elements = static_cast<int64_t>(n / dtype_size(d.dtype));
            d.copy_dst.narrow(0, 0, elements).copy_(d.copy_src.narrow(0, 0, elements));
        }
        left -= n;
    }
    device_synchronize(d.copy_src.device());
}

// One call of (norm, impl, pass) on a shape; everything it allocates dies when it returns.
std::function<void()> make_call(const std::string& norm_type, const std::string& impl, const std::string& pass,
                                ShapeData& d, const std::shared_ptr<Norm>& module) {
    const bool layer = norm_type == "layernorm";
    const bool backward = pass == "fwd+bwd";
    const double eps = module->eps();
    const int64_t rows = d.x.size(0), hidden = d.x.size(1);
    Tensor bias = layer ? d.bias : Tensor();
    const Device device = d.x.device();
    if (norm_type == "dyt" && impl == "kernel") {
        Backend* be = &backend_for(device);
        return [be, &d, backward, rows, hidden, device] {
            be->dyt_forward({.dtype = d.dtype, .x = d.x.data_ptr(), .alpha = d.alpha.data_ptr(),
                             .weight = d.weight.data_ptr(), .bias = d.bias.data_ptr(), .y = d.y.data_ptr(),
                             .rows = rows, .d = hidden});
            if (backward)
                be->dyt_backward({.dtype = d.dtype, .dy = d.dy.data_ptr(), .x = d.x.data_ptr(),
                                  .alpha = d.alpha.data_ptr(), .weight = d.weight.data_ptr(), .dx = d.dx.data_ptr(),
                                  .dalpha = d.dalpha.data_ptr(), .dweight = d.dweight.data_ptr(),
                                  .dbias = d.dbias.data_ptr(), .rows = rows, .d = hidden});
            device_synchronize(device);
        };
    }
    if (norm_type == "dyt" && impl == "op") {
        return [&d, backward, device] {
            Tensor y = dyt_forward(d.x, d.alpha, d.weight, d.bias);
            if (backward) DytBackward g = dyt_backward(d.dy, d.x, d.alpha, d.weight);
            device_synchronize(device);
        };
    }
    if (impl == "kernel") {
        Backend* be = &backend_for(device);
        return [be, &d, layer, backward, eps, rows, hidden, device] {
            be->norm_forward({.dtype = d.dtype, .x = d.x.data_ptr(), .weight = d.weight.data_ptr(),
                              .bias = layer ? d.bias.data_ptr() : nullptr, .y = d.y.data_ptr(),
                              .mean = layer ? d.mean.data_ptr() : nullptr, .rstd = d.rstd.data_ptr(), .rows = rows,
                              .d = hidden, .eps = eps, .subtract_mean = layer, .stat_count = hidden});
            if (backward)
                be->norm_backward({.dtype = d.dtype, .dy = d.dy.data_ptr(), .x = d.x.data_ptr(),
                                   .weight = d.weight.data_ptr(), .mean = layer ? d.mean.data_ptr() : nullptr,
                                   .rstd = d.rstd.data_ptr(), .dx = d.dx.data_ptr(), .dweight = d.dweight.data_ptr(),
                                   .dbias = layer ? d.dbias.data_ptr() : nullptr, .rows = rows, .d = hidden,
                                   .subtract_mean = layer, .stat_count = hidden});
            device_synchronize(device);
        };
    }
    if (impl == "op") {
        return [&d, bias, layer, backward, eps, device] {
            NormForward f = norm_forward(d.x, d.weight, bias, eps, layer);
            if (backward) NormBackward g = norm_backward(d.dy, d.x, d.weight, f.mean, f.rstd, layer, -1, true, layer);
            device_synchronize(device);
        };
    }
    // fused / composed modules through autograd. Forward alone runs as inference (no graph).
    return [&d, module, backward, device] {
        if (!backward) {
            NoGradGuard no_grad;
            Var y = module->forward(Var(d.x));
            device_synchronize(device);
            return;
        }
        Var x(d.x, true);
        Var y = module->forward(x);
        y.backward(Var(d.dy));
        module->zero_grad();
        device_synchronize(device);
    };
}

// Peak allocator bytes above what was live before one call (the call's own transient memory).
int64_t peak_of(const std::function<void()>& call, Device device) {
    const int64_t base = memory_stats(device).current_bytes;
    reset_peak(device);
    call();
    return memory_stats(device).peak_bytes - base;
}

// Bytes the module's graph keeps for backward after one forward with grad.
int64_t saved_of(ShapeData& d, const std::shared_ptr<Norm>& module) {
    Var x(d.x, true);
    Var y = module->forward(x);
    return graph_saved_bytes(y);
}

std::shared_ptr<Norm> build_module(const std::string& norm_type, const std::string& impl, const ShapeData& d) {
    NormOptions o;
    o.type = norm_type;
    o.dim = d.x.size(1);
    o.fused = impl != "composed";
    o.dtype = d.dtype;
    std::shared_ptr<Norm> m = make_norm(o);
    m->to(d.x.device());
    // The same random affine parameters for every impl (DyT's alpha stays at its init, as the kernel's).
    m->parameter("weight").data().copy_(d.weight);
    if (m->has_parameter("bias")) m->parameter("bias").data().copy_(d.bias);
    return m;
}

std::string shape_label(const Shape2& s) { return fmt::format("{}x{}", s.rows, s.hidden); }

// "0.123+-4%": the median in ms and half the interquartile range.
std::string time_cell(const Stats& s) {
    const double ms = s.median * 1e3;
    const int decimals = ms < 1 ? 4 : ms < 100 ? 3 : 1;
    return fmt::format("{:.{}f}+-{:.0f}%", ms, decimals, s.spread_pct());
}

const Result* find(const std::vector<Result>& results, const Shape2& s, const std::string& norm,
                   const std::string& impl, const std::string& pass, const std::string& dtype) {
    for (const Result& r : results)
        if (r.shape.rows == s.rows && r.shape.hidden == s.hidden && r.norm == norm && r.impl == impl &&
            r.pass == pass && r.dtype == dtype)
            return &r;
    return nullptr;
}

// One pass in one dtype: a row per (shape, norm), a cell per implementation.
void print_time_table(const NormsBenchConfig& c, const std::vector<Result>& results, const std::string& pass,
                      const std::string& dtype) {
    fmt::print("\n{} ({:g} B/element moved by a fused kernel), {}: median ms +- half the IQR, GB/s, and "
               "x copy = copy time / our time for the same bytes\n",
               pass == "fwd" ? "forward" : "forward+backward", bytes_per_element(pass, dtype_from_name(dtype)), dtype);
    std::string header = fmt::format("  {:<11} {:<10} {:>8}", "shape", "norm", "copy GB/s");
    for (const std::string& impl : c.impls) header += fmt::format(" | {:>26}", impl + ": ms, GB/s, x copy");
    fmt::print("{}\n", header);
    for (const Shape2& s : c.shapes()) {
        for (const std::string& norm : c.norms) {
            std::string line;
            double copy_gbs = 0;
            for (const std::string& impl : c.impls) {
                const Result* r = find(results, s, norm, impl, pass, dtype);
                if (!r) continue;
                copy_gbs = std::max(copy_gbs, r->copy_gbs());
                line += fmt::format(" | {:>14} {:6.2f} {:4.2f}", time_cell(r->ours), r->gbs(), r->vs_copy());
            }
            fmt::print("  {:<11} {:<10} {:>8.2f}{}\n", shape_label(s), norm, copy_gbs, line);
        }
    }
}

void print_time_tables(const NormsBenchConfig& c, const std::vector<Result>& results) {
    for (const std::string& dtype : c.dtypes) {
        for (const std::string& pass : c.passes) {
            print_time_table(c, results, pass, dtype);
        }
    }
    fmt::print("  copy = {}, timed interleaved with each case; the copy GB/s shown is the best of the row's "
               "cases.\n",
               c.device.is_cpu() ? "std::memcpy split over the OpenMP threads"
                                 : "a device-to-device tensor copy on " + c.device.str());
}

// RMSNorm time / LayerNorm time per shape and implementation in one dtype; under 1 means RMSNorm is faster.
void print_ratio_table(const NormsBenchConfig& c, const std::vector<Result>& results, const std::string& dtype) {
    if (std::find(c.norms.begin(), c.norms.end(), "layernorm") == c.norms.end() ||
        std::find(c.norms.begin(), c.norms.end(), "rmsnorm") == c.norms.end())
        return;
    fmt::print("\nRMSNorm time / LayerNorm time, {} (median over median; < 1: RMSNorm faster; the seed article "
               "claims 0.80-0.85)\n",
               dtype);
    std::string header = fmt::format("  {:<11}", "shape");
    for (const std::string& pass : c.passes)
        for (const std::string& impl : c.impls) header += fmt::format(" {:>17}", impl + " " + pass);
    fmt::print("{}\n", header);
    // Geometric means over the seed shapes and over the large shapes.
    std::map<std::string, std::pair<double, int>> log_sum[2];
    for (const Shape2& s : c.shapes()) {
        std::string line = fmt::format("  {:<11}", shape_label(s));
        for (const std::string& pass : c.passes) {
            for (const std::string& impl : c.impls) {
                const Result* rms = find(results, s, "rmsnorm", impl, pass, dtype);
                const Result* ln = find(results, s, "layernorm", impl, pass, dtype);
                if (!rms || !ln) {
                    line += fmt::format(" {:>17}", "-");
                    continue;
                }
                const double ratio = rms->ours.median / ln->ours.median;
                auto& acc = log_sum[s.large ? 1 : 0][pass + " " + impl];
                acc.first += std::log(ratio);
                acc.second += 1;
                line += fmt::format(" {:>17.3f}", ratio);
            }
        }
        fmt::print("{}\n", line);
    }
    for (int group = 0; group < 2; ++group) {
        std::string line = fmt::format("  {:<11}", group == 0 ? "geomean seed" : "geomean large");
        bool any = false;
        for (const std::string& pass : c.passes) {
            for (const std::string& impl : c.impls) {
                auto it = log_sum[group].find(pass + " " + impl);
                if (it == log_sum[group].end() || it->second.second == 0) {
                    line += fmt::format(" {:>17}", "-");
                    continue;
                }
                any = true;
                line += fmt::format(" {:>17.3f}", std::exp(it->second.first / it->second.second));
            }
        }
        if (any) fmt::print("{}\n", line);
    }
}

void print_memory_table(const NormsBenchConfig& c, const std::vector<Result>& results, const std::string& dtype) {
    fmt::print("\nmemory per call, {}: peak allocator bytes above the inputs during one fwd+bwd call, and the bytes "
               "the graph saves for backward (x itself included)\n",
               dtype);
    std::string header = fmt::format("  {:<11} {:<10}", "shape", "norm");
    for (const std::string& impl : c.impls)
        if (impl == "fused" || impl == "composed")
            header += fmt::format(" | {:>12} {:>12}", impl + " peak", "saved");
    header += fmt::format(" | {:>12}", "op peak");
    fmt::print("{}\n", header);
    for (const Shape2& s : c.shapes()) {
        for (const std::string& norm : c.norms) {
            std::string line = fmt::format("  {:<11} {:<10}", shape_label(s), norm);
            bool any = false;
            for (const std::string& impl : c.impls) {
                if (impl != "fused" && impl != "composed") continue;
                const Result* r = find(results, s, norm, impl, "fwd+bwd", dtype);
                if (!r) {
                    line += fmt::format(" | {:>12} {:>12}", "-", "-");
                    continue;
                }
                any = true;
                line += fmt::format(" | {:>12} {:>12}", format_bytes(static_cast<double>(r->peak_bytes)),
                                    format_bytes(static_cast<double>(r->saved_bytes)));
            }
            const Result* op = find(results, s, norm, "op", "fwd+bwd", dtype);
            line += fmt::format(" | {:>12}", op ? format_bytes(static_cast<double>(op->peak_bytes)) : "-");
            if (any || op) fmt::print("{}\n", line);
        }
    }
}

std::string csv_text(const std::vector<Result>& results) {
    std::string out =
        "group,rows,hidden,norm,impl,pass,dtype,samples,calls_per_sample,median_s,p25_s,p75_s,min_s,max_s,bytes,gbs,"
        "copy_median_s,copy_min_s,copy_max_s,copy_gbs,ratio_to_copy,peak_bytes,saved_bytes,device\n";
    for (const Result& r : results) {
        out += fmt::format("{},{},{},{},{},{},{},{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.0f},{:.6g},{:.9g},{:.9g},"
                           "{:.9g},{:.6g},{:.6g},{},{},{}\n",
                           r.shape.large ? "large" : "seed", r.shape.rows, r.shape.hidden, r.norm, r.impl, r.pass,
                           r.dtype, r.ours.samples, r.ours.calls_per_sample, r.ours.median, r.ours.p25, r.ours.p75, r.ours.min,
                           r.ours.max, r.bytes, r.gbs(), r.copy.median, r.copy.min, r.copy.max, r.copy_gbs(),
                           r.vs_copy(), r.peak_bytes, r.saved_bytes, r.device);
    }
    return out;
}

struct NormsCommand {
    std::string config;
    std::vector<std::string> overrides;
    std::string csv;
    std::string out;
    bool quick = false;
    bool force = false;
};

void run_bench_norms(const NormsCommand& cmd) {
    json root = cmd.config.empty() ? json::object() : load_json_file(cmd.config);
    NL_REQUIRE(root.is_object(), cmd.config, ": expected a JSON object at the top level");
    for (const std::string& o : cmd.overrides) apply_override(root, o);
    NormsBenchConfig c = read_config(root, cmd.config.empty() ? "(defaults)" : cmd.config);
    if (cmd.quick) make_quick(c);
    if (c.threads > 0) {
        omp_set_num_threads(static_cast<int>(c.threads));
        openblas_set_num_threads(static_cast<int>(c.threads));
    }

    // Decide where the CSV goes before any work, so a refusal costs nothing.
    std::string csv = cmd.csv;
    if (csv.empty()) csv = (cmd.out.empty() ? std::string(".") : cmd.out) + "/bench_norms.csv";
    NL_REQUIRE(cmd.force || !std::filesystem::exists(csv), "bench norms: ", csv,
               " exists (pass --force to overwrite, or --csv PATH)");
    if (!cmd.out.empty()) std::filesystem::create_directories(cmd.out);

    std::string dtypes;
    for (const std::string& dtype : c.dtypes) dtypes += (dtypes.empty() ? "" : ", ") + dtype;
    fmt::print("normlab bench norms: {} on {}, {} reps at the seed shapes, {} at the large ones, >= {} ms per sample; "
               "OpenMP {} threads, OpenBLAS {} threads; {} clock\n",
               dtypes, c.device.str(), c.reps, c.large_reps, c.min_sample_ms, omp_get_max_threads(), openblas_get_num_threads(),
               c.clock == "cpu" ? "process CPU-time" : "wall");
    fmt::print("implementations: kernel = backend kernel on preallocated buffers; op = core/fused.h (allocates "
               "outputs); fused / composed = make_norm modules through autograd\n");

    Generator gen(c.seed);
    std::vector<Result> results;
    const double min_sample_s = c.min_sample_ms * 1e-3;
    const Clock clock = c.clock == "cpu" ? Clock::Cpu : Clock::Wall;
    for (const Shape2& s : c.shapes()) {
        const HostInputs host(s, gen);
        const double n = static_cast<double>(s.rows * s.hidden);
        for (const std::string& dtype : c.dtypes) {
            ShapeData d(host, dtype_from_name(dtype), c.device);  // one dtype's tensors live at a time
            fmt::print(stderr, "  shape {} {} ...\n", shape_label(s), dtype);
            for (const std::string& norm : c.norms) {
                for (const std::string& impl : c.impls) {
                    std::shared_ptr<Norm> module = build_module(norm, impl, d);
                    for (const std::string& pass : c.passes) {
                        Result r;
                        r.shape = s;
                        r.norm = norm;
                        r.impl = impl;
                        r.pass = pass;
                        r.dtype = dtype;
                        r.device = c.device.str();
                        r.bytes = bytes_per_element(pass, d.dtype) * n;
                        std::function<void()> call = make_call(norm, impl, pass, d, module);
                        const double bytes = r.bytes;
                        auto copy = [&d, bytes] { copy_bytes(d, bytes); };
                        r.peak_bytes = peak_of(call, c.device);
                        std::tie(r.ours, r.copy) = time_interleaved(call, copy, s.large ? c.large_reps : c.reps,
                                                                    s.large ? 0.0 : min_sample_s, clock);
                        if (pass == "fwd+bwd" && (impl == "fused" || impl == "composed"))
                            r.saved_bytes = saved_of(d, module);
                        results.push_back(r);
                    }
                }
            }
        }
    }

    print_time_tables(c, results);
    for (const std::string& dtype : c.dtypes) print_ratio_table(c, results, dtype);
    for (const std::string& dtype : c.dtypes) print_memory_table(c, results, dtype);
    write_file_atomic(csv, csv_text(results));
    fmt::print("\nwrote {} ({} cases)\n", csv, results.size());
}

}  // namespace

void register_bench_norms(CLI::App& bench) {
    auto cmd = std::make_shared<NormsCommand>();
    CLI::App* sub = bench.add_subcommand(
        "norms", "LayerNorm vs RMSNorm (and DyT), fused vs composed, fwd and fwd+bwd: time, GB/s vs a memory copy, "
                 "memory");
    sub->add_option("config", cmd->config, "JSON config (see configs/bench_norms.json); defaults when absent");
    sub->add_option("--set", cmd->overrides, "override a config key, e.g. --set reps=20 (repeatable)")
        ->allow_extra_args(false);  // one KEY=VALUE per --set, so a config path after it stays positional
    sub->add_option("--csv", cmd->csv, "CSV output path (default: bench_norms.csv in --out or the current dir)");
    sub->add_option("--out", cmd->out, "directory for the CSV (created when missing)");
    sub->add_flag("--quick", cmd->quick, "a smoke run: two small seed shapes, one 4096x512 shape, 5 reps");
    sub->add_flag("--force", cmd->force, "overwrite an existing CSV");
    sub->callback([cmd] { run_bench_norms(*cmd); });
}

}  // namespace nl::cli
