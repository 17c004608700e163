// Seeded random numbers. Counter-based (Philox-4x32-10, Salmon et al. 2011): the i-th number of a
// draw depends only on (seed, offset + i), so the same seed gives the same tensor on every run and
// every thread count, and a generator's whole state is two integers that a checkpoint can save.
#pragma once

#include <cstdint>

namespace nl {

class Generator {
public:
    explicit Generator(uint64_t seed = 0) : seed_(seed) {}

    uint64_t seed() const { return seed_; }
    uint64_t offset() const { return offset_; }        // 32-bit words consumed so far
    void set_state(uint64_t seed, uint64_t offset) { seed_ = seed; offset_ = offset; }

    // Fill `out[0..n)` with uniform floats in [0, 1), or standard normals (Box-Muller); advances.
    void fill_uniform(float* out, int64_t n);
    void fill_uniform(double* out, int64_t n);
    void fill_normal(float* out, int64_t n);
    void fill_normal(double* out, int64_t n);
    // One uniform integer in [0, n); advances.
    uint64_t next_below(uint64_t n);

    // Philox-4x32-10 block `counter` under `key`: four 32-bit random words. The 64-bit key is the
    // 2x32 Philox key {low word, high word}; the 64-bit counter is the 4x32 counter
    // {low word, high word, 0, 0}. So philox(k, c) == philox4x32({c, c >> 32, 0, 0}, {k, k >> 32}).
    static void philox(uint64_t key, uint64_t counter, uint32_t out[4]);
    // The raw Philox-4x32-10 bijection on a full 4x32 counter and 2x32 key (Random123's
    // philox4x32_R(10, ...)), exposed so known-answer tests can check every counter word.
    static void philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

private:
    uint64_t seed_ = 0;
    uint64_t offset_ = 0;
};

// The process-wide default generator (torch.manual_seed's analogue).
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace nl
