// Tensor core tests: every view op against expected shapes/strides/values (incl. chained views,
// negative dims, size-1 and size-0 dims), storage sharing, contiguous/clone, copy_ with broadcast and
// dtype conversion, creation functions, host access, printing and error messages.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/tensor.h"

using namespace nl;
using Catch::Contains;

namespace {

// arange(0, numel) viewed as `shape`, so an element's value is its row-major index in the base.
Tensor iota(const Shape& shape, DType dtype = DType::F32) {
    return arange(0, static_cast<double>(shape_numel(shape)), 1, dtype).view(shape);
}

// The values a view must show: element [i...] of the view reads base element offset + sum(i * stride).
// Here the base is iota, so that element's value is exactly that flat position.
std::vector<double> expected_values(const Shape& shape, const Shape& strides, int64_t offset) {
    std::vector<double> out;
    const int64_t n = shape_numel(shape);
    for (int64_t linear = 0; linear < n; ++linear) {
        int64_t rest = linear, pos = offset;
        for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
            pos += (rest % shape[d]) * strides[d];
            rest /= shape[d];
        }
        out.push_back(static_cast<double>(pos));
    }
    return out;
}

void check_view(const Tensor& v, const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
    INFO("view shape " << shape_str(v.shape()) << " strides " << shape_str(v.strides()));
    REQUIRE(v.shape() == shape);
    REQUIRE(v.strides() == strides);
    REQUIRE(v.offset() == offset);
    REQUIRE(v.storage() == base.storage());
    REQUIRE(v.to_vector() == expected_values(shape, strides, offset));
}

uint16_t bits16(const Tensor& t, int64_t i) {
    uint16_t b;
    std::memcpy(&b, static_cast<const char*>(t.data_ptr()) + 2 * i, 2);
    return b;
}

}  // namespace

TEST_CASE("creation functions fill shape, dtype and values", "[tensor]") {
    Tensor z = zeros({2, 3});
    REQUIRE(z.shape() == Shape{2, 3});
    REQUIRE(z.strides() == Shape{3, 1});
    REQUIRE(z.dtype() == DType::F32);
    REQUIRE(z.device() == Device::cpu());
    REQUIRE(z.to_vector() == std::vector<double>(6, 0.0));
    REQUIRE(ones({4}, DType::F64).to_vector() == std::vector<double>(4, 1.0));
    REQUIRE(full({2, 2}, -3.5, DType::BF16).to_vector() == std::vector<double>(4, -3.5));
    REQUIRE(full({3}, 7, DType::I64).to_vector_as<int64_t>() == std::vector<int64_t>{7, 7, 7});

    Tensor s = scalar_tensor(2.5, DType::F16);
    REQUIRE(s.dim() == 0);
    REQUIRE(s.numel() == 1);
    REQUIRE(s.item() == 2.5);

    Tensor like = full_like(iota({2, 3}, DType::F64), 4.0);
    REQUIRE(like.shape() == Shape{2, 3});
    REQUIRE(like.dtype() == DType::F64);
    REQUIRE(like.to_vector() == std::vector<double>(6, 4.0));
    REQUIRE(zeros_like(like).to_vector() == std::vector<double>(6, 0.0));
    REQUIRE(ones_like(like).to_vector() == std::vector<double>(6, 1.0));

    REQUIRE(arange(0, 5).to_vector() == std::vector<double>{0, 1, 2, 3, 4});
    REQUIRE(arange(1, 2, 0.25, DType::F64).to_vector() == std::vector<double>{1, 1.25, 1.5, 1.75});
    REQUIRE(arange(5, 0, -2, DType::I64).to_vector_as<int64_t>() == std::vector<int64_t>{5, 3, 1});
    REQUIRE(arange(3, 3).numel() == 0);
    REQUIRE_THROWS_WITH(arange(0, 5, -1), Contains("arange"));
    REQUIRE_THROWS_WITH(arange(0, 5, 0), Contains("arange"));

    Tensor fv = from_vector(std::vector<float>{1.5f, 2.5f, 3.5f, 4.5f}, {2, 2}, DType::F64);
    REQUIRE(fv.dtype() == DType::F64);
    REQUIRE(fv.at({1, 0}) == 3.5);
    Tensor iv = from_vector(std::vector<int64_t>{1, -2, 3}, {3});
    REQUIRE(iv.dtype() == DType::I64);
    REQUIRE(iv.data<int64_t>()[1] == -2);
    Tensor dv = from_vector(std::vector<double>{0.1, 0.2}, {2}, DType::F64);
    REQUIRE(dv.data<double>()[0] == 0.1);

    Tensor empty = zeros({2, 0, 3});
    REQUIRE(empty.numel() == 0);
    REQUIRE(empty.to_vector().empty());
    REQUIRE(empty.is_contiguous());
}

TEST_CASE("data<T> checks the dtype and storage is 64-byte aligned", "[tensor]") {
    Tensor t = zeros({5}, DType::F64);
    REQUIRE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64 == 0);
    REQUIRE_THROWS_WITH(t.data<float>(), Contains("expected dtype f32, found f64"));
    Tensor undefined;
    REQUIRE_FALSE(undefined.defined());
    REQUIRE_THROWS_WITH(undefined.view({1}), Contains("undefined"));
    REQUIRE_THROWS_WITH(Tensor::empty({2, -1}), Contains("empty: invalid size -1"));
}

TEST_CASE("view and reshape compute PyTorch strides", "[tensor]") {
    Tensor base = iota({2, 3, 4});
    check_view(base.view({4, 6}), base, {4, 6}, {6, 1}, 0);
    check_view(base.view({-1, 4}), base, {6, 4}, {4, 1}, 0);
    check_view(base.view({2, -1}), base, {2, 12}, {12, 1}, 0);
    check_view(base.view({24}), base, {24}, {1}, 0);
    check_view(base.view({1, 2, 1, 12, 1}), base, {1, 2, 1, 12, 1}, {24, 12, 12, 1, 1}, 0);
    check_view(base.reshape({3, 8}), base, {3, 8}, {8, 1}, 0);

    // A transposed tensor can still split or merge dims that stay contiguous in memory.
    Tensor tr = base.transpose(0, 1);  // (3, 2, 4), strides (4, 12, 1)
    check_view(tr.view({3, 2, 2, 2}), base, {3, 2, 2, 2}, {4, 12, 2, 1}, 0);
    REQUIRE_THROWS_WITH(tr.view({6, 4}), Contains("view") && Contains("[6, 4]") && Contains("[3, 2, 4]"));
    // reshape falls back to a packed copy with the same logical values.
    Tensor r = tr.reshape({6, 4});
    REQUIRE(r.storage() != base.storage());
    REQUIRE(r.is_contiguous());
    REQUIRE(r.to_vector() == tr.to_vector());

    // Scalars and size-0 tensors.
    Tensor scalar = scalar_tensor(0);  // iota of shape []
    check_view(scalar.view({1, 1}), scalar, {1, 1}, {1, 1}, 0);
    REQUIRE(scalar.view({}).dim() == 0);
    REQUIRE(scalar.view({-1}).shape() == Shape{1});
    Tensor e = zeros({2, 0, 3});
    REQUIRE(e.view({0, 6}).shape() == Shape{0, 6});
    REQUIRE(e.reshape({3, 0, 5}).shape() == Shape{3, 0, 5});
    REQUIRE_THROWS_WITH(e.view({-1, 0}), Contains("view: cannot infer the -1"));

    REQUIRE_THROWS_WITH(base.view({5, 5}),
                        Contains("view: cannot view a tensor of shape [2, 3, 4] (24 elements) as [5, 5]"));
    REQUIRE_THROWS_WITH(base.reshape({7, -1}), Contains("reshape") && Contains("[7, -1]"));
    REQUIRE_THROWS_WITH(base.view({-1, -1}), Contains("only one dim can be -1"));
    REQUIRE_THROWS_WITH(base.view({-2, 12}), Contains("invalid size -2"));
}

TEST_CASE("transpose, t and permute swap shapes and strides", "[tensor]") {
    Tensor base = iota({2, 3, 4});
    check_view(base.transpose(0, 2), base, {4, 3, 2}, {1, 4, 12}, 0);
    check_view(base.transpose(-1, -2), base, {2, 4, 3}, {12, 1, 4}, 0);
    check_view(base.transpose(1, 1), base, {2, 3, 4}, {12, 4, 1}, 0);
    check_view(base.permute({2, 0, 1}), base, {4, 2, 3}, {1, 12, 4}, 0);
    check_view(base.permute({-1, 0, -2}), base, {4, 2, 3}, {1, 12, 4}, 0);
    Tensor m = iota({3, 5});
    check_view(m.t(), m, {5, 3}, {1, 5}, 0);
    REQUIRE(m.t().at({4, 2}) == m.at({2, 4}));
    REQUIRE(iota({4}).t().shape() == Shape{4});
    REQUIRE_FALSE(base.transpose(0, 1).is_contiguous());

    REQUIRE_THROWS_WITH(base.t(), Contains("t: expected a tensor with at most 2 dims, found shape [2, 3, 4]"));
    REQUIRE_THROWS_WITH(base.transpose(0, 3), Contains("transpose: dim 3 is out of range"));
    REQUIRE_THROWS_WITH(base.permute({0, 0, 1}), Contains("permute") && Contains("[2, 3, 4]") &&
                                                     Contains("[0, 0, 1]"));
    REQUIRE_THROWS_WITH(base.permute({0, 1}), Contains("permute") && Contains("[0, 1]"));
    REQUIRE_THROWS_WITH(base.permute({0, 1, 3}), Contains("permute"));
}

TEST_CASE("narrow, slice and select take python-like ranges", "[tensor]") {
    Tensor base = iota({2, 3, 4});
    check_view(base.narrow(2, 1, 2), base, {2, 3, 2}, {12, 4, 1}, 1);
    check_view(base.narrow(-2, -2, 2), base, {2, 2, 4}, {12, 4, 1}, 4);
    check_view(base.narrow(0, 2, 0), base, {0, 3, 4}, {12, 4, 1}, 24);
    check_view(base.slice(2, 1, 4, 2), base, {2, 3, 2}, {12, 4, 2}, 1);
    check_view(base.slice(1, -2, 100), base, {2, 2, 4}, {12, 4, 1}, 4);
    check_view(base.slice(2, 0, 4, 3), base, {2, 3, 2}, {12, 4, 3}, 0);
    check_view(base.slice(2, -100, -1), base, {2, 3, 3}, {12, 4, 1}, 0);
    REQUIRE(base.slice(2, 3, 1).shape() == Shape{2, 3, 0});  // end before start -> empty
    check_view(base.select(1, -1), base, {2, 4}, {12, 1}, 8);
    check_view(base.select(0, 1), base, {3, 4}, {4, 1}, 12);
    check_view(base.select(2, 3).select(0, 0), base, {3}, {4}, 3);
    Tensor one = iota({3}).select(0, 2);
    REQUIRE(one.dim() == 0);
    REQUIRE(one.item() == 2);

    REQUIRE_THROWS_WITH(base.narrow(2, 3, 2),
                        Contains("narrow: start 3 and length 2 do not fit dim 2 of size 4 (shape [2, 3, 4])"));
    REQUIRE_THROWS_WITH(base.narrow(1, 0, -1), Contains("narrow"));
    REQUIRE_THROWS_WITH(base.narrow(3, 0, 1), Contains("narrow: dim 3 is out of range"));
    REQUIRE_THROWS_WITH(base.slice(0, 0, 2, 0), Contains("slice: expected step > 0, found 0"));
    REQUIRE_THROWS_WITH(base.slice(-4, 0, 1), Contains("slice: dim -4 is out of range"));
    REQUIRE_THROWS_WITH(base.select(1, 3),
                        Contains("select: index 3 is out of range for dim 1 of size 3 (shape [2, 3, 4])"));
    REQUIRE_THROWS_WITH(base.select(1, -4), Contains("select"));
}

TEST_CASE("expand, squeeze, unsqueeze and flatten", "[tensor]") {
    Tensor col = iota({3, 1});
    check_view(col.expand({2, 3, 4}), col, {2, 3, 4}, {0, 1, 0}, 0);
    check_view(col.expand({-1, 5}), col, {3, 5}, {1, 0}, 0);
    check_view(col.expand({3, 0}), col, {3, 0}, {1, 0}, 0);
    Tensor four = scalar_tensor(4);
    REQUIRE(four.expand({2, 2}).strides() == Shape{0, 0});
    REQUIRE(four.expand({2, 2}).to_vector() == std::vector<double>(4, 4.0));
    REQUIRE_THROWS_WITH(col.expand({3, 2, 1}) , Contains("expand: cannot expand [3, 1] to [3, 2, 1]"));
    REQUIRE_THROWS_WITH(col.expand({4}), Contains("expand: cannot expand [3, 1] to [4]"));
    REQUIRE_THROWS_WITH(col.expand({-1, 2, 1}), Contains("expand"));

    Tensor base = iota({1, 3, 1, 2});
    check_view(base.squeeze(), base, {3, 2}, {2, 1}, 0);
    check_view(base.squeeze(0), base, {3, 1, 2}, {2, 2, 1}, 0);
    check_view(base.squeeze(-2), base, {1, 3, 2}, {6, 2, 1}, 0);
    check_view(base.squeeze(1), base, {1, 3, 1, 2}, {6, 2, 2, 1}, 0);
    Tensor m = iota({3, 2});
    check_view(m.unsqueeze(0), m, {1, 3, 2}, {6, 2, 1}, 0);
    check_view(m.unsqueeze(1), m, {3, 1, 2}, {2, 2, 1}, 0);
    check_view(m.unsqueeze(-1), m, {3, 2, 1}, {2, 1, 1}, 0);
    check_view(m.unsqueeze(2), m, {3, 2, 1}, {2, 1, 1}, 0);
    REQUIRE_THROWS_WITH(m.unsqueeze(3), Contains("unsqueeze: dim 3 is out of range"));
    REQUIRE_THROWS_WITH(m.squeeze(2), Contains("squeeze: dim 2 is out of range"));

    Tensor cube = iota({2, 3, 4});
    check_view(cube.flatten(), cube, {24}, {1}, 0);
    Tensor tr = m.t();
    Tensor flat = tr.flatten();  // not viewable: a packed copy
    REQUIRE(flat.storage() != m.storage());
    REQUIRE(flat.to_vector() == std::vector<double>{0, 2, 4, 1, 3, 5});
    REQUIRE(scalar_tensor(1).flatten().shape() == Shape{1});
}

TEST_CASE("chained views compose offsets and strides", "[tensor]") {
    Tensor base = iota({4, 5, 6});
    // (4,5,6) -> transpose(0,2): (6,5,4) strides (1,6,30) -> slice dim0 [1:6:2]: (3,5,4) strides (2,6,30)
    // offset 1 -> select(1, -1): (3,4) strides (2,30) offset 1+24 -> unsqueeze(0): (1,3,4) strides (6,2,30)
    Tensor v = base.transpose(0, 2).slice(0, 1, 6, 2).select(1, -1).unsqueeze(0);
    check_view(v, base, {1, 3, 4}, {6, 2, 30}, 25);  // unsqueeze stride = 3 * 2
    check_view(v.expand({2, 3, 4}), base, {2, 3, 4}, {0, 2, 30}, 25);
    check_view(v.permute({2, 0, 1}).narrow(0, 1, 2), base, {2, 1, 3}, {30, 6, 2}, 55);
    check_view(base.slice(1, 1, 5).view({4, 2, 2, 6}).transpose(-1, 0), base, {6, 2, 2, 4}, {1, 12, 6, 30}, 6);
    // Chained size-1 and size-0 views.
    check_view(base.narrow(1, 2, 0).transpose(0, 1), base, {0, 4, 6}, {6, 30, 1}, 12);
    check_view(base.select(0, 3).unsqueeze(1).squeeze(1), base, {5, 6}, {6, 1}, 90);
}

TEST_CASE("views share storage with their base", "[tensor]") {
    Tensor base = zeros({3, 4});
    base.select(0, 1).fill_(7);
    base.t().select(0, 3).fill_(-1);  // column 3
    Tensor expected = from_vector(std::vector<double>{0, 0, 0, -1, 7, 7, 7, -1, 0, 0, 0, -1}, {3, 4});
    REQUIRE(base.to_vector() == expected.to_vector());
    base.slice(1, 0, 4, 2).copy_(from_vector(std::vector<double>{5, 6}, {2}));
    REQUIRE(base.at({2, 0}) == 5);
    REQUIRE(base.at({2, 2}) == 6);
    REQUIRE(base.at({2, 1}) == 0);
    Tensor reshaped = base.view({12});
    reshaped.fill_(2);
    REQUIRE(base.to_vector() == std::vector<double>(12, 2.0));
}

TEST_CASE("contiguous and clone copy only when they must", "[tensor]") {
    Tensor base = iota({3, 4});
    Tensor same = base.contiguous();
    REQUIRE(same.storage() == base.storage());
    Tensor narrowed_rows = base.narrow(0, 1, 2);  // still packed, nonzero offset
    REQUIRE(narrowed_rows.is_contiguous());
    REQUIRE(narrowed_rows.contiguous().storage() == base.storage());
    REQUIRE(iota({3, 1}).expand({3, 1}).is_contiguous());
    REQUIRE(iota({1, 4}).transpose(0, 1).transpose(0, 1).is_contiguous());
    REQUIRE(iota({4, 1}).transpose(0, 1).is_contiguous());  // size-1 dims do not count

    Tensor tr = base.t();
    Tensor packed = tr.contiguous();
    REQUIRE(packed.storage() != base.storage());
    REQUIRE(packed.is_contiguous());
    REQUIRE(packed.strides() == Shape{3, 1});
    REQUIRE(packed.to_vector() == tr.to_vector());

    Tensor c = base.clone();
    REQUIRE(c.storage() != base.storage());
    c.fill_(0);
    REQUIRE(base.at({2, 3}) == 11);
    Tensor expanded = iota({3}).expand({2, 3}).contiguous();
    REQUIRE(expanded.strides() == Shape{3, 1});
    REQUIRE(expanded.to_vector() == std::vector<double>{0, 1, 2, 0, 1, 2});
}

TEST_CASE("copy_ broadcasts and converts", "[tensor]") {
    Tensor dst = zeros({2, 3}, DType::F64);
    dst.copy_(from_vector(std::vector<double>{1.5, 2.5, 3.5}, {3}, DType::F32));
    REQUIRE(dst.to_vector() == std::vector<double>{1.5, 2.5, 3.5, 1.5, 2.5, 3.5});
    dst.copy_(from_vector(std::vector<double>{-1, 4}, {2, 1}, DType::BF16));
    REQUIRE(dst.to_vector() == std::vector<double>{-1, -1, -1, 4, 4, 4});
    dst.copy_(scalar_tensor(9, DType::I64));
    REQUIRE(dst.to_vector() == std::vector<double>(6, 9.0));
    dst.copy_(from_vector(std::vector<double>{1, 2, 3}, {1, 1, 3}).squeeze(0));
    REQUIRE(dst.to_vector() == std::vector<double>{1, 2, 3, 1, 2, 3});

    // Into a transposed (non-contiguous) destination.
    Tensor m = zeros({3, 2}, DType::F16);
    m.t().copy_(iota({2, 3}));
    REQUIRE(m.to_vector() == std::vector<double>{0, 3, 1, 4, 2, 5});

    // Source overlapping the destination's storage is read before it is overwritten.
    Tensor sq = iota({3, 3});
    sq.copy_(sq.t());
    REQUIRE(sq.to_vector() == std::vector<double>{0, 3, 6, 1, 4, 7, 2, 5, 8});

    REQUIRE_THROWS_WITH(dst.copy_(zeros({4})), Contains("copy_: cannot broadcast source [4] to destination [2, 3]"));
    REQUIRE_THROWS_WITH(dst.copy_(zeros({2, 2, 3})), Contains("copy_") && Contains("[2, 2, 3]"));
}

TEST_CASE("dtype conversions match reference values for every pair", "[tensor]") {
    // Values exactly representable in every dtype round-trip through every pair.
    const std::vector<double> exact = {0, 1, -2, 3, 100, -128, 256, 2048};
    const DType all[] = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64};
    for (DType from : all) {
        for (DType to : all) {
            INFO(dtype_name(from) << " -> " << dtype_name(to));
            Tensor src = from_vector(exact, {2, 4}, from);
            REQUIRE(src.to(to).dtype() == to);
            REQUIRE(src.to(to).to_vector() == exact);
            REQUIRE(src.t().to(to).to_vector() == src.t().to_vector());  // strided path
        }
    }
    // Float -> i64 truncates toward zero.
    Tensor f = from_vector(std::vector<double>{2.7, -2.7, 0.5, -0.5, 1e10}, {5}, DType::F64);
    REQUIRE(f.to(DType::I64).to_vector_as<int64_t>() == std::vector<int64_t>{2, -2, 0, 0, 10000000000});
    // Large i64 survive i64 -> f64 -> i64 exactly below 2^53, and i64 -> i64 always.
    Tensor big = from_vector(std::vector<int64_t>{(int64_t{1} << 53) - 1, std::numeric_limits<int64_t>::max()}, {2});
    REQUIRE(big.to(DType::F64).at({0}) == 9007199254740991.0);
    REQUIRE(big.clone().to_vector_as<int64_t>()[1] == std::numeric_limits<int64_t>::max());
    // f64 -> f32 rounds to nearest.
    REQUIRE(from_vector(std::vector<double>{0.1}, {1}, DType::F64).to(DType::F32).to_vector_as<float>()[0] == 0.1f);
    // Narrowing rounds: 1/3 in bf16 and f16.
    REQUIRE(scalar_tensor(1.0 / 3.0, DType::BF16).item() == 0.333984375);
    REQUIRE(scalar_tensor(1.0 / 3.0, DType::F16).item() == 0.333251953125);
}

TEST_CASE("half conversions produce the expected bit patterns", "[tensor]") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    // f16: 1, -2.5, max finite, ties to even at 1 + 2^-11 (down) and 1 + 3 * 2^-11 (up), overflow,
    // the smallest subnormal and a subnormal tie.
    const std::vector<float> in16 = {1.0f, -2.5f, 65504.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65520.0f,
                                     -1e6f, 0x1p-24f, 0x1p-25f, 3 * 0x1p-25f, 0.0f, -0.0f};
    const std::vector<uint16_t> want16 = {0x3c00, 0xc100, 0x7bff, 0x3c00, 0x3c02, 0x7c00,
                                          0xfc00, 0x0001, 0x0000, 0x0002, 0x0000, 0x8000};
    Tensor h = from_vector(in16, {static_cast<int64_t>(in16.size())}).to(DType::F16);
    for (size_t i = 0; i < in16.size(); ++i) {
        INFO("f16 of " << in16[i]);
        REQUIRE(bits16(h, static_cast<int64_t>(i)) == want16[i]);
    }
    // bf16: 1, -2.5, ties to even at 1 + 2^-8 (down) and 1 + 3 * 2^-8 (up), overflow of FLT_MAX to inf.
    const std::vector<float> in_bf = {1.0f, -2.5f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f,
                                      std::numeric_limits<float>::max(), -inf};
    const std::vector<uint16_t> want_bf = {0x3f80, 0xc020, 0x3f80, 0x3f82, 0x7f80, 0xff80};
    Tensor b = from_vector(in_bf, {static_cast<int64_t>(in_bf.size())}).to(DType::BF16);
    for (size_t i = 0; i < in_bf.size(); ++i) {
        INFO("bf16 of " << in_bf[i]);
        REQUIRE(bits16(b, static_cast<int64_t>(i)) == want_bf[i]);
    }
    // NaN stays NaN through every floating conversion; NaN -> i64 is 0 (not undefined behaviour).
    Tensor n = scalar_tensor(nan, DType::F32);
    for (DType d : {DType::F64, DType::BF16, DType::F16})
        REQUIRE(std::isnan(n.to(d).to(DType::F32).item()));
    REQUIRE(n.to(DType::I64).item() == 0);
    REQUIRE(std::isinf(scalar_tensor(1e6, DType::F16).item()));
    // fill_ rounds too.
    Tensor filled = zeros({3}, DType::F16);
    filled.fill_(1.0 + 0x1p-11);
    REQUIRE(bits16(filled, 2) == 0x3c00);
}

TEST_CASE("large copies take the parallel paths and stay exact", "[tensor]") {
    Generator gen(5);
    Tensor a = randn({300, 211}, gen, DType::F64);
    std::vector<double> av = a.to_vector();
    Tensor t32 = a.t().to(DType::F32);  // strided converting path, 63300 elements
    std::vector<float> got = t32.to_vector_as<float>();
    for (int64_t i = 0; i < 211; ++i)
        for (int64_t j = 0; j < 300; ++j) REQUIRE(got[i * 300 + j] == static_cast<float>(av[j * 211 + i]));
    Tensor back = t32.to(DType::F64);  // contiguous converting path
    Tensor same = a.clone();           // contiguous memcpy path
    REQUIRE(same.to_vector() == av);
    REQUIRE(back.t().contiguous().to_vector_as<float>() == a.to_vector_as<float>());
    Tensor big = zeros({70000}, DType::BF16);
    big.fill_(3.0);
    std::vector<double> bv = big.to_vector();
    REQUIRE(std::all_of(bv.begin(), bv.end(), [](double v) { return v == 3.0; }));
}

TEST_CASE("item, at, to_vector and to(dtype/device)", "[tensor]") {
    Tensor m = iota({2, 3}, DType::F64);
    REQUIRE(m.at({1, 2}) == 5);
    REQUIRE(m.at({-1, -3}) == 3);
    REQUIRE(m.size(-1) == 3);
    REQUIRE(m.nbytes() == 48);
    REQUIRE(m.select(0, 1).select(0, 1).item() == 4);
    REQUIRE(m.to_vector_as<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
    REQUIRE(m.to(DType::F64).storage() == m.storage());
    REQUIRE(m.to(Device::cpu()).storage() == m.storage());
    REQUIRE_THROWS_WITH(m.item(), Contains("item: expected a tensor with 1 element, found shape [2, 3] (6 elements)"));
    REQUIRE_THROWS_WITH(m.at({2, 0}), Contains("at: index [2, 0] is out of range for shape [2, 3]"));
    REQUIRE_THROWS_WITH(m.at({0}), Contains("at"));
    REQUIRE_THROWS_WITH(m.size(2), Contains("size: dim 2 is out of range"));
#ifndef NORMLAB_HAVE_CUDA
    REQUIRE_THROWS_WITH(m.to(Device::cuda()), Contains("normlab was built without CUDA"));
    REQUIRE_THROWS_WITH(zeros({2}, DType::F32, Device::cuda(1)), Contains("built without CUDA"));
#endif
}

TEST_CASE("from_vector checks the element count", "[tensor]") {
    REQUIRE_THROWS_WITH(from_vector(std::vector<double>{1, 2, 3, 4, 5}, {2, 3}),
                        Contains("from_vector: got 5 values for shape [2, 3] (6 elements)"));
    REQUIRE_THROWS_WITH(from_vector(std::vector<int64_t>{1}, {}, DType::I64).view({2}), Contains("view"));
    REQUIRE(from_vector(std::vector<float>{}, {0, 4}).shape() == Shape{0, 4});
}

TEST_CASE("str prints dtype, shape, device and nested values", "[tensor]") {
    std::string s = iota({2, 3}).str();
    REQUIRE_THAT(s, Contains("Tensor(f32, [2, 3], cpu)"));
    REQUIRE_THAT(s, Contains("[[0, 1, 2],\n [3, 4, 5]]"));
    REQUIRE_THAT(scalar_tensor(7, DType::I64).str(), Contains("Tensor(i64, [], cpu)\n7"));
    REQUIRE_THAT(iota({2, 3}).t().str(), Contains("[[0, 3],\n [1, 4],\n [2, 5]]"));
    std::string big = iota({5000}).str();
    REQUIRE_THAT(big, Contains("[0, 1, 2, ..., 4997, 4998, 4999]"));
    REQUIRE(Tensor().str() == "Tensor(undefined)");
}
