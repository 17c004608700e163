// The config schema of every job, and what is generated from it: JSON Schema, docs tables, defaults
// (jobs/config_schema.h).
#include "jobs/config_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include <fmt/core.h>

#include "core/error.h"
#include "jobs/data.h"
#include "jobs/train_config.h"
#include "layers/norm_registry.h"
#include "layers/norms.h"

namespace nl {

using json = nlohmann::json;

// Each key below is a designated initializer naming only the fields it sets; GCC 12 warns about the
// fields left at their defaults (-Wmissing-field-initializers), which is the point here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif

namespace {

// ---- the keys ----

// The norm object that train's /model/norm and stability's /norm share. `with_type`: the object
// names the norm type (train); stability sweeps types with its own /norms list instead.
void add_norm_keys(std::vector<ConfigKey>& keys, const std::string& prefix, bool with_type) {
    const NormOptions norm;  // the defaults
    if (with_type)
        keys.push_back({.path = prefix + ".type", .type = ConfigType::String, .default_value = norm.type,
                        .choices = norm_types(), .meaning = "every norm in the model ([norms.md](norms.md))"});
    keys.push_back({.path = prefix + ".eps", .type = ConfigType::Number,
                    .default_text = "the type's own default, 1e-5 for every type ([norms.md](norms.md))",
                    .min = 0.0, .max = 1.0, .meaning = "added to the variance / mean square"});
    keys.push_back({.path = prefix + ".fused", .type = ConfigType::Boolean, .default_value = norm.fused,
                    .meaning = "fused kernels (closed-form backward) or composed from autograd ops"});
    keys.push_back({.path = prefix + ".elementwise_affine", .type = ConfigType::Boolean,
                    .default_value = norm.elementwise_affine,
                    .meaning = "learnable weight (and bias where the norm has one)"});
    keys.push_back({.path = prefix + ".bias", .type = ConfigType::Boolean, .default_value = norm.bias,
                    .meaning = "norms with a bias (`layernorm`, `hybridnorm`): learn it"});
    keys.push_back({.path = prefix + ".p", .type = ConfigType::Number, .default_value = norm.p, .min = 0.0,
                    .max = 1.0, .min_exclusive = true,
                    .meaning = "`prmsnorm`: the fraction of each row its RMS is computed over"});
    keys.push_back({.path = prefix + ".alpha", .type = ConfigType::Number, .default_value = norm.alpha, .min = 0.0,
                    .max = 1.0, .meaning = "`hybridnorm`: the weight of the RMSNorm branch"});
    keys.push_back({.path = prefix + ".alpha_init", .type = ConfigType::Number, .default_value = norm.alpha_init,
                    .meaning = "`dyt`: the initial value of its learnable scalar alpha (Zhu et al. 2025's 0.5)"});
}

ConfigKey device_key() {
    return {.path = "device", .type = ConfigType::Device, .default_value = "cpu",
            .meaning = "where the job's tensors live ([cuda.md](cuda.md))"};
}

ConfigSchema make_train_schema() {
    const DataOptions data;
    const TransformerOptions model;
    const OptimConfig optim;
    const LoopConfig loop;
    const std::vector<std::string> synthetic = {"synthetic"}, text = {"text"}, tokens = {"tokens"},
                                   files = {"text", "tokens"};
    std::vector<ConfigKey> k;
    k.push_back({.path = "seed", .type = ConfigType::Integer, .default_value = 0, .min = 0,
                 .meaning = "initial weights (`Generator(seed)`); also the default of `data.seed`"});
    k.push_back(device_key());
    k.back().meaning = "where the model, batches and AdamW state live ([cuda.md](cuda.md))";

    k.push_back({.path = "data.source", .type = ConfigType::String, .default_value = data.source,
                 .choices = {"synthetic", "text", "tokens"}, .meaning = "where sequences come from"});
    k.push_back({.path = "data.task", .type = ConfigType::String, .default_value = data.task,
                 .choices = {"copy", "reverse", "sort", "add"}, .meaning = "the task (see below)",
                 .when_key = "source", .when_values = synthetic});
    k.push_back({.path = "data.length", .type = ConfigType::Integer, .default_value = data.length, .min = 1,
                 .max = 4096, .meaning = "symbols per sequence; `add`: digits per operand", .when_key = "source",
                 .when_values = synthetic});
    k.push_back({.path = "data.symbols", .type = ConfigType::Integer, .default_value = data.symbols, .min = 2,
                 .max = 1000000, .meaning = "distinct symbols of `copy`/`reverse`/`sort` (`add` always uses 10 digits)",
                 .when_key = "source", .when_values = synthetic});
    k.push_back({.path = "data.path", .type = ConfigType::Path, .default_text = "(required)",
                 .meaning = "a UTF-8 file (text) or a directory holding `train.bin` and `val.bin` (tokens)",
                 .when_key = "source", .when_values = files, .required = true});
    k.push_back({.path = "data.val_fraction", .type = ConfigType::Number, .default_value = data.val_fraction,
                 .min = 0.0, .max = 1.0, .min_exclusive = true, .max_exclusive = true,
                 .meaning = "the last fraction of the file is the validation split", .when_key = "source",
                 .when_values = text});
    k.push_back({.path = "data.dtype", .type = ConfigType::String, .default_value = data.dtype,
                 .choices = {"uint16", "uint32"},
                 .meaning = "the id type of `train.bin` and `val.bin` (nanoGPT writes `np.uint16`)",
                 .when_key = "source", .when_values = tokens});
    k.push_back({.path = "data.vocab_size", .type = ConfigType::Integer, .default_text = "(required)", .min = 1,
                 .max = double(kMaxTokenVocab), .meaning = "every id is below it; the model's vocabulary",
                 .when_key = "source", .when_values = tokens, .required = true});
    k.push_back({.path = "data.seq_len", .type = ConfigType::Integer, .default_value = data.seq_len, .min = 1,
                 .max = double(1 << 20), .meaning = "tokens per training window (the model's input length)",
                 .when_key = "source", .when_values = files});
    k.push_back({.path = "data.eval_sequences", .type = ConfigType::Integer, .default_value = data.eval_sequences,
                 .min = 1, .max = double(1 << 20),
                 .meaning = "held-out problems (synthetic; at most 1/10 of the distinct problems) or validation "
                            "windows (text, tokens) per evaluation"});
    k.push_back({.path = "data.seed", .type = ConfigType::Integer, .default_text = "`seed`", .min = 0,
                 .meaning = "the data streams (training batches, held-out set)"});

    k.push_back({.path = "model.init_from", .type = ConfigType::Path, .default_value = "",
                 .meaning = "start from a model transformers or llama.cpp holds: a `LlamaForCausalLM`, `Qwen3ForCausalLM` or "
                            "`Olmo2ForCausalLM` directory or a "
                            "GGUF file ([interop.md](interop.md)). Its architecture becomes `/model` (a key given here "
                            "that differs is an error naming it) and its weights replace the initial ones; text data "
                            "needs its character tokenizer"});
    k.push_back({.path = "model.vocab_size", .type = ConfigType::Integer, .default_value = 0, .min = 0,
                 .max = double(kMaxTokenVocab),
                 .meaning = "the model's vocabulary; 0 means the data's; otherwise at least the data's (`init_from` "
                            "sets it to the file's)"});
    k.push_back({.path = "model.dim", .type = ConfigType::Integer, .default_value = model.dim, .min = 2,
                 .max = double(kMaxModelDim), .meaning = "model width"});
    k.push_back({.path = "model.n_layers", .type = ConfigType::Integer, .default_value = model.n_layers, .min = 0,
                 .max = double(kMaxLayers), .meaning = "transformer blocks"});
    k.push_back({.path = "model.n_heads", .type = ConfigType::Integer, .default_value = model.n_heads, .min = 1,
                 .max = double(kMaxModelDim), .constraint = "dividing `dim` into an even head size (RoPE) unless `head_dim` is set",
                 .meaning = "attention heads"});
    k.push_back({.path = "model.head_dim", .type = ConfigType::Integer, .default_text = "`dim / n_heads`", .min = 2,
                 .max = double(kMaxModelDim), .constraint = "even (RoPE)",
                 .meaning = "each attention head's size: q, k and v project to heads x head_dim and the output "
                            "projection back to `dim` (Qwen3-0.6B: 128 at dim 1024 with 16 heads)"});
    k.push_back({.path = "model.n_kv_heads", .type = ConfigType::Integer, .default_text = "`n_heads`", .min = 1,
                 .max = double(kMaxModelDim), .constraint = "dividing `n_heads`",
                 .meaning = "key/value heads (grouped-query attention)"});
    k.push_back({.path = "model.multiple_of", .type = ConfigType::Integer, .default_value = model.multiple_of,
                 .min = 1, .max = double(kMaxModelDim),
                 .meaning = "SwiGLU hidden size rounding (the article's and LLaMA's 256; the shipped configs set 32)"});
    k.push_back({.path = "model.ffn_hidden_dim", .type = ConfigType::Integer, .default_value = model.ffn_hidden_dim,
                 .min = 0, .max = double(4 * kMaxModelDim),
                 .meaning = "SwiGLU hidden size before LLaMA's 2/3 rule; 0 means `4 * dim`"});
    add_norm_keys(k, "model.norm", true);
    k.push_back({.path = "model.norm.alpha_init_attention", .type = ConfigType::Number,
                 .default_text = "`alpha_init`",
                 .meaning = "`dyt`: alpha_init of the norms before attention (`attention_norm` in pre and peri "
                            "blocks), which Zhu et al. 2025 set apart from the others in LLaMA"});
    k.push_back({.path = "model.norm_placement", .type = ConfigType::String, .default_value = model.norm_placement,
                 .choices = norm_placement_names(),
                 .meaning = "where the blocks' norms sit: `pre` (LLaMA), `post` (Vaswani et al.), `peri` (Peri-LN), "
                            "`output` (OLMo 2), `mix` (Mix-LN), `deepnorm` (DeepNet), `none` "
                            "([norms.md](norms.md#norm-placements))"});
    k.push_back({.path = "model.pre_norm", .type = ConfigType::Boolean,
                 .default_text = "none: `norm_placement` decides",
                 .meaning = "the older name of `norm_placement` `pre` (true) or `post` (false), still read; "
                            "given with `norm_placement`, the two must agree"});
    k.push_back({.path = "model.mix_fraction", .type = ConfigType::Number, .default_value = model.mix_fraction,
                 .min = 0.0, .max = 1.0, .min_exclusive = true,
                 .meaning = "`mix`: the first `ceil(mix_fraction * n_layers)` blocks are post-norm, the rest pre-norm",
                 .when_key = "norm_placement", .when_values = {"mix"}});
    k.push_back({.path = "model.norm_scaling", .type = ConfigType::String, .default_value = model.norm_scaling,
                 .choices = {"none", "depth"},
                 .meaning = "`depth`: LayerNorm Scaling (Sun et al. 2025), each pre-norm's output times `1 / sqrt(l)` "
                            "in the l-th block; needs `norm_placement` pre, peri or mix"});
    k.push_back({.path = "model.qk_norm", .type = ConfigType::String, .default_value = model.qk_norm,
                 .choices = qk_norm_choices(),
                 .meaning = "a norm of `norm.type` (rmsnorm or layernorm) on q and k before RoPE: `head` over each "
                            "head's vector (Qwen3, Gemma 3), `full` over the whole projection (OLMo 2)"});
    k.push_back({.path = "model.logit_softcap", .type = ConfigType::Number, .default_value = model.logit_softcap,
                 .min = 0.0, .meaning = "`cap * tanh(logit / cap)` on the output logits (Gemma 2); 0 is off"});
    k.push_back({.path = "model.attn_softcap", .type = ConfigType::Number, .default_value = model.attn_softcap,
                 .min = 0.0,
                 .meaning = "`cap * tanh(score / cap)` on the attention scores before softmax (Gemma 2); 0 is off"});
    k.push_back({.path = "model.rope_theta", .type = ConfigType::Number, .default_value = model.rope_theta,
                 .min = 0.0, .min_exclusive = true, .meaning = "RoPE base"});
    k.push_back({.path = "model.max_seq_len", .type = ConfigType::Integer, .default_value = model.max_seq_len,
                 .min = 1, .max = double(1 << 20),
                 .meaning = "the model's context; the data's input length may not exceed it"});
    k.push_back({.path = "model.fused_swiglu", .type = ConfigType::Boolean, .default_value = model.fused_swiglu,
                 .meaning = "SwiGLU's gate silu(w1 x) * w3 x as one fused kernel pair, or silu and mul in autograd "
                            "ops (twice differentiable)"});
    k.push_back({.path = "model.init", .type = ConfigType::String, .default_value = model.init,
                 .choices = init_choices(),
                 .meaning = "the embedding's and the Linear weights' initial values: `pytorch` (Embedding N(0, 1), "
                            "Linear kaiming-uniform, PyTorch's defaults), `normal` (all N(0, `init_std`^2): GPT-2, "
                            "OLMo) or `xavier` (Linear U(-b, b), b = sqrt(6 / (fan_in + fan_out)), as Xiong et al. "
                            "2020; the embedding keeps N(0, 1)); norm parameters keep their own init "
                            "([configs.md](configs.md#initialization))"});
    k.push_back({.path = "model.init_std", .type = ConfigType::Number, .default_value = model.init_std, .min = 0.0,
                 .min_exclusive = true, .meaning = "the standard deviation of `init` \"normal\""});
    k.push_back({.path = "model.init_scaled_residual", .type = ConfigType::Boolean,
                 .default_value = model.init_scaled_residual,
                 .meaning = "draw attention.wo and feed_forward.w2 (the projections into the residual stream) with "
                            "the std (normal) or bound (xavier) divided by sqrt(2 n_layers), GPT-2's rule; not with "
                            "`init` \"pytorch\""});
    k.push_back({.path = "model.fused_attention", .type = ConfigType::Boolean,
                 .default_value = model.fused_attention,
                 .meaning = "fused causal attention (FlashAttention's tiles and online softmax: no T x T matrix "
                            "stored) or LLaMA's composed attention in autograd ops (the reference, twice "
                            "differentiable)"});

    k.push_back({.path = "optim.lr", .type = ConfigType::Number, .default_value = optim.lr, .min = 0.0, .max = 10.0,
                 .meaning = "peak learning rate, reached after warmup"});
    k.push_back({.path = "optim.min_lr", .type = ConfigType::Number, .default_value = optim.min_lr, .min = 0.0,
                 .constraint = "<= `optim.lr`", .meaning = "cosine floor, reached at `train.steps`"});
    k.push_back({.path = "optim.warmup_steps", .type = ConfigType::Integer, .default_value = optim.warmup_steps,
                 .min = 0, .constraint = "< `train.steps`",
                 .meaning = "linear warmup: step i (from 0) uses `lr * (i + 1) / warmup_steps`"});
    k.push_back({.path = "optim.weight_decay", .type = ConfigType::Number, .default_value = optim.weight_decay,
                 .min = 0.0, .meaning = "AdamW's decoupled weight decay (which parameters: `optim.decay`; how it scales: `optim.weight_decay_mode`)"});
    k.push_back({.path = "optim.beta1", .type = ConfigType::Number, .default_value = optim.beta1, .min = 0.0,
                 .max = 1.0, .max_exclusive = true, .meaning = "AdamW first-moment decay"});
    k.push_back({.path = "optim.beta2", .type = ConfigType::Number, .default_value = optim.beta2, .min = 0.0,
                 .max = 1.0, .max_exclusive = true, .meaning = "AdamW second-moment decay"});
    k.push_back({.path = "optim.eps", .type = ConfigType::Number, .default_value = optim.eps, .min = 0.0,
                 .meaning = "AdamW epsilon (outside the square root, as PyTorch)"});
    k.push_back({.path = "optim.grad_clip", .type = ConfigType::Number, .default_value = optim.grad_clip, .min = 0.0,
                 .meaning = "clip the global gradient L2 norm to this; 0 turns clipping off"});
    k.push_back({.path = "optim.decay", .type = ConfigType::String, .default_value = optim.decay,
                 .choices = {"all", "matrices"},
                 .meaning = "which parameters `weight_decay` decays: all, or those with two or more dimensions (the "
                            "Linear weights and the embedding; not norm gains, biases, QK-norm weights or DyT's "
                            "alpha: nanoGPT's grouping)"});
    k.push_back({.path = "optim.weight_decay_mode", .type = ConfigType::String,
                 .default_value = optim.weight_decay_mode, .choices = {"lr", "independent"},
                 .meaning = "`lr`: torch.optim.AdamW, `p *= 1 - lr_t * weight_decay`; `independent`: `p *= 1 - "
                            "weight_decay * lr_t / lr`, the schedule's multiplier only (Loshchilov & Hutter 2019; "
                            "Wortsman et al. 2023), so the decay does not grow with a sweep's peak lr"});

    k.push_back({.path = "train.steps", .type = ConfigType::Integer, .default_value = loop.steps, .min = 1,
                 .max = double(kMaxSteps), .meaning = "optimizer steps (the cosine schedule's length)"});
    k.push_back({.path = "train.batch_size", .type = ConfigType::Integer, .default_value = loop.batch_size, .min = 1,
                 .max = double(kMaxBatchSize), .meaning = "sequences per step (and per evaluation batch)"});
    k.push_back({.path = "train.eval_every", .type = ConfigType::Integer, .default_value = loop.eval_every, .min = 0,
                 .meaning = "evaluate every N steps (and always at the end); 0: only at the end"});
    k.push_back({.path = "train.checkpoint_every", .type = ConfigType::Integer,
                 .default_value = loop.checkpoint_every, .min = 0,
                 .meaning = "checkpoint every N steps (and always at the end); 0: only at the end"});
    k.push_back({.path = "train.log_every", .type = ConfigType::Integer, .default_value = loop.log_every, .min = 1,
                 .meaning = "a progress line every N steps when stderr is not a terminal"});
    k.push_back({.path = "train.grad_shards", .type = ConfigType::Integer, .default_value = loop.grad_shards,
                 .min = 0, .max = double(1 << 20),
                 .meaning = "the batch's gradient is a fixed-order sum over this many equal shards; the same value "
                            "gives the same bits on 1, 2 or 4 MPI ranks; 0: one shard per rank "
                            "([distributed.md](distributed.md))"});
    k.push_back({.path = "train.bucket_kb", .type = ConfigType::Integer, .default_value = loop.bucket_kb, .min = 1,
                 .max = double(1 << 20), .meaning = "MPI ranks sum gradients in buckets of about this many KiB"});
    k.push_back({.path = "train.overlap_comm", .type = ConfigType::Boolean, .default_value = loop.overlap_comm,
                 .meaning = "start each bucket's sum during backward; false: after backward (for measuring)"});
    k.push_back({.path = "train.threads", .type = ConfigType::Integer, .default_value = loop.threads, .min = 0,
                 .max = 1024,
                 .meaning = "CPU threads; 0: `OMP_NUM_THREADS` if set, else auto: the cores other processes leave "
                            "free, first decided before the model is built (from the other processes' running "
                            "threads), then from /proc/stat's ticks before the first step past 50 ms and every 0.5 s "
                            "between steps (results do not depend on it)"});
    k.push_back({.path = "train.z_loss", .type = ConfigType::Number, .default_value = loop.z_loss, .min = 0.0,
                 .meaning = "the z-loss coefficient c: the loss adds `c * mean(logsumexp(logits)^2)` (PaLM's 1e-4), "
                            "logged as metrics.csv's `z_loss`; 0 is off"});
    k.push_back({.path = "train.probe_every", .type = ConfigType::Integer, .default_value = loop.probe_every,
                 .min = 0,
                 .meaning = "every N steps, write the stability probes to probes.csv: per block the largest "
                            "attention score, the attention's entropy and first-token weight, the residual stream's "
                            "RMS, max and channel kurtosis; the output logsumexp, each parameter's gradient RMS and "
                            "update/weight ratio, each DyT alpha, each norm's input RMS "
                            "([norms.md](norms.md#probes)); 0 is off"});
    k.push_back({.path = "train.sharpness_every", .type = ConfigType::Integer, .default_value = loop.sharpness_every,
                 .min = 0,
                 .meaning = "every N steps, write to probes.csv the sharpness of the step's objective (the largest "
                            "Hessian eigenvalue, weights before the update) and of its AdamW-preconditioned "
                            "Hessian, with Cohen et al. 2022's threshold (2 + 2 beta1) / ((1 - beta1) lr) "
                            "([norms.md](norms.md#sharpness)); 0 is off"});
    k.push_back({.path = "train.sharpness_iters", .type = ConfigType::Integer, .default_value = loop.sharpness_iters,
                 .min = 1, .max = 10000,
                 .meaning = "Lanczos iterations per sharpness value, each a Hessian-vector product (a forward and "
                            "a double backward)"});
    k.push_back({.path = "train.autocast", .type = ConfigType::String, .default_value = loop.autocast,
                 .choices = {"none", "bf16"},
                 .meaning = "run the forward under bf16 autocast ([cuda.md](cuda.md#bf16-autocast))"});
    k.push_back({.path = "train.dtype", .type = ConfigType::String, .default_value = loop.dtype,
                 .choices = {"f32", "f64"},
                 .meaning = "the weights', activations', gradients', AdamW state's and loss's dtype; f64 runs on the "
                            "CPU on one process, without autocast, and replays in PyTorch step for step "
                            "([replay.md](replay.md))"});
    k.push_back({.path = "train.save_initial", .type = ConfigType::Boolean, .default_value = loop.save_initial,
                 .meaning = "write the initial weights as checkpoints/step_00000000.safetensors before the first "
                            "update"});
    k.push_back({.path = "train.save_batches", .type = ConfigType::Boolean, .default_value = loop.save_batches,
                 .meaning = "write every step's batch to batches.safetensors: int64 `inputs` and `targets` [steps, "
                            "batch, T], `targets` -100 where the loss ignores a position (at most 1 GiB)"});
    return {"train", "normlab train config", std::move(k)};
}

ConfigSchema make_stability_schema() {
    std::vector<ConfigKey> k;
    k.push_back({.path = "norms", .type = ConfigType::StringList, .default_value = {"rmsnorm", "layernorm"},
                 .choices = norm_types(), .constraint = "each at most once", .meaning = "the norms to compare"});
    k.push_back({.path = "depths", .type = ConfigType::IntegerList, .default_value = {2}, .min = 1, .max = 64,
                 .constraint = "each at most once",
                 .meaning = "hidden blocks `fc<i> -> norm<i> -> ReLU` before the output layer `fc<depth+1>`; 2 is "
                            "the article's model"});
    k.push_back({.path = "lrs", .type = ConfigType::NumberList, .default_value = {1e-3}, .min = 0.0, .max = 1e6,
                 .constraint = "each at most once", .meaning = "Adam learning rates"});
    k.push_back({.path = "seeds", .type = ConfigType::IntegerList, .default_value = {42}, .min = 0,
                 .constraint = "each at most once",
                 .meaning = "each seed draws the data (x, then y), then the Linear weights (fc1, fc2, ...) from one "
                            "generator; norms draw nothing, so at one seed every norm starts from the same point"});
    k.push_back({.path = "epochs", .type = ConfigType::Integer, .default_value = 100, .min = 1, .max = 1e7,
                 .meaning = "full-batch epochs"});
    k.push_back({.path = "samples", .type = ConfigType::Integer, .default_value = 1000, .min = 1,
                 .max = double(1 << 24), .meaning = "rows of x and y"});
    k.push_back({.path = "in_features", .type = ConfigType::Integer, .default_value = 100, .min = 1,
                 .max = double(1 << 16), .meaning = "columns of x"});
    k.push_back({.path = "hidden", .type = ConfigType::Integer, .default_value = 256, .min = 1,
                 .max = double(1 << 16), .meaning = "width of the hidden layers (the norms' dim)"});
    k.push_back({.path = "out_features", .type = ConfigType::Integer, .default_value = 10, .min = 1,
                 .max = double(1 << 16), .meaning = "columns of y"});
    k.push_back({.path = "dtype", .type = ConfigType::String, .default_value = "f32", .choices = {"f32", "f64"},
                 .meaning = "the run's dtype; data and weights are drawn in f32 (as `torch.randn` and PyTorch's "
                            "init) and converted, so an f64 run starts from exactly the f32 run's point"});
    k.push_back(device_key());
    k.back().meaning = "where the data, the models and Adam's state live ([cuda.md](cuda.md))";
    add_norm_keys(k, "norm", false);
    k.push_back({.path = "diverge_factor", .type = ConfigType::Number, .default_value = 10.0, .min = 1.0,
                 .meaning = "a run diverges at the first epoch whose loss is NaN/Inf or above `diverge_factor` x its "
                            "epoch-1 loss; it is recorded and stopped. `1e300` lets spikes recover"});
    k.push_back({.path = "perturb", .type = ConfigType::Number, .default_value = 1e-6, .min = 0.0, .max = 1.0,
                 .meaning = "the sensitivity probe: every run is trained a second time with `fc1.weight` scaled by "
                            "`1 + perturb`; 0 turns it off"});
    k.push_back({.path = "init_from", .type = ConfigType::Path, .default_value = "",
                 .meaning = "initial weights from a safetensors file with PyTorch's names (`fc1.weight`, "
                            "`norm1.weight`, ...), strict (every name, exact shapes), any floating dtype. `{norm}` "
                            "and `{depth}` in the path are replaced per run"});
    k.push_back({.path = "data_from", .type = ConfigType::Path, .default_value = "",
                 .meaning = "x `(samples, in_features)` and y `(samples, out_features)` from a safetensors file"});
    k.push_back({.path = "plots", .type = ConfigType::Boolean, .default_value = true,
                 .meaning = "render `losses.png` and `grad_norms.png` with gnuplot, when it is installed"});
    return {"stability", "normlab stability config", std::move(k)};
}

ConfigSchema make_sweep_schema() {
    std::vector<ConfigKey> k;
    k.push_back({.path = "base", .type = ConfigType::PathOrObject, .default_text = "(required)",
                 .meaning = "the train config every run starts from: a train config file (relative to this "
                            "file's folder) or a train config object inline",
                 .required = true});
    k.push_back({.path = "grid", .type = ConfigType::Object, .default_value = json::object(),
                 .constraint = "each list non-empty, each value at most once",
                 .meaning = "train config keys, dotted as `--set` takes them (`\"optim.lr\"`, `\"model.qk_norm\"`), "
                            "each mapped to the list of values to sweep; runs are the cartesian product in the "
                            "file's key order, the last key fastest, times the seeds"});
    k.push_back({.path = "seeds", .type = ConfigType::IntegerList, .default_value = {0}, .min = 0,
                 .constraint = "each at most once",
                 .meaning = "each run's train `seed` (the initial weights); the seeds vary fastest"});
    k.push_back({.path = "diverge_factor", .type = ConfigType::Number, .default_value = 3.0, .min = 1.0,
                 .meaning = "a run diverges at the first step whose train loss is NaN/Inf or above `diverge_factor` "
                            "x its loss at initialization; it is stopped and recorded as diverged (not an error)"});
    k.push_back({.path = "plots", .type = ConfigType::Boolean, .default_value = true,
                 .meaning = "render `val_loss_vs_lr.png`, `attn_score_max.png` and `residual_rms.png` with "
                            "gnuplot, when it is installed (`plots.gp` is always written)"});
    k.push_back({.path = "baseline", .type = ConfigType::String, .default_value = "",
                 .constraint = "a variant's name as summary.json gives it",
                 .meaning = "the variant the others are compared with (`\"model.qk_norm=none\"`): summary.json gives "
                            "each other variant's paired difference to it per lr (matched by seed), mean and 95% "
                            "interval; \"\" for none"});
    return {"sweep", "normlab sweep config", std::move(k)};
}

ConfigSchema make_bench_norms_schema() {
    std::vector<ConfigKey> k;
    k.push_back({.path = "reps", .type = ConfigType::Integer, .default_value = 100, .min = 1, .max = 100000,
                 .meaning = "samples per case at the seed shapes"});
    k.push_back({.path = "hidden", .type = ConfigType::IntegerList, .default_value = {128, 256, 512, 1024, 2048},
                 .min = 1, .max = double(1 << 20), .meaning = "seed shapes: hidden sizes, each crossed with every `batch`"});
    k.push_back({.path = "batch", .type = ConfigType::IntegerList, .default_value = {32, 64, 128}, .min = 1,
                 .max = double(1 << 24), .meaning = "seed shapes: rows"});
    k.push_back({.path = "large_shapes", .type = ConfigType::StringList,
                 .default_value = {"32768x512", "16384x4096"}, .constraint = "each `\"ROWSxHIDDEN\"`",
                 .meaning = "the large shapes"});
    k.push_back({.path = "large_reps", .type = ConfigType::Integer, .default_value = 10, .min = 1, .max = 100000,
                 .meaning = "samples per case at the large shapes"});
    k.push_back({.path = "norms", .type = ConfigType::StringList, .default_value = {"layernorm", "rmsnorm"},
                 .choices = {"layernorm", "rmsnorm", "dyt"}, .meaning = "the norms to time"});
    k.push_back({.path = "impls", .type = ConfigType::StringList,
                 .default_value = {"kernel", "op", "fused", "composed"},
                 .choices = {"kernel", "op", "fused", "composed"},
                 .meaning = "implementations ([benchmarks.md](benchmarks.md))"});
    k.push_back({.path = "passes", .type = ConfigType::StringList, .default_value = {"fwd", "fwd+bwd"},
                 .choices = {"fwd", "fwd+bwd"}, .meaning = "passes to time"});
    k.push_back({.path = "dtypes", .type = ConfigType::StringList, .default_value = {"f32"},
                 .choices = {"f32", "bf16", "f16"}, .constraint = "each at most once",
                 .meaning = "every case runs in each"});
    k.push_back({.path = "min_sample_ms", .type = ConfigType::Number, .default_value = 1.0, .min = 0.0,
                 .max = 10000.0,
                 .meaning = "seed shapes: a sample averages enough back-to-back calls to last this long"});
    k.push_back({.path = "threads", .type = ConfigType::Integer, .default_value = 0, .min = 0, .max = 1024,
                 .meaning = "OpenMP (and OpenBLAS) threads; 0 keeps OpenMP's default"});
    k.push_back({.path = "clock", .type = ConfigType::String, .default_value = "wall", .choices = {"wall", "cpu"},
                 .meaning = "wall clock, or the process's CPU time (steadier on a loaded machine)"});
    k.push_back({.path = "seed", .type = ConfigType::Integer, .default_value = 0, .min = 0,
                 .meaning = "the random inputs and affine parameters"});
    k.push_back(device_key());
    k.back().meaning = "where every case runs ([cuda.md](cuda.md))";
    return {"bench_norms", "normlab bench norms config", std::move(k)};
}

// ---- text ----

// The shortest text that reads back as x: 0.003, 1e-6, 10000, 16777216.
std::string number_text(double x) {
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    if (x == std::floor(x) && std::abs(x) < 1e15) return fmt::format("{:.0f}", x);
    std::string text = fmt::format("{}", x);
    // fmt writes 1e-06; the docs write 1e-6.
    const size_t e = text.find('e');
    if (e != std::string::npos) {
        std::string mantissa = text.substr(0, e), exponent = text.substr(e + 1);
        const bool negative = exponent[0] == '-';
        if (exponent[0] == '-' || exponent[0] == '+') exponent = exponent.substr(1);
        while (exponent.size() > 1 && exponent[0] == '0') exponent = exponent.substr(1);
        text = mantissa + "e" + (negative ? "-" : "") + exponent;
    }
    return text;
}

std::string json_text(const json& value) {
    if (value.is_number()) return number_text(value.get<double>());
    if (value.is_array()) {
        std::string out = "[";
        for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + json_text(value[i]);
        return out + "]";
    }
    return value.dump();
}

std::string quoted_choices(const std::vector<std::string>& choices, const std::string& separator) {
    std::string out;
    for (size_t i = 0; i < choices.size(); ++i) out += (i ? separator : "") + ("`\"" + choices[i] + "\"`");
    return out;
}

bool is_list(ConfigType type) {
    return type == ConfigType::IntegerList || type == ConfigType::NumberList || type == ConfigType::StringList;
}

bool is_integer(ConfigType type) { return type == ConfigType::Integer || type == ConfigType::IntegerList; }

}  // namespace

// ---- ConfigKey ----

std::string ConfigKey::name() const {
    const size_t dot = path.rfind('.');
    return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string ConfigKey::parent() const {
    const size_t dot = path.rfind('.');
    return dot == std::string::npos ? "" : path.substr(0, dot);
}

std::string ConfigKey::pointer() const {
    std::string out = "/" + path;
    std::replace(out.begin(), out.end(), '.', '/');
    return out;
}

bool ConfigKey::in_range(double x) const {
    const bool above = min_exclusive ? x > min : x >= min;
    const bool below = max_exclusive ? x < max : x <= max;
    return above && below;
}

std::string ConfigKey::range_text() const {
    const bool has_min = std::isfinite(min), has_max = std::isfinite(max);
    if (has_min && has_max)
        return fmt::format("in {}{}, {}{}", min_exclusive ? "(" : "[", number_text(min), number_text(max),
                           max_exclusive ? ")" : "]");
    if (has_min) return fmt::format("{} {}", min_exclusive ? ">" : ">=", number_text(min));
    if (has_max) return fmt::format("{} {}", max_exclusive ? "<" : "<=", number_text(max));
    return "";
}

std::string ConfigKey::type_text() const {
    const std::string range = range_text();
    std::string text;
    switch (type) {
        case ConfigType::Integer: text = "int" + (range.empty() ? "" : " " + range); break;
        case ConfigType::Number: text = "number" + (range.empty() ? "" : " " + range); break;
        case ConfigType::Boolean: text = "bool"; break;
        case ConfigType::String: text = choices.empty() ? "string" : quoted_choices(choices, " \\| "); break;
        case ConfigType::Path: text = "path"; break;
        case ConfigType::Device: text = "`\"cpu\"` \\| `\"cuda\"` \\| `\"cuda:N\"`"; break;
        case ConfigType::IntegerList: text = "list of ints" + (range.empty() ? "" : " " + range); break;
        case ConfigType::NumberList: text = "list of numbers" + (range.empty() ? "" : " " + range); break;
        case ConfigType::StringList:
            text = choices.empty() ? "list of strings" : "list of " + quoted_choices(choices, ", ");
            break;
        case ConfigType::Object: text = "object"; break;
        case ConfigType::PathOrObject: text = "path \\| object"; break;
    }
    return constraint.empty() ? text : text + ", " + constraint;
}

// ---- ConfigSchema ----

std::vector<std::string> ConfigSchema::objects() const {
    std::vector<std::string> out = {""};
    for (const ConfigKey& k : keys) {
        // Every prefix of the parent is an object too: "model", then "model.norm".
        std::string parent = k.parent();
        std::vector<std::string> chain;
        while (!parent.empty()) {
            chain.insert(chain.begin(), parent);
            const size_t dot = parent.rfind('.');
            parent = dot == std::string::npos ? "" : parent.substr(0, dot);
        }
        for (const std::string& object : chain)
            if (std::find(out.begin(), out.end(), object) == out.end()) out.push_back(object);
    }
    return out;
}

const ConfigKey* ConfigSchema::find(const std::string& path) const {
    for (const ConfigKey& k : keys)
        if (k.path == path) return &k;
    return nullptr;
}

const ConfigKey& ConfigSchema::key(const std::string& path) const {
    const ConfigKey* k = find(path);
    NL_REQUIRE(k != nullptr, "the ", job, " config schema declares no key '", path, "'");
    return *k;
}

const std::vector<std::string>& config_jobs() {
    static const std::vector<std::string> jobs = {"train", "stability", "sweep", "bench_norms"};
    return jobs;
}

const ConfigSchema& config_schema(const std::string& job) {
    static const ConfigSchema train = make_train_schema();
    static const ConfigSchema stability = make_stability_schema();
    static const ConfigSchema sweep = make_sweep_schema();
    static const ConfigSchema bench_norms = make_bench_norms_schema();
    if (job == "train") return train;
    if (job == "stability") return stability;
    if (job == "sweep") return sweep;
    if (job == "bench_norms") return bench_norms;
    std::string names;
    for (const std::string& name : config_jobs()) names += (names.empty() ? "" : ", ") + name;
    throw Error(fmt::format("no config schema for job '{}' (the jobs that read a config: {})", job, names));
}

// ---- JSON Schema ----

namespace {

json bound(double x, bool integer) { return integer ? json(static_cast<int64_t>(x)) : json(x); }

// The schema of one value (of a list's element for the list types).
json value_schema(const ConfigKey& k) {
    json s = json::object();
    switch (k.type) {
        case ConfigType::Integer:
        case ConfigType::IntegerList: s["type"] = "integer"; break;
        case ConfigType::Number:
        case ConfigType::NumberList: s["type"] = "number"; break;
        case ConfigType::Boolean: s["type"] = "boolean"; break;
        case ConfigType::String:
        case ConfigType::StringList:
        case ConfigType::Path: s["type"] = "string"; break;
        case ConfigType::Device:
            s["type"] = "string";
            s["pattern"] = "^(cpu|cuda(:[0-9]+)?)$";
            break;
        case ConfigType::Object: s["type"] = "object"; break;
        case ConfigType::PathOrObject: s["type"] = json::array({"string", "object"}); break;
    }
    if (!k.choices.empty()) s["enum"] = k.choices;
    const bool integer = is_integer(k.type);
    if (std::isfinite(k.min)) s[k.min_exclusive ? "exclusiveMinimum" : "minimum"] = bound(k.min, integer);
    if (std::isfinite(k.max)) s[k.max_exclusive ? "exclusiveMaximum" : "maximum"] = bound(k.max, integer);
    return s;
}

// Markdown links as plain text for an editor's tooltip: "[norms.md](norms.md)" -> "docs/norms.md"
// (the docs' links are relative to docs/), "[a](http://x)" -> "a (http://x)"; backticks dropped.
std::string plain_text(const std::string& markdown) {
    std::string out;
    for (size_t i = 0; i < markdown.size(); ++i) {
        const size_t close = markdown[i] == '[' ? markdown.find("](", i) : std::string::npos;
        const size_t end = close == std::string::npos ? std::string::npos : markdown.find(')', close);
        if (end == std::string::npos) {
            if (markdown[i] != '`') out += markdown[i];
            continue;
        }
        const std::string label = markdown.substr(i + 1, close - i - 1);
        const std::string target = markdown.substr(close + 2, end - close - 2);
        out += target.find("://") != std::string::npos ? label + " (" + target + ")" : "docs/" + target;
        i = end;
    }
    return out;
}

std::string description(const ConfigKey& k) {
    std::string text = k.meaning;
    if (!k.when_key.empty()) {
        std::string values;
        for (const std::string& v : k.when_values) values += (values.empty() ? "" : ", ") + v;
        text = values + ": " + text;
    }
    if (k.default_value.is_null() && !k.default_text.empty() && !k.required)
        text += " (default: " + k.default_text + ")";
    if (!k.constraint.empty()) text += " (" + k.constraint + ")";
    return plain_text(text);
}

json key_schema(const ConfigKey& k) {
    json element = value_schema(k);
    json s = is_list(k.type)
                 ? json{{"anyOf", json::array({element, {{"type", "array"}, {"items", element}, {"minItems", 1}}})}}
                 : element;
    if (!k.default_value.is_null()) s["default"] = k.default_value;
    s["description"] = description(k);
    return s;
}

// The sibling `when_key`'s default, to decide what an absent one means.
json sibling_default(const ConfigSchema& schema, const ConfigKey& k) {
    const std::string parent = k.parent();
    const ConfigKey* sibling = schema.find(parent.empty() ? k.when_key : parent + "." + k.when_key);
    return sibling ? sibling->default_value : json();
}

}  // namespace

json json_schema(const ConfigSchema& schema) {
    std::map<std::string, json> objects;
    for (const std::string& object : schema.objects())
        objects[object] = {{"type", "object"}, {"additionalProperties", false}, {"properties", json::object()}};
    for (const ConfigKey& k : schema.keys) {
        json& object = objects[k.parent()];
        object["properties"][k.name()] = key_schema(k);
        if (k.when_key.empty()) {
            if (k.required) object["required"].push_back(k.name());  // everywhere (a sweep's base)
            continue;
        }
        // The key of another source is refused; where it applies and is required, it must be given.
        const json absent_means = sibling_default(schema, k);
        const bool applies_when_absent = std::find(k.when_values.begin(), k.when_values.end(),
                                                   absent_means.is_string() ? absent_means.get<std::string>() : "") !=
                                         k.when_values.end();
        json other = {{"properties", {{k.when_key, {{"not", {{"enum", k.when_values}}}}}}}};
        if (applies_when_absent) other["required"] = {k.when_key};
        object["allOf"].push_back({{"if", other}, {"then", {{"not", {{"required", {k.name()}}}}}}});
        if (k.required) {
            json applies = {{"properties", {{k.when_key, {{"enum", k.when_values}}}}}};
            if (!applies_when_absent) applies["required"] = {k.when_key};
            object["allOf"].push_back({{"if", applies}, {"then", {{"required", {k.name()}}}}});
        }
    }
    // Nest the objects, deepest first, each into its parent's properties.
    std::vector<std::string> order = schema.objects();
    std::sort(order.begin(), order.end(), [](const std::string& a, const std::string& b) {
        return std::count(a.begin(), a.end(), '.') > std::count(b.begin(), b.end(), '.');
    });
    for (const std::string& object : order) {
        if (object.empty()) continue;
        const size_t dot = object.rfind('.');
        const std::string parent = dot == std::string::npos ? "" : object.substr(0, dot);
        objects[parent]["properties"][object.substr(dot == std::string::npos ? 0 : dot + 1)] = objects[object];
    }
    json root = {{"$schema", "https://json-schema.org/draft/2020-12/schema"},
                 {"$id", "normlab/" + schema.job + ".schema.json"},
                 {"title", schema.title}};
    for (auto& [name, value] : objects[""].items()) root[name] = value;
    root["properties"]["$schema"] = {
        {"type", "string"},
        {"description", "the JSON Schema this file follows, for editors (normlab reads past it)"}};
    return root;
}

// ---- docs ----

std::string config_markdown_table(const ConfigSchema& schema) {
    std::ostringstream out;
    out << "| key | type | default | meaning |\n|---|---|---|---|\n";
    for (const ConfigKey& k : schema.keys) {
        std::string fallback;
        if (!k.default_value.is_null()) {
            fallback = json_text(k.default_value);
            if (k.default_value.is_string() || k.default_value.is_array()) fallback = "`" + fallback + "`";
        } else {
            fallback = k.default_text;
        }
        std::string meaning = k.meaning;
        if (!k.when_key.empty()) {
            std::string values;
            for (const std::string& v : k.when_values) values += (values.empty() ? "" : ", ") + v;
            meaning = values + ": " + meaning;
        }
        out << "| `" << k.path << "` | " << k.type_text() << " | " << fallback << " | " << meaning << " |\n";
    }
    return out.str();
}

std::string update_generated_config_tables(const std::string& text, const std::string& file) {
    const std::string begin = "<!-- generated by `normlab config --markdown ";
    const std::string begin_end = "`: do not edit -->\n";
    const std::string end = "<!-- end of generated table -->";
    std::string out;
    size_t at = 0;
    while (true) {
        const size_t start = text.find(begin, at);
        if (start == std::string::npos) break;
        const size_t job_end = text.find(begin_end, start);
        NL_REQUIRE(job_end != std::string::npos, file, ": a generated-table marker at byte ", start,
                   " is not of the form ", begin, "JOB", begin_end.substr(0, begin_end.size() - 1));
        const std::string job = text.substr(start + begin.size(), job_end - start - begin.size());
        const size_t stop = text.find(end, job_end);
        NL_REQUIRE(stop != std::string::npos, file, ": the generated table of '", job, "' has no closing ", end);
        out += text.substr(at, job_end + begin_end.size() - at);
        out += config_markdown_table(config_schema(job));
        at = stop;
    }
    return out + text.substr(at);
}

json config_defaults(const ConfigSchema& schema) {
    json out = json::object();
    for (const ConfigKey& k : schema.keys) {
        if (k.default_value.is_null()) continue;
        if (!k.when_key.empty()) {
            const json when = sibling_default(schema, k);
            if (!when.is_string() ||
                std::find(k.when_values.begin(), k.when_values.end(), when.get<std::string>()) == k.when_values.end())
                continue;
        }
        out[json::json_pointer(k.pointer())] = k.default_value;
    }
    return out;
}

}  // namespace nl
