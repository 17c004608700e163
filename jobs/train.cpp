// The train job (jobs/train.h). Reads top to bottom: helpers (the forward, one evaluation, the
// metrics file), then the session: set up (config -> data -> run directory -> model -> resume),
// one step, stop, finish (profile, summary), and run_train's loop.
//
// "device" puts the model, the batches and AdamW's state on a GPU (batches are made on the host, so
// every device sees the same data); losses are read back to the host. train.autocast "bf16" runs the
// forward under an AutocastGuard (layers/autocast.h): bf16 matmuls, f32 weights, norms, softmax and
// loss.
//
// Exact resumes: a checkpoint holds the model, AdamW's moments and step, the data generator's state
// (the only randomness in a step) and the step, so a run stopped at a checkpoint and resumed
// computes the same batches, gradients and updates bit for bit as one that never stopped.
#include "jobs/train.h"

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
#include <map>
#include <optional>

#include <fmt/core.h>

#include "autograd/autograd.h"
#include "core/dist.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/profiler.h"
#include "core/safetensors.h"
#include "core/thread_governor.h"
#include "jobs/config.h"
#include "jobs/distributed.h"
#include "jobs/interop.h"
#include "jobs/run_dir.h"
#include "layers/autocast.h"
#include "layers/checkpoint.h"
#include "layers/loss.h"
#include "jobs/probes.h"
#include "jobs/sharpness.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/schedule.h"

namespace fs = std::filesystem;

namespace nl {

namespace {

// Logits (B, T, V): f32, or bf16 under autocast, where the forward runs under an AutocastGuard (bf16
// matmuls, f32 weights and norms). `cache`, where given, holds the step's parameter casts, so the
// step's shards cast each weight once.
Var forward_logits(Transformer& model, const Tensor& inputs, bool autocast, AutocastCache* cache = nullptr) {
    AutocastGuard guard(DType::BF16, autocast, cache);
    return model.forward(inputs);
}

// The loss of logits from forward_logits, under the same autocast, so it is computed in f32 as
// torch.autocast computes it: the fused cross-entropy reads bf16 logits as they are and returns an
// f32 loss (layers/loss.h), with no f32 copy of the (B, T, V) logits.
CrossEntropyTerms loss_of(CrossEntropyLoss& criterion, const Var& logits, const Tensor& targets, bool autocast) {
    AutocastGuard guard(DType::BF16, autocast);
    return criterion.forward_terms(logits, targets);
}

// The batch on `device` (a no-op on the CPU): the data pipeline always makes batches on the host,
// so the batches, and with them a resumed run, are the same on every device.
Batch batch_on(const Batch& batch, Device device) { return {batch.inputs.to(device), batch.targets.to(device)}; }

// Teacher-forced: one forward per batch. For exact-sequence accuracy this equals greedy decoding:
// if every answer token is the argmax given the true prefix, greedy decoding produces exactly that
// prefix at every step, and the first wrong argmax makes both fail. Over MPI ranks, rank r scores
// batches r, r + N, ...; the per-batch sums are reduced, then added in batch order, so the result is
// the same bits for any N.
EvalResult evaluate_on(Transformer& model, const std::vector<Batch>& batches, bool exact_sequences, bool autocast) {
    NoGradGuard no_grad;
    model.eval();
    std::vector<double> batch_loss(batches.size(), 0.0);  // (batches,) summed loss, zero where another rank scores
    int64_t counts[4] = {0, 0, 0, 0};  // scored, correct_tokens, correct_sequences, sequences
    int64_t& scored = counts[0];
    int64_t& correct_tokens = counts[1];
    int64_t& correct_sequences = counts[2];
    int64_t& sequences = counts[3];
    CrossEntropyLoss summed{CrossEntropyOptions{.ignore_index = kIgnoreIndex, .reduction = Reduction::Sum}};
    for (size_t index = static_cast<size_t>(dist::rank()); index < batches.size();
         index += static_cast<size_t>(dist::world_size())) {
        const Batch& batch = batches[index];
        Var logits = forward_logits(model, batch.inputs, autocast);  // (B, T, V), bf16 under autocast
        batch_loss[index] = loss_of(summed, logits, batch.targets, autocast).loss.item();
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
// --profile: the kernel table (core/profiler.h) over the steps this session ran, written to the run
// directory as profile.txt and profile.csv; returns the table.
std::string write_profile(const RunDir& run, double seconds, int64_t steps) {
    const std::vector<profiler::OpStats> rows = profiler::collected();
    const std::string table = profiler::format_table(rows, seconds, steps);
    run.write_text("profile.txt", table);
    run.write_text("profile.csv", profiler::format_csv(rows, seconds, steps));
    return table;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// ---- the session's state ----

struct TrainSession::State {
    TrainJob job;
    std::string config_file;  // the config's name in messages: its path, or job.config_name
    bool root_rank = dist::is_root();
    TrainConfig config;
    std::unique_ptr<Dataset> data;
    ShardPlan plan;
    std::optional<RunDir> run;  // rank 0's
    std::string run_dir;        // every rank's copy of rank 0's path
    std::optional<ThreadGovernor> governor;
    std::vector<Batch> eval_set;  // the held-out batches, on the device
    bool autocast = false;

    std::optional<PretrainedModel> pretrained;  // /model/init_from's weights, until the model takes them
    std::unique_ptr<Transformer> model;
    NamedVars params;
    std::unique_ptr<DataParallel> data_parallel;
    std::unique_ptr<AdamW> optimizer;
    LrSchedule schedule;
    std::optional<CrossEntropyLoss> criterion;  // with train.z_loss
    std::optional<Generator> data_gen;
    std::map<std::string, std::string> metadata;  // each checkpoint's: the config, T, the text vocab
    CsvWriter metrics;                            // rank 0's metrics.csv
    CsvWriter probes;                             // rank 0's probes.csv (train.probe_every > 0)

    int64_t start_step = 0;  // the checkpoint's step when resuming, else 0
    int64_t step = 0;        // steps done
    int64_t end_step = 0;
    int64_t saved_step = -1;  // the step of the latest checkpoint this session wrote
    bool finished = false;

    std::chrono::steady_clock::time_point start;
    double train_seconds = 0.0;  // the steps' time, evaluations and checkpoints left out
    std::vector<double> step_seconds;  // (steps run,) each step's time, for the median
    int64_t tokens_seen = 0;
    int64_t peak_step_bytes = 0;  // the allocator's peak within one step (the largest over the steps)
    double train_loss = NAN;
    EvalResult last_eval;
    bool evaluated = false;

    // Runs `f`; an exception leaves error.txt in the run directory (the mark of a failed run).
    template <typename F>
    auto guarded(F&& f) {
        try {
            return f();
        } catch (const std::exception& e) {
            if (run) run->write_error(e.what());
            throw;
        }
    }
};

namespace {

using State = TrainSession::State;

// ---- set-up ----

// Config, data, shards and run directory, checked on every rank: a mistake stops every rank with
// one error (dist::JobError), and none is left waiting for the others.
void prepare(State& s) {
    dist::run_on_every_rank([&] {
        // Config: read, override, validate (before anything is written).
        nlohmann::json root = s.job.config;
        if (!s.job.config_path.empty()) {
            root = load_json_file(s.job.config_path);
            resolve_paths_beside_config(root, s.job.config_path, {"/data/path", "/model/init_from"});
        }
        for (const std::string& assignment : s.job.overrides) apply_override(root, assignment);
        s.config = read_train_config(root, s.config_file);
        TrainConfig& config = s.config;
        if (!config.init_from.empty()) {
            // The architecture comes from the file (jobs/interop.h); its weights replace the init.
            s.pretrained = load_pretrained(config.init_from);
            adopt_pretrained_architecture(config, root.contains("model") ? root["model"] : nlohmann::json(), *s.pretrained);
        }
        require_device_available(config.device, s.config_file + ": /device");
        // Sizes against the machine before anything big is allocated: first without the text's vocab
        // (the held-out set is made with the dataset), then with it. On a GPU the device allocator
        // reports its own out-of-memory; the host still holds the data.
        const std::string memory_keys = config.file + ": this config (/model, /data, /train/batch_size)";
        const int64_t known_vocab = config.data.source == "text" ? 0 : SyntheticTask::vocab_size_of(config.data);
        require_memory(config.device.is_cpu()
                           ? estimated_train_bytes(config, known_vocab)
                           : 8.0 * 2.0 * double(config.data.eval_sequences) * double(data_seq_len(config.data)),
                       memory_keys);
        s.plan = plan_shards(config.train.batch_size, config.train.grad_shards, dist::world_size(), dist::rank(),
                             config.file + ": /train");
        NL_REQUIRE(config.model.dtype != DType::F64 || dist::world_size() == 1, config.file,
                   ": /train/dtype: \"f64\" runs on one process, found ", dist::world_size(), " MPI ranks");
        if (dist::world_size() > 1 && config.device.is_cuda()) {
            // Rank r of a machine uses its r-th GPU; the gradients are summed by NCCL.
            NL_REQUIRE(dist::built_with_nccl(), config.file, ": /device: \"", config.device.str(), "\" over ",
                       dist::world_size(), " MPI ranks needs NCCL, and this normlab was built without it");
            config.device = Device::cuda(dist::local_rank());
            require_device_available(config.device, s.config_file + ": /device (rank " +
                                                        std::to_string(dist::rank()) + "'s local GPU)");
        }
        // Data: the text file is read here, so a missing or empty one fails before the run directory exists.
        s.data = make_dataset(config.data, config.file + ": /data");
        if (s.pretrained) check_pretrained_vocab(config, *s.data, *s.pretrained);
        if (config.device.is_cpu()) {
            config.model.vocab_size = model_vocab_size(config, s.data->vocab_size());
            require_memory(estimated_train_bytes(config, config.model.vocab_size), memory_keys);
        }
        if (s.root_rank) {
            const std::string name_for_dir = s.job.config_path.empty() ? s.job.config_name : s.job.config_path;
            s.run = RunDir::create(name_for_dir, s.job.out, s.job.force, s.job.resume);
        }
    });
    s.config.model.vocab_size = model_vocab_size(s.config, s.data->vocab_size());
    s.run_dir = dist::broadcast_string(s.run ? s.run->dir() : std::string());
}

// CPU threads: train.threads, else OMP_NUM_THREADS, else auto (the cores other processes leave free,
// re-read between steps). The governor decides when it is made, so the model is built on that count
// too, and its first window of /proc ticks passes while the model is built.
void start_threads(State& s) {
    const int64_t threads = s.config.train.threads;
    if (threads > 0) {
        omp_set_num_threads(static_cast<int>(threads));
        openblas_set_num_threads(static_cast<int>(threads));
    }
    s.governor.emplace(omp_get_max_threads(), threads == 0 && std::getenv("OMP_NUM_THREADS") == nullptr);
}

// Model and optimizer (the model moves first, so AdamW's moments are created on its device).
void build_model(State& s) {
    const TrainConfig& config = s.config;
    s.eval_set = s.data->eval_batches(config.train.batch_size);
    for (Batch& batch : s.eval_set) batch = batch_on(batch, config.device);
    s.autocast = config.train.autocast == "bf16";
    s.model = std::make_unique<Transformer>(config.model);
    if (config.model.dtype == DType::F64) {
        // The f32 run's initial weights (the same draws, or the pretrained ones), widened exactly: an
        // f64 run starts where the f32 run of its seed starts, so the two can be compared.
        TransformerOptions drawn = config.model;
        drawn.dtype = DType::F32;
        NamedTensors weights = s.pretrained ? s.pretrained->weights : Transformer(drawn).state_dict();
        for (auto& [name, t] : weights) t = t.to(DType::F64);
        s.model->load_state_dict(weights);
        s.pretrained.reset();
    } else if (s.pretrained) {
        s.model->load_state_dict(s.pretrained->weights);
        s.pretrained.reset();  // the model holds the weights now
    }
    s.model->to(config.device);
    s.params = s.model->named_parameters();
    s.criterion.emplace(CrossEntropyOptions{.ignore_index = kIgnoreIndex, .z_loss = config.train.z_loss});
    // The same seed gives the same weights on every rank; on the CPU rank 0's are sent anyway.
    if (dist::world_size() > 1 && config.device.is_cpu())
        for (auto& [name, p] : s.params) dist::broadcast(p.data().data<float>(), p.numel() * 4);
    s.data_parallel = std::make_unique<DataParallel>(s.params, s.plan.local_shards, config.train.bucket_kb * 1024,
                                                     config.train.overlap_comm);
    AdamOptions adam;
    adam.lr = config.optim.lr;
    adam.beta1 = config.optim.beta1;
    adam.beta2 = config.optim.beta2;
    adam.eps = config.optim.eps;
    // optim.decay and optim.weight_decay_mode as one coefficient per parameter (parameter_weight_decay):
    // the matrices' value for all, and the others' where it differs.
    adam.weight_decay = parameter_weight_decay(config.optim, 2);
    for (const auto& [name, p] : s.params) {
        const double decay = parameter_weight_decay(config.optim, p.dim());
        if (decay != adam.weight_decay) adam.weight_decay_of[name] = decay;
    }
    s.optimizer = std::make_unique<AdamW>(s.params, adam);
    s.schedule = LrSchedule::warmup_cosine(config.optim.lr, config.optim.warmup_steps, config.train.steps,
                                           config.optim.min_lr);
    s.schedule.validate();
    s.data_gen.emplace(training_stream_seed(config.data));
}

// Resume from the run directory's latest checkpoint, or start it afresh; then config.json, the
// checkpoints' metadata and metrics.csv. Every rank loads the checkpoint (rank 0 wrote it; the
// same file whatever the number of ranks that wrote it).
void open_run(State& s) {
    dist::run_on_every_rank([&] {
        if (s.job.resume) {
            const std::string path = latest_checkpoint(s.run_dir);
            NL_REQUIRE(!path.empty(), "--resume: no checkpoint in ", s.run_dir, "/checkpoints to resume from");
            check_checkpoint_matches(path, s.config);
            s.start_step = load_checkpoint(path, *s.model, s.optimizer.get(), &*s.data_gen).step;
            if (s.root_rank) truncate_metrics(s.run->path("metrics.csv"), s.start_step);
        } else if (s.root_rank) {
            std::error_code ec;
            fs::remove_all(s.run->path("checkpoints"), ec);  // force: old checkpoints must not be resumed
        }
        if (s.root_rank) {
            fs::create_directories(s.run->path("checkpoints"));
            s.run->write_json("config.json", s.config.resolved);
        }
    });
    s.step = s.start_step;
    s.saved_step = s.job.resume ? s.start_step : -1;
    const int64_t steps = s.config.train.steps;
    s.end_step = s.job.stop_after > 0 ? std::min(s.job.stop_after, steps) : steps;
    s.metadata = {{"config", s.config.resolved.dump()}, {kTrainedSeqLenKey, std::to_string(s.data->seq_len())}};
    if (!s.data->vocab_metadata().is_null()) s.metadata["vocab"] = s.data->vocab_metadata().dump();
    if (s.root_rank) s.metrics = CsvWriter(s.run->path("metrics.csv"), metrics_columns(), s.job.resume);
}

// probes.csv's header and writer (rank 0, train.probe_every or train.sharpness_every > 0): the
// probes' columns, then the sharpness columns; a resumed run keeps its rows up to the checkpoint's
// step, as metrics.csv does.
void open_probes(State& s) {
    const LoopConfig& loop = s.config.train;
    if (!s.root_rank || (loop.probe_every == 0 && loop.sharpness_every == 0)) return;
    std::vector<std::string> columns = {"step"};
    if (loop.probe_every > 0)
        for (const std::string& c : probe_columns(*s.model)) columns.push_back(c);
    if (loop.sharpness_every > 0)
        for (const std::string& c : sharpness_columns()) columns.push_back(c);
    if (s.job.resume) truncate_metrics(s.run->path("probes.csv"), s.start_step);
    s.probes = CsvWriter(s.run->path("probes.csv"), columns, s.job.resume);
}

// ---- one step ----

void save_checkpoint_at(State& s, int64_t step) {
    if (s.root_rank)
        save_checkpoint(checkpoint_path(s.run_dir, step), *s.model, s.optimizer.get(), &*s.data_gen, step, s.metadata);
    s.saved_step = step;
}

// train.save_initial: the weights before the first update, as checkpoint step 0 (a fresh run only: a
// resumed one has it already).
void save_initial(State& s) {
    if (!s.config.train.save_initial || s.job.resume) return;
    save_checkpoint_at(s, 0);
}

// train.save_batches: every step's global batch, drawn up front from a copy of the data generator in
// the order the steps draw them, so the file exists before the first update and a run stopped early
// has it whole. inputs and targets (steps, B, T) i64, targets kIgnoreIndex where the loss skips.
void save_batches(State& s) {
    if (!s.config.train.save_batches || s.job.resume || !s.root_rank) return;
    Generator gen = *s.data_gen;
    std::vector<Tensor> inputs, targets;  // (steps,) of (1, B, T)
    for (int64_t step = 0; step < s.config.train.steps; ++step) {
        const Batch batch = s.data->train_batch(s.config.train.batch_size, gen);
        inputs.push_back(batch.inputs.unsqueeze(0));
        targets.push_back(batch.targets.unsqueeze(0));
    }
    save_safetensors(s.run->path(kSavedBatchesFile), {{"inputs", cat(inputs, 0)}, {"targets", cat(targets, 0)}},
                     {{"format", "normlab batches"}, {"ignore_index", std::to_string(kIgnoreIndex)}});
}

// The forward and backward of every shard this rank computes of the step's global batch (the same
// on every rank, on the host), leaving the batch's gradient in .grad; returns the batch's mean
// cross-entropy and z-loss term (the same on every rank): the gradient is the sum's.
struct StepLoss {
    double cross_entropy = 0.0;
    double z_loss = 0.0;
};

// This rank's j-th shard of the step's batch, on the device, and its weight in the batch's mean loss:
// its share of the batch's scored targets (1 with one shard), so the weighted shards sum to the batch
// mean. batch_scored is the batch's count of scored targets.
struct Shard {
    Batch batch;
    double share = 1.0;
};
Shard local_shard(const State& s, const Batch& batch, int64_t j, int64_t batch_scored, int64_t step) {
    const ShardPlan& plan = s.plan;
    const int64_t first = (plan.first_shard + j) * plan.shard_rows;
    Shard shard;
    shard.batch = batch_on({batch.inputs.narrow(0, first, plan.shard_rows).contiguous(),
                            batch.targets.narrow(0, first, plan.shard_rows).contiguous()},
                           s.config.device);
    if (plan.shards > 1) {
        const int64_t shard_scored = scored_targets(batch.targets, first, plan.shard_rows);
        NL_REQUIRE(shard_scored > 0, "train: shard rows [", first, ", ", first + plan.shard_rows, ") of step ", step,
                   " have no scored targets; lower /train/grad_shards");
        shard.share = static_cast<double>(shard_scored) / static_cast<double>(batch_scored);
    }
    return shard;
}

StepLoss forward_backward(State& s, int64_t step, const Batch& batch, StepProbe* probe) {
    const ShardPlan& plan = s.plan;
    const int64_t batch_scored = scored_targets(batch.targets, 0, plan.batch);
    s.optimizer->zero_grad();
    AutocastCache casts;  // the weights' bf16 copies, made once for all of this step's shards
    std::vector<double> shard_losses;  // (local_shards,) each shard's weighted loss (cross-entropy + z term)
    std::vector<double> shard_z;       // (local_shards,) each shard's weighted z term
    for (int64_t j = 0; j < plan.local_shards; ++j) {
        Var loss;
        double z_term = 0.0;
        {
            profiler::PhaseGuard forward(profiler::Phase::Forward);
            const Shard shard = local_shard(s, batch, j, batch_scored, step);
            // The probe reads the step's first shard's activations (the whole batch on one process).
            if (probe && j == 0) probe->begin();
            Var logits = forward_logits(*s.model, shard.batch.inputs, s.autocast, &casts);  // (B / S, T, V)
            if (probe && j == 0) probe->end_forward();
            const CrossEntropyTerms terms = loss_of(*s.criterion, logits, shard.batch.targets, s.autocast);
            loss = terms.loss;  // f32: mean over the shard's targets
            z_term = terms.z_loss.item();
            if (plan.shards > 1) {
                loss = loss * shard.share;
                z_term *= shard.share;
            }
        }
        shard_losses.push_back(loss.item());
        shard_z.push_back(z_term);
        s.data_parallel->backward(loss, j);  // the engine counts its kernels as backward
    }
    inject_test_fault(step);
    double sums[2] = {tree_sum(shard_losses), tree_sum(shard_z)};
    dist::allreduce_sum(sums, 2);
    return {sums[0] - sums[1], sums[1]};  // z_loss 0: the loss's own bits
}

// The step's training objective for the sharpness probe: the loss the step differentiated (the
// cross-entropy plus the z-loss term, each shard's weighted by its share of the batch's targets), one
// term per shard this rank computes, in the weights' dtype. Under bf16 autocast the f32 objective
// that the autocast step rounds: a Hessian of bf16 products would be rounding noise.
ObjectiveTerms step_objective(State& s, const Batch& batch, int64_t step) {
    const ShardPlan& plan = s.plan;
    const int64_t batch_scored = scored_targets(batch.targets, 0, plan.batch);
    ObjectiveTerms terms;
    for (int64_t j = 0; j < plan.local_shards; ++j) {
        const Shard shard = local_shard(s, batch, j, batch_scored, step);
        terms.push_back([&s, shard, weighted = plan.shards > 1] {
            Var loss = loss_of(*s.criterion, forward_logits(*s.model, shard.batch.inputs, false), shard.batch.targets,
                               false).loss;
            return weighted ? loss * shard.share : loss;
        });
    }
    return terms;
}

// The sharpness row of a step (train.sharpness_every): called after the optimizer's step with the
// weights the step started from, `before`. The plain sharpness is taken at those weights; so is the
// preconditioned one, with P from the moments the step's update used (the optimizer's state now),
// the updated weights put back after. Lanczos starts from the same vector in both, drawn from the
// run's seed and the step.
ProbeValues step_sharpness(State& s, int64_t step, double lr, const Batch& batch, const std::vector<Tensor>& before) {
    profiler::EnableGuard not_profiled(false);  // --profile's table is the training step's kernels
    const LoopConfig& loop = s.config.train;
    const OptimConfig& optim = s.config.optim;
    std::vector<Var> params;
    std::vector<std::string> names;
    for (const auto& [name, p] : s.params) {
        names.push_back(name);
        params.push_back(p);
    }
    std::vector<Tensor> after;  // (parameters,) the updated weights, while the step's own are back
    for (size_t i = 0; i < params.size(); ++i) {
        after.push_back(params[i].data().clone());
        params[i].data().copy_(before[i]);
    }
    const ObjectiveTerms terms = step_objective(s, batch, step);
    const uint64_t seed = s.config.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(step);
    const double plain = objective_sharpness(terms, params, loop.sharpness_iters, seed);
    const std::vector<double> scale =
        adam_inverse_sqrt_preconditioner(s.optimizer->state_dict(), names, params, optim.beta2, optim.eps);
    const double adam = objective_sharpness(terms, params, loop.sharpness_iters, seed, scale);
    for (size_t i = 0; i < params.size(); ++i) params[i].data().copy_(after[i]);
    const std::vector<std::string>& columns = sharpness_columns();
    return {{columns[0], plain}, {columns[1], adam}, {columns[2], adam_sharpness_threshold(optim.beta1, lr)}};
}

// The optimizer step of `step` (1-based): lr from the schedule, forward and backward, clipping, AdamW.
// A probed step's row (probes.csv) holds its probes and sharpness; a family not measured at this
// step is NaN (an empty cell).
TrainStep train_step(State& s, int64_t step) {
    TrainStep out;
    out.step = step;
    out.steps = s.config.train.steps;
    out.lr = s.schedule.lr_at(step - 1);
    profiler::EnableGuard profiling(s.job.profile);  // time this step's kernels
    s.optimizer->set_lr(out.lr);
    const LoopConfig& loop = s.config.train;
    std::optional<StepProbe> probe;
    if (loop.probe_every > 0 && step % loop.probe_every == 0) probe.emplace(*s.model);
    const bool sharpness = loop.sharpness_every > 0 && step % loop.sharpness_every == 0;
    // The global batch, the same on every rank; this rank computes its shards' rows.
    const Batch batch = s.data->train_batch(loop.batch_size, *s.data_gen);  // (B, T) on the host
    const StepLoss loss = forward_backward(s, step, batch, probe ? &*probe : nullptr);
    out.train_loss = loss.cross_entropy;
    out.z_loss = loss.z_loss;
    profiler::PhaseGuard optimizer_phase(profiler::Phase::Optimizer);
    if (probe) probe->gradients();  // the batch's gradient, before clipping
    const double clip = s.config.optim.grad_clip;
    out.grad_norm = clip > 0 ? clip_grad_norm_(s.params, clip) : nl::grad_norm(s.model->parameters());
    if (probe) probe->before_update();
    std::vector<Tensor> before;  // (parameters,) the weights the step starts from, for the sharpness
    if (sharpness)
        for (const auto& [name, p] : s.params) before.push_back(p.data().clone());
    s.optimizer->step();
    if (!probe && !sharpness) return out;
    if (loop.probe_every > 0) {
        if (probe) out.probes = probe->values();
        else
            for (const std::string& c : probe_columns(*s.model)) out.probes.emplace_back(c, NAN);
    }
    if (sharpness) {
        const ProbeValues row = step_sharpness(s, step, out.lr, batch, before);
        out.probes.insert(out.probes.end(), row.begin(), row.end());
    } else if (loop.sharpness_every > 0) {
        for (const std::string& c : sharpness_columns()) out.probes.emplace_back(c, NAN);
    }
    return out;
}

void write_metrics_row(State& s, const TrainStep& t) {
    if (!s.root_rank) return;
    std::vector<std::string> cells;
    for (const MetricsCell& cell : metrics_row(t)) cells.push_back(cell.value ? format_number(*cell.value) : "");
    s.metrics.row(cells);
}

void write_probes_row(State& s, const TrainStep& t) {
    if (!s.root_rank || t.probes.empty()) return;
    std::vector<std::string> cells = {std::to_string(t.step)};
    for (const auto& [name, value] : t.probes) cells.push_back(format_cell(value));
    s.probes.row(cells);
}

nlohmann::json summary_of(const State& s) {
    const TrainConfig& config = s.config;
    nlohmann::json summary = {
        {"config", s.job.config_path.empty() ? s.job.config_name : s.job.config_path},
        {"steps", config.train.steps},
        {"resumed_from_step", s.start_step},
        {"device", config.device.str()},
        {"autocast", config.train.autocast},
        {"dtype", config.train.dtype},
        {"parameters", count_parameters(*s.model)},
        {"final_train_loss", s.train_loss},
        {"val_loss", s.last_eval.loss},
        {"val_token_accuracy", s.last_eval.token_accuracy},
        {"tokens_per_s", s.train_seconds > 0 ? static_cast<double>(s.tokens_seen) / s.train_seconds : 0.0},
        {"train_seconds", s.train_seconds},
        {"wall_seconds", seconds_since(s.start)},
        {"checkpoint", latest_checkpoint(s.run_dir)},
        {"world_size", dist::world_size()},
        {"grad_shards", s.plan.shards},
        {"comm_wait_seconds", s.data_parallel->comm_wait_seconds()},
        {"median_step_seconds", median_of(s.step_seconds)},
        {"peak_step_bytes", s.peak_step_bytes},
        {"threads", s.governor->threads()},
    };
    if (s.data->has_accuracy()) {
        summary["val_accuracy"] = s.last_eval.accuracy;
        summary["held_out_sequences"] = config.data.eval_sequences;
    }
    return summary;
}

}  // namespace

// ---- metrics.csv ----

std::vector<MetricsCell> metrics_row(const TrainStep& t) {
    const auto when_evaluated = [&](double value) { return t.evaluated ? std::optional<double>(value) : std::nullopt; };
    // val_accuracy is NaN for a task without one (language modelling): a blank cell, not "nan".
    const std::optional<double> accuracy =
        t.evaluated && !std::isnan(t.eval.accuracy) ? std::optional<double>(t.eval.accuracy) : std::nullopt;
    return {{"step", static_cast<double>(t.step)},
            {"lr", t.lr},
            {"train_loss", t.train_loss},
            {"grad_norm", t.grad_norm},
            {"val_loss", when_evaluated(t.eval.loss)},
            {"val_accuracy", accuracy},
            {"val_token_accuracy", when_evaluated(t.eval.token_accuracy)},
            {"tokens_per_s", t.tokens_per_s},
            {"elapsed_s", t.elapsed_seconds},
            {"z_loss", t.z_loss}};
}

std::vector<std::string> metrics_columns() {
    std::vector<std::string> columns;
    for (const MetricsCell& cell : metrics_row(TrainStep{})) columns.push_back(cell.column);
    return columns;
}

// ---- the session ----

TrainSession::TrainSession(const TrainJob& job) : state_(std::make_unique<State>()) {
    State& s = *state_;
    s.job = job;
    s.config_file = job.config_path.empty() ? job.config_name : job.config_path;
    prepare(s);
    s.guarded([&] {
        start_threads(s);
        build_model(s);
        open_run(s);
        save_initial(s);
        save_batches(s);
        open_probes(s);
    });
    model().train();
    if (job.profile) profiler::reset();
    s.start = std::chrono::steady_clock::now();
}

TrainSession::~TrainSession() = default;

std::string TrainSession::description() const {
    const State& s = *state_;
    const ShardPlan& plan = s.plan;
    return fmt::format("{} parameters, {} data, vocab {}, T = {}, on {}{}, {}{}, run directory {}",
                       count_parameters(*s.model), s.config.data.source == "text" ? s.config.data.path : s.config.data.task,
                       s.data->vocab_size(), s.data->seq_len(), s.config.device.str(),
                       s.autocast ? " with bf16 autocast" : "", dist::describe(),
                       plan.shards > 1 ? fmt::format(", batch {} in {} shards of {} ({} buckets)", plan.batch,
                                                     plan.shards, plan.shard_rows, s.data_parallel->bucket_count())
                                       : "",
                       s.run_dir);
}

const TrainConfig& TrainSession::config() const { return state_->config; }
const Dataset& TrainSession::dataset() const { return *state_->data; }
Transformer& TrainSession::model() { return *state_->model; }
const std::string& TrainSession::run_dir() const { return state_->run_dir; }
int64_t TrainSession::step() const { return state_->step; }
int64_t TrainSession::end_step() const { return state_->end_step; }
bool TrainSession::done() const { return state_->step >= state_->end_step; }

EvalResult TrainSession::evaluate() {
    State& s = *state_;
    return s.guarded([&] { return evaluate_on(*s.model, s.eval_set, s.data->has_accuracy(), s.autocast); });
}

TrainStep TrainSession::run_step() {
    State& s = *state_;
    NL_REQUIRE(!s.finished && !done(), "train: the session is at step ", s.step, " of ", s.end_step,
               (s.finished ? " and finished" : ": no step left to run"));
    return s.guarded([&] {
        const int64_t step = s.step + 1;
        s.governor->update();
        reset_peak(s.config.device);  // the peak below is this step's: state + activations + temporaries
        const auto t0 = std::chrono::steady_clock::now();
        TrainStep t = train_step(s, step);
        s.step_seconds.push_back(seconds_since(t0));
        s.peak_step_bytes = std::max(s.peak_step_bytes, memory_stats(s.config.device).peak_bytes);
        s.train_seconds += s.step_seconds.back();
        s.tokens_seen += s.config.train.batch_size * s.data->seq_len();
        s.train_loss = t.train_loss;
        s.step = step;
        // The loss is the same on every rank, so every rank stops here together.
        if (!std::isfinite(t.train_loss) && s.job.nonfinite_loss_is_error)
            throw dist::JobError(detail::concat("train: the loss became ", t.train_loss, " at step ", step,
                                                " (diverged; try a lower /optim/lr or /optim/grad_clip in ",
                                                s.config.file, ")"),
                                 2);
        const int64_t steps = s.config.train.steps;
        const bool last = step == steps;
        const int64_t eval_every = s.config.train.eval_every;
        t.evaluated = last || (eval_every > 0 && step % eval_every == 0);
        if (t.evaluated) {
            s.last_eval = evaluate_on(*s.model, s.eval_set, s.data->has_accuracy(), s.autocast);
            s.evaluated = true;
        }
        t.has_eval = s.evaluated;
        t.eval = s.last_eval;
        t.tokens_per_s = static_cast<double>(s.tokens_seen) / s.train_seconds;
        t.elapsed_seconds = seconds_since(s.start);
        t.threads = s.governor->threads();
        t.max_threads = s.governor->max_threads();
        t.world_size = dist::world_size();
        write_metrics_row(s, t);
        write_probes_row(s, t);
        const int64_t every = s.config.train.checkpoint_every;
        if (last || step == s.end_step || (every > 0 && step % every == 0)) save_checkpoint_at(s, step);
        return t;
    });
}

void TrainSession::stop_here() {
    State& s = *state_;
    s.guarded([&] {
        if (s.step > s.start_step && s.saved_step != s.step) save_checkpoint_at(s, s.step);
    });
    s.end_step = s.step;
}

TrainResult TrainSession::finish() {
    State& s = *state_;
    NL_REQUIRE(!s.finished, "train: finish() was already called for ", s.run_dir);
    s.finished = true;
    return s.guarded([&] {
        TrainResult result;
        result.run_dir = s.run_dir;
        result.last_step = s.step;
        const int64_t ran = s.step - s.start_step;
        if (s.job.profile && s.root_rank) result.profile_table = write_profile(*s.run, s.train_seconds, ran);
        if (s.step < s.config.train.steps) return result;  // stopped early: no summary, the run is not complete
        if (!s.evaluated) s.last_eval = evaluate_on(*s.model, s.eval_set, s.data->has_accuracy(), s.autocast);
        result.summary = summary_of(s);
        result.complete = true;
        if (s.root_rank) s.run->write_summary(result.summary);
        return result;
    });
}

TrainResult run_train(const TrainJob& job, const TrainCallbacks& callbacks) {
    TrainSession session(job);
    if (callbacks.on_start) callbacks.on_start(session);
    std::vector<TrainStep> history;
    while (!session.done()) {
        history.push_back(session.run_step());
        if (callbacks.on_step) callbacks.on_step(history.back());
        if (!session.done() && callbacks.should_stop && callbacks.should_stop()) session.stop_here();
    }
    TrainResult result = session.finish();
    result.history = std::move(history);
    return result;
}

}  // namespace nl
