// matmul with torch.matmul semantics (1-D, 2-D and broadcast-batched operands) on the backend's
// batched gemm. Transposed views reach BLAS as transpose flags and broadcast batch dims as stride 0,
// so the common cases copy nothing but the output.
#include <algorithm>

#include "core/backend.h"
#include "core/ops.h"

namespace nl {

namespace {

// One operand of a batched gemm: every batch matrix is op(M) with M row-major at
// data + p * batch_stride, leading dimension ld. `keep` holds the storage alive when a copy was made.
struct GemmOperand {
    Tensor keep;
    const void* data = nullptr;
    bool trans = false;
    int64_t ld = 0;
    int64_t batch_stride = 0;
};

// The stride that walks all batch dims of `t` (every dim but the last two) as one flat index, or
// false when they do not collapse (e.g. [2, 5] batch dims with strides [12, 0]). Size-1 dims never
// move the index, so their strides do not matter; all-broadcast dims collapse to stride 0.
bool collapse_batch(const Tensor& t, int64_t* stride) {
    const int64_t nbatch = t.dim() - 2;
    int64_t expected = -1;  // stride the next outer non-trivial dim must have
    *stride = 0;
    for (int64_t d = nbatch - 1; d >= 0; --d) {
        const int64_t size = t.shape()[d], st = t.strides()[d];
        if (size == 1) continue;
        if (expected < 0) {
            *stride = st;
        } else if (st != expected) {
            return false;
        }
        expected = st * size;
    }
    return true;
}

// How BLAS can read the matrices (last two dims, rows x cols) of `t` without a copy: row-major when
// the last dim has stride 1, the transpose of a row-major matrix when the second-to-last has.
// BLAS needs ld >= max(1, row length), which also rules out stride-0 (expanded) rows.
bool matrix_layout(const Tensor& t, bool* trans, int64_t* ld) {
    const int64_t rows = t.shape()[t.dim() - 2], cols = t.shape()[t.dim() - 1];
    const int64_t srow = t.strides()[t.dim() - 2], scol = t.strides()[t.dim() - 1];
    if (cols == 1 || scol == 1) {
        const int64_t need = std::max<int64_t>(1, cols);
        const int64_t l = rows == 1 ? need : srow;
        if (l >= need) {
            *trans = false;
            *ld = l;
            return true;
        }
    }
    if (rows == 1 || srow == 1) {
        const int64_t need = std::max<int64_t>(1, rows);
        const int64_t l = cols == 1 ? need : scol;
        if (l >= need) {
            *trans = true;
            *ld = l;
            return true;
        }
    }
    return false;
}

// `t` already expanded to batch + [rows, cols]; packs it only when BLAS cannot read it as it is.
GemmOperand make_operand(const Tensor& t) {
    GemmOperand op;
    op.keep = t;
    if (!matrix_layout(t, &op.trans, &op.ld) || !collapse_batch(t, &op.batch_stride)) {
        op.keep = t.contiguous();
        const bool ok = matrix_layout(op.keep, &op.trans, &op.ld) && collapse_batch(op.keep, &op.batch_stride);
        NL_CHECK(ok, "a contiguous tensor must be readable by gemm");
    }
    op.data = op.keep.data_ptr();
    return op;
}

// The product in out_dtype: a's dtype, or f32 for bf16 operands on the CPU (the backend's gemm
// writes the f32 sums as they are).
Tensor matmul_compute(const Tensor& a, const Tensor& b, DType out_dtype) {
    // torch.matmul: a 1-D left operand is a row vector (prepend 1), a 1-D right operand a column
    // vector (append 1); both extra dims are removed from the result.
    const bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
    const Tensor a2 = a_vec ? a.unsqueeze(0) : a;   // (..., m, k)
    const Tensor b2 = b_vec ? b.unsqueeze(1) : b;   // (..., k, n)
    const int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
    NL_REQUIRE(b2.size(-2) == k, "matmul: cannot multiply ", shape_str(a.shape()), " by ",
               shape_str(b.shape()), " (", k, " != ", b2.size(-2), ")");

    const Shape a_batch(a2.shape().begin(), a2.shape().end() - 2);
    const Shape b_batch(b2.shape().begin(), b2.shape().end() - 2);
    Shape batch;
    try {
        batch = broadcast_shapes(a_batch, b_batch, "matmul");
    } catch (const Error&) {
        throw Error(detail::concat("matmul: batch dims ", shape_str(a_batch), " of ", shape_str(a.shape()),
                                   " and ", shape_str(b_batch), " of ", shape_str(b.shape()),
                                   " do not broadcast"));
    }
    const int64_t nbatch = shape_numel(batch);

    Shape out_shape = batch;  // (batch..., m, n)
    out_shape.push_back(m);
    out_shape.push_back(n);
    Tensor out = Tensor::empty(out_shape, out_dtype, a.device());
    Shape result_shape = batch;  // the 1-D operands' extra dims removed
    if (!a_vec) result_shape.push_back(m);
    if (!b_vec) result_shape.push_back(n);

    if (out.numel() == 0) return out.view(result_shape);
    if (k == 0) {  // an empty sum
        out.zero_();
        return out.view(result_shape);
    }

    Shape a_full = batch, b_full = batch;
    a_full.insert(a_full.end(), {m, k});
    b_full.insert(b_full.end(), {k, n});
    const GemmOperand opa = make_operand(a2.expand(a_full));
    const GemmOperand opb = make_operand(b2.expand(b_full));

    Backend& be = backend_for(a.device());
    // [B, T, C] @ [C, D]: when every batch of b is the same matrix and a's rows run on across its
    // batches, the whole batch is one (B*T, C) @ (C, D) gemm, which BLAS runs much faster than
    // B small ones.
    const bool fold = nbatch > 1 && opb.batch_stride == 0 && !opa.trans && opa.batch_stride == m * opa.ld;
    if (fold) {
        be.gemm(a.dtype(), out_dtype, false, opb.trans, nbatch * m, n, k, 1.0, opa.data, opa.ld, 0, opb.data, opb.ld, 0,
                0.0, out.data_ptr(), n, 0, 1);
    } else {
        be.gemm(a.dtype(), out_dtype, opa.trans, opb.trans, m, n, k, 1.0, opa.data, opa.ld, opa.batch_stride, opb.data,
                opb.ld, opb.batch_stride, 0.0, out.data_ptr(), n, m * n, nbatch);
    }
    return out.view(result_shape);
}

}  // namespace

namespace {
void check_operands(const Tensor& a, const Tensor& b) {
    NL_REQUIRE(a.defined() && b.defined(), "matmul: operand is an undefined tensor");
    NL_REQUIRE(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, found ",
               shape_str(a.shape()), " and ", shape_str(b.shape()));
    NL_REQUIRE(a.dtype() == b.dtype(), "matmul: operands must share a dtype, found ", dtype_name(a.dtype()),
               " and ", dtype_name(b.dtype()));
    NL_REQUIRE(is_floating(a.dtype()), "matmul: expected a floating dtype, found ", dtype_name(a.dtype()));
    NL_REQUIRE(a.device() == b.device(), "matmul: operands must be on one device, found ",
               a.device().str(), " and ", b.device().str());
}
// Whether the backend's gemm takes these operands as they are: bf16 on the CPU (the bf16 gemm: bf16
// operands read as they are, f32 sums); f16, and bf16 on CUDA, are multiplied in f32.
bool gemm_reads(const Tensor& a) { return !is_half(a.dtype()) || (a.dtype() == DType::BF16 && a.device().is_cpu()); }
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
    check_operands(a, b);
    // Where the gemm does not read half operands they are multiplied in f32 and rounded once at the
    // end: the same result up to the order of the f32 sums.
    if (!gemm_reads(a)) return matmul_compute(a.to(DType::F32), b.to(DType::F32), DType::F32).to(a.dtype());
    return matmul_compute(a, b, a.dtype());
}

Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype) {
    check_operands(a, b);
    if (out_dtype == a.dtype()) return matmul(a, b);
    NL_REQUIRE(is_half(a.dtype()) && out_dtype == DType::F32, "matmul: a result in ", dtype_name(out_dtype),
               " for ", dtype_name(a.dtype()), " operands: expected the operands' dtype, or f32 for bf16/f16");
    if (!gemm_reads(a)) return matmul_compute(a.to(DType::F32), b.to(DType::F32), DType::F32);
    return matmul_compute(a, b, DType::F32);
}

}  // namespace nl
