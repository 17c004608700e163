// Bindings of normlab's layers (layers/): nl::Module and every concrete module the layers build
// (Linear, Embedding, the activations and Dropout, every norm of the registry, the transformer's
// parts), the option structs of the transformer's parts, the norm registry's entries, and the
// functional forms (linear, the norms, the losses, swiglu, causal attention).
//
// The C++ modules are shared with Python (std::shared_ptr): python/normlab/nn/ wraps each one in a
// Python nn.Module whose parameters are the C++ module's own Vars, so nothing is copied and an
// optimizer, a state_dict or a user's in-place write sees the same memory the C++ forward reads.
// Every concrete class is bound, even with no methods of its own, because nanobind hands out a
// module at its most-derived *bound* type: a HybridNorm's children must come back as norms, not
// as plain Modules. Each forward releases the GIL while it computes.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/norm_registry.h"
#include "layers/norms.h"
#include "layers/transformer.h"

namespace nl::py {

namespace {

using Guard = nb::call_guard<nb::gil_scoped_release>;

Var var_or_undefined(const std::optional<Var>& v) { return v ? *v : Var(); }

// (name, Tensor) pairs as Python lists of tuples; a buffer (a plain Tensor) as a Var on its memory.
nb::list named_list(const NamedVars& vars) {
    nb::list out;
    for (const auto& [name, var] : vars) out.append(nb::make_tuple(name, var));
    return out;
}

nb::list named_list(const NamedTensors& tensors) {
    nb::list out;
    for (const auto& [name, tensor] : tensors) out.append(nb::make_tuple(name, Var(tensor)));
    return out;
}

// A state dict from Python: a mapping (name -> Tensor) or an iterable of (name, Tensor) pairs.
NamedTensors named_tensors_from(nb::handle entries) {
    nb::object items = nb::hasattr(entries, "items") ? entries.attr("items")() : nb::borrow(entries);
    NamedTensors out;
    for (nb::handle item : items) {
        NL_REQUIRE(PySequence_Check(item.ptr()) && nb::len(item) == 2,
                   "load_state_dict: expected (name, Tensor) pairs, found ", nb::str(nb::repr(item)).c_str());
        out.emplace_back(nb::cast<std::string>(item[0]), nb::cast<Var>(item[1]).data());
    }
    return out;
}

Reduction reduction_from(const std::string& name) {
    if (name == "mean") return Reduction::Mean;
    if (name == "sum") return Reduction::Sum;
    if (name == "none") return Reduction::None;
    throw Error("reduction: expected 'mean', 'sum' or 'none', found '" + name + "'");
}

// ---- nl::Module and the containers ----

void bind_module(nb::module_& m) {
    nb::class_<Module>(m, "Module",
                       "A C++ module (layers/module.h): parameters, buffers and children by name, in registration "
                       "order; normlab.nn.Module wraps one.")
        .def_prop_ro("type_name", &Module::type_name, "The class name its print shows: \"Linear\", \"RMSNorm\", ...")
        .def("extra_repr", &Module::extra_repr, "What its print shows inside the parentheses.")
        .def("__repr__", &Module::str, "The module tree, PyTorch-style.")
        .def("named_parameters",
             [](const Module& self, bool recurse) { return named_list(self.named_parameters(recurse)); },
             nb::arg("recurse") = true,
             "(dotted name, Tensor) pairs, own parameters first, then each child's: the live Vars, not copies.")
        .def("named_buffers", [](const Module& self, bool recurse) { return named_list(self.named_buffers(recurse)); },
             nb::arg("recurse") = true, "(dotted name, Tensor) pairs of the buffers, on their memory.")
        .def("named_children", &Module::named_children, "(name, Module) pairs of the direct children, in order.")
        .def("state_dict", [](const Module& self) { return named_list(self.state_dict()); },
             "(dotted name, Tensor) pairs of the parameters and buffers, on their memory (PyTorch's order).")
        .def("load_state_dict", [](Module& self, nb::handle entries, bool strict) {
                 NamedTensors values = named_tensors_from(entries);
                 nb::gil_scoped_release release;
                 self.load_state_dict(values, strict);
             },
             nb::arg("state_dict"), nb::arg("strict") = true,
             "Copies each value into the existing parameter or buffer; strict: missing and unexpected keys are "
             "an error naming them all; a shape or dtype mismatch always is. Nothing is copied on an error.")
        .def("train", &Module::train, nb::arg("mode") = true, "Sets training mode here and in every descendant.")
        .def_prop_ro("training", &Module::is_training)
        .def("zero_grad", &Module::zero_grad, "Clears every parameter's .grad (set to None).")
        .def("to", [](Module& self, nb::handle dtype) { self.to(dtype_from(dtype, DType::F32)); }, nb::arg("dtype"),
             "Converts the floating parameters and buffers, here and below, to dtype; the parameter Vars keep their "
             "identity (only their data changes).")
        .def("num_parameters", &Module::num_parameters, "Elements over all parameters.");
    nb::class_<UnaryModule, Module>(m, "UnaryModule", "A module of one input and one output.")
        .def("forward", &UnaryModule::forward, nb::arg("input"), Guard());
    nb::class_<Sequential, UnaryModule>(m, "Sequential", "Runs its children, named \"0\", \"1\", ..., in order.");
    nb::class_<ModuleList, Module>(m, "ModuleList",
                                   "Holds modules named \"0\", \"1\", ... (the transformer's layers).");
}

// ---- Linear, Embedding, activations ----

void bind_basic_layers(nb::module_& m) {
    nb::class_<Linear, UnaryModule>(m, "Linear", "nn.Linear: y = x W^T + b, PyTorch's names, shapes and init.")
        .def("__init__", [](Linear* self, int64_t in_features, int64_t out_features, bool bias, nb::handle dtype,
                            Generator* generator) {
                 LinearOptions o;
                 o.in_features = in_features;
                 o.out_features = out_features;
                 o.bias = bias;
                 o.dtype = dtype_from(dtype, DType::F32);
                 o.generator = generator;
                 new (self) Linear(o);
             },
             nb::arg("in_features"), nb::arg("out_features"), nb::arg("bias") = true,
             nb::arg("dtype").none() = nb::none(), nb::arg("generator").none() = nb::none(),
             "weight (out, in) and bias (out) ~ U(-1/sqrt(in), 1/sqrt(in)), drawn from generator (None: the "
             "default generator, normlab.manual_seed).")
        .def_prop_ro("in_features", [](const Linear& l) { return l.options().in_features; })
        .def_prop_ro("out_features", [](const Linear& l) { return l.options().out_features; })
        .def_prop_ro("has_bias", [](const Linear& l) { return l.options().bias; })
        .def("reset_parameters", [](Linear& l, Generator* g) { l.reset_parameters(g ? *g : module_init_generator()); },
             nb::arg("generator").none() = nb::none(), "Redraws weight and bias in place.");
    nb::class_<Embedding, Module>(m, "Embedding", "nn.Embedding: a (num_embeddings, embedding_dim) lookup table.")
        .def("__init__", [](Embedding* self, int64_t num_embeddings, int64_t embedding_dim, nb::handle dtype,
                            Generator* generator) {
                 EmbeddingOptions o;
                 o.num_embeddings = num_embeddings;
                 o.embedding_dim = embedding_dim;
                 o.dtype = dtype_from(dtype, DType::F32);
                 o.generator = generator;
                 new (self) Embedding(o);
             },
             nb::arg("num_embeddings"), nb::arg("embedding_dim"), nb::arg("dtype").none() = nb::none(),
             nb::arg("generator").none() = nb::none(), "weight ~ N(0, 1), drawn from generator (None: the default).")
        .def_prop_ro("num_embeddings", [](const Embedding& e) { return e.options().num_embeddings; })
        .def_prop_ro("embedding_dim", [](const Embedding& e) { return e.options().embedding_dim; })
        .def("forward", [](Embedding& e, const Var& ids) { return e.forward(ids.data()); }, nb::arg("ids"), Guard(),
             "int64 ids of any shape, each in [0, num_embeddings) -> ids.shape + (embedding_dim,).");
    nb::class_<ReLU, UnaryModule>(m, "ReLU").def(nb::init<>());
    nb::class_<SiLU, UnaryModule>(m, "SiLU").def(nb::init<>());
    nb::class_<GELU, UnaryModule>(m, "GELU", "The exact (erf) GELU.").def(nb::init<>());
    nb::class_<Dropout, UnaryModule>(m, "Dropout",
                                     "Inverted dropout with its own seeded generator (reproducible masks); identity "
                                     "outside training.")
        .def(nb::init<double, uint64_t>(), nb::arg("p") = 0.5, nb::arg("seed") = 0)
        .def_prop_ro("p", &Dropout::p);
}

// ---- the norms and their registry ----

void bind_norm_options(nb::module_& m) {
    nb::class_<NormOptions>(m, "NormOptions", "A norm's options (layers/norms.h NormOptions).")
        .def(nb::init<>())
        .def_rw("type", &NormOptions::type, "A registry name: \"layernorm\", \"rmsnorm\", ...")
        .def_rw("dim", &NormOptions::dim, "The features normalized over (the last dim).")
        .def_prop_rw("eps", [](const NormOptions& o) { return o.eps; },
                     [](NormOptions& o, nb::handle eps) {
                         o.eps = eps.is_none() ? std::nullopt : std::optional<double>(nb::cast<double>(eps));
                     },
                     nb::arg("eps").none(), "None: the registry entry's default (1e-5).")
        .def_rw("fused", &NormOptions::fused, "The fused kernel form (else composed from autograd ops).")
        .def_rw("elementwise_affine", &NormOptions::elementwise_affine, "Learnable weight (and bias where it has one).")
        .def_rw("bias", &NormOptions::bias, "layernorm and hybridnorm: a bias (nn.LayerNorm's bias=True).")
        .def_rw("p", &NormOptions::p, "prmsnorm: the fraction of each row its RMS is computed over.")
        .def_rw("alpha", &NormOptions::alpha, "hybridnorm: the fixed weight of the RMSNorm branch.")
        .def_rw("alpha_init", &NormOptions::alpha_init, "dyt: the initial value of its learnable scalar alpha.")
        .def_rw("dtype", &NormOptions::dtype)
        .def("resolved_eps", &NormOptions::resolved_eps, "eps, or the type's default.");
}

void bind_norm_registry(nb::module_& m) {
    nb::enum_<NormStatistic>(m, "NormStatistic", "What a norm divides x by (layers/norm_registry.h NormStatistic).")
        .value("variance", NormStatistic::Variance, "mean-subtracting, (x - mean) / sqrt(var + eps) (LayerNorm)")
        .value("root_mean_square", NormStatistic::RootMeanSquare, "x / sqrt(mean(x^2) + eps) (RMSNorm)")
        .value("both", NormStatistic::Both, "a variance branch and an RMS branch, blended (HybridNorm)")
        .value("l2_norm", NormStatistic::L2Norm, "x / max(||x||_2, eps) (ScaleNorm)")
        .value("elementwise", NormStatistic::Elementwise, "none: each element on its own, tanh(alpha * x) (DyT)");
    nb::class_<NormType>(m, "NormType",
                         "A norm registry entry (layers/norm_registry.h): what the norm computes, its parameters, "
                         "its forms, how its gradients are checked, its help.")
        .def_ro("name", &NormType::name, "The config / CLI name: \"rmsnorm\".")
        .def_ro("class_name", &NormType::class_name, "The PyTorch-style class name: \"RMSNorm\".")
        .def_ro("default_eps", &NormType::default_eps)
        .def_ro("partial_row", &NormType::partial_row, "The statistic covers ceil(p * d) elements (reads p).")
        .def_prop_ro("option_names", &norm_option_names,
                     "The NormOptions fields it reads beyond eps (its classes' arguments), from its typed fields: "
                     "elementwise_affine, bias, p, alpha, alpha_init.")
        .def_ro("statistic", &NormType::statistic, "What it divides x by: a NormStatistic.")
        .def_prop_ro("statistic_name", [](const NormType& t) { return std::string(norm_statistic_name(t.statistic)); },
                     "The statistic for help texts: \"variance\", \"RMS\", \"variance and RMS\", \"L2 norm\" or "
                     "\"none (elementwise)\".")
        .def_prop_ro("fused_form", [](const NormType& t) { return std::string(fused_form_name(t.fused)); },
                     "What fused=True runs: one_kernel_node, kernel_and_ops or composed (no kernel of its own).")
        .def_prop_ro("parameters", [](const NormType& t) {
                         nb::list out;
                         for (const NormParameter& p : t.parameters) {
                             nb::dict d;
                             d["name"] = p.state_name();
                             d["child"] = p.child;
                             d["shape"] = p.shape == ParameterShape::Features ? "features" : "one";
                             d["init"] = parameter_init_name(p.init);
                             d["presence"] = parameter_presence_name(p.presence);
                             out.append(d);
                         }
                         return out;
                     },
                     "Its parameters in state-dict order: dicts of name, child, shape (features or one), init "
                     "(ones, zeros, sqrt_dim, alpha_init), presence (always, affine, affine_and_bias).")
        .def_prop_ro("formula", [](const NormType& t) { return t.help.formula; })
        .def_prop_ro("reference", [](const NormType& t) { return t.help.reference; })
        .def_prop_ro("fused_help", [](const NormType& t) { return t.help.fused_form; })
        .def_prop_ro("gradcheck_options", [](const NormType& t) { return t.gradcheck.options; },
                     "The options its f64 gradient check uses (p and alpha away from their defaults).")
        .def_prop_ro("gradcheck_atol", [](const NormType& t) { return t.gradcheck.atol; })
        .def_prop_ro("gradcheck_rtol", [](const NormType& t) { return t.gradcheck.rtol; })
        .def("forward",
             [](const NormType& t, const Var& x, const std::vector<std::optional<Var>>& params,
                const NormOptions& options, bool fused) {
                 std::vector<Var> vars;
                 for (const auto& p : params) vars.push_back(var_or_undefined(p));
                 nb::gil_scoped_release release;
                 return t.forward(x, vars, options, fused);
             },
             nb::arg("x"), nb::arg("parameters"), nb::arg("options"), nb::arg("fused") = true,
             "The norm as a function: x and its parameters in the entry's order (None for an absent one), "
             "with the options' eps, p and alpha.")
        .def("__repr__", [](const NormType& t) { return "<norm " + t.name + ": " + t.class_name + ">"; });
    m.def("norm_registry", [] {
              nb::list out;
              for (const NormType& t : norm_registry()) out.append(nb::cast(&t, nb::rv_policy::reference));
              return out;
          },
          "Every registry entry, in the registry's order.");
    m.def("find_norm_type", [](const std::string& name) { return &find_norm_type(name); }, nb::arg("name"),
          nb::rv_policy::reference, "The entry named `name`; normlab.Error naming the choices otherwise.");
    m.def("norm_types", &norm_types, "The registry's names, in order.");
}

void bind_norms(nb::module_& m) {
    nb::class_<Norm, UnaryModule>(m, "Norm", "Every norm: over the last dim, fused or composed (layers/norms.h).")
        .def_prop_ro("options", [](const Norm& n) { return n.options(); }, "A copy of its NormOptions.")
        .def_prop_ro("norm_type", [](const Norm& n) { return &n.norm_type(); }, nb::rv_policy::reference,
                     "Its registry entry.")
        .def_prop_ro("dim", &Norm::dim)
        .def_prop_ro("eps", &Norm::eps)
        .def_prop_rw("fused", &Norm::fused, &Norm::set_fused, "The fused kernel form, else composed (settable).");
    // The concrete classes, for nanobind's downcasts (see the top of the file).
    nb::class_<LayerNorm, Norm>(m, "LayerNorm");
    nb::class_<RMSNorm, Norm>(m, "RMSNorm").def_prop_ro("stat_count", &RMSNorm::stat_count);
    nb::class_<AdaptiveRMSNorm, Norm>(m, "AdaptiveRMSNorm");
    nb::class_<HybridNorm, Norm>(m, "HybridNorm").def_prop_ro("alpha", &HybridNorm::alpha);
    nb::class_<DyT, Norm>(m, "DyT").def_prop_ro("alpha_init", &DyT::alpha_init);
    nb::class_<RegistryNorm, Norm>(m, "RegistryNorm");
    m.def("make_norm", [](const NormOptions& options) { return make_norm(options); }, nb::arg("options"),
          "Builds the norm options.type names through the registry.");
    m.def("set_norms_fused", &set_norms_fused, nb::arg("model"), nb::arg("fused"),
          "Sets every norm in model to the fused or composed form; returns how many it set.");
}

// ---- the transformer's parts ----

void bind_transformer_options(nb::module_& m) {
    nb::class_<FeedForwardOptions>(m, "FeedForwardOptions", "layers/transformer.h FeedForwardOptions.")
        .def(nb::init<>())
        .def_rw("dim", &FeedForwardOptions::dim)
        .def_rw("hidden_dim", &FeedForwardOptions::hidden_dim, "Before LLaMA's 2/3 rule (LLaMA passes 4 * dim).")
        .def_rw("multiple_of", &FeedForwardOptions::multiple_of)
        .def_rw("dtype", &FeedForwardOptions::dtype)
        .def_rw("fused", &FeedForwardOptions::fused, "swiglu's fused form.");
    nb::class_<AttentionOptions>(m, "AttentionOptions", "layers/transformer.h AttentionOptions.")
        .def(nb::init<>())
        .def_rw("dim", &AttentionOptions::dim)
        .def_rw("n_heads", &AttentionOptions::n_heads)
        .def_rw("n_kv_heads", &AttentionOptions::n_kv_heads, "0: n_heads; must divide n_heads.")
        .def_rw("head_dim", &AttentionOptions::head_dim, "Each head's size; 0: dim / n_heads.")
        .def_rw("rope_theta", &AttentionOptions::rope_theta)
        .def_rw("max_seq_len", &AttentionOptions::max_seq_len)
        .def_rw("fused", &AttentionOptions::fused)
        .def_rw("dtype", &AttentionOptions::dtype);
    nb::class_<TransformerBlockOptions>(m, "TransformerBlockOptions", "layers/transformer.h TransformerBlockOptions.")
        .def(nb::init<>())
        .def_rw("dim", &TransformerBlockOptions::dim)
        .def_rw("n_heads", &TransformerBlockOptions::n_heads)
        .def_rw("n_kv_heads", &TransformerBlockOptions::n_kv_heads)
        .def_rw("head_dim", &TransformerBlockOptions::head_dim)
        .def_rw("ffn_hidden_dim", &TransformerBlockOptions::ffn_hidden_dim)
        .def_rw("multiple_of", &TransformerBlockOptions::multiple_of)
        .def_rw("norm", &TransformerBlockOptions::norm)
        .def_rw("norm_placement", &TransformerBlockOptions::norm_placement)
        .def_rw("pre_norm_scale", &TransformerBlockOptions::pre_norm_scale)
        .def_rw("deepnorm_alpha", &TransformerBlockOptions::deepnorm_alpha)
        .def_rw("deepnorm_beta", &TransformerBlockOptions::deepnorm_beta)
        .def_rw("qk_norm", &TransformerBlockOptions::qk_norm)
        .def_rw("alpha_init_attention", &TransformerBlockOptions::alpha_init_attention)
        .def_rw("attn_softcap", &TransformerBlockOptions::attn_softcap)
        .def_rw("rope_theta", &TransformerBlockOptions::rope_theta)
        .def_rw("max_seq_len", &TransformerBlockOptions::max_seq_len)
        .def_rw("fused_attention", &TransformerBlockOptions::fused_attention)
        .def_rw("fused_swiglu", &TransformerBlockOptions::fused_swiglu)
        .def_rw("dtype", &TransformerBlockOptions::dtype);
    nb::class_<TransformerOptions>(m, "TransformerOptions",
                                   "layers/transformer.h TransformerOptions (LLaMA's ModelArgs).")
        .def(nb::init<>())
        .def_rw("vocab_size", &TransformerOptions::vocab_size)
        .def_rw("dim", &TransformerOptions::dim)
        .def_rw("n_layers", &TransformerOptions::n_layers)
        .def_rw("n_heads", &TransformerOptions::n_heads)
        .def_rw("n_kv_heads", &TransformerOptions::n_kv_heads)
        .def_rw("head_dim", &TransformerOptions::head_dim)
        .def_rw("multiple_of", &TransformerOptions::multiple_of)
        .def_rw("ffn_hidden_dim", &TransformerOptions::ffn_hidden_dim)
        .def_rw("norm", &TransformerOptions::norm)
        .def_rw("norm_placement", &TransformerOptions::norm_placement)
        .def_rw("mix_fraction", &TransformerOptions::mix_fraction)
        .def_rw("norm_scaling", &TransformerOptions::norm_scaling)
        .def_rw("qk_norm", &TransformerOptions::qk_norm)
        .def_rw("alpha_init_attention", &TransformerOptions::alpha_init_attention)
        .def_rw("logit_softcap", &TransformerOptions::logit_softcap)
        .def_rw("attn_softcap", &TransformerOptions::attn_softcap)
        .def_rw("rope_theta", &TransformerOptions::rope_theta)
        .def_rw("max_seq_len", &TransformerOptions::max_seq_len)
        .def_rw("fused_attention", &TransformerOptions::fused_attention)
        .def_rw("fused_swiglu", &TransformerOptions::fused_swiglu)
        .def_rw("seed", &TransformerOptions::seed, "The initial weights are drawn from Generator(seed).")
        .def_rw("dtype", &TransformerOptions::dtype)
        .def("validate", &TransformerOptions::validate, "normlab.Error naming the field when the sizes do not fit.");
}

void bind_transformer(nb::module_& m) {
    nb::class_<FeedForward, UnaryModule>(m, "FeedForward", "LLaMA's SwiGLU FeedForward: w2(silu(w1 x) * w3 x).")
        .def("__init__", [](FeedForward* self, FeedForwardOptions options, Generator* generator) {
                 options.generator = generator;
                 new (self) FeedForward(options);
             },
             nb::arg("options"), nb::arg("generator").none() = nb::none())
        .def_prop_ro("hidden", &FeedForward::hidden, "The hidden size after the 2/3 rule.");
    nb::class_<Attention, UnaryModule>(m, "Attention",
                                       "LLaMA's causal self-attention: RoPE, grouped-query heads, no biases.")
        .def("__init__", [](Attention* self, AttentionOptions options, Generator* generator) {
                 options.generator = generator;
                 new (self) Attention(options);
             },
             nb::arg("options"), nb::arg("generator").none() = nb::none())
        .def_prop_ro("head_dim", &Attention::head_dim)
        .def_prop_ro("n_heads", &Attention::n_heads)
        .def_prop_ro("n_kv_heads", &Attention::n_kv_heads);
    nb::class_<TransformerBlock, UnaryModule>(m, "TransformerBlock",
                                              "LLaMA's block (pre-norm) or the original post-norm block.")
        .def("__init__", [](TransformerBlock* self, TransformerBlockOptions options, Generator* generator) {
                 options.generator = generator;
                 new (self) TransformerBlock(options);
             },
             nb::arg("options"), nb::arg("generator").none() = nb::none())
        .def_prop_ro("options", [](const TransformerBlock& b) { return b.options(); });
    nb::class_<Transformer, Module>(m, "Transformer", "The decoder-only language model (LLaMA's names).")
        .def(nb::init<const TransformerOptions&>(), nb::arg("options"))
        .def("forward", [](Transformer& t, const Var& ids) { return t.forward(ids.data()); }, nb::arg("ids"), Guard(),
             "ids (B, T) int64 -> logits (B, T, vocab_size).")
        .def_prop_ro("options", [](const Transformer& t) { return t.options(); })
        .def("count_parameters", [](const Transformer& t, bool include_embeddings) {
                 return count_parameters(t, include_embeddings);
             },
             nb::arg("include_embeddings") = true, "Parameter elements; without the embedding table on request.");
    m.def("swiglu_hidden_dim", &swiglu_hidden_dim, nb::arg("hidden_dim"), nb::arg("multiple_of"),
          "LLaMA's FeedForward hidden size: multiple_of * ceil(int(2 * hidden_dim / 3) / multiple_of).");
}

// ---- the functional forms ----

void bind_functional(nb::module_& m) {
    m.def("linear", [](const Var& x, const Var& weight, std::optional<Var> bias) {
              Var y = linear(x, weight);
              return bias ? y + *bias : y;
          },
          nb::arg("input"), nb::arg("weight"), nb::arg("bias").none() = nb::none(), Guard(),
          "F.linear: x (..., in) W^T (out, in) + b (out).");
    m.def("layer_norm", [](const Var& x, std::optional<Var> w, std::optional<Var> b, double eps, bool fused) {
              return layer_norm(x, var_or_undefined(w), var_or_undefined(b), eps, fused);
          },
          nb::arg("input"), nb::arg("weight").none(), nb::arg("bias").none(), nb::arg("eps"), nb::arg("fused") = true,
          Guard(), "LayerNorm over the last dim (biased variance).");
    m.def("rms_norm", [](const Var& x, std::optional<Var> w, std::optional<Var> b, double eps, bool fused,
                         int64_t stat_count) {
              return rms_norm(x, var_or_undefined(w), var_or_undefined(b), eps, fused, stat_count);
          },
          nb::arg("input"), nb::arg("weight").none(), nb::arg("bias").none(), nb::arg("eps"), nb::arg("fused") = true,
          nb::arg("stat_count") = -1, Guard(),
          "RMSNorm over the last dim (LLaMA's form; + bias for RMSNormWithBias; the RMS over the first stat_count "
          "elements for pRMSNorm).");
    m.def("cross_entropy", [](const Var& logits, const Var& targets, int64_t ignore_index, const std::string& reduction,
                              bool fused) {
              const Reduction r = reduction_from(reduction);
              nb::gil_scoped_release release;
              return fused ? cross_entropy_loss(logits, targets.data(), ignore_index, r)
                           : cross_entropy_loss_composed(logits, targets.data(), ignore_index, r);
          },
          nb::arg("input"), nb::arg("target"), nb::arg("ignore_index") = -100, nb::arg("reduction") = "mean",
          nb::arg("fused") = true,
          "F.cross_entropy with the class dim last: logits (..., C), int64 targets (...); rows whose target is "
          "ignore_index count for nothing.");
    m.def("mse_loss", &mse_loss, nb::arg("input"), nb::arg("target"), Guard(),
          "mean((input - target)^2); the shapes must match exactly.");
    m.def("swiglu", &swiglu, nb::arg("a"), nb::arg("b"), nb::arg("fused") = true, Guard(), "silu(a) * b.");
    m.def("causal_attention", &causal_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("fused") = true,
          nb::arg("softcap") = 0.0, Guard(),
          "Causal attention of q (B, T, H, hd) over k, v (B, L, KV, hd), KV dividing H, scaled by 1/sqrt(hd); "
          "softcap > 0 caps the scaled scores to softcap * tanh(s / softcap) before the softmax (0: off).");
    m.def("embedding", [](const Var& ids, const Var& weight) { return embedding(weight, ids.data()); },
          nb::arg("input"), nb::arg("weight"), Guard(), "F.embedding: the rows of weight at the int64 ids.");
    m.def("dropout", [](const Var& x, double p, bool training, Generator* generator) {
              nb::gil_scoped_release release;
              return dropout(x, p, training, generator ? *generator : default_generator());
          },
          nb::arg("input"), nb::arg("p") = 0.5, nb::arg("training") = true, nb::arg("generator").none() = nb::none(),
          "Inverted dropout; the mask drawn from generator (None: the default generator).");
}

}  // namespace

void bind_nn(nb::module_& m) {
    bind_module(m);
    bind_basic_layers(m);
    bind_norm_options(m);
    bind_norm_registry(m);
    bind_norms(m);
    bind_transformer_options(m);
    bind_transformer(m);
    bind_functional(m);
}

}  // namespace nl::py
