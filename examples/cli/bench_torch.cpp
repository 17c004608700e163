// `normlab bench torch`: normlab against PyTorch on the same device (CPU by default, or a GPU with
// --device cuda[:N]), same machine, same thread count, one run.
// Times normlab's stability experiment (the seed article's SimpleModel, 1000x100 full batch, Adam,
// MSE; seconds per epoch, LayerNorm and RMSNorm) and toy transformer training steps (the model of
// configs/toy_transformer.json, AdamW + grad clipping on random tokens; tokens per second), then runs
// examples/cli/torch_bench.py --json with the same sizes and device and prints both sides and their
// ratios. PyTorch's transformer is timed with LLaMA's attention (matmul + mask + softmax) and with
// F.scaled_dot_product_attention (nanoGPT's), and normlab is set beside the faster of the two.
// Without python3 + torch the PyTorch side is skipped and the reason printed. On a GPU the model,
// data and optimizer state live there and every timed epoch/step ends with a device synchronize, so
// the time is the kernels', not their launches.
// "torch / normlab" above 1 means normlab is the faster of the two.
#include "examples/cli/commands.h"

#include <cblas.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "autograd/autograd.h"
#include "core/cpu_runtime.h"
#include "core/thread_governor.h"
#include "core/profiler.h"
#include "examples/cli/bench_util.h"
#include "jobs/config.h"
#include "jobs/data.h"
#include "jobs/train.h"
#include "layers/activation.h"
#include "layers/autocast.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/norms.h"
#include "layers/transformer.h"
#include "optim/adam.h"
#include "optim/clip.h"

namespace nl::cli {

namespace {

struct TorchCommand {
    std::string config = "configs/toy_transformer.json";
    std::string script = "examples/cli/torch_bench.py";
    std::string python = "python3";
    std::string device = "cpu";  // "cpu", "cuda" or "cuda:N"
    int64_t threads = 0;   // 0: OpenMP's default
    int64_t epochs = 100;  // timed stability epochs per norm (the experiment's length)
    int64_t steps = 30;    // timed transformer steps
    int64_t warmup = 3;    // untimed epochs/steps first, on both sides
    int64_t rounds = 3;    // normlab then PyTorch, this many times: a ratio per round, then their median
    double target = 1.0;   // the transformer's ratio (ours / theirs) that the confidence interval is held against
    bool quick = false;
    bool skip_torch = false;
    bool profile = false;  // after the rounds, one more profiled pass of normlab's transformer steps
    bool load = false;     // after the rounds, the transformer again with a busy loop beside it
    std::vector<std::string> overrides;  // --set key.path=value on the config, as train's
    std::string autocast = "none";       // --autocast: "bf16" sets train.autocast for both sides
};

// The toy transformer and its training step, as resolved from the config (both sides use these).
struct ToySpec {
    TransformerOptions model;
    int64_t seq_len = 0;  // model input length T
    int64_t batch = 0;
    double lr = 1e-3, weight_decay = 0.0, grad_clip = 1.0;
    bool autocast = false;  // train.autocast "bf16": both sides' forwards under bf16 autocast
    std::string source;   // where the values came from, for the printout
};

// The toy transformer, batch and optimizer settings of a train config, read by the train job's own
// validated reader (read_train_config): the same keys, checks, defaults and error messages as
// `normlab train`. The config's "device" is not used: --device decides where both sides run.
ToySpec resolve_toy_spec(const std::string& path, const std::vector<std::string>& overrides) {
    json root = load_json_file(path);
    resolve_paths_beside_config(root, path, {"/data/path"});  // as train does
    for (const std::string& assignment : overrides) apply_override(root, assignment);
    TrainConfig config = read_train_config(root, path);
    ToySpec s;
    s.source = path;
    s.model = config.model;
    s.batch = config.train.batch_size;
    s.lr = config.optim.lr;
    s.weight_decay = config.optim.weight_decay;
    s.grad_clip = config.optim.grad_clip;
    s.autocast = config.train.autocast == "bf16";
    // The data decide the vocabulary and the sequence length.
    config.data.eval_sequences = 1;  // only the sizes are needed here
    std::unique_ptr<Dataset> data = make_dataset(config.data, path + ": /data");
    s.model.vocab_size = data->vocab_size();
    s.seq_len = data->seq_len();
    s.model.validate();
    return s;
}

// ---- normlab's side ----

// The seed article's SimpleModel: Linear 100->256, norm, ReLU, Linear 256->256, norm, ReLU, Linear 256->10.
std::shared_ptr<Sequential> simple_model(const std::string& norm, bool fused) {
    auto model = std::make_shared<Sequential>();
    auto add_norm = [&] {
        NormOptions o;
        o.type = norm;
        o.dim = 256;
        o.fused = fused;
        model->push_back(make_norm(o));
    };
    model->push_back(std::make_shared<Linear>(100, 256));
    add_norm();
    model->push_back(std::make_shared<ReLU>());
    model->push_back(std::make_shared<Linear>(256, 256));
    add_norm();
    model->push_back(std::make_shared<ReLU>());
    model->push_back(std::make_shared<Linear>(256, 10));
    return model;
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per full-batch epoch (zero_grad, forward, MSE, backward, Adam step). Weights and data are
// drawn on the host and moved; the model moves before Adam is made, so its moments live on `device`.
Stats time_stability(const std::string& norm, bool fused, int64_t epochs, int64_t warmup, Device device) {
    Generator gen(0);
    std::shared_ptr<Sequential> model = simple_model(norm, fused);
    model->to(device);
    Adam opt(model->named_parameters(), AdamOptions{.lr = 1e-3});
    Var x(randn({1000, 100}, gen).to(device));  // (N, 100)
    Var y(randn({1000, 10}, gen).to(device));   // (N, 10)
    std::vector<double> times;
    for (int64_t epoch = 0; epoch < warmup + epochs; ++epoch) {
        device_synchronize(device);
        const double start = now_s();
        opt.zero_grad();
        Var loss = mse_loss(model->forward(x), y);
        loss.backward();
        opt.step();
        device_synchronize(device);
        if (epoch >= warmup) times.push_back(now_s() - start);
    }
    return summarize(times);
}

// The mean loss of a batch, as train computes it: under bf16 autocast the forward and the loss run
// under an AutocastGuard, and the fused cross-entropy reads the bf16 logits as they are for its f32
// loss.
Var batch_loss(Transformer& model, const Tensor& inputs, const Tensor& targets, bool autocast) {
    AutocastGuard guard(DType::BF16, autocast);
    return cross_entropy_loss(model.forward(inputs), targets);
}

// Seconds per transformer training step on random tokens (the batch is drawn and moved to `device`
// before the clock starts). With `profile_table`, the timed steps run under the profiler
// (core/profiler.h) and its table is written there.
Stats time_transformer(const ToySpec& spec, int64_t steps, int64_t warmup, Device device,
                       std::string* profile_table = nullptr, ThreadGovernor* governor = nullptr) {
    Transformer model(spec.model);
    model.to(device);  // before AdamW, so its moments are created on the device
    AdamOptions ao;
    ao.lr = spec.lr;
    ao.weight_decay = spec.weight_decay;
    AdamW opt(model.named_parameters(), ao);
    Generator gen(1);
    const int64_t vocab = spec.model.vocab_size, B = spec.batch, T = spec.seq_len;
    std::vector<double> times;
    profiler::reset();
    for (int64_t step = 0; step < warmup + steps; ++step) {
        std::vector<int64_t> ids(static_cast<size_t>(B * (T + 1)));
        for (int64_t& id : ids) id = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(vocab)));
        Tensor seq = from_vector(ids, {B, T + 1});                  // (B, T + 1)
        Tensor inputs = seq.narrow(1, 0, T).contiguous().to(device);   // (B, T)
        Tensor targets = seq.narrow(1, 1, T).contiguous().to(device);  // (B, T)
        device_synchronize(device);
        if (governor) governor->update();  // as train does between steps
        const double start = now_s();
        {
            profiler::EnableGuard profiling(profile_table != nullptr && step >= warmup);
            opt.zero_grad();
            Var loss;
            {
                profiler::PhaseGuard forward(profiler::Phase::Forward);
                loss = batch_loss(model, inputs, targets, spec.autocast);
            }
            loss.backward();
            profiler::PhaseGuard optimizer_phase(profiler::Phase::Optimizer);
            if (spec.grad_clip > 0) clip_grad_norm_(model.named_parameters(), spec.grad_clip);
            opt.step();
            device_synchronize(device);
        }
        if (step >= warmup) times.push_back(now_s() - start);
    }
    if (profile_table) {
        double total = 0;
        for (double t : times) total += t;
        *profile_table = profiler::format_table(profiler::collected(), total, steps);
        profiler::reset();
    }
    return summarize(times);
}

// The model's matmul FLOPs per token (nanoGPT's estimate_mfu, after the PaLM paper's appendix B): 6
// per weight of every Linear (forward 2, backward 4) plus the attention products, 12 * layers * dim * T
// (scores and the weighted sum, forward and backward, counted without the causal half).
double model_flops_per_token(const ToySpec& spec, const Transformer& model) {
    const double matmul_weights = static_cast<double>(count_parameters(model, false));  // all but the lookup table
    const double attention = 12.0 * static_cast<double>(spec.model.n_layers * spec.model.dim * spec.seq_len);
    return 6.0 * matmul_weights + attention;
}

// The GEMM engines a model-shapes measurement can time: OpenBLAS's cblas_sgemm, normlab's f32 engine,
// or normlab's bf16 gemm on one of its engines (bf16 operands and C, f32 sums).
struct GemmEngine {
    enum Kind { OpenBlas, NativeF32, Bf16 } kind;
    std::string bf16_engine;  // for Bf16: "f32", "avx512bf16"
};

// The engine on the model's own GEMM shapes: every Linear (out x in) of one training step at
// M = batch * T rows, forward Y = X W^T (M, out, in), backward dX = dY W (M, in, out) and
// dW = dY^T X (out, in, M). Returns the FLOP/s of the whole set, timed `reps` times, median.
double gemm_flops_at_model_shapes(const ToySpec& spec, const Transformer& model, int reps, const GemmEngine& engine) {
    const int rows = static_cast<int>(spec.batch * spec.seq_len);
    struct Shape3 {
        int m, n, k;
        bool ta, tb;
    };
    std::vector<Shape3> shapes;
    for (const auto& [name, p] : model.named_parameters()) {
        if (p.dim() != 2 || name.find("embeddings") != std::string::npos) continue;
        const int out = static_cast<int>(p.size(0)), in = static_cast<int>(p.size(1));
        shapes.push_back({rows, out, in, false, true});  // X (M, in) @ W^T
        shapes.push_back({rows, in, out, false, false});  // dY (M, out) @ W (out, in)
        shapes.push_back({out, in, rows, true, false});   // dY^T (out, M) @ X (M, in)
    }
    double flops = 0;
    size_t biggest = 0;
    for (const Shape3& g : shapes) {
        flops += 2.0 * g.m * g.n * g.k;
        biggest = std::max({biggest, size_t(g.m) * g.k, size_t(g.k) * g.n, size_t(g.m) * g.n});
    }
    std::vector<float> a(biggest, 0.5f), b(biggest, 0.25f), c(biggest, 0.0f);
    std::vector<uint16_t> a16(biggest, f32_to_bf16(0.5f)), b16(biggest, f32_to_bf16(0.25f)), c16(biggest, 0);
    std::vector<double> times;
    for (int r = 0; r < reps + 1; ++r) {  // the first pass warms the caches and the engines' buffers
        const double start = now_s();
        for (const Shape3& g : shapes) {
            const int lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
            switch (engine.kind) {
                case GemmEngine::NativeF32:
                    sgemm_native(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), g.n);
                    break;
                case GemmEngine::Bf16:
                    bgemm_with_kernel(engine.bf16_engine, g.ta, g.tb, g.m, g.n, g.k, 1.0f, a16.data(), lda, b16.data(),
                                      ldb, 0.0f, c16.data(), false, g.n);
                    break;
                case GemmEngine::OpenBlas:
                    cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.m,
                                g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), g.n);
                    break;
            }
        }
        if (r > 0) times.push_back(now_s() - start);
    }
    return flops / summarize(times).median;
}

// The allocator's peak over one training step (the second of `steps`: the first also creates
// AdamW's moments), with the fused or the composed attention.
int64_t peak_step_bytes(ToySpec spec, bool fused_attention, Device device, int steps) {
    spec.model.fused_attention = fused_attention;
    Transformer model(spec.model);
    model.to(device);
    AdamOptions ao;
    ao.lr = spec.lr;
    AdamW opt(model.named_parameters(), ao);
    Generator gen(1);
    int64_t peak = 0;
    for (int step = 0; step < steps; ++step) {
        std::vector<int64_t> ids(static_cast<size_t>(spec.batch * (spec.seq_len + 1)));
        for (int64_t& id : ids) id = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(spec.model.vocab_size)));
        Tensor seq = from_vector(ids, {spec.batch, spec.seq_len + 1});
        Tensor inputs = seq.narrow(1, 0, spec.seq_len).contiguous().to(device);
        Tensor targets = seq.narrow(1, 1, spec.seq_len).contiguous().to(device);
        reset_peak(device);
        opt.zero_grad();
        batch_loss(model, inputs, targets, spec.autocast).backward();
        if (spec.grad_clip > 0) clip_grad_norm_(model.named_parameters(), spec.grad_clip);
        opt.step();
        peak = memory_stats(device).peak_bytes;
    }
    return peak;
}

// A child process that keeps one core busy until stop_busy_loop.
pid_t start_busy_loop() {
    const pid_t pid = fork();
    if (pid == 0) {
        volatile uint64_t x = 0;
        for (;;) x = x + 1;
    }
    return pid;
}
void stop_busy_loop(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
}

// ---- PyTorch's side ----

struct Shell {
    int status = -1;
    std::string out;  // stdout
    std::string err;  // stderr (from a temporary file)
};

std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

Shell run_shell(const std::string& command) {
    Shell r;
    const std::string err_path =
        (std::filesystem::temp_directory_path() / fmt::format("normlab-bench-torch-{}.err", getpid())).string();
    // The child gets the CPUs normlab started with: under OMP_PROC_BIND normlab's main thread is
    // bound to one, and PyTorch inheriting that mask would run all its threads on one CPU.
    FILE* pipe = nullptr;
    with_starting_cpus([&] { pipe = popen((command + " 2>" + quote(err_path)).c_str(), "r"); });
    if (!pipe) return r;
    std::array<char, 4096> buffer{};
    size_t n = 0;
    while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.out.append(buffer.data(), n);
    const int raw = pclose(pipe);
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    std::ifstream in(err_path);
    std::stringstream ss;
    ss << in.rdbuf();
    r.err = ss.str();
    std::filesystem::remove(err_path);
    return r;
}

std::string last_line(const std::string& text) {
    std::string t = text;
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    const size_t nl = t.rfind('\n');
    return nl == std::string::npos ? t : t.substr(nl + 1);
}

// The PyTorch results, or nullopt with `why` set.
// `extra` is appended to the script's arguments.
std::optional<json> run_torch(const TorchCommand& cmd, const ToySpec& spec, int threads, Device device,
                              std::string& why, const std::string& extra = "") {
    if (cmd.skip_torch) {
        why = "--skip-torch was given";
        return std::nullopt;
    }
    if (!std::filesystem::exists(cmd.script)) {
        why = cmd.script + " not found (run from the repository root, or pass --script)";
        return std::nullopt;
    }
    Shell probe = run_shell(quote(cmd.python) + " -c 'import torch'");
    if (probe.status != 0) {
        why = fmt::format("`{} -c 'import torch'` failed: {}", cmd.python,
                          probe.status == 127 ? std::string("python3 not found") : last_line(probe.err));
        return std::nullopt;
    }
    const TransformerOptions& m = spec.model;
    std::string command = fmt::format(
        "{} {} --json --device {} --threads {} --epochs {} --steps {} --warmup {} --vocab-size {} --dim {} --n-layers {} "
        "--n-heads {} --n-kv-heads {} --multiple-of {} --ffn-hidden-dim {} --norm {} --rope-theta {} --seq-len {} "
        "--batch {} --lr {} --weight-decay {} --grad-clip {}",
        quote(cmd.python), quote(cmd.script), device.str(), threads, cmd.epochs, cmd.steps, cmd.warmup, m.vocab_size, m.dim,
        m.n_layers, m.n_heads, m.n_kv_heads, m.multiple_of, m.ffn_hidden_dim, quote(m.norm.type), m.rope_theta,
        spec.seq_len, spec.batch, spec.lr, spec.weight_decay, spec.grad_clip);
    if (m.norm.eps) command += fmt::format(" --norm-eps {}", *m.norm.eps);
    if (m.norm_placement == "post") command += " --post-norm";
    if (spec.autocast) command += " --autocast bf16";
    command += extra;
    fmt::print(stderr, "  running {}\n", command);
    Shell r = run_shell(command);
    if (r.status != 0) {
        why = fmt::format("{} exited with status {}: {}", cmd.script, r.status, last_line(r.err));
        return std::nullopt;
    }
    try {
        return json::parse(last_line(r.out));
    } catch (const json::exception& e) {
        why = fmt::format("could not parse {}'s JSON output: {}", cmd.script, e.what());
        return std::nullopt;
    }
}

// The --device value, checked before any work: malformed, or a GPU this build or machine lacks, is an
// nl::Error (one line, exit code 2), with the same wording as the jobs' "device" config key.
Device parse_device_flag(const std::string& name) {
    Device device;
    try {
        device = device_from_name(name);
    } catch (const Error&) {
        throw Error(detail::concat("bench torch: --device: expected \"cpu\", \"cuda\" or \"cuda:N\" (N a GPU index), got \"",
                                   name, "\""));
    }
    require_device_available(device, "bench torch: --device");
    return device;
}

void print_header(const TorchCommand& cmd, const ToySpec& spec, Device device, int threads) {
    const TransformerOptions& m = spec.model;
    fmt::print("normlab bench torch: normlab vs PyTorch on {}, {} threads each (OpenMP/OpenBLAS; torch.set_num_threads)\n",
               device.str(), threads);
    fmt::print("  stability: SimpleModel 100-256-256-10, x (1000, 100), Adam lr 1e-3, MSE, full batch; {} timed epochs "
               "after {} warm-up\n",
               cmd.epochs, cmd.warmup);
    fmt::print("  transformer ({}): vocab {}, dim {}, {} layers, {} heads ({} kv), {} {}, batch {} x seq {}, AdamW, "
               "clip {}{}; {} timed steps after {} warm-up\n\n",
               spec.source, m.vocab_size, m.dim, m.n_layers, m.n_heads, m.n_kv_heads ? m.n_kv_heads : m.n_heads,
               m.norm_placement + "-norm", m.norm.type, spec.batch, spec.seq_len, spec.grad_clip,
               spec.autocast ? ", bf16 autocast on both sides" : "", cmd.steps, cmd.warmup);
}

// The stability rows per norm, then the transformer row, per round.
const std::vector<std::string> kBenchNorms = {"layernorm", "rmsnorm"};

// PyTorch's two attentions (torch_bench.py --attention both): LLaMA's matmul + mask + softmax (JSON
// key "transformer") and F.scaled_dot_product_attention (key "transformer_sdpa").
struct TorchAttention {
    const char* key;    // the JSON key of its timing
    const char* label;  // the table's row
    const char* name;   // the profile's heading
};
const TorchAttention kTorchAttentions[] = {
    {"transformer", "  PyTorch, matmul + softmax", "LLaMA's matmul + mask + softmax"},
    {"transformer_sdpa", "  PyTorch, SDPA", "F.scaled_dot_product_attention"}};
constexpr size_t kTorchAttentionCount = std::size(kTorchAttentions);

struct Rounds {
    // (rows, rounds): s/epoch or s/step. PyTorch's transformer row is, per round, the faster of its
    // two attentions: normlab's fused attention against PyTorch's best, as a user would choose it.
    std::vector<std::vector<double>> ours, theirs, ratios;
    std::vector<std::vector<double>> theirs_attention, ratios_attention;  // (kTorchAttentions, rounds): each one
    std::vector<std::vector<double>> ours_composed;         // (norms, rounds)
    std::string why, torch_version;                          // why PyTorch was skipped; its version
    double torch_gemm_flops = 0.0;                           // torch.mm at the model's GEMM shapes, last round
    bool have_torch = true;
};

// Separate processes cannot interleave per step, so the two sides alternate by rounds (normlab,
// PyTorch, normlab, ...): a load that comes and goes on this shared machine then lands on both
// sides, and each round gives its own ratio.
Rounds run_rounds(const TorchCommand& cmd, const ToySpec& spec, Device device, int threads) {
    const size_t norms = kBenchNorms.size(), rows = norms + 1;
    Rounds r;
    r.ours.resize(rows), r.theirs.resize(rows), r.ratios.resize(rows), r.ours_composed.resize(norms);
    r.theirs_attention.resize(kTorchAttentionCount), r.ratios_attention.resize(kTorchAttentionCount);
    for (int64_t round = 0; round < cmd.rounds; ++round) {
        fmt::print(stderr, "  round {}/{}: timing normlab ...\n", round + 1, cmd.rounds);
        for (size_t i = 0; i < norms; ++i) {
            r.ours[i].push_back(time_stability(kBenchNorms[i], true, cmd.epochs, cmd.warmup, device).median);
            r.ours_composed[i].push_back(time_stability(kBenchNorms[i], false, cmd.epochs, cmd.warmup, device).median);
        }
        r.ours[norms].push_back(time_transformer(spec, cmd.steps, cmd.warmup, device).median);
        if (!r.have_torch) continue;
        fmt::print(stderr, "  round {}/{}: timing PyTorch ...\n", round + 1, cmd.rounds);
        std::optional<json> torch = run_torch(cmd, spec, threads, device, r.why);
        if (!torch) {
            r.have_torch = false;
            continue;
        }
        r.torch_version = torch->at("torch_version").get<std::string>();
        for (size_t i = 0; i < norms; ++i)
            r.theirs[i].push_back(torch->at("stability").at(kBenchNorms[i]).at("median_s").get<double>());
        double fastest = 0.0;
        for (size_t a = 0; a < kTorchAttentionCount; ++a) {
            if (!torch->contains(kTorchAttentions[a].key)) continue;  // a script that times one attention only
            const json& t = torch->at(kTorchAttentions[a].key);
            const double seconds = t.at("median_s").get<double>();
            r.theirs_attention[a].push_back(seconds);
            r.ratios_attention[a].push_back(seconds / r.ours[norms].back());
            fastest = fastest == 0.0 ? seconds : std::min(fastest, seconds);
            if (t.contains("gemm_flops_per_s")) r.torch_gemm_flops = t.at("gemm_flops_per_s").get<double>();
        }
        NL_REQUIRE(fastest > 0.0, "bench torch: ", cmd.script, " reported no transformer timing (expected JSON key ",
                   kTorchAttentions[0].key, " or ", kTorchAttentions[1].key, ")");
        r.theirs[norms].push_back(fastest);
        for (size_t i = 0; i < rows; ++i) r.ratios[i].push_back(r.theirs[i].back() / r.ours[i].back());
    }
    return r;
}

// "1.23 [1.10, 1.40]": the median of per-round values with the rounds' [min, max].
std::string ratio_cell(const std::vector<double>& per_round) {
    const Stats s = summarize(per_round);
    return fmt::format("{:.2f} [{:.2f}, {:.2f}]", s.median, s.min, s.max);
}

// The transformer's per-round ratios, sorted, and a 95% interval for their median held against
// --target: whether this many rounds decide the ratio on a machine whose speed moves from round to round.
void print_ratio_interval(const TorchCommand& cmd, const std::vector<double>& per_round) {
    std::vector<double> sorted = per_round;
    std::sort(sorted.begin(), sorted.end());
    std::string values;
    for (double v : sorted) values += fmt::format(" {:.2f}", v);
    fmt::print("transformer ours/theirs per round, sorted:{}\n", values);
    constexpr double kConfidence = 0.95;  // the "95%" and "6 rounds" of the lines below
    const MedianInterval ci = median_interval(per_round, kConfidence);
    const double median = summarize(per_round).median;
    if (ci.coverage < kConfidence) {
        fmt::print("  median {:.2f}; [min, max] = [{:.2f}, {:.2f}] holds the true median with {:.1f}% only: 6 rounds "
                   "or more give a 95% interval; against --target {:.2f}: not decided\n",
                   median, ci.lo, ci.hi, 100.0 * ci.coverage, cmd.target);
        return;
    }
    fmt::print("  median {:.2f}; 95% interval for the median [{:.2f}, {:.2f}]: rounds {} and {} of {} sorted ({:.1f}%, "
               "distribution-free, the rounds taken as independent)\n",
               median, ci.lo, ci.hi, ci.rank, ci.samples + 1 - ci.rank, ci.samples, 100.0 * ci.coverage);
    const char* verdict = ci.lo > cmd.target   ? "above it, the whole interval"
                          : ci.hi < cmd.target ? "below it, the whole interval"
                                               : "not decided, the interval holds it (more rounds narrow it)";
    fmt::print("  against --target {:.2f}: {}\n", cmd.target, verdict);
}

void print_table(const TorchCommand& cmd, const ToySpec& spec, const Rounds& r) {
    // A cell: the median over rounds of each round's median, with the rounds' [min, max].
    auto cell = [](const std::vector<double>& per_round, double scale, const char* unit) {
        const Stats s = summarize(per_round);
        const int decimals = scale == 1.0 ? 0 : 2;  // tok/s as whole numbers, ms with two decimals
        return fmt::format("{:.{}f} {} [{:.{}f}, {:.{}f}]", s.median * scale, decimals, unit, s.min * scale, decimals,
                           s.max * scale, decimals);
    };
    fmt::print("{:<30} {:<34} {:<34} {}\n", "", "normlab", r.have_torch ? "PyTorch " + r.torch_version : "PyTorch (skipped)",
               "torch/ours [min, max]");
    const double tokens = static_cast<double>(spec.batch * spec.seq_len);
    for (size_t i = 0; i < r.ours.size(); ++i) {
        const bool transformer = i == kBenchNorms.size();
        // The transformer row is in tokens/s: tokens / (s/step).
        std::vector<double> ours_row = r.ours[i], theirs_row = r.theirs[i];
        if (transformer) {
            for (double& t : ours_row) t = tokens / t;
            for (double& t : theirs_row) t = tokens / t;
        }
        const char* unit = transformer ? "tok/s" : "ms";
        const double scale = transformer ? 1.0 : 1e3;
        const std::string label = transformer ? "transformer tokens/s" : "stability " + kBenchNorms[i] + " s/epoch";
        fmt::print("{:<30} {:<34} {:<34} {}\n", label, cell(ours_row, scale, unit),
                   r.have_torch ? cell(theirs_row, scale, unit) : std::string("-"),
                   r.have_torch ? ratio_cell(r.ratios[i]) : std::string("-"));
        if (!transformer)
            fmt::print("{:<30} {:<34}\n", "  (normlab composed norm)", cell(r.ours_composed[i], 1e3, "ms"));
        for (size_t a = 0; transformer && r.have_torch && a < kTorchAttentionCount; ++a) {
            if (r.theirs_attention[a].size() != r.ours[i].size()) continue;  // not timed every round
            std::vector<double> theirs_tokens = r.theirs_attention[a];
            for (double& t : theirs_tokens) t = tokens / t;
            fmt::print("{:<30} {:<34} {:<34} {}\n", kTorchAttentions[a].label, "", cell(theirs_tokens, 1.0, "tok/s"),
                       ratio_cell(r.ratios_attention[a]));
        }
    }
    fmt::print("torch/ours = PyTorch time / normlab time, per round (for tokens/s: ours / theirs); >= 1 means normlab "
               "is at least as fast (the target).\n");
    if (r.have_torch) {
        fmt::print("idle OpenMP threads: normlab {}; PyTorch {} (the environment normlab was given)\n",
                   idle_threads_setting(true), idle_threads_setting(false));
        fmt::print("PyTorch's transformer row: per round, the faster of its two attentions, LLaMA's matmul + mask + "
                   "softmax and F.scaled_dot_product_attention(is_causal=True) (nanoGPT's; a flash attention on the CPU); "
                   "normlab runs its fused attention.\n");
    }
    fmt::print("each cell: the median over {} rounds of a round's median over its timed epochs/steps, [min, max] over "
               "the rounds; normlab's stability rows use its fused norms, PyTorch's nn.LayerNorm / nn.RMSNorm.\n",
               cmd.rounds);
    if (!r.have_torch) fmt::print("PyTorch side skipped: {}\n", r.why);
    else print_ratio_interval(cmd, r.ratios[kBenchNorms.size()]);
}

// Model FLOP/s against OpenBLAS's sgemm at the model's own GEMM shapes, measured now.
void print_model_flops(const ToySpec& spec, const Rounds& r) {
    const double tokens = static_cast<double>(spec.batch * spec.seq_len);
    const double ours_tokens = tokens / summarize(r.ours[kBenchNorms.size()]).median;
    const Transformer model(spec.model);  // its weights' shapes: the FLOP count and the GEMM shapes
    const double flops_per_token = model_flops_per_token(spec, model);
    const double model_flops = flops_per_token * ours_tokens;
    const double sgemm = gemm_flops_at_model_shapes(spec, model, 5, {GemmEngine::OpenBlas, ""});
    fmt::print("model FLOP/s: {:.1f} GFLOP/s ({:.2f} MFLOP per token x {:.0f} tokens/s; 6 x matmul weights + "
               "12 x layers x dim x T) = {:.2f} x OpenBLAS sgemm at the model's GEMM shapes ({:.1f} GFLOP/s, "
               "measured now)\n",
               model_flops / 1e9, flops_per_token / 1e6, ours_tokens, model_flops / sgemm, sgemm / 1e9);
    if (sgemm_engine_is_native()) {
        const double own = gemm_flops_at_model_shapes(spec, model, 5, {GemmEngine::NativeF32, ""});
        fmt::print("normlab's own gemm engine ({}) at the same GEMM shapes: {:.1f} GFLOP/s = {:.2f} x OpenBLAS "
                   "sgemm\n",
                   sgemm_engine_name(), own / 1e9, own / sgemm);
    }
    if (r.torch_gemm_flops > 0 && !spec.autocast)
        fmt::print("PyTorch's torch.mm at the same GEMM shapes: {:.1f} GFLOP/s = {:.2f} x OpenBLAS sgemm (the "
                   "GEMM engines side by side)\n",
                   r.torch_gemm_flops / 1e9, r.torch_gemm_flops / sgemm);
    if (!spec.autocast) return;
    // Under bf16 autocast: normlab's bf16 engines and torch.mm on bf16 tensors (oneDNN) at the same shapes.
    fmt::print("bf16 GEMMs at the same shapes (bf16 operands and C, f32 sums); auto runs {}:\n", bgemm_engine_name());
    std::vector<std::pair<std::string, double>> engine_flops;  // (engine, GFLOP/s x 1e9) of each that runs here
    for (const std::string& engine : bgemm_kernels_this_cpu_runs()) {
        const double flops = gemm_flops_at_model_shapes(spec, model, 5, {GemmEngine::Bf16, engine});
        fmt::print("  normlab bf16 engine {:<14} {:7.1f} GFLOP/s = {:.2f} x OpenBLAS sgemm\n", engine, flops / 1e9,
                   flops / sgemm);
        engine_flops.emplace_back(engine, flops);
    }
    if (r.torch_gemm_flops > 0)
        fmt::print("  PyTorch torch.mm on bf16 (oneDNN) {:7.1f} GFLOP/s = {:.2f} x OpenBLAS sgemm\n", r.torch_gemm_flops / 1e9,
                   r.torch_gemm_flops / sgemm);
    // Each bf16 instruction's own ceiling: its register loop on one core (median of 5), times the
    // threads; the engine that runs on it as a share of it (and oneDNN's, which runs on the best one).
    for (const auto& [engine, flops] : engine_flops) {
        const bool amx = engine == "amx";
        if (!amx && engine != "avx512bf16") continue;  // the widened engine's ceiling is the f32 FMA's
        const int64_t trips = amx ? 20000 : 2000000;
        const double trip_flops = 16.0 * (amx ? 16384.0 : 64.0);  // 16 instructions a trip
        std::vector<double> rates;
        for (int rep = 0; rep < 6; ++rep) {
            const auto start = std::chrono::steady_clock::now();
            volatile float sink = amx ? bgemm_amx_register_loop(trips) : bgemm_avx512bf16_register_loop(trips);
            (void)sink;
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            if (rep > 0) rates.push_back(trip_flops * static_cast<double>(trips) / s);
        }
        const double peak = summarize(rates).median * omp_get_max_threads();
        fmt::print("  {} peak: {:.1f} GFLOP/s ({} threads x {} on registers); the {} engine runs at {:.0f}% of it",
                   amx ? "AMX" : "vdpbf16ps", peak / 1e9, omp_get_max_threads(), amx ? "tdpbf16ps" : "vdpbf16ps", engine,
                   100.0 * flops / peak);
        if (r.torch_gemm_flops > 0 && engine == engine_flops.front().first)
            fmt::print(", oneDNN at {:.0f}%", 100.0 * r.torch_gemm_flops / peak);
        fmt::print("\n");
    }
}

void print_peak_memory(const TorchCommand& cmd, const ToySpec& spec, Device device) {
    const int peak_steps = cmd.quick ? 1 : 2;  // --quick: the first step's peak, a smoke run
    const int64_t peak_fused = peak_step_bytes(spec, true, device, peak_steps);
    const int64_t peak_composed = peak_step_bytes(spec, false, device, peak_steps);
    fmt::print("peak memory per training step (normlab's allocator): fused attention {:.1f} MiB, composed attention "
               "{:.1f} MiB (T = {})\n",
               static_cast<double>(peak_fused) / (1 << 20), static_cast<double>(peak_composed) / (1 << 20),
               spec.seq_len);
}

// Users train beside builds and sweeps: the same steps with a busy loop on one core, normlab's
// default thread setting against 1 thread, and PyTorch's the same. The two settings alternate which
// goes first from round to round (the machine's speed drifts during a run), and each round gives
// one ratio.
void run_under_load(const TorchCommand& cmd, const ToySpec& spec, Device device, int threads, Rounds& r) {
    fmt::print(stderr, "  under load: a busy loop on one core while each side trains ...\n");
    const pid_t busy = start_busy_loop();
    std::vector<double> ours_default, ours_one, ours_ratio, torch_default, torch_one, torch_ratio;  // (rounds,)
    int threads_at_end = threads;
    // normlab's default is train's: auto threads (core/thread_governor.h), up to --threads, from a
    // new governor as each train run starts one.
    auto time_ours = [&](bool governed) {
        omp_set_num_threads(governed ? threads : 1);
        openblas_set_num_threads(governed ? threads : 1);
        ThreadGovernor governor(threads, governed);
        const double seconds =
            time_transformer(spec, cmd.steps, cmd.warmup, device, nullptr, governed ? &governor : nullptr).median;
        if (governed) threads_at_end = governor.threads();
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
        return seconds;
    };
    auto time_torch = [&](int torch_threads) -> std::optional<double> {  // 0: torch's own default
        const std::optional<json> j =
            run_torch(cmd, spec, torch_threads, device, r.why, " --skip-stability --attention llama");
        if (!j) return std::nullopt;
        return j->at("transformer").at("median_s").get<double>();
    };
    bool torch_ok = r.have_torch;
    for (int64_t round = 0; round < cmd.rounds; ++round) {
        fmt::print(stderr, "  under load, round {}/{} ...\n", round + 1, cmd.rounds);
        const bool default_first = round % 2 == 0;
        const double first = time_ours(default_first), second = time_ours(!default_first);
        ours_default.push_back(default_first ? first : second);
        ours_one.push_back(default_first ? second : first);
        ours_ratio.push_back(ours_one.back() / ours_default.back());
        if (!torch_ok) continue;
        const std::optional<double> a = time_torch(default_first ? 0 : 1), b = time_torch(default_first ? 1 : 0);
        if (!a || !b) {
            torch_ok = false;
            continue;
        }
        torch_default.push_back(default_first ? *a : *b);
        torch_one.push_back(default_first ? *b : *a);
        torch_ratio.push_back(torch_one.back() / torch_default.back());
    }
    stop_busy_loop(busy);
    const double tokens = static_cast<double>(spec.batch * spec.seq_len);
    auto tok = [&](const std::vector<double>& seconds) {
        return fmt::format("{:.0f} tok/s", tokens / summarize(seconds).median);
    };
    fmt::print("under load (a busy loop on one core), transformer tokens/s, medians over {} rounds that alternate "
               "which setting goes first; default / 1 thread per round, [min, max]:\n",
               cmd.rounds);
    fmt::print("  normlab, default threads ({} at the end): {}    normlab, 1 thread: {}    default / 1 thread: {}\n",
               threads_at_end, tok(ours_default), tok(ours_one), ratio_cell(ours_ratio));
    if (torch_ok && !torch_ratio.empty())
        fmt::print("  PyTorch (LLaMA's attention), default threads: {}    PyTorch, 1 thread: {}    default / 1 thread: {}\n",
                   tok(torch_default), tok(torch_one), ratio_cell(torch_ratio));
}

// After the timed rounds, so the profiler's clock reads never touch the figures above.
void run_profiles(const TorchCommand& cmd, const ToySpec& spec, Device device, int threads, Rounds& r) {
    std::string table;
    time_transformer(spec, cmd.steps, cmd.warmup, device, &table);
    fmt::print("\nnormlab's transformer steps under --profile (one more pass of {} steps after {} warm-up):\n{}",
               cmd.steps, cmd.warmup, table);
    if (!r.have_torch) return;
    std::optional<json> torch = run_torch(cmd, spec, threads, device, r.why, " --skip-stability --profile");
    bool printed = false;
    for (const TorchAttention& attention : kTorchAttentions) {
        const char* key = attention.key;
        if (!torch || !torch->contains(key) || !torch->at(key).contains("profile_table")) continue;
        fmt::print("\nPyTorch's transformer steps with {} under torch.profiler (key_averages(), the same steps):\n{}\n",
                   attention.name, torch->at(key).at("profile_table").get<std::string>());
        printed = true;
    }
    if (!printed)
        fmt::print("\nPyTorch's profile: not available ({})\n", torch ? "no profile_table in its output" : r.why);
}

void run_bench_torch(TorchCommand cmd) {
    const Device device = parse_device_flag(cmd.device);
    if (cmd.quick) {
        cmd.epochs = 5;
        cmd.steps = 3;
        cmd.warmup = 1;
        cmd.rounds = 1;
    }
    NL_REQUIRE(cmd.epochs >= 1 && cmd.steps >= 1 && cmd.rounds >= 1 && cmd.warmup >= 0,
               "bench torch: --epochs, --steps and --rounds must be at least 1 and --warmup at least 0, found ",
               cmd.epochs, ", ", cmd.steps, ", ", cmd.rounds, ", ", cmd.warmup);
    NL_REQUIRE(cmd.target > 0.0 && std::isfinite(cmd.target), "bench torch: --target must be a ratio above 0, found ",
               cmd.target);
    if (cmd.threads > 0) {
        omp_set_num_threads(static_cast<int>(cmd.threads));
        openblas_set_num_threads(static_cast<int>(cmd.threads));
    }
    const int threads = omp_get_max_threads();
    std::vector<std::string> overrides = cmd.overrides;
    if (cmd.autocast != "none") overrides.push_back("train.autocast=" + cmd.autocast);
    const ToySpec spec = resolve_toy_spec(cmd.config, overrides);
    const TransformerOptions& m = spec.model;
    // The PyTorch reference (examples/cli/torch_bench.py) builds LLaMA's pre-norm or the post-norm block.
    NL_REQUIRE((m.norm_placement == "pre" || m.norm_placement == "post") && m.norm_scaling == "none" &&
                   m.qk_norm == "none" && m.logit_softcap == 0.0 && m.attn_softcap == 0.0,
               "bench torch: the PyTorch reference builds pre- or post-norm blocks without qk_norm, norm_scaling or "
               "soft-capping; the config has norm_placement \"", m.norm_placement, "\", qk_norm \"", m.qk_norm, "\"");
    print_header(cmd, spec, device, threads);
    Rounds rounds = run_rounds(cmd, spec, device, threads);
    print_table(cmd, spec, rounds);
    if (device.is_cpu()) print_model_flops(spec, rounds);
    print_peak_memory(cmd, spec, device);
    if (cmd.load && device.is_cpu()) run_under_load(cmd, spec, device, threads, rounds);
    if (cmd.profile) run_profiles(cmd, spec, device, threads, rounds);
}

}  // namespace

void register_bench_torch(CLI::App& bench) {
    auto cmd = std::make_shared<TorchCommand>();
    CLI::App* sub = bench.add_subcommand(
        "torch", "normlab vs PyTorch on one device: stability seconds/epoch and toy transformer tokens/s, side by side");
    sub->add_option("--config", cmd->config, "the toy transformer's train config (read as `normlab train` reads it)")
        ->capture_default_str();
    sub->add_option("--script", cmd->script, "the PyTorch script")->capture_default_str();
    sub->add_option("--python", cmd->python, "the Python interpreter")->capture_default_str();
    sub->add_option("--device", cmd->device, "where both sides run: cpu, cuda (= cuda:0) or cuda:N")
        ->capture_default_str();
    sub->add_option("--threads", cmd->threads, "threads for both sides (0: OpenMP's default)")->capture_default_str();
    sub->add_option("--epochs", cmd->epochs, "timed stability epochs per norm")->capture_default_str();
    sub->add_option("--steps", cmd->steps, "timed transformer steps")->capture_default_str();
    sub->add_option("--warmup", cmd->warmup, "untimed epochs/steps first")->capture_default_str();
    sub->add_option("--rounds", cmd->rounds, "alternate normlab and PyTorch this many times")->capture_default_str();
    sub->add_option("--target", cmd->target,
                    "the transformer's tokens/s ratio (normlab / PyTorch) to hold the 95% interval of the rounds' "
                    "median against: above, below or not decided")
        ->capture_default_str();
    sub->add_flag("--quick", cmd->quick, "5 epochs, 3 steps: a smoke run, not a measurement");
    sub->add_flag("--skip-torch", cmd->skip_torch, "time normlab only");
    sub->add_flag("--profile", cmd->profile,
                  "after the rounds, profile one more pass of normlab's transformer steps: time per kernel by op "
                  "and phase (docs/profiling.md)");
    sub->add_option("--autocast", cmd->autocast,
                    "bf16: both sides train under bf16 autocast (normlab's train.autocast, torch.autocast), and the "
                    "bf16 GEMM engines are timed at the model's shapes")
        ->check(CLI::IsMember({"none", "bf16"}))
        ->capture_default_str();
    sub->add_option("--set", cmd->overrides,
                    "override a key of the config: --set model.dim=384 (repeatable; as train's --set)");
    sub->add_flag("--load", cmd->load,
                  "after the rounds, time the transformer again with a busy loop on one core: normlab's default "
                  "threads and 1 thread, PyTorch's default threads and 1 thread");
    sub->callback([cmd] { run_bench_torch(*cmd); });
}

}  // namespace nl::cli
