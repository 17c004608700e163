// The stability job (jobs/stability.h). Reads top to bottom: config -> data and model -> train ->
// gather over ranks -> report. "device" runs every run on a GPU (data and weights are drawn on the
// host, then moved).
#include "jobs/stability.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "autograd/autograd.h"
#include "core/thread_governor.h"
#include "core/dist.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "jobs/config.h"
#include "jobs/grid_runner.h"
#include "jobs/run_dir.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/norms.h"
#include "optim/adam.h"

namespace fs = std::filesystem;

namespace nl {

namespace {

// ---------------------------------------------------------------------------------------------
// config
// ---------------------------------------------------------------------------------------------

// Every field is read from the config; the defaults are the schema's (jobs/config_schema.cpp).
struct StabilityConfig {
    std::string file;
    std::vector<std::string> norms;
    std::vector<int64_t> depths;  // hidden Linear+norm+ReLU blocks; 2 is the article's model
    std::vector<double> lrs;
    std::vector<int64_t> seeds;
    int64_t epochs = 0;
    int64_t samples = 0;
    int64_t in_features = 0;
    int64_t hidden = 0;
    int64_t out_features = 0;
    DType dtype = DType::F32;
    Device device;                   // where the data, models and Adam state live
    NormOptions norm;                // every norm's options but its type (and dim); eps unset: each type's default
    double diverge_factor = 0.0;     // diverged: loss not finite or > factor * epoch-1 loss
    double perturb = 0.0;            // 0: no sensitivity copy
    std::string init_from;           // may contain {norm} and {depth}
    std::string data_from;
    bool plots = true;
    json resolved;
};

template <typename T>
void require_distinct(const ConfigReader& reader, const std::string& key, const std::vector<T>& values) {
    std::set<T> seen;
    for (const T& v : values)
        if (!seen.insert(v).second) reader.fail(key, "lists the value " + fmt::format("{}", v) + " twice");
}

StabilityConfig read_config(const StabilityJob& job) {
    const std::string path = job.config_path.empty() ? job.config_name : job.config_path;
    json root = job.config;
    if (!job.config_path.empty()) {
        root = load_json_file(path);
        resolve_paths_beside_config(root, path, {"/init_from", "/data_from"});
    }
    for (const std::string& assignment : job.overrides) apply_override(root, assignment);
    NL_REQUIRE(root.is_object(), path, ": expected a JSON object at the top level, got ", root.type_name());
    // Keys that moved into the /norm object train's /model/norm shares: refused with the new name,
    // so an old config does not silently run with other settings.
    ConfigReader r(root, path, config_schema("stability"));
    if (r.has("fused")) r.fail("fused", "moved: set /norm/fused (--set norm.fused=...), as train's /model/norm/fused");
    if (r.has("norm_eps"))
        r.fail("norm_eps", "moved: set /norm/eps (--set norm.eps=...), or leave it out for each type's own default, "
                           "as train's /model/norm/eps");
    StabilityConfig c;
    c.file = path;
    c.norms = r.get_string_list("norms");
    c.depths = r.get_int_list("depths");
    c.lrs = r.get_double_list("lrs");
    c.seeds = r.get_int_list("seeds");
    require_distinct(r, "norms", c.norms);
    require_distinct(r, "depths", c.depths);
    require_distinct(r, "lrs", c.lrs);
    require_distinct(r, "seeds", c.seeds);
    c.epochs = r.get_int("epochs");
    // Upper bounds (the schema's) keep every size product far from overflow; the memory the sizes
    // need is checked against the machine below.
    c.samples = r.get_int("samples");
    c.in_features = r.get_int("in_features");
    c.hidden = r.get_int("hidden");
    c.out_features = r.get_int("out_features");
    c.dtype = r.get_string("dtype") == "f64" ? DType::F64 : DType::F32;
    c.device = read_device(r);
    require_device_available(c.device, r.where("device"));
    c.norm = read_norm_options(r.child("norm"), false);
    c.diverge_factor = r.get_double("diverge_factor");
    c.perturb = r.get_double("perturb");
    c.init_from = r.get_string("init_from");
    c.data_from = r.get_string("data_from");
    c.plots = r.get_bool("plots");
    r.finish();
    c.resolved = r.resolved();
    // A lower bound of what the deepest run holds at once: the data, the model and its copy with
    // gradients and Adam's two moments, and the activations the backward keeps (about 4 per block).
    const double bytes_per = c.dtype == DType::F64 ? 8.0 : 4.0;
    const double S = double(c.samples), I = double(c.in_features), H = double(c.hidden), O = double(c.out_features);
    const double depth = double(*std::max_element(c.depths.begin(), c.depths.end()));
    const double params = I * H + (depth - 1.0) * H * H + H * O;
    const double bytes = bytes_per * (S * (I + O) + 2.0 * 4.0 * params + 4.0 * S * H * depth);
    require_memory(bytes, path + ": this config (/samples, /in_features, /hidden, /out_features, /depths)");
    return c;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
        text.replace(at, from.size(), to);
    return text;
}

// init_from with its placeholders filled: one file per norm (and depth) in a sweep.
std::string init_path(const StabilityConfig& c, const std::string& norm, int64_t depth) {
    return replace_all(replace_all(c.init_from, "{norm}", norm), "{depth}", std::to_string(depth));
}

// ---------------------------------------------------------------------------------------------
// data and model
// ---------------------------------------------------------------------------------------------

struct Data {
    Tensor x;  // (samples, in_features), the run's dtype
    Tensor y;  // (samples, out_features)
};

// As the article: x then y from N(0, 1), drawn in f32 (torch.randn's default) and converted, so an
// f64 run starts from exactly the f32 run's data.
Data make_data(const StabilityConfig& c, Generator& gen) {
    Tensor x = randn({c.samples, c.in_features}, gen, DType::F32);
    Tensor y = randn({c.samples, c.out_features}, gen, DType::F32);
    return {x.to(c.dtype), y.to(c.dtype)};
}

// data_from: a safetensors file with x (samples, in_features) and y (samples, out_features).
Data load_data(const StabilityConfig& c) {
    SafeTensorsFile file = load_safetensors(c.data_from);
    Data data{file.at("x"), file.at("y")};
    const Shape want_x{c.samples, c.in_features}, want_y{c.samples, c.out_features};
    NL_REQUIRE(is_floating(data.x.dtype()) && is_floating(data.y.dtype()), "data_from ", c.data_from,
               ": expected floating x and y, found ", dtype_name(data.x.dtype()), " and ",
               dtype_name(data.y.dtype()));
    NL_REQUIRE(data.x.shape() == want_x && data.y.shape() == want_y, "data_from ", c.data_from, ": expected x ",
               shape_str(want_x), " and y ", shape_str(want_y), " (samples, in_features, out_features of ",
               c.file, "), found x ", shape_str(data.x.shape()), " and y ", shape_str(data.y.shape()));
    return {data.x.to(c.dtype), data.y.to(c.dtype)};
}

// The article's SimpleModel with `depth` hidden blocks: fc1, norm1, ReLU, ..., fc<depth>,
// norm<depth>, ReLU, fc<depth+1>. Registered in that order, so the parameter names and order are
// PyTorch's (fc1.weight, fc1.bias, norm1.weight, ...) and Linear inits draw fc1, fc2, ... in turn.
class SimpleModel : public UnaryModule {
public:
    SimpleModel(const StabilityConfig& c, const std::string& norm, int64_t depth, Generator& gen) {
        for (int64_t i = 1; i <= depth + 1; ++i) {
            LinearOptions linear;
            linear.in_features = i == 1 ? c.in_features : c.hidden;
            linear.out_features = i == depth + 1 ? c.out_features : c.hidden;
            linear.generator = &gen;
            fcs_.push_back(register_module("fc" + std::to_string(i), std::make_shared<Linear>(linear)));
            if (i == depth + 1) break;
            NormOptions options = c.norm;
            options.type = norm;
            options.dim = c.hidden;
            norms_.push_back(register_module("norm" + std::to_string(i), make_norm(options)));
        }
    }
    std::string type_name() const override { return "SimpleModel"; }

    Var forward(const Var& x) override {
        Var h = x;  // (N, in_features)
        for (size_t i = 0; i < norms_.size(); ++i) h = relu(norms_[i]->forward(fcs_[i]->forward(h)));  // (N, hidden)
        return fcs_.back()->forward(h);  // (N, out_features)
    }

private:
    std::vector<std::shared_ptr<Linear>> fcs_;
    std::vector<std::shared_ptr<Norm>> norms_;
};

// The initial weights of one (norm, depth) from init_from, converted to the run's dtype and checked
// against the model (strict names and shapes) so a bad file fails before any run starts.
NamedTensors load_init(const StabilityConfig& c, const std::string& norm, int64_t depth) {
    const std::string path = init_path(c, norm, depth);
    SafeTensorsFile file = load_safetensors(path);
    NamedTensors entries;
    for (const auto& [name, tensor] : file.tensors) {
        NL_REQUIRE(is_floating(tensor.dtype()), "init_from ", path, ": '", name, "' is ",
                   dtype_name(tensor.dtype()), ", expected a floating tensor");
        entries.emplace_back(name, tensor.to(c.dtype));
    }
    Generator unused(0);
    SimpleModel probe(c, norm, depth, unused);
    probe.to(c.dtype);
    try {
        probe.load_state_dict(entries);
    } catch (const Error& e) {
        throw Error(detail::concat("init_from ", path, ": does not fit the ", norm, " model of depth ", depth,
                                   " (hidden ", c.hidden, "): ", e.what()));
    }
    return entries;
}

// ---------------------------------------------------------------------------------------------
// train
// ---------------------------------------------------------------------------------------------

struct RunSpec {
    std::string norm;
    int64_t depth = 2;
    double lr = 1e-3;
    int64_t seed = 0;
    std::string id;  // "rmsnorm_d2_lr0.001_s42": the curve file's name
};

struct Curve {
    std::vector<double> losses;                   // [epoch - 1]: the loss before that epoch's update
    std::vector<std::vector<double>> grad_norms;  // [epoch - 1]: total, then one per layer
    int64_t diverged_epoch = 0;                   // first epoch whose loss was not finite or too big; 0: none
    double seconds = 0.0;

    bool diverged() const { return diverged_epoch > 0; }
    double final_loss() const { return losses.back(); }
};

// L2 norm of each layer's gradient (all its parameters), and of all of them first.
std::vector<double> layer_grad_norms(const Module& model) {
    std::vector<double> norms{0.0};
    for (const auto& [name, layer] : model.named_children()) {
        double squares = 0.0;
        for (const Var& p : layer->parameters())
            if (p.grad().defined()) squares += sum(square(p.grad().data())).to(DType::F64).item();
        norms.push_back(std::sqrt(squares));
        norms[0] += squares;
    }
    norms[0] = std::sqrt(norms[0]);
    return norms;
}

// Full-batch Adam on MSE, as the article's loop: zero_grad, loss, backward, step. Stops at the
// first epoch whose loss is NaN/Inf or above diverge_factor times the first epoch's loss.
Curve train(SimpleModel& model, const Data& data, double lr, const StabilityConfig& c,
            const std::function<void(int64_t epoch, double loss)>& on_epoch) {
    AdamOptions options;  // torch.optim.Adam's defaults: betas (0.9, 0.999), eps 1e-8, no decay
    options.lr = lr;
    Adam adam(model.named_parameters(), options);
    const Var x(data.x), y(data.y);
    Curve curve;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t epoch = 1; epoch <= c.epochs; ++epoch) {
        adam.zero_grad();
        Var loss = mse_loss(model.forward(x), y);
        const double value = loss.item();
        curve.losses.push_back(value);
        loss.backward();
        curve.grad_norms.push_back(layer_grad_norms(model));
        on_epoch(epoch, value);
        if (!std::isfinite(value) || value > c.diverge_factor * curve.losses[0]) {
            curve.diverged_epoch = epoch;
            break;
        }
        adam.step();
    }
    curve.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return curve;
}

struct RunResult {
    RunSpec spec;
    Curve curve;
    std::optional<Curve> perturbed;  // the copy with fc1.weight scaled by (1 + perturb)
    std::vector<std::string> layers; // the model's layer names (the curve file's grad-norm columns)

    // |final loss change| / final loss when both copies ran every epoch.
    std::optional<double> sensitivity() const {
        if (!perturbed || curve.diverged() || perturbed->diverged()) return std::nullopt;
        return std::fabs(perturbed->final_loss() - curve.final_loss()) / std::fabs(curve.final_loss());
    }
};

// ---------------------------------------------------------------------------------------------
// a run's record for the grid runner (jobs/grid_runner.h), which deals the runs over the ranks and
// gathers them on rank 0: the curves as hex text of their raw bytes (doubles bit for bit, NaN included)
// ---------------------------------------------------------------------------------------------

std::string hex_of(const std::vector<double>& values) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(values.size() * 16);
    for (double v : values) {
        uint64_t bits = 0;
        std::memcpy(&bits, &v, sizeof v);
        for (int shift = 60; shift >= 0; shift -= 4) out += digits[(bits >> shift) & 0xf];
    }
    return out;
}

std::vector<double> values_of(const json& hex) {
    const std::string& text = hex.get_ref<const std::string&>();
    NL_CHECK(text.size() % 16 == 0, "a gathered stability curve is truncated");
    std::vector<double> out(text.size() / 16);
    for (size_t i = 0; i < out.size(); ++i) {
        const uint64_t bits = std::stoull(text.substr(16 * i, 16), nullptr, 16);
        std::memcpy(&out[i], &bits, sizeof bits);
    }
    return out;
}

json curve_json(const Curve& curve) {
    json grad_norms = json::array();
    for (const auto& row : curve.grad_norms) grad_norms.push_back(hex_of(row));
    return {{"losses", hex_of(curve.losses)},
            {"grad_norms", grad_norms},
            {"diverged_epoch", curve.diverged_epoch},
            {"seconds", hex_of({curve.seconds})}};
}

Curve curve_of(const json& record) {
    Curve curve;
    curve.losses = values_of(record["losses"]);
    for (const json& row : record["grad_norms"]) curve.grad_norms.push_back(values_of(row));
    curve.diverged_epoch = record["diverged_epoch"].get<int64_t>();
    curve.seconds = values_of(record["seconds"]).at(0);
    return curve;
}

json result_json(const RunResult& r) {
    json out = {{"curve", curve_json(r.curve)}, {"layers", r.layers}};
    if (r.perturbed) out["perturbed"] = curve_json(*r.perturbed);
    return out;
}

RunResult result_of(const RunSpec& spec, const json& record) {
    RunResult r{spec, curve_of(record["curve"]), std::nullopt, record["layers"].get<std::vector<std::string>>()};
    if (record.contains("perturbed")) r.perturbed = curve_of(record["perturbed"]);
    return r;
}

// ---------------------------------------------------------------------------------------------
// report
// ---------------------------------------------------------------------------------------------

std::string format_lr(double lr) { return fmt::format("{:g}", lr); }

std::string cell(const std::vector<double>& values, size_t i) {
    return i < values.size() ? format_number(values[i]) : "";
}

// curves/<id>.csv: epoch, loss, loss_perturbed, grad_norm_total, grad_norm.<layer>...
void write_curve_csv(const RunDir& run, const RunResult& result, const std::vector<std::string>& layers) {
    std::vector<std::string> header{"epoch", "loss", "loss_perturbed", "grad_norm_total"};
    for (const std::string& layer : layers) header.push_back("grad_norm." + layer);
    CsvWriter csv(run.path("curves/" + result.spec.id + ".csv"), header);
    const std::vector<double> none;
    const std::vector<double>& perturbed = result.perturbed ? result.perturbed->losses : none;
    const size_t rows = std::max(result.curve.losses.size(), perturbed.size());
    for (size_t i = 0; i < rows; ++i) {
        std::vector<std::string> cells{std::to_string(i + 1), cell(result.curve.losses, i), cell(perturbed, i)};
        for (size_t k = 0; k <= layers.size(); ++k)
            cells.push_back(i < result.curve.grad_norms.size() ? format_number(result.curve.grad_norms[i][k]) : "");
        csv.row(cells);
    }
}

struct Stats {
    int64_t count = 0;
    double mean = NAN, std = NAN, min = NAN, max = NAN;  // std: sample (n - 1), NaN below 2 values
};

Stats stats_of(const std::vector<double>& values) {
    Stats s;
    s.count = static_cast<int64_t>(values.size());
    if (values.empty()) return s;
    double total = 0.0;
    for (double v : values) total += v;
    s.mean = total / static_cast<double>(values.size());
    s.min = *std::min_element(values.begin(), values.end());
    s.max = *std::max_element(values.begin(), values.end());
    if (values.size() >= 2) {
        double squares = 0.0;
        for (double v : values) squares += (v - s.mean) * (v - s.mean);
        s.std = std::sqrt(squares / static_cast<double>(values.size() - 1));
    }
    return s;
}

double median(std::vector<double> values) {
    if (values.empty()) return NAN;
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

json number_or_null(double value) { return std::isfinite(value) ? json(value) : json(nullptr); }

// One row of the summary: a (norm, depth, lr) over its seeds.
struct Group {
    std::string norm;
    int64_t depth;
    double lr;
    std::vector<const RunResult*> runs;
};

json group_json(const Group& g, const StabilityConfig& c) {
    std::vector<double> finals, sensitivities, per_epoch;
    int64_t diverged = 0;
    for (const RunResult* r : g.runs) {
        per_epoch.push_back(r->curve.seconds / static_cast<double>(r->curve.losses.size()));
        if (r->curve.diverged()) {
            ++diverged;
            continue;
        }
        finals.push_back(r->curve.final_loss());
        if (auto s = r->sensitivity()) sensitivities.push_back(*s);
    }
    Stats f = stats_of(finals), s = stats_of(sensitivities);
    const double runs = static_cast<double>(g.runs.size());
    return json{{"norm", g.norm},
                {"depth", g.depth},
                {"lr", g.lr},
                {"seeds", g.runs.size()},
                {"diverged", diverged},
                {"divergence_rate", static_cast<double>(diverged) / runs},
                {"final_loss_mean", number_or_null(f.mean)},
                {"final_loss_std", number_or_null(f.std)},
                {"final_loss_min", number_or_null(f.min)},
                {"final_loss_max", number_or_null(f.max)},
                {"final_loss_relative_spread", number_or_null((f.max - f.min) / f.mean)},
                {"sensitivity_max", number_or_null(s.max)},
                {"sensitivity_median", number_or_null(median(sensitivities))},
                {"sensitivity_perturb", c.perturb},
                {"seconds_per_epoch", stats_of(per_epoch).mean}};
}

json run_json(const RunResult& r) {
    json j{{"id", r.spec.id},
           {"norm", r.spec.norm},
           {"depth", r.spec.depth},
           {"lr", r.spec.lr},
           {"seed", r.spec.seed},
           {"epochs_run", r.curve.losses.size()},
           {"first_loss", number_or_null(r.curve.losses.front())},
           {"final_loss", number_or_null(r.curve.final_loss())},
           {"diverged", r.curve.diverged()},
           {"diverged_epoch", r.curve.diverged() ? json(r.curve.diverged_epoch) : json(nullptr)},
           {"seconds", r.curve.seconds}};
    if (r.perturbed) {
        j["final_loss_perturbed"] = number_or_null(r.perturbed->final_loss());
        j["perturbed_diverged_epoch"] = r.perturbed->diverged() ? json(r.perturbed->diverged_epoch) : json(nullptr);
    }
    auto s = r.sensitivity();
    j["sensitivity"] = s ? json(*s) : json(nullptr);
    return j;
}

std::string fmt_or_na(const json& value, const char* format) {
    return value.is_number() ? fmt::format(fmt::runtime(format), value.get<double>()) : "n/a";
}

std::string summary_table(const json& groups, const StabilityConfig& c) {
    std::string out = fmt::format("{:<17} {:>5} {:>6} {:>5} {:>11} {:>24} {:>22} {:>11} {:>8}\n", "norm", "depth", "lr",
                                  "seeds", "diverged", "final loss mean +- std", "min .. max", "sensitivity",
                                  "s/epoch");
    for (const json& g : groups) {
        const std::string diverged = fmt::format("{}/{} ({:.0f}%)", g["diverged"].get<int64_t>(),
                                                 g["seeds"].get<int64_t>(), 100.0 * g["divergence_rate"].get<double>());
        const std::string mean = fmt_or_na(g["final_loss_mean"], "{:.4g}") + " +- " + fmt_or_na(g["final_loss_std"], "{:.2g}");
        const std::string range = fmt_or_na(g["final_loss_min"], "{:.4g}") + " .. " + fmt_or_na(g["final_loss_max"], "{:.4g}");
        std::string sensitivity = c.perturb > 0 ? "n/a" : "off";
        if (g["sensitivity_max"].is_number()) {
            const double percent = 100.0 * g["sensitivity_max"].get<double>();
            sensitivity = percent >= 100 ? fmt::format("{:.0f}%", percent) : fmt::format("{:.2g}%", percent);
        }
        out += fmt::format("{:<17} {:>5} {:>6} {:>5} {:>11} {:>24} {:>22} {:>11} {:>8.4f}\n",
                           g["norm"].get<std::string>(), g["depth"].get<int64_t>(), format_lr(g["lr"].get<double>()),
                           g["seeds"].get<int64_t>(), diverged, mean, range, sensitivity,
                           g["seconds_per_epoch"].get<double>());
    }
    return out;
}

// plots.gp always (so the plots can be redrawn later); losses.png and grad_norms.png when gnuplot
// is installed. One colour (and dash pattern) per (norm, depth, lr), its seeds sharing it and one
// key entry, so a sweep's plot stays readable. Returns the note for the summary.
std::string write_plots(const RunDir& run, const std::vector<RunResult>& results, bool enabled) {
    std::string script =
        "# gnuplot script written by normlab stability: run `gnuplot plots.gp` in this directory\n"
        "set terminal pngcairo size 1200,700 noenhanced\nset datafile separator ','\n"
        "set key outside right\nset xlabel 'epoch'\nset grid\nset logscale y\n";
    std::vector<std::string> groups;
    std::string loss_plot, grad_plot;
    for (const RunResult& r : results) {
        const std::string group = fmt::format("{} d{} lr{}", r.spec.norm, r.spec.depth, format_lr(r.spec.lr));
        const bool first = std::find(groups.begin(), groups.end(), group) == groups.end();
        if (first) groups.push_back(group);
        const size_t index = std::find(groups.begin(), groups.end(), group) - groups.begin();
        const std::string style = fmt::format(" with lines lc {} dt {} {}", index % 8 + 1, index / 8 % 5 + 1,
                                              first ? "title '" + group + "'" : "notitle");
        const std::string file = "'curves/" + r.spec.id + ".csv'";
        loss_plot += (loss_plot.empty() ? "plot " : ", \\\n     ") + file + " using 1:2" + style;
        grad_plot += (grad_plot.empty() ? "plot " : ", \\\n     ") + file + " using 1:4" + style;
    }
    script += "set output 'losses.png'\nset ylabel 'MSE loss (before the epoch update)'\n" + loss_plot + "\n";
    script += "set output 'grad_norms.png'\nset ylabel 'gradient L2 norm, all parameters'\n" + grad_plot + "\n";
    run.write_text("plots.gp", script);
    if (!enabled) return "plots disabled (plots = false); plots.gp can draw them";
    const std::string failed = run_gnuplot(run.dir());
    if (!failed.empty()) return failed + ": no PNG plots; the curves are in curves/*.csv and plots.gp draws them";
    return "losses.png, grad_norms.png";
}

// ---------------------------------------------------------------------------------------------
// the job
// ---------------------------------------------------------------------------------------------

// What every rank reads before any run: the config and the files it names (checked on every rank;
// a mistake stops them all with one error). Rank 0 alone creates the run directory.
struct Inputs {
    StabilityConfig c;
    std::optional<Data> file_data;
    std::map<std::pair<std::string, int64_t>, NamedTensors> inits;
    std::optional<RunDir> run_dir;  // rank 0's
    std::vector<RunSpec> specs;     // every run of the sweep, in order
};

void read_inputs(const StabilityJob& job, Inputs& in) {
    dist::run_on_every_rank([&] {
        in.c = read_config(job);
        const StabilityConfig& c = in.c;
        if (!c.data_from.empty()) in.file_data = load_data(c);
        if (!c.init_from.empty())
            for (const std::string& norm : c.norms)
                for (int64_t depth : c.depths) in.inits[{norm, depth}] = load_init(c, norm, depth);
        if (!dist::is_root()) return;
        if (job.resume) require_resumable(job.out, c.resolved, "stability run");
        in.run_dir = RunDir::create(job.config_path.empty() ? job.config_name : job.config_path, job.out, job.force,
                                    job.resume);
        if (!job.resume) {
            // A forced run starts over: the records of the run it replaces must not be read back.
            std::error_code ec;
            fs::remove_all(in.run_dir->path("runs"), ec);
            fs::remove(in.run_dir->path("summary.json"), ec);
        }
    });
    for (const std::string& norm : in.c.norms)
        for (int64_t depth : in.c.depths)
            for (double lr : in.c.lrs)
                for (int64_t seed : in.c.seeds)
                    in.specs.push_back({norm, depth, lr, seed,
                                        fmt::format("{}_d{}_lr{}_s{}", norm, depth, format_lr(lr), seed)});
}

std::string describe(const Inputs& in, int jobs) {
    const StabilityConfig& c = in.c;
    return fmt::format("{} runs ({} norms x {} depths x {} lrs x {} seeds), {} epochs, {} on {}{}{}{} -> {}", in.specs.size(),
                       c.norms.size(), c.depths.size(), c.lrs.size(), c.seeds.size(), c.epochs, dtype_name(c.dtype),
                       c.device.str(), c.perturb > 0 ? fmt::format(", each with a copy perturbed by {:g}", c.perturb) : "",
                       jobs > 1 ? fmt::format(", {} at once", jobs) : "",
                       dist::world_size() > 1 ? fmt::format(", over {}", dist::describe()) : "", in.run_dir->dir());
}

// Runs at once on each rank: --jobs, else one per core (the cores divided by the ranks) but at most a
// rank's runs, so a sweep of one run per rank keeps every core for it; one on a GPU.
int jobs_of(const StabilityJob& job, const Inputs& in) {
    if (job.jobs > 0) return job.jobs;
    if (!in.c.device.is_cpu()) return 1;
    const int64_t ranks = dist::world_size();
    const int64_t runs_per_rank = (static_cast<int64_t>(in.specs.size()) + ranks - 1) / ranks;
    const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
    return static_cast<int>(std::max<int64_t>(1, std::min(cores / ranks, runs_per_rank)));
}

// One run of the sweep with its perturbed copy, on whichever of this rank's threads the grid runner
// gives it: the runs share only the inputs (read-only), the progress count and the callbacks.
class Runner {
public:
    // one_thread_each: each run on one OpenMP (and OpenBLAS) thread, as several run at once; otherwise
    // one run at a time with the cores a ThreadGovernor finds free.
    Runner(const Inputs& in, const StabilityCallbacks& callbacks, bool one_thread_each)
        : in_(in), c_(in.c), callbacks_(callbacks), one_thread_each_(one_thread_each) {
        // As train: the cores other processes leave free, re-read between epochs, unless
        // OMP_NUM_THREADS is set (results do not depend on the thread count).
        if (!one_thread_each_) governor_.emplace(omp_get_max_threads(), std::getenv("OMP_NUM_THREADS") == nullptr);
    }

    // The run's data and model from its seed (or the files), then the run and its copy trained.
    RunResult run(const RunSpec& spec) {
        if (one_thread_each_) {  // on the thread that drives the run (the grid runner puts the caller's back)
            omp_set_num_threads(1);
            openblas_set_num_threads(1);
        }
        Generator gen(static_cast<uint64_t>(spec.seed));
        // Drawn on the host, so every device starts from the same data and weights.
        Data data = in_.file_data ? *in_.file_data : make_data(c_, gen);
        data = {data.x.to(c_.device), data.y.to(c_.device)};
        SimpleModel model(c_, spec.norm, spec.depth, gen);  // drawn after the data, as the article
        model.to(c_.dtype);
        model.to(c_.device);
        if (!c_.init_from.empty()) model.load_state_dict(in_.inits.at({spec.norm, spec.depth}));
        NamedTensors initial;
        for (const auto& [name, tensor] : model.state_dict()) initial.emplace_back(name, tensor.clone());

        RunResult result{spec, train_copy(model, data, spec, false), std::nullopt, {}};
        if (c_.perturb > 0) {
            Generator unused(0);
            SimpleModel copy(c_, spec.norm, spec.depth, unused);
            copy.to(c_.dtype);
            copy.to(c_.device);
            copy.load_state_dict(initial);
            Var w = copy.child("fc1")->parameter("weight");
            w.data().copy_(mul(w.data(), 1.0 + c_.perturb));  // in the run's dtype, as w.mul_(1 + 1e-6)
            result.perturbed = train_copy(copy, data, spec, true);
        }
        for (const auto& [name, layer] : model.named_children()) result.layers.push_back(name);
        return result;
    }

private:
    Curve train_copy(SimpleModel& model, const Data& data, const RunSpec& spec, bool perturbed) {
        StabilityEpoch event{spec.id, perturbed, 0, 0.0, 0, 0};
        Curve curve = train(model, data, spec.lr, c_, [&](int64_t epoch, double loss) {
            if (governor_) governor_->update();
            event.epoch = epoch;
            event.loss = loss;
            report(event, 1);
        });
        if (curve.diverged()) {  // its end is an event, and the epochs it did not run count as done
            event.diverged_epoch = curve.diverged_epoch;
            report(event, c_.epochs - static_cast<int64_t>(curve.losses.size()));
        }
        return curve;
    }

    // Counts `epochs` more done on this rank, then the event with that count; one call at a time.
    void report(StabilityEpoch& event, int64_t epochs) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_ += epochs;
        event.done = done_;
        if (callbacks_.on_epoch) callbacks_.on_epoch(event);
    }

    const Inputs& in_;
    const StabilityConfig& c_;
    const StabilityCallbacks& callbacks_;
    const bool one_thread_each_;
    std::mutex mutex_;  // guards done_ and the calls of on_epoch
    int64_t done_ = 0;  // epochs trained on this rank, a perturbed copy's included
    std::optional<ThreadGovernor> governor_;  // one run at a time only
};

// Rank 0's files from every run: curves/<id>.csv and runs.csv, in sweep order.
void write_run_files(const RunDir& run, const std::vector<RunResult>& results) {
    CsvWriter runs_csv(run.path("runs.csv"), {"id", "norm", "depth", "lr", "seed", "epochs_run", "final_loss",
                                              "diverged_epoch", "final_loss_perturbed", "sensitivity", "seconds"});
    for (const RunResult& result : results) {
        const RunSpec& spec = result.spec;
        write_curve_csv(run, result, result.layers);
        auto s = result.sensitivity();
        runs_csv.row({spec.id, spec.norm, std::to_string(spec.depth), format_lr(spec.lr), std::to_string(spec.seed),
                      std::to_string(result.curve.losses.size()), format_number(result.curve.final_loss()),
                      result.curve.diverged() ? std::to_string(result.curve.diverged_epoch) : "",
                      result.perturbed ? format_number(result.perturbed->final_loss()) : "", s ? format_number(*s) : "",
                      format_number(result.curve.seconds)});
    }
}

// The summary's rows: one per (norm, depth, lr) over its seeds, in sweep order.
json group_rows_of(const std::vector<RunResult>& results, const StabilityConfig& c) {
    std::vector<Group> groups;
    for (const RunResult& r : results) {
        auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
            return g.norm == r.spec.norm && g.depth == r.spec.depth && g.lr == r.spec.lr;
        });
        if (it == groups.end()) it = groups.insert(groups.end(), Group{r.spec.norm, r.spec.depth, r.spec.lr, {}});
        it->runs.push_back(&r);
    }
    json rows = json::array();
    for (const Group& g : groups) rows.push_back(group_json(g, c));
    return rows;
}

StabilityRun run_of(const RunResult& r) {
    StabilityRun out{r.spec.id, r.spec.norm, r.spec.depth, r.spec.lr, r.spec.seed, r.curve.losses, {}, {},
                     r.curve.diverged_epoch, r.curve.seconds};
    if (r.perturbed) out.perturbed_losses = r.perturbed->losses;
    for (const auto& row : r.curve.grad_norms) out.grad_norms.push_back(row.front());
    return out;
}

// Rank 0: the files, the table, the plots, then summary.json last.
StabilityResult report(const StabilityJob& job, const Inputs& in, const std::vector<RunResult>& results, double seconds) {
    const StabilityConfig& c = in.c;
    const RunDir& run = *in.run_dir;
    write_run_files(run, results);
    StabilityResult out;
    out.run_dir = run.dir();
    const json group_rows = group_rows_of(results, c);
    json run_rows = json::array();
    for (const RunResult& r : results) {
        run_rows.push_back(run_json(r));
        out.runs.push_back(run_of(r));
    }
    out.plots = write_plots(run, results, c.plots);
    out.table = summary_table(group_rows, c);
    if (c.perturb > 0)
        out.notes.push_back(fmt::format("sensitivity: the largest relative change of the final loss, over seeds, when "
                                        "fc1.weight is scaled by (1 + {:g}) before training.", c.perturb));
    if (c.seeds.size() < 2)
        out.notes.push_back("one seed per row: the spread over seeds is unknown (n/a); with a large sensitivity, one "
                            "seed's final loss says little about a norm. Add seeds to measure the spread.");
    out.summary = json{{"job", "stability"},
                       {"config", job.config_path.empty() ? job.config_name : job.config_path},
                       {"dtype", dtype_name(c.dtype)},
                       {"device", c.device.str()},
                       {"epochs", c.epochs},
                       {"diverge_factor", c.diverge_factor},
                       {"perturb", c.perturb},
                       {"groups", group_rows},
                       {"runs", run_rows},
                       {"plots", out.plots},
                       {"seconds", seconds},
                       {"world_size", dist::world_size()}};
    run.write_summary(out.summary);
    return out;
}

}  // namespace

StabilityResult run_stability(const StabilityJob& job, const StabilityCallbacks& callbacks) {
    NL_REQUIRE(!job.resume || !job.out.empty(), "stability: --resume needs --out naming the run directory");
    NL_REQUIRE(!(job.resume && job.force), "stability: --resume and --force cannot be combined");
    NL_REQUIRE(job.jobs >= 0, "stability: --jobs must be >= 0, found ", job.jobs);
    Inputs in;
    read_inputs(job, in);
    const std::string dir = dist::broadcast_string(in.run_dir ? in.run_dir->dir() : std::string());
    const auto start = std::chrono::steady_clock::now();
    try {
        if (dist::is_root()) {
            if (!job.resume) in.run_dir->write_json("config.json", in.c.resolved);
            fs::create_directories(in.run_dir->path("curves"));
        }
        // This rank's runs over `jobs` threads, each run's record written to runs/<i>/result.json;
        // rank 0 gathers every record, then writes the curves and runs.csv in run order.
        GridRunner grid;
        grid.dir = dir;
        grid.runs = static_cast<int64_t>(in.specs.size());
        grid.jobs = jobs_of(job, in);
        grid.resume = job.resume;
        // The runs already done, counted before any rank writes a record.
        const std::vector<int64_t> finished = job.resume ? finished_runs(grid) : std::vector<int64_t>();
        dist::barrier();
        int64_t mine = 0;
        for (int64_t i = dist::rank(); i < grid.runs; i += dist::world_size())
            mine += std::find(finished.begin(), finished.end(), i) == finished.end();
        // Each run on one thread when several may run at once: decided by --jobs, not by how many
        // runs are left, so a resumed run trains at the thread count of an uninterrupted one.
        Runner runner(in, callbacks, grid.jobs > 1);
        if (callbacks.on_start) {
            const int64_t copies = in.c.perturb > 0 ? 2 : 1;
            callbacks.on_start({dist::is_root() ? describe(in, grid.jobs) : std::string(), in.c.epochs,
                                mine * copies * in.c.epochs, grid.runs, static_cast<int64_t>(finished.size())});
        }
        grid.run = [&](int64_t index, const std::string&) {
            return result_json(runner.run(in.specs[static_cast<size_t>(index)]));
        };
        const std::vector<json> records = run_grid(grid);
        if (!dist::is_root()) return {};
        std::vector<RunResult> results;
        for (size_t i = 0; i < records.size(); ++i) results.push_back(result_of(in.specs[i], records[i]));
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return report(job, in, results, seconds);
    } catch (const std::exception& e) {
        if (in.run_dir) in.run_dir->write_error(e.what());
        throw;
    }
}

}  // namespace nl
