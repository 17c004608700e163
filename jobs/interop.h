// Models that travel: a normlab Transformer exported to Hugging Face transformers
// (LlamaForCausalLM, Qwen3ForCausalLM or Olmo2ForCausalLM: config.json, model.safetensors,
// generation_config.json, and a character tokenizer) and to llama.cpp (a GGUF v3 file, architecture
// "llama"), and such models read back as a Transformer's options and weights, for `model.init_from`
// and `normlab sample`. docs/interop.md.
//
// Names: one table (kWeightNames) maps each of the 12 LLaMA weight kinds between normlab's (Meta's)
// names, transformers' and GGUF's; Qwen3 adds q_norm and k_norm, OLMo 2 replaces the input norms by
// its output norms (hf_weight_names). RoPE layout: normlab and llama.cpp rotate interleaved pairs
// (x[2i], x[2i+1]); transformers rotates the two halves (x[i], x[i + hd/2]) (rotate_half), so the
// rows of wq and wk, and the QK-norm weights that act on them, are permuted on the way to and from
// transformers, and on no other way.
//
// What a format cannot hold is refused by name, never approximated: RMSNorm models with a learned
// weight, pre-norm (LLaMA, and Qwen3 with qk_norm "head") or output norms with qk_norm "full"
// (OLMo 2), no soft-caps, no depth scaling; llama.cpp's "llama" holds the LLaMA ones.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "layers/module.h"
#include "jobs/data.h"
#include "jobs/train_config.h"
#include "layers/transformer.h"

namespace nl {

// One weight kind under its three names. A per-layer kind's names follow the layer prefixes
// "layers.{i}." (normlab), "model.layers.{i}." (transformers), "blk.{i}." (GGUF).
struct WeightName {
    const char* normlab;
    const char* hf;
    const char* gguf;
    bool per_layer;
};
extern const std::vector<WeightName> kWeightNames;

// The transformers classes normlab writes and reads, each a set of TransformerOptions:
//   Llama: norm_placement "pre", qk_norm "none" (LlamaForCausalLM, model_type "llama");
//   Qwen3: norm_placement "pre", qk_norm "head" (Qwen3ForCausalLM, model_type "qwen3");
//   Olmo2: norm_placement "output", qk_norm "full" (Olmo2ForCausalLM, model_type "olmo2");
// all with RMSNorm and its learned weight.
enum class HfArch { Llama, Qwen3, Olmo2 };
const char* hf_class_name(HfArch arch);  // "LlamaForCausalLM", "Qwen3ForCausalLM", "Olmo2ForCausalLM"
const char* hf_model_type(HfArch arch);  // "llama", "qwen3", "olmo2"

// The weight names of one architecture (the gguf field is "" for a kind GGUF's llama lacks):
// LLaMA's table; Qwen3's adds attention.q_norm / k_norm (self_attn.q_norm / k_norm); OLMo 2's has
// those, and attention_out_norm and ffn_out_norm as post_attention_layernorm and
// post_feedforward_layernorm in place of the input norms (OLMo 2 gives LLaMA's name of the
// feed-forward's input norm to the attention's output norm).
const std::vector<WeightName>& hf_weight_names(HfArch arch);

// A normlab parameter name ("layers.3.attention.wq.weight") under transformers' or GGUF's names;
// an nl::Error for a name outside the table.
std::string hf_weight_name(const std::string& normlab_name, HfArch arch = HfArch::Llama);
std::string gguf_weight_name(const std::string& normlab_name);

// The q or k projection's rows, (n_heads * hd, dim), from normlab's interleaved RoPE pairs to
// transformers' half split: row h*hd + 2i + j goes to h*hd + j*hd/2 + i (the inverse of the permute
// in transformers' convert_llama_weights_to_hf.py). The inverse with to_half_split = false.
Tensor permute_rope_rows(const Tensor& weight, int64_t n_heads, bool to_half_split);

// The transformers class that holds `options`; nl::Error "export --to hf: ..." naming the option no
// class holds (a norm other than rmsnorm, a norm without a weight, a placement, a qk_norm with that
// placement, depth scaling, a soft-cap) and what each class is.
HfArch hf_architecture(const TransformerOptions& options);

// nl::Error naming the reason when `options` is not a model `to` ("hf" or "gguf") can hold:
// hf_architecture's refusals for "hf"; for "gguf" (llama.cpp's "llama") LLaMA's options only.
void check_exportable(const TransformerOptions& options, const std::string& to);

// ---- transformers ----

// The config.json of `options` as hf_architecture's class (untied embeddings, weights in `dtype`).
nlohmann::json hf_config_json(const TransformerOptions& options, DType dtype);

// The Transformer options of a LlamaForCausalLM, Qwen3ForCausalLM or Olmo2ForCausalLM config.json
// (its model_type), and whether its embeddings are tied. Everything those classes can be but normlab
// cannot is refused by key (attention or MLP biases, an activation other than silu, rope_scaling, an
// OLMo 2 head_dim other than hidden_size / heads, dropout, pretraining_tp, Qwen3's sliding window); sizes
// are bounded as the train config's are. `intermediate_size` H is held exactly: multiple_of 1 and
// ffn_hidden_dim ceil(3H / 2) (swiglu_hidden_dim gives H back). Errors: "<where>: /key: expected
// ..., got ...".
struct HfConfig {
    TransformerOptions options;
    HfArch arch = HfArch::Llama;
    bool tied = false;
};
HfConfig read_hf_config(const nlohmann::json& config, const std::string& where);

// ---- what is read back ----

struct PretrainedModel {
    std::string path;                  // the directory or file read
    std::string format;                // "hf" or "gguf"
    TransformerOptions options;        // the architecture, vocab_size and max_seq_len (the context)
    NamedTensors weights;              // every parameter under normlab's names, f32, on the CPU
    std::vector<uint32_t> char_vocab;  // a character tokenizer's codepoints in id order; empty when
                                       // the model's vocabulary is not one character per token
};

// True for a directory holding config.json and model.safetensors or model.safetensors.index.json
// (a run directory holds neither), or a file whose first bytes are GGUF's magic.
bool is_pretrained_model(const std::string& path);

// A transformers directory (config.json, then model.safetensors or model.safetensors.index.json and
// its shards, each a plain file name inside the directory) or a GGUF file (F32/F16/BF16 tensors,
// quantized types refused by name). `with_weights` false reads only the architecture and vocab.
// Missing, unexpected, duplicate or misshapen tensors are named. Safetensors files are
// memory-mapped, each tensor converted to f32 from the map.
PretrainedModel load_pretrained(const std::string& path, bool with_weights = true);
// The same file read once into a Transformer built from its options (f32, on the CPU; `model` is set
// as soon as the architecture is read), each weight converted and copied in one tensor at a time, so
// loading holds the model and one converted tensor, not a second copy of every weight. Returns what
// load_pretrained(path, false) does. The same checks and errors.
PretrainedModel load_pretrained_into(const std::string& path, std::unique_ptr<Transformer>& model);
// The bytes of a Transformer's weights in f32 (every parameter, the output head counted apart from
// the embedding as normlab holds it), for checks before allocating.
double model_weight_bytes(const TransformerOptions& options);

// ---- model.init_from ----

// The architecture of `pretrained` becomes config.model and is recorded in config.resolved's /model
// (so checkpoints, `sample` and `--resume` never need the file). A key the config gives explicitly
// (`given_model`: its /model object as written) must agree with the file: one nl::Error names every
// key that differs, with both values. max_seq_len may be given smaller than the file's context.
void adopt_pretrained_architecture(TrainConfig& config, const nlohmann::json& given_model, const PretrainedModel& pretrained);

// The data against the pretrained vocabulary: text data needs the file's character tokenizer with
// exactly the text's characters in the same order; token and synthetic data need every id below the
// file's vocab_size. nl::Error naming what differs.
void check_pretrained_vocab(const TrainConfig& config, const Dataset& data, const PretrainedModel& pretrained);

// ---- export ----

struct ExportOptions {
    std::string to;                 // "hf" (a directory) or "gguf" (a file)
    std::string out;                // the directory or file to write
    DType dtype = DType::F32;       // the tensors' dtype: F32, F16 or BF16
    bool force = false;             // replace an existing `out`
};

// Writes `model` (with `char_vocab`'s tokenizer when not empty) as `export_options` says. Atomic:
// everything is written under a temporary name beside `out` and renamed over it last, so a failed
// export leaves no partial file or directory.
void export_model(const Transformer& model, const std::vector<uint32_t>& char_vocab, const ExportOptions& options);

}  // namespace nl
