// LayerNorm -> RMSNorm migration: replace every LayerNorm in a model, in place, by an RMSNorm of the
// same size, eps, dtype, affine flag and fused/composed form, copying the scale weights.
#pragma once

#include <string>
#include <vector>

#include "layers/module.h"

namespace nl {

struct MigrationReport {
    std::vector<std::string> replaced;        // dotted module names of the replaced LayerNorms
    std::vector<std::string> dropped_biases;  // parameter names that no longer exist ("ln1.bias")
};

// RMSNorm has no bias and does not re-center, so LayerNorm biases are DROPPED (listed in the
// report), and the migrated model computes a different function until it is fine-tuned; the weight
// keeps its name ("ln1.weight") and values. LayerNorms inside a NormMonitor are replaced too (the
// monitor keeps its buffers); a HybridNorm's own layer_norm branch is left alone. This is the
// article's migrate_layernorm_to_rmsnorm (6.3: RMSNorm(normalized_shape[0], eps=module.eps), the
// weight copied) carried out in place. Parameter Vars of the replaced norms are new: build optimizers after
// migrating.
MigrationReport migrate_layernorm_to_rmsnorm(Module& model);

}  // namespace nl
