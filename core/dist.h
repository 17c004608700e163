// The communication layer for running one job over several processes (ranks): MPI when normlab is
// built with it (NORMLAB_MPI) and launched by mpirun or srun, otherwise a single-process fallback in
// which rank() is 0, world_size() is 1 and every collective is a no-op. Host buffers only.
//
// Sums are deterministic: with a power-of-two number of ranks, allreduce_sum and the nonblocking
// AllReduceQueue add by recursive doubling (step k exchanges with rank ^ 2^k), so every rank ends with
// the same balanced-tree sum ((r0 + r1) + (r2 + r3)), bit for bit, whatever MPI's own reduction order
// (x + y == y + x in IEEE arithmetic, so the two partners agree). Other sizes use MPI_Allreduce.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace nl::dist {

// True when this binary was built with MPI.
bool built_with_mpi();
// Starts MPI when the process was launched by an MPI launcher (mpirun's OMPI_COMM_WORLD_SIZE, a PMI
// or PMIx rank); otherwise (or without MPI) the process is a world of one. Call once, first thing.
void init(int* argc, char*** argv);
// MPI_Finalize when init started MPI.
void finalize();

int rank();
int world_size();
inline bool is_root() { return rank() == 0; }

// While one is alive, the calling thread is a world of one: rank() 0, world_size() 1, every
// collective a no-op. A sweep runs each of its runs alone this way, on whichever rank or thread it
// was dealt to (jobs/grid_runner.h), with the job's own code unchanged. Nests; per thread.
class SoloGuard {
public:
    SoloGuard();
    ~SoloGuard();
    SoloGuard(const SoloGuard&) = delete;
    SoloGuard& operator=(const SoloGuard&) = delete;
};
// "1 process", "2 ranks (MPI)".
std::string describe();

// Element-wise sum over ranks, in place, the same bits on every rank (see above).
void allreduce_sum(float* data, int64_t count);
void allreduce_sum(double* data, int64_t count);
void allreduce_sum(int64_t* data, int64_t count);
// Root's bytes copied to every rank.
void broadcast(void* data, int64_t bytes, int root = 0);
// Root's string on every rank.
std::string broadcast_string(const std::string& text, int root = 0);
// Each rank's bytes; the root receives all of them (index = rank), other ranks an empty list. Starts
// with barrier(), so ranks that finish early wait without spinning.
std::vector<std::string> gather(const std::string& bytes, int root = 0);
// Returns once every rank has called it; waits without spinning.
void barrier();
// Ends the whole job now (MPI_Abort: mpirun names this rank and stops the others).
[[noreturn]] void abort(int exit_code);

// ---- GPUs: NCCL (built only where MPI, CUDA and NCCL are all found; see docs/distributed.md) ----

// True when this binary has the NCCL path.
bool built_with_nccl();
// Opens NCCL now (it is opened at run time, on first use; see core/dist.cpp) and returns the path the
// loader took it from; nl::Error naming the library or the missing function where that fails, or
// where built without NCCL.
std::string load_nccl();
// This rank's index among the ranks on its machine (rank r there uses local GPU local_rank()); 0 alone.
int local_rank();
// Sum over ranks of `count` floats in GPU memory on the current device, in place, enqueued on the
// legacy default stream after the kernels that wrote them (normlab's kernels all run there). The
// NCCL communicator is made on the first call: rank 0's ncclUniqueId reaches the others by MPI_Bcast.
// Not bit-deterministic across rank counts (NCCL picks its own reduction order). nl::Error without NCCL.
void device_allreduce_sum(float* device_data, int64_t count);

// An error every rank throws together (run_on_every_rank): the message of the lowest failing rank.
// main prints it once (rank 0) and every rank exits with exit_code, without MPI_Abort.
class JobError : public Error {
public:
    JobError(const std::string& message, int exit_code) : Error(message), exit_code(exit_code) {}
    int exit_code;  // 2: a user mistake (nl::Error), 1: anything else
};

// Runs `step` on every rank, then agrees: when it threw on any rank, every rank throws JobError with
// the lowest failing rank's message (prefixed "rank R: " when that is not rank 0). Use it around work
// that can fail on some ranks only (rank 0 creating the run directory) so that no rank is left
// waiting in a collective. In a world of one, `step`'s exception passes through unchanged.
void run_on_every_rank(const std::function<void()>& step);

// ---- nonblocking sums, for overlapping gradient communication with backward ----

// Sums started one by one (start), advanced whenever progress() is called, completed by wait_all().
// Every rank must start the same sums in the same order. The buffers must stay alive and untouched
// until wait_all returns. Deterministic as allreduce_sum.
class AllReduceQueue {
public:
    AllReduceQueue();
    ~AllReduceQueue();
    AllReduceQueue(const AllReduceQueue&) = delete;
    AllReduceQueue& operator=(const AllReduceQueue&) = delete;

    void start(float* data, int64_t count);
    void progress();  // tests the sums in flight and posts their next step; never blocks
    void wait_all();  // blocks until every started sum is complete
    // Seconds spent blocked in wait_all since the last reset (communication not hidden by compute).
    double wait_seconds() const { return wait_seconds_; }
    void reset_wait_seconds() { wait_seconds_ = 0.0; }

private:
    struct Sum;
    bool advance(Sum& sum, bool block);
    std::vector<Sum*> in_flight_;
    int next_tag_ = 0;
    double wait_seconds_ = 0.0;
};

}  // namespace nl::dist
