// Data-parallel training over MPI ranks (core/dist.h), as PyTorch DDP: every rank holds the whole
// model, computes the gradient of its share of the global batch, and the gradients are summed over
// ranks in buckets started during backward, as each bucket's gradients become final, so
// communication overlaps the rest of backward. See docs/distributed.md.
//
// A batch's gradient is defined as a fixed-order sum over a fixed number of shards S (train.grad_shards;
// 0 means one shard per rank): shard k holds rows [k B/S, (k+1) B/S) of the global batch of B rows,
// each rank takes S/N consecutive shards, and the shard gradients are added as a tree that halves
// while the count is even and then adds left to right (tree_sum below). With N a power of two, the
// ranks' part of that tree is exactly the recursive doubling of dist::AllReduceQueue, so 1, 2, 4 ...
// ranks with the same S compute the same bits (at one OpenMP thread per rank).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/var.h"
#include "core/dist.h"
#include "layers/module.h"

namespace nl {

// Which rows of the global batch this rank computes, and as how many shards.
struct ShardPlan {
    int64_t batch = 0;         // B: the global batch
    int64_t shards = 0;        // S: shards of the global batch (a multiple of the world size)
    int64_t local_shards = 0;  // S / N on each rank
    int64_t shard_rows = 0;    // B / S
    int64_t first_shard = 0;   // this rank's first shard: rank * S / N
};

// nl::Error "<where>/batch_size: ..." or "<where>/grad_shards: ..." naming both numbers when N does
// not divide B or S, or S does not divide B. `where` is "<file>: /train".
ShardPlan plan_shards(int64_t batch, int64_t grad_shards, int world, int rank, const std::string& where);

// The fixed-order sum over shards: halves while the count is even, then left to right.
// out[i] = tree over k of shards[k][begin + i], for i < end - begin.
void tree_sum(const std::vector<const float*>& shards, int64_t begin, int64_t end, float* out);
double tree_sum(const std::vector<double>& values);

class DataParallel {
public:
    // `params` (f32) in the model's order; buckets are filled in reverse order (the order backward
    // finishes them) up to bucket_bytes each. With overlap off, every bucket is sent after backward (for
    // measuring what the overlap hides). On the CPU the sums go through MPI on host buffers; on a GPU
    // (one shard per rank) through NCCL on a device buffer (dist::device_allreduce_sum), untested on GPUs.
    DataParallel(const NamedVars& params, int64_t local_shards, int64_t bucket_bytes, bool overlap);

    // Backward of this rank's local shard `shard` (0 .. local_shards - 1), whose loss is already
    // weighted by its share of the global batch. After the last shard every parameter's .grad holds the
    // sum over all shards of all ranks (the global batch's gradient), the same bits on every rank.
    void backward(const Var& loss, int64_t shard);

    int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }  // 0 in one process, one shard
    // Seconds blocked waiting for communication after backward, summed since the last reset.
    double comm_wait_seconds() const { return queue_.wait_seconds(); }
    void reset_comm_wait() { queue_.reset_wait_seconds(); }

private:
    struct Bucket {
        size_t first_param = 0, end_param = 0;  // params_[first_param .. end_param)
        int64_t begin = 0, end = 0;             // flat offsets
        size_t ready = 0;                       // params of this bucket whose gradient is final
    };
    void mark_ready(size_t index);
    void launch_ready_buckets();

    std::vector<Var> params_;                       // bucket order (reverse of the model's)
    std::vector<int64_t> offsets_;                  // flat offset of each param
    std::vector<size_t> bucket_of_;                 // param -> bucket
    std::unordered_map<const VarImpl*, size_t> index_of_;
    std::vector<Bucket> buckets_;
    int64_t total_ = 0;                             // P: parameters' elements
    int64_t local_shards_ = 1;
    bool overlap_ = true;
    bool passthrough_ = false;                      // one process, one shard: loss.backward() alone
    std::vector<std::vector<float>> shard_grads_;   // (local_shards, P) when local_shards > 1
    std::vector<float> reduced_;                    // (P,) the summed gradient, bucket order
    bool on_device_ = false;                        // parameters on a GPU: NCCL on device_flat_
    Tensor device_flat_;                            // (P,) on the GPU, bucket order
    std::vector<bool> ready_;                       // (params,) this step's gradient is final
    std::vector<bool> has_grad_;                    // (params,) some shard produced a gradient
    size_t next_bucket_ = 0;
    dist::AllReduceQueue queue_;
};

}  // namespace nl
