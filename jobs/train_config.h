// The train job's config schema (every key, its default and its check in one place:
// read_train_config) and what a train run directory's checkpoints carry (the config, the trained
// sequence length, the text vocab), which `normlab sample`, resuming and `bench torch` read back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "jobs/data.h"
#include "layers/checkpoint.h"
#include "layers/transformer.h"

namespace nl {

// Upper bounds of the size keys (the error names the key, its value and the bound).
inline constexpr int64_t kMaxModelDim = 65536;        // /model/dim, n_heads, multiple_of; ffn_hidden_dim 4x
inline constexpr int64_t kMaxLayers = 1024;           // /model/n_layers
inline constexpr int64_t kMaxBatchSize = 1 << 20;     // /train/batch_size
inline constexpr int64_t kMaxSteps = 1'000'000'000'000;  // /train/steps
// train.save_batches: the largest batches.safetensors a run may write (its inputs and targets, int64).
inline constexpr double kMaxSavedBatchesBytes = 1024.0 * 1024.0 * 1024.0;
inline constexpr const char* kSavedBatchesFile = "batches.safetensors";

struct OptimConfig {
    double lr = 3e-3;           // peak learning rate (after warmup)
    double min_lr = 3e-4;       // cosine decay floor, reached at train.steps
    int64_t warmup_steps = 50;  // linear warmup from lr / warmup_steps
    double weight_decay = 0.01; // AdamW's decoupled decay
    double beta1 = 0.9;
    double beta2 = 0.98;
    double eps = 1e-8;
    double grad_clip = 1.0;     // global grad-norm clip; 0 turns clipping off
    // Which parameters AdamW decays: "all", or "matrices" (those with two or more dimensions: the Linear
    // weights and the embedding; not norm gains, biases or DyT's alpha), nanoGPT's grouping.
    std::string decay = "all";
    // "lr": torch.optim.AdamW's p *= 1 - lr_t * wd; "independent": p *= 1 - wd * lr_t / lr (the schedule's
    // multiplier only; Loshchilov & Hutter 2019, Wortsman et al. 2023), so the decay does not grow
    // with the peak learning rate of a sweep.
    std::string weight_decay_mode = "lr";
};

struct LoopConfig {
    int64_t steps = 1500;
    int64_t batch_size = 64;
    int64_t eval_every = 250;       // 0: only at the end
    int64_t checkpoint_every = 0;   // 0: only at the end
    int64_t log_every = 50;         // progress lines when stderr is not a terminal
    std::string autocast = "none";  // "bf16": bf16 matmuls, f32 weights, norms and loss (layers/autocast.h)
    // "f32" or "f64": the dtype of the weights, activations, gradients, AdamW's moments and the loss
    // (RoPE tables and softmax included). f64 runs on the CPU, on one process with one gradient shard.
    std::string dtype = "f32";
    bool save_initial = false;  // checkpoints/step_00000000.safetensors: the weights before the first update
    bool save_batches = false;  // batches.safetensors: every step's inputs and targets (kSavedBatchesFile)
    double z_loss = 0.0;            // the loss adds z_loss * mean(logsumexp(logits)^2) (PaLM); 0: off
    int64_t probe_every = 0;        // probes.csv every N steps (jobs/probes.h); 0: off
    int64_t sharpness_every = 0;    // probes.csv's sharpness columns every N steps (jobs/sharpness.h); 0: off
    int64_t sharpness_iters = 20;   // Lanczos iterations (Hessian-vector products) per sharpness value
    // Data parallel over MPI ranks (jobs/distributed.h, docs/distributed.md):
    int64_t grad_shards = 0;        // the batch's gradient is a fixed-order sum over this many shards; 0: one per rank
    int64_t bucket_kb = 256;        // gradients are summed over ranks in buckets of about this size
    bool overlap_comm = true;       // start each bucket's sum during backward (false: after it, for measuring)
    int64_t threads = 0;            // CPU threads; 0: auto, the cores other processes leave free (core/thread_governor.h)
};

struct TrainConfig {
    std::string file;
    uint64_t seed = 0;  // the model's initial weights
    Device device;      // where the model, batches and optimizer state live ("device": "cpu" default)
    DataOptions data;
    TransformerOptions model;  // vocab_size is filled from the data (or model_vocab_size)
    int64_t model_vocab_size = 0;  // /model/vocab_size: 0 means the data's; else at least the data's
    std::string init_from;     // /model/init_from: a transformers directory or GGUF file ("": none)
    OptimConfig optim;
    LoopConfig train;
    nlohmann::json resolved;  // the config with every default filled in (written to config.json)
};

// Validates `root` (read from `file`) completely: types, ranges, unknown keys (nearest suggested),
// the model's shape constraints, and that a sequence fits the model's context (max_seq_len).
// "device" is checked for its form only: the job checks that the GPU exists (require_device_available),
// so `normlab sample` can read the config of a checkpoint trained on a GPU on a machine without one.
// Errors are nl::Error "<file>: /json/path: what was expected, what was found". Does not read
// the text file (the dataset does).
TrainConfig read_train_config(const nlohmann::json& root, const std::string& file);

// A lower bound of the bytes a training step on the CPU holds: the held-out set, weights, gradients,
// AdamW's moments and the activations saved for backward (f32).
double estimated_train_bytes(const TrainConfig& config, int64_t vocab_size);

// The vocab size the model is built with: /model/vocab_size when set (an nl::Error naming it when
// it is below the data's `data_vocab`), else the data's.
int64_t model_vocab_size(const TrainConfig& config, int64_t data_vocab);

// The model input length the config's data needs (T).
int64_t data_seq_len(const DataOptions& data);

// The checkpoint metadata key holding the sequence length the model was trained on (decimal):
// `normlab sample` never feeds more positions than this.
inline constexpr const char* kTrainedSeqLenKey = "trained_seq_len";

// A train checkpoint's JSON metadata entry ("config" or "vocab"), parsed with the depth limit; an
// nl::Error naming `path` and the key when it is absent or not JSON.
nlohmann::json checkpoint_metadata_json(const CheckpointInfo& info, const std::string& path, const std::string& key);

// The weight decay AdamW applies to the parameter `name` of shape `shape` under `optim`: 0 where
// optim.decay leaves it out; weight_decay / lr for weight_decay_mode "independent" (so that torch's
// p *= 1 - lr_t * decay is p *= 1 - weight_decay * lr_t / lr; 0 when lr is 0).
double parameter_weight_decay(const OptimConfig& optim, int64_t dims);

// "<run dir>/checkpoints/step_00001500.safetensors".
std::string checkpoint_path(const std::string& run_dir, int64_t step);
// The run directory's checkpoint with the highest step; "" when it has none.
std::string latest_checkpoint(const std::string& run_dir);


// nl::Error naming the first difference when the checkpoint at `path` cannot continue a run of
// `config`: its /seed, /model or /data differ, or it is past /train/steps.
void check_checkpoint_matches(const std::string& path, const TrainConfig& config);

}  // namespace nl
