// Indexing ops against plain reference loops: index_select / index_add along each dim (repeated
// indices accumulate), gather / scatter_add on 3-D along each dim, embedding shapes, cat along each
// dim with negative dims, views and empty tensors, and every error path.
#include <catch2/catch.hpp>

#include <vector>

#include "core/ops.h"

using namespace nl;

namespace {

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
    std::vector<int64_t> idx(shape.size());
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
    return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const Shape& shape) {
    int64_t pos = 0;
    for (size_t d = 0; d < shape.size(); ++d) pos = pos * shape[d] + idx[d];
    return pos;
}

Tensor i64(const std::vector<int64_t>& values, const Shape& shape) { return from_vector(values, shape); }

// Random indices in [0, high) of `shape`, from the generator.
Tensor random_index(const Shape& shape, int64_t high, Generator& gen) {
    std::vector<int64_t> v(shape_numel(shape));
    for (auto& x : v) x = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(high)));
    return i64(v, shape);
}

void require_equal(const Tensor& t, const std::vector<double>& expected, double tol = 0.0) {
    const std::vector<double> got = t.to_vector();
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - expected[i]) <= tol);
}

}  // namespace

TEST_CASE("index_select along each dim matches the reference", "[index]") {
    Generator gen(11);
    const Shape shape{3, 4, 5};
    const Tensor a = randn(shape, gen, DType::F64);
    const std::vector<double> av = a.to_vector();
    for (int64_t dim = 0; dim < 3; ++dim) {
        const std::vector<int64_t> idx{shape[dim] - 1, 0, shape[dim] - 1, 1};  // repeats allowed
        const Tensor out = index_select(a, dim, i64(idx, {4}));
        Shape os = shape;
        os[dim] = 4;
        REQUIRE(out.shape() == os);
        std::vector<double> expected(shape_numel(os));
        for (int64_t p = 0; p < shape_numel(os); ++p) {
            std::vector<int64_t> i = unravel(p, os);
            i[dim] = idx[i[dim]];
            expected[p] = av[ravel(i, shape)];
        }
        require_equal(out, expected);
        // Negative dim, non-contiguous input and a strided index give the same answer.
        const Tensor at = a.permute({2, 0, 1}).contiguous().permute({1, 2, 0});
        REQUIRE_FALSE(at.is_contiguous());
        const Tensor strided = i64({idx[0], 9, idx[1], 9, idx[2], 9, idx[3], 9}, {8}).slice(0, 0, 8, 2);
        require_equal(index_select(at, dim - 3, strided), expected);
    }
    // An empty index gives an empty dim; bf16 round-trips exactly.
    CHECK(index_select(a, 1, i64({}, {0})).shape() == Shape{3, 0, 5});
    const Tensor h = a.to(DType::BF16);
    const Tensor hs = index_select(h, 0, i64({2, 0}, {2}));
    CHECK(hs.dtype() == DType::BF16);
    CHECK(hs.to_vector() == index_select(h.to(DType::F32), 0, i64({2, 0}, {2})).to_vector());
}

TEST_CASE("index_add accumulates repeated indices along each dim", "[index]") {
    Generator gen(12);
    const Shape shape{3, 4, 5};
    for (DType dt : {DType::F64, DType::F32}) {
        const Tensor a = randn(shape, gen, dt);
        const std::vector<double> av = a.to_vector();
        for (int64_t dim = 0; dim < 3; ++dim) {
            const std::vector<int64_t> idx{1, 0, 1, 1, 2};  // index 1 three times
            Shape ss = shape;
            ss[dim] = 5;
            const Tensor src = randn(ss, gen, dt);
            const std::vector<double> sv = src.to_vector();
            std::vector<double> expected = av;
            for (int64_t p = 0; p < shape_numel(ss); ++p) {
                std::vector<int64_t> i = unravel(p, ss);
                i[dim] = idx[i[dim]];
                expected[ravel(i, shape)] += sv[p];
            }
            const Tensor out = index_add(a, dim, i64(idx, {5}), src);
            REQUIRE(out.shape() == shape);
            require_equal(out, expected, dt == DType::F64 ? 1e-12 : 1e-5);
            require_equal(a, av);  // the input is untouched
        }
    }
    // A large add (the threaded path) is exact against the reference in f64.
    const Tensor w = zeros({7, 300}, DType::F64);
    const Tensor idx = random_index({2000}, 7, gen);
    const Tensor src = randn({2000, 300}, gen, DType::F64);
    const std::vector<int64_t> iv = idx.to_vector_as<int64_t>();
    const std::vector<double> sv = src.to_vector();
    std::vector<double> expected(7 * 300, 0.0);
    for (int64_t j = 0; j < 2000; ++j)
        for (int64_t c = 0; c < 300; ++c) expected[iv[j] * 300 + c] += sv[j * 300 + c];
    require_equal(index_add(w, 0, idx, src), expected, 0.0);
}

TEST_CASE("gather and scatter_add on 3-D along each dim", "[index]") {
    Generator gen(13);
    const Shape shape{3, 4, 5};
    const Tensor a = randn(shape, gen, DType::F64);
    const std::vector<double> av = a.to_vector();
    for (int64_t dim = 0; dim < 3; ++dim) {
        // The index may be smaller than `a` on every dim and larger along `dim`.
        Shape is{2, 3, 4};
        is[dim] = 6;
        const Tensor index = random_index(is, shape[dim], gen);
        const std::vector<int64_t> iv = index.to_vector_as<int64_t>();

        std::vector<double> expected(shape_numel(is));
        for (int64_t p = 0; p < shape_numel(is); ++p) {
            std::vector<int64_t> i = unravel(p, is);
            i[dim] = iv[p];
            expected[p] = av[ravel(i, shape)];
        }
        const Tensor g = gather(a, dim, index);
        REQUIRE(g.shape() == is);
        require_equal(g, expected);
        require_equal(gather(a.transpose(0, 2).contiguous().transpose(0, 2), dim - 3, index), expected);

        // src may be larger than the index; only the index's part of it is added.
        Shape ss = is;
        ss[(dim + 1) % 3] += 1;
        const Tensor src = randn(ss, gen, DType::F64);
        const std::vector<double> sv = src.to_vector();
        std::vector<double> summed = av;
        for (int64_t p = 0; p < shape_numel(is); ++p) {
            std::vector<int64_t> i = unravel(p, is);
            const double v = sv[ravel(i, ss)];
            i[dim] = iv[p];
            summed[ravel(i, shape)] += v;
        }
        const Tensor s = scatter_add(a, dim, index, src);
        REQUIRE(s.shape() == shape);
        require_equal(s, summed, 1e-12);
        // An index covering all of `a` on the other dims takes the in-place path.
        Shape full = shape;
        full[dim] = 2;
        const Tensor fi = random_index(full, shape[dim], gen);
        const Tensor fs = randn(full, gen, DType::F32);
        const Tensor af = a.to(DType::F32);
        std::vector<double> fexp = af.to_vector();
        const std::vector<int64_t> fiv = fi.to_vector_as<int64_t>();
        const std::vector<double> fsv = fs.to_vector();
        for (int64_t p = 0; p < shape_numel(full); ++p) {
            std::vector<int64_t> i = unravel(p, full);
            i[dim] = fiv[p];
            fexp[ravel(i, shape)] += fsv[p];
        }
        require_equal(scatter_add(af, dim, fi, fs), fexp, 1e-5);
    }
}

TEST_CASE("embedding looks up rows for ids of any shape", "[index]") {
    Generator gen(14);
    const Tensor w = randn({10, 4}, gen);
    const std::vector<double> wv = w.to_vector();
    const Tensor ids = i64({3, 0, 9, 3, 1, 2}, {2, 3});
    const Tensor e = embedding(w, ids);
    REQUIRE(e.shape() == Shape{2, 3, 4});
    std::vector<double> expected;
    for (int64_t id : ids.to_vector_as<int64_t>())
        for (int64_t c = 0; c < 4; ++c) expected.push_back(wv[id * 4 + c]);
    require_equal(e, expected);
    CHECK(embedding(w, i64({7}, {1})).shape() == Shape{1, 4});
    CHECK(embedding(w, i64({}, {2, 0})).shape() == Shape{2, 0, 4});
    CHECK(embedding(w, from_vector(std::vector<int64_t>{5}, Shape{})).shape() == Shape{4});
}

TEST_CASE("cat along each dim, negative dims, views and empty tensors", "[index]") {
    Generator gen(15);
    for (int64_t dim = 0; dim < 3; ++dim) {
        Shape s1{2, 3, 4}, s2{2, 3, 4}, s3{2, 3, 4};
        s2[dim] = 1;
        s3[dim] = 0;
        const Tensor a = randn(s1, gen, DType::F64);
        const Tensor b = randn({s2[2], s2[1], s2[0]}, gen, DType::F64).permute({2, 1, 0});  // a view
        const Tensor c = randn(s3, gen, DType::F64);
        REQUIRE(b.shape() == s2);
        for (int64_t d : {dim, dim - 3}) {
            const Tensor out = cat({a, c, b}, d);
            Shape os = s1;
            os[dim] += 1;
            REQUIRE(out.shape() == os);
            std::vector<double> expected(shape_numel(os));
            for (int64_t p = 0; p < shape_numel(os); ++p) {
                std::vector<int64_t> i = unravel(p, os);
                if (i[dim] < s1[dim]) {
                    expected[p] = a.at(i);
                } else {
                    i[dim] -= s1[dim];
                    expected[p] = b.at(i);
                }
            }
            require_equal(out, expected);
        }
    }
    // i64 tensors concatenate too (copy handles every dtype).
    CHECK(cat({i64({1, 2}, {2}), i64({3}, {1})}, 0).to_vector_as<int64_t>() == std::vector<int64_t>{1, 2, 3});
}

TEST_CASE("index op errors name what was expected and found", "[index]") {
    Generator gen(16);
    const Tensor a = randn({3, 4}, gen);
    // index_select / index_add
    REQUIRE_THROWS_WITH(index_select(a, 0, i64({0, 3}, {2})),
                        Catch::Contains("index_select: index 3 is out of range for dim 0 of size 3"));
    REQUIRE_THROWS_WITH(index_select(a, 1, i64({-1}, {1})), Catch::Contains("index -1 is out of range for dim 1 of size 4"));
    REQUIRE_THROWS_WITH(index_select(a, 0, from_vector(std::vector<double>{0.0}, {1})),
                        Catch::Contains("index_select: expected an index of dtype i64, found f32"));
    REQUIRE_THROWS_WITH(index_select(a, 0, i64({0, 1}, {1, 2})),
                        Catch::Contains("index_select: expected a 1-D index, found shape [1, 2]"));
    REQUIRE_THROWS_WITH(index_select(a, 2, i64({0}, {1})), Catch::Contains("index_select"));
    REQUIRE_THROWS_WITH(index_select(i64({1, 2}, {2}), 0, i64({0}, {1})),
                        Catch::Contains("index_select: expected a floating dtype, found i64"));
    REQUIRE_THROWS_WITH(index_add(a, 0, i64({0, 1}, {2}), randn({3, 4}, gen)),
                        Catch::Contains("index_add: expected src of shape [2, 4]"));
    REQUIRE_THROWS_WITH(index_add(a, 0, i64({5}, {1}), randn({1, 4}, gen)),
                        Catch::Contains("index_add: index 5 is out of range for dim 0 of size 3"));
    REQUIRE_THROWS_WITH(index_add(a, 0, i64({0}, {1}), randn({1, 4}, gen, DType::F64)),
                        Catch::Contains("index_add: src has dtype f64 but the input has f32"));
    // gather / scatter_add
    REQUIRE_THROWS_WITH(gather(a, 0, i64({0, 1}, {2})), Catch::Contains("gather: index must have the input's rank 2"));
    REQUIRE_THROWS_WITH(gather(a, 0, i64({0, 0, 0, 0, 0}, {1, 5})),
                        Catch::Contains("gather: index shape [1, 5] exceeds input shape [3, 4] in dim 1"));
    REQUIRE_THROWS_WITH(gather(a, 1, i64({4}, {1, 1})),
                        Catch::Contains("gather: index 4 is out of range for dim 1 of size 4"));
    REQUIRE_THROWS_WITH(scatter_add(a, 0, i64({0, 1}, {1, 2}), randn({1, 1}, gen)),
                        Catch::Contains("scatter_add: index shape [1, 2] exceeds src shape [1, 1] in dim 1"));
    REQUIRE_THROWS_WITH(scatter_add(a, 0, i64({3}, {1, 1}), randn({1, 1}, gen)),
                        Catch::Contains("scatter_add: index 3 is out of range for dim 0 of size 3"));
    // embedding
    REQUIRE_THROWS_WITH(embedding(a, i64({0, 3}, {2})), Catch::Contains("embedding: id 3 is out of range for 3 embeddings"));
    REQUIRE_THROWS_WITH(embedding(randn({3}, gen), i64({0}, {1})), Catch::Contains("embedding: expected a 2-D weight"));
    REQUIRE_THROWS_WITH(embedding(a, from_vector(std::vector<double>{0.0}, {1})),
                        Catch::Contains("embedding: expected ids of dtype i64, found f32"));
    // cat
    REQUIRE_THROWS_WITH(cat({}, 0), Catch::Contains("cat: expected at least one tensor"));
    REQUIRE_THROWS_WITH(cat({a, randn({3, 5}, gen), randn({2, 4}, gen)}, 0),
                        Catch::Contains("cat: tensor 1 has shape [3, 5] but tensor 0 has shape [3, 4] (sizes must match except in dim 0)"));
    REQUIRE_THROWS_WITH(cat({a, randn({3, 4, 1}, gen)}, 1), Catch::Contains("cat: tensor 1 has shape [3, 4, 1]"));
    REQUIRE_THROWS_WITH(cat({a, randn({3, 4}, gen, DType::F64)}, 0), Catch::Contains("cat: tensor 1 has dtype f64"));
    REQUIRE_THROWS_WITH(cat({a, a}, 2), Catch::Contains("cat"));
    REQUIRE_THROWS_WITH(cat({scalar_tensor(1.0)}, 0), Catch::Contains("cat: cannot concatenate 0-dim tensors"));
}
