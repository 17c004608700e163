// The sweep job (jobs/sweep.h). Reads top to bottom: config (the base train config, the grid, the
// seeds; every run's train config validated before anything is written) -> one run (a TrainSession
// stepped until done or diverged) -> the grid runner -> runs.csv, summary.json, plots.
#include "jobs/sweep.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include <fmt/core.h>

#include "core/dist.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "jobs/config.h"
#include "jobs/config_schema.h"
#include "jobs/grid_runner.h"
#include "jobs/run_dir.h"
#include "jobs/sharpness.h"
#include "jobs/stats.h"
#include "jobs/train.h"
#include "jobs/train_config.h"

namespace fs = std::filesystem;

namespace nl {

namespace {

// The train config key of the learning rate: the variants of summary.json are the grid points
// without it (and without the seed).
const char* const kLrKey = "optim.lr";

// ---------------------------------------------------------------------------------------------
// config
// ---------------------------------------------------------------------------------------------

struct SweepConfig {
    std::string file;                       // the config's name in messages
    json base;                              // the train config every run starts from (paths resolved)
    std::vector<std::string> keys;          // grid keys, in the file's order
    std::vector<std::vector<json>> values;  // (keys,) each key's values
    std::vector<int64_t> seeds;
    double diverge_factor = 3.0;
    bool plots = true;
    std::string baseline;                   // the variant the others are compared with; "": none
    json resolved;                          // the sweep config with base as the train config object
    std::vector<json> run_configs;          // (runs,) each run's train config
    std::vector<double> run_lrs;            // (runs,) each run's resolved optim.lr
};

int64_t run_count(const SweepConfig& c) {
    int64_t n = static_cast<int64_t>(c.seeds.size());
    for (const auto& values : c.values) n *= static_cast<int64_t>(values.size());
    return n;
}

// Run `index`'s position: one value index per grid key, then the seed's (the seeds vary fastest,
// then the last grid key).
std::vector<size_t> position_of(const SweepConfig& c, int64_t index, size_t& seed_at) {
    seed_at = static_cast<size_t>(index % static_cast<int64_t>(c.seeds.size()));
    int64_t rest = index / static_cast<int64_t>(c.seeds.size());
    std::vector<size_t> at(c.keys.size());
    for (size_t k = c.keys.size(); k-- > 0;) {
        const int64_t n = static_cast<int64_t>(c.values[k].size());
        at[k] = static_cast<size_t>(rest % n);
        rest /= n;
    }
    return at;
}

// A grid value as a runs.csv cell and a label: strings as they are, other JSON as JSON text (commas
// of a list become spaces, so the cell stays one CSV cell).
std::string value_text(const json& value) {
    std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    std::replace(text.begin(), text.end(), ',', ' ');
    return text;
}

std::string run_label(const SweepConfig& c, int64_t index) {
    size_t seed_at = 0;
    const std::vector<size_t> at = position_of(c, index, seed_at);
    std::string label;
    for (size_t k = 0; k < c.keys.size(); ++k) label += c.keys[k] + "=" + value_text(c.values[k][at[k]]) + " ";
    return label + "seed=" + std::to_string(c.seeds[seed_at]);
}

// Run `index`'s grid values: {key: value} for every grid key.
json grid_values_of(const SweepConfig& c, int64_t index) {
    size_t seed_at = 0;
    const std::vector<size_t> at = position_of(c, index, seed_at);
    json grid = json::object();
    for (size_t k = 0; k < c.keys.size(); ++k) grid[c.keys[k]] = c.values[k][at[k]];
    return grid;
}

// A variant's name in summary.json (and a `baseline`'s value): "model.qk_norm=head", the grid keys
// other than optim.lr that have more than one value (a key with one value is the same in every
// variant: it would only lengthen the name); "base" when there are none. `grid`: the variant's values.
std::string variant_name(const SweepConfig& c, const json& grid) {
    std::string name;
    for (size_t k = 0; k < c.keys.size(); ++k)
        if (c.keys[k] != kLrKey && c.values[k].size() > 1)
            name += (name.empty() ? "" : " ") + c.keys[k] + "=" + value_text(grid[c.keys[k]]);
    return name.empty() ? "base" : name;
}

// The grid's keys in the order the config file lists them: JSON objects are read sorted by name, so
// the file is read once more keeping its order. Keys it does not list (an inline config's, or added
// by --set) follow, sorted.
std::vector<std::string> grid_key_order(const std::string& config_path, const json& grid) {
    std::vector<std::string> order;
    if (!config_path.empty()) {
        std::ifstream in(config_path);
        std::stringstream text;
        text << in.rdbuf();
        const nlohmann::ordered_json file = nlohmann::ordered_json::parse(text.str(), nullptr, false);
        if (!file.is_discarded() && file.is_object() && file.contains("grid") && file["grid"].is_object())
            for (const auto& item : file["grid"].items())
                if (grid.contains(item.key())) order.push_back(item.key());
    }
    for (const auto& item : grid.items())
        if (std::find(order.begin(), order.end(), item.key()) == order.end()) order.push_back(item.key());
    return order;
}

// Checks one grid value against the train schema's type of its key (the bounds are checked when
// each run's config is read); `where` is "<file>: /grid/<key>/<i>".
void check_grid_value(const ConfigKey& k, const json& v, const std::string& where) {
    auto fail = [&](const std::string& expected) {
        throw Error(where + ": expected " + expected + ", found " + brief_json(v));
    };
    switch (k.type) {
        case ConfigType::Integer:
            if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
                fail("an integer");
            break;
        case ConfigType::Number:
            if (!v.is_number()) fail("a number");
            break;
        case ConfigType::Boolean:
            if (!v.is_boolean()) fail("true or false");
            break;
        case ConfigType::String:
        case ConfigType::Path:
        case ConfigType::Device:
            if (!v.is_string()) fail("a string");
            break;
        case ConfigType::IntegerList:
        case ConfigType::NumberList:
        case ConfigType::StringList:
            if (v.is_object() || v.is_null()) fail("a list or a value");
            break;
        case ConfigType::Object:
            if (!v.is_object()) fail("an object");
            break;
        case ConfigType::PathOrObject:
            if (!v.is_object() && !v.is_string()) fail("a path or an object");
            break;
    }
}

// The nearest train key to a misspelled one, for the error message.
std::string nearest_train_key(const std::string& key) {
    std::string best;
    int64_t best_distance = std::numeric_limits<int64_t>::max();
    for (const ConfigKey& k : config_schema("train").keys) {
        const int64_t d = edit_distance(k.path, key);
        if (d < best_distance) best_distance = d, best = k.path;
    }
    return best;
}

// Run `index`'s train config: the base with the run's grid values and seed; train.threads 1 unless
// the base or the grid sets it (the runs go in parallel, each on one thread).
json run_config_of(const SweepConfig& c, int64_t index) {
    size_t seed_at = 0;
    const std::vector<size_t> at = position_of(c, index, seed_at);
    json root = c.base;
    for (size_t k = 0; k < c.keys.size(); ++k)
        root[json::json_pointer(config_schema("train").key(c.keys[k]).pointer())] = c.values[k][at[k]];
    root["seed"] = c.seeds[seed_at];
    if (!root.contains("train") || !root["train"].is_object() || !root["train"].contains("threads"))
        root["train"]["threads"] = 1;
    return root;
}

// The train config file `/base` names, its relative paths beside it.
json read_base_file(const std::string& file, const std::string& path) {
    NL_REQUIRE(fs::is_regular_file(path), file, ": /base: no train config file \"", path, "\"");
    json base = load_json_file(path);
    resolve_paths_beside_config(base, path, {"/data/path", "/model/init_from"});
    return base;
}

SweepConfig read_config(const SweepJob& job) {
    SweepConfig c;
    c.file = job.config_path.empty() ? job.config_name : job.config_path;
    json root = job.config;
    if (!job.config_path.empty()) {
        root = load_json_file(job.config_path);
        resolve_paths_beside_config(root, job.config_path, {"/base"});
    }
    bool base_file_read = false;  // /base named a file, read here already: its paths are resolved
    for (const std::string& assignment : job.overrides) {
        // `--set base.<key>=...` on a base given as a file: the file is read first (its relative
        // paths beside it), so the override lands in the train config it names.
        if (assignment.rfind("base.", 0) == 0 && root.is_object() && root.contains("base") && root["base"].is_string()) {
            root["base"] = read_base_file(c.file, root["base"].get<std::string>());
            base_file_read = true;
        }
        apply_override(root, assignment);
    }
    NL_REQUIRE(root.is_object(), c.file, ": expected a JSON object at the top level, got ", root.type_name());
    ConfigReader r(root, c.file, config_schema("sweep"));
    const json base = r.get_json("base");
    if (base.is_null()) r.fail("base", "required: a train config file or a train config object");
    const json grid = r.get_json("grid");
    c.seeds = r.get_int_list("seeds");
    {
        std::set<int64_t> seen;
        for (int64_t seed : c.seeds)
            if (!seen.insert(seed).second) r.fail("seeds", "lists the value " + std::to_string(seed) + " twice");
    }
    c.diverge_factor = r.get_double("diverge_factor");
    c.plots = r.get_bool("plots");
    c.baseline = r.get_string("baseline");
    r.finish();

    // The base train config, its relative paths beside the file that holds them.
    if (base.is_string()) {
        c.base = read_base_file(c.file, base.get<std::string>());
    } else {
        c.base = base;
        if (!job.config_path.empty() && !base_file_read)
            resolve_paths_beside_config(c.base, job.config_path, {"/data/path", "/model/init_from"});
    }
    NL_REQUIRE(c.base.is_object(), c.file, ": /base: expected a train config object, found ", brief_json(c.base));

    // The grid: train keys, each a non-empty list of distinct values of the key's type.
    const json grid_object = grid.is_null() ? json::object() : grid;
    for (const std::string& key : grid_key_order(job.config_path, grid_object)) {
        const std::string where = c.file + ": /grid/" + key;
        const ConfigKey* k = config_schema("train").find(key);
        NL_REQUIRE(k != nullptr, where, ": not a train config key (did you mean '", nearest_train_key(key),
                   "'? docs/configs.md lists them)");
        NL_REQUIRE(key != "seed", where, ": the seeds are swept by /seeds");
        const json& list = grid_object[key];
        NL_REQUIRE(list.is_array() && !list.empty(), where, ": expected a non-empty list of values, found ",
                   brief_json(list));
        std::vector<json> values;
        for (size_t i = 0; i < list.size(); ++i) {
            check_grid_value(*k, list[i], where + "/" + std::to_string(i));
            NL_REQUIRE(std::find(values.begin(), values.end(), list[i]) == values.end(), where, "/", i,
                       ": lists the value ", brief_json(list[i]), " twice");
            values.push_back(list[i]);
        }
        c.keys.push_back(key);
        c.values.push_back(std::move(values));
    }
    c.resolved = r.resolved();
    c.resolved["base"] = c.base;

    // The baseline names one of the grid's variants, as summary.json names them.
    if (!c.baseline.empty()) {
        std::vector<std::string> names;
        for (int64_t i = 0; i < run_count(c); ++i) {
            const std::string name = variant_name(c, grid_values_of(c, i));
            if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
        }
        if (std::find(names.begin(), names.end(), c.baseline) == names.end()) {
            std::string choices;
            for (const std::string& name : names) choices += (choices.empty() ? "" : ", ") + json(name).dump();
            r.fail("baseline", "expected one of the grid's variants (" + choices + "), found " + json(c.baseline).dump());
        }
    }

    // Every run's train config, read as `normlab train` reads it, before anything is written.
    const int64_t runs = run_count(c);
    for (int64_t i = 0; i < runs; ++i) {
        json config = run_config_of(c, i);
        const std::string name = fmt::format("{}: run {} ({})", c.file, i, run_label(c, i));
        const TrainConfig train = read_train_config(config, name);
        for (const std::string& path : {train.data.path, train.init_from})
            NL_REQUIRE(path.empty() || fs::exists(path), name, ": no file \"", path, "\"");
        c.run_lrs.push_back(train.optim.lr);
        c.run_configs.push_back(std::move(config));
    }
    return c;
}

// ---------------------------------------------------------------------------------------------
// one run
// ---------------------------------------------------------------------------------------------

// A number for a record: JSON has no NaN or Inf, so those are null (read back as NaN).
json number(double x) { return std::isfinite(x) ? json(x) : json(); }
double number_of(const json& value) { return value.is_number() ? value.get<double>() : NAN; }

// Runs run `index` in `dir` step by step: its held-out loss before any update (init_loss: evaluate()
// reads the fixed held-out batches and no generator, so the run's bits are those of `normlab
// train`), then steps until the end or until the train loss is not finite or above diverge_factor x
// init_loss. A diverged run's session ends there, without summary.json.
json run_one(const SweepConfig& c, int64_t index, const std::string& dir) {
    const auto start = std::chrono::steady_clock::now();
    TrainJob train;
    train.config = c.run_configs[static_cast<size_t>(index)];
    train.config_name = "run " + std::to_string(index);
    train.out = dir;
    train.force = true;
    train.nonfinite_loss_is_error = false;
    TrainSession session(train);
    const double init_loss = session.evaluate().loss;
    double final_train = NAN, final_val = NAN;
    std::vector<double> train_losses;  // per step, for loss_spikes
    double max_grad_norm = -INFINITY;  // pre-clip; the first NaN stays
    int64_t diverged_at = 0, probe_step = 0;
    // The last measured value of each probes.csv column: [[name, value], ...]. A row holds the
    // probes (train.probe_every) and the sharpness (train.sharpness_every), each only at its own steps;
    // probe_step is the last step of the probes (of the sharpness where the run has no probes).
    json probes = json::array();
    json attn_max = json::array();     // [[step, max over blocks of attn_score_max.block<i>], ...]
    const LoopConfig& loop = session.config().train;
    const std::vector<std::string>& sharpness = sharpness_columns();
    while (!session.done()) {
        const TrainStep t = session.run_step();
        final_train = t.train_loss;
        train_losses.push_back(t.train_loss);
        if (!std::isnan(max_grad_norm) && !(t.grad_norm <= max_grad_norm)) max_grad_norm = t.grad_norm;
        if (!t.probes.empty()) {
            const bool probed = loop.probe_every > 0 && t.step % loop.probe_every == 0;
            const bool sharp = loop.sharpness_every > 0 && t.step % loop.sharpness_every == 0;
            if (probed || loop.probe_every == 0) probe_step = t.step;
            if (probes.empty())  // every row has every column: the first fixes their order
                for (const auto& [name, value] : t.probes) probes.push_back(json::array({name, nullptr}));
            double m = -INFINITY;
            for (size_t i = 0; i < t.probes.size(); ++i) {
                const auto& [name, value] = t.probes[i];
                const bool of_sharpness = std::find(sharpness.begin(), sharpness.end(), name) != sharpness.end();
                if (of_sharpness ? sharp : probed) probes[i][1] = number(value);
                if (name.rfind("attn_score_max.block", 0) == 0 && !(value <= m)) m = value;  // NaN wins
            }
            if (probed) attn_max.push_back(json::array({t.step, number(m)}));
        }
        if (!std::isfinite(t.train_loss) || t.train_loss > c.diverge_factor * init_loss) {
            diverged_at = t.step;
            break;
        }
    }
    if (diverged_at == 0) final_val = session.finish().summary["val_loss"].get<double>();
    size_t seed_at = 0;
    position_of(c, index, seed_at);  // for the seed: the grid values come from grid_values_of
    return {{"index", index},
            {"grid", grid_values_of(c, index)},
            {"seed", c.seeds[seed_at]},
            {"init_loss", number(init_loss)},
            {"final_train_loss", number(final_train)},
            {"final_val_loss", number(final_val)},
            {"diverged", diverged_at > 0},
            {"diverged_at_step", diverged_at},
            {"loss_spikes", count_loss_spikes(train_losses)},
            {"max_grad_norm", number(max_grad_norm)},
            {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()},
            {"probe_step", probe_step},
            {"probes", probes},
            {"attn_score_max", attn_max}};
}

// ---------------------------------------------------------------------------------------------
// tables
// ---------------------------------------------------------------------------------------------

std::string cell(double x) { return std::isnan(x) ? "" : format_number(x); }

// runs.csv: index, the grid keys, seed, the run's numbers, then its last probes row (probes.csv's
// column names; a column another run has and this one lacks is empty).
void make_table(const SweepConfig& c, const std::vector<json>& records, SweepResult& out) {
    out.columns = {"index"};
    for (const std::string& key : c.keys) out.columns.push_back(key);
    for (const char* column : {"seed", "init_loss", "final_train_loss", "final_val_loss", "diverged",
                               "diverged_at_step", "loss_spikes", "max_grad_norm", "seconds", "probe_step"})
        out.columns.push_back(column);
    const size_t fixed = out.columns.size();
    for (const json& r : records)
        for (const json& probe : r["probes"])
            if (std::find(out.columns.begin() + fixed, out.columns.end(), probe[0].get<std::string>()) == out.columns.end())
                out.columns.push_back(probe[0].get<std::string>());
    for (const json& r : records) {
        std::vector<std::string> row = {std::to_string(r["index"].get<int64_t>())};
        for (const std::string& key : c.keys) row.push_back(value_text(r["grid"][key]));
        row.push_back(std::to_string(r["seed"].get<int64_t>()));
        for (const char* key : {"init_loss", "final_train_loss", "final_val_loss"}) row.push_back(cell(number_of(r[key])));
        row.push_back(r["diverged"].get<bool>() ? "1" : "0");
        row.push_back(std::to_string(r["diverged_at_step"].get<int64_t>()));
        // A record from before these columns (a sweep resumed by a newer normlab) leaves them empty.
        row.push_back(r.contains("loss_spikes") ? std::to_string(r["loss_spikes"].get<int64_t>()) : "");
        row.push_back(cell(number_of(r.value("max_grad_norm", json()))));
        row.push_back(cell(number_of(r["seconds"])));
        row.push_back(std::to_string(r["probe_step"].get<int64_t>()));
        row.resize(out.columns.size());
        for (const json& probe : r["probes"]) {
            const size_t at = std::find(out.columns.begin() + fixed, out.columns.end(), probe[0].get<std::string>()) -
                              out.columns.begin();
            row[at] = cell(number_of(probe[1]));
        }
        out.rows.push_back(std::move(row));
    }
}

// One variant: a grid point without its lr, over its lrs and seeds.
struct Variant {
    json grid;                     // the variant's grid values, optim.lr left out
    std::string name;              // variant_name: "model.qk_norm=head"
    std::vector<const json*> runs;
};

std::vector<Variant> variants_of(const std::vector<json>& records, const SweepConfig& c) {
    std::vector<Variant> variants;
    for (const json& r : records) {
        json grid = r["grid"];
        grid.erase(kLrKey);
        auto it = std::find_if(variants.begin(), variants.end(), [&](const Variant& v) { return v.grid == grid; });
        if (it == variants.end()) it = variants.insert(variants.end(), Variant{grid, variant_name(c, grid), {}});
        it->runs.push_back(&r);
    }
    return variants;
}

// A variant's final val losses as its summary counts them: L_init (the mean init_loss over its runs)
// and, per lr and seed, the run's final val loss, or L_init where the run diverged or its val loss is
// not finite (Wortsman et al. 2023: a run that failed is no better than no training). The lr
// sensitivity, the per-lr means and intervals and the paired differences to the baseline all read
// these, so one rule decides what a failed run counts as.
struct VariantLosses {
    double init_loss = NAN;
    std::map<double, std::map<int64_t, double>> by_lr;  // lr -> seed -> counted final val loss
    std::map<double, int64_t> diverged_by_lr;
    int64_t diverged = 0;
};

VariantLosses losses_of(const Variant& v, const SweepConfig& c) {
    VariantLosses out;
    std::vector<double> inits;
    for (const json* r : v.runs) inits.push_back(number_of((*r)["init_loss"]));
    out.init_loss = sample_mean(inits);
    for (const json* r : v.runs) {
        const double lr = c.run_lrs[static_cast<size_t>((*r)["index"].get<int64_t>())];
        const double val = number_of((*r)["final_val_loss"]);
        const bool diverged = (*r)["diverged"].get<bool>();
        out.by_lr[lr][(*r)["seed"].get<int64_t>()] = diverged || !std::isfinite(val) ? out.init_loss : val;
        out.diverged_by_lr[lr] += diverged;
        out.diverged += diverged;
    }
    return out;
}

// A plotted point: the mean at lr and its 95% interval (NaN without one).
struct CurvePoint {
    double lr = 0.0;
    MeanInterval value;
};

// An interval as summary.json gives it: [lo, hi], null without one (fewer than 2 values).
json interval_json(const MeanInterval& m) {
    return std::isfinite(m.lo) && std::isfinite(m.hi) ? json::array({m.lo, m.hi}) : json();
}

// A variant's summary: lr_sensitivity from the per-lr means of its counted losses, the best lr, the
// divergence rate; per lr (`lrs`) the spread over seeds and (`per_lr`) the mean with its Student-t
// 95% interval over seeds and, given the baseline's losses, the paired differences variant -
// baseline (matched by seed: the seeds both ran at that lr) with their mean and interval.
json variant_json(const Variant& v, const VariantLosses& l, const VariantLosses* baseline, std::vector<CurvePoint>& curve,
                  std::vector<CurvePoint>& diff_curve) {
    json lrs = json::array(), per_lr = json::array();
    std::vector<double> means;
    double best_lr = NAN, best = INFINITY;
    for (const auto& [lr, by_seed] : l.by_lr) {
        std::vector<double> values;
        for (const auto& [seed, loss] : by_seed) values.push_back(loss);
        const MeanInterval m = mean_interval(values);
        means.push_back(m.mean);
        curve.push_back({lr, m});
        if (m.mean < best) best = m.mean, best_lr = lr;
        lrs.push_back({{"lr", lr},
                       {"val_loss_mean", number(m.mean)},
                       {"val_loss_std", number(sample_std(values))},
                       {"val_loss_min", number(*std::min_element(values.begin(), values.end()))},
                       {"val_loss_max", number(*std::max_element(values.begin(), values.end()))},
                       {"seeds", values.size()},
                       {"diverged", l.diverged_by_lr.at(lr)}});
        json entry = {{"lr", lr}, {"final_val_loss_mean", number(m.mean)}, {"final_val_loss_ci95", interval_json(m)}};
        if (baseline != nullptr) {
            std::vector<double> diffs;
            if (auto base = baseline->by_lr.find(lr); base != baseline->by_lr.end())
                for (const auto& [seed, loss] : by_seed)
                    if (auto pair = base->second.find(seed); pair != base->second.end()) diffs.push_back(loss - pair->second);
            const MeanInterval d = mean_interval(diffs);
            if (!diffs.empty()) diff_curve.push_back({lr, d});
            entry["baseline_pairs"] = diffs.size();
            entry["baseline_diff_mean"] = number(d.mean);
            entry["baseline_diff_ci95"] = interval_json(d);
        }
        per_lr.push_back(std::move(entry));
    }
    json runs = json::array();
    for (const json* r : v.runs) runs.push_back((*r)["index"]);
    return {{"name", v.name},
            {"grid", v.grid},
            {"runs", runs},
            {"init_loss", number(l.init_loss)},
            {"lr_sensitivity", number(lr_sensitivity(means, l.init_loss))},
            {"best_lr", number(best_lr)},
            {"best_val_loss", number(best)},
            {"divergence_rate", static_cast<double>(l.diverged) / static_cast<double>(v.runs.size())},
            {"lrs", lrs},
            {"per_lr", per_lr}};
}

// ---------------------------------------------------------------------------------------------
// plots
// ---------------------------------------------------------------------------------------------

// gnuplot's title text: single quotes doubled inside a single-quoted string.
std::string title(const std::string& text) {
    std::string out;
    for (char ch : text) out += ch == '\'' ? std::string("''") : std::string(1, ch);
    return "'" + out + "'";
}

// Variant v's line colour and dash type in every plot (8 colours, then 5 dash types).
std::string variant_color(size_t v) { return fmt::format("lc {}", v % 8 + 1); }
std::string variant_style(size_t v) { return fmt::format(" {} dt {}", variant_color(v), v / 8 % 5 + 1); }

// One curve of a plot: its datablock `$<name>` (lr, mean, and where every point has one, the
// interval's ends) added to `data`, and its plot elements added to `plot`: the interval as a
// translucent band in the line's colour, then the line.
void add_curve(const std::vector<CurvePoint>& points, const std::string& name, size_t v, const std::string& label,
               std::string& data, std::string& plot) {
    const bool band = !points.empty() && std::all_of(points.begin(), points.end(), [](const CurvePoint& p) {
        return std::isfinite(p.value.lo) && std::isfinite(p.value.hi);
    });
    data += fmt::format("${} << EOD\n", name);
    for (const CurvePoint& p : points)
        data += fmt::format("{} {}{}\n", format_number(p.lr), format_number(p.value.mean),
                            band ? fmt::format(" {} {}", format_number(p.value.lo), format_number(p.value.hi)) : "");
    data += "EOD\n";
    auto add = [&plot](const std::string& element) { plot += (plot.empty() ? "plot " : ", \\\n     ") + element; };
    if (band)
        add(fmt::format("${} using 1:3:4 with filledcurves fs transparent solid 0.2 noborder {} notitle", name,
                        variant_color(v)));
    add(fmt::format("${} using 1:2 with linespoints{} title {}", name, variant_style(v), title(label)));
}

// plots.gp with its data inline (datablocks), so it redraws the PNGs anywhere: the final val loss
// vs lr (log x), one line per variant with its 95% interval over seeds as a band (with 2 seeds or
// more); with a baseline, the paired difference to it vs lr, one line and band per other variant;
// the largest attention score (max over blocks) vs step, one line per run at its variant's best lr;
// the residual-stream RMS after each block (the last probed step) vs the block index, one line per
// variant at its best lr, averaged over seeds.
std::string write_plots(const RunDir& run, const SweepConfig& c, const std::vector<Variant>& variants,
                        const json& summary_variants, const std::vector<std::vector<CurvePoint>>& curves,
                        const std::vector<std::vector<CurvePoint>>& diff_curves) {
    std::string data, loss_plot, diff_plot, attn_plot, rms_plot;
    bool any_probes = false;
    for (size_t v = 0; v < variants.size(); ++v) {
        const std::string style = variant_style(v);
        add_curve(curves[v], fmt::format("loss{}", v), v, variants[v].name, data, loss_plot);
        if (!diff_curves[v].empty())
            add_curve(diff_curves[v], fmt::format("diff{}", v), v, variants[v].name + " - " + c.baseline, data, diff_plot);
        const double best_lr = number_of(summary_variants[v]["best_lr"]);
        std::map<int64_t, std::vector<double>> rms;  // block -> (best-lr runs,) residual_rms.block<i>
        bool titled = false;
        for (const json* r : variants[v].runs) {
            if (c.run_lrs[static_cast<size_t>((*r)["index"].get<int64_t>())] != best_lr) continue;
            if ((*r)["attn_score_max"].empty()) continue;
            any_probes = true;
            const int64_t i = (*r)["index"].get<int64_t>();
            data += fmt::format("$attn{} << EOD\n", i);
            for (const json& point : (*r)["attn_score_max"])
                data += std::to_string(point[0].get<int64_t>()) + " " + cell(number_of(point[1])) + "\n";
            data += "EOD\n";
            attn_plot += (attn_plot.empty() ? "plot " : ", \\\n     ") +
                         fmt::format("$attn{} using 1:2 with lines{} {}", i, style,
                                     titled ? "notitle" : "title " + title(variants[v].name));
            titled = true;
            for (const json& probe : (*r)["probes"]) {
                const std::string name = probe[0].get<std::string>();
                if (name.rfind("residual_rms.block", 0) == 0)
                    rms[std::stoll(name.substr(18))].push_back(number_of(probe[1]));
            }
        }
        if (rms.empty()) continue;
        data += fmt::format("$rms{} << EOD\n", v);
        for (const auto& [block, values] : rms) data += std::to_string(block) + " " + cell(sample_mean(values)) + "\n";
        data += "EOD\n";
        rms_plot += (rms_plot.empty() ? "plot " : ", \\\n     ") +
                    fmt::format("$rms{} using 1:2 with linespoints{} title {}", v, style, title(variants[v].name));
    }
    std::string script =
        "# gnuplot script written by normlab sweep: run `gnuplot plots.gp` in this directory\n"
        "set terminal pngcairo size 1200,800 noenhanced\nset key below\nset grid\n" + data;
    std::string drawn = "val_loss_vs_lr.png";
    script += "set output 'val_loss_vs_lr.png'\nset logscale x\nset xlabel 'peak learning rate (optim.lr)'\n"
              "set ylabel 'final validation loss (mean over seeds, band: 95% t interval; diverged = loss at init)'\n" +
              loss_plot + "\n";
    if (!diff_plot.empty()) {
        drawn += ", val_loss_diff_vs_lr.png";
        script += "set output 'val_loss_diff_vs_lr.png'\n"
                  "set ylabel 'final validation loss minus the baseline''s, paired by seed (mean, band: 95% t interval)'\n" +
                  diff_plot + ", \\\n     0 with lines lc 'black' dt 2 notitle\n";
    }
    if (any_probes) {
        drawn += ", attn_score_max.png, residual_rms.png";
        script += "unset logscale x\nset output 'attn_score_max.png'\nset xlabel 'step'\n"
                  "set ylabel 'max attention score q.k/sqrt(d), max over blocks (best lr per variant)'\n" +
                  attn_plot + "\n";
        script += "set output 'residual_rms.png'\nset xlabel 'block'\n"
                  "set ylabel 'residual stream RMS after the block, last probed step (best lr)'\n" + rms_plot + "\n";
    }
    run.write_text("plots.gp", script);
    const std::string probes_note = any_probes ? "" : " (no probes: set train.probe_every for the attention and RMS plots)";
    if (!c.plots) return "plots disabled (plots = false); plots.gp can draw them" + probes_note;
    const std::string failed = run_gnuplot(run.dir());
    if (!failed.empty()) return failed + ": no PNG plots; plots.gp draws them" + probes_note;
    return drawn + probes_note;
}

std::string describe(const SweepConfig& c, const GridRunner& grid, const std::string& dir) {
    std::string shape;
    for (size_t k = 0; k < c.keys.size(); ++k) shape += fmt::format("{} {} x ", c.keys[k], c.values[k].size());
    const std::string shard = grid.shards > 1 ? fmt::format(", shard {}/{}: {} of them", grid.shard, grid.shards,
                                                            shard_runs(grid).size())
                                              : "";
    return fmt::format("{} runs ({}seeds {}){}, {} at once{} -> {}", run_count(c), shape, c.seeds.size(), shard,
                       grid.jobs, dist::world_size() > 1 ? fmt::format(" on each of {}", dist::describe()) : "", dir);
}

std::string table_of(const json& variants) {
    std::string out = fmt::format("{:<40} {:>12} {:>14} {:>14} {:>10}\n", "variant", "best lr", "best val loss",
                                  "lr sensitivity", "diverged");
    for (const json& v : variants)
        out += fmt::format("{:<40} {:>12.4g} {:>14.6g} {:>14.6g} {:>9.0f}%\n", v["name"].get<std::string>(),
                           number_of(v["best_lr"]), number_of(v["best_val_loss"]), number_of(v["lr_sensitivity"]),
                           100.0 * v["divergence_rate"].get<double>());
    return out;
}

// A shard's sweep directory, shared with the sweep's other shards, which may be running at the same
// moment on other machines. So it is not locked (RunDir's lock would shut the other shards out; each
// run's own directory is still locked by its train job) and nothing in it is removed. The first
// shard to come writes config.json (atomically, and every shard of the sweep writes the same
// config); the others check theirs against it, as --resume does.
void join_shared_sweep_dir(const std::string& out, const json& resolved) {
    std::error_code ec;
    const std::string config = out + "/config.json";
    if (fs::exists(out, ec)) {
        NL_REQUIRE(fs::is_directory(out, ec), "--shard: ", out, ": exists and is not a directory");
        if (!fs::exists(config, ec))
            for (const auto& entry : fs::directory_iterator(out, ec))
                // Another shard may be writing config.json (its temporary file) right now.
                NL_REQUIRE(entry.path().filename().string().rfind("config.json", 0) == 0, "--shard: ", out,
                           " is not empty and holds no sweep (no config.json); the shards of a sweep share a "
                           "directory that only they write");
    }
    fs::create_directories(out, ec);
    NL_REQUIRE(!ec, "--shard: ", out, ": cannot create the sweep directory: ", ec.message());
    if (!fs::exists(config, ec)) write_file_atomic(config, resolved.dump(2) + "\n");
    require_resumable(out, resolved, "sweep", "--shard");
    fs::create_directories(out + "/runs");
}

}  // namespace

SweepShard parse_shard(const std::string& text) {
    SweepShard shard;
    const size_t slash = text.find('/');
    auto integer = [](std::string_view digits, int64_t& value) {
        const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        return !digits.empty() && error == std::errc() && end == digits.data() + digits.size();
    };
    const bool ok = slash != std::string::npos && integer(std::string_view(text).substr(0, slash), shard.index) &&
                    integer(std::string_view(text).substr(slash + 1), shard.count) && shard.count >= 1 &&
                    shard.index >= 0 && shard.index < shard.count;
    NL_REQUIRE(ok, "sweep: --shard: expected K/N, integers with N >= 1 and 0 <= K < N (K counts from 0), found \"",
               text, "\"");
    return shard;
}

int64_t count_loss_spikes(const std::vector<double>& losses) {
    int64_t spikes = 0;
    std::vector<double> window(kLossSpikeWindow);
    for (size_t i = kLossSpikeWindow; i < losses.size(); ++i) {
        std::copy(losses.begin() + static_cast<std::ptrdiff_t>(i - kLossSpikeWindow),
                  losses.begin() + static_cast<std::ptrdiff_t>(i), window.begin());
        // NaN sorts as +Inf (std::sort needs a strict order); a window holding it has a large median.
        for (double& x : window)
            if (std::isnan(x)) x = INFINITY;
        std::sort(window.begin(), window.end());
        const size_t n = window.size();
        const double median = n % 2 == 1 ? window[n / 2] : 0.5 * (window[n / 2 - 1] + window[n / 2]);
        spikes += !(losses[i] <= kLossSpikeFactor * median);  // a NaN loss is a spike
    }
    return spikes;
}

double lr_sensitivity(const std::vector<double>& losses, double init_loss) {
    if (losses.empty()) return NAN;
    const double best = *std::min_element(losses.begin(), losses.end());
    double sum = 0.0;
    for (double loss : losses) sum += std::min(loss, init_loss) - best;
    return sum / static_cast<double>(losses.size());
}

SweepResult run_sweep(const SweepJob& job, const SweepCallbacks& callbacks) {
    NL_REQUIRE(!job.resume || !job.out.empty(), "sweep: --resume needs --out naming the sweep directory");
    NL_REQUIRE(!(job.resume && job.force), "sweep: --resume and --force cannot be combined");
    NL_REQUIRE(job.jobs >= 0, "sweep: --jobs must be >= 0, found ", job.jobs);
    const SweepShard shard = job.shard.empty() ? SweepShard{} : parse_shard(job.shard);
    const bool sharded = !job.shard.empty();
    NL_REQUIRE(!sharded || !job.out.empty(), "sweep: --shard needs --out naming the sweep directory the shards share");
    NL_REQUIRE(!sharded || !job.force, "sweep: --shard and --force cannot be combined (a shard would delete the "
                                       "other shards' runs)");
    SweepConfig c;
    std::optional<RunDir> run;  // rank 0's; none for a shard, which writes no tables
    dist::run_on_every_rank([&] {
        c = read_config(job);
        if (!dist::is_root()) return;
        if (sharded) return join_shared_sweep_dir(job.out, c.resolved);
        if (job.resume) require_resumable(job.out, c.resolved, "sweep");
        run = RunDir::create(job.config_path.empty() ? job.config_name : job.config_path, job.out, job.force, job.resume);
        if (!job.resume) {
            // A forced sweep starts over: runs of the sweep it replaces must not be read back.
            std::error_code ec;
            fs::remove_all(run->path("runs"), ec);
            fs::remove(run->path("summary.json"), ec);
            run->write_json("config.json", c.resolved);
        }
        fs::create_directories(run->path("runs"));
    });
    const std::string dir = dist::broadcast_string(run ? run->dir() : sharded ? job.out : std::string());
    const auto start = std::chrono::steady_clock::now();
    try {
        const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        GridRunner grid;
        grid.dir = dir;
        grid.runs = run_count(c);
        grid.jobs = job.jobs > 0 ? job.jobs : std::max(1, cores / std::max(1, dist::world_size()));
        grid.resume = job.resume;
        grid.shard = shard.index;
        grid.shards = shard.count;
        const std::vector<int64_t> in_shard = shard_runs(grid), on_rank = rank_runs(grid);
        int64_t mine = static_cast<int64_t>(on_rank.size()), resumed = 0, resumed_total = 0, done = 0;
        if (job.resume) {
            for (int64_t i : finished_runs(grid)) {
                resumed += std::binary_search(on_rank.begin(), on_rank.end(), i);
                resumed_total += dist::is_root() && std::binary_search(in_shard.begin(), in_shard.end(), i);
            }
            mine -= resumed;
        }
        if (callbacks.on_start)
            callbacks.on_start({dist::is_root() ? describe(c, grid, dir) : std::string(), grid.runs, resumed, mine});
        grid.run = [&](int64_t index, const std::string& run_dir) { return run_one(c, index, run_dir); };
        const int rank = dist::rank(), world_size = dist::world_size();  // the runs' threads see a world of one
        grid.on_done = [&](int64_t index, const json& r) {
            ++done;
            if (callbacks.on_run)
                callbacks.on_run({index, run_label(c, index), r["diverged"].get<bool>(), r["diverged_at_step"].get<int64_t>(),
                                  number_of(r["final_val_loss"]), number_of(r["seconds"]), done, mine, rank, world_size});
        };
        const std::vector<json> records = run_grid(grid);
        if (!dist::is_root()) return {};

        SweepResult out;
        out.run_dir = dir;
        out.shard_runs = static_cast<int64_t>(in_shard.size());
        if (sharded) return out;  // the tables need every shard's runs: a --resume afterwards writes them
        make_table(c, records, out);
        CsvWriter csv(run->path("runs.csv"), out.columns);
        for (const auto& row : out.rows) csv.row(row);
        const std::vector<Variant> variants = variants_of(records, c);
        std::vector<VariantLosses> losses;
        const VariantLosses* baseline = nullptr;
        for (const Variant& v : variants) losses.push_back(losses_of(v, c));
        for (size_t v = 0; v < variants.size(); ++v)
            if (variants[v].name == c.baseline) baseline = &losses[v];
        json variant_rows = json::array();
        std::vector<std::vector<CurvePoint>> curves(variants.size()), diff_curves(variants.size());
        for (size_t v = 0; v < variants.size(); ++v)
            variant_rows.push_back(variant_json(variants[v], losses[v], &losses[v] == baseline ? nullptr : baseline,
                                                curves[v], diff_curves[v]));
        out.plots = write_plots(*run, c, variants, variant_rows, curves, diff_curves);
        out.table = table_of(variant_rows);
        int64_t diverged = 0;
        for (const json& r : records) diverged += r["diverged"].get<bool>();
        out.summary = json{{"job", "sweep"},
                           {"config", job.config_path.empty() ? job.config_name : job.config_path},
                           {"runs", grid.runs},
                           {"grid_keys", c.keys},
                           {"seeds", c.seeds},
                           {"lr_key", kLrKey},
                           {"diverge_factor", c.diverge_factor},
                           {"diverged_runs", diverged},
                           {"baseline", c.baseline.empty() ? json() : json(c.baseline)},
                           {"variants", variant_rows},
                           {"plots", out.plots},
                           {"resumed_runs", resumed_total},
                           {"jobs", grid.jobs},
                           {"world_size", dist::world_size()},
                           {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}};
        run->write_summary(out.summary);
        return out;
    } catch (const std::exception& e) {
        if (run) run->write_error(e.what());
        throw;
    }
}

}  // namespace nl
