// Philox-4x32-10 counter-based generator (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as
// easy as 1, 2, 3", SC 2011; constants from Random123). Word w of a seed's stream is word w % 4 of
// block w / 4, so every output depends only on (seed, offset + i) and large draws split across
// OpenMP threads without changing a single bit.
#include "core/rng.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace nl {

namespace {

constexpr uint32_t kMul0 = 0xD2511F53u;   // Philox multipliers
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // key schedule increments (golden ratio, sqrt(3) - 1)
constexpr uint32_t kWeyl1 = 0xBB67AE85u;
constexpr int64_t kParallelMin = 32768;   // below this a draw stays on one thread

// Reads consecutive 32-bit words of one seed's stream, computing each Philox block once.
class WordStream {
public:
    explicit WordStream(uint64_t seed) : seed_(seed) {}
    uint32_t word(uint64_t w) {
        uint64_t block = w / 4;
        if (!valid_ || block != block_) {
            Generator::philox(seed_, block, words_);
            block_ = block;
            valid_ = true;
        }
        return words_[w % 4];
    }

private:
    uint64_t seed_;
    uint64_t block_ = 0;
    bool valid_ = false;
    uint32_t words_[4] = {0, 0, 0, 0};
};

// Uniform in [0, 1) from the top 24 bits of one word (every float in the grid k * 2^-24 is exact).
float uniform_float(WordStream& s, uint64_t w) {
    return static_cast<float>(s.word(w) >> 8) * 5.9604644775390625e-8f;  // 2^-24
}

// Uniform in [0, 1) from 53 bits of two words.
double uniform_double(WordStream& s, uint64_t w) {
    uint64_t bits = (static_cast<uint64_t>(s.word(w)) << 32) | s.word(w + 1);
    return static_cast<double>(bits >> 11) * 1.1102230246251565e-16;  // 2^-53
}

// Runs body(begin, end) over [0, n) in contiguous chunks, in parallel when n is large. Each chunk
// owns its own WordStream, so results do not depend on the thread count.
template <typename Body>
void parallel_chunks(int64_t n, Body body) {
    if (n < kParallelMin) {
        body(int64_t{0}, n);
        return;
    }
    const int64_t chunk = 16384;
    const int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) body(c * chunk, std::min(n, (c + 1) * chunk));
}

// Uniforms: output i uses `words` words starting at offset + i * words.
template <typename T>
void fill_uniform_impl(uint64_t seed, uint64_t offset, T* out, int64_t n) {
    parallel_chunks(n, [&](int64_t begin, int64_t end) {
        WordStream s(seed);
        for (int64_t i = begin; i < end; ++i) {
            if constexpr (sizeof(T) == 4)
                out[i] = uniform_float(s, offset + static_cast<uint64_t>(i));
            else
                out[i] = uniform_double(s, offset + 2 * static_cast<uint64_t>(i));
        }
    });
}

// Box-Muller (Box & Muller 1958): outputs 2k and 2k+1 come from the uniform pair k:
// r = sqrt(-2 ln u1), z0 = r cos(2 pi u2), z1 = r sin(2 pi u2). u1 is taken in (0, 1] so log is finite.
template <typename T>
void fill_normal_impl(uint64_t seed, uint64_t offset, T* out, int64_t n) {
    constexpr uint64_t words = sizeof(T) == 4 ? 1 : 2;  // words per uniform
    const int64_t pairs = (n + 1) / 2;
    parallel_chunks(pairs, [&](int64_t begin, int64_t end) {
        WordStream s(seed);
        for (int64_t k = begin; k < end; ++k) {
            uint64_t w = offset + 2 * words * static_cast<uint64_t>(k);
            double u1, u2;
            if constexpr (sizeof(T) == 4) {
                u1 = 1.0 - uniform_float(s, w);
                u2 = uniform_float(s, w + 1);
            } else {
                u1 = 1.0 - uniform_double(s, w);
                u2 = uniform_double(s, w + 2);
            }
            double r = std::sqrt(-2.0 * std::log(u1));
            double theta = 2.0 * std::numbers::pi * u2;
            out[2 * k] = static_cast<T>(r * std::cos(theta));
            if (2 * k + 1 < n) out[2 * k + 1] = static_cast<T>(r * std::sin(theta));
        }
    });
}

}  // namespace

void Generator::philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {  // the key is bumped before every round but the first
            k0 += kWeyl0;
            k1 += kWeyl1;
        }
        uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
        uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
        uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
        uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

void Generator::philox(uint64_t key, uint64_t counter, uint32_t out[4]) {
    const uint32_t ctr[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0};
    const uint32_t k[2] = {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
    philox4x32(ctr, k, out);
}

void Generator::fill_uniform(float* out, int64_t n) {
    NL_REQUIRE(n >= 0, "fill_uniform: expected n >= 0, found ", n);
    fill_uniform_impl(seed_, offset_, out, n);
    offset_ += static_cast<uint64_t>(n);
}

void Generator::fill_uniform(double* out, int64_t n) {
    NL_REQUIRE(n >= 0, "fill_uniform: expected n >= 0, found ", n);
    fill_uniform_impl(seed_, offset_, out, n);
    offset_ += 2 * static_cast<uint64_t>(n);
}

void Generator::fill_normal(float* out, int64_t n) {
    NL_REQUIRE(n >= 0, "fill_normal: expected n >= 0, found ", n);
    fill_normal_impl(seed_, offset_, out, n);
    offset_ += 2 * static_cast<uint64_t>((n + 1) / 2);  // whole pairs, even for odd n
}

void Generator::fill_normal(double* out, int64_t n) {
    NL_REQUIRE(n >= 0, "fill_normal: expected n >= 0, found ", n);
    fill_normal_impl(seed_, offset_, out, n);
    offset_ += 4 * static_cast<uint64_t>((n + 1) / 2);
}

uint64_t Generator::next_below(uint64_t n) {
    NL_REQUIRE(n > 0, "next_below: expected n > 0, found 0");
    // Rejection sampling on 64 bits: drop the lowest (2^64 mod n) values so every residue is
    // equally likely.
    const uint64_t threshold = (0 - n) % n;
    WordStream s(seed_);
    while (true) {
        uint64_t r = (static_cast<uint64_t>(s.word(offset_)) << 32) | s.word(offset_ + 1);
        offset_ += 2;
        if (r >= threshold) return r % n;
    }
}

Generator& default_generator() {
    static Generator generator(0);
    return generator;
}

void manual_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

}  // namespace nl
