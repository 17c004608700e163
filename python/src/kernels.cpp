// Bindings of normlab's fused CPU kernels on plain tensors (core/fused.h, no autograd): the norm
// forward/backward pair behind LayerNorm, RMSNorm, RMSNorm with bias and pRMSNorm, SwiGLU's gate
// and causal attention. normlab.torch wraps them in torch.autograd.Functions that hand PyTorch's
// tensors over by DLPack, so no data is copied either way. Each releases the GIL while it computes.
#include <optional>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include "bindings.h"
#include "core/fused.h"

namespace nl::py {

namespace {

using Guard = nb::call_guard<nb::gil_scoped_release>;

Tensor data_or_none(const std::optional<Var>& v) { return v ? v->data() : Tensor(); }
std::optional<Var> var_or_none(const Tensor& t) { return t.defined() ? std::optional<Var>(Var(t)) : std::nullopt; }

}  // namespace

void bind_kernels(nb::module_& m) {
    m.def("norm_forward",
          [](const Var& x, std::optional<Var> weight, std::optional<Var> bias, double eps, bool subtract_mean,
             int64_t stat_count) {
              NormForward f = norm_forward(x.data(), data_or_none(weight), data_or_none(bias), eps, subtract_mean,
                                           stat_count);
              return std::make_tuple(Var(f.y), var_or_none(f.mean), Var(f.rstd));
          },
          nb::arg("x"), nb::arg("weight").none(), nb::arg("bias").none(), nb::arg("eps"), nb::arg("subtract_mean"),
          nb::arg("stat_count") = -1, Guard(),
          "One norm over the last dim of x (..., d): LayerNorm with subtract_mean (y = (x - mean) * rstd * w + b, "
          "biased variance), else RMSNorm (y = x * rstd * w + b, rstd = 1/sqrt(mean(x^2) + eps)); the statistics "
          "over the first stat_count elements of each row (-1: all; pRMSNorm). Returns (y, mean or None, rstd); "
          "mean and rstd are x.shape[:-1], float64 for float64 x, else float32.");
    m.def("norm_backward",
          [](const Var& dy, const Var& x, std::optional<Var> weight, std::optional<Var> mean, const Var& rstd,
             bool subtract_mean, int64_t stat_count, bool need_dweight, bool need_dbias) {
              NormBackward g = norm_backward(dy.data(), x.data(), data_or_none(weight), data_or_none(mean),
                                             rstd.data(), subtract_mean, stat_count, need_dweight, need_dbias);
              return std::make_tuple(Var(g.dx), var_or_none(g.dweight), var_or_none(g.dbias));
          },
          nb::arg("dy"), nb::arg("x"), nb::arg("weight").none(), nb::arg("mean").none(), nb::arg("rstd"),
          nb::arg("subtract_mean"), nb::arg("stat_count") = -1, nb::arg("need_dweight") = true,
          nb::arg("need_dbias") = true, Guard(),
          "The closed-form backward of norm_forward from its saved mean and rstd: (dx, dweight or None, dbias or "
          "None). The weight and bias gradients sum over rows in a fixed order (the same bits on any thread count).");
    m.def("partial_stat_count", &partial_stat_count, nb::arg("d"), nb::arg("p"),
          "pRMSNorm's statistic size: ceil(p * d) within [1, d].");
    m.def("swiglu_forward", [](const Var& a, const Var& b) { return Var(swiglu_forward(a.data(), b.data())); },
          nb::arg("a"), nb::arg("b"), Guard(), "SwiGLU's gate, silu(a) * b, in one pass.");
    m.def("swiglu_backward",
          [](const Var& dout, const Var& a, const Var& b) {
              SwigluBackward g = swiglu_backward(dout.data(), a.data(), b.data());
              return std::make_tuple(Var(g.da), Var(g.db));
          },
          nb::arg("dout"), nb::arg("a"), nb::arg("b"), Guard(), "The gate's gradients (da, db) in one pass.");
    m.def("attention_forward",
          [](const Var& q, const Var& k, const Var& v) {
              AttentionForward f = attention_forward(q.data(), k.data(), v.data());
              return std::make_tuple(Var(f.out), Var(f.lse));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), Guard(),
          "Causal attention (FlashAttention's tiles and online softmax): q (B, T, H, hd), k and v (B, L, KV, hd) "
          "with KV dividing H (grouped-query heads), scores scaled by 1/sqrt(hd). Returns (out (B, T, H, hd), lse "
          "(B, H, T)).");
    m.def("attention_backward",
          [](const Var& dout, const Var& q, const Var& k, const Var& v, const Var& out, const Var& lse) {
              AttentionBackward g = attention_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data());
              return std::make_tuple(Var(g.dq), Var(g.dk), Var(g.dv));
          },
          nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), Guard(),
          "The attention's gradients (dq, dk, dv), the probabilities recomputed from lse tile by tile.");
}

}  // namespace nl::py
