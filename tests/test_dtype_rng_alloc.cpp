// Tests for dtype helpers and half conversions (exhaustive round trips, rounding against an
// independent reference), device/shape helpers, the counting CPU allocator, and the Philox RNG
// (known answers, determinism across seeds/offsets/thread counts, distribution moments).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <omp.h>

#include "core/backend.h"
#include "core/tensor.h"

using namespace nl;
using Catch::Contains;

namespace {

float from_bits(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

// Round-to-nearest-even reference for f32 -> bf16, by comparing the two bf16 neighbours in f64.
uint16_t reference_bf16(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    const uint16_t down = static_cast<uint16_t>(bits >> 16);
    const uint16_t up = static_cast<uint16_t>(down + 1);
    const double lo = bf16_to_f32(down), hi = bf16_to_f32(up);
    const double dlo = std::fabs(static_cast<double>(x) - lo), dhi = std::fabs(hi - static_cast<double>(x));
    if (dlo < dhi) return down;
    if (dhi < dlo) return up;
    return (down & 1) ? up : down;
}

}  // namespace

TEST_CASE("dtype names, sizes and categories", "[tensor]") {
    REQUIRE(dtype_size(DType::F32) == 4);
    REQUIRE(dtype_size(DType::F64) == 8);
    REQUIRE(dtype_size(DType::BF16) == 2);
    REQUIRE(dtype_size(DType::F16) == 2);
    REQUIRE(dtype_size(DType::I64) == 8);
    for (DType d : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64})
        REQUIRE(dtype_from_name(dtype_name(d)) == d);
    REQUIRE_THROWS_WITH(dtype_from_name("float32"), Contains("f32, f64, bf16, f16, i64") && Contains("float32"));
    REQUIRE(is_floating(DType::BF16));
    REQUIRE_FALSE(is_floating(DType::I64));
    REQUIRE(is_half(DType::F16));
    REQUIRE_FALSE(is_half(DType::F32));
    REQUIRE(compute_dtype(DType::BF16) == DType::F32);
    REQUIRE(compute_dtype(DType::F64) == DType::F64);
}

TEST_CASE("device names and shape helpers", "[tensor]") {
    REQUIRE(device_from_name("cpu") == Device::cpu());
    REQUIRE(device_from_name("cuda") == Device::cuda(0));
    REQUIRE(device_from_name("cuda:3") == Device::cuda(3));
    REQUIRE(Device::cuda(2).str() == "cuda:2");
    REQUIRE_THROWS_WITH(device_from_name("gpu"), Contains("\"cpu\", \"cuda\" or \"cuda:N\"") && Contains("gpu"));
    REQUIRE_THROWS_WITH(device_from_name("cuda:x"), Contains("cuda:x"));

    REQUIRE(shape_str({}) == "[]");
    REQUIRE(shape_str({2, 3}) == "[2, 3]");
    REQUIRE(shape_numel({}) == 1);
    REQUIRE(shape_numel({2, 0, 3}) == 0);
    REQUIRE(contiguous_strides({2, 3, 4}) == Shape{12, 4, 1});
    REQUIRE(contiguous_strides({2, 0, 4}) == Shape{4, 4, 1});
    REQUIRE(wrap_dim(-1, 3, "op") == 2);
    REQUIRE_THROWS_WITH(wrap_dim(3, 3, "myop"), Contains("myop: dim 3 is out of range"));
    REQUIRE_THROWS_WITH(wrap_dim(-4, 3, "myop"), Contains("myop"));
    REQUIRE(broadcast_shapes({2, 1, 4}, {3, 1}, "add") == Shape{2, 3, 4});
    REQUIRE(broadcast_shapes({}, {5}, "add") == Shape{5});
    REQUIRE(broadcast_shapes({0, 1}, {1, 3}, "add") == Shape{0, 3});
    REQUIRE_THROWS_WITH(broadcast_shapes({2, 3}, {4}, "add"),
                        Contains("add: cannot broadcast [2, 3] with [4] (dim -1: 3 vs 4)"));
}

TEST_CASE("half formats round-trip every value and round to nearest even", "[tensor]") {
    // Every non-NaN 16-bit pattern survives decode then encode; NaNs stay NaN.
    for (uint32_t h = 0; h <= 0xffff; ++h) {
        const uint16_t bits = static_cast<uint16_t>(h);
        const float f16 = f16_to_f32(bits), bf = bf16_to_f32(bits);
        if (std::isnan(f16))
            REQUIRE(std::isnan(f16_to_f32(f32_to_f16(f16))));
        else
            REQUIRE(f32_to_f16(f16) == bits);
        if (std::isnan(bf))
            REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(bf))));
        else
            REQUIRE(f32_to_bf16(bf) == bits);
    }
    REQUIRE(f16_to_f32(0x0001) == 0x1p-24f);
    REQUIRE(f16_to_f32(0x7bff) == 65504.0f);
    REQUIRE(f16_to_f32(0x3555) == 0.333251953125f);
    REQUIRE(std::isinf(f16_to_f32(0x7c00)));
    REQUIRE(f32_to_f16(65519.0f) == 0x7bff);  // just below the overflow threshold
    REQUIRE(f32_to_f16(std::numeric_limits<float>::infinity()) == 0x7c00);

    // Random f32 bit patterns against independent references (f16: the compiler's _Float16 when it
    // has one; bf16: nearest of the two neighbours in f64). Covers normals, subnormals and ties.
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 200000; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;  // LCG (Knuth MMIX)
        uint32_t bits = static_cast<uint32_t>(state >> 32);
        if (i % 4 == 0) bits &= 0xffff8000u | (bits & 0x10000u);  // force exact bf16 ties often
        if (i % 4 == 1) bits = (bits & 0x80000000u) | (0x33000000u + (bits & 0x07ffffffu));  // f16 subnormal range
        const float x = from_bits(bits);
        if (std::isnan(x)) continue;
        INFO("x bits " << std::hex << bits);
        if (std::fabs(x) < 3.3e38f) REQUIRE(f32_to_bf16(x) == reference_bf16(x));
#if defined(__FLT16_MAX__)
        const _Float16 h = static_cast<_Float16>(x);
        uint16_t want;
        std::memcpy(&want, &h, 2);
        REQUIRE(f32_to_f16(x) == want);
#endif
    }
}

TEST_CASE("the CPU allocator counts current, peak and allocations", "[tensor]") {
    const MemoryStats before = memory_stats(Device::cpu());
    {
        Tensor a = zeros({1000});  // 4000 bytes
        MemoryStats during = memory_stats(Device::cpu());
        REQUIRE(during.current_bytes == before.current_bytes + 4000);
        REQUIRE(during.allocations == before.allocations + 1);
        REQUIRE(during.peak_bytes >= during.current_bytes);
        REQUIRE(a.storage()->nbytes() == 4000);
        REQUIRE(reinterpret_cast<uintptr_t>(a.data_ptr()) % 64 == 0);
        Tensor view = a.view({10, 100}).t();  // views allocate nothing
        REQUIRE(memory_stats(Device::cpu()).current_bytes == during.current_bytes);
        REQUIRE(memory_stats(Device::cpu()).allocations == during.allocations);
    }
    REQUIRE(memory_stats(Device::cpu()).current_bytes == before.current_bytes);

    reset_peak(Device::cpu());
    const int64_t base = memory_stats(Device::cpu()).current_bytes;
    REQUIRE(memory_stats(Device::cpu()).peak_bytes == base);
    {
        Tensor big = zeros({2000}, DType::F64);  // 16000 bytes
        { Tensor small = zeros({10}, DType::BF16); }  // 20 bytes, freed at once
        REQUIRE(memory_stats(Device::cpu()).peak_bytes == base + 16020);
    }
    MemoryStats after = memory_stats(Device::cpu());
    REQUIRE(after.current_bytes == base);
    REQUIRE(after.peak_bytes == base + 16020);
    reset_peak(Device::cpu());
    REQUIRE(memory_stats(Device::cpu()).peak_bytes == base);

    // Empty tensors own a (zero-byte) storage and are counted as allocations, not bytes.
    const MemoryStats e0 = memory_stats(Device::cpu());
    Tensor empty = zeros({0, 5});
    REQUIRE(empty.defined());
    REQUIRE(memory_stats(Device::cpu()).current_bytes == e0.current_bytes);
    REQUIRE(memory_stats(Device::cpu()).allocations == e0.allocations + 1);
#ifndef NORMLAB_HAVE_CUDA
    REQUIRE_THROWS_WITH(allocator_for(Device::cuda()), Contains("allocator_for: normlab was built without CUDA"));
    REQUIRE_THROWS_WITH(backend_for(Device::cuda()), Contains("built without CUDA"));
#endif
}

TEST_CASE("Philox-4x32-10 matches Random123's known answers", "[tensor]") {
    // Random123 tests/kat_vectors, the three philox4x32 10 lines: counter[4], key[2] -> out[4].
    struct Kat {
        uint32_t ctr[4], key[2], out[4];
    };
    const Kat kats[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (const Kat& k : kats) {
        uint32_t out[4];
        Generator::philox4x32(k.ctr, k.key, out);
        for (int i = 0; i < 4; ++i) REQUIRE(out[i] == k.out[i]);
    }
    uint32_t zero[4];
    Generator::philox(0, 0, zero);
    REQUIRE(zero[0] == 0x6627e8d5u);
    REQUIRE(zero[3] == 0x9b00dbd8u);
    // The 64-bit packing: key -> {low, high}, counter -> {low, high, 0, 0}. Checked with the pi KAT's
    // key and first two counter words, so a swapped or dropped word would differ.
    const uint32_t ctr[4] = {0x243f6a88, 0x85a308d3, 0, 0};
    const uint32_t key[2] = {0xa4093822, 0x299f31d0};
    uint32_t raw[4], packed[4];
    Generator::philox4x32(ctr, key, raw);
    Generator::philox(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, packed);
    for (int i = 0; i < 4; ++i) REQUIRE(packed[i] == raw[i]);
    uint32_t swapped[4];
    Generator::philox(0xa4093822299f31d0ull, 0x85a308d3243f6a88ull, swapped);
    REQUIRE(swapped[0] != raw[0]);
}

TEST_CASE("random tensors are deterministic by seed and offset", "[tensor]") {
    Generator g1(42), g2(42), g3(43);
    Tensor a = randn({64, 33}, g1);
    Tensor b = randn({64, 33}, g2);
    REQUIRE(a.to_vector() == b.to_vector());
    REQUIRE(randn({64, 33}, g3).to_vector() != a.to_vector());
    // The offset advances, so the next draw differs; restoring the state replays it.
    const uint64_t offset = g1.offset();
    REQUIRE(offset == 64 * 33);  // f32 normals use one word each
    Tensor next = randn({64, 33}, g1);
    REQUIRE(next.to_vector() != a.to_vector());
    g2.set_state(42, offset);
    REQUIRE(randn({64, 33}, g2).to_vector() == next.to_vector());
    // Uniform word accounting: f32 one word per value, f64 two.
    Generator g(7);
    rand({5}, g);
    REQUIRE(g.offset() == 5);
    rand({5}, g, DType::F64);
    REQUIRE(g.offset() == 15);
    randn({3}, g, DType::F64);
    REQUIRE(g.offset() == 15 + 8);  // two Box-Muller pairs of two f64 uniforms
    // Draws are split consistently: drawing 10 then 10 equals drawing 20 (uniforms).
    Generator whole(9), parts(9);
    std::vector<double> w = rand({20}, whole).to_vector();
    std::vector<double> p1 = rand({10}, parts).to_vector(), p2 = rand({10}, parts).to_vector();
    p1.insert(p1.end(), p2.begin(), p2.end());
    REQUIRE(p1 == w);
    // bf16 tensors are f32 draws rounded.
    Generator h1(3), h2(3);
    REQUIRE(rand({100}, h1, DType::BF16).to_vector() == rand({100}, h2).to(DType::BF16).to_vector());
    // manual_seed resets the default generator.
    manual_seed(11);
    Tensor d1 = rand({8}, default_generator());
    manual_seed(11);
    REQUIRE(rand({8}, default_generator()).to_vector() == d1.to_vector());
    REQUIRE_THROWS_WITH(rand({2}, g, DType::I64), Contains("rand: expected a floating dtype, found i64"));
}

TEST_CASE("random draws do not depend on the thread count", "[tensor]") {
    const int saved = omp_get_max_threads();
    std::vector<std::vector<double>> runs;
    for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        Generator g(1234);
        std::vector<double> v = randn({100001}, g).to_vector();  // large enough to run in parallel
        std::vector<double> u = uniform({70000}, -2, 3, g, DType::F64).to_vector();
        v.insert(v.end(), u.begin(), u.end());
        runs.push_back(v);
    }
    omp_set_num_threads(saved);
    REQUIRE(runs[0] == runs[1]);
    REQUIRE(runs[0] == runs[2]);
}

TEST_CASE("uniform and normal have the right moments", "[tensor]") {
    const int64_t n = 100000;
    auto moments = [](const std::vector<double>& v) {
        double mean = 0, var = 0;
        for (double x : v) mean += x;
        mean /= static_cast<double>(v.size());
        for (double x : v) var += (x - mean) * (x - mean);
        return std::pair<double, double>{mean, var / static_cast<double>(v.size() - 1)};
    };
    for (DType dtype : {DType::F32, DType::F64}) {
        INFO(dtype_name(dtype));
        Generator g(2024);
        // U[0,1): mean 1/2, variance 1/12; the mean's standard error is 0.29/sqrt(n) ~ 0.0009.
        std::vector<double> u = rand({n}, g, dtype).to_vector();
        auto [um, uv] = moments(u);
        REQUIRE(std::fabs(um - 0.5) < 0.005);
        REQUIRE(std::fabs(uv - 1.0 / 12.0) < 0.002);
        REQUIRE(*std::min_element(u.begin(), u.end()) >= 0.0);
        REQUIRE(*std::max_element(u.begin(), u.end()) < 1.0);
        // U[-3, 5): mean 1, variance 64/12.
        auto [lm, lv] = moments(uniform({n}, -3, 5, g, dtype).to_vector());
        REQUIRE(std::fabs(lm - 1.0) < 0.04);
        REQUIRE(std::fabs(lv - 64.0 / 12.0) < 0.1);
        // N(0,1) and N(2, 0.5^2).
        std::vector<double> z = randn({n}, g, dtype).to_vector();
        auto [zm, zv] = moments(z);
        REQUIRE(std::fabs(zm) < 0.015);
        REQUIRE(std::fabs(std::sqrt(zv) - 1.0) < 0.01);
        int64_t beyond2 = std::count_if(z.begin(), z.end(), [](double x) { return std::fabs(x) > 2.0; });
        REQUIRE(std::fabs(static_cast<double>(beyond2) / n - 0.0455) < 0.004);  // two-sided tail
        auto [nm, nv] = moments(normal({n}, 2.0, 0.5, g, dtype).to_vector());
        REQUIRE(std::fabs(nm - 2.0) < 0.008);
        REQUIRE(std::fabs(std::sqrt(nv) - 0.5) < 0.006);
    }
    // next_below covers [0, n) evenly.
    Generator g(5);
    std::vector<int> counts(7, 0);
    for (int i = 0; i < 70000; ++i) counts[g.next_below(7)]++;
    for (int c : counts) REQUIRE(std::abs(c - 10000) < 500);
    REQUIRE_THROWS_WITH(g.next_below(0), Contains("next_below"));
    REQUIRE_THROWS_WITH(normal({2}, 0, -1, g), Contains("normal: expected std >= 0"));
}

TEST_CASE("allocator: borrowed storage is read and written in place, uncounted, and released once", "[alloc]") {
    std::vector<float> owner = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};  // another library's memory
    int releases = 0;
    const int64_t before = memory_stats(Device::cpu()).current_bytes;
    {
        auto storage = std::make_shared<Storage>(owner.data(), owner.size() * 4, Device::cpu(), [&] { ++releases; });
        CHECK(storage->borrowed());
        Tensor t(storage, {2, 3}, {3, 1}, 0, DType::F32);  // (2, 3) on the owner's memory
        CHECK(memory_stats(Device::cpu()).current_bytes == before);
        CHECK(t.at({1, 2}) == 6.0);
        Tensor column = t.select(1, 1);  // a view keeps the storage too
        t.fill_(0.5);
        CHECK(owner[4] == 0.5f);  // written through
        owner[1] = 9.0f;
        CHECK(column.at({0}) == 9.0);  // read through
        t = Tensor();
        CHECK(releases == 0);  // the view still holds it
    }
    CHECK(releases == 1);
    CHECK_THROWS_AS(Storage(owner.data(), 4, Device::cpu(), nullptr), InternalError);
}
