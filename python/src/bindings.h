// The Python extension normlab._normlab: one binding file per area, each adding its part of the
// module through one function declared here (module.cpp calls them in order), plus the
// conversions between Python values and normlab's that several areas share. The Python-level
// package (python/normlab/) builds PyTorch's names and conveniences on top.
#pragma once

#include <cstdint>
#include <string>

#include <nanobind/nanobind.h>

#include "autograd/autograd.h"

namespace nl::py {

namespace nb = nanobind;

// normlab.Tensor is an autograd Var; module.cpp registers the class and hands it to the areas
// that add its methods.
using TensorClass = nb::class_<Var>;

void bind_tensor(nb::module_& m, TensorClass& t);    // tensor.cpp: dtypes, Tensor, creation, NumPy and DLPack
void bind_ops(nb::module_& m, TensorClass& t);       // ops.cpp: arithmetic, math, reductions, shapes, indexing
void bind_autograd(nb::module_& m, TensorClass& t);  // autograd.cpp: grad mode, backward, grad, gradcheck, graphs
void bind_nn(nb::module_& m);        // nn.cpp: normlab's layers (Module, Linear, the norms, the transformer)
void bind_optim(nb::module_& m);     // optim.cpp: SGD, Adam, AdamW, clipping, schedules
void bind_jobs(nb::module_& m);      // jobs.cpp: train, sample, stability, checkpoints
void bind_kernels(nb::module_& m);   // kernels.cpp: the fused kernels on plain tensors (normlab.torch)

// A shape from a Python sequence of ints (a tuple, list or torch.Size); nl::Error naming `what`
// and the value otherwise.
Shape shape_from(nb::handle sequence, const char* what = "shape");
nb::tuple shape_tuple(const Shape& shape);

// A dtype argument: None (`fallback`), a normlab.dtype, or a name ("float32", "f32", "bfloat16", ...).
DType dtype_from(nb::handle value, DType fallback);

// A Python value as a Var: a Tensor as is, a Python number as a 0-d tensor of `like`'s dtype (so
// `x * 2` keeps x's dtype, as PyTorch's scalars do).
Var var_from(nb::handle value, DType like);

}  // namespace nl::py
