// A program written against the normlab library, as a user would: it takes a norm from the norm
// registry by its config name (ScaleNorm unless the first argument names another of `normlab
// norms`), checks that norm's gradients against finite differences in f64, trains a tiny MLP that
// uses it with Adam, and saves and reloads a checkpoint. Exits 1 when the gradient check fails, the
// loss does not drop, or the reloaded model differs; 2 for an unknown norm name. docs/library.md
// explains each step.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "core/error.h"
#include "core/tensor.h"
#include "layers/activation.h"
#include "layers/checkpoint.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "layers/norm_registry.h"
#include "layers/norms.h"
#include "optim/adam.h"

// Linear(8, 32) -> the norm over 32 features -> ReLU -> Linear(32, 1). make_norm builds the norm
// named by options.type, as a config's {"norm": {"type": "scalenorm"}} does.
std::shared_ptr<nl::Sequential> make_mlp(const std::string& norm_type) {
    nl::NormOptions norm;
    norm.type = norm_type;
    norm.dim = 32;
    auto model = std::make_shared<nl::Sequential>();
    model->push_back(std::make_shared<nl::Linear>(8, 32));
    model->push_back(nl::make_norm(norm));
    model->push_back(std::make_shared<nl::ReLU>());
    model->push_back(std::make_shared<nl::Linear>(32, 1));
    return model;
}

// The norm's functional form (its registry entry's forward) against central differences in f64,
// with x and every parameter as inputs. norm_gradcheck_inputs draws them: the parameters at their
// init plus noise, so a missing factor of a weight of ones cannot hide.
bool check_gradients(const nl::NormType& type, nl::Generator& gen) {
    const nl::NormOptions options = nl::norm_gradcheck_options(type, /*dim=*/6, /*fused=*/false);
    const std::vector<nl::Var> inputs = nl::norm_gradcheck_inputs(type, {4, 6}, gen);  // x (4, 6), then g (1)
    nl::GradcheckResult check = nl::gradcheck(
        [&type, &options](const std::vector<nl::Var>& in) {
            return type.forward(in[0], std::vector<nl::Var>(in.begin() + 1, in.end()), options, /*fused=*/false);
        },
        inputs);
    std::printf("gradcheck %s (x and its parameters, f64): %s\n", type.name.c_str(), check.message.c_str());
    return check.ok;
}

int main(int argc, char** argv) {
    const std::string norm_type = argc > 1 ? argv[1] : "scalenorm";
    const nl::NormType* type = nullptr;
    try {
        type = &nl::find_norm_type(norm_type);
    } catch (const nl::Error& e) {
        std::printf("error: %s\n", e.what());
        return 2;
    }

    // ---- 1. the norm's gradients, analytic vs central differences, in f64 ----
    nl::Generator gen(0);
    if (!check_gradients(*type, gen)) return 1;

    // ---- 2. a tiny MLP with the norm, trained with Adam on y = tanh(x . w) ----
    nl::manual_seed(0);  // the layers' initial weights
    std::shared_ptr<nl::Sequential> model = make_mlp(norm_type);

    nl::Tensor inputs = nl::randn({256, 8}, gen);                                // (256, 8)
    nl::Tensor targets = nl::tanh(nl::matmul(inputs, nl::randn({8, 1}, gen)));  // (256, 1)
    nl::Var x(inputs), y(targets);

    nl::AdamOptions options;
    options.lr = 1e-2;
    nl::Adam optimizer(model->named_parameters(), options);
    double first_loss = 0.0, last_loss = 0.0;
    for (int step = 1; step <= 200; ++step) {
        nl::Var loss = nl::mse_loss(model->forward(x), y);
        optimizer.zero_grad();
        loss.backward();
        optimizer.step();
        if (step == 1) first_loss = loss.item();
        last_loss = loss.item();
        if (step == 1 || step % 50 == 0) std::printf("step %3d: mse %.5f\n", step, last_loss);
    }
    if (!(last_loss < 0.2 * first_loss)) {
        std::printf("FAILED: the loss went from %.5f to %.5f, expected below a fifth\n", first_loss, last_loss);
        return 1;
    }

    // ---- 3. checkpoint: save, load into a fresh model, same outputs ----
    const std::string path = (std::filesystem::temp_directory_path() / "scalenorm_mlp.safetensors").string();
    nl::save_checkpoint(path, *model, &optimizer, nullptr, /*step=*/200);
    std::shared_ptr<nl::Sequential> reloaded = make_mlp(norm_type);
    nl::CheckpointInfo info = nl::load_checkpoint(path, *reloaded);
    std::filesystem::remove(path);
    const double difference = nl::max_abs_diff(reloaded->forward(x).data(), model->forward(x).data());
    std::printf("checkpoint: step %lld reloaded, max |difference| of the outputs %g\n",
                static_cast<long long>(info.step), difference);
    if (difference != 0.0) return 1;
    std::printf("ok: loss %.5f -> %.5f\n", first_loss, last_loss);
    return 0;
}
