// LLaMA-style transformer parts (reference: meta-llama/llama model.py; the fixtures' generator
// tests/reference/make_fixtures.py mirrors it): autograd ops, fused kernels (core/fused.h) for RoPE,
// SwiGLU's gate and causal attention, and the norms of layers/norms.h.
#include "layers/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/fused_node.h"
#include "autograd/grad_mode.h"
#include "core/fused.h"
#include "layers/activation.h"
#include "layers/autocast.h"
#include "layers/norms.h"

namespace nl {

// ---------------------------------------------------------------- SwiGLU feed-forward

int64_t swiglu_hidden_dim(int64_t hidden_dim, int64_t multiple_of) {
    NL_REQUIRE(hidden_dim > 0, "FeedForward: hidden_dim must be > 0, found ", hidden_dim);
    NL_REQUIRE(multiple_of > 0, "FeedForward: multiple_of must be > 0, found ", multiple_of);
    const int64_t h = 2 * hidden_dim / 3;  // python int(2 * hidden_dim / 3): floor for positives
    return multiple_of * ((h + multiple_of - 1) / multiple_of);
}

// LLaMA's projections: Linear without bias, PyTorch's default init drawn from `generator`.
static std::shared_ptr<Linear> bias_free_linear(int64_t in, int64_t out, DType dtype, Generator* generator) {
    LinearOptions lo;
    lo.in_features = in;
    lo.out_features = out;
    lo.bias = false;
    lo.dtype = dtype;
    lo.generator = generator;
    return std::make_shared<Linear>(lo);
}

FeedForward::FeedForward(const FeedForwardOptions& options)
    : options_(options), hidden_(swiglu_hidden_dim(options.hidden_dim, options.multiple_of)) {
    NL_REQUIRE(options.dim > 0, "FeedForward: dim must be > 0, found ", options.dim);
    options_.generator = nullptr;  // only used while constructing
    auto linear = [&](int64_t in, int64_t out) {
        return bias_free_linear(in, out, options.dtype, options.generator);
    };
    // LLaMA's construction (and so init) order: w1, w2, w3.
    w1_ = register_module("w1", linear(options.dim, hidden_));
    w2_ = register_module("w2", linear(hidden_, options.dim));
    w3_ = register_module("w3", linear(options.dim, hidden_));
}

std::string FeedForward::extra_repr() const {
    return detail::concat("dim=", options_.dim, ", hidden=", hidden_);
}

Var swiglu(const Var& a, const Var& b, bool fused) {
    if (!fused) return silu(a) * b;
    std::vector<SavedTensor> saved;  // as Vars: the composed twin differentiates through them
    saved.emplace_back("a", a);
    saved.emplace_back("b", b);
    return make_fused_result(swiglu_forward(a.data(), b.data()), "swiglu", {a, b}, std::move(saved), {0, 1},
                             [](const Var& dout, const std::vector<Var>& s) -> std::vector<Var> {
                                 SwigluBackward g = swiglu_backward(dout.data(), s[0].data(), s[1].data());
                                 return {Var(g.da), Var(g.db)};
                             },
                             [](const std::vector<Var>& in) { return silu(in[0]) * in[1]; });
}

Var FeedForward::forward(const Var& x) {
    const Tensor x_low = autocast_lower_data(x);  // one bf16 copy of x under autocast (else undefined)
    return w2_->forward(swiglu(w1_->forward_cast(x, x_low), w3_->forward_cast(x, x_low), options_.fused));
}

// ---------------------------------------------------------------- RoPE

namespace {

// One graph node for the whole rotation, one fused kernel each way (core/fused.h's rope_rotate, the
// order of torch's complex product): the gradient is the inverse rotation. x (B, T, H, hd) in any
// floating dtype (a half one is rotated in f32 and rounded once); cos/sin (T, hd/2) in x's compute
// dtype.
Var rotate_pairs(const Var& x, const Tensor& cos, const Tensor& sin, bool inverse) {
    return make_result(rope_rotate(x.data(), cos, sin, inverse), "rope", {x}, {},
                       [cos, sin, inverse](const Var& g, const std::vector<Var>&) -> std::vector<Var> {
                           return {rotate_pairs(g, cos, sin, !inverse)};
                       });
}

}  // namespace

RopeTables rope_tables(int64_t head_dim, int64_t seq_len, double theta, DType dtype) {
    NL_REQUIRE(head_dim > 0 && head_dim % 2 == 0, "rope_tables: head_dim must be even and > 0, found ", head_dim);
    NL_REQUIRE(seq_len >= 0, "rope_tables: seq_len must be >= 0, found ", seq_len);
    NL_REQUIRE(theta > 0.0, "rope_tables: theta must be > 0, found ", theta);
    NL_REQUIRE(dtype == DType::F32 || dtype == DType::F64, "rope_tables: dtype must be f32 or f64, found ",
               dtype_name(dtype));
    const int64_t half = head_dim / 2;
    std::vector<double> c(static_cast<size_t>(seq_len * half)), s(c.size());  // (T, hd/2)
    for (int64_t k = 0; k < half; ++k) {
        if (dtype == DType::F32) {
            // LLaMA's precompute_freqs_cis in f32: 1 / theta^(arange(0, hd, 2) / hd), angle t * freq.
            const float freq = 1.0f / std::pow(static_cast<float>(theta),
                                               static_cast<float>(2 * k) / static_cast<float>(head_dim));
            for (int64_t t = 0; t < seq_len; ++t) {
                const float angle = static_cast<float>(t) * freq;
                c[t * half + k] = std::cos(angle);
                s[t * half + k] = std::sin(angle);
            }
        } else {
            const double freq = 1.0 / std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(head_dim));
            for (int64_t t = 0; t < seq_len; ++t) {
                const double angle = static_cast<double>(t) * freq;
                c[t * half + k] = std::cos(angle);
                s[t * half + k] = std::sin(angle);
            }
        }
    }
    return {from_vector(c, {seq_len, half}, dtype), from_vector(s, {seq_len, half}, dtype)};
}

Var apply_rope(const Var& x, const RopeTables& tables) {
    NL_REQUIRE(x.defined() && x.dim() == 4, "apply_rope: expected x of shape (B, T, H, head_dim), found ",
               x.defined() ? shape_str(x.shape()) : "undefined");
    const int64_t T = x.size(1), hd = x.size(3);
    NL_REQUIRE(hd % 2 == 0, "apply_rope: head_dim must be even, found ", shape_str(x.shape()));
    NL_REQUIRE(tables.cos.defined() && tables.cos.dim() == 2 && tables.cos.size(1) == hd / 2 &&
                   tables.cos.size(0) >= T && tables.sin.shape() == tables.cos.shape(),
               "apply_rope: tables must be (>= ", T, ", ", hd / 2, ") for x ", shape_str(x.shape()), ", found cos ",
               tables.cos.defined() ? shape_str(tables.cos.shape()) : "undefined");
    // Half inputs rotate in f32 and are rounded back (LLaMA: xq.float() ... .type_as(xq)). rope_rotate
    // does both inside its kernel, each way, with the bits of the widen / rotate / round ops.
    const DType compute = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
    NL_REQUIRE(tables.cos.dtype() == compute, "apply_rope: x of dtype ", dtype_name(x.dtype()),
               " needs ", dtype_name(compute), " tables, found ", dtype_name(tables.cos.dtype()));
    const Tensor cos = tables.cos.narrow(0, 0, T).to(x.device());  // (T, hd/2)
    const Tensor sin = tables.sin.narrow(0, 0, T).to(x.device());
    return rotate_pairs(x, cos, sin, false);  // (B, T, H, hd) in x's dtype
}

// ---------------------------------------------------------------- attention

const std::vector<std::string>& qk_norm_choices() {
    static const std::vector<std::string> choices = {"none", "head", "full"};
    return choices;
}

namespace {
bool contains(const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
}

std::string joined(const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
}

// The norm types QK-norm takes: a norm of the vector's scale, with or without its mean.
void check_qk_norm(const std::string& qk_norm, const std::string& norm_type, const char* where) {
    NL_REQUIRE(contains(qk_norm_choices(), qk_norm), where, ": qk_norm must be one of ", joined(qk_norm_choices()),
               ", found \"", qk_norm, "\"");
    NL_REQUIRE(qk_norm == "none" || norm_type == "rmsnorm" || norm_type == "layernorm", where,
               ": qk_norm \"", qk_norm, "\" needs norm type rmsnorm or layernorm, found \"", norm_type, "\"");
}
}  // namespace

AttentionProbe attention_probe(const Tensor& q, const Tensor& k, double softcap) {
    NL_REQUIRE(q.defined() && k.defined() && q.dim() == 4 && k.dim() == 4 && k.size(3) == q.size(3) &&
                   k.size(2) > 0 && q.size(2) % k.size(2) == 0 && k.size(1) >= q.size(1),
               "attention_probe: expected q (B, T, H, hd) and k (B, L, KV, hd), found q ",
               q.defined() ? shape_str(q.shape()) : "undefined", ", k ", k.defined() ? shape_str(k.shape()) : "undefined");
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), hd = q.size(3), L = k.size(1), KV = k.size(2);
    const Tensor qh = q.to(Device::cpu()).to(DType::F64).transpose(1, 2);                     // (B, H, T, hd)
    const Tensor kh = k.to(Device::cpu()).to(DType::F64).unsqueeze(3).expand({B, L, KV, H / KV, hd}).reshape({B, L, H, hd});
    const Tensor scores = matmul(qh, kh.transpose(1, 2).transpose(2, 3)).contiguous();    // (B, H, T, L)
    const double* s = scores.data<double>();
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    const int64_t rows = B * H * T;
    // Each row's largest |score|, entropy and weight on key 0, then summed in row order, so the probe
    // is the same bits on any number of threads.
    std::vector<double> row_max(static_cast<size_t>(rows)), row_entropy(static_cast<size_t>(rows)),
        row_sink(static_cast<size_t>(rows));  // (rows,) each
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t position = L - T + r % T;  // the query's position; it sees keys 0..position
        const double* row = s + r * L;
        std::vector<double> z(static_cast<size_t>(position + 1));  // (position + 1,) the row's logits
        double top = -std::numeric_limits<double>::infinity(), largest = 0.0;
        for (int64_t j = 0; j <= position; ++j) {
            const double score = row[j] * scale;
            largest = std::max(largest, std::abs(score));
            z[j] = softcap > 0.0 ? softcap * std::tanh(score / softcap) : score;
            top = std::max(top, z[j]);
        }
        // H(p) = log Z - sum_j p_j (z_j - top), with Z = sum_j exp(z_j - top).
        double partition = 0.0, weighted = 0.0;
        for (int64_t j = 0; j <= position; ++j) {
            const double e = std::exp(z[j] - top);
            partition += e;
            weighted += e * (z[j] - top);
        }
        row_max[r] = largest;
        row_entropy[r] = std::log(partition) - weighted / partition;
        row_sink[r] = std::exp(z[0] - top) / partition;
    }
    double max_score = 0.0, entropy = 0.0, sink = 0.0;
    int64_t sink_rows = 0;
    std::vector<double> head_entropy(static_cast<size_t>(H)), head_sink(static_cast<size_t>(H));  // (H,) sums
    std::vector<int64_t> head_sink_rows(static_cast<size_t>(H));                                  // (H,)
    for (int64_t r = 0; r < rows; ++r) {
        const size_t head = static_cast<size_t>(r / T % H);  // rows are (B, H, T)
        max_score = std::max(max_score, row_max[r]);
        entropy += row_entropy[r];
        head_entropy[head] += row_entropy[r];
        if (L - T + r % T >= 1) {  // position 0 sees only itself
            sink += row_sink[r];
            ++sink_rows;
            head_sink[head] += row_sink[r];
            ++head_sink_rows[head];
        }
    }
    const double nan = std::numeric_limits<double>::quiet_NaN();
    AttentionProbe probe;
    probe.max_score = max_score;
    probe.entropy = entropy / static_cast<double>(rows);
    probe.sink = sink_rows > 0 ? sink / static_cast<double>(sink_rows) : nan;
    for (size_t h = 0; h < static_cast<size_t>(H); ++h) {
        probe.entropy_by_head.push_back(head_entropy[h] / static_cast<double>(B * T));
        probe.sink_by_head.push_back(head_sink_rows[h] > 0 ? head_sink[h] / static_cast<double>(head_sink_rows[h]) : nan);
    }
    return probe;
}

Attention::Attention(const AttentionOptions& options) : options_(options) {
    NL_REQUIRE(options.dim > 0, "Attention: dim must be > 0, found ", options.dim);
    NL_REQUIRE(options.head_dim >= 0, "Attention: head_dim must be >= 0 (0: dim / n_heads), found ", options.head_dim);
    NL_REQUIRE(options.n_heads > 0 && (options.head_dim > 0 || options.dim % options.n_heads == 0),
               "Attention: n_heads (", options.n_heads, ") must be > 0 and divide dim (", options.dim,
               ") unless head_dim is set");
    if (options_.n_kv_heads == 0) options_.n_kv_heads = options.n_heads;
    NL_REQUIRE(options_.n_kv_heads > 0 && options.n_heads % options_.n_kv_heads == 0, "Attention: n_kv_heads (",
               options_.n_kv_heads, ") must be > 0 and divide n_heads (", options.n_heads, ")");
    head_dim_ = options.head_dim > 0 ? options.head_dim : options.dim / options.n_heads;
    options_.head_dim = head_dim_;
    NL_REQUIRE(head_dim_ % 2 == 0, "Attention: head_dim = ", head_dim_, " must be even for RoPE");
    NL_REQUIRE(options.max_seq_len >= 0, "Attention: max_seq_len must be >= 0 (0: no bound), found ",
               options.max_seq_len);
    options_.generator = nullptr;  // only used while constructing
    auto linear = [&](int64_t in, int64_t out) {
        return bias_free_linear(in, out, options.dtype, options.generator);
    };
    wq_ = register_module("wq", linear(options.dim, options.n_heads * head_dim_));
    wk_ = register_module("wk", linear(options.dim, options_.n_kv_heads * head_dim_));
    wv_ = register_module("wv", linear(options.dim, options_.n_kv_heads * head_dim_));
    wo_ = register_module("wo", linear(options.n_heads * head_dim_, options.dim));
    check_qk_norm(options.qk_norm, options.qk_norm_options.type, "Attention");
    NL_REQUIRE(std::isfinite(options.softcap) && options.softcap >= 0.0,
               "Attention: softcap must be finite and >= 0 (0 is off), found ", options.softcap);
    if (options.qk_norm != "none") {
        // Qwen3 and Gemma 3 normalize each head's vector; OLMo 2 the whole projection.
        const bool per_head = options.qk_norm == "head";
        NormOptions q_norm = options.qk_norm_options, k_norm = options.qk_norm_options;
        q_norm.dim = per_head ? head_dim_ : options.n_heads * head_dim_;
        k_norm.dim = per_head ? head_dim_ : options_.n_kv_heads * head_dim_;
        q_norm.dtype = k_norm.dtype = options.dtype;
        register_module("q_norm", make_norm(q_norm));
        register_module("k_norm", make_norm(k_norm));
    }
}

std::string Attention::extra_repr() const {
    return detail::concat("dim=", options_.dim, ", n_heads=", options_.n_heads, ", n_kv_heads=", options_.n_kv_heads,
                          ", head_dim=", head_dim_, ", rope_theta=", options_.rope_theta,
                          options_.qk_norm == "none" ? "" : ", qk_norm=" + options_.qk_norm,
                          options_.softcap > 0.0 ? detail::concat(", softcap=", options_.softcap) : "");
}

RopeTables Attention::rope(int64_t seq_len, DType dtype) {
    const DType table_dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
    if (!rope_cache_.cos.defined() || rope_cache_.cos.dtype() != table_dtype || rope_cache_.cos.size(0) < seq_len)
        rope_cache_ = rope_tables(head_dim_, seq_len, options_.rope_theta, table_dtype);
    return {rope_cache_.cos.narrow(0, 0, seq_len), rope_cache_.sin.narrow(0, 0, seq_len)};
}

Var Attention::forward(const Var& x) { return attend(x, nullptr); }

Var Attention::forward_cached(const Var& x, const KVSlot& slot) {
    NL_REQUIRE(!is_grad_enabled(), "Attention: the KV cache is for inference; run it under NoGradGuard");
    return attend(x, &slot);
}

Var Attention::attend(const Var& x, const KVSlot* slot) {
    NL_REQUIRE(x.defined() && x.dim() == 3 && x.size(2) == options_.dim, "Attention: expected x of shape (B, T, ",
               options_.dim, "), found ", x.defined() ? shape_str(x.shape()) : "undefined");
    const int64_t B = x.size(0), T = x.size(1);
    const int64_t H = options_.n_heads, KV = options_.n_kv_heads, hd = head_dim_;
    // x holds positions start..start+T-1; the keys cover positions 0..L-1 (the cached ones first).
    const int64_t start = slot ? slot->start : 0;
    const int64_t L = start + T;
    NL_REQUIRE(options_.max_seq_len == 0 || L <= options_.max_seq_len, "Attention: sequence length ", L,
               " exceeds max_seq_len ", options_.max_seq_len);
    if (slot) {
        const Shape want = {B, slot->keys.defined() ? slot->keys.size(1) : 0, KV, hd};
        NL_REQUIRE(slot->keys.defined() && slot->keys.shape() == want && slot->values.shape() == want,
                   "Attention: KV cache buffers must be (", B, ", capacity, ", KV, ", ", hd, "), found ",
                   slot->keys.defined() ? shape_str(slot->keys.shape()) : "undefined");
        NL_REQUIRE(L <= want[1], "Attention: KV cache full: positions ", start, "..", L - 1,
                   " do not fit its capacity ", want[1]);
    }
    const RopeTables all = rope(L, x.dtype());
    const RopeTables tables = {all.cos.narrow(0, start, T), all.sin.narrow(0, start, T)};  // positions start..L-1
    const Tensor x_low = autocast_lower_data(x);  // one bf16 copy of x under autocast (else undefined)
    Var q = wq_->forward_cast(x, x_low);  // (B, T, H * hd)
    Var k = wk_->forward_cast(x, x_low);  // (B, T, KV * hd)
    if (options_.qk_norm == "full") {
        q = qk_normalized("q_norm", q);
        k = qk_normalized("k_norm", k);
    }
    q = reshape(q, {B, T, H, hd});
    k = reshape(k, {B, T, KV, hd});
    if (options_.qk_norm == "head") {
        q = qk_normalized("q_norm", q);
        k = qk_normalized("k_norm", k);
    }
    q = apply_rope(q, tables);                                     // (B, T, H, hd)
    k = apply_rope(k, tables);                                     // (B, T, KV, hd)
    Var v = reshape(wv_->forward_cast(x, x_low), {B, T, KV, hd});  // (B, T, KV, hd)
    if (slot) {
        // Append, then read back every position so far: (B, L, KV, hd) views of the buffers.
        slot->keys.narrow(1, start, T).copy_(k.data());
        slot->values.narrow(1, start, T).copy_(v.data());
        k = Var(slot->keys.narrow(1, 0, L));
        v = Var(slot->values.narrow(1, 0, L));
    }
    if (probing_) last_probe_ = attention_probe(q.data(), k.data(), options_.softcap);
    const Var out = causal_attention(q, k, v, options_.fused, options_.softcap);  // (B, T, H, hd)
    return wo_->forward(reshape(out, {B, T, H * hd}));
}

Var Attention::qk_normalized(const char* name, const Var& x) {
    // Under autocast the projection is bf16 while the norm's parameters are the model's dtype: the
    // norm reads it widened and its output goes back to the projection's dtype for the products.
    // The weights' dtype, not options_.dtype: a model moved with to(dtype) keeps its options.
    auto norm = std::dynamic_pointer_cast<UnaryModule>(child(name));
    const DType norm_dtype = wq_->weight().dtype();
    if (x.dtype() == norm_dtype) return norm->forward(x);
    return nl::to(norm->forward(nl::to(x, norm_dtype)), x.dtype());
}

// ---------------------------------------------------------------- causal attention

namespace {

Var composed_causal_attention(const Var& q, Var k, Var v, double softcap);

// One node over the fused kernel pair. Saved: q, k, v (as Vars, for the composed twin under
// create_graph), out, lse (the probabilities are recomputed).
Var fused_causal_attention(const Var& q, const Var& k, const Var& v, double softcap) {
    AttentionForward f = attention_forward(q.data(), k.data(), v.data(), softcap);
    std::vector<SavedTensor> saved;
    saved.emplace_back("q", q);
    saved.emplace_back("k", k);
    saved.emplace_back("v", v);
    saved.emplace_back("out", f.out);
    saved.emplace_back("lse", f.lse);
    return make_fused_result(f.out, "attention", {q, k, v}, std::move(saved), {0, 1, 2},
                       [softcap](const Var& dout, const std::vector<Var>& s) -> std::vector<Var> {
                           AttentionBackward g = attention_backward(dout.data(), s[0].data(), s[1].data(),
                                                                    s[2].data(), s[3].data(), s[4].data(), softcap);
                           return {Var(g.dq), Var(g.dk), Var(g.dv)};
                       },
                       [softcap](const std::vector<Var>& in) {
                           return composed_causal_attention(in[0], in[1], in[2], softcap);
                       });
}

// LLaMA's attention in autograd ops (meta-llama/llama model.py, Attention.forward).
Var composed_causal_attention(const Var& q, Var k, Var v, double softcap) {
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), hd = q.size(3);
    const int64_t L = k.size(1), KV = k.size(2), start = L - T;
    if (KV != H) {
        // repeat_kv: query head h reads kv head h / (H / KV).
        const int64_t rep = H / KV;
        k = reshape(expand(unsqueeze(k, 3), {B, L, KV, rep, hd}), {B, L, H, hd});
        v = reshape(expand(unsqueeze(v, 3), {B, L, KV, rep, hd}), {B, L, H, hd});
    }
    const Var qh = transpose(q, 1, 2);  // (B, H, T, hd)
    const Var kh = transpose(k, 1, 2);  // (B, H, L, hd)
    const Var vh = transpose(v, 1, 2);  // (B, H, L, hd)
    // Under autocast the two products take bf16 inputs (q, k, v already are: wq/wk/wv made them).
    Var scores = autocast_matmul(qh, transpose(kh, 2, 3)) / std::sqrt(static_cast<double>(hd));  // (B, H, T, L)
    // Gemma 2's soft-capping, before the mask: cap * tanh(scores / cap), in f32 at least (as the softmax).
    if (softcap > 0.0) {
        scores = nl::to(scores, scores.dtype() == DType::F64 ? DType::F64 : DType::F32);
        scores = tanh(scores / softcap) * softcap;
    }
    // Causal mask: key position j > query position start + i is -inf (LLaMA adds a -inf upper
    // triangle; with a cache, LLaMA's mask is hstack([zeros(T, start), triu(-inf)]), the same rule).
    std::vector<double> future(static_cast<size_t>(T * L), 0.0);  // (T, L)
    for (int64_t i = 0; i < T; ++i)
        for (int64_t j = start + i + 1; j < L; ++j) future[i * L + j] = 1.0;
    scores = masked_fill(scores, from_vector(future, {T, L}, scores.dtype()).to(q.device()),
                         -std::numeric_limits<double>::infinity());
    // Softmax in f32 at least (LLaMA: F.softmax(scores.float(), dim=-1).type_as(xq)); xq is q,
    // whose dtype is x's, or the autocast dtype under autocast.
    const DType compute = scores.dtype() == DType::F64 ? DType::F64 : DType::F32;
    const Var probs = nl::to(softmax(nl::to(scores, compute), 3), q.dtype());  // (B, H, T, L)
    return transpose(autocast_matmul(probs, vh), 1, 2);                        // (B, T, H, hd)
}

}  // namespace

Var causal_attention(const Var& q, const Var& k, const Var& v, bool fused, double softcap) {
    NL_REQUIRE(q.defined() && k.defined() && v.defined(), "causal_attention: q, k and v must be defined");
    NL_REQUIRE(q.dim() == 4 && k.dim() == 4 && v.shape() == k.shape() && k.size(0) == q.size(0) &&
                   k.size(3) == q.size(3) && k.size(2) > 0 && q.size(2) % k.size(2) == 0 && k.size(1) >= q.size(1),
               "causal_attention: expected q (B, T, H, hd) and k, v (B, L, KV, hd) with L >= T and KV dividing H, "
               "found q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
    NL_REQUIRE(std::isfinite(softcap) && softcap >= 0.0, "causal_attention: softcap must be finite and >= 0 (0: off), "
               "found ", softcap);
    return fused ? fused_causal_attention(q, k, v, softcap) : composed_causal_attention(q, k, v, softcap);
}

// ---------------------------------------------------------------- blocks

const std::vector<NormPlacement>& norm_placements() {
    static const std::vector<NormPlacement> placements = {
        {.name = "pre",
         .formula = "h = x + f(N(x)); a final norm",
         .reference = "LLaMA (Touvron et al. 2023); Xiong et al. 2020",
         .input_norms = true,
         .hf_export = true,
         .gguf_export = true},
        {.name = "post",
         .formula = "h = N(x + f(x))",
         .reference = "the original Transformer (Vaswani et al. 2017)",
         .sum_norms = true},
        {.name = "peri",
         .formula = "h = x + N_out(f(N_in(x))); a final norm",
         .reference = "Peri-LN (Kim et al. 2025); Gemma 2 and 3's sandwich norms",
         .input_norms = true,
         .output_norms = true},
        {.name = "output",
         .formula = "h = x + N_out(f(x)); a final norm",
         .reference = "OLMo 2's reordered norm (OLMo et al. 2024)",
         .output_norms = true,
         .hf_export = true},
        {.name = "mix",
         .formula = "post in the first ceil(mix_fraction * n_layers) blocks, pre after; a final norm",
         .reference = "Mix-LN (Li et al. 2024)",
         .mixed = true},
        {.name = "deepnorm",
         .formula = "h = N(alpha * x + f(x)), alpha = (2 n_layers)^(1/4); value, output and feed-forward weights "
                    "initialized times beta = (8 n_layers)^(-1/4)",
         .reference = "DeepNet (Wang et al. 2022), decoder-only",
         .sum_norms = true,
         .scaled_residual = true},
        {.name = "none", .formula = "h = x + f(x); no norm anywhere", .reference = "the control", .final_norm = false},
    };
    return placements;
}

std::vector<std::string> norm_placement_names() {
    std::vector<std::string> names;
    for (const NormPlacement& p : norm_placements()) names.push_back(p.name);
    return names;
}

std::string depth_scalable_placements() {
    std::vector<std::string> names;
    for (const NormPlacement& p : norm_placements())
        if (p.input_norms || p.mixed) names.push_back(p.name);
    std::string out;
    for (size_t i = 0; i < names.size(); ++i)
        out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    return out;
}

const NormPlacement& norm_placement(const std::string& name) {
    for (const NormPlacement& p : norm_placements())
        if (p.name == name) return p;
    throw Error("norm_placement must be one of " + joined(norm_placement_names()) + ", found \"" + name + "\"");
}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& options) : options_(options) {
    NL_REQUIRE(contains(norm_placement_names(), options.norm_placement) && !norm_placement(options.norm_placement).mixed,
               "TransformerBlock: norm_placement must be one of pre, post, peri, output, deepnorm, none (mix is "
               "the model's), found \"", options.norm_placement, "\"");
    NL_REQUIRE(std::isfinite(options.pre_norm_scale) && options.pre_norm_scale > 0.0,
               "TransformerBlock: pre_norm_scale must be finite and > 0, found ", options.pre_norm_scale);
    NL_REQUIRE(std::isfinite(options.deepnorm_alpha) && options.deepnorm_alpha > 0.0 &&
                   std::isfinite(options.deepnorm_beta) && options.deepnorm_beta > 0.0,
               "TransformerBlock: deepnorm_alpha and deepnorm_beta must be finite and > 0, found ",
               options.deepnorm_alpha, " and ", options.deepnorm_beta);
    options_.generator = nullptr;  // only used while constructing
    if (options_.n_kv_heads == 0) options_.n_kv_heads = options.n_heads;
    if (options_.ffn_hidden_dim == 0) options_.ffn_hidden_dim = 4 * options.dim;
    options_.norm.dim = options.dim;
    options_.norm.dtype = options.dtype;

    AttentionOptions ao;
    ao.dim = options.dim;
    ao.n_heads = options.n_heads;
    ao.n_kv_heads = options_.n_kv_heads;
    ao.head_dim = options.head_dim;
    ao.rope_theta = options.rope_theta;
    ao.max_seq_len = options.max_seq_len;
    ao.fused = options.fused_attention;
    ao.qk_norm = options.qk_norm;
    ao.qk_norm_options = options_.norm;
    ao.softcap = options.attn_softcap;
    ao.dtype = options.dtype;
    ao.generator = options.generator;
    FeedForwardOptions fo;
    fo.dim = options.dim;
    fo.hidden_dim = options_.ffn_hidden_dim;
    fo.multiple_of = options.multiple_of;
    fo.fused = options.fused_swiglu;
    fo.dtype = options.dtype;
    fo.generator = options.generator;
    // LLaMA's order (named_parameters and init): attention, feed_forward, attention_norm, ffn_norm.
    auto attention = register_module("attention", std::make_shared<Attention>(ao));
    auto feed_forward = register_module("feed_forward", std::make_shared<FeedForward>(fo));
    const NormPlacement& placement = norm_placement(options_.norm_placement);
    if (placement.input_norms || placement.sum_norms) {
        NormOptions attention_input = options_.norm;
        if (placement.input_norms && options_.alpha_init_attention)
            attention_input.alpha_init = *options_.alpha_init_attention;
        register_module("attention_norm", make_norm(attention_input));
        register_module("ffn_norm", make_norm(options_.norm));
    }
    if (placement.output_norms) {
        register_module("attention_out_norm", make_norm(options_.norm));
        register_module("ffn_out_norm", make_norm(options_.norm));
    }
    if (options_.deepnorm_beta != 1.0) {
        // DeepNet's init (torchscale): the value, output and feed-forward projections' initial
        // weights times beta; queries and keys keep theirs.
        for (const auto& linear : {attention->child("wv"), attention->child("wo"), feed_forward->child("w1"),
                                   feed_forward->child("w2"), feed_forward->child("w3")}) {
            Tensor w = linear->parameter("weight").data();
            w.copy_(mul(w, options_.deepnorm_beta));
        }
    }
}

std::string TransformerBlock::extra_repr() const {
    std::string out = options_.norm_placement;
    if (options_.pre_norm_scale != 1.0) out += detail::concat(", pre_norm_scale=", options_.pre_norm_scale);
    if (options_.deepnorm_alpha != 1.0) out += detail::concat(", deepnorm_alpha=", options_.deepnorm_alpha);
    return out;
}

namespace {
template <typename M>
std::shared_ptr<M> typed_child(const Module& m, const std::string& name) {
    std::shared_ptr<Module> child = m.child(name);
    std::shared_ptr<M> typed = std::dynamic_pointer_cast<M>(child);
    NL_REQUIRE(typed != nullptr, m.type_name(), ": child '", name, "' is a ", child->type_name(),
               ", which is not the expected kind of module");
    return typed;
}
}  // namespace

std::shared_ptr<Attention> TransformerBlock::attention() const { return typed_child<Attention>(*this, "attention"); }
std::shared_ptr<FeedForward> TransformerBlock::feed_forward() const {
    return typed_child<FeedForward>(*this, "feed_forward");
}
std::shared_ptr<UnaryModule> TransformerBlock::attention_norm() const {
    return typed_child<UnaryModule>(*this, "attention_norm");
}
std::shared_ptr<UnaryModule> TransformerBlock::ffn_norm() const { return typed_child<UnaryModule>(*this, "ffn_norm"); }

namespace {
// x + branch. Under autocast the branch ends in a bf16 Linear while the residual stream keeps the
// model's dtype: the sum is taken in x's dtype, as torch's type promotion does for f32 + bf16, so
// the stream (and every norm's input) stays f32 and only the matmuls' activations are bf16. An f32
// stream reads a half branch as it is (add_widened: the bits of widening it first, in one pass); the
// branch's gradient is the stream's, rounded to the branch's dtype, as a cast node's backward gives.
Var residual_add(const Var& x, const Var& branch) {
    if (branch.dtype() == x.dtype()) return x + branch;
    if (x.dtype() != DType::F32 || !is_half(branch.dtype()) || x.shape() != branch.shape())
        return x + nl::to(branch, x.dtype());
    return make_result(add_widened(x.data(), branch.data()), "add", {x, branch}, {},
                       [half = branch.dtype()](const Var& g, const std::vector<Var>&) -> std::vector<Var> {
                           return {g, nl::to(g, half)};
                       });
}
}  // namespace

ResidualProbe residual_probe(const Tensor& h) {
    NL_REQUIRE(h.defined() && h.dim() >= 1 && h.numel() > 0, "residual_probe: expected a non-empty (..., dim) tensor, found ",
               h.defined() ? shape_str(h.shape()) : "undefined");
    const int64_t dim = h.size(-1);
    const Tensor x = h.to(Device::cpu()).to(DType::F64).reshape({h.numel() / dim, dim});  // (rows, dim)
    const Tensor channel_ms = mean(square(x), {0});                                       // (dim,) s_j^2
    double ms = 0.0, ms_squared = 0.0;  // sums of s_j^2 and s_j^4
    for (const double v : channel_ms.to_vector()) {
        ms += v;
        ms_squared += v * v;
    }
    ms /= static_cast<double>(dim);
    ms_squared /= static_cast<double>(dim);
    ResidualProbe probe;
    probe.rms = std::sqrt(ms);
    probe.max_abs = max(abs(x)).item();
    probe.kurtosis = ms > 0.0 ? ms_squared / (ms * ms) : std::numeric_limits<double>::quiet_NaN();
    return probe;
}

Var TransformerBlock::forward(const Var& x) { return run(x, nullptr); }

Var TransformerBlock::forward_cached(const Var& x, const KVSlot& slot) { return run(x, &slot); }

void TransformerBlock::set_probing(bool on) {
    probing_ = on;
    attention()->set_probing(on);
}

Var TransformerBlock::input_norm(const char* name, const Var& x) {
    const Var y = typed_child<UnaryModule>(*this, name)->forward(x);
    return options_.pre_norm_scale == 1.0 ? y : y * options_.pre_norm_scale;
}

Var TransformerBlock::output_norm(const char* name, const Var& branch, DType stream_dtype) {
    const Var in = branch.dtype() == stream_dtype ? branch : nl::to(branch, stream_dtype);
    return typed_child<UnaryModule>(*this, name)->forward(in);
}

Var TransformerBlock::run(const Var& x, const KVSlot* slot) {
    auto attend = [&](const Var& in) {
        return slot ? attention()->forward_cached(in, *slot) : attention()->forward(in);
    };
    auto ffn = [&](const Var& in) { return feed_forward()->forward(in); };
    const NormPlacement& placement = norm_placement(options_.norm_placement);
    const DType stream = x.dtype();
    // One sublayer as the placement's row says: its input norm, its output norm, the residual's
    // scale, the norm after the sum.
    auto sublayer = [&](const Var& in, const char* norm, const char* out_norm, const auto& f) {
        Var branch = f(placement.input_norms ? input_norm(norm, in) : in);
        if (placement.output_norms) branch = output_norm(out_norm, branch, stream);
        const Var sum = residual_add(placement.scaled_residual ? in * options_.deepnorm_alpha : in, branch);
        return placement.sum_norms ? typed_child<UnaryModule>(*this, norm)->forward(sum) : sum;
    };
    const Var h = sublayer(x, "attention_norm", "attention_out_norm", attend);
    const Var out = sublayer(h, "ffn_norm", "ffn_out_norm", ffn);
    if (probing_) last_residual_probe_ = residual_probe(out.data());
    return out;
}

// ---------------------------------------------------------------- the language model

const std::vector<std::string>& init_choices() {
    static const std::vector<std::string> choices = {"pytorch", "normal", "xavier"};
    return choices;
}

// TransformerOptions::init other than "pytorch": every matrix drawn again from Generator(seed), in
// parameter order (the embedding, then each block's projections, then the output head). A name
// ending in attention.wo.weight or feed_forward.w2.weight writes into the residual stream.
static void reinitialize(Transformer& model, const TransformerOptions& options) {
    Generator gen(options.seed);
    NoGradGuard no_grad;
    const double residual_scale =
        options.init_scaled_residual ? 1.0 / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(options.n_layers, 1)))
                                     : 1.0;
    auto ends_with = [](const std::string& s, const std::string& tail) {
        return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (auto& [name, p] : model.named_parameters()) {
        if (p.dim() != 2) continue;  // norm gains, biases and alphas keep their registry init
        const bool embedding = name == "tok_embeddings.weight";
        const bool residual = ends_with(name, "attention.wo.weight") || ends_with(name, "feed_forward.w2.weight");
        const double scale = residual ? residual_scale : 1.0;
        Tensor drawn;
        if (options.init == "normal") {
            drawn = normal(p.shape(), 0.0, options.init_std * scale, gen, p.dtype());
        } else if (embedding) {
            drawn = normal(p.shape(), 0.0, 1.0, gen, p.dtype());  // xavier: PyTorch's Embedding init
        } else {
            const double fan_out = static_cast<double>(p.size(0)), fan_in = static_cast<double>(p.size(1));
            const double bound = std::sqrt(6.0 / (fan_in + fan_out)) * scale;
            drawn = uniform(p.shape(), -bound, bound, gen, p.dtype());
        }
        p.data().copy_(drawn);
    }
    // DeepNet's beta on the value, output and feed-forward projections, as the blocks apply it to PyTorch's init.
    if (!norm_placement(options.norm_placement).scaled_residual) return;
    const double beta = std::pow(8.0 * static_cast<double>(options.n_layers), -0.25);
    for (auto& [name, p] : model.named_parameters())
        for (const char* tail : {"attention.wv.weight", "attention.wo.weight", "feed_forward.w1.weight",
                                 "feed_forward.w2.weight", "feed_forward.w3.weight"})
            if (ends_with(name, tail)) p.data().copy_(mul(p.data(), beta));
}

void TransformerOptions::validate() const {
    NL_REQUIRE(vocab_size > 0, "TransformerOptions: vocab_size must be > 0, found ", vocab_size);
    NL_REQUIRE(dim > 0, "TransformerOptions: dim must be > 0, found ", dim);
    NL_REQUIRE(n_layers >= 0, "TransformerOptions: n_layers must be >= 0, found ", n_layers);
    NL_REQUIRE(head_dim >= 0, "TransformerOptions: head_dim must be >= 0 (0: dim / n_heads), found ", head_dim);
    NL_REQUIRE(n_heads > 0 && (head_dim > 0 || dim % n_heads == 0), "TransformerOptions: n_heads (", n_heads,
               ") must be > 0 and divide dim (", dim, ") unless head_dim is set");
    const int64_t kv = n_kv_heads == 0 ? n_heads : n_kv_heads;
    NL_REQUIRE(kv > 0 && n_heads % kv == 0, "TransformerOptions: n_kv_heads (", n_kv_heads,
               ") must be > 0 and divide n_heads (", n_heads, ")");
    NL_REQUIRE(head_size() % 2 == 0, "TransformerOptions: head dim ", head_dim > 0 ? "= head_dim = " : "= dim / n_heads = ",
               head_size(), " must be even for RoPE");
    NL_REQUIRE(multiple_of > 0, "TransformerOptions: multiple_of must be > 0, found ", multiple_of);
    NL_REQUIRE(ffn_hidden_dim >= 0, "TransformerOptions: ffn_hidden_dim must be >= 0, found ", ffn_hidden_dim);
    NL_REQUIRE(rope_theta > 0.0, "TransformerOptions: rope_theta must be > 0, found ", rope_theta);
    NL_REQUIRE(max_seq_len > 0, "TransformerOptions: max_seq_len must be > 0, found ", max_seq_len);
    NL_REQUIRE(is_floating(dtype), "TransformerOptions: dtype must be floating, found ", dtype_name(dtype));
    NL_REQUIRE(contains(norm_placement_names(), norm_placement), "TransformerOptions: norm_placement must be one of ",
               joined(norm_placement_names()), ", found \"", norm_placement, "\"");
    NL_REQUIRE(mix_fraction > 0.0 && mix_fraction <= 1.0, "TransformerOptions: mix_fraction must be in (0, 1], found ",
               mix_fraction);
    NL_REQUIRE(!nl::norm_placement(norm_placement).scaled_residual || n_layers > 0,
               "TransformerOptions: norm_placement \"", norm_placement, "\" needs n_layers > 0 (its alpha and beta are "
               "(2 n_layers)^(1/4) and (8 n_layers)^(-1/4)), found ", n_layers);
    NL_REQUIRE(norm_scaling == "none" || norm_scaling == "depth",
               "TransformerOptions: norm_scaling must be none or depth, found \"", norm_scaling, "\"");
    NL_REQUIRE(norm_scaling == "none" || nl::norm_placement(norm_placement).input_norms ||
                   nl::norm_placement(norm_placement).mixed,
               "TransformerOptions: norm_scaling \"depth\" scales pre-norms, which norm_placement \"", norm_placement,
               "\" does not have (", depth_scalable_placements(), " do)");
    check_qk_norm(qk_norm, norm.type, "TransformerOptions");
    NL_REQUIRE(contains(init_choices(), init), "TransformerOptions: init must be one of ", joined(init_choices()),
               ", found \"", init, "\"");
    NL_REQUIRE(!init_scaled_residual || init != "pytorch",
               "TransformerOptions: init_scaled_residual needs init normal or xavier, found \"pytorch\"");
    NL_REQUIRE(std::isfinite(init_std) && init_std > 0.0, "TransformerOptions: init_std must be finite and > 0, found ",
               init_std);
    NL_REQUIRE(!alpha_init_attention || std::isfinite(*alpha_init_attention),
               "TransformerOptions: alpha_init_attention must be finite, found ", alpha_init_attention.value_or(0.0));
    NL_REQUIRE(std::isfinite(logit_softcap) && logit_softcap >= 0.0,
               "TransformerOptions: logit_softcap must be finite and >= 0 (0 is off), found ", logit_softcap);
    NL_REQUIRE(std::isfinite(attn_softcap) && attn_softcap >= 0.0,
               "TransformerOptions: attn_softcap must be finite and >= 0 (0 is off), found ", attn_softcap);
}

std::string TransformerOptions::block_placement(int64_t layer) const {
    if (!nl::norm_placement(norm_placement).mixed) return norm_placement;
    const auto post_blocks = static_cast<int64_t>(std::ceil(mix_fraction * static_cast<double>(n_layers) - 1e-9));
    return layer < post_blocks ? "post" : "pre";
}

Transformer::Transformer(const TransformerOptions& options) : options_(options) {
    options.validate();
    if (options_.n_kv_heads == 0) options_.n_kv_heads = options.n_heads;
    options_.norm.dim = options.dim;
    options_.norm.dtype = options.dtype;
    Generator gen(options.seed);

    EmbeddingOptions eo;
    eo.num_embeddings = options.vocab_size;
    eo.embedding_dim = options.dim;
    eo.dtype = options.dtype;
    eo.generator = &gen;
    register_module("tok_embeddings", std::make_shared<Embedding>(eo));

    auto layers = register_module("layers", std::make_shared<ModuleList>());
    for (int64_t i = 0; i < options.n_layers; ++i) {
        TransformerBlockOptions bo;
        bo.dim = options.dim;
        bo.n_heads = options.n_heads;
        bo.n_kv_heads = options_.n_kv_heads;
        bo.head_dim = options.head_dim;
        bo.ffn_hidden_dim = options.ffn_hidden_dim;
        bo.multiple_of = options.multiple_of;
        bo.norm = options_.norm;
        bo.norm_placement = options.block_placement(i);
        if (options.norm_scaling == "depth") bo.pre_norm_scale = 1.0 / std::sqrt(static_cast<double>(i + 1));
        if (norm_placement(options.norm_placement).scaled_residual) {
            const auto n = static_cast<double>(options.n_layers);
            bo.deepnorm_alpha = std::pow(2.0 * n, 0.25);
            bo.deepnorm_beta = std::pow(8.0 * n, -0.25);
        }
        bo.qk_norm = options.qk_norm;
        bo.alpha_init_attention = options.alpha_init_attention;
        bo.attn_softcap = options.attn_softcap;
        bo.rope_theta = options.rope_theta;
        bo.max_seq_len = options.max_seq_len;
        bo.fused_attention = options.fused_attention;
        bo.fused_swiglu = options.fused_swiglu;
        bo.dtype = options.dtype;
        bo.generator = &gen;
        layers->push_back(std::make_shared<TransformerBlock>(bo));
    }
    if (norm_placement(options.norm_placement).final_norm) register_module("norm", make_norm(options_.norm));

    LinearOptions lo;
    lo.in_features = options.dim;
    lo.out_features = options.vocab_size;
    lo.bias = false;
    lo.dtype = options.dtype;
    lo.generator = &gen;
    register_module("output", std::make_shared<Linear>(lo));
    if (options.init != "pytorch") reinitialize(*this, options);
}

std::string Transformer::extra_repr() const {
    return detail::concat("vocab_size=", options_.vocab_size, ", dim=", options_.dim, ", n_layers=", options_.n_layers,
                          ", n_heads=", options_.n_heads, ", n_kv_heads=", options_.n_kv_heads,
                          options_.head_dim > 0 ? detail::concat(", head_dim=", options_.head_dim) : "", ", norm=",
                          options_.norm.type, ", norm_placement=", options_.norm_placement);
}

void Transformer::set_probing(bool on) {
    probing_ = on;
    for (int64_t i = 0; i < options_.n_layers; ++i) layer(i)->set_probing(on);
}

Transformer::Probes Transformer::last_probes() const {
    Probes probes;
    for (int64_t i = 0; i < options_.n_layers; ++i) {
        probes.attention.push_back(layer(i)->attention()->last_probe());
        probes.residual.push_back(layer(i)->last_residual_probe());
    }
    probes.logsumexp_mean = last_lse_mean_;
    probes.logsumexp_max = last_lse_max_;
    return probes;
}

std::shared_ptr<TransformerBlock> Transformer::layer(int64_t index) const {
    return typed_child<ModuleList>(*this, "layers")->at<TransformerBlock>(index);
}

Var Transformer::forward(const Tensor& ids) { return run(ids, nullptr); }

KVCache Transformer::make_cache(int64_t batch, int64_t capacity) const {
    NL_REQUIRE(batch > 0, "Transformer::make_cache: batch must be > 0, found ", batch);
    NL_REQUIRE(capacity > 0 && capacity <= options_.max_seq_len, "Transformer::make_cache: capacity must be in [1, ",
               options_.max_seq_len, "] (max_seq_len), found ", capacity);
    const Tensor weight = parameters().front().data();  // tok_embeddings.weight: the model's dtype and device
    const Shape shape = {batch, capacity, options_.n_kv_heads, options_.head_size()};  // (B, capacity, KV, hd)
    KVCache cache;
    cache.capacity = capacity;
    for (int64_t i = 0; i < options_.n_layers; ++i)
        cache.layers.push_back({zeros(shape, weight.dtype(), weight.device()),
                                zeros(shape, weight.dtype(), weight.device()), 0});
    return cache;
}

Var Transformer::forward_cached(const Tensor& ids, KVCache& cache) {
    NL_REQUIRE(!is_grad_enabled(), "Transformer: the KV cache is for inference; run it under NoGradGuard");
    NL_REQUIRE(static_cast<int64_t>(cache.layers.size()) == options_.n_layers, "Transformer: the KV cache has ",
               cache.layers.size(), " layers, the model ", options_.n_layers, " (make it with make_cache)");
    NL_REQUIRE(ids.defined() && ids.dim() == 2, "Transformer: expected ids of shape (B, T), found ",
               ids.defined() ? shape_str(ids.shape()) : "undefined");
    NL_REQUIRE(cache.length >= 0 && cache.length + ids.size(1) <= cache.capacity, "Transformer: KV cache full: ",
               cache.length, " positions filled + ", ids.size(1), " new exceed its capacity ", cache.capacity);
    Var logits = run(ids, &cache);
    cache.length += ids.size(1);
    return logits;
}

Var Transformer::embed(const Tensor& ids) {
    NL_REQUIRE(ids.defined() && ids.dim() == 2, "Transformer: expected ids of shape (B, T), found ",
               ids.defined() ? shape_str(ids.shape()) : "undefined");
    NL_REQUIRE(ids.dtype() == DType::I64, "Transformer: expected i64 ids, found ", dtype_name(ids.dtype()));
    NL_REQUIRE(ids.size(1) <= options_.max_seq_len, "Transformer: sequence length ", ids.size(1),
               " exceeds max_seq_len ", options_.max_seq_len);
    return typed_child<Embedding>(*this, "tok_embeddings")->forward(ids);  // (B, T, dim)
}

Var Transformer::logits(const Var& h) {
    Var out = has_child("norm") ? typed_child<UnaryModule>(*this, "norm")->forward(h) : h;
    out = typed_child<UnaryModule>(*this, "output")->forward(out);  // (B, T, vocab)
    if (options_.logit_softcap > 0.0) out = softcap(out, options_.logit_softcap);  // Gemma 2
    return out;
}

Var Transformer::run(const Tensor& ids, KVCache* cache) {
    Var h = embed(ids);  // (B, T, dim)
    const auto layers = typed_child<ModuleList>(*this, "layers");
    for (int64_t i = 0; i < layers->size(); ++i) {
        if (!cache) {
            h = layers->at<UnaryModule>(i)->forward(h);
            continue;
        }
        KVSlot& slot = cache->layers[static_cast<size_t>(i)];
        slot.start = cache->length;
        h = layers->at<TransformerBlock>(i)->forward_cached(h, slot);
    }
    Var logits = this->logits(h);  // (B, T, vocab)
    if (probing_) {
        // The output's log-partition per row (Wortsman et al. 2023's output-logit drift; the z-loss
        // pulls it to 0), in at least f32.
        const Tensor l = logits.data().to(compute_dtype(logits.dtype()));
        const Tensor row_max = max(l, {-1}, true);                                     // (B, T, 1)
        const Tensor lse = log(sum(exp(l - row_max), {-1}, true)) + row_max;           // (B, T, 1)
        last_lse_mean_ = mean(lse).item();
        last_lse_max_ = max(lse).item();
    }
    return logits;
}

int64_t count_parameters(const Module& module, bool include_embeddings) {
    int64_t total = 0;
    const std::string suffix = "embeddings.weight";
    for (const auto& [name, param] : module.named_parameters()) {
        const bool embedding = name.size() >= suffix.size() &&
                               name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
        if (embedding && !include_embeddings) continue;
        total += param.numel();
    }
    return total;
}

}  // namespace nl
