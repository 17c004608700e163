// `normlab bench core`: the tensor core's overhead against the best it could do, measured in one run.
// matmul through nl::matmul vs a direct cblas_sgemm on the same buffers (target ratio >= 0.95), and
// large elementwise ops (add, mul, relu) in GB/s vs std::memcpy of the same size (target >= 0.7).
// Ours and the reference alternate per repetition (A B A B ...) so drift on a shared machine hits both.
// The fused cross-entropy at a GPT-2-sized vocabulary, in f32 vs memcpy and under bf16 autocast.
// Then the arithmetic peaks of one core: f32 FMA against AVX512-BF16's vdpbf16ps, which decide the
// bf16 gemm's engine (core/cpu/cpu_bgemm.cpp).
#include "examples/cli/commands.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define NL_BENCH_X86 1
#endif

#include "autograd/autograd.h"
#include "core/allocator.h"
#include "core/cpu_runtime.h"
#include "core/fused.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "examples/cli/bench_util.h"
#include "layers/autocast.h"
#include "layers/loss.h"

namespace nl::cli {

namespace {

struct BenchOptions {
    int reps = 7;
    bool quick = false;
};

std::string ms_cell(const Stats& s) {
    return fmt::format("{:8.3f} [{:.3f}, {:.3f}]", s.median * 1e3, s.min * 1e3, s.max * 1e3);
}

// One matmul shape: (m, k) @ (k, n). With trans_a, A is stored (k, m) and passed as the view A.t(),
// as the backward's x^T @ dy is.
struct MatmulCase {
    std::string label;
    int64_t m, k, n;
    bool trans_a = false;
};

void bench_matmul(const BenchOptions& opt, double min_sample_s) {
    std::vector<MatmulCase> cases;
    std::vector<int64_t> squares = opt.quick ? std::vector<int64_t>{256, 512} : std::vector<int64_t>{256, 512, 1024, 2048};
    for (int64_t s : squares) cases.push_back({fmt::format("square {}", s), s, s, s});
    // The stability experiment's MLP (1000 samples, 100 -> 256 -> 256 -> 10) and one backward product.
    cases.push_back({"x @ W1", 1000, 100, 256});
    cases.push_back({"h @ W2", 1000, 256, 256});
    cases.push_back({"h @ W3", 1000, 256, 10});
    cases.push_back({"x^T @ dy (view)", 100, 1000, 256, true});

    fmt::print("matmul, f32: nl::matmul vs cblas_sgemm on the same buffers (ms per call, median [min, max])\n");
    fmt::print("  {:<16} {:>24}  {:<26} {:<26} {:>8} {:>7} {:>9}\n", "case", "shape", "tensor API ms",
               "cblas_sgemm ms", "GFLOP/s", "ratio", "max|diff|");
    Generator gen(1234);
    for (const MatmulCase& c : cases) {
        Tensor a_store = c.trans_a ? randn({c.k, c.m}, gen) : randn({c.m, c.k}, gen);  // (k, m) or (m, k)
        Tensor a = c.trans_a ? a_store.t() : a_store;                                     // (m, k)
        Tensor b = randn({c.k, c.n}, gen);                                                // (k, n)
        Tensor ref = Tensor::empty({c.m, c.n});                                           // (m, n)
        const float* pa = a_store.data<float>();
        const float* pb = b.data<float>();
        float* pc = ref.data<float>();
        const int lda = static_cast<int>(c.trans_a ? c.m : c.k);

        Tensor ours;
        auto run_ours = [&] { ours = matmul(a, b); };
        auto run_ref = [&] {
            cblas_sgemm(CblasRowMajor, c.trans_a ? CblasTrans : CblasNoTrans, CblasNoTrans, static_cast<int>(c.m),
                        static_cast<int>(c.n), static_cast<int>(c.k), 1.0f, pa, lda, pb, static_cast<int>(c.n),
                        0.0f, pc, static_cast<int>(c.n));
        };
        auto [t_ours, t_ref] = time_interleaved(run_ours, run_ref, opt.reps, min_sample_s);

        // Both sides must have computed the same product, or the timing means nothing.
        Tensor out = ours.contiguous();
        const float* po = out.data<float>();
        double diff = 0;
        for (int64_t i = 0; i < c.m * c.n; ++i) diff = std::max(diff, static_cast<double>(std::fabs(po[i] - pc[i])));
        // Entries are sums of k products of N(0, 1) numbers (about sqrt(k) in size): f32 rounding of a
        // different summation order stays far below 1e-3 of that.
        NL_CHECK(diff <= 1e-3 * std::sqrt(static_cast<double>(c.k)), "bench core: matmul ", c.label,
                 " differs from cblas_sgemm by ", diff);

        const double gflops = 2.0 * c.m * c.n * c.k / t_ours.median * 1e-9;
        const std::string shape = c.trans_a ? fmt::format("({}x{})^T @ {}x{}", c.k, c.m, c.k, c.n)
                                            : fmt::format("{}x{} @ {}x{}", c.m, c.k, c.k, c.n);
        fmt::print("  {:<16} {:>24}  {:<26} {:<26} {:8.1f} {:7.3f} {:9.2g}\n", c.label, shape, ms_cell(t_ours),
                   ms_cell(t_ref), gflops, t_ref.median / t_ours.median, diff);
    }
    fmt::print("  ratio = cblas time / tensor time (target >= 0.95)\n\n");
}

void bench_elementwise(const BenchOptions& opt, double min_sample_s) {
    const int64_t mib = opt.quick ? 16 : 64;
    const int64_t n = mib * 1024 * 1024 / static_cast<int64_t>(sizeof(float));
    Generator gen(99);
    Tensor x = randn({n}, gen);  // (n,)
    Tensor y = randn({n}, gen);  // (n,)
    Tensor dst = Tensor::empty({n});
    const double nbytes = static_cast<double>(x.nbytes());

    // memcpy moves nbytes in and nbytes out; it is the bandwidth ceiling a streaming op can hope for.
    auto run_copy = [&] { std::memcpy(dst.data_ptr(), x.data_ptr(), static_cast<size_t>(x.nbytes())); };

    struct Case {
        std::string name;
        std::function<Tensor()> op;
        double bytes;  // read + written per call
    };
    std::vector<Case> cases = {
        {"add", [&] { return add(x, y); }, 3 * nbytes},
        {"mul", [&] { return mul(x, y); }, 3 * nbytes},
        {"relu", [&] { return relu(x); }, 2 * nbytes},
    };

    fmt::print("elementwise, f32, {} MiB tensors: GB/s (bytes read + written) vs std::memcpy of {} MiB\n", mib, mib);
    fmt::print("  {:<6} {:<26} {:>8}   {:<26} {:>8} {:>7}\n", "op", "tensor API ms", "GB/s", "memcpy ms", "GB/s",
               "ratio");
    for (const Case& c : cases) {
        Tensor out;
        auto run_ours = [&] { out = c.op(); };
        auto [t_ours, t_copy] = time_interleaved(run_ours, run_copy, opt.reps, min_sample_s);
        const double gbs_ours = c.bytes / t_ours.median * 1e-9;
        const double gbs_copy = 2 * nbytes / t_copy.median * 1e-9;
        fmt::print("  {:<6} {:<26} {:8.2f}   {:<26} {:8.2f} {:7.3f}\n", c.name, ms_cell(t_ours), gbs_ours,
                   ms_cell(t_copy), gbs_copy, gbs_ours / gbs_copy);
    }
    fmt::print("  ratio = tensor GB/s / memcpy GB/s (target >= 0.7); outputs are allocated by the op, as users see\n");

    // What the ops pay before computing anything: a fresh output's allocation and first-touch page
    // faults, against writing a buffer that is already mapped.
    auto run_fresh = [&] {
        Tensor t = Tensor::empty({n});
        std::memset(t.data_ptr(), 0, static_cast<size_t>(t.nbytes()));
    };
    auto run_mapped = [&] { std::memset(dst.data_ptr(), 0, static_cast<size_t>(dst.nbytes())); };
    auto [t_fresh, t_mapped] = time_interleaved(run_fresh, run_mapped, opt.reps, min_sample_s);
    fmt::print("  output allocation: a fresh {} MiB tensor allocated and written once: {:.3f} ms [{:.3f}, {:.3f}];\n"
               "  writing an already mapped buffer: {:.3f} ms [{:.3f}, {:.3f}]\n",
               mib, t_fresh.median * 1e3, t_fresh.min * 1e3, t_fresh.max * 1e3, t_mapped.median * 1e3,
               t_mapped.min * 1e3, t_mapped.max * 1e3);
}

// The loss of a language model's logits (rows x vocab), forward and backward, at GPT-2's padded
// vocabulary: in f32 against a memcpy of the logits (the kernels read each logit twice and write
// its gradient once), and under bf16 autocast read as bf16 against a cast to f32 first (what
// torch.autocast does), with each one's peak memory.
void bench_cross_entropy(const BenchOptions& opt, double min_sample_s) {
    const int64_t rows = opt.quick ? 256 : 2048, vocab = 50304;
    Generator gen(7);
    const Tensor logits = randn({rows, vocab}, gen) * 2.0;  // (rows, vocab) f32
    const Tensor logits_low = logits.to(DType::BF16);       // (rows, vocab) bf16
    std::vector<int64_t> ids(static_cast<size_t>(rows));
    for (int64_t& id : ids) id = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(vocab)));
    const Tensor targets = from_vector(ids, {rows});  // (rows) i64
    const Tensor one = scalar_tensor(1.0, DType::F32);
    Tensor dst = Tensor::empty({rows, vocab});
    const double nbytes = static_cast<double>(logits.nbytes());

    fmt::print("cross-entropy, {} x {} logits (rows x vocab), forward + backward (ms, median [min, max])\n", rows, vocab);
    auto run_f32 = [&] {
        const CrossEntropyForward f = cross_entropy_forward(logits, targets);
        cross_entropy_backward(one, logits, targets, f.lse);
    };
    auto run_copy = [&] { std::memcpy(dst.data_ptr(), logits.data_ptr(), static_cast<size_t>(logits.nbytes())); };
    auto [t_f32, t_memcpy] = time_interleaved(run_f32, run_copy, opt.reps, min_sample_s);
    const double gbs_f32 = 3 * nbytes / t_f32.median * 1e-9, gbs_copy = 2 * nbytes / t_memcpy.median * 1e-9;
    fmt::print("  f32 fused         {:<26} {:8.2f} GB/s   memcpy {:<26} {:8.2f} GB/s   ratio {:.3f}\n", ms_cell(t_f32),
               gbs_f32, ms_cell(t_memcpy), gbs_copy, gbs_f32 / gbs_copy);

    // Under autocast, as `train` computes the loss: a node over the logits, backward to them.
    auto autocast_loss = [&](bool through_copy) {
        Var z(logits_low, true);
        Var loss;
        {
            AutocastGuard autocast(DType::BF16);
            loss = cross_entropy_loss(through_copy ? autocast_f32(z) : z, targets);
        }
        loss.backward();
    };
    auto peak_of = [](const std::function<void()>& fn) {
        reset_peak(Device::cpu());
        const int64_t before = memory_stats(Device::cpu()).current_bytes;
        fn();
        return static_cast<double>(memory_stats(Device::cpu()).peak_bytes - before);
    };
    auto run_direct = [&] { autocast_loss(false); };
    auto run_through_copy = [&] { autocast_loss(true); };
    auto [t_direct, t_through] = time_interleaved(run_direct, run_through_copy, opt.reps, min_sample_s);
    fmt::print("  bf16 autocast, logits read as bf16 {:<26} peak {:>10}\n", ms_cell(t_direct),
               format_bytes(peak_of(run_direct)));
    fmt::print("  bf16 autocast, through an f32 copy {:<26} peak {:>10}   time / read as bf16 {:.3f}\n",
               ms_cell(t_through), format_bytes(peak_of(run_through_copy)), t_through.median / t_direct.median);
    fmt::print("  ratio = fused GB/s (logits read twice, gradient written once) / memcpy GB/s; train reads bf16 logits "
               "as they are\n\n");
}

#ifdef NL_BENCH_X86
// Register-only loops: 16 independent accumulators, so each instruction's throughput, not its
// latency, sets the pace. The operands are an identity-like product that keeps the sums finite.
__attribute__((target("avx512f"), noinline)) float fma_avx512_loop(int64_t trips) {
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
    __m512 x = _mm512_set1_ps(1.0f);
    const __m512 y = _mm512_set1_ps(1e-30f);
    for (int64_t t = 0; t < trips; ++t) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(x, y, acc[i]);
        __asm__ volatile("" : "+v"(x));  // keeps the loop from being folded
    }
    __m512 sum = acc[0];
    for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);
    float total = 0;
    for (float v : lanes) total += v;
    return total;
}
#endif

// GFLOP/s of one core for `loop` (16 instructions of flops_per_instruction per trip), median of reps.
double loop_gflops(float (*loop)(int64_t), double flops_per_instruction, int reps, int64_t trips) {
    std::vector<double> rates;
    volatile float sink = 0;
    for (int r = 0; r < reps + 1; ++r) {
        const auto start = std::chrono::steady_clock::now();
        sink = sink + loop(trips);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (r > 0) rates.push_back(16.0 * static_cast<double>(trips) * flops_per_instruction / s / 1e9);
    }
    return summarize(rates).median;
}

void bench_instruction_peaks(const BenchOptions& opt) {
    fmt::print("\narithmetic peak of one core (register-only loops, median of {} reps):\n", opt.reps);
#ifdef NL_BENCH_X86
    const int64_t trips = opt.quick ? 2000000 : 20000000;
    if (!__builtin_cpu_supports("avx512f")) {
        fmt::print("  skipped: this CPU lacks AVX-512\n");
        return;
    }
    const double fma = loop_gflops(fma_avx512_loop, 32.0, opt.reps, trips);
    fmt::print("  f32 FMA (vfmadd231ps zmm)        {:7.1f} GFLOP/s\n", fma);
    if (!__builtin_cpu_supports("avx512bf16")) {
        fmt::print("  vdpbf16ps: skipped (this CPU lacks AVX512-BF16)\n");
        return;
    }
    const double bf16 = loop_gflops(bgemm_avx512bf16_register_loop, 64.0, opt.reps, trips);
    fmt::print("  bf16 dot (vdpbf16ps zmm)         {:7.1f} GFLOP/s = {:.2f} x the f32 FMA\n", bf16, bf16 / fma);
    try {
        bgemm_amx_register_loop(0);
    } catch (const Error& e) {
        fmt::print("  tdpbf16ps: skipped ({})\n", e.what());
        return;
    }
    // 16 tdpbf16ps per trip, each 16 x 16 x 32 products: 16,384 FLOP (loop_gflops counts 16 per trip).
    const double tiles = loop_gflops(bgemm_amx_register_loop, 16384.0, opt.reps, trips / 64);
    fmt::print("  bf16 tiles (AMX tdpbf16ps)       {:7.1f} GFLOP/s = {:.2f} x the f32 FMA\n", tiles, tiles / fma);
#else
    fmt::print("  skipped: not an x86-64 build\n");
#endif
}

void run_bench_core(const BenchOptions& opt) {
    NL_REQUIRE(opt.reps >= 1, "bench core: --reps must be at least 1, found ", opt.reps);
    fmt::print("normlab bench core: {} reps per case, interleaved; OpenBLAS {} threads ({}), OpenMP {} threads\n\n",
               opt.reps, openblas_get_num_threads(), openblas_get_corename(), omp_get_max_threads());
    const double min_sample_s = opt.quick ? 0.005 : 0.02;
    bench_matmul(opt, min_sample_s);
    bench_elementwise(opt, min_sample_s);
    bench_cross_entropy(opt, min_sample_s);
    bench_instruction_peaks(opt);
}

}  // namespace

void register_bench_core(CLI::App& bench) {
    auto opt = std::make_shared<BenchOptions>();
    CLI::App* cmd = bench.add_subcommand("core", "matmul vs direct cblas_sgemm; add/mul/relu vs memcpy bandwidth");
    CLI::Option* reps = cmd->add_option("--reps", opt->reps, "repetitions per case (median and min/max reported)")
                            ->capture_default_str();
    cmd->add_flag("--quick", opt->quick, "fewer sizes, 16 MiB tensors, 3 reps (a smoke run, not a measurement)");
    cmd->callback([opt, reps] {
        BenchOptions o = *opt;
        if (o.quick && reps->count() == 0) o.reps = 3;  // an explicit --reps wins over --quick's default
        run_bench_core(o);
    });
}

}  // namespace nl::cli
