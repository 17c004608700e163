// The analyze job (jobs/analyze.h): inputs checked before the weights are read, the windows run one
// at a time with every block's attention probed, then the same windows with each block skipped.
#include "jobs/analyze.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "jobs/config.h"
#include "jobs/convert.h"
#include "jobs/data.h"
#include "jobs/interop.h"
#include "jobs/run_dir.h"
#include "jobs/sample.h"
#include "layers/loss.h"
#include "layers/norms.h"

namespace nl {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int64_t kTopChannels = 5;  // a norm weight's channels listed by |weight|

void check_options(const AnalyzeOptions& o) {
    NL_REQUIRE(!o.model.empty(), "analyze: no model given (a checkpoint, run directory, transformers directory or GGUF file)");
    NL_REQUIRE(o.tokens.empty() != o.text.empty(), "analyze: give exactly one of --tokens DIR and --text FILE, got ",
               o.tokens.empty() ? "neither" : "both");
    NL_REQUIRE(o.windows >= 1 && o.windows <= kMaxAnalyzeWindows, "analyze: --windows must be in [1, ", kMaxAnalyzeWindows,
               "], got ", o.windows);
    NL_REQUIRE(o.seq_len == 0 || o.seq_len >= 2, "analyze: --seq-len must be at least 2 (the attention sink is read at "
               "positions >= 1) or 0 for the model's context, got ", o.seq_len);
    NL_REQUIRE(o.dtype == "f32" || o.dtype == "bf16" || o.dtype == "f64", "analyze: --dtype must be f32, bf16 or f64, got '",
               o.dtype, "'");
    NL_REQUIRE(o.token_dtype.empty() || o.text.empty(), "analyze: --token-dtype is for --tokens, not --text");
    NL_REQUIRE(o.token_dtype.empty() || o.token_dtype == "uint16" || o.token_dtype == "uint32",
               "analyze: --token-dtype must be uint16 or uint32, got '", o.token_dtype, "'");
    std::error_code ec;
    NL_REQUIRE(o.out.empty() || o.force || !fs::exists(fs::symlink_status(o.out, ec)), "analyze: ", o.out,
               " exists (--force replaces it)");
}

// The bytes per id of <dir>/val.bin: the option, else meta.json's "dtype" (python -m
// normlab.data.tokenize writes it), else by the vocabulary's size.
int64_t token_width(const AnalyzeOptions& o, int64_t vocab_size) {
    if (!o.token_dtype.empty()) return token_dtype_bytes(o.token_dtype);
    const fs::path meta = fs::path(o.tokens) / "meta.json";
    std::error_code ec;
    if (fs::is_regular_file(meta, ec)) {
        const json m = load_json_file(meta.string());
        NL_REQUIRE(m.is_object() && m.contains("dtype") && m["dtype"].is_string(), meta.string(),
                   ": /dtype: expected \"uint16\" or \"uint32\" (or give --token-dtype)");
        return token_dtype_bytes(m["dtype"].get<std::string>());
    }
    return vocab_size <= 65536 ? 2 : 4;
}

// The first `count` ids of <dir>/val.bin, `width` bytes each, little-endian; only those bytes are read.
std::vector<int64_t> read_val_ids(const std::string& dir, int64_t width, int64_t count, int64_t vocab_size,
                                  const std::string& shape_hint) {
    const fs::path path = fs::path(dir) / "val.bin";
    std::error_code ec;
    NL_REQUIRE(fs::is_directory(dir, ec), "analyze: --tokens ", dir, ": not a directory (expected one holding val.bin)");
    NL_REQUIRE(fs::is_regular_file(path, ec), "analyze: ", path.string(), ": missing (--tokens names a directory holding "
               "nanoGPT's val.bin)");
    const uintmax_t bytes = fs::file_size(path, ec);
    NL_REQUIRE(!ec && bytes % static_cast<uintmax_t>(width) == 0, path.string(), ": ", bytes,
               " bytes is not a whole number of ", width, "-byte ids (--token-dtype uint", 8 * width, ")");
    const int64_t held = static_cast<int64_t>(bytes / static_cast<uintmax_t>(width));
    NL_REQUIRE(held >= count, path.string(), ": ", shape_hint, " need ", count, " ids, the file holds ", held,
               " (lower --windows or --seq-len)");
    std::ifstream in(path, std::ios::binary);
    std::vector<unsigned char> raw(static_cast<size_t>(count * width));  // (count * width,) bytes
    in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
    NL_REQUIRE(in.good(), path.string(), ": read failed");
    std::vector<int64_t> ids(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
        uint64_t id = 0;
        for (int64_t b = width - 1; b >= 0; --b) id = id << 8 | raw[static_cast<size_t>(i * width + b)];
        NL_REQUIRE(static_cast<int64_t>(id) < vocab_size, path.string(), ": id ", id, " at index ", i,
                   " is beyond the model's vocabulary (vocab_size ", vocab_size, "; wrong --token-dtype?)");
        ids[static_cast<size_t>(i)] = static_cast<int64_t>(id);
    }
    return ids;
}

// The first `count` characters of a UTF-8 text file as the ids of a character vocabulary.
std::vector<int64_t> read_text_ids(const std::string& path, const std::vector<uint32_t>& codepoints, int64_t count,
                                   const std::string& shape_hint) {
    NL_REQUIRE(!codepoints.empty(), "analyze: --text needs a model with a character tokenizer normlab reads (a normlab "
               "text model, or an export of one); this model's ids are not characters: give --tokens DIR");
    std::error_code ec;
    NL_REQUIRE(fs::is_regular_file(path, ec), "analyze: --text ", path, ": not a file");
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::vector<uint32_t> text = decode_utf8(bytes, path);
    NL_REQUIRE(static_cast<int64_t>(text.size()) >= count, path, ": ", shape_hint, " need ", count,
               " characters, the file holds ", text.size(), " (lower --windows or --seq-len)");
    std::map<uint32_t, int64_t> id_of;
    for (size_t i = 0; i < codepoints.size(); ++i) id_of.emplace(codepoints[i], static_cast<int64_t>(i));
    std::vector<int64_t> ids(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
        auto it = id_of.find(text[static_cast<size_t>(i)]);
        NL_REQUIRE(it != id_of.end(), path, ": character '", encode_utf8({text[static_cast<size_t>(i)]}), "' at ", i,
                   " is not in the model's vocabulary (", codepoints.size(), " characters)");
        ids[static_cast<size_t>(i)] = it->second;
    }
    return ids;
}

// Sum over rows of the cross-entropy of logits (1, T, V) at targets (1, T), computed in at least f32.
double loss_sum(const Var& logits, const Tensor& targets) {
    const Var l = logits.dtype() == DType::F64 ? logits : Var(logits.data().to(DType::F32));
    return cross_entropy_loss(l, targets, -100, Reduction::Sum).item();
}

// One norm's weight: max and mean |w| and the channels of the largest |w| (ties: the lower index).
json norm_weight_stats(const std::string& name, const Norm& norm) {
    const Tensor w = norm.parameter("weight").data().to(DType::F64).contiguous();
    const double* p = w.data<double>();
    const int64_t n = w.numel();
    std::vector<int64_t> order(static_cast<size_t>(n));  // (n,) channel indices
    double max_abs = 0.0, sum_abs = 0.0;
    for (int64_t j = 0; j < n; ++j) {
        order[static_cast<size_t>(j)] = j;
        max_abs = std::max(max_abs, std::abs(p[j]));
        sum_abs += std::abs(p[j]);
    }
    const int64_t top = std::min(kTopChannels, n);
    std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int64_t a, int64_t b) {
        return std::abs(p[a]) != std::abs(p[b]) ? std::abs(p[a]) > std::abs(p[b]) : a < b;
    });
    order.resize(static_cast<size_t>(top));
    return {{"name", name}, {"type", norm.options().type}, {"channels", n}, {"weight_max_abs", max_abs},
            {"weight_mean_abs", n > 0 ? sum_abs / static_cast<double>(n) : 0.0}, {"weight_top_channels", order}};
}

DType dtype_of(const std::string& name) {
    return name == "bf16" ? DType::BF16 : name == "f64" ? DType::F64 : DType::F32;
}

// plots.gp: act_max and act_kurtosis by block, drop_delta_loss by block, a block x head heatmap of
// attn_sink. Data inline, so it redraws anywhere.
std::string plots_script(const json& analysis) {
    std::string layers = "$layers << EOD\n", sink = "$sink << EOD\n";
    for (const json& l : analysis["layers"]) {
        layers += fmt::format("{} {:.17g} {:.17g} {:.17g}\n", l["layer"].get<int64_t>(), l["act_max"].get<double>(),
                              l["act_kurtosis"].get<double>(), l["drop_delta_loss"].get<double>());
        std::string row;
        for (const json& v : l["attn_sink"]) {
            if (!row.empty()) row += ' ';
            row += fmt::format("{:.17g}", v.is_null() ? 0.0 : v.get<double>());
        }
        sink += row + "\n";
    }
    layers += "EOD\n";
    sink += "EOD\n";
    const std::string model = analysis["model"].get<std::string>();
    std::string title = fs::path(model).filename().string();
    if (title.empty()) title = model;
    std::replace(title.begin(), title.end(), '\'', '`');
    return "# gnuplot script written by normlab analyze: run `gnuplot plots.gp` in this directory\n"
           "set terminal pngcairo size 1000,650 noenhanced\nset grid\nset key top left\n" + layers + sink +
           "set title '" + title + "'\nset xlabel 'block'\n" + (analysis["layers"].size() <= 40 ? "set xtics 1\n" : "") +
           "set output 'act_max.png'\nset logscale y\n"
           "set ylabel 'largest |h| of the residual stream after the block'\n"
           "plot $layers using 1:2 with linespoints pt 7 title 'act_max'\nunset logscale y\n"
           "set output 'act_kurtosis.png'\n"
           "set ylabel 'kurtosis of the channels'' RMS, mean(s^4)/mean(s^2)^2'\n"
           "plot $layers using 1:3 with linespoints pt 7 title 'act_kurtosis', 1 with lines dt 2 lc 'black' "
           "title 'all channels alike'\n"
           "set output 'drop_block.png'\nset style fill solid 0.5\nset boxwidth 0.7\n"
           "set ylabel 'loss with the block skipped minus the loss (nats)'\n"
           "plot $layers using 1:4 with boxes title 'drop_delta_loss'\n"
           "set output 'attn_sink.png'\nunset grid\nset xlabel 'query head'\nset ylabel 'block'\n"
           "set cblabel 'attention on token 0 (mean over queries at positions >= 1)'\nset cbrange [0:1]\n"
           "set palette rgb 33,13,10\nset autoscale fix\n"
           "plot $sink matrix with image notitle\n";
}

// `out` replaced by the directory `tmp` (everything written there first): a reader sees the old
// directory or the new one, never half of one.
void move_dir_into_place(const fs::path& tmp, const fs::path& out) {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(out, ec))) {
        fs::remove_all(out, ec);
        NL_REQUIRE(!ec, out.string(), ": cannot replace it: ", ec.message());
    }
    fs::rename(tmp, out, ec);
    NL_REQUIRE(!ec, out.string(), ": cannot move the analysis into place: ", ec.message());
}

}  // namespace

json analyze_windows(Transformer& model, const std::vector<std::vector<int64_t>>& windows, Transformer* converted) {
    NL_REQUIRE(!windows.empty() && windows[0].size() >= 3, "analyze: expected windows of at least 3 ids");
    NoGradGuard no_grad;
    const int64_t L = model.n_layers(), D = model.options().dim, N = static_cast<int64_t>(windows.size());
    const int64_t T = static_cast<int64_t>(windows[0].size()) - 1;
    const int64_t H = model.options().n_heads;
    struct LayerStats {
        double act_max = -1.0;
        int64_t act_max_channel = 0;
        std::vector<double> channel_sq;          // (D,) sum over windows and positions of h_j^2
        std::vector<double> sink, entropy;       // (H,) sums over windows of the per-window head means
        double drop_loss = 0.0;                  // summed over every window's targets
    };
    std::vector<LayerStats> stats(static_cast<size_t>(L));
    for (LayerStats& s : stats) {
        s.channel_sq.assign(static_cast<size_t>(D), 0.0);
        s.sink.assign(static_cast<size_t>(H), 0.0);
        s.entropy.assign(static_cast<size_t>(H), 0.0);
    }
    double loss = 0.0, converted_loss = 0.0, max_logit_diff = 0.0, max_logit = 0.0;
    double probed_seconds = 0.0, drop_seconds = 0.0;
    using Clock = std::chrono::steady_clock;
    for (const std::vector<int64_t>& window : windows) {
        const auto probed_start = Clock::now();
        NL_REQUIRE(static_cast<int64_t>(window.size()) == T + 1, "analyze: windows differ in length");
        const Tensor ids = from_vector(std::vector<int64_t>(window.begin(), window.end() - 1), {1, T});
        const Tensor targets = from_vector(std::vector<int64_t>(window.begin() + 1, window.end()), {1, T});
        std::vector<Var> inputs;  // (L,) each block's input (1, T, D), for the drop-one-block runs
        Var h = model.embed(ids);
        for (int64_t l = 0; l < L; ++l) {
            inputs.push_back(h);
            const auto block = model.layer(l);
            block->attention()->set_probing(true);
            h = block->forward(h);
            block->attention()->set_probing(false);
            LayerStats& s = stats[static_cast<size_t>(l)];
            const AttentionProbe& probe = block->attention()->last_probe();
            for (int64_t k = 0; k < H; ++k) {
                s.sink[static_cast<size_t>(k)] += probe.sink_by_head[static_cast<size_t>(k)];
                s.entropy[static_cast<size_t>(k)] += probe.entropy_by_head[static_cast<size_t>(k)];
            }
            const Tensor x = h.data().to(DType::F64).contiguous();  // (1, T, D)
            const double* p = x.data<double>();
            for (int64_t t = 0; t < T; ++t)
                for (int64_t j = 0; j < D; ++j) {
                    const double v = p[t * D + j];
                    if (std::abs(v) > s.act_max) {
                        s.act_max = std::abs(v);
                        s.act_max_channel = j;
                    }
                    s.channel_sq[static_cast<size_t>(j)] += v * v;
                }
        }
        const Var logits = model.logits(h);  // (1, T, V)
        loss += loss_sum(logits, targets);
        if (converted != nullptr) {
            const Var c = converted->forward(ids);
            converted_loss += loss_sum(c, targets);
            const Tensor a = logits.data().to(DType::F64), b = c.data().to(DType::F64);
            max_logit_diff = std::max(max_logit_diff, max(abs(a - b)).item());
            max_logit = std::max(max_logit, max(abs(a)).item());
        }
        const auto drop_start = Clock::now();
        probed_seconds += std::chrono::duration<double>(drop_start - probed_start).count();
        for (int64_t l = 0; l < L; ++l) {
            Var x = inputs[static_cast<size_t>(l)];  // block l skipped: its output is its input
            for (int64_t m = l + 1; m < L; ++m) x = model.layer(m)->forward(x);
            stats[static_cast<size_t>(l)].drop_loss += loss_sum(model.logits(x), targets);
        }
        drop_seconds += std::chrono::duration<double>(Clock::now() - drop_start).count();
    }
    const double targets_total = static_cast<double>(N * T);
    json out;
    out["loss"] = loss / targets_total;
    out["layers"] = json::array();
    for (int64_t l = 0; l < L; ++l) {
        const LayerStats& s = stats[static_cast<size_t>(l)];
        double s2 = 0.0, s4 = 0.0;  // means over channels of s_j^2 and s_j^4
        for (double sq : s.channel_sq) {
            const double ms = sq / targets_total;  // s_j^2: channel j's mean square
            s2 += ms / static_cast<double>(D);
            s4 += ms * ms / static_cast<double>(D);
        }
        json sink = json::array(), entropy = json::array();
        for (int64_t k = 0; k < H; ++k) {
            sink.push_back(s.sink[static_cast<size_t>(k)] / static_cast<double>(N));
            entropy.push_back(s.entropy[static_cast<size_t>(k)] / static_cast<double>(N));
        }
        out["layers"].push_back({{"layer", l},
                                 {"act_max", s.act_max},
                                 {"act_max_channel", s.act_max_channel},
                                 {"act_kurtosis", s2 > 0.0 ? s4 / (s2 * s2) : 0.0},
                                 {"attn_sink", sink},
                                 {"attn_entropy", entropy},
                                 {"drop_delta_loss", s.drop_loss / targets_total - loss / targets_total}});
    }
    out["norms"] = json::array();
    for (const auto& [name, module] : model.named_modules()) {
        const auto* norm = dynamic_cast<const Norm*>(module);
        if (norm != nullptr && norm->has_parameter("weight")) out["norms"].push_back(norm_weight_stats(name, *norm));
    }
    out["timing"] = {{"probed_forward_s", probed_seconds}, {"drop_blocks_s", drop_seconds}};
    if (converted != nullptr)
        out["convert_check"] = {{"max_abs_logit_diff", max_logit_diff},
                                {"max_abs_logit", max_logit},
                                {"loss_rmsnorm", converted_loss / targets_total},
                                {"loss_diff", (converted_loss - loss) / targets_total}};
    return out;
}

AnalyzeResult run_analyze(const AnalyzeOptions& o) {
    const auto start = std::chrono::steady_clock::now();
    check_options(o);
    // What the model says of itself, without its weights.
    TrainCheckpoint described = load_train_checkpoint(o.model, false);
    const TransformerOptions& arch = described.config.model;
    const int64_t T = o.seq_len > 0 ? o.seq_len : std::min<int64_t>(described.context, kDefaultAnalyzeSeqLen);
    NL_REQUIRE(T >= 2, "analyze: the model's context (", described.context, ") is below 2 positions");
    NL_REQUIRE(T <= arch.max_seq_len, "analyze: --seq-len ", T, " exceeds the model's max_seq_len ", arch.max_seq_len);
    if (o.convert_check) check_convertible_to_rmsnorm(arch);
    const int64_t count = o.windows * (T + 1);
    const std::string shape_hint = fmt::format("{} windows of {} + 1 tokens", o.windows, T);
    const std::vector<int64_t> stream =
        o.text.empty() ? read_val_ids(o.tokens, token_width(o, arch.vocab_size), count, arch.vocab_size, shape_hint)
                       : read_text_ids(o.text, described.vocab ? described.vocab->codepoints() : std::vector<uint32_t>{},
                                       count, shape_hint);
    // Activations: each block's input kept for the drop runs, the logits, the probe's (H, T, T) scores.
    const double activations = 8.0 * (static_cast<double>(arch.n_layers + 4) * T * arch.dim +
                                      2.0 * T * static_cast<double>(arch.vocab_size) +
                                      static_cast<double>(arch.n_heads) * T * T);
    require_memory(activations * (o.convert_check ? 2.0 : 1.0), "analyze: the activations of one window (--seq-len)");

    const auto load_start = std::chrono::steady_clock::now();
    TrainCheckpoint loaded = load_train_checkpoint(o.model, true);
    std::unique_ptr<Transformer> converted;
    if (o.convert_check) converted = convert_to_rmsnorm(*loaded.model);
    const DType dtype = dtype_of(o.dtype);
    if (dtype != DType::F32) {
        loaded.model->to(dtype);
        if (converted) converted->to(dtype);
    }
    std::vector<std::vector<int64_t>> windows;
    for (int64_t w = 0; w < o.windows; ++w)
        windows.emplace_back(stream.begin() + w * (T + 1), stream.begin() + (w + 1) * (T + 1));

    json analysis;
    analysis["model"] = loaded.path;
    analysis["format"] = is_pretrained_model(o.model) ? (fs::is_directory(o.model) ? "hf" : "gguf") : "normlab";
    analysis["tokens"] = o.text.empty() ? (fs::path(o.tokens) / "val.bin").string() : o.text;
    analysis["windows"] = o.windows;
    analysis["seq_len"] = T;
    analysis["dtype"] = o.dtype;
    analysis["architecture"] = {{"dim", arch.dim},
                                {"n_layers", arch.n_layers},
                                {"n_heads", arch.n_heads},
                                {"n_kv_heads", arch.n_kv_heads > 0 ? arch.n_kv_heads : arch.n_heads},
                                {"head_dim", arch.head_size()},
                                {"vocab_size", arch.vocab_size},
                                {"norm", arch.norm.type},
                                {"norm_placement", arch.norm_placement},
                                {"qk_norm", arch.qk_norm},
                                {"parameters", count_parameters(*loaded.model)}};
    const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    analysis.update(analyze_windows(*loaded.model, windows, converted.get()));
    analysis["timing"]["load_s"] = load_seconds;
    analysis["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    AnalyzeResult result;
    result.analysis = analysis;
    if (o.out.empty()) {
        result.plots = "none (no output directory)";
        return result;
    }
    const fs::path out = o.out;
    NL_REQUIRE(o.force || !fs::exists(fs::symlink_status(out)), "analyze: ", o.out, " exists (--force replaces it)");
    if (out.has_parent_path()) fs::create_directories(out.parent_path());
    const fs::path tmp = out.string() + ".tmp." + std::to_string(::getpid());
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directory(tmp);
    try {
        write_file_atomic((tmp / "analysis.json").string(), analysis.dump(1) + "\n");
        write_file_atomic((tmp / "plots.gp").string(), plots_script(analysis));
        const std::string failed = run_gnuplot(tmp.string());
        result.plots = failed.empty() ? "act_max.png, act_kurtosis.png, drop_block.png, attn_sink.png"
                                      : failed + ": no PNG plots; plots.gp draws them";
        move_dir_into_place(tmp, out);
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
    result.out = out.string();
    return result;
}

}  // namespace nl
