// The fused CPU kernel of α-entmax over rows (entmax_forward / _backward), compiled on first use into one extension
// module with the attention kernels of attention/csrc/ (longsparse/cpu_kernel/module.cpp). The row solver lives
// in entmax_rows.h and tau_solve.h (the attention kernels use it too). The rows, one at a time, rows in
// parallel:
//   forward:  one vectorised max pass that also flags NaN / +inf and keeps its lanes' maxima; a lower bound
//             of τ from them (the τ of 16 entries of the row) or, for fp32 rows with α < 2 other than 1.5
//             and 2, from group_bound (Jensen on value bands); a branch-free pass collecting the entries
//             above that bound (never above −1: τ ≥ −1 always, so nothing else can be in the support),
//             pruned as they are collected on long rows; a bracketed Newton (α = 1.5, 2: exact in closed
//             form once the support is found) or Halley (other α, vectorised powers pow_pd) solve for τ in
//             double on the candidates only; zero the row and write the support. Other α renormalise.
//             Rows with α = 1 are softmax (every entry point: the rows, the attention scores, backward).
//   backward: dz = u ⊙ g − u · (Σ u g)/(Σ u), u = p^{2−α}, two passes.
// Fully masked rows (all -inf) give zeros; rows with a NaN or +inf are reported to the caller (which raises).
#include <ATen/Parallel.h>
#include <torch/types.h>

#include <atomic>
#include <tuple>

#include "entmax_rows.h"

namespace longsparse {

// x: (R, n) contiguous; alpha: (R,) float64 per-row α. Returns (p, code): code 0, or 1 if some row has a
// NaN, 2 if some row has a +inf (those rows are left as zeros; the caller raises).
std::tuple<torch::Tensor, int64_t> entmax_forward(torch::Tensor x, torch::Tensor alpha) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "entmax kernel: x must be a contiguous 2-D tensor");
  TORCH_CHECK(alpha.dim() == 1 && alpha.size(0) == x.size(0) && alpha.scalar_type() == torch::kFloat64 &&
              alpha.is_contiguous(), "entmax kernel: alpha must be contiguous float64 of shape (rows,)");
  TORCH_CHECK(x.size(1) < (int64_t{1} << 31) - 64, "entmax kernel: rows of at most 2^31 − 64 entries");
  auto p = torch::empty_like(x);
  const int64_t R = x.size(0), n = x.size(1);
  const double* a = alpha.data_ptr<double>();
  std::atomic<int> bad{0};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "entmax_forward", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* pp = p.data_ptr<scalar_t>();
    at::parallel_for(0, R, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
      Cands w;
      RowList<scalar_t> rl;
      scalar_t lanes[16];
      int n_lanes = 0;
      for (int64_t r = b; r < e; ++r) {
        scalar_t m;
        if (const int code = row_max<scalar_t>(xp + r * n, n, m, lanes, &n_lanes)) {
          if (code == 1) bad.store(1); else { int zero = 0; bad.compare_exchange_strong(zero, 2); }
          std::fill(pp + r * n, pp + (r + 1) * n, scalar_t(0));
          continue;
        }
        forward_row<scalar_t>(xp + r * n, pp + r * n, n, a[r], static_cast<double>(m), rl, w, lanes, n_lanes);
      }
    });
  });
  return {p, static_cast<int64_t>(bad.load())};
}

// dz = u ⊙ g − u · (Σ u g)/(Σ u), u = p^{2−α}, per row of the contiguous (R, n) p and g; alpha: (R,) float64.
torch::Tensor entmax_backward(torch::Tensor p, torch::Tensor g, torch::Tensor alpha) {
  TORCH_CHECK(p.dim() == 2 && p.is_contiguous() && g.is_contiguous() && g.sizes() == p.sizes(),
              "entmax kernel: p and grad must be contiguous 2-D tensors of one shape");
  TORCH_CHECK(g.scalar_type() == p.scalar_type(), "entmax kernel: p and grad dtypes differ");
  auto dz = torch::empty_like(p);
  const int64_t R = p.size(0), n = p.size(1);
  const double* a = alpha.contiguous().data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "entmax_backward", [&] {
    const scalar_t* pp = p.data_ptr<scalar_t>();
    const scalar_t* gp = g.data_ptr<scalar_t>();
    scalar_t* dp = dz.data_ptr<scalar_t>();
    at::parallel_for(0, R, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) backward_row<scalar_t>(pp + r * n, gp + r * n, dp + r * n, n, a[r]);
    });
  });
  return dz;
}

// x_j ← x_j·scale − slope·|pos − j| for j < limit (symmetric ALiBi, as add_alibi), tracking the max and whether a

}  // namespace longsparse
