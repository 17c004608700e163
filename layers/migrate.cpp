// LayerNorm -> RMSNorm migration over a module tree, in place.
#include "layers/migrate.h"

#include "layers/monitor.h"
#include "layers/norms.h"

namespace nl {

MigrationReport migrate_layernorm_to_rmsnorm(Module& model) {
    MigrationReport report;
    // Collect (parent, child name, dotted name) first; replacing while walking would invalidate it.
    struct Target {
        Module* parent;
        std::string name;
        std::string path;
    };
    std::vector<Target> targets;
    for (auto& [path, module] : model.named_modules()) {
        // A HybridNorm's layer_norm is a part of that norm, not a LayerNorm of the model.
        if (dynamic_cast<Norm*>(module) != nullptr && dynamic_cast<NormMonitor*>(module) == nullptr) continue;
        for (auto& [name, child] : module->named_children()) {
            if (std::dynamic_pointer_cast<LayerNorm>(child)) targets.push_back({module, name, join_name(path, name)});
        }
    }
    for (const Target& t : targets) {
        auto ln = std::dynamic_pointer_cast<LayerNorm>(t.parent->child(t.name));
        NormOptions options = ln->options();
        options.type = "rmsnorm";
        options.eps = ln->eps();  // keep LayerNorm's eps (not RMSNorm's default)
        options.dtype = ln->weight().defined() ? ln->weight().dtype() : options.dtype;
        auto rms = std::make_shared<RMSNorm>(options);
        if (ln->weight().defined()) {
            rms->to(ln->weight().device());
            NoGradGuard no_grad;
            Var w = rms->weight();
            w.data().copy_(ln->weight().data().to(w.device()));
        }
        if (ln->bias().defined()) report.dropped_biases.push_back(join_name(t.path, "bias"));
        rms->train(ln->is_training());
        t.parent->replace_module(t.name, rms);
        report.replaced.push_back(t.path);
    }
    return report;
}

}  // namespace nl
