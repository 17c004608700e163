// CUDA kernels for the fused norms (LayerNorm, RMSNorm, RMSNorm with bias, pRMSNorm's first-k
// statistics) and DyT's pair (no statistic: elementwise, with its dalpha/dweight/dbias reduced as the
// norms' dweight); the formulas are in core/backend.h and derived in core/cpu/cpu_norms.cpp.
//
// One block per row. bf16/f16 are converted to f32 on load and rounded once on store, with all math
// and accumulation in f32 (f64 for f64). Statistics are two-pass (mean, then squared deviations),
// the mean summed as x - x[0] and applied as a hi + lo pair, as on the CPU.
// A thread reads its part of a row in tiles of kTileItems elements, all loads of a tile issued before
// the first use: one load in flight per thread cannot cover device memory's latency, and a loop that
// reads one element per iteration compiles to exactly that. A block has up to 1024 threads, so rows up to
// 8192 (f32 and bf16 alike) are one tile: the row stays in registers between the passes and device
// memory is read once. Wider rows re-read each tile per pass (from L1/L2 for the most part).
// dweight/dbias are reduced without atomics in two stages: the rows are cut into a number of chunks
// that depends on `rows` only; block c walks its chunk's rows in order, each thread adding into
// the partial-row columns it alone owns (in registers for one-tile rows); then the partial rows are
// summed per column in a fixed order (sum_partials_kernel). So the bits are the same on every run and
// every GPU.
#include <algorithm>
#include <tuple>

#include "core/cuda/cuda_backend.cuh"
#include "core/cuda/cuda_common.cuh"
#include "core/cuda/nl_cuda_api.h"

namespace nl {

namespace {

constexpr int kTileItems = 8;          // elements of a row per thread per tile (loads in flight)
constexpr int kMaxNormThreads = 1024;  // threads per block: one tile covers 8192 elements
constexpr int64_t kMaxChunks = 512;    // partial rows for dweight/dbias (and blocks in the backward)

// Threads for rows of d elements: enough for one tile when possible, a multiple of 32 (block_sum).
int norm_threads(int64_t d) {
    const int64_t t = ((d + kTileItems - 1) / kTileItems + 31) / 32 * 32;
    return static_cast<int>(std::clamp<int64_t>(t, 32, kMaxNormThreads));
}

// Tiles per row: a block reads kTileItems * blockDim.x elements per tile.
__device__ __forceinline__ int64_t row_tiles(int64_t d) {
    const int64_t per_tile = int64_t{kTileItems} * blockDim.x;
    return (d + per_tile - 1) / per_tile;
}

// The row column of this thread's element i in tile t: a warp's i-th loads are consecutive (coalesced).
__device__ __forceinline__ int64_t tile_column(int64_t tile, int i) {
    return (tile * kTileItems + i) * int64_t(blockDim.x) + threadIdx.x;
}

// v[i] = p[base + tile_column(tile, i)] as T, or `fill` past column `limit`. The loop is unrolled, so all
// kTileItems loads are issued before any is used.
template <typename T>
__device__ __forceinline__ void load_tile(DType dtype, const void* p, int64_t base, int64_t limit, int64_t tile,
                                          T fill, T (&v)[kTileItems]) {
#pragma unroll
    for (int i = 0; i < kTileItems; ++i) {
        const int64_t j = tile_column(tile, i);
        v[i] = j < limit ? cuda::load_as<T>(dtype, p, base + j) : fill;
    }
}

// T is the math type: float for f32/bf16/f16, double for f64. mean, rstd: (rows).
// __launch_bounds__: a 1024-thread block may use at most 64 registers per thread, or it cannot launch.
template <typename T>
__global__ void __launch_bounds__(kMaxNormThreads)
    norm_forward_kernel(DType dtype, const void* x, const void* weight, const void* bias, void* y, T* mean, T* rstd,
                        int64_t rows, int64_t d, T eps, bool subtract_mean, int64_t k) {
    __shared__ T scratch[32];
    const int64_t tiles = row_tiles(d);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t base = r * d;  // row r of x, y: (d)
        T xv[kTileItems];            // this thread's tile of row r; kept across the passes when tiles == 1
        bool cached = false;
        // The mean as a hi + lo pair of T (to about twice T's precision), as the CPU kernel: a mean kept
        // only as a float costs ~1e-3 relative in y for rows like 1e4 + N(0, 1) (tests/test_fused.cpp),
        // while x - mu_hi is exact near the mean (Sterbenz), so centering in T loses nothing.
        T mu_hi = T(0), mu_lo = T(0);
        if (subtract_mean) {
            // Summing x - x[0] keeps a large common offset out of the T accumulators.
            const T x0 = cuda::load_as<T>(dtype, x, base);
            T sum = T(0);
            for (int64_t t = 0; t < tiles; ++t) {
                if (!cached) load_tile(dtype, x, base, d, t, T(0), xv);
#pragma unroll
                for (int i = 0; i < kTileItems; ++i)
                    if (tile_column(t, i) < k) sum += xv[i] - x0;
            }
            cached = tiles == 1;
            const double mu = double(x0) + double(cuda::block_sum(sum, scratch)) / double(k);
            mu_hi = T(mu);
            mu_lo = T(mu - double(mu_hi));
        }
        // Second pass over centered values: exact enough even when |mean| >> std.
        T sum_sq = T(0);
        for (int64_t t = 0; t < tiles; ++t) {
            if (!cached) load_tile(dtype, x, base, d, t, T(0), xv);
#pragma unroll
            for (int i = 0; i < kTileItems; ++i) {
                const T c = (xv[i] - mu_hi) - mu_lo;
                if (tile_column(t, i) < k) sum_sq += c * c;
            }
        }
        cached = tiles == 1;
        const T rs = T(1) / cuda::m_sqrt(cuda::block_sum(sum_sq, scratch) / T(k) + eps);
        for (int64_t t = 0; t < tiles; ++t) {
            if (!cached) load_tile(dtype, x, base, d, t, T(0), xv);
            T w[kTileItems], b[kTileItems];  // weight, bias tiles: (d) each, L1/L2 hits after the first row
            if (weight) load_tile(dtype, weight, 0, d, t, T(1), w);
            if (bias) load_tile(dtype, bias, 0, d, t, T(0), b);
#pragma unroll
            for (int i = 0; i < kTileItems; ++i) {
                const int64_t j = tile_column(t, i);
                if (j >= d) continue;
                const T xhat = ((xv[i] - mu_hi) - mu_lo) * rs;
                cuda::store_as<T>(dtype, y, base + j, xhat * (weight ? w[i] : T(1)) + (bias ? b[i] : T(0)));
            }
        }
        if (threadIdx.x == 0) {
            // The backward centers with this saved mean alone, as the CPU's (which saves mu_hi too).
            if (subtract_mean && mean != nullptr) mean[r] = mu_hi;
            rstd[r] = rs;
        }
    }
}

// Block c handles rows [c * rows / chunks, (c + 1) * rows / chunks): dx for each, and its partial
// rows dw_partial[c] (d), db_partial[c] (d) when those are wanted (null otherwise).
template <typename T>
__global__ void __launch_bounds__(kMaxNormThreads)
    norm_backward_kernel(DType dtype, const void* dy, const void* x, const void* weight, const T* mean, const T* rstd,
                         void* dx, T* dw_partial, T* db_partial, int64_t rows, int64_t d, bool subtract_mean,
                         int64_t k, int64_t chunks) {
    __shared__ T scratch[32];
    const int64_t c = blockIdx.x;
    const int64_t tiles = row_tiles(d);
    T* dw_row = dw_partial ? dw_partial + c * d : nullptr;  // (d)
    T* db_row = db_partial ? db_partial + c * d : nullptr;  // (d)
    // One-tile rows: the thread's columns of dweight/dbias are summed in registers over the chunk's rows
    // (the same additions in the same order as the read-modify-writes of wider rows) and stored once.
    T dw_acc[kTileItems], db_acc[kTileItems];
#pragma unroll
    for (int i = 0; i < kTileItems; ++i) dw_acc[i] = db_acc[i] = T(0);
    // Wider rows add into the partial rows in place, so those start at zero. Every column j is touched
    // only by thread j % blockDim.x, here and below: no barrier needed.
    for (int64_t j = threadIdx.x; tiles > 1 && j < d; j += blockDim.x) {
        if (dw_row) dw_row[j] = T(0);
        if (db_row) db_row[j] = T(0);
    }
    T w[kTileItems];  // the weight tile (ones without weight); loaded once per chunk when tiles == 1
    if (tiles == 1) load_tile(dtype, weight, 0, weight ? d : 0, 0, T(1), w);
    const T inv_k = T(1) / T(k);
    const int64_t row_end = (c + 1) * rows / chunks;
    for (int64_t r = c * rows / chunks; r < row_end; ++r) {
        const int64_t base = r * d;
        const T mu = subtract_mean ? mean[r] : T(0);
        const T rs = rstd[r];
        T xv[kTileItems], dyv[kTileItems];  // this thread's tiles of x and dy; kept for pass 2 when tiles == 1
        T sum_g = T(0), sum_g_xhat = T(0);
        for (int64_t t = 0; t < tiles; ++t) {
            load_tile(dtype, x, base, d, t, T(0), xv);
            load_tile(dtype, dy, base, d, t, T(0), dyv);
            if (tiles > 1) load_tile(dtype, weight, 0, weight ? d : 0, t, T(1), w);
#pragma unroll
            for (int i = 0; i < kTileItems; ++i) {
                // Past d the tiles hold x = 0, dy = 0: g = 0 adds nothing.
                const T xhat = (xv[i] - mu) * rs;
                const T g = dyv[i] * w[i];
                sum_g += g;
                sum_g_xhat += g * xhat;
            }
        }
        sum_g = cuda::block_sum(sum_g, scratch);
        sum_g_xhat = cuda::block_sum(sum_g_xhat, scratch);
        const T a = subtract_mean ? sum_g * inv_k : T(0);
        const T b = sum_g_xhat * inv_k;
        for (int64_t t = 0; t < tiles; ++t) {
            if (tiles > 1) {
                load_tile(dtype, x, base, d, t, T(0), xv);
                load_tile(dtype, dy, base, d, t, T(0), dyv);
                load_tile(dtype, weight, 0, weight ? d : 0, t, T(1), w);
            }
#pragma unroll
            for (int i = 0; i < kTileItems; ++i) {
                const int64_t j = tile_column(t, i);
                if (j >= d) continue;
                const T xhat = (xv[i] - mu) * rs;
                const T g = dyv[i] * w[i];
                // Elements past k do not feed the statistics: only the direct path remains.
                const T through_stats = j < k ? a + xhat * b : T(0);
                cuda::store_as<T>(dtype, dx, base + j, rs * (g - through_stats));
                if (tiles == 1) {
                    if (dw_row) dw_acc[i] += dyv[i] * xhat;
                    if (db_row) db_acc[i] += dyv[i];
                } else {
                    if (dw_row) dw_row[j] += dyv[i] * xhat;
                    if (db_row) db_row[j] += dyv[i];
                }
            }
        }
    }
    if (tiles == 1) {
#pragma unroll
        for (int i = 0; i < kTileItems; ++i) {
            const int64_t j = tile_column(0, i);
            if (j >= d) continue;
            if (dw_row) dw_row[j] = dw_acc[i];
            if (db_row) db_row[j] = db_acc[i];
        }
    }
}

// out[j] = sum over c of partial[c][j] (zeros when chunks == 0), in a fixed order: a block of
// kSumGroups warps takes 32 columns; warp g sums chunks g, g + kSumGroups, ... in order, then the
// warps' sums are added in warp order. So kSumGroups times more threads read the partial rows than
// with one thread per column, and the bits are the same on every run.
constexpr int kSumGroups = 8;

template <typename T>
__global__ void sum_partials_kernel(DType dtype, const T* partial, void* out, int64_t chunks, int64_t d) {
    __shared__ T group_sums[kSumGroups][32];
    const int lane = threadIdx.x % 32, group = threadIdx.x / 32;
    // The tile loop is the same for every thread of the block (barriers inside).
    for (int64_t tile = blockIdx.x; tile * 32 < d; tile += gridDim.x) {
        const int64_t j = tile * 32 + lane;
        T sum = T(0);
        if (j < d)
            for (int64_t c = group; c < chunks; c += kSumGroups) sum += partial[c * d + j];
        group_sums[group][lane] = sum;
        __syncthreads();
        if (group == 0 && j < d) {
            T total = T(0);
            for (int g = 0; g < kSumGroups; ++g) total += group_sums[g][lane];
            cuda::store_as<T>(dtype, out, j, total);
        }
        __syncthreads();  // group_sums is rewritten by the next tile
    }
}

// A scratch buffer from the device's caching allocator, returned on scope exit. Returning it before
// the kernels using it have run is safe: its next owner's work is queued behind them on the stream.
class Scratch {
public:
    Scratch(int device, size_t nbytes) : allocator_(cuda_allocator(device)), nbytes_(nbytes) {
        if (nbytes_ > 0) ptr_ = allocator_.allocate(nbytes_);
    }
    ~Scratch() {
        if (ptr_) allocator_.deallocate(ptr_, nbytes_);
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    template <typename T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }

private:
    Allocator& allocator_;
    size_t nbytes_;
    void* ptr_ = nullptr;
};

template <typename T>
void norm_backward_typed(int device, const NormBackwardArgs& a) {
    const int64_t chunks = std::min(a.rows, kMaxChunks), d = a.d;
    const size_t partial_bytes = static_cast<size_t>(chunks * d) * sizeof(T);
    Scratch dw_partial(device, a.dweight ? partial_bytes : 0);  // (chunks, d)
    Scratch db_partial(device, a.dbias ? partial_bytes : 0);    // (chunks, d)
    if (chunks > 0) {
        NL_LAUNCH(norm_backward_kernel<T>, static_cast<unsigned>(chunks), norm_threads(d))(
            a.dtype, a.dy, a.x, a.weight, static_cast<const T*>(a.mean), static_cast<const T*>(a.rstd), a.dx,
            dw_partial.as<T>(), db_partial.as<T>(), a.rows, d, a.subtract_mean, a.stat_count, chunks);
        NL_CUDA_CHECK_LAUNCH();
    }
    for (auto [partial, out] : {std::pair{&dw_partial, a.dweight}, std::pair{&db_partial, a.dbias}}) {
        if (out == nullptr) continue;
        NL_LAUNCH(sum_partials_kernel<T>, cuda::blocks_for((d + 31) / 32, 1), kSumGroups * 32)(
            a.dtype, partial->template as<T>(), out, chunks, d);
        NL_CUDA_CHECK_LAUNCH();
    }
}

// ---- DyT: y = tanh(alpha * x) * w + b (core/backend.h) ----

// One block per row (a grid-stride loop over rows), the row read in tiles as the norms' kernels do.
// alpha is read from device memory by every thread (one L1/L2 hit), so the host never waits for it.
template <typename T>
__global__ void __launch_bounds__(kMaxNormThreads)
    dyt_forward_kernel(DType dtype, const void* x, const void* alpha, const void* weight, const void* bias, void* y,
                       int64_t rows, int64_t d) {
    const T a = cuda::load_as<T>(dtype, alpha, 0);
    const int64_t tiles = row_tiles(d);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t base = r * d;  // row r of x, y: (d)
        for (int64_t t = 0; t < tiles; ++t) {
            T xv[kTileItems], w[kTileItems], b[kTileItems];  // x, weight (ones without), bias (zeros without) tiles
            load_tile(dtype, x, base, d, t, T(0), xv);
            load_tile(dtype, weight, 0, weight ? d : 0, t, T(1), w);
            load_tile(dtype, bias, 0, bias ? d : 0, t, T(0), b);
#pragma unroll
            for (int i = 0; i < kTileItems; ++i) {
                const int64_t j = tile_column(t, i);
                if (j < d) cuda::store_as<T>(dtype, y, base + j, cuda::m_tanh(a * xv[i]) * w[i] + b[i]);
            }
        }
    }
}

// Block c handles rows [c * rows / chunks, (c + 1) * rows / chunks): dx for each, its partial rows
// dw_partial[c] (d) and db_partial[c] (d) when wanted (null otherwise), as norm_backward_kernel, and
// da_partial[c]: the block's sum of dy * w * x * (1 - t^2) (each thread's running sum over its columns
// of the chunk's rows in order, then block_sum).
template <typename T>
__global__ void __launch_bounds__(kMaxNormThreads)
    dyt_backward_kernel(DType dtype, const void* dy, const void* x, const void* alpha, const void* weight, void* dx,
                        T* da_partial, T* dw_partial, T* db_partial, int64_t rows, int64_t d, int64_t chunks) {
    __shared__ T scratch[32];
    const int64_t c = blockIdx.x;
    const int64_t tiles = row_tiles(d);
    const T a = cuda::load_as<T>(dtype, alpha, 0);
    T* dw_row = dw_partial ? dw_partial + c * d : nullptr;  // (d)
    T* db_row = db_partial ? db_partial + c * d : nullptr;  // (d)
    // One-tile rows sum their columns in registers and store once; wider rows add into the partial rows
    // in place, which start at zero. Column j is touched only by thread j % blockDim.x: no barrier.
    T dw_acc[kTileItems], db_acc[kTileItems];
#pragma unroll
    for (int i = 0; i < kTileItems; ++i) dw_acc[i] = db_acc[i] = T(0);
    for (int64_t j = threadIdx.x; tiles > 1 && j < d; j += blockDim.x) {
        if (dw_row) dw_row[j] = T(0);
        if (db_row) db_row[j] = T(0);
    }
    T da = T(0);
    const int64_t row_end = (c + 1) * rows / chunks;
    for (int64_t r = c * rows / chunks; r < row_end; ++r) {
        const int64_t base = r * d;
        for (int64_t t = 0; t < tiles; ++t) {
            T xv[kTileItems], dyv[kTileItems], w[kTileItems];  // this thread's tiles of x, dy and the weight
            load_tile(dtype, x, base, d, t, T(0), xv);
            load_tile(dtype, dy, base, d, t, T(0), dyv);
            load_tile(dtype, weight, 0, weight ? d : 0, t, T(1), w);
#pragma unroll
            for (int i = 0; i < kTileItems; ++i) {
                const int64_t j = tile_column(t, i);
                if (j >= d) continue;
                const T th = cuda::m_tanh(a * xv[i]);
                const T dt = dyv[i] * w[i] * (T(1) - th * th);  // d loss / d (alpha x_j)
                cuda::store_as<T>(dtype, dx, base + j, dt * a);
                da += dt * xv[i];
                if (tiles == 1) {
                    dw_acc[i] += dyv[i] * th;
                    db_acc[i] += dyv[i];
                } else {
                    if (dw_row) dw_row[j] += dyv[i] * th;
                    if (db_row) db_row[j] += dyv[i];
                }
            }
        }
    }
    if (tiles == 1) {
#pragma unroll
        for (int i = 0; i < kTileItems; ++i) {
            const int64_t j = tile_column(0, i);
            if (j >= d) continue;
            if (dw_row) dw_row[j] = dw_acc[i];
            if (db_row) db_row[j] = db_acc[i];
        }
    }
    da = cuda::block_sum(da, scratch);  // every thread of the block reaches it
    if (threadIdx.x == 0 && da_partial) da_partial[c] = da;
}

template <typename T>
void dyt_backward_typed(int device, const DytBackwardArgs& a) {
    const int64_t chunks = std::min(a.rows, kMaxChunks), d = a.d;
    const size_t partial_bytes = static_cast<size_t>(chunks * d) * sizeof(T);
    Scratch da_partial(device, a.dalpha ? static_cast<size_t>(chunks) * sizeof(T) : 0);  // (chunks)
    Scratch dw_partial(device, a.dweight ? partial_bytes : 0);                          // (chunks, d)
    Scratch db_partial(device, a.dbias ? partial_bytes : 0);                            // (chunks, d)
    if (chunks > 0) {
        NL_LAUNCH(dyt_backward_kernel<T>, static_cast<unsigned>(chunks), norm_threads(d))(
            a.dtype, a.dy, a.x, a.alpha, a.weight, a.dx, da_partial.as<T>(), dw_partial.as<T>(), db_partial.as<T>(),
            a.rows, d, chunks);
        NL_CUDA_CHECK_LAUNCH();
    }
    // The (chunks) dalpha partials are a (chunks, 1) partial-row matrix: the same fixed-order sum.
    for (auto [partial, out, width] : {std::tuple{&da_partial, a.dalpha, int64_t{1}},
                                       std::tuple{&dw_partial, a.dweight, d}, std::tuple{&db_partial, a.dbias, d}}) {
        if (out == nullptr) continue;
        NL_LAUNCH(sum_partials_kernel<T>, cuda::blocks_for((width + 31) / 32, 1), kSumGroups * 32)(
            a.dtype, partial->template as<T>(), out, chunks, width);
        NL_CUDA_CHECK_LAUNCH();
    }
}

}  // namespace

void CudaBackend::norm_forward(const NormForwardArgs& a) {
    check_kernel_args(a);
    if (a.rows == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::row_blocks(a.rows);
    if (a.dtype == DType::F64) {
        NL_LAUNCH(norm_forward_kernel<double>, blocks, norm_threads(a.d))(
            a.dtype, a.x, a.weight, a.bias, a.y, static_cast<double*>(a.mean), static_cast<double*>(a.rstd), a.rows,
            a.d, a.eps, a.subtract_mean, a.stat_count);
    } else {
        NL_LAUNCH(norm_forward_kernel<float>, blocks, norm_threads(a.d))(
            a.dtype, a.x, a.weight, a.bias, a.y, static_cast<float*>(a.mean), static_cast<float*>(a.rstd), a.rows,
            a.d, static_cast<float>(a.eps), a.subtract_mean, a.stat_count);
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::norm_backward(const NormBackwardArgs& a) {
    check_kernel_args(a);
    cuda::DeviceGuard guard(index_);
    if (a.dtype == DType::F64) {
        norm_backward_typed<double>(index_, a);
    } else {
        norm_backward_typed<float>(index_, a);
    }
}

void CudaBackend::dyt_forward(const DytForwardArgs& a) {
    check_kernel_args(a);
    if (a.rows == 0) return;
    cuda::DeviceGuard guard(index_);
    const unsigned blocks = cuda::row_blocks(a.rows);
    if (a.dtype == DType::F64) {
        NL_LAUNCH(dyt_forward_kernel<double>, blocks, norm_threads(a.d))(a.dtype, a.x, a.alpha, a.weight, a.bias, a.y,
                                                                         a.rows, a.d);
    } else {
        NL_LAUNCH(dyt_forward_kernel<float>, blocks, norm_threads(a.d))(a.dtype, a.x, a.alpha, a.weight, a.bias, a.y,
                                                                        a.rows, a.d);
    }
    NL_CUDA_CHECK_LAUNCH();
}

void CudaBackend::dyt_backward(const DytBackwardArgs& a) {
    check_kernel_args(a);
    cuda::DeviceGuard guard(index_);
    if (a.dtype == DType::F64) {
        dyt_backward_typed<double>(index_, a);
    } else {
        dyt_backward_typed<float>(index_, a);
    }
}

}  // namespace nl
