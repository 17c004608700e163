// Data-parallel gradients over ranks: shard plan, fixed-order shard sums, buckets started from the
// backward engine's ready hook (see distributed.h).
#include "jobs/distributed.h"

#include <cstring>

#include <fmt/core.h>

#include "autograd/grad_ready.h"
#include "core/error.h"

namespace nl {

ShardPlan plan_shards(int64_t batch, int64_t grad_shards, int world, int rank, const std::string& where) {
    if (batch % world != 0)
        throw Error(fmt::format("{}/batch_size: expected a multiple of the {} ranks (the global batch is split "
                                "into equal shards), got {}",
                                where, world, batch));
    ShardPlan plan;
    plan.batch = batch;
    plan.shards = grad_shards > 0 ? grad_shards : world;
    if (plan.shards % world != 0)
        throw Error(fmt::format("{}/grad_shards: expected a multiple of the {} ranks (each rank takes an equal "
                                "number of shards), got {}",
                                where, world, plan.shards));
    if (batch % plan.shards != 0)
        throw Error(fmt::format("{}/grad_shards: expected a divisor of /train/batch_size = {} (shards are equal), "
                                "got {}",
                                where, batch, plan.shards));
    plan.local_shards = plan.shards / world;
    plan.shard_rows = batch / plan.shards;
    plan.first_shard = static_cast<int64_t>(rank) * plan.local_shards;
    return plan;
}

namespace {

// Recursive on [lo, hi): halves while even (so a power-of-two world's ranks each hold whole subtrees),
// else adds left to right. `scratch` holds one partial sum per recursion level.
void tree_sum_range(const std::vector<const float*>& shards, size_t lo, size_t hi, int64_t begin, int64_t n,
                    float* out) {
    const size_t count = hi - lo;
    if (count % 2 == 0 && count > 0) {
        const size_t mid = lo + count / 2;
        std::vector<float> right(static_cast<size_t>(n));  // (n,) the right half's sum
        tree_sum_range(shards, lo, mid, begin, n, out);
        tree_sum_range(shards, mid, hi, begin, n, right.data());
        for (int64_t i = 0; i < n; ++i) out[i] += right[i];
        return;
    }
    std::memcpy(out, shards[lo] + begin, static_cast<size_t>(n) * sizeof(float));
    for (size_t k = lo + 1; k < hi; ++k)
        for (int64_t i = 0; i < n; ++i) out[i] += shards[k][begin + i];
}

double tree_sum_range(const std::vector<double>& values, size_t lo, size_t hi) {
    const size_t count = hi - lo;
    if (count % 2 == 0 && count > 0) {
        const size_t mid = lo + count / 2;
        return tree_sum_range(values, lo, mid) + tree_sum_range(values, mid, hi);
    }
    double total = values[lo];
    for (size_t k = lo + 1; k < hi; ++k) total += values[k];
    return total;
}

}  // namespace

void tree_sum(const std::vector<const float*>& shards, int64_t begin, int64_t end, float* out) {
    NL_CHECK(!shards.empty() && end >= begin);
    tree_sum_range(shards, 0, shards.size(), begin, end - begin, out);
}

double tree_sum(const std::vector<double>& values) {
    NL_CHECK(!values.empty());
    return tree_sum_range(values, 0, values.size());
}

DataParallel::DataParallel(const NamedVars& params, int64_t local_shards, int64_t bucket_bytes, bool overlap)
    : local_shards_(local_shards), overlap_(overlap) {
    NL_CHECK(local_shards >= 1 && bucket_bytes > 0);
    // One process, one shard: plain backward (no copies; any device).
    passthrough_ = dist::world_size() == 1 && local_shards == 1;
    if (passthrough_) return;
    on_device_ = !params.empty() && params.front().second.device().is_cuda();
    NL_REQUIRE(!on_device_ || local_shards == 1, "data-parallel training on GPUs takes one shard per rank (",
               "/train/grad_shards 0 or the number of ranks), found ", local_shards, " shards per rank");
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
        const Var& p = it->second;
        NL_REQUIRE(p.dtype() == DType::F32 && p.device() == params.front().second.device(),
                   "data-parallel training: parameter ", it->first, " must be f32 on ", params.front().second.device().str(),
                   ", found ", dtype_name(p.dtype()), " on ", p.device().str());
        index_of_[p.impl().get()] = params_.size();
        params_.push_back(p);
        offsets_.push_back(total_);
        total_ += p.numel();
    }
    // Buckets of consecutive parameters (bucket order), closed once they reach bucket_bytes.
    const int64_t bucket_elements = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(sizeof(float)));
    for (size_t i = 0; i < params_.size(); ++i) {
        if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= bucket_elements)
            buckets_.push_back({i, i, offsets_[i], offsets_[i], 0});
        buckets_.back().end_param = i + 1;
        buckets_.back().end = offsets_[i] + params_[i].numel();
        bucket_of_.push_back(buckets_.size() - 1);
    }
    if (local_shards_ > 1)
        shard_grads_.assign(static_cast<size_t>(local_shards_), std::vector<float>(static_cast<size_t>(total_)));
    if (on_device_) device_flat_ = Tensor::empty({total_}, DType::F32, params.front().second.device());
    else reduced_.assign(static_cast<size_t>(total_), 0.0f);
    ready_.assign(params_.size(), false);
    has_grad_.assign(params_.size(), false);
}

// Copies parameter `index`'s gradient (zeros without one) into this step's last-shard buffer.
void DataParallel::mark_ready(size_t index) {
    if (ready_[index]) return;
    ready_[index] = true;
    const Var& p = params_[index];
    if (on_device_) {  // a device-to-device copy on the default stream, ordered after backward's kernels
        const Var grad = p.grad();
        Tensor slot = device_flat_.narrow(0, offsets_[index], p.numel());
        if (grad.defined()) {
            has_grad_[index] = true;
            slot.copy_(grad.data().reshape({p.numel()}));
        } else {
            slot.copy_(zeros({p.numel()}, DType::F32, p.device()));
        }
        ++buckets_[bucket_of_[index]].ready;
        return;
    }
    float* slot = (local_shards_ > 1 ? shard_grads_.back().data() : reduced_.data()) + offsets_[index];
    const Var grad = p.grad();
    if (grad.defined()) {
        has_grad_[index] = true;
        const Tensor g = grad.data().contiguous();
        std::memcpy(slot, g.data<float>(), static_cast<size_t>(p.numel()) * sizeof(float));
    } else {
        std::memset(slot, 0, static_cast<size_t>(p.numel()) * sizeof(float));
    }
    ++buckets_[bucket_of_[index]].ready;
}

// Starts the sums of complete buckets, in bucket order (every rank starts the same sums in the same order).
void DataParallel::launch_ready_buckets() {
    while (next_bucket_ < buckets_.size()) {
        Bucket& bucket = buckets_[next_bucket_];
        if (bucket.ready < bucket.end_param - bucket.first_param) break;
        if (on_device_) {
            dist::device_allreduce_sum(device_flat_.data<float>() + bucket.begin, bucket.end - bucket.begin);
            ++next_bucket_;
            continue;
        }
        float* out = reduced_.data() + bucket.begin;
        if (local_shards_ > 1) {
            std::vector<const float*> shards;
            for (const auto& g : shard_grads_) shards.push_back(g.data());
            tree_sum(shards, bucket.begin, bucket.end, out);
        }
        queue_.start(out, bucket.end - bucket.begin);
        ++next_bucket_;
    }
    queue_.progress();
}

void DataParallel::backward(const Var& loss, int64_t shard) {
    NL_CHECK(shard >= 0 && shard < local_shards_);
    if (passthrough_) return loss.backward();
    if (shard == 0) std::fill(has_grad_.begin(), has_grad_.end(), false);
    if (shard < local_shards_ - 1) {
        // An earlier local shard: keep its gradient aside for the fixed-order sum, then clear .grad.
        loss.backward();
        for (size_t i = 0; i < params_.size(); ++i) {
            float* slot = shard_grads_[static_cast<size_t>(shard)].data() + offsets_[i];
            const Var grad = params_[i].grad();
            if (grad.defined()) {
                has_grad_[i] = true;
                const Tensor g = grad.data().contiguous();
                std::memcpy(slot, g.data<float>(), static_cast<size_t>(params_[i].numel()) * sizeof(float));
            } else {
                std::memset(slot, 0, static_cast<size_t>(params_[i].numel()) * sizeof(float));
            }
            params_[i].zero_grad();
        }
        return;
    }

    // The last local shard: buckets go out as backward finishes them.
    std::fill(ready_.begin(), ready_.end(), false);
    for (Bucket& bucket : buckets_) bucket.ready = 0;
    next_bucket_ = 0;
    {
        GradReadyFn on_ready;
        if (overlap_)
            on_ready = [this](VarImpl& leaf) {
                auto it = index_of_.find(&leaf);
                if (it == index_of_.end()) return;  // a leaf that is not a parameter
                mark_ready(it->second);
                launch_ready_buckets();
            };
        GradReadyGuard guard(std::move(on_ready));
        loss.backward();
    }
    for (size_t i = 0; i < params_.size(); ++i) mark_ready(i);  // parameters backward did not reach
    launch_ready_buckets();
    queue_.wait_all();

    // The global gradient back into .grad (parameters no shard reached keep none, as in one process).
    for (size_t i = 0; i < params_.size(); ++i) {
        Var& p = params_[i];
        if (!has_grad_[i]) {
            p.zero_grad();
            continue;
        }
        if (on_device_) {
            p.set_grad(Var(device_flat_.narrow(0, offsets_[i], p.numel()).reshape(p.shape()).clone()));
            continue;
        }
        Tensor g = Tensor::empty(p.shape(), DType::F32);
        std::memcpy(g.data<float>(), reduced_.data() + offsets_[i], static_cast<size_t>(p.numel()) * sizeof(float));
        p.set_grad(Var(g));
    }
}

}  // namespace nl
