// A program written against the normlab library, as a user would: it defines its own norm from
// autograd ops (ScaleNorm), checks that norm's gradients against finite differences in f64, trains a
// tiny MLP that uses it with Adam, and saves and reloads a checkpoint. Exits 1 when the gradient
// check fails, the loss does not drop, or the reloaded model differs. docs/library.md explains each step.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "autograd/autograd.h"
#include "core/tensor.h"
#include "layers/activation.h"
#include "layers/checkpoint.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "layers/module.h"
#include "optim/adam.h"

// ScaleNorm (Nguyen & Salazar, 2019, "Transformers without Tears", eq. 6):
//   y = g * x / sqrt(sum_i x_i^2 + eps)   over the last dimension, g a learned scalar.
// Written with differentiable ops only: autograd derives its backward.
// x (..., dim), g (1) -> (..., dim)
nl::Var scale_norm(const nl::Var& x, const nl::Var& g, double eps) {
    nl::Var norm = nl::sqrt(nl::sum(nl::square(x), {-1}, /*keepdim=*/true) + eps);  // (..., 1)
    return g * x / norm;
}

// The norm as a layer: g is its parameter, sqrt(dim) at init.
class ScaleNorm : public nl::UnaryModule {
public:
    explicit ScaleNorm(int64_t dim, double eps = 1e-5) : eps_(eps) {
        register_parameter("g", nl::Var(nl::full({1}, std::sqrt(static_cast<double>(dim)))));
    }
    std::string type_name() const override { return "ScaleNorm"; }
    nl::Var forward(const nl::Var& x) override { return scale_norm(x, parameter("g"), eps_); }

private:
    double eps_;
};

int main() {
    // ---- 1. the norm's gradients, analytic vs central differences, in f64 ----
    nl::Generator gen(0);
    {
        nl::Var x(nl::randn({4, 6}, gen, nl::DType::F64), /*requires_grad=*/true);  // (4, 6)
        nl::Var g(nl::full({1}, 1.5, nl::DType::F64), /*requires_grad=*/true);      // (1)
        nl::GradcheckResult check = nl::gradcheck(
            [](const std::vector<nl::Var>& inputs) { return scale_norm(inputs[0], inputs[1], 1e-5); }, {x, g});
        std::printf("gradcheck scale_norm (x and g, f64): %s\n", check.message.c_str());
        if (!check.ok) return 1;
    }

    // ---- 2. a tiny MLP with the norm, trained with Adam on y = tanh(x . w) ----
    nl::manual_seed(0);  // the layers' initial weights
    auto model = std::make_shared<nl::Sequential>();
    model->push_back(std::make_shared<nl::Linear>(8, 32));
    model->push_back(std::make_shared<ScaleNorm>(32));
    model->push_back(std::make_shared<nl::ReLU>());
    model->push_back(std::make_shared<nl::Linear>(32, 1));

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
    auto reloaded = std::make_shared<nl::Sequential>();
    reloaded->push_back(std::make_shared<nl::Linear>(8, 32));
    reloaded->push_back(std::make_shared<ScaleNorm>(32));
    reloaded->push_back(std::make_shared<nl::ReLU>());
    reloaded->push_back(std::make_shared<nl::Linear>(32, 1));
    nl::CheckpointInfo info = nl::load_checkpoint(path, *reloaded);
    std::filesystem::remove(path);
    const double difference = nl::max_abs_diff(reloaded->forward(x).data(), model->forward(x).data());
    std::printf("checkpoint: step %lld reloaded, max |difference| of the outputs %g\n",
                static_cast<long long>(info.step), difference);
    if (difference != 0.0) return 1;
    std::printf("ok: loss %.5f -> %.5f\n", first_loss, last_loss);
    return 0;
}
