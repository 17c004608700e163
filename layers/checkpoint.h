// Checkpoints: one safetensors file holding a model's state_dict under its PyTorch names (so
// `model.load_state_dict({k: v for k, v in load_file(path).items() if not k.startswith("optim.")})`
// works in PyTorch), the optimizer's state under "optim.<param name>.<buffer>", and the scalars
// (step, RNG state, optimizer hyperparameters, user metadata) in the file's __metadata__.
// Written atomically by save_safetensors (temp file + rename), so a crash never leaves half a file.
//
// Layers sit below optim/, so the optimizer is seen here through a small interface
// (StatefulOptimizer) that nl::Optimizer implements.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/rng.h"
#include "layers/module.h"

namespace nl {

// Everything an optimizer needs to resume exactly.
struct OptimizerState {
    std::string type;                     // "SGD", "Adam", "AdamW": checked on load
    int64_t step = 0;                     // step() calls so far
    std::map<std::string, double> hyper;  // "lr", "beta1", ...: restored on load (as PyTorch does)
    // Per-parameter buffers named "<param name>.<buffer>": "fc1.weight.exp_avg",
    // "fc1.weight.exp_avg_sq", "fc1.weight.step" (0-d i64), "fc1.weight.momentum_buffer".
    // A parameter that never had a gradient has no entries (PyTorch's lazy state).
    NamedTensors tensors;
};

// The optimizer as a checkpoint sees it.
class StatefulOptimizer {
public:
    virtual ~StatefulOptimizer() = default;
    // Copies of the state (later steps do not change a returned state).
    virtual OptimizerState state_dict() const = 0;
    // Strict: a different type, a buffer for an unknown parameter, an unknown buffer name or a
    // shape/dtype mismatch is an nl::Error naming the key (and both shapes).
    virtual void load_state_dict(const OptimizerState& state) = 0;
};

// The file's metadata keys that normlab writes; user metadata may not use the prefix "normlab.".
//   normlab.format = "checkpoint-v1", normlab.step, normlab.rng.seed, normlab.rng.offset,
//   normlab.optim.type, normlab.optim.step, normlab.optim.<hyper> (e.g. normlab.optim.lr).
// Numbers are written in decimal (doubles with 17 significant digits, so they round-trip).
inline constexpr const char* kCheckpointOptimPrefix = "optim.";

// Saves model.state_dict() (parameters and buffers), the optimizer's state when `optimizer` is not
// null, the generator's (seed, offset) when `rng` is not null, `step`, and `metadata`.
void save_checkpoint(const std::string& path, const Module& model, const StatefulOptimizer* optimizer = nullptr,
                     const Generator* rng = nullptr, int64_t step = 0,
                     const std::map<std::string, std::string>& metadata = {});

struct CheckpointInfo {
    int64_t step = 0;
    bool has_optimizer = false;
    bool has_rng = false;
    uint64_t rng_seed = 0;
    uint64_t rng_offset = 0;
    std::map<std::string, std::string> metadata;  // the user's metadata (normlab.* keys removed)
};

// Loads into an existing model (strict: every model key present, no unexpected non-"optim." key,
// same shapes and dtypes), the optimizer when not null (the file must then hold optimizer state)
// and the generator when not null (the file must then hold an RNG state). Errors name the key,
// the shapes and the file. Nothing is modified unless the whole file validates.
CheckpointInfo load_checkpoint(const std::string& path, Module& model, StatefulOptimizer* optimizer = nullptr,
                               Generator* rng = nullptr);

// Reads only the scalars (step, RNG, metadata) of a checkpoint. normlab.step and
// normlab.optim.step must be decimal integers in [0, 2^63); the RNG state unsigned 64-bit decimals.
CheckpointInfo read_checkpoint_info(const std::string& path);
// The same from a file already loaded (errors name file.path).
struct SafeTensorsFile;
CheckpointInfo checkpoint_info(const SafeTensorsFile& file);

}  // namespace nl
