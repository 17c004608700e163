// The `normlab` program's subcommands: each lives in its own examples/cli/<job>_cmd.cpp (or
// bench_<name>.cpp), which parses its flags, calls the job in jobs/ and prints, and adds itself to
// the command line through one register function declared here, which main.cpp calls.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace nl::cli {

// `normlab info`: version, build, BLAS, threads, devices, dtypes, memory (examples/cli/info_cmd.cpp).
void register_info(CLI::App& app);

// What the program's restart at start set for its libraries (examples/cli/main.cpp), empty where it
// set nothing: kept for `normlab info`, and out of the environment of the programs normlab starts.
struct RestartSettings {
    std::string gomp_spincount;  // GOMP_SPINCOUNT, where normlab chose it
    std::string blas_fallback;   // the kernel OpenBLAS fell back to, where normlab chose another
};
const RestartSettings& restart_settings();
// Runs `start_child` (a popen or fork) with this thread's CPUs set to those the process started with,
// then sets them back: a program normlab starts (PyTorch under `bench torch`) gets the CPUs the user
// gave normlab, not the one CPU an OpenMP runtime binds normlab's main thread to under
// OMP_PROC_BIND.
void with_starting_cpus(const std::function<void()>& start_child);
// How idle OpenMP threads wait: OMP_WAIT_POLICY or GOMP_SPINCOUNT as the user set them, else (in this
// process) normlab's own GOMP_SPINCOUNT, else the runtime's default. in_this_process false: what a
// program normlab starts gets (examples/cli/info_cmd.cpp).
std::string idle_threads_setting(bool in_this_process);

// `normlab bench ...`: benchmarks are subcommands of `bench`, which main.cpp creates.
// `normlab bench core`: matmul vs direct cblas, elementwise vs memcpy (examples/cli/bench_core.cpp).
void register_bench_core(CLI::App& bench);

// `normlab train CONFIG`: the toy transformer LM on synthetic tasks or a text file (examples/cli/train_cmd.cpp).
void register_train(CLI::App& app);
// `normlab sample CHECKPOINT`: sequences or text from a train checkpoint (examples/cli/sample_cmd.cpp).
void register_sample(CLI::App& app);
// `normlab bench norms [CONFIG]`: LayerNorm vs RMSNorm, fused vs composed, fwd and fwd+bwd, GB/s vs a
// memory copy, peak memory and bytes saved for backward (examples/cli/bench_norms.cpp).
void register_bench_norms(CLI::App& bench);
// `normlab bench torch`: normlab vs PyTorch on CPU, the stability experiment's seconds per epoch and
// the toy transformer's tokens/s, side by side in one run (examples/cli/bench_torch.cpp).
void register_bench_torch(CLI::App& bench);

// `normlab export CHECKPOINT --to hf DIR | --to gguf FILE`: a model for transformers or llama.cpp
// (jobs/export.h, examples/cli/export_cmd.cpp).
void register_export(CLI::App& app);
// `normlab convert CHECKPOINT --to rmsnorm OUT`: a pre-norm LayerNorm model as the pre-norm RMSNorm
// model with the same function (jobs/convert.h, examples/cli/convert_cmd.cpp).
void register_convert(CLI::App& app);
// `normlab analyze MODEL --tokens DIR --out OUTDIR`: a trained model's activations, attention sinks,
// blocks and norm weights over held-out windows (jobs/analyze.h, examples/cli/analyze_cmd.cpp).
void register_analyze(CLI::App& app);

// `normlab stability CONFIG`: the seed article's norm stability experiment, swept (examples/cli/stability_cmd.cpp).
void register_stability(CLI::App& app);
// `normlab sweep CONFIG`: a grid of train runs with learning-rate sensitivity (jobs/sweep.h,
// examples/cli/sweep_cmd.cpp).
void register_sweep(CLI::App& app);
// `normlab gradcheck`: every norm (both forms) and layer checked in f64 (jobs/gradcheck.h,
// examples/cli/gradcheck_cmd.cpp).
void register_gradcheck(CLI::App& app);
// `normlab graph --layer NAME --dot out.dot`: a norm's autograd graph (jobs/norm_graph.h,
// examples/cli/graph_cmd.cpp).
void register_graph(CLI::App& app);
// `normlab config --schema JOB | --markdown JOB | ...`: the config schema (jobs/config_schema.h,
// examples/cli/config_cmd.cpp).
void register_config(CLI::App& app);
// `normlab norms [--example]`: the norm registry, or the explainer's worked example (examples/cli/norms_cmd.cpp).
void register_norms(CLI::App& app);

}  // namespace nl::cli
