// LLaMA-style transformer parts with LLaMA's parameter names (Touvron et al. 2023; the reference is
// meta-llama/llama model.py): the SwiGLU FeedForward, causal multi-head self-attention with
// grouped-query heads, rotary position embeddings (RoPE, Su et al. 2021, LLaMA's interleaved
// complex-pair layout) and optional QK-norm, blocks with the norm placements that stability research
// compares (pre-norm LLaMA, post-norm Vaswani et al. 2017, Peri-LN, OLMo 2's output norms, Mix-LN,
// DeepNorm, none; docs/norms.md draws them), and a decoder-only language model, with a KV cache for
// generation (each new token computes one position).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/norms.h"

namespace nl {

// ---- SwiGLU feed-forward ----

// LLaMA's FeedForward hidden size: multiple_of * ceil(int(2 * hidden_dim / 3) / multiple_of).
// E.g. (64, 8): int(128 / 3) = 42 -> 48.
int64_t swiglu_hidden_dim(int64_t hidden_dim, int64_t multiple_of);

struct FeedForwardOptions {
    int64_t dim = 0;
    int64_t hidden_dim = 0;   // the argument before the 2/3 rule (LLaMA passes 4 * dim)
    int64_t multiple_of = 256;  // the article's LLaMAFeedForward(dim, hidden_dim, multiple_of=256)
    DType dtype = DType::F32;
    Generator* generator = nullptr;  // null: module_init_generator()
    bool fused = true;               // swiglu()'s fused form (else the composed reference)
};

// SwiGLU's gate, silu(a) * b (a, b one shape). fused: one graph node over a kernel pair
// (core/fused.h), saving a and b, whose backward under create_graph is the composed form's
// autograd (autograd/fused_node.h); composed: silu and mul in autograd ops. Both twice differentiable.
Var swiglu(const Var& a, const Var& b, bool fused);

// out = w2(silu(w1 x) * w3 x); w1, w3 (hidden, dim), w2 (dim, hidden), no biases.
class FeedForward : public UnaryModule {
public:
    explicit FeedForward(const FeedForwardOptions& options);
    std::string type_name() const override { return "FeedForward"; }
    std::string extra_repr() const override;
    Var forward(const Var& x) override;  // (..., dim) -> (..., dim)
    int64_t hidden() const { return hidden_; }

private:
    FeedForwardOptions options_;
    int64_t hidden_;
    std::shared_ptr<Linear> w1_, w2_, w3_;
};

// ---- rotary position embeddings ----

struct RopeTables {
    Tensor cos;  // (T, head_dim / 2): cos(t * theta^(-2k / head_dim))
    Tensor sin;  // (T, head_dim / 2)
};
// Positions 0..seq_len-1. dtype F32 computes as LLaMA does (the frequencies and angles in f32);
// F64 computes everything in f64 (for gradient checks). Other dtypes are not accepted.
RopeTables rope_tables(int64_t head_dim, int64_t seq_len, double theta, DType dtype = DType::F32);

// x (B, T, H, head_dim): rotates each interleaved pair (x[2k], x[2k+1]) at position t by the angle
// of tables[t, k]: out[2k] = x[2k] cos - x[2k+1] sin, out[2k+1] = x[2k] sin + x[2k+1] cos.
// The tables need at least T rows (extra rows are ignored). bf16/f16 x is rotated in f32 and cast
// back (LLaMA's xq.float() ... type_as(xq)); f64 x needs f64 tables, other x f32 tables.
Var apply_rope(const Var& x, const RopeTables& tables);

// ---- attention ----

// Causal scaled dot-product attention of q (B, T, H, hd) over k and v (B, L, KV, hd), L >= T, KV
// dividing H: query head h reads kv head h / (H / KV) (LLaMA's repeat_kv), query row i sits at
// position L - T + i and sees keys 0..L - T + i, scores scaled by 1 / sqrt(hd), softmax in at least
// f32. Returns (B, T, H, hd).
// - fused: one graph node over a FlashAttention kernel pair (core/fused.h): no (T x L) matrix is
//   formed or saved, only q, k, v, the output and one logsumexp per row; the repeated K/V heads are
//   never materialized. Twice differentiable: under backward(create_graph=true) the node's
//   backward is the composed form's autograd (autograd/fused_node.h).
// - composed: LLaMA's code in autograd ops (repeat_kv, q k^T / sqrt(hd), a -inf mask above the
//   diagonal, softmax, @ v): the reference, twice differentiable. Under autocast its two products
//   run in bf16.
// softcap = cap > 0: Gemma 2's attention logit soft-capping (Gemma Team 2024), the scaled scores
// become cap * tanh(scores / cap) before the mask and the softmax; 0 (the default) is off, with the
// same bits and speed as without it. cap must be finite and >= 0.
Var causal_attention(const Var& q, const Var& k, const Var& v, bool fused, double softcap = 0.0);

// One layer's part of a KV cache (generation, no autograd): the keys (after RoPE) and values of the
// positions 0..start-1 already seen, in buffers with room for `capacity` positions.
struct KVSlot {
    Tensor keys;        // (B, capacity, n_kv_heads, head_dim)
    Tensor values;      // (B, capacity, n_kv_heads, head_dim)
    int64_t start = 0;  // positions filled; the next input's first position
};

// QK-norm (Dehghani et al. 2023, ViT-22B; Wortsman et al. 2023): a norm on the projected queries
// and keys, before RoPE. The accepted AttentionOptions::qk_norm values, with what each normalizes:
//   "none": no QK-norm;
//   "head": each head's head_dim vector of q and of k (Qwen3, Gemma 3): q_norm, k_norm over [head_dim];
//   "full": the whole projected q (n_heads * head_dim) and k (n_kv_heads * head_dim) (OLMo 2).
const std::vector<std::string>& qk_norm_choices();

// RoPE's base where none is given: LLaMA's ModelArgs.rope_theta (RoFormer's 10000).
inline constexpr double kDefaultRopeTheta = 10000.0;

struct AttentionOptions {
    int64_t dim = 0;
    int64_t n_heads = 1;
    int64_t n_kv_heads = 0;  // 0: n_heads (plain multi-head attention); must divide n_heads
    int64_t head_dim = 0;    // each head's size; 0: dim / n_heads (which n_heads must then divide). Qwen3's is its own
    double rope_theta = kDefaultRopeTheta;
    // Longer inputs are an error; 0: no bound. Only a Transformer has a context of its own
    // (TransformerOptions::max_seq_len, which it passes down); a module alone takes none by default.
    int64_t max_seq_len = 0;
    bool fused = true;           // causal_attention's fused form (else the composed reference)
    std::string qk_norm = "none";  // qk_norm_choices(); the norm is qk_norm_options' type
    NormOptions qk_norm_options;   // type rmsnorm or layernorm; dim and dtype are set by Attention
    double softcap = 0.0;          // scores capped to cap * tanh(s / cap) before softmax (Gemma 2); 0: off
    DType dtype = DType::F32;
    Generator* generator = nullptr;  // null: module_init_generator()
};

// What the attention probe measures of one forward (attention_probe).
struct AttentionProbe {
    // The largest |q k^T| / sqrt(hd) over the visible entries, before soft-capping and softmax
    // (Wortsman et al. 2023's attention-logit growth).
    double max_score = 0.0;
    // The entropy of p in nats, -sum_j p_j log p_j, mean over batch, heads and every query row.
    double entropy = 0.0;
    // p on key position 0, mean over batch, heads and the query rows at positions >= 1 (position 0
    // sees only itself); Xiao et al. 2023's attention sink. NaN when no row is at a position >= 1.
    double sink = 0.0;
    // The same two per query head (H,), in head order: each head's mean over batch and its rows.
    std::vector<double> entropy_by_head, sink_by_head;
};

// Causal self-attention as LLaMA's Attention: wq (n_heads*hd, dim), wk and wv (n_kv_heads*hd, dim),
// wo (dim, n_heads*hd), no biases, hd = head_dim (dim / n_heads unless set). With QK-norm, q_norm and k_norm normalize the
// projections before RoPE (see qk_norm_choices). RoPE on q and k; query head h reads kv head
// h / (n_heads / n_kv_heads) (repeat_kv); scores q k^T / sqrt(hd) with -inf above the diagonal;
// softmax in f32 (cast back for half inputs); heads concatenated head-major, then wo.
class Attention : public UnaryModule {
public:
    explicit Attention(const AttentionOptions& options);
    std::string type_name() const override { return "Attention"; }
    std::string extra_repr() const override;
    Var forward(const Var& x) override;  // (B, T, dim) -> (B, T, dim)
    // x (B, T, dim) at positions slot.start..slot.start+T-1, attending to the cached positions and
    // itself (causally); its keys and values are appended to the slot (the caller advances start).
    // The same computation as forward() on the whole sequence. Inference only (NoGradGuard).
    Var forward_cached(const Var& x, const KVSlot& slot);

    int64_t head_dim() const { return head_dim_; }
    int64_t n_heads() const { return options_.n_heads; }
    int64_t n_kv_heads() const { return options_.n_kv_heads; }
    const AttentionOptions& options() const { return options_; }

    // Probing (the train job's probes): while on, every forward records attention_probe of its q
    // and k (the scores recomputed in one extra product, so it costs nothing while off).
    void set_probing(bool on) { probing_ = on; }
    const AttentionProbe& last_probe() const { return last_probe_; }
    // The RoPE tables for positions 0..seq_len-1 in `dtype` (cached, recomputed when a longer
    // sequence or another dtype comes).
    RopeTables rope(int64_t seq_len, DType dtype);

private:
    Var attend(const Var& x, const KVSlot* slot);  // slot null: no cache, positions from 0
    Var qk_normalized(const char* name, const Var& x);  // q_norm or k_norm of x, in x's dtype

    AttentionOptions options_;
    int64_t head_dim_;
    std::shared_ptr<Linear> wq_, wk_, wv_, wo_;
    RopeTables rope_cache_;
    bool probing_ = false;
    AttentionProbe last_probe_;
};

// The attention probe's formulas, public so a test can recompute them: of q (B, T, H, hd) and k
// (B, L, KV, hd) as causal_attention takes them (query row i at position L - T + i sees keys
// 0..L - T + i; query head h reads kv head h / (H / KV)), with p the attention distribution
// softmax(softcap(q k^T / sqrt(hd))) over a row's visible keys. No gradient; computed in f64.
AttentionProbe attention_probe(const Tensor& q, const Tensor& k, double softcap);

// ---- blocks ----

// What the residual-stream probe measures of a block's output h (..., dim), in f64 (residual_probe).
struct ResidualProbe {
    double rms = 0.0;      // sqrt(mean(h^2)) over every element (Xiong et al. 2020: growth with depth)
    double max_abs = 0.0;  // max |h| (Sun et al. 2024's massive activations)
    // With s_j the RMS of channel j over every row (batch and positions), mean(s^4) / mean(s^2)^2:
    // 1 when every channel has the same scale, large when a few channels carry it (He et al. 2024's
    // outlier features; the plain ratio, not the excess).
    double kurtosis = 0.0;
};
ResidualProbe residual_probe(const Tensor& h);

// Where a block's norms sit: one row per model.norm_placement (norm_placements()). N is a norm, f
// the sublayer (attention, then the feed-forward), x the residual stream; each line is one sublayer's
// step. TransformerBlock builds and runs its norms from the row, and the model, the config checks and
// interop read it; a new placement is a row plus its PyTorch formula in the replay's model
// (examples/python/torch_model.py). A block's norms are always named attention_norm and ffn_norm
// (on the sublayer's input, or on the residual sum) and attention_out_norm and ffn_out_norm (on the
// sublayer's output).
struct NormPlacement {
    std::string name;
    std::string formula;    // one line, for help texts and docs/norms.md
    std::string reference;  // the paper or model it comes from
    bool input_norms = false;      // attention_norm, ffn_norm on each sublayer's input: h = x + f(N(x))
    bool sum_norms = false;        // attention_norm, ffn_norm on the residual sum: h = N(x + f(x))
    bool output_norms = false;     // attention_out_norm, ffn_out_norm on each sublayer's output: h = x + N(f(x))
    bool scaled_residual = false;  // the residual times deepnorm_alpha before the sum, alpha and beta from n_layers
    bool final_norm = true;        // the model's norm before the output head
    bool mixed = false;            // the model's only: its blocks are post, then pre (TransformerOptions::block_placement)
    bool hf_export = false;        // a transformers class holds it (which one also depends on qk_norm: jobs/interop.h)
    bool gguf_export = false;      // llama.cpp's "llama" holds it (with qk_norm none)
};
// pre, post, peri, output, mix, deepnorm, none (mix is the model's: its blocks are post or pre).
const std::vector<NormPlacement>& norm_placements();
std::vector<std::string> norm_placement_names();
// The row of `name`; nl::Error naming the accepted names for any other.
const NormPlacement& norm_placement(const std::string& name);
// The placements with pre-norms for LayerNorm Scaling (norm_scaling "depth") to scale: "pre, peri or mix".
std::string depth_scalable_placements();

struct TransformerBlockOptions {
    int64_t dim = 0;
    int64_t n_heads = 1;
    int64_t n_kv_heads = 0;      // 0: n_heads
    int64_t head_dim = 0;        // AttentionOptions::head_dim; 0: dim / n_heads
    int64_t ffn_hidden_dim = 0;  // the FeedForward argument before the 2/3 rule; 0: 4 * dim (LLaMA)
    int64_t multiple_of = 256;   // the article's LLaMATransformerBlock(..., multiple_of=256, norm_eps=1e-5)
    NormOptions norm;            // any norm type (norm.dim is set to dim); eps unset: the type's 1e-5
    // A norm_placements() name other than "mix" (the model resolves mix block by block).
    std::string norm_placement = "pre";
    // LayerNorm Scaling (Sun et al. 2025, The Curse of Depth): each pre-norm's output (the input
    // norms of pre and peri) is multiplied by this; the model sets 1 / sqrt(l) for the l-th block.
    double pre_norm_scale = 1.0;
    // deepnorm: h = N(deepnorm_alpha * x + f(x)); the value, output and feed-forward weights are
    // initialized times deepnorm_beta (Wang et al. 2022; the model sets both from n_layers).
    double deepnorm_alpha = 1.0;
    double deepnorm_beta = 1.0;
    std::string qk_norm = "none";  // AttentionOptions::qk_norm; its norm is `norm`'s options
    // DyT's alpha_init for attention_norm where it is the attention's input norm (pre, peri); unset:
    // norm.alpha_init. Zhu et al. 2025 give the norms before attention their own value in LLaMA.
    std::optional<double> alpha_init_attention;
    double attn_softcap = 0.0;     // AttentionOptions::softcap
    double rope_theta = kDefaultRopeTheta;
    int64_t max_seq_len = 0;  // AttentionOptions::max_seq_len
    bool fused_attention = true;  // AttentionOptions::fused
    bool fused_swiglu = true;     // FeedForwardOptions::fused
    DType dtype = DType::F32;
    Generator* generator = nullptr;  // null: module_init_generator()
};

// Children, in LLaMA's order: attention, feed_forward, then the norms the placement has:
// attention_norm and ffn_norm (the input norms of pre and peri, the norms after the sum of post and
// deepnorm), attention_out_norm and ffn_out_norm (on the sublayer's output: peri, output).
//   pre (LLaMA):            h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h))
//   post (Vaswani et al.):  h = attention_norm(x + attention(x)); out = ffn_norm(h + feed_forward(h))
//   peri (Peri-LN):         h = x + attention_out_norm(attention(attention_norm(x))); likewise ffn_*
//   output (OLMo 2):        h = x + attention_out_norm(attention(x)); likewise ffn_out_norm
//   deepnorm (DeepNet):     h = attention_norm(alpha * x + attention(x)); likewise ffn_norm
//   none:                   h = x + attention(x); out = h + feed_forward(h)
class TransformerBlock : public UnaryModule {
public:
    explicit TransformerBlock(const TransformerBlockOptions& options);
    std::string type_name() const override { return "TransformerBlock"; }
    std::string extra_repr() const override;
    Var forward(const Var& x) override;  // (B, T, dim) -> (B, T, dim)
    Var forward_cached(const Var& x, const KVSlot& slot);  // see Attention::forward_cached

    std::shared_ptr<Attention> attention() const;
    std::shared_ptr<FeedForward> feed_forward() const;
    // Read through child() so a norm swapped by replace_module (the LayerNorm -> RMSNorm
    // migration) is the one used.
    std::shared_ptr<UnaryModule> attention_norm() const;
    std::shared_ptr<UnaryModule> ffn_norm() const;
    const TransformerBlockOptions& options() const { return options_; }

    // Probing: while on, every forward records residual_probe of its output (the residual stream
    // after the block) and its attention's probe (Attention::set_probing).
    void set_probing(bool on);
    const ResidualProbe& last_residual_probe() const { return last_residual_probe_; }

private:
    Var run(const Var& x, const KVSlot* slot);
    // norm(x), times pre_norm_scale where it is not 1 (the input norms of pre and peri).
    Var input_norm(const char* name, const Var& x);
    // norm(branch) for the output norms, the branch read in the stream's dtype (under autocast the
    // sublayer ends in a bf16 Linear while the norm's parameters are the model's dtype).
    Var output_norm(const char* name, const Var& branch, DType stream_dtype);

    bool probing_ = false;
    ResidualProbe last_residual_probe_;

    TransformerBlockOptions options_;
};

// ---- the language model ----

// Every layer's keys and values for generation (Transformer::make_cache): feed the prompt, then one
// token at a time, each costing one position instead of the whole sequence.
struct KVCache {
    std::vector<KVSlot> layers;  // one per block; Transformer::forward_cached sets their start
    int64_t capacity = 0;        // positions the buffers hold (<= the model's max_seq_len)
    int64_t length = 0;          // positions filled; 0 forgets them all (the buffers are kept)
};

// LLaMA's ModelArgs, plus the norm, its placement and the stability research's knobs.
struct TransformerOptions {
    int64_t vocab_size = 0;
    int64_t dim = 64;
    int64_t n_layers = 2;
    int64_t n_heads = 4;
    int64_t n_kv_heads = 0;      // 0: n_heads
    int64_t head_dim = 0;        // each head's size (Qwen3: 128 at dim 1024 with 16 heads); 0: dim / n_heads
    int64_t multiple_of = 256;   // SwiGLU hidden rounding (LLaMA's ModelArgs and the article: 256)
    int64_t ffn_hidden_dim = 0;  // 0: 4 * dim before the 2/3 rule (LLaMA)
    NormOptions norm;            // every block's norms and the final norm (norm.dim is set to dim); eps
                                 // unset: the type's default, 1e-5 (ModelArgs.norm_eps)
    std::string norm_placement = "pre";  // norm_placements(); TransformerBlock has the formulas
    double mix_fraction = 0.25;  // mix (Mix-LN, Li et al. 2024): the first ceil(mix_fraction * n_layers) blocks are post
    // "none" or "depth": LayerNorm Scaling (Sun et al. 2025), each pre-norm's output times 1 / sqrt(l)
    // in the l-th block (1-based); needs pre-norms (pre, peri, mix).
    std::string norm_scaling = "none";
    std::string qk_norm = "none";  // qk_norm_choices(); needs norm.type rmsnorm or layernorm
    std::optional<double> alpha_init_attention;  // TransformerBlockOptions::alpha_init_attention
    // Soft-capping (Gemma 2): cap * tanh(s / cap) on the final logits and on the attention scores
    // before softmax; 0 is off.
    double logit_softcap = 0.0;
    double attn_softcap = 0.0;
    double rope_theta = kDefaultRopeTheta;
    int64_t max_seq_len = 256;
    bool fused_attention = true;  // AttentionOptions::fused
    bool fused_swiglu = true;     // FeedForwardOptions::fused
    uint64_t seed = 0;           // initial weights are drawn from Generator(seed)
    // The initial weights of the embedding and every Linear (init_choices()): "pytorch" (Embedding
    // N(0, 1), Linear kaiming-uniform with bound 1 / sqrt(fan_in): PyTorch's defaults), "normal" (all
    // N(0, init_std^2): GPT-2, OLMo) or "xavier" (Linear U(-b, b), b = sqrt(6 / (fan_in + fan_out)),
    // Glorot & Bengio 2010, as Xiong et al. 2020; the embedding keeps PyTorch's N(0, 1)).
    // init_scaled_residual: attention.wo and feed_forward.w2, whose outputs join the residual stream,
    // drawn with std (or bound) / sqrt(2 n_layers) (GPT-2's rule). Norm parameters keep their
    // registry init; deepnorm's beta applies on top.
    std::string init = "pytorch";
    double init_std = 0.02;
    bool init_scaled_residual = false;
    DType dtype = DType::F32;

    // nl::Error naming the field when sizes do not fit (dim % n_heads, n_heads % n_kv_heads, odd head
    // dim...) or the choices do not go together (qk_norm with a norm type it cannot use, deepnorm
    // without layers, depth scaling without pre-norms, a negative cap).
    void validate() const;
    // Each head's size: head_dim, or dim / n_heads where it is 0.
    int64_t head_size() const { return head_dim > 0 ? head_dim : dim / n_heads; }
    // The l-th block's (0-based) placement: norm_placement, or for mix post or pre.
    std::string block_placement(int64_t layer) const;
};

// TransformerOptions::init's choices: pytorch, normal, xavier.
const std::vector<std::string>& init_choices();

// Parameters (LLaMA names): tok_embeddings.weight (vocab, dim), layers.<i>.attention.w{q,k,v,o}.weight,
// layers.<i>.attention.{q,k}_norm.* (QK-norm), layers.<i>.feed_forward.w{1,2,3}.weight, the block
// norms the placement has (layers.<i>.attention_norm.*, ffn_norm.*, attention_out_norm.*,
// ffn_out_norm.*), norm.*, output.weight (vocab, dim). Init: Embedding N(0, 1), Linear PyTorch's
// default, norms their registry init, all drawn in construction order from Generator(options.seed)
// (norms draw nothing, so the placement does not change the other weights' values; deepnorm scales
// some by beta). The final norm is kept for every placement but none (for post and deepnorm the
// blocks' outputs are already normalized, so the names never change).
class Transformer : public Module {
public:
    explicit Transformer(const TransformerOptions& options);
    std::string type_name() const override { return "Transformer"; }
    std::string extra_repr() const override;

    // ids (B, T) i64, each in [0, vocab_size), T <= max_seq_len -> logits (B, T, vocab_size).
    // Under an AutocastGuard (layers/autocast.h) every Linear and attention product runs in bf16,
    // the residual stream and the norms stay in the model's dtype, and the logits come out bf16
    // (cast them to f32 for the loss, as torch.autocast's cross_entropy does).
    Var forward(const Tensor& ids);
    // forward() in its two ends, for a caller that runs the blocks itself (layer(i)->forward, as
    // `normlab analyze` does to skip one): ids (B, T) -> the embedded stream (B, T, dim), and the
    // stream after the last block -> logits (B, T, vocab_size) (final norm, output, logit soft-cap).
    Var embed(const Tensor& ids);
    Var logits(const Var& h);
    // A cache for `batch` sequences of up to `capacity` positions (<= max_seq_len), on the model's
    // device and in its dtype.
    KVCache make_cache(int64_t batch, int64_t capacity) const;
    // ids (B, T) at positions cache.length()..cache.length()+T-1 -> logits (B, T, vocab_size), the
    // same as the last T positions of forward() on the whole sequence; advances the cache by T.
    // Positions past the capacity are an error. Inference only (under NoGradGuard).
    Var forward_cached(const Tensor& ids, KVCache& cache);

    const TransformerOptions& options() const { return options_; }
    std::shared_ptr<TransformerBlock> layer(int64_t index) const;
    int64_t n_layers() const { return options_.n_layers; }

    // Probing: while on, every forward records each block's residual and attention probes
    // (TransformerBlock::set_probing) and the logsumexp of every output row (mean and max).
    void set_probing(bool on);
    struct Probes {
        std::vector<AttentionProbe> attention;  // (n_layers,)
        std::vector<ResidualProbe> residual;    // (n_layers,)
        double logsumexp_mean = 0.0;              // over the rows of the last forward's logits
        double logsumexp_max = 0.0;
    };
    Probes last_probes() const;

private:
    Var run(const Tensor& ids, KVCache* cache);

    TransformerOptions options_;
    bool probing_ = false;
    double last_lse_mean_ = 0.0, last_lse_max_ = 0.0;
};

// Parameter count of a module (elements); without embeddings: minus every parameter whose name
// ends in "embeddings.weight" (the lookup tables, as model-size conventions count).
int64_t count_parameters(const Module& module, bool include_embeddings = true);

}  // namespace nl
