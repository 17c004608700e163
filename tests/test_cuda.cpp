// CUDA backend against the CPU backend, ggml test-backend-ops style: every Backend kernel runs on the
// same random input on both devices (through the tensor ops that call it, including strided views,
// broadcasting, size-1 and empty dims) and the results are compared with a tolerance stated per
// dtype below. Without a GPU (or in a build without CUDA) each test reports itself skipped by name
// with a "SKIPPED: no CUDA device" warning, which CTest turns into a Skipped status (see
// CMakeLists.txt); only the no-device error tests run everywhere.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "layers/linear.h"
#include "layers/norms.h"
#include "layers/transformer.h"
#include "kernel_workload.h"
#include "layers_test_util.h"

#include "core/fused.h"
#include "core/ops.h"
#include "core/tensor.h"
#ifdef NORMLAB_HAVE_CUDA
#include "core/cuda/nl_cuda_api.h"
#endif

using namespace nl;

namespace {

bool have_cuda_device() {
#ifdef NORMLAB_HAVE_CUDA
    return cuda_device_count() > 0;
#else
    return false;
#endif
}

// Every GPU test starts with this: without a device it warns with the test's name and returns, so
// the test is reported skipped, never silently passed.
#define CUDA_TEST_OR_SKIP()                                                                           \
    do {                                                                                              \
        if (!have_cuda_device()) {                                                                    \
            WARN("SKIPPED: no CUDA device: " << Catch::getResultCapture().getCurrentTestName());      \
            return;                                                                                   \
        }                                                                                             \
    } while (0)

const Device kGpu = Device::cuda(0);

// Tolerances per dtype (relative to max(1, |cpu|), so also absolute near zero). The reductions sum
// in double on both; the GPU's row kernels (the norms' statistics) in f32 for f32/bf16/f16 rows and
// in tree order, and CUDA's f32 transcendentals
// are within 2 ulp: f32 agrees to ~1e-6 relative; bf16 (8 mantissa bits) and f16 (11) may differ by
// one unit in the last place after rounding the same f32 value from either side of a tie.
double tolerance(DType dtype) {
    switch (dtype) {
        case DType::F64: return 1e-11;
        case DType::F32: return 2e-5;
        case DType::BF16: return 1e-2;
        case DType::F16: return 2e-3;
        case DType::I64: return 0.0;
    }
    return 0.0;
}

// The GPU result, copied back, equals the CPU result within `tol` (NaN matches NaN, inf matches inf).
void require_close(const Tensor& cpu, const Tensor& gpu, double tol, const std::string& what) {
    INFO(what);
    REQUIRE(gpu.device() == kGpu);
    REQUIRE(cpu.shape() == gpu.shape());
    REQUIRE(cpu.dtype() == gpu.dtype());
    const std::vector<double> want = cpu.to_vector();
    const std::vector<double> got = gpu.to(Device::cpu()).to_vector();
    double worst = 0.0;
    size_t worst_at = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        const double w = want[i], g = got[i];
        if (std::isnan(w) || std::isnan(g)) {
            INFO("element " << i << ": cpu " << w << " gpu " << g);
            REQUIRE(std::isnan(w) == std::isnan(g));
            continue;
        }
        if (std::isinf(w) || std::isinf(g)) {
            INFO("element " << i << ": cpu " << w << " gpu " << g);
            REQUIRE(w == g);
            continue;
        }
        const double err = std::abs(g - w) / std::max(1.0, std::abs(w));
        if (err > worst) {
            worst = err;
            worst_at = i;
        }
    }
    INFO("worst element " << worst_at << " relative error " << worst << " (tolerance " << tol << ")");
    REQUIRE(worst <= tol);
}

void require_close(const Tensor& cpu, const Tensor& gpu, const std::string& what) {
    require_close(cpu, gpu, tolerance(cpu.dtype()), what);
}

// Bitwise equality of two GPU results (determinism checks).
void require_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
    INFO(what);
    const std::vector<double> x = a.to(Device::cpu()).to_vector();
    const std::vector<double> y = b.to(Device::cpu()).to_vector();
    REQUIRE(x.size() == y.size());
    for (size_t i = 0; i < x.size(); ++i) REQUIRE((x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]))));
}

Tensor random_normal(const Shape& shape, uint64_t seed, DType dtype = DType::F32) {
    Generator gen(seed);
    return randn(shape, gen, DType::F64).to(dtype);
}

Tensor random_uniform(const Shape& shape, uint64_t seed, double low, double high, DType dtype = DType::F32) {
    Generator gen(seed);
    return uniform(shape, low, high, gen, DType::F64).to(dtype);
}

Tensor random_indices(const Shape& shape, int64_t bound, uint64_t seed) {
    Generator gen(seed);
    std::vector<int64_t> values(static_cast<size_t>(shape_numel(shape)));
    for (int64_t& v : values) v = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(bound)));
    return from_vector(values, shape);
}

Tensor gpu(const Tensor& t) { return t.to(kGpu); }

}  // namespace

// ---- runs everywhere: a missing device is a clear error ----

TEST_CASE("cuda: asking for a missing CUDA device throws a clear error", "[cuda]") {
#ifdef NORMLAB_HAVE_CUDA
    REQUIRE_THROWS_WITH(Tensor::empty({2}, DType::F32, Device::cuda(99)), Catch::Contains("cuda:99: no such CUDA device"));
    REQUIRE_THROWS_WITH(backend_for(Device::cuda(99)), Catch::Contains("no such CUDA device"));
    REQUIRE(cuda_device_descriptions().size() == static_cast<size_t>(cuda_device_count()));
    if (cuda_device_count() == 0) {
        REQUIRE_THROWS_WITH(zeros({2}, DType::F32, Device::cuda(0)), Catch::Contains("no usable GPU found"));
        REQUIRE_THROWS_WITH(from_vector(std::vector<double>{1.0}, {1}).to(Device::cuda(0)),
                            Catch::Contains("cuda:0: no such CUDA device"));
    }
#else
    REQUIRE_THROWS_WITH(Tensor::empty({2}, DType::F32, Device::cuda(0)), Catch::Contains("built without CUDA"));
#endif
}

// ---- memory ----

TEST_CASE("cuda: host <-> device copies round-trip every dtype exactly", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    Tensor x = random_normal({3, 5, 7}, 1, DType::F64) * 100.0;
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64}) {
        const Tensor host = x.to(dtype);
        require_close(host, gpu(host), 0.0, std::string("round trip ") + dtype_name(dtype));
    }
    // i64 beyond 2^53 must survive (no trip through a double).
    const Tensor big = from_vector(std::vector<int64_t>{(int64_t(1) << 60) + 1, -((int64_t(1) << 62) + 3), 7}, {3});
    REQUIRE(gpu(big).to(Device::cpu()).to_vector_as<int64_t>() == big.to_vector_as<int64_t>());
    // empty and scalar tensors
    require_close(zeros({0, 4}), gpu(zeros({0, 4})), 0.0, "empty");
    require_close(scalar_tensor(3.5), gpu(scalar_tensor(3.5)), 0.0, "scalar");
}

TEST_CASE("cuda: device copies convert between every pair of dtypes as the CPU does", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    // Values that exercise rounding, saturation, NaN and inf in each conversion.
    std::vector<double> values = {0.0, -0.0, 1.0, -1.5, 2.5, 1e-8, 65504.0, 70000.0, 3.0e38, -7.25,
                                  1.0 / 3.0, 123456789.0, std::numeric_limits<double>::infinity(),
                                  std::numeric_limits<double>::quiet_NaN(), 1e30, -2.75};
    const Tensor base = from_vector(values, {4, 4}, DType::F64);
    for (DType from : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64}) {
        const Tensor src = base.to(from);
        const Tensor src_gpu = gpu(src);
        for (DType to : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64}) {
            const std::string what = std::string(dtype_name(from)) + " -> " + dtype_name(to);
            require_close(src.to(to), src_gpu.to(to), 0.0, what);
            // a strided (transposed) source through the same kernel
            require_close(src.t().to(to), src_gpu.t().to(to), 0.0, what + " transposed");
        }
    }
}

TEST_CASE("cuda: copies between two GPUs keep every dtype exactly, and each GPU computes", "[cuda]") {
    CUDA_TEST_OR_SKIP();
#ifdef NORMLAB_HAVE_CUDA
    if (cuda_device_count() < 2) {
        // Same skip wording as above, so ctest reports it skipped; device_check.sh accepts this one on a
        // one-GPU machine. (The emulator runs it with NL_EMU_DEVICES=2, as .ci/run does.)
        WARN("SKIPPED: no CUDA device cuda:1 (one GPU here): " << Catch::getResultCapture().getCurrentTestName());
        return;
    }
    const Device second = Device::cuda(1);
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64}) {
        const Tensor x = (random_normal({3, 7}, 36, DType::F64) * 100.0).to(dtype);
        const Tensor on_second = gpu(x).to(second);
        REQUIRE(on_second.device() == second);
        require_close(x, on_second.to(kGpu), 0.0, std::string("cuda:0 -> cuda:1 -> cuda:0 ") + dtype_name(dtype));
        REQUIRE(on_second.to(Device::cpu()).to_vector() == x.to_vector());
    }
    const Tensor a = random_normal({5, 6}, 37), b = random_normal({6, 4}, 38);
    const Tensor product = matmul(a.to(second), b.to(second));
    REQUIRE(product.device() == second);
    require_close(matmul(a, b), product.to(kGpu), 1e-5, "matmul on cuda:1");
#endif
}

TEST_CASE("cuda: seeded random tensors on the GPU are the CPU's numbers", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    // Drawn on the host by the same Philox generator, then copied (there is no device RNG kernel).
    for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
        Generator cpu_gen(46), gpu_gen(46);
        require_close(randn({5, 7}, cpu_gen, dtype), randn({5, 7}, gpu_gen, dtype, kGpu), 0.0, "randn");
        require_close(rand({9}, cpu_gen, dtype), rand({9}, gpu_gen, dtype, kGpu), 0.0, "rand");
        require_close(uniform({3, 3}, -2.0, 5.0, cpu_gen, dtype), uniform({3, 3}, -2.0, 5.0, gpu_gen, dtype, kGpu),
                      0.0, "uniform");
    }
}

TEST_CASE("cuda: strided copies, broadcast copy_ and fill match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    const Tensor x = random_normal({4, 6, 5}, 2);
    const Tensor xg = gpu(x);
    require_close(x.permute({2, 0, 1}).contiguous(), xg.permute({2, 0, 1}).contiguous(), 0.0, "permute");
    require_close(x.slice(1, 1, 6, 2).contiguous(), xg.slice(1, 1, 6, 2).contiguous(), 0.0, "step slice");
    Tensor dst = zeros({3, 4, 5}), dst_gpu = zeros({3, 4, 5}, DType::F32, kGpu);
    dst.copy_(x.select(1, 2).unsqueeze(1).narrow(0, 0, 1).expand({3, 4, 5}));
    dst_gpu.copy_(xg.select(1, 2).unsqueeze(1).narrow(0, 0, 1).expand({3, 4, 5}));
    require_close(dst, dst_gpu, 0.0, "broadcast copy_");
    // copy_ from the host into a strided device view
    Tensor target = zeros({5, 4}, DType::F32, kGpu);
    Tensor target_cpu = zeros({5, 4});
    target.t().copy_(x.select(2, 0).narrow(1, 0, 5));  // [4, 5] host slice into the [4, 5] transposed view
    target_cpu.t().copy_(x.select(2, 0).narrow(1, 0, 5));
    require_close(target_cpu, target, 0.0, "host -> strided device view");
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64}) {
        for (double v : {0.0, -2.7, 1e9}) {
            require_close(full({3, 2, 5}, v, dtype), full({3, 2, 5}, v, dtype, kGpu), 0.0,
                          std::string("fill ") + dtype_name(dtype));
            Tensor part = zeros({4, 6}, dtype, kGpu), part_cpu = zeros({4, 6}, dtype);
            part.slice(1, 0, 6, 2).fill_(v);
            part_cpu.slice(1, 0, 6, 2).fill_(v);
            require_close(part_cpu, part, 0.0, std::string("strided fill ") + dtype_name(dtype));
        }
    }
}

TEST_CASE("cuda: allocator counts current and peak bytes and reuses freed blocks", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    reset_peak(kGpu);
    const MemoryStats before = memory_stats(kGpu);
    {
        Tensor a = Tensor::empty({1000}, DType::F32, kGpu);
        const MemoryStats during = memory_stats(kGpu);
        REQUIRE(during.current_bytes == before.current_bytes + 4000);
        REQUIRE(during.peak_bytes >= during.current_bytes);
        REQUIRE(during.allocations == before.allocations + 1);
    }
    const MemoryStats after = memory_stats(kGpu);
    REQUIRE(after.current_bytes == before.current_bytes);
    REQUIRE(after.peak_bytes == before.current_bytes + 4000);
    reset_peak(kGpu);
    REQUIRE(memory_stats(kGpu).peak_bytes == after.current_bytes);
}

TEST_CASE("cuda: an allocation larger than the GPU throws a clear error and loses nothing", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    Tensor kept = random_normal({1000}, 35).to(kGpu);
    const MemoryStats before = memory_stats(kGpu);
    // 2^42 f32 elements = 16 TiB, far more than any GPU has: cudaMalloc fails and the allocator, after
    // emptying its cache and trying once more, throws naming the device and the size.
    REQUIRE_THROWS_WITH(Tensor::empty({int64_t{1} << 42}, DType::F32, kGpu),
                        Catch::Contains("out of CUDA memory on cuda:0") && Catch::Contains("17592186044416 bytes"));
    REQUIRE(memory_stats(kGpu).current_bytes == before.current_bytes);
    // The device still works: the kept tensor is intact and new allocations succeed.
    require_close(random_normal({1000}, 35), kept, 0.0, "kept tensor after the failed allocation");
    require_close(random_normal({1000}, 35) * 2.0, kept * 2.0, 0.0, "a kernel after the failed allocation");
}

// ---- elementwise ----

TEST_CASE("cuda: binary ops with broadcasting and strided views match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64}) {
        const Tensor a = random_normal({4, 1, 6}, 3, dtype);
        const Tensor b = random_normal({5, 6}, 4, dtype);
        const Tensor pa = random_uniform({3, 7}, 5, 0.1, 3.0, dtype);
        const Tensor pb = random_normal({7, 3}, 6, dtype).t();  // non-contiguous
        const Tensor ag = gpu(a), bg = gpu(b), pag = gpu(pa), pbg = gpu(pb);
        const std::string d = dtype_name(dtype);
        require_close(add(a, b), add(ag, bg), "add " + d);
        require_close(sub(a, b), sub(ag, bg), "sub " + d);
        require_close(mul(a, b), mul(ag, bg), "mul " + d);
        require_close(div(a, b), div(ag, bg), "div " + d);
        require_close(pow(pa, pb), pow(pag, pbg), "pow " + d);
        require_close(maximum(a, b), maximum(ag, bg), "maximum " + d);
        require_close(minimum(a, b), minimum(ag, bg), "minimum " + d);
        const Tensor ar = a.slice(2, 0, 6, 2), br = b.slice(1, 1, 6, 2).select(0, 1);  // [4,1,3] vs [3]
        const Tensor arg = ag.slice(2, 0, 6, 2), brg = bg.slice(1, 1, 6, 2).select(0, 1);
        require_close(eq(ar, ar), eq(arg, arg), "eq " + d);
        require_close(ne(ar, br), ne(arg, brg), "ne " + d);
        require_close(lt(ar, br), lt(arg, brg), "lt " + d);
        require_close(le(ar, br), le(arg, brg), "le " + d);
        require_close(gt(ar, br), gt(arg, brg), "gt " + d);
        require_close(ge(ar, br), ge(arg, brg), "ge " + d);
        require_close(add(a, 2.5), add(ag, 2.5), "add scalar " + d);
        require_close(silu_backward(a, b * 4.0), silu_backward(ag, bg * 4.0), "silu_backward " + d);
        require_close(add(zeros({0, 6}, dtype), b.select(0, 0)), add(zeros({0, 6}, dtype, kGpu), bg.select(0, 0)),
                      "empty " + d);
        // In place, into a transposed view (the autograd engine sums gradients this way).
        Tensor sum_cpu = random_normal({6, 5}, 7, dtype), sum_gpu = gpu(sum_cpu);
        Tensor view_cpu = sum_cpu.t(), view_gpu = sum_gpu.t();  // [5, 6]
        add_(view_cpu, b);
        add_(view_gpu, bg);
        require_close(sum_cpu, sum_gpu, "add_ " + d);
    }
    // Autocast's f32 + bf16/f16 sum, b widened as it is read, broadcast and strided, and in place.
    for (DType half : {DType::BF16, DType::F16}) {
        const Tensor a = random_normal({4, 5, 6}, 8, DType::F32), b = random_normal({6, 5}, 9, DType::F32).to(half).t();
        const Tensor ag = gpu(a), bg = gpu(b);
        require_close(add_widened(a, b), add_widened(ag, bg), std::string("add_widened ") + dtype_name(half));
        Tensor in_cpu = a.clone(), in_gpu = gpu(a);
        add_widened_(in_cpu, b);
        add_widened_(in_gpu, bg);
        require_close(in_cpu, in_gpu, std::string("add_widened_ ") + dtype_name(half));
    }
    // NaN handling of maximum/minimum
    const Tensor n = from_vector(std::vector<double>{std::nan(""), 1.0, 2.0}, {3});
    const Tensor m = from_vector(std::vector<double>{0.0, std::nan(""), 3.0}, {3});
    require_close(maximum(n, m), maximum(gpu(n), gpu(m)), "maximum NaN");
    require_close(minimum(n, m), minimum(gpu(n), gpu(m)), "minimum NaN");
}

TEST_CASE("cuda: unary ops match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64}) {
        const Tensor x = (random_normal({7, 9}, 7, dtype) * 4.0).t();  // non-contiguous, wide range
        const Tensor p = random_uniform({50}, 8, 0.01, 20.0, dtype);
        const Tensor xg = gpu(x), pg = gpu(p);
        const std::string d = dtype_name(dtype);
        require_close(neg(x), neg(xg), "neg " + d);
        require_close(exp(x), exp(xg), "exp " + d);
        require_close(log(p), log(pg), "log " + d);
        require_close(sqrt(p), sqrt(pg), "sqrt " + d);
        require_close(rsqrt(p), rsqrt(pg), "rsqrt " + d);
        require_close(abs(x), abs(xg), "abs " + d);
        require_close(relu(x), relu(xg), "relu " + d);
        require_close(silu(x), silu(xg), "silu " + d);
        require_close(sigmoid(x * 30.0), sigmoid(xg * 30.0), "sigmoid (large |x|) " + d);
        require_close(tanh(x), tanh(xg), "tanh " + d);
        require_close(gelu(x), gelu(xg), "gelu " + d);
        require_close(sign(x), sign(xg), "sign " + d);
        require_close(square(x), square(xg), "square " + d);
    }
}

TEST_CASE("cuda: where, masked_fill, tril and cat match the CPU for every dtype", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    const Tensor c = gt(random_normal({4, 1, 5}, 9), 0.0);  // f32 0/1 condition, broadcast
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64}) {
        const Tensor a = (random_normal({3, 5}, 10, DType::F64) * 10.0).to(dtype);
        const Tensor b = (random_normal({4, 3, 1}, 11, DType::F64) * 10.0).to(dtype);
        for (DType cond_dtype : {DType::F32, DType::F64, DType::BF16, DType::I64}) {
            const Tensor cd = c.to(cond_dtype);
            require_close(where(cd, a, b), where(gpu(cd), gpu(a), gpu(b)), 0.0,
                          std::string("where ") + dtype_name(dtype) + " cond " + dtype_name(cond_dtype));
        }
    }
    const Tensor x = random_normal({2, 4, 4}, 12);
    const Tensor mask = gt(random_normal({4, 4}, 13), 0.5);
    require_close(masked_fill(x, mask, -1e9), masked_fill(gpu(x), gpu(mask), -1e9), "masked_fill");
    require_close(tril(x, 0), tril(gpu(x), 0), "tril");
    const Tensor y = random_normal({2, 3, 4}, 14);
    require_close(cat({x, y}, 1), cat({gpu(x), gpu(y)}, 1), "cat dim 1");
    require_close(cat({x.transpose(1, 2), y.transpose(1, 2)}, 2), cat({gpu(x).transpose(1, 2), gpu(y).transpose(1, 2)}, 2),
                  "cat strided");
}

// ---- reductions and softmax ----

TEST_CASE("cuda: reductions over every axis layout match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64}) {
        const std::string d = dtype_name(dtype);
        // len > 32 with inner == 1 (one block per row), short rows, and inner > 1 (columns).
        for (const Shape& shape : {Shape{6, 1000}, Shape{300, 5}, Shape{3, 70, 9}, Shape{2, 1, 4}}) {
            const Tensor x = random_normal(shape, 15, dtype) + 3.0;
            const Tensor xg = gpu(x);
            for (int64_t dim = 0; dim < static_cast<int64_t>(shape.size()); ++dim) {
                const std::string what = d + " " + shape_str(shape) + " dim " + std::to_string(dim);
                require_close(sum(x, {dim}), sum(xg, {dim}), "sum " + what);
                require_close(mean(x, {dim}), mean(xg, {dim}), "mean " + what);
                require_close(max(x, {dim}), max(xg, {dim}), "max " + what);
                require_close(min(x, {dim}), min(xg, {dim}), "min " + what);
                require_close(var(x, {dim}), var(xg, {dim}), "var " + what);
                require_close(var(x, {dim}, 0), var(xg, {dim}, 0), "var biased " + what);
                require_close(sum_of_squares(x, {dim}), sum_of_squares(xg, {dim}), "sum_of_squares " + what);
                require_close(argmax(x, dim), argmax(xg, dim), 0.0, "argmax " + what);
            }
            require_close(sum(x), sum(xg), "sum all " + d);
            require_close(sum_of_squares(x), sum_of_squares(xg), "sum_of_squares all " + d);
        }
        // empty reduced dim: sum 0, mean NaN
        require_close(sum(zeros({3, 0}, dtype), {1}), sum(zeros({3, 0}, dtype, kGpu), {1}), "sum empty " + d);
        require_close(mean(zeros({3, 0}, dtype), {1}), mean(zeros({3, 0}, dtype, kGpu), {1}), "mean empty " + d);
    }
    // argmax ties (first max wins) and NaN (first NaN wins), in a long row and in columns
    std::vector<double> v(100, 1.0);
    v[40] = 5.0;
    v[70] = 5.0;
    const Tensor ties = from_vector(v, {1, 100});
    require_close(argmax(ties, 1), argmax(gpu(ties), 1), 0.0, "argmax ties row");
    require_close(argmax(ties.t(), 0), argmax(gpu(ties).t(), 0), 0.0, "argmax ties column");
    v[60] = std::nan("");
    v[90] = std::nan("");
    const Tensor nans = from_vector(v, {1, 100});
    require_close(argmax(nans, 1), argmax(gpu(nans), 1), 0.0, "argmax NaN row");
    require_close(max(nans, {1}), max(gpu(nans), {1}), "max NaN row");
    require_close(min(nans, {1}), min(gpu(nans), {1}), "min NaN row");
}

TEST_CASE("cuda: softmax and log_softmax forward and backward match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64}) {
        for (const Shape& shape : {Shape{5, 7}, Shape{3, 1000}, Shape{2, 3, 300}}) {
            const Tensor x = random_normal(shape, 16, dtype) * 5.0 + 500.0;  // large offset: needs the max shift
            const Tensor dy = random_normal(shape, 17, dtype);
            const Tensor xg = gpu(x), dyg = gpu(dy);
            const std::string what = std::string(dtype_name(dtype)) + " " + shape_str(shape);
            const Tensor y = softmax(x, -1), yg = softmax(xg, -1);
            require_close(y, yg, "softmax " + what);
            require_close(softmax_backward(y, dy, -1), softmax_backward(yg, dyg, -1), "softmax backward " + what);
            const Tensor ly = log_softmax(x, -1), lyg = log_softmax(xg, -1);
            require_close(ly, lyg, "log_softmax " + what);
            require_close(log_softmax_backward(ly, dy, -1), log_softmax_backward(lyg, dyg, -1),
                          "log_softmax backward " + what);
        }
    }
}

// ---- matmul ----

TEST_CASE("cuda: matmul (cuBLAS, TF32 off) matches the CPU for 2-D, batched, broadcast and transposed", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64}) {
        // f32: sums of ~100 products computed in a different order: a few ulp of the sum's magnitude.
        const double tol = dtype == DType::F32 ? 1e-4 : 1e-11;
        const std::string d = dtype_name(dtype);
        const Tensor a = random_normal({17, 33}, 18, dtype), b = random_normal({33, 9}, 19, dtype);
        require_close(matmul(a, b), matmul(gpu(a), gpu(b)), tol, "2-D " + d);
        require_close(matmul(b.t(), a.t()), matmul(gpu(b).t(), gpu(a).t()), tol, "transposed " + d);
        const Tensor ba = random_normal({4, 5, 33}, 20, dtype), bb = random_normal({4, 33, 6}, 21, dtype);
        require_close(matmul(ba, bb), matmul(gpu(ba), gpu(bb)), tol, "batched " + d);
        require_close(matmul(ba, b), matmul(gpu(ba), gpu(b)), tol, "broadcast right " + d);
        require_close(matmul(a.narrow(0, 0, 5), bb), matmul(gpu(a).narrow(0, 0, 5), gpu(bb)), tol, "broadcast left " + d);
        require_close(matmul(bb.transpose(1, 2), ba.transpose(1, 2)), matmul(gpu(bb).transpose(1, 2), gpu(ba).transpose(1, 2)),
                      tol, "batched transposed " + d);
        const Tensor v = random_normal({33}, 22, dtype);
        require_close(matmul(a, v), matmul(gpu(a), gpu(v)), tol, "matrix-vector " + d);
        require_close(matmul(zeros({3, 0}, dtype), zeros({0, 4}, dtype)),
                      matmul(zeros({3, 0}, dtype, kGpu), zeros({0, 4}, dtype, kGpu)), 0.0, "k = 0 " + d);
    }
}

// ---- indexing ----

TEST_CASE("cuda: index_select, index_add, gather, scatter_add and embedding match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64}) {
        const std::string d = dtype_name(dtype);
        const Tensor x = random_normal({5, 8, 3}, 23, dtype);
        const Tensor idx = random_indices({11}, 8, 24);  // repeats: accumulation order matters
        const Tensor xg = gpu(x), idxg = gpu(idx);
        require_close(index_select(x, 1, idx), index_select(xg, 1, idxg), 0.0, "index_select " + d);
        const Tensor src = random_normal({5, 11, 3}, 25, dtype);
        const Tensor added = index_add(x, 1, idx, src), added_gpu = index_add(xg, 1, idxg, gpu(src));
        require_close(added, added_gpu, "index_add " + d);
        require_same_bits(added_gpu, index_add(xg, 1, idxg, gpu(src)), "index_add deterministic " + d);
        const Tensor gidx = random_indices({5, 6, 3}, 8, 26);
        require_close(gather(x, 1, gidx), gather(xg, 1, gpu(gidx)), 0.0, "gather " + d);
        const Tensor gsrc = random_normal({5, 6, 3}, 27, dtype);
        const Tensor scattered_gpu = scatter_add(xg, 1, gpu(gidx), gpu(gsrc));
        require_close(scatter_add(x, 1, gidx, gsrc), scattered_gpu, "scatter_add " + d);
        require_same_bits(scattered_gpu, scatter_add(xg, 1, gpu(gidx), gpu(gsrc)), "scatter_add deterministic " + d);
        const Tensor table = random_normal({10, 16}, 28, dtype);
        const Tensor ids = random_indices({4, 7}, 10, 29);
        require_close(embedding(table, ids), embedding(gpu(table), gpu(ids)), 0.0, "embedding " + d);
    }
}

// ---- fused kernels ----

TEST_CASE("cuda: fused norms forward and backward match the CPU for every variant and dtype", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    struct Variant {
        const char* name;
        bool subtract_mean, weight, bias;
        double p;  // pRMSNorm fraction; 1 = all d
    };
    const Variant variants[] = {{"layernorm", true, true, true, 1.0}, {"layernorm no affine", true, false, false, 1.0},
                                {"rmsnorm", false, true, false, 1.0}, {"rmsnorm bias", false, true, true, 1.0},
                                {"prmsnorm", false, true, false, 0.25}};
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
        // Rows up to 8192 wide are one register tile per block (core/cuda/cuda_norms.cu); 9001 takes the
        // path that re-reads two tiles per pass.
        for (const Shape& shape : {Shape{6, 5, 48}, Shape{3, 1000}, Shape{1, 7}, Shape{0, 16}, Shape{3, 9001}}) {
            const int64_t d = shape.back();
            const Tensor x = (random_normal(shape, 30, DType::F64) * 2.0 + 1.0).to(dtype);
            const Tensor dy = random_normal(shape, 31, dtype);
            const Tensor w = (random_normal({d}, 32, DType::F64) * 0.5 + 1.0).to(dtype);
            const Tensor b = random_normal({d}, 33, dtype);
            for (const Variant& v : variants) {
                const std::string what = std::string(v.name) + " " + dtype_name(dtype) + " " + shape_str(shape);
                const int64_t k = partial_stat_count(d, v.p);
                const Tensor wc = v.weight ? w : Tensor(), bc = v.bias ? b : Tensor();
                const Tensor wg = v.weight ? gpu(w) : Tensor(), bg = v.bias ? gpu(b) : Tensor();
                const NormForward f = norm_forward(x, wc, bc, 1e-5, v.subtract_mean, k);
                const NormForward fg = norm_forward(gpu(x), wg, bg, 1e-5, v.subtract_mean, k);
                require_close(f.y, fg.y, "y " + what);
                require_close(f.rstd, fg.rstd, tolerance(f.rstd.dtype()), "rstd " + what);
                if (v.subtract_mean) require_close(f.mean, fg.mean, tolerance(f.mean.dtype()), "mean " + what);
                const NormBackward g = norm_backward(dy, x, wc, f.mean, f.rstd, v.subtract_mean, k);
                const NormBackward gg = norm_backward(gpu(dy), gpu(x), wg, fg.mean, fg.rstd, v.subtract_mean, k);
                // dx/dweight sum over a row or over rows: a little looser than elementwise for halves.
                const double tol = is_half(dtype) ? 2 * tolerance(dtype) : 10 * tolerance(dtype);
                require_close(g.dx, gg.dx, tol, "dx " + what);
                if (v.weight) require_close(g.dweight, gg.dweight, tol, "dweight " + what);
                if (v.bias || g.dbias.defined()) require_close(g.dbias, gg.dbias, tol, "dbias " + what);
                const NormBackward again = norm_backward(gpu(dy), gpu(x), wg, fg.mean, fg.rstd, v.subtract_mean, k);
                if (v.weight) require_same_bits(gg.dweight, again.dweight, "dweight deterministic " + what);
                require_same_bits(gg.dx, again.dx, "dx deterministic " + what);
            }
        }
    }
}

TEST_CASE("cuda: DyT's kernel pair matches the CPU for every dtype, with and without weight and bias", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
        // One register tile per row up to 8192 wide; 9001 re-reads two tiles (core/cuda/cuda_norms.cu).
        for (const Shape& shape : {Shape{6, 5, 48}, Shape{3, 1000}, Shape{1, 7}, Shape{0, 16}, Shape{3, 9001}}) {
            const int64_t d = shape.back();
            const Tensor x = (random_normal(shape, 40, DType::F64) * 2.0 + 0.3).to(dtype);
            const Tensor dy = random_normal(shape, 41, dtype);
            const Tensor alpha = full({1}, 0.7, dtype);
            const Tensor w = (random_normal({d}, 42, DType::F64) * 0.5 + 1.0).to(dtype);
            const Tensor b = random_normal({d}, 43, dtype);
            for (bool affine : {true, false}) {
                const std::string what = std::string(affine ? "affine " : "bare ") + dtype_name(dtype) + " " +
                                         shape_str(shape);
                const Tensor wc = affine ? w : Tensor(), bc = affine ? b : Tensor();
                const Tensor wg = affine ? gpu(w) : Tensor(), bg = affine ? gpu(b) : Tensor();
                require_close(dyt_forward(x, alpha, wc, bc), dyt_forward(gpu(x), gpu(alpha), wg, bg), "y " + what);
                const DytBackward g = dyt_backward(dy, x, alpha, wc);
                const DytBackward gg = dyt_backward(gpu(dy), gpu(x), gpu(alpha), wg);
                // Sums over a row's or all rows' elements: looser than elementwise, as the norms' dweight.
                const double tol = is_half(dtype) ? 2 * tolerance(dtype) : 10 * tolerance(dtype);
                require_close(g.dx, gg.dx, tol, "dx " + what);
                require_close(g.dalpha, gg.dalpha, tol, "dalpha " + what);
                require_close(g.dbias, gg.dbias, tol, "dbias " + what);
                if (affine) require_close(g.dweight, gg.dweight, tol, "dweight " + what);
                const DytBackward again = dyt_backward(gpu(dy), gpu(x), gpu(alpha), wg);
                require_same_bits(gg.dalpha, again.dalpha, "dalpha deterministic " + what);
                require_same_bits(gg.dbias, again.dbias, "dbias deterministic " + what);
                if (affine) require_same_bits(gg.dweight, again.dweight, "dweight deterministic " + what);
            }
        }
    }
}

TEST_CASE("cuda: LayerNorm of a large-offset input (1e4 + N(0,1)) in f32 matches the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    // A mean kept only as a float costs ~1e-3 relative in y here; the CPU keeps it to about twice f32's
    // precision (tests/test_fused.cpp checks it against an f64 reference), and so must the GPU.
    for (const int64_t d : {int64_t{64}, int64_t{1000}, int64_t{3000}}) {
        const Tensor x = (random_normal({7, d}, 34, DType::F64) + 1e4).to(DType::F32);
        const NormForward f = norm_forward(x, Tensor(), Tensor(), 1e-5, true);
        const NormForward fg = norm_forward(gpu(x), Tensor(), Tensor(), 1e-5, true);
        const std::string what = "d " + std::to_string(d);
        require_close(f.y, fg.y, 1e-5, "y " + what);
        require_close(f.rstd, fg.rstd, 1e-6, "rstd " + what);
        require_close(f.mean, fg.mean, 2e-7, "mean " + what);  // one f32 ulp at 1e4 is ~1e-7 relative
    }
}

TEST_CASE("cuda: fused cross-entropy forward and backward match the CPU, with ignore_index", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
        for (int64_t classes : {int64_t(5), int64_t(1000)}) {
            const Tensor logits = (random_normal({4, 6, classes}, 34, DType::F64) * 3.0).to(dtype);
            Tensor targets = random_indices({4, 6}, classes, 35);
            std::vector<int64_t> t = targets.to_vector_as<int64_t>();
            t[3] = -100;
            t[10] = -100;
            targets = from_vector(t, {4, 6});
            for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
                const std::string what = std::string(dtype_name(dtype)) + " classes " + std::to_string(classes) +
                                         " reduction " + std::to_string(static_cast<int>(red));
                const CrossEntropyForward f = cross_entropy_forward(logits, targets, -100, red);
                const CrossEntropyForward fg = cross_entropy_forward(gpu(logits), gpu(targets), -100, red);
                require_close(f.loss, fg.loss, 2 * tolerance(dtype), "loss " + what);
                require_close(f.lse, fg.lse, tolerance(f.lse.dtype()), "lse " + what);
                REQUIRE(f.count == fg.count);
                const Tensor dloss = red == Reduction::None ? random_normal({4, 6}, 36, f.loss.dtype())
                                                            : full({}, 1.5, f.loss.dtype());
                const Tensor dl = cross_entropy_backward(dloss, logits, targets, f.lse, -100, red);
                const Tensor dlg = cross_entropy_backward(gpu(dloss), gpu(logits), gpu(targets), fg.lse, -100, red);
                require_close(dl, dlg, 2 * tolerance(dtype), "dlogits " + what);
            }
        }
    }
}

TEST_CASE("cuda: the cross-entropy's z-loss forward and backward match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
        const Tensor logits = (random_normal({4, 6, 300}, 134, DType::F64) * 3.0 + 2.0).to(dtype);
        Tensor targets = random_indices({4, 6}, 300, 135);
        std::vector<int64_t> t = targets.to_vector_as<int64_t>();
        t[5] = -100;
        targets = from_vector(t, {4, 6});
        for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
            const std::string what = std::string("z-loss ") + dtype_name(dtype) + " reduction " +
                                     std::to_string(static_cast<int>(red));
            const CrossEntropyForward f = cross_entropy_forward(logits, targets, -100, red, std::nullopt, 0.01);
            const CrossEntropyForward fg = cross_entropy_forward(gpu(logits), gpu(targets), -100, red, std::nullopt, 0.01);
            require_close(f.loss, fg.loss, 2 * tolerance(dtype), "loss " + what);
            require_close(f.z_loss, fg.z_loss, 2 * tolerance(dtype), "z_loss " + what);
            const Tensor dloss = red == Reduction::None ? random_normal({4, 6}, 136, f.loss.dtype())
                                                        : full({}, 1.5, f.loss.dtype());
            const Tensor dl = cross_entropy_backward(dloss, logits, targets, f.lse, -100, red, 0.01);
            const Tensor dlg = cross_entropy_backward(gpu(dloss), gpu(logits), gpu(targets), fg.lse, -100, red, 0.01);
            require_close(dl, dlg, 2 * tolerance(dtype), "dlogits " + what);
        }
    }
}

TEST_CASE("cuda: Adam, AdamW, AMSGrad and SGD steps match the CPU over several steps", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64}) {
        const std::string d = dtype_name(dtype);
        for (int variant = 0; variant < 3; ++variant) {
            AdamParams params;
            params.lr = 1e-2;
            params.weight_decay = 0.1;
            params.decoupled = variant >= 1;
            params.amsgrad = variant == 2;
            Tensor p = random_normal({37, 5}, 37, dtype), m = zeros({37, 5}, dtype), v = zeros({37, 5}, dtype);
            Tensor vmax = params.amsgrad ? zeros({37, 5}, dtype) : Tensor();
            Tensor pg = gpu(p), mg = gpu(m), vg = gpu(v), vmaxg = params.amsgrad ? gpu(vmax) : Tensor();
            for (int64_t step = 1; step <= 5; ++step) {
                const Tensor grad = random_normal({37, 5}, 100 + step, dtype);
                adam_step(p, grad, m, v, params, step, vmax);
                adam_step(pg, gpu(grad).t().contiguous().t(), mg, vg, params, step, vmaxg);
            }
            const std::string what = d + " adam variant " + std::to_string(variant);
            require_close(p, pg, 10 * tolerance(dtype), "param " + what);
            require_close(m, mg, 10 * tolerance(dtype), "exp_avg " + what);
            require_close(v, vg, 10 * tolerance(dtype), "exp_avg_sq " + what);
        }
        for (bool nesterov : {false, true}) {
            SgdParams params;
            params.lr = 0.05;
            params.momentum = 0.9;
            params.weight_decay = 0.01;
            params.nesterov = nesterov;
            Tensor p = random_normal({64}, 38, dtype), buf = zeros({64}, dtype);
            Tensor pg = gpu(p), bufg = gpu(buf);
            for (int step = 0; step < 4; ++step) {
                const Tensor grad = random_normal({64}, 200 + step, dtype);
                sgd_step(p, grad, buf, params, step == 0);
                sgd_step(pg, gpu(grad), bufg, params, step == 0);
            }
            require_close(p, pg, 10 * tolerance(dtype), d + " sgd nesterov " + std::to_string(nesterov));
            require_close(buf, bufg, 10 * tolerance(dtype), d + " sgd buffer");
        }
    }
}

TEST_CASE("cuda: RoPE rotation and its inverse match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
        const DType table_dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
        const Tensor x = random_normal({3, 5, 4, 8}, 31, dtype);  // (B, T, H, hd)
        const Tensor cos = random_uniform({5, 4}, 32, -1.0, 1.0, table_dtype);
        const Tensor sin = random_uniform({5, 4}, 33, -1.0, 1.0, table_dtype);
        for (bool inverse : {false, true}) {
            require_close(rope_rotate(x, cos, sin, inverse), rope_rotate(gpu(x), gpu(cos), gpu(sin), inverse),
                          std::string("rope ") + dtype_name(dtype) + (inverse ? " inverse" : ""));
        }
    }
}

TEST_CASE("cuda: fused causal attention forward and backward match the CPU (GQA, cached offset)", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    struct Case {
        int64_t B, T, L, H, KV, hd;
    };
    for (const Case& c : {Case{2, 5, 5, 4, 2, 6}, Case{1, 3, 9, 3, 1, 4}, Case{1, 70, 70, 2, 2, 8}}) {
        for (DType dtype : {DType::F32, DType::F64}) {
            const std::string what = std::string("attention ") + dtype_name(dtype) + " T " + std::to_string(c.T) +
                                     " L " + std::to_string(c.L);
            const Tensor q = random_normal({c.B, c.T, c.H, c.hd}, 41, dtype);
            const Tensor k = random_normal({c.B, c.L, c.KV, c.hd}, 42, dtype);
            const Tensor v = random_normal({c.B, c.L, c.KV, c.hd}, 43, dtype);
            const Tensor dout = random_normal({c.B, c.T, c.H, c.hd}, 44, dtype);
            const AttentionForward host = attention_forward(q, k, v);
            const AttentionForward dev = attention_forward(gpu(q), gpu(k), gpu(v));
            require_close(host.out, dev.out, 10 * tolerance(dtype), what + " out");
            require_close(host.lse, dev.lse, 10 * tolerance(dtype), what + " lse");
            const AttentionBackward hg = attention_backward(dout, q, k, v, host.out, host.lse);
            const AttentionBackward dg = attention_backward(gpu(dout), gpu(q), gpu(k), gpu(v), dev.out, dev.lse);
            require_close(hg.dq, dg.dq, 10 * tolerance(dtype), what + " dq");
            require_close(hg.dk, dg.dk, 10 * tolerance(dtype), what + " dk");
            require_close(hg.dv, dg.dv, 10 * tolerance(dtype), what + " dv");
        }
    }
}

TEST_CASE("cuda: soft-capped causal attention forward and backward match the CPU (GQA, cached offset)", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    struct Case {
        int64_t B, T, L, H, KV, hd;
    };
    for (const Case& c : {Case{2, 5, 5, 4, 2, 6}, Case{1, 3, 9, 3, 1, 4}, Case{1, 70, 70, 2, 2, 8}}) {
        for (DType dtype : {DType::F32, DType::F64}) {
            const std::string what = std::string("softcap attention ") + dtype_name(dtype) + " T " +
                                     std::to_string(c.T) + " L " + std::to_string(c.L);
            const Tensor q = random_normal({c.B, c.T, c.H, c.hd}, 141, dtype) * 2.0;
            const Tensor k = random_normal({c.B, c.L, c.KV, c.hd}, 142, dtype) * 2.0;
            const Tensor v = random_normal({c.B, c.L, c.KV, c.hd}, 143, dtype);
            const Tensor dout = random_normal({c.B, c.T, c.H, c.hd}, 144, dtype);
            const double cap = 1.5;
            const AttentionForward host = attention_forward(q, k, v, cap);
            const AttentionForward dev = attention_forward(gpu(q), gpu(k), gpu(v), cap);
            require_close(host.out, dev.out, 10 * tolerance(dtype), what + " out");
            require_close(host.lse, dev.lse, 10 * tolerance(dtype), what + " lse");
            const AttentionBackward hg = attention_backward(dout, q, k, v, host.out, host.lse, cap);
            const AttentionBackward dg = attention_backward(gpu(dout), gpu(q), gpu(k), gpu(v), dev.out, dev.lse, cap);
            require_close(hg.dq, dg.dq, 10 * tolerance(dtype), what + " dq");
            require_close(hg.dk, dg.dk, 10 * tolerance(dtype), what + " dk");
            require_close(hg.dv, dg.dv, 10 * tolerance(dtype), what + " dv");
        }
    }
}

TEST_CASE("cuda: the fused SwiGLU gate forward and backward match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
        const Tensor a = random_normal({5, 33}, 45, dtype), b = random_normal({5, 33}, 46, dtype);
        const Tensor dout = random_normal({5, 33}, 47, dtype);
        const std::string what = std::string("swiglu ") + dtype_name(dtype);
        require_close(swiglu_forward(a, b), swiglu_forward(gpu(a), gpu(b)), what);
        const SwigluBackward host = swiglu_backward(dout, a, b), dev = swiglu_backward(gpu(dout), gpu(a), gpu(b));
        require_close(host.da, dev.da, what + " da");
        require_close(host.db, dev.db, what + " db");
    }
}

TEST_CASE("cuda: the soft-capping pair matches the CPU, saturated elements included", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
        // x up to about +-10 caps: tanh's small and large branches and saturation.
        const Tensor x = random_normal({5, 33}, 48, dtype) * 40.0, dy = random_normal({5, 33}, 49, dtype);
        const std::string what = std::string("softcap ") + dtype_name(dtype);
        const Tensor y = softcap_forward(x, 15.0), y_dev = softcap_forward(gpu(x), 15.0);
        require_close(y, y_dev, what + " y");
        require_close(softcap_backward(dy, y, 15.0), softcap_backward(gpu(dy), gpu(y), 15.0), what + " dx");
    }
}

TEST_CASE("cuda: TF32 setting is off by default and can be switched", "[cuda]") {
    CUDA_TEST_OR_SKIP();
#ifdef NORMLAB_HAVE_CUDA
    REQUIRE_FALSE(cuda_tf32());
    const Tensor a = random_normal({64, 256}, 39), b = random_normal({256, 32}, 40);
    set_cuda_tf32(true);
    const Tensor tf32 = matmul(gpu(a), gpu(b));
    set_cuda_tf32(false);
    // TF32 keeps 10 mantissa bits: within ~1e-2 of the exact result, but must still be close.
    require_close(matmul(a, b), tf32, 2e-2, "tf32 matmul");
    require_close(matmul(a, b), matmul(gpu(a), gpu(b)), 1e-4, "exact f32 after switching back");
#endif
}

// ---- layers ----

namespace {

// Builds one module from a fixed seed: called twice, it gives two modules with the same parameters.
using ModuleFactory = std::function<std::shared_ptr<UnaryModule>(Generator&)>;

// The module on the CPU and its copy moved to the GPU (Module::to) see the same input; loss =
// sum(y * dy). y, dL/dx and every parameter's gradient must agree with the CPU's within `tol`.
void require_layer_matches(const std::string& what, const ModuleFactory& make, const Shape& input_shape,
                           double tol) {
    Generator cpu_gen(40), gpu_gen(40);
    std::shared_ptr<UnaryModule> cpu_module = make(cpu_gen), gpu_module = make(gpu_gen);
    gpu_module->to(kGpu);
    const Tensor x = random_normal(input_shape, 41);
    Var x_cpu(x, true), x_gpu(gpu(x), true);
    const Var y_cpu = cpu_module->forward(x_cpu), y_gpu = gpu_module->forward(x_gpu);
    require_close(y_cpu.data(), y_gpu.data(), tol, what + ": y");
    const Tensor dy = random_normal(y_cpu.shape(), 42);
    sum(y_cpu * Var(dy)).backward();
    sum(y_gpu * Var(gpu(dy))).backward();
    REQUIRE(x_gpu.grad().defined());
    require_close(x_cpu.grad().data(), x_gpu.grad().data(), tol, what + ": dL/dx");
    const auto cpu_params = cpu_module->named_parameters(), gpu_params = gpu_module->named_parameters();
    REQUIRE(cpu_params.size() == gpu_params.size());
    for (size_t i = 0; i < cpu_params.size(); ++i) {
        REQUIRE(gpu_params[i].second.device() == kGpu);
        REQUIRE(gpu_params[i].second.grad().defined());
        require_close(cpu_params[i].second.grad().data(), gpu_params[i].second.grad().data(), tol,
                      what + ": grad of " + cpu_params[i].first);
    }
}

}  // namespace

TEST_CASE("cuda: every layer's output, input gradient and parameter gradients match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    // Gradients sum over the batch and (attention, blocks) over positions: f32 sums in another order.
    const double tol = 1e-4;
    require_layer_matches("Linear", [](Generator& g) {
        LinearOptions o;
        o.in_features = 16, o.out_features = 12, o.generator = &g;
        return std::make_shared<Linear>(o);
    }, {3, 5, 16}, tol);
    for (const std::string& type : norm_types()) {
        for (bool fused : {true, false}) {
            require_layer_matches(type + (fused ? " fused" : " composed"), [&type, fused](Generator& g) {
                NormOptions o;
                o.type = type, o.dim = 16, o.fused = fused;
                std::shared_ptr<Norm> norm = make_norm(o);
                nl::test::randomize_parameters(*norm, g);  // not ones and zeros, which hide mistakes
                return norm;
            }, {3, 5, 16}, tol);
        }
    }
    require_layer_matches("FeedForward (SwiGLU)", [](Generator& g) {
        FeedForwardOptions o;
        o.dim = 16, o.hidden_dim = 64, o.multiple_of = 8, o.generator = &g;
        return std::make_shared<FeedForward>(o);
    }, {3, 5, 16}, tol);
    require_layer_matches("Attention (RoPE, grouped kv heads)", [](Generator& g) {
        AttentionOptions o;
        o.dim = 16, o.n_heads = 4, o.n_kv_heads = 2, o.max_seq_len = 8, o.generator = &g;
        return std::make_shared<Attention>(o);
    }, {2, 7, 16}, tol);
    for (bool pre_norm : {true, false}) {
        require_layer_matches(pre_norm ? "TransformerBlock pre-norm RMSNorm" : "TransformerBlock post-norm LayerNorm",
                              [pre_norm](Generator& g) {
            TransformerBlockOptions o;
            o.dim = 16, o.n_heads = 4, o.multiple_of = 8, o.norm_placement = pre_norm ? "pre" : "post", o.max_seq_len = 8, o.generator = &g;
            o.norm.type = pre_norm ? "rmsnorm" : "layernorm";
            return std::make_shared<TransformerBlock>(o);
        }, {2, 7, 16}, tol);
    }
}

TEST_CASE("cuda: the kernel table's workload reaches every row on the GPU backend", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    // tests/test_profiler.cpp's workload, on the GPU: a row whose CUDA function no op reaches (or
    // whose op falls back to another path on the GPU) shows as 0 calls.
    test::require_every_kernel_called([] { test::kernel_table_workload(kGpu); });
}

TEST_CASE("cuda: Embedding's output and weight gradient match the CPU", "[cuda]") {
    CUDA_TEST_OR_SKIP();
    Generator cpu_gen(43), gpu_gen(43);
    EmbeddingOptions o;
    o.num_embeddings = 11, o.embedding_dim = 16;
    o.generator = &cpu_gen;
    Embedding cpu_embedding(o);
    o.generator = &gpu_gen;
    Embedding gpu_embedding(o);
    gpu_embedding.to(kGpu);
    const Tensor ids = random_indices({4, 9}, 11, 44), dy = random_normal({4, 9, 16}, 45);
    const Var y_cpu = cpu_embedding.forward(ids), y_gpu = gpu_embedding.forward(gpu(ids));
    require_close(y_cpu.data(), y_gpu.data(), 0.0, "embedding rows");
    sum(y_cpu * Var(dy)).backward();
    sum(y_gpu * Var(gpu(dy))).backward();
    // Repeated ids add their rows in order on both devices: the same bits.
    REQUIRE(gpu_embedding.weight().grad().defined());
    require_close(cpu_embedding.weight().grad().data(), gpu_embedding.weight().grad().data(), 0.0,
                  "embedding weight grad");
}
