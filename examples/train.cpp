// `normlab train CONFIG`: a LLaMA-style toy transformer trained with AdamW, linear warmup + cosine
// decay and global grad-norm clipping on a synthetic sequence task or a character-level text file.
// Reads top to bottom: config -> data -> model -> train loop (eval, checkpoints) -> report.
// "device" puts the model, the batches and AdamW's state on a GPU (batches are made on the host, so
// every device sees the same data); losses are read back to the host for logging. train.autocast
// "bf16" runs the forward under an AutocastGuard (layers/autocast.h): bf16 matmuls, f32 weights,
// norms, softmax and loss.
//
// Data parallel (mpirun -np N normlab train CONFIG; examples/distributed.h): every rank draws the same
// global batch from the same generator, computes its shards' gradients, and the gradients are summed over
// ranks during backward; rank 0 alone writes the run directory. A checkpoint is the same whatever N, so a
// run resumes on any number of ranks.
//
// Exact resumes: a checkpoint holds the model, AdamW's moments and step, the data generator's state
// (the only randomness in a step) and the step, so a run stopped at a checkpoint and resumed
// computes the same batches, gradients and updates bit for bit as one that never stopped.
//
// --profile times the steps' kernels by op and phase (core/profiler.h, docs/profiling.md).
#include "examples/train.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>

#include <fmt/core.h>

#include "autograd/autograd.h"
#include "core/dist.h"
#include "core/cpu/thread_governor.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "core/ops.h"
#include "core/profiler.h"
#include "examples/commands.h"
#include "examples/config.h"
#include "examples/distributed.h"
#include "examples/run_dir.h"
#include "layers/autocast.h"
#include "layers/checkpoint.h"
#include "layers/loss.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/schedule.h"

namespace fs = std::filesystem;

namespace nl::cli {

// ---- the config schema ----

int64_t data_seq_len(const DataOptions& data) {
    if (data.source == "text") return data.seq_len;
    // prompt + answer tokens, minus one: the last token is only ever a target (see data.h)
    int64_t sequence = data.task == "add" ? 3 * data.length + 3 : 2 * data.length + 1;
    return sequence - 1;
}

static DataOptions read_data(ConfigReader reader, uint64_t seed) {
    DataOptions data;
    data.source = reader.get_string("source", "synthetic", {"synthetic", "text"});
    const std::vector<std::string> synthetic_keys = {"task", "length", "symbols"};
    const std::vector<std::string> text_keys = {"path", "val_fraction", "seq_len"};
    if (data.source == "synthetic") {
        data.task = reader.get_string("task", "reverse", {"copy", "reverse", "sort", "add"});
        data.length = reader.get_int("length", 8, 1, 4096);
        data.symbols = reader.get_int("symbols", 10, 2, 1000000);
    } else {
        data.path = reader.get_string("path", "");
        if (data.path.empty()) reader.fail("path", "a text file is required for source \"text\"");
        data.val_fraction = reader.get_double("val_fraction", 0.1, 1e-6, 0.999999);
        data.seq_len = reader.get_int("seq_len", 64, 1, 1 << 20);
    }
    data.eval_sequences = reader.get_int("eval_sequences", 256, 1, 1 << 20);
    data.seed = static_cast<uint64_t>(reader.get_int("seed", static_cast<int64_t>(seed), 0));
    // A key of the other source is a likelier mistake than a typo: say so instead of "unknown key".
    const auto& other = data.source == "synthetic" ? text_keys : synthetic_keys;
    for (const std::string& key : other)
        if (reader.has(key))
            reader.fail(key, "applies to source \"" + std::string(data.source == "synthetic" ? "text" : "synthetic") +
                                 "\" only (this config's source is \"" + data.source + "\")");
    reader.finish();
    return data;
}

static NormOptions read_norm(ConfigReader reader) {
    NormOptions norm;
    norm.type = reader.get_string("type", "rmsnorm", norm_types());
    NormOptions type_defaults;
    type_defaults.type = norm.type;
    norm.eps = reader.get_double("eps", type_defaults.resolved_eps(), 0.0, 1.0);
    norm.fused = reader.get_bool("fused", true);
    norm.elementwise_affine = reader.get_bool("elementwise_affine", true);
    norm.bias = reader.get_bool("bias", true);
    norm.p = reader.get_double("p", 0.0625, 1e-9, 1.0);
    norm.alpha = reader.get_double("alpha", 0.5, 0.0, 1.0);
    reader.finish();
    return norm;
}

static TransformerOptions read_model(ConfigReader reader, uint64_t seed) {
    TransformerOptions model;
    // Upper bounds: far above a toy model, low enough that no size product below can overflow
    // (the memory a config needs is checked against the machine before training, see run_train).
    model.dim = reader.get_int("dim", 64, 2, kMaxModelDim);
    model.n_layers = reader.get_int("n_layers", 2, 0, kMaxLayers);
    model.n_heads = reader.get_int("n_heads", 4, 1, kMaxModelDim);
    if (model.dim % model.n_heads != 0)
        reader.fail("n_heads", fmt::format("expected a positive integer dividing dim={}, got {}", model.dim, model.n_heads));
    if ((model.dim / model.n_heads) % 2 != 0)
        reader.fail("n_heads", fmt::format("expected an even head size (RoPE rotates pairs), got dim / n_heads = {} / {} = {}",
                                           model.dim, model.n_heads, model.dim / model.n_heads));
    model.n_kv_heads = reader.get_int("n_kv_heads", model.n_heads, 1);
    if (model.n_heads % model.n_kv_heads != 0)
        reader.fail("n_kv_heads", fmt::format("expected a positive integer dividing n_heads={}, got {}",
                                              model.n_heads, model.n_kv_heads));
    model.multiple_of = reader.get_int("multiple_of", model.multiple_of, 1, kMaxModelDim);
    model.ffn_hidden_dim = reader.get_int("ffn_hidden_dim", 0, 0, 4 * kMaxModelDim);
    model.norm = read_norm(reader.child("norm"));
    model.pre_norm = reader.get_bool("pre_norm", true);
    model.rope_theta = reader.get_double("rope_theta", 10000.0, 1e-9);
    model.max_seq_len = reader.get_int("max_seq_len", 256, 1, 1 << 20);
    model.fused_attention = reader.get_bool("fused_attention", true);
    model.fused_swiglu = reader.get_bool("fused_swiglu", true);
    model.seed = seed;
    reader.finish();
    return model;
}

static OptimConfig read_optim(ConfigReader reader) {
    OptimConfig optim;
    optim.lr = reader.get_double("lr", optim.lr, 0.0, 10.0);
    optim.min_lr = reader.get_double("min_lr", optim.min_lr, 0.0, optim.lr);
    optim.warmup_steps = reader.get_int("warmup_steps", optim.warmup_steps, 0);
    optim.weight_decay = reader.get_double("weight_decay", optim.weight_decay, 0.0);
    optim.beta1 = reader.get_double("beta1", optim.beta1, 0.0, 0.999999);
    optim.beta2 = reader.get_double("beta2", optim.beta2, 0.0, 0.999999);
    optim.eps = reader.get_double("eps", optim.eps, 0.0);
    optim.grad_clip = reader.get_double("grad_clip", optim.grad_clip, 0.0);
    reader.finish();
    return optim;
}

static LoopConfig read_loop(ConfigReader reader) {
    LoopConfig loop;
    loop.steps = reader.get_int("steps", loop.steps, 1, kMaxSteps);
    loop.batch_size = reader.get_int("batch_size", loop.batch_size, 1, kMaxBatchSize);
    loop.eval_every = reader.get_int("eval_every", loop.eval_every, 0);
    loop.checkpoint_every = reader.get_int("checkpoint_every", loop.checkpoint_every, 0);
    loop.log_every = reader.get_int("log_every", loop.log_every, 1);
    loop.autocast = reader.get_string("autocast", loop.autocast, {"none", "bf16"});
    loop.grad_shards = reader.get_int("grad_shards", loop.grad_shards, 0, 1 << 20);
    loop.bucket_kb = reader.get_int("bucket_kb", loop.bucket_kb, 1, 1 << 20);
    loop.overlap_comm = reader.get_bool("overlap_comm", loop.overlap_comm);
    loop.threads = reader.get_int("threads", loop.threads, 0, 1024);
    reader.finish();
    return loop;
}

TrainConfig read_train_config(const nlohmann::json& root, const std::string& file) {
    ConfigReader reader(root, file);
    TrainConfig config;
    config.file = file;
    config.seed = static_cast<uint64_t>(reader.get_int("seed", 0, 0));
    config.device = read_device(reader);
    config.data = read_data(reader.child("data"), config.seed);
    config.model = read_model(reader.child("model"), config.seed);
    config.optim = read_optim(reader.child("optim"));
    config.train = read_loop(reader.child("train"));
    reader.finish();

    if (config.optim.warmup_steps >= config.train.steps)
        throw Error(fmt::format("{}: /optim/warmup_steps: expected fewer than /train/steps = {}, got {}", file,
                                config.train.steps, config.optim.warmup_steps));
    const int64_t T = data_seq_len(config.data);
    if (T > config.model.max_seq_len) {
        std::string key = config.data.source == "text" ? "/data/seq_len" : "/data/length";
        throw Error(fmt::format("{}: {}: sequences need {} positions, above the model's context "
                                "/model/max_seq_len = {}",
                                file, key, T, config.model.max_seq_len));
    }
    config.resolved = reader.resolved();
    return config;
}

double estimated_train_bytes(const TrainConfig& config, int64_t vocab_size) {
    // In double: the sizes are bounded, but their products need not fit an int64. A lower bound of
    // what a step holds (f32 = 4 bytes), so a config that fits is never refused.
    const TransformerOptions& m = config.model;
    const double D = double(m.dim), L = double(m.n_layers), V = double(vocab_size), H = double(m.n_heads);
    const double kv_dim = D / H * double(m.n_kv_heads);
    const double ffn_in = m.ffn_hidden_dim > 0 ? double(m.ffn_hidden_dim) : 4.0 * D;
    const double ffn = double(m.multiple_of) * std::ceil(std::floor(2.0 * ffn_in / 3.0) / double(m.multiple_of));
    const double params = 2.0 * V * D + L * (2.0 * D * D + 2.0 * D * kv_dim + 3.0 * D * ffn + 4.0 * D) + 2.0 * D;
    const double B = double(config.train.batch_size), T = double(data_seq_len(config.data));
    const double evals = double(config.data.eval_sequences) * (T + 1.0);
    const double tokens = 8.0 * 2.0 * evals;                       // held-out ids and targets, i64
    const double weights = 4.0 * 4.0 * params;                     // weights, grads, AdamW's two moments
    const double saved = 4.0 * B * T * (L * (8.0 * D + 3.0 * ffn) + 3.0 * V) +  // activations for backward
                         4.0 * 2.0 * B * H * T * T * L;                          // attention scores, softmax
    return tokens + weights + saved;
}

nlohmann::json checkpoint_metadata_json(const CheckpointInfo& info, const std::string& path, const std::string& key) {
    auto it = info.metadata.find(key);
    NL_REQUIRE(it != info.metadata.end(), path, ": not a normlab train checkpoint (no ", key, " in its metadata)");
    return parse_json(it->second, path + ": metadata '" + key + "'");
}

std::string checkpoint_path(const std::string& run_dir, int64_t step) {
    return fmt::format("{}/checkpoints/step_{:08}.safetensors", run_dir, step);
}

std::string latest_checkpoint(const std::string& run_dir) {
    std::error_code ec;
    std::string best;
    int64_t best_step = -1;
    static const std::regex pattern("step_([0-9]{8})\\.safetensors");
    for (const auto& entry : fs::directory_iterator(run_dir + "/checkpoints", ec)) {
        std::smatch match;
        std::string name = entry.path().filename().string();
        if (!std::regex_match(name, match, pattern)) continue;
        int64_t step = std::stoll(match[1].str());
        if (step > best_step) best_step = step, best = entry.path().string();
    }
    return best;
}

namespace {

// ---- the forward, and one evaluation over the held-out set ----

// Logits (B, T, V) in f32 for the loss. With autocast the forward runs under an AutocastGuard
// (bf16 matmuls, f32 weights and norms) and its bf16 logits are cast to f32 here, inside the
// recorded graph, so the loss and its softmax are computed in f32 as torch.autocast does.
Var forward_logits(Transformer& model, const Tensor& inputs, bool autocast) {
    AutocastGuard guard(DType::BF16, autocast);
    return autocast_f32(model.forward(inputs));
}

// The batch on `device` (a no-op on the CPU): the data pipeline always makes batches on the host,
// so the batches, and with them a resumed run, are the same on every device.
Batch batch_on(const Batch& batch, Device device) { return {batch.inputs.to(device), batch.targets.to(device)}; }

struct EvalResult {
    double loss = 0.0;            // mean cross-entropy per scored token
    double accuracy = NAN;        // exact-sequence (synthetic only)
    double token_accuracy = 0.0;  // next-token argmax accuracy over scored tokens
};

// Teacher-forced: one forward per batch. For exact-sequence accuracy this equals greedy decoding:
// if every answer token is the argmax given the true prefix, greedy decoding produces exactly that
// prefix at every step, and the first wrong argmax makes both fail. Over MPI ranks, rank r scores
// batches r, r + N, ...; the per-batch sums are reduced, then added in batch order, so the result is
// the same bits for any N.
EvalResult evaluate(Transformer& model, const std::vector<Batch>& batches, bool exact_sequences, bool autocast) {
    NoGradGuard no_grad;
    model.eval();
    std::vector<double> batch_loss(batches.size(), 0.0);  // (batches,) summed loss, zero where another rank scores
    int64_t counts[4] = {0, 0, 0, 0};  // scored, correct_tokens, correct_sequences, sequences
    int64_t& scored = counts[0];
    int64_t& correct_tokens = counts[1];
    int64_t& correct_sequences = counts[2];
    int64_t& sequences = counts[3];
    for (size_t index = static_cast<size_t>(dist::rank()); index < batches.size();
         index += static_cast<size_t>(dist::world_size())) {
        const Batch& batch = batches[index];
        Var logits = forward_logits(model, batch.inputs, autocast);  // (B, T, V) f32
        batch_loss[index] = cross_entropy_loss(logits, batch.targets, kIgnoreIndex, Reduction::Sum).item();
        // Counted on the host (the batches may live on a GPU).
        Tensor predicted = argmax(logits.data(), -1).to(Device::cpu()).contiguous();  // (B, T) i64
        Tensor targets = batch.targets.to(Device::cpu()).contiguous();
        const int64_t B = targets.size(0), T = targets.size(1);
        const int64_t* p = predicted.data<int64_t>();
        const int64_t* y = targets.data<int64_t>();
        for (int64_t b = 0; b < B; ++b) {
            bool all_right = true;
            for (int64_t t = 0; t < T; ++t) {
                if (y[b * T + t] == kIgnoreIndex) continue;
                bool right = p[b * T + t] == y[b * T + t];
                correct_tokens += right;
                all_right = all_right && right;
                ++scored;
            }
            correct_sequences += all_right;
            ++sequences;
        }
    }
    dist::allreduce_sum(batch_loss.data(), static_cast<int64_t>(batch_loss.size()));  // x + 0: exact
    dist::allreduce_sum(counts, 4);
    double loss_sum = 0.0;
    for (double value : batch_loss) loss_sum += value;
    model.train();
    EvalResult result;
    result.loss = loss_sum / static_cast<double>(scored);
    result.token_accuracy = static_cast<double>(correct_tokens) / static_cast<double>(scored);
    if (exact_sequences) result.accuracy = static_cast<double>(correct_sequences) / static_cast<double>(sequences);
    return result;
}

// ---- resuming ----

// The parts of a config a checkpoint's tensors and batches depend on; any difference means the
// checkpoint cannot continue this run.
void check_checkpoint_matches(const std::string& path, const TrainConfig& config) {
    CheckpointInfo info = read_checkpoint_info(path);
    nlohmann::json saved = checkpoint_metadata_json(info, path, "config");
    // A step past the end would resume a run that is already complete, and write its summary again.
    NL_REQUIRE(info.step <= config.train.steps, path, ": checkpoint is at step ", info.step,
               ", beyond /train/steps = ", config.train.steps, " in ", config.file);
    for (const char* section : {"/seed", "/model", "/data"}) {
        nlohmann::json::json_pointer pointer(section);
        nlohmann::json a = saved.contains(pointer) ? saved[pointer] : nlohmann::json();
        const nlohmann::json& b = config.resolved[pointer];
        if (a == b) continue;
        // Name the first differing key.
        std::string key = section, was = brief_json(a), now = brief_json(b);
        for (const auto& change : nlohmann::json::diff(a, b)) {
            key = std::string(section) + change["path"].get<std::string>();
            nlohmann::json::json_pointer p(change["path"].get<std::string>());
            was = a.contains(p) ? brief_json(a[p]) : "absent";
            now = b.contains(p) ? brief_json(b[p]) : "absent";
            break;
        }
        throw Error(fmt::format("{}: checkpoint does not match the config: {} is {} in the checkpoint, {} in {}",
                                path, key, was, now, config.file));
    }
}

// A resumed run keeps metrics.csv rows up to the checkpoint's step (rows written after it, by the
// interrupted run, are recomputed).
// A row that does not start with a step number (a line torn by a crash or a full disk) ends the
// kept rows: everything from it on is recomputed.
void truncate_metrics(const std::string& path, int64_t last_step) {
    std::ifstream in(path);
    if (!in.good()) return;
    std::string line, kept;
    bool header = true;
    while (std::getline(in, line)) {
        if (!header) {
            const std::string cell = line.substr(0, line.find(','));
            const bool number = !cell.empty() && cell.size() <= 18 && cell.find_first_not_of("0123456789") == std::string::npos;
            if (!number || std::stoll(cell) > last_step) break;
        }
        kept += line + "\n";
        header = false;
    }
    in.close();
    write_file_atomic(path, kept);
}

double median_of(std::vector<double> values) {
    if (values.empty()) return 0.0;
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string format_cell(double value) { return std::isnan(value) ? "" : format_number(value); }

// --profile: the kernel table (core/profiler.h) on stdout and in the run directory (profile.txt,
// profile.csv), over the steps this invocation ran.
void write_profile(const RunDir& run, double seconds, int64_t steps, bool quiet) {
    const std::vector<profiler::OpStats> rows = profiler::collected();
    const std::string table = profiler::format_table(rows, seconds, steps);
    run.write_text("profile.txt", table);
    run.write_text("profile.csv", profiler::format_csv(rows, seconds, steps));
    if (!quiet) fmt::print("{}", table);
}

// ---- the job ----

}  // namespace

// Test hook for the failure tests (tests/test_mpi.cpp): NORMLAB_TEST_FAULT="<rank>:<step>:throw|die"
// makes that rank throw an error, or die by SIGKILL, at that step, as a bug or a crashed node would.
void inject_test_fault(int64_t step) {
    const char* fault = std::getenv("NORMLAB_TEST_FAULT");
    if (fault == nullptr) return;
    int fault_rank = -1;
    long long fault_step = -1;
    char mode[8] = {0};
    NL_REQUIRE(std::sscanf(fault, "%d:%lld:%7s", &fault_rank, &fault_step, mode) == 3,
               "NORMLAB_TEST_FAULT: expected <rank>:<step>:throw|die, found \"", fault, "\"");
    if (fault_rank != dist::rank() || fault_step != step) return;
    if (std::string(mode) == "die") std::raise(SIGKILL);
    throw std::runtime_error(fmt::format("NORMLAB_TEST_FAULT: rank {} fails at step {}", fault_rank, step));
}

// The number of scored targets (not kIgnoreIndex) in rows [first, first + rows) of `targets` (B, T).
int64_t scored_targets(const Tensor& targets, int64_t first, int64_t rows) {
    const Tensor host = targets.narrow(0, first, rows).contiguous();
    const int64_t* y = host.data<int64_t>();
    int64_t count = 0;
    for (int64_t i = 0; i < host.numel(); ++i) count += y[i] != kIgnoreIndex;
    return count;
}

nlohmann::json run_train(const TrainFlags& flags) {
    const bool root_rank = dist::is_root();
    const bool quiet = flags.quiet || !root_rank;  // one progress line: rank 0's
    TrainConfig config;
    std::unique_ptr<Dataset> data;
    ShardPlan plan;
    std::optional<RunDir> run;  // rank 0's
    // Config, data, shards and run directory, checked on every rank: a mistake stops every rank with
    // one error (dist::JobError), and none is left waiting for the others.
    dist::run_on_every_rank([&] {
        // Config: read, override, validate (before anything is written).
        nlohmann::json root = load_json_file(flags.config_path);
        resolve_paths_beside_config(root, flags.config_path, {"/data/path"});
        for (const std::string& assignment : flags.overrides) apply_override(root, assignment);
        config = read_train_config(root, flags.config_path);
        require_device_available(config.device, flags.config_path + ": /device");
        // Sizes against the machine before anything big is allocated: first without the text's vocab
        // (the held-out set is made with the dataset), then with it. On a GPU the device allocator
        // reports its own out-of-memory; the host still holds the data.
        const std::string memory_keys = config.file + ": this config (/model, /data, /train/batch_size)";
        const int64_t known_vocab = config.data.source == "text" ? 0 : SyntheticTask::vocab_size_of(config.data);
        require_memory(config.device.is_cpu()
                           ? estimated_train_bytes(config, known_vocab)
                           : 8.0 * 2.0 * double(config.data.eval_sequences) * double(data_seq_len(config.data)),
                       memory_keys);
        plan = plan_shards(config.train.batch_size, config.train.grad_shards, dist::world_size(), dist::rank(),
                           config.file + ": /train");
        if (dist::world_size() > 1 && config.device.is_cuda()) {
            // Rank r of a machine uses its r-th GPU; the gradients are summed by NCCL.
            NL_REQUIRE(dist::built_with_nccl(), config.file, ": /device: \"", config.device.str(),
                       "\" over ", dist::world_size(), " MPI ranks needs NCCL, and this normlab was built without it");
            config.device = Device::cuda(dist::local_rank());
            require_device_available(config.device, flags.config_path + ": /device (rank " +
                                                        std::to_string(dist::rank()) + "'s local GPU)");
        }

        // Data: the text file is read here, so a missing or empty one fails before the run directory exists.
        data = make_dataset(config.data, config.file + ": /data");
        if (config.device.is_cpu()) {
            config.model.vocab_size = data->vocab_size();
            require_memory(estimated_train_bytes(config, config.model.vocab_size), memory_keys);
        }
        if (root_rank) run = RunDir::create(flags.config_path, flags.out, flags.force, flags.resume);
    });
    config.model.vocab_size = data->vocab_size();
    // CPU threads: train.threads, else OMP_NUM_THREADS, else auto (the cores other processes leave
    // free, re-read between steps). The governor decides when it is made, here, so the model is built
    // on that count too, and its first window of /proc ticks passes while the model is built.
    if (config.train.threads > 0) {
        omp_set_num_threads(static_cast<int>(config.train.threads));
        openblas_set_num_threads(static_cast<int>(config.train.threads));
    }
    ThreadGovernor governor(omp_get_max_threads(),
                            config.train.threads == 0 && std::getenv("OMP_NUM_THREADS") == nullptr);
    const std::string run_dir = dist::broadcast_string(run ? run->dir() : std::string());
    std::vector<Batch> eval_set = data->eval_batches(config.train.batch_size);
    for (Batch& batch : eval_set) batch = batch_on(batch, config.device);
    const bool autocast = config.train.autocast == "bf16";

    // Model and optimizer (the model moves first, so AdamW's moments are created on its device).
    Transformer model(config.model);
    model.to(config.device);
    NamedVars params = model.named_parameters();
    // The same seed gives the same weights on every rank; on the CPU rank 0's are sent anyway.
    if (dist::world_size() > 1 && config.device.is_cpu())
        for (auto& [name, p] : params) dist::broadcast(p.data().data<float>(), p.numel() * 4);
    DataParallel data_parallel(params, plan.local_shards, config.train.bucket_kb * 1024, config.train.overlap_comm);
    AdamOptions adam;
    adam.lr = config.optim.lr;
    adam.beta1 = config.optim.beta1;
    adam.beta2 = config.optim.beta2;
    adam.eps = config.optim.eps;
    adam.weight_decay = config.optim.weight_decay;
    AdamW optimizer(params, adam);
    LrSchedule schedule = LrSchedule::warmup_cosine(config.optim.lr, config.optim.warmup_steps,
                                                    config.train.steps, config.optim.min_lr);
    schedule.validate();
    CrossEntropyLoss criterion(CrossEntropyOptions{kIgnoreIndex});
    Generator data_gen(training_stream_seed(config.data));

    try {
        int64_t start_step = 0;
        // Every rank loads the checkpoint (rank 0 wrote it; the same file whatever N wrote it).
        dist::run_on_every_rank([&] {
            if (flags.resume) {
                std::string path = latest_checkpoint(run_dir);
                NL_REQUIRE(!path.empty(), "--resume: no checkpoint in ", run_dir, "/checkpoints to resume from");
                check_checkpoint_matches(path, config);
                start_step = load_checkpoint(path, model, &optimizer, &data_gen).step;
                if (root_rank) truncate_metrics(run->path("metrics.csv"), start_step);
            } else if (root_rank) {
                std::error_code ec;
                fs::remove_all(run->path("checkpoints"), ec);  // --force: old checkpoints must not be resumed
            }
            if (root_rank) {
                fs::create_directories(run->path("checkpoints"));
                run->write_json("config.json", config.resolved);
            }
        });

        std::map<std::string, std::string> metadata = {{"config", config.resolved.dump()},
                                                       {kTrainedSeqLenKey, std::to_string(data->seq_len())}};
        if (!data->vocab_metadata().is_null()) metadata["vocab"] = data->vocab_metadata().dump();
        auto save = [&](int64_t step) {
            if (root_rank)
                save_checkpoint(checkpoint_path(run_dir, step), model, &optimizer, &data_gen, step, metadata);
        };

        CsvWriter metrics;
        if (root_rank)
            metrics = CsvWriter(run->path("metrics.csv"),
                                {"step", "lr", "train_loss", "grad_norm", "val_loss", "val_accuracy",
                                 "val_token_accuracy", "tokens_per_s", "elapsed_s"},
                                flags.resume);
        const int world = dist::world_size();
        if (!quiet)
            fmt::print(stderr, "train: {} parameters, {} data, vocab {}, T = {}, on {}{}, {}{}, run directory {}\n",
                       count_parameters(model), config.data.source == "text" ? config.data.path : config.data.task,
                       data->vocab_size(), data->seq_len(), config.device.str(),
                       autocast ? " with bf16 autocast" : "", dist::describe(),
                       plan.shards > 1 ? fmt::format(", batch {} in {} shards of {} ({} buckets)", plan.batch,
                                                     plan.shards, plan.shard_rows, data_parallel.bucket_count())
                                       : "",
                       run_dir);

        // Train.
        const int64_t steps = config.train.steps;
        const int64_t end_step = flags.stop_after > 0 ? std::min(flags.stop_after, steps) : steps;
        const int64_t tokens_per_step = config.train.batch_size * data->seq_len();
        Progress progress(steps, quiet, config.train.log_every);
        double train_seconds = 0.0;
        double profiled_seconds = 0.0;  // the steps this invocation ran (a resumed run's earlier ones are not)
        int64_t profiled_steps = 0;
        if (flags.profile) profiler::reset();
        std::vector<double> step_seconds;  // (steps run,) each step's time, for the median
        int64_t tokens_seen = 0;
        double train_loss = NAN;
        EvalResult last_eval;
        bool evaluated = false;
        int64_t peak_step_bytes = 0;  // the allocator's peak within one step (the largest over the steps)
        model.train();
        for (int64_t step = start_step + 1; step <= end_step; ++step) {
            governor.update();
            reset_peak(config.device);  // the peak below is this step's: state + activations + temporaries
            auto t0 = std::chrono::steady_clock::now();
            double grad_norm = 0.0;
            const double lr = schedule.lr_at(step - 1);
            {
                profiler::EnableGuard profiling(flags.profile);  // --profile: time this step's kernels
                optimizer.set_lr(lr);
                // The global batch, the same on every rank; this rank computes its shards' rows.
                const Batch batch = data->train_batch(config.train.batch_size, data_gen);  // (B, T) on the host
                const int64_t batch_scored = scored_targets(batch.targets, 0, plan.batch);
                optimizer.zero_grad();
                std::vector<double> shard_losses;  // (local_shards,) each shard's weighted loss
                for (int64_t j = 0; j < plan.local_shards; ++j) {
                    const int64_t first = (plan.first_shard + j) * plan.shard_rows;
                    Var loss;
                    {
                        profiler::PhaseGuard forward(profiler::Phase::Forward);
                        const Batch shard = batch_on({batch.inputs.narrow(0, first, plan.shard_rows).contiguous(),
                                                      batch.targets.narrow(0, first, plan.shard_rows).contiguous()},
                                                     config.device);
                        Var logits = forward_logits(model, shard.inputs, autocast);  // (B / S, T, V) f32
                        loss = criterion.forward(logits, shard.targets);            // mean over the shard's targets
                        if (plan.shards > 1) {
                            // Weighted by the shard's share of the batch's targets: the shards' sum is the batch mean.
                            const int64_t shard_scored = scored_targets(batch.targets, first, plan.shard_rows);
                            NL_REQUIRE(shard_scored > 0, "train: shard rows [", first, ", ", first + plan.shard_rows,
                                       ") of step ", step, " have no scored targets; lower /train/grad_shards");
                            loss = loss * (static_cast<double>(shard_scored) / static_cast<double>(batch_scored));
                        }
                    }
                    shard_losses.push_back(loss.item());
                    data_parallel.backward(loss, j);  // the engine counts its kernels as backward
                }
                inject_test_fault(step);
                double loss_value = tree_sum(shard_losses);
                dist::allreduce_sum(&loss_value, 1);
                {
                    profiler::PhaseGuard optimizer_phase(profiler::Phase::Optimizer);
                    grad_norm = config.optim.grad_clip > 0 ? clip_grad_norm_(params, config.optim.grad_clip)
                                                           : nl::grad_norm(model.parameters());
                    optimizer.step();
                }
                train_loss = loss_value;
            }
            step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            peak_step_bytes = std::max(peak_step_bytes, memory_stats(config.device).peak_bytes);
            train_seconds += step_seconds.back();
            profiled_seconds += step_seconds.back();
            ++profiled_steps;
            tokens_seen += tokens_per_step;
            // The loss is the same on every rank, so every rank stops here together.
            if (!std::isfinite(train_loss))
                throw dist::JobError(detail::concat("train: the loss became ", train_loss, " at step ", step,
                                                    " (diverged; try a lower /optim/lr or /optim/grad_clip in ",
                                                    config.file, ")"),
                                     2);

            const bool last = step == steps;
            const bool eval_now = last || (config.train.eval_every > 0 && step % config.train.eval_every == 0);
            EvalResult eval;
            if (eval_now) {
                eval = evaluate(model, eval_set, data->has_accuracy(), autocast);
                last_eval = eval;
                evaluated = true;
            }
            const double tokens_per_s = static_cast<double>(tokens_seen) / train_seconds;
            if (root_rank) metrics.row({std::to_string(step), format_number(lr), format_number(train_loss), format_number(grad_norm),
                         eval_now ? format_number(eval.loss) : "", eval_now ? format_cell(eval.accuracy) : "",
                         eval_now ? format_number(eval.token_accuracy) : "", format_number(tokens_per_s),
                         format_number(progress.elapsed_seconds())});
            std::string fields = fmt::format("loss {:.4f} lr {:.2e} | {:.0f} tok/s", train_loss, lr, tokens_per_s);
            if (world > 1) fields += fmt::format(" | {} ranks", world);
            if (governor.threads() < governor.max_threads())
                fields += fmt::format(" | {} of {} threads (cores busy elsewhere)", governor.threads(),
                                      governor.max_threads());
            if (evaluated)
                fields += data->has_accuracy()
                              ? fmt::format(" | val {:.4f} acc {:.2f}%", last_eval.loss, 100 * last_eval.accuracy)
                              : fmt::format(" | val {:.4f}", last_eval.loss);
            progress.update(step, fields);

            const bool checkpoint_now =
                last || step == end_step ||
                (config.train.checkpoint_every > 0 && step % config.train.checkpoint_every == 0);
            if (checkpoint_now) save(step);
        }
        progress.finish();
        if (flags.profile && root_rank) write_profile(*run, profiled_seconds, profiled_steps, flags.quiet);

        if (end_step < steps) {
            if (!quiet)
                fmt::print(stderr, "train: stopped after step {} of {} (--stop-after); continue with --resume\n",
                           end_step, steps);
            return nullptr;  // no summary: the run is not complete
        }
        if (!evaluated) last_eval = evaluate(model, eval_set, data->has_accuracy(), autocast);  // resumed at the end

        // Report.
        nlohmann::json summary = {
            {"config", flags.config_path},
            {"steps", steps},
            {"resumed_from_step", start_step},
            {"device", config.device.str()},
            {"autocast", config.train.autocast},
            {"parameters", count_parameters(model)},
            {"final_train_loss", train_loss},
            {"val_loss", last_eval.loss},
            {"val_token_accuracy", last_eval.token_accuracy},
            {"tokens_per_s", train_seconds > 0 ? static_cast<double>(tokens_seen) / train_seconds : 0.0},
            {"train_seconds", train_seconds},
            {"wall_seconds", progress.elapsed_seconds()},
            {"checkpoint", latest_checkpoint(run_dir)},
            {"world_size", world},
            {"grad_shards", plan.shards},
            {"comm_wait_seconds", data_parallel.comm_wait_seconds()},
            {"median_step_seconds", median_of(step_seconds)},
            {"peak_step_bytes", peak_step_bytes},
            {"threads", governor.threads()},
        };
        if (data->has_accuracy()) {
            summary["val_accuracy"] = last_eval.accuracy;
            summary["held_out_sequences"] = config.data.eval_sequences;
        }
        if (root_rank) run->write_summary(summary);
        if (!quiet) {
            std::string accuracy = data->has_accuracy()
                                       ? fmt::format(", exact-sequence accuracy {:.2f}% on {} held-out sequences",
                                                     100 * last_eval.accuracy, config.data.eval_sequences)
                                       : "";
            fmt::print("train: step {}: train loss {:.4f}, val loss {:.4f}{}, {:.0f} tokens/s, peak memory {:.1f} MiB "
                       "per step, {:.1f} s -> {}\n",
                       steps, train_loss, last_eval.loss, accuracy, summary["tokens_per_s"].get<double>(),
                       static_cast<double>(peak_step_bytes) / (1 << 20), progress.elapsed_seconds(), run_dir);
        }
        return summary;
    } catch (const std::exception& e) {
        if (run) run->write_error(e.what());
        throw;
    }
}

void register_train(CLI::App& app) {
    auto flags = std::make_shared<TrainFlags>();
    CLI::App* cmd = app.add_subcommand("train", "Train the toy transformer from a JSON config");
    cmd->add_option("config", flags->config_path, "JSON config (configs/toy_transformer.json)")->required();
    cmd->add_option("--set", flags->overrides, "Override a config key: --set train.steps=200 (repeatable)");
    cmd->add_option("--out", flags->out, "Run directory (default runs/<config name>-<timestamp>)");
    cmd->add_flag("--force", flags->force, "Overwrite an existing run directory");
    cmd->add_flag("--resume", flags->resume, "Continue the run in --out from its latest checkpoint");
    cmd->add_flag("--quiet", flags->quiet, "No progress line or report");
    cmd->add_flag("--profile", flags->profile,
                  "Time every kernel by op and phase (forward, backward, optimizer) and print the table "
                  "(calls, ms/step, share of the step, GFLOP/s or GB/s); also written to the run directory "
                  "as profile.txt and profile.csv (docs/profiling.md)");
    cmd->add_option("--stop-after", flags->stop_after,
                    "Stop after this step as if interrupted, leaving a checkpoint to --resume from");
    cmd->callback([flags] {
        NL_REQUIRE(!flags->resume || !flags->out.empty(), "train: --resume needs --out naming the run directory");
        NL_REQUIRE(!(flags->resume && flags->force), "train: --resume and --force cannot be combined");
        NL_REQUIRE(flags->stop_after >= 0, "train: --stop-after must be >= 0, found ", flags->stop_after);
        run_train(*flags);
    });
}

}  // namespace nl::cli
