// Trains normlab's toy transformer from a config with the library's train job, as `normlab train`
// does, and reads the result back: a program of a few lines against the installed normlab
// (docs/library.md walks through it). With a path argument it trains that config file; without,
// the small config written below. The run directory goes to a temporary folder.
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "jobs/train.h"

int main(int argc, char** argv) {
    nl::TrainJob job;
    if (argc > 1) {
        job.config_path = argv[1];
    } else {
        job.config = {{"data", {{"source", "synthetic"}, {"task", "reverse"}, {"length", 6}}},
                      {"model", {{"dim", 32}, {"n_layers", 1}, {"n_heads", 2}}},
                      {"optim", {{"lr", 3e-3}, {"warmup_steps", 10}}},
                      {"train", {{"steps", 200}, {"batch_size", 32}, {"eval_every", 100}}}};
        job.config_name = "reverse_small";
    }
    job.out = (std::filesystem::temp_directory_path() / "normlab_train_from_config").string();
    job.force = true;

    nl::TrainCallbacks callbacks;
    callbacks.on_step = [](const nl::TrainStep& step) {
        if (step.evaluated) std::printf("step %lld: train loss %.4f, val loss %.4f\n", static_cast<long long>(step.step),
                                        step.train_loss, step.eval.loss);
    };
    try {
        const nl::TrainResult result = nl::run_train(job, callbacks);
        const double first = result.history.front().train_loss, last = result.history.back().train_loss;
        std::printf("trained %zu steps in %s: loss %.4f -> %.4f, %.0f tokens/s\n", result.history.size(),
                    result.run_dir.c_str(), first, last, result.summary["tokens_per_s"].get<double>());
        return last < first ? 0 : 1;  // the consumer's check that the job trained
    } catch (const nl::Error& e) {
        std::fprintf(stderr, "train_from_config: error: %s\n", e.what());
        return 2;
    }
}
