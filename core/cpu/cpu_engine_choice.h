// How the CPU backend picks its gemm engines (f32: normlab's kernels or OpenBLAS; bf16: AMX tiles,
// vdpbf16ps or widened to the f32 engine): by measuring them on this machine, not by a list of CPUs.
// The first process that needs an engine times each one this CPU runs on a short gemm of a training
// step's shape and takes the fastest; the choice and the measured rates are kept per machine in a
// cache file, so every later run on the machine uses the same engine and so computes the same bits
// (engines sum in different orders). NORMLAB_GEMM and NORMLAB_GEMM_BF16 still force an engine.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace nl {

struct EngineRate {
    std::string key;      // the engine's name for its variable: "avx512", "openblas", "amx", ...
    std::string why_not;  // empty where this CPU runs it, else why not (it is never chosen then)
    double gflops = 0.0;  // measured on this machine
};

// A later engine must be this much faster than an earlier one to be chosen over it: the candidates
// are listed in the order of preference (normlab's own kernels first: their bits do not depend on
// the thread count), and rates within a few percent of each other are one machine's noise.
inline constexpr double kEngineMargin = 1.10;

// The index of the engine to use among those this CPU runs: the first, unless a later one is
// kEngineMargin times as fast as the best so far; an nl::Error when none runs.
size_t fastest_engine(const std::vector<EngineRate>& rates);

// Whether engine `faster` runs here and is at least kEngineMargin times as fast as `than` (which
// counts as 0 GFLOP/s where it does not run): the same margin as the choice, so noise does not flip
// it. The fused attention on bf16 runs on vdpbf16ps where "avx512bf16" beats "f32" (the widened engine).
bool engine_beats(const std::vector<EngineRate>& rates, const std::string& faster, const std::string& than);

struct EngineChoice {
    std::string key;                // the chosen engine
    std::vector<EngineRate> rates;  // every candidate, with its rate where this CPU runs it
    std::string source;             // "measured now, kept in FILE", "measured earlier (FILE)", ...
    // "avx512 151.2, avx2 120.0, openblas 98.1 GFLOP/s": for `normlab info` and the reasons.
    std::string rates_text() const;
};

// One gemm of the probe shape on the named engine.
using EngineProbe = std::function<void(const std::string& key)>;

// The choice of `kind` ("f32" or "bf16") among `candidates` (their why_not filled in): the cache's
// where it holds one for this machine and exactly these engines, else measured, while the cache is
// locked (so two processes starting together measure once), and stored. Measuring runs `probe` on
// one thread (the rate of a core: a team is slowed by a core busy elsewhere) on every engine this
// CPU runs in turn, round after round, and keeps each engine's best time, so a moment of load
// elsewhere on the machine falls on every engine alike. Without a usable cache file
// it measures in every process.
EngineChoice choose_engine_by_rate(const std::string& kind, std::vector<EngineRate> candidates,
                                   const EngineProbe& probe, double probe_flops);

// The cache file: NORMLAB_ENGINE_CACHE (a path, or "off" for none: "" is returned), else
// $XDG_CACHE_HOME/normlab/gemm_engines.json, else $HOME/.cache/normlab/gemm_engines.json.
std::string engine_cache_path();

// What identifies this machine in the cache: the CPU's model name, its vector support, normlab's
// version (a new version may have faster kernels) and the probe's (a cache measured another way, or
// on kernels since made faster, is measured again: raise it when an engine's speed changes).
std::string engine_cache_machine();
inline constexpr int kEngineProbeVersion = 3;

// The shape every engine is timed on: the query projection of a nanoGPT-sized step (384 wide, 2048
// tokens in a batch), cut to 512 rows so that it takes a few milliseconds: C (m, n) = A (m, k) B^T,
// B stored (n, k), as a Linear's forward.
inline constexpr int64_t kEngineProbeM = 512, kEngineProbeN = 384, kEngineProbeK = 384;
inline constexpr double kEngineProbeFlops = 2.0 * double(kEngineProbeM) * double(kEngineProbeN) * double(kEngineProbeK);

// The probe's operands, the same for every engine (small values, exact in bf16): A (m, k) and B (n, k).
struct EngineProbeOperands {
    std::vector<float> a, b;
    EngineProbeOperands();
};

}  // namespace nl
