// MPI behind core/dist.h (see there for the contract); without NORMLAB_HAVE_MPI, a world of one.
#include "core/dist.h"

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#ifdef NORMLAB_HAVE_MPI
// The C API only: OpenMPI's and MPICH's mpi.h otherwise pull in the removed C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif
#ifdef NORMLAB_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace nl::dist {

namespace {

bool g_started = false;  // MPI_Init_thread was called (and MPI_Finalize is owed)
int g_rank = 0;
int g_size = 1;
thread_local int t_solo = 0;  // SoloGuards alive on this thread: it is a world of one
int g_local_rank = 0;    // among the ranks sharing this machine's memory
#ifdef NORMLAB_HAVE_NCCL
ncclComm_t g_nccl = nullptr;  // made by the first device_allreduce_sum

// NCCL is opened (dlopen) on first use, not linked: a process that imports normlab's Python package
// and then PyTorch must get PyTorch's own (newer) libnccl.so.2, and the dynamic loader keeps the first
// library of a soname it loads. dlopen returns the one already loaded, if any, else the system's,
// else the one CMake found (NORMLAB_NCCL_LIBRARY_PATH).
struct NcclApi {
    decltype(&ncclGetUniqueId) get_unique_id = nullptr;
    decltype(&ncclCommInitRank) comm_init_rank = nullptr;
    decltype(&ncclAllReduce) all_reduce = nullptr;
    decltype(&ncclCommDestroy) comm_destroy = nullptr;
    decltype(&ncclGetErrorString) get_error_string = nullptr;
    std::string path;  // the file the loader opened
};

const NcclApi& nccl() {
    static const NcclApi api = [] {
        void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (library == nullptr) library = dlopen(NORMLAB_NCCL_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
        NL_REQUIRE(library != nullptr, "summing gradients on GPUs needs NCCL: could not open libnccl.so.2 or ",
                   NORMLAB_NCCL_LIBRARY_PATH, " (", dlerror(), ")");
        auto symbol = [library](const char* name) {
            void* found = dlsym(library, name);
            NL_REQUIRE(found != nullptr, "the NCCL library lacks ", name, " (", dlerror(), ")");
            return found;
        };
        NcclApi loaded;
        Dl_info where{};
        if (dladdr(symbol("ncclGetUniqueId"), &where) != 0 && where.dli_fname != nullptr) loaded.path = where.dli_fname;
        loaded.get_unique_id = reinterpret_cast<decltype(&ncclGetUniqueId)>(symbol("ncclGetUniqueId"));
        loaded.comm_init_rank = reinterpret_cast<decltype(&ncclCommInitRank)>(symbol("ncclCommInitRank"));
        loaded.all_reduce = reinterpret_cast<decltype(&ncclAllReduce)>(symbol("ncclAllReduce"));
        loaded.comm_destroy = reinterpret_cast<decltype(&ncclCommDestroy)>(symbol("ncclCommDestroy"));
        loaded.get_error_string = reinterpret_cast<decltype(&ncclGetErrorString)>(symbol("ncclGetErrorString"));
        return loaded;
    }();
    return api;
}
#endif

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// An MPI count is an int: a bigger buffer is a bug of the caller (buckets are far smaller).
int as_count(int64_t count) {
    NL_CHECK(count >= 0 && count <= INT_MAX, "MPI message of ", count, " elements exceeds INT_MAX");
    return static_cast<int>(count);
}

#ifdef NORMLAB_HAVE_MPI
MPI_Datatype mpi_type(const float*) { return MPI_FLOAT; }
MPI_Datatype mpi_type(const double*) { return MPI_DOUBLE; }

// Blocking recursive doubling: after step k every rank holds the sum over its block of 2^(k+1)
// ranks, each pair adding the same two values (commutative, so bit-identical on both partners).
template <typename T>
void recursive_doubling_sum(T* data, int64_t count) {
    std::vector<T> received(static_cast<size_t>(count));  // (count,) the partner's partial sum
    for (int mask = 1; mask < g_size; mask <<= 1) {
        const int partner = g_rank ^ mask;
        MPI_Sendrecv(data, as_count(count), mpi_type(data), partner, 0, received.data(), as_count(count),
                     mpi_type(data), partner, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int64_t i = 0; i < count; ++i) data[i] += received[i];
    }
}

template <typename T>
void deterministic_sum(T* data, int64_t count) {
    if (!g_started || g_size == 1 || t_solo > 0 || count == 0) return;
    if (is_power_of_two(g_size)) return recursive_doubling_sum(data, count);
    MPI_Allreduce(MPI_IN_PLACE, data, as_count(count), mpi_type(data), MPI_SUM, MPI_COMM_WORLD);
}
#else
template <typename T>
void deterministic_sum(T*, int64_t) {}
#endif

// A launcher that starts MPI ranks leaves one of these in each process's environment.
bool launched_by_mpi() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"})
        if (std::getenv(name) != nullptr) return true;
    return false;
}

}  // namespace

bool built_with_mpi() {
#ifdef NORMLAB_HAVE_MPI
    return true;
#else
    return false;
#endif
}

void init(int* argc, char*** argv) {
#ifdef NORMLAB_HAVE_MPI
    if (g_started || !launched_by_mpi()) return;
    // FUNNELED: only the main thread calls MPI (OpenMP workers never do).
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    g_started = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MPI_Comm node;  // the ranks of this machine, ordered by world rank
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &g_local_rank);
    MPI_Comm_free(&node);
#else
    (void)argc;
    (void)argv;
#endif
}

void finalize() {
#ifdef NORMLAB_HAVE_NCCL
    if (g_nccl != nullptr) nccl().comm_destroy(g_nccl);
    g_nccl = nullptr;
#endif
#ifdef NORMLAB_HAVE_MPI
    if (g_started) MPI_Finalize();
    g_started = false;
#endif
}

int rank() { return t_solo > 0 ? 0 : g_rank; }
int local_rank() { return g_local_rank; }
int world_size() { return t_solo > 0 ? 1 : g_size; }

SoloGuard::SoloGuard() { ++t_solo; }
SoloGuard::~SoloGuard() { --t_solo; }

std::string describe() {
    if (t_solo > 0) return "1 process";
    if (g_size == 1) return g_started ? "1 rank (MPI)" : "1 process";
    return std::to_string(g_size) + " ranks (MPI)";
}

void allreduce_sum(float* data, int64_t count) { deterministic_sum(data, count); }
void allreduce_sum(double* data, int64_t count) { deterministic_sum(data, count); }

void allreduce_sum(int64_t* data, int64_t count) {
#ifdef NORMLAB_HAVE_MPI
    if (!g_started || g_size == 1 || t_solo > 0 || count == 0) return;
    MPI_Allreduce(MPI_IN_PLACE, data, as_count(count), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);  // exact
#else
    (void)data;
    (void)count;
#endif
}

void broadcast(void* data, int64_t bytes, int root) {
#ifdef NORMLAB_HAVE_MPI
    if (!g_started || g_size == 1 || t_solo > 0 || bytes == 0) return;
    MPI_Bcast(data, as_count(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
#else
    (void)data;
    (void)bytes;
    (void)root;
#endif
}

std::string broadcast_string(const std::string& text, int root) {
    int64_t length = static_cast<int64_t>(text.size());
    broadcast(&length, sizeof(length), root);
    std::string out = text;
    out.resize(static_cast<size_t>(length));
    broadcast(out.data(), length, root);
    return out;
}

std::vector<std::string> gather(const std::string& bytes, int root) {
    if (!g_started || g_size == 1 || t_solo > 0) return {bytes};
#ifdef NORMLAB_HAVE_MPI
    barrier();
    int length = as_count(static_cast<int64_t>(bytes.size()));
    std::vector<int> lengths(g_rank == root ? g_size : 0);  // (world,) bytes from each rank
    MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, MPI_COMM_WORLD);
    std::vector<int> offsets(lengths.size());
    int64_t total = 0;
    for (size_t r = 0; r < lengths.size(); ++r) {
        offsets[r] = as_count(total);
        total += lengths[r];
    }
    std::string all(static_cast<size_t>(total), '\0');
    MPI_Gatherv(bytes.data(), length, MPI_BYTE, all.data(), lengths.data(), offsets.data(), MPI_BYTE, root,
                MPI_COMM_WORLD);
    std::vector<std::string> out;
    for (size_t r = 0; r < lengths.size(); ++r) out.push_back(all.substr(offsets[r], lengths[r]));
    return out;
#else
    return {bytes};
#endif
}

void barrier() {
#ifdef NORMLAB_HAVE_MPI
    if (!g_started || g_size == 1 || t_solo > 0) return;
    // Polled with short sleeps: a rank that arrives early (a sweep's rank with fewer runs) leaves the
    // CPU to the ranks still working instead of spinning in MPI_Barrier.
    MPI_Request request;
    MPI_Ibarrier(MPI_COMM_WORLD, &request);
    int done = 0;
    while (MPI_Test(&request, &done, MPI_STATUS_IGNORE), !done) std::this_thread::sleep_for(std::chrono::microseconds(200));
#endif
}

void abort(int exit_code) {
#ifdef NORMLAB_HAVE_MPI
    if (g_started) MPI_Abort(MPI_COMM_WORLD, exit_code);
#endif
    std::exit(exit_code);
}

void run_on_every_rank(const std::function<void()>& step) {
#ifndef NORMLAB_HAVE_MPI
    step();
#else
    if (g_size == 1 || t_solo > 0) return step();
    std::string message;
    int exit_code = 0;
    try {
        step();
    } catch (const Error& e) {
        message = e.what();
        exit_code = 2;
    } catch (const std::exception& e) {
        message = e.what();
        exit_code = 1;
    }
    // The lowest failing rank speaks for all (g_size when none failed).
    int first = exit_code != 0 ? g_rank : g_size;
    MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == g_size) return;
    int64_t header[2] = {exit_code, static_cast<int64_t>(message.size())};
    MPI_Bcast(header, 2, MPI_INT64_T, first, MPI_COMM_WORLD);
    message.resize(static_cast<size_t>(header[1]));
    MPI_Bcast(message.data(), as_count(header[1]), MPI_BYTE, first, MPI_COMM_WORLD);
    throw JobError(first == 0 ? message : "rank " + std::to_string(first) + ": " + message,
                   static_cast<int>(header[0]));
#endif
}

// ---- NCCL ----

bool built_with_nccl() {
#ifdef NORMLAB_HAVE_NCCL
    return true;
#else
    return false;
#endif
}

std::string load_nccl() {
#ifdef NORMLAB_HAVE_NCCL
    return nccl().path;
#else
    throw Error("this normlab was built without NCCL (CMake finds nccl.h and libnccl beside the CUDA toolkit)");
#endif
}

void device_allreduce_sum(float* device_data, int64_t count) {
    if (g_size == 1 || t_solo > 0 || count == 0) return;
#ifdef NORMLAB_HAVE_NCCL
    const NcclApi& api = nccl();
    auto check = [&api](ncclResult_t result, const char* what) {
        if (result != ncclSuccess)
            throw std::runtime_error(std::string("NCCL ") + what + " failed: " + api.get_error_string(result));
    };
    if (g_nccl == nullptr) {
        ncclUniqueId id;
        if (g_rank == 0) check(api.get_unique_id(&id), "ncclGetUniqueId");
        MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
        check(api.comm_init_rank(&g_nccl, g_size, id, g_rank), "ncclCommInitRank");  // on the current device
    }
    // Stream 0 is the legacy default stream, where the gradients were computed.
    check(api.all_reduce(device_data, device_data, static_cast<size_t>(count), ncclFloat, ncclSum, g_nccl, 0),
          "ncclAllReduce");
#else
    (void)device_data;
    throw Error("summing gradients on GPUs over MPI ranks needs NCCL, and this normlab was built without it "
                "(CMake finds nccl.h and libnccl beside the CUDA toolkit)");
#endif
}

// ---- AllReduceQueue ----

struct AllReduceQueue::Sum {
    float* data = nullptr;
    int64_t count = 0;
    int tag = 0;
    int mask = 1;                  // recursive doubling: this step's partner is rank ^ mask
    bool posted = false;           // this step's send and receive are in flight
    bool done = false;
    std::vector<float> received;   // (count,) the partner's partial sum
#ifdef NORMLAB_HAVE_MPI
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
#endif
};

AllReduceQueue::AllReduceQueue() = default;

// Sums still in flight are only left when an exception unwinds a step; the job then ends by
// MPI_Abort, and freeing receive buffers MPI may still write into would be worse than leaving them.
AllReduceQueue::~AllReduceQueue() = default;

void AllReduceQueue::start(float* data, int64_t count) {
    if (!g_started || g_size == 1 || t_solo > 0 || count == 0) return;
    auto* sum = new Sum;
    sum->data = data;
    sum->count = count;
    sum->tag = next_tag_;
    next_tag_ = (next_tag_ + 1) % 32000;  // MPI guarantees tags up to 32767
    in_flight_.push_back(sum);
    advance(*sum, false);
}

// Moves `sum` as far as it can go: completes the step in flight (waiting for it when `block`), adds
// the partner's values, posts the next step. True when the sum is complete.
bool AllReduceQueue::advance(Sum& sum, bool block) {
#ifdef NORMLAB_HAVE_MPI
    while (!sum.done) {
        if (sum.posted) {
            int complete = 0;
            if (block) {
                MPI_Waitall(2, sum.requests, MPI_STATUSES_IGNORE);
                complete = 1;
            } else {
                MPI_Testall(2, sum.requests, &complete, MPI_STATUSES_IGNORE);
            }
            if (!complete) return false;
            sum.posted = false;
            if (is_power_of_two(g_size)) {
                for (int64_t i = 0; i < sum.count; ++i) sum.data[i] += sum.received[i];
                sum.mask <<= 1;
                sum.done = sum.mask >= g_size;
            } else {
                sum.done = true;  // MPI_Iallreduce finished in place
            }
            continue;
        }
        if (is_power_of_two(g_size)) {
            const int partner = g_rank ^ sum.mask;
            sum.received.resize(static_cast<size_t>(sum.count));
            MPI_Irecv(sum.received.data(), as_count(sum.count), MPI_FLOAT, partner, sum.tag, MPI_COMM_WORLD,
                      &sum.requests[0]);
            MPI_Isend(sum.data, as_count(sum.count), MPI_FLOAT, partner, sum.tag, MPI_COMM_WORLD, &sum.requests[1]);
        } else {
            MPI_Iallreduce(MPI_IN_PLACE, sum.data, as_count(sum.count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                           &sum.requests[0]);
            sum.requests[1] = MPI_REQUEST_NULL;
        }
        sum.posted = true;
    }
#else
    (void)block;
    sum.done = true;
#endif
    return true;
}

void AllReduceQueue::progress() {
    for (Sum* sum : in_flight_) advance(*sum, false);
}

void AllReduceQueue::wait_all() {
    const auto t0 = std::chrono::steady_clock::now();
    // Polled with short sleeps rather than MPI_Waitall, whose busy wait would take the CPU the partner
    // rank (or anything else on a shared machine) needs to finish its part.
    for (Sum* sum : in_flight_) {
        while (!advance(*sum, false)) std::this_thread::sleep_for(std::chrono::microseconds(20));
        delete sum;
    }
    in_flight_.clear();
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace nl::dist
