// In-place α-entmax of blocks of attention logits, for the fused_dense backend (attention/fused_dense.py, through
// chunked.BlockSpec.fused_probabilities / fused_jvp), which computes the q·kᵀ products itself and hands them here
// to be scaled, masked and mapped. Part of the fused CPU kernel module (longsparse/cpu_kernel/module.cpp); the row solver is
// the mapping's (mappings/csrc/).
#include <ATen/Parallel.h>
#include <torch/types.h>

#include <atomic>

#include "../../mappings/csrc/entmax_rows.h"

namespace {

// NaN was seen.
template <typename scalar_t>
inline void transform_row(scalar_t* x, int64_t limit, scalar_t sc, scalar_t slope, int64_t pos,
                          scalar_t& m, bool& nan) {
  int64_t j = 0;
#if defined(__AVX2__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    const __m256 vs = _mm256_set1_ps(sc), vslope = _mm256_set1_ps(slope);
    const __m256 step = _mm256_set1_ps(8.0f);
    __m256 dist = _mm256_setr_ps(0, -1, -2, -3, -4, -5, -6, -7);      // (pos − j) − pos for j = 0..7
    dist = _mm256_add_ps(dist, _mm256_set1_ps(static_cast<float>(pos)));
    __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    __m256 vnan = _mm256_setzero_ps();
    for (; j + 8 <= limit; j += 8) {
      const __m256 adist = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), dist);   // |pos − j|
      __m256 v = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), vs), _mm256_mul_ps(vslope, adist));
      _mm256_storeu_ps(x + j, v);
      vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      vmax = _mm256_max_ps(vmax, v);
      dist = _mm256_sub_ps(dist, step);
    }
    alignas(32) float buf[8];
    _mm256_store_ps(buf, vmax);
    for (float b : buf) m = b > m ? b : m;
    nan |= _mm256_movemask_ps(vnan) != 0;
  }
#endif
  for (; j < limit; ++j) {
    scalar_t v = x[j] * sc - slope * static_cast<scalar_t>(std::abs(pos - j));
    x[j] = v; nan |= (v != v); m = v > m ? v : m;
  }
}

}  // namespace

namespace longsparse {

// z: (G, n, kend) raw q·kᵀ products of G (batch × head) rows-blocks; row r of block g is the query at
// absolute position first_pos + r. In place: x = z·scale − slope_g·|pos − j|, −inf for j > pos when
// causal, then α-entmax of x. One read-modify-write pass and the candidate pass per row; no other
// score-sized buffer is touched. Returns 1 if a NaN or +inf was met (the caller raises).
int64_t entmax_scores_forward(torch::Tensor z, torch::Tensor alpha, double scale, int64_t first_pos,
                              bool causal, torch::Tensor slopes) {
  TORCH_CHECK(z.dim() == 3 && z.is_contiguous(), "entmax kernel: scores must be a contiguous (G, n, kend) tensor");
  TORCH_CHECK(alpha.dim() == 1 && alpha.size(0) == z.size(0) && alpha.scalar_type() == torch::kFloat64,
              "entmax kernel: alpha must be float64 of shape (G,)");
  const bool has_slopes = slopes.numel() > 0;
  TORCH_CHECK(!has_slopes || (slopes.dim() == 1 && slopes.size(0) == z.size(0) && slopes.scalar_type() == torch::kFloat64),
              "entmax kernel: slopes must be empty or float64 of shape (G,)");
  const int64_t G = z.size(0), n = z.size(1), kend = z.size(2);
  const double* a = alpha.data_ptr<double>();
  const double* sl = has_slopes ? slopes.data_ptr<double>() : nullptr;
  std::atomic<int> bad{0};
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "entmax_scores_forward", [&] {
    scalar_t* zp = z.data_ptr<scalar_t>();
    at::parallel_for(0, G * n, std::max<int64_t>(1, 16384 / std::max<int64_t>(kend, 1)), [&](int64_t b, int64_t e) {
      Cands w;
      RowList<scalar_t> rl;
      for (int64_t row = b; row < e; ++row) {
        const int64_t g = row / n, pos = first_pos + row % n;
        scalar_t* x = zp + row * kend;
        const int64_t limit = causal ? std::min<int64_t>(kend, pos + 1) : kend;
        const scalar_t sc = static_cast<scalar_t>(scale);
        const scalar_t slope = has_slopes ? static_cast<scalar_t>(sl[g]) : scalar_t(0);
        scalar_t m = -std::numeric_limits<scalar_t>::infinity();
        bool nan = false;
        transform_row<scalar_t>(x, limit, sc, slope, pos, m, nan);
        if (nan || m == std::numeric_limits<scalar_t>::infinity()) { bad.store(1); std::fill(x, x + kend, scalar_t(0)); continue; }
        // entmax over the visible prefix; the future part is zero
        forward_row<scalar_t>(x, x, limit, a[g], static_cast<double>(m), rl, w);
        std::fill(x + limit, x + kend, scalar_t(0));
      }
    });
  });
  return bad.load();
}

// In place on dp: dz = scale · u ⊙ (dp − Σ u dp / Σ u), u = p^{2−α}.
void entmax_scores_backward(torch::Tensor p, torch::Tensor dp, torch::Tensor alpha, double scale) {
  TORCH_CHECK(p.dim() == 3 && p.is_contiguous() && dp.is_contiguous() && dp.sizes() == p.sizes() &&
              dp.scalar_type() == p.scalar_type(), "entmax kernel: p and dp must be contiguous (G, n, kend) of one dtype");
  const int64_t G = p.size(0), n = p.size(1), kend = p.size(2);
  const double* a = alpha.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "entmax_scores_backward", [&] {
    const scalar_t* pp = p.data_ptr<scalar_t>();
    scalar_t* gp = dp.data_ptr<scalar_t>();
    const scalar_t sc = static_cast<scalar_t>(scale);
    at::parallel_for(0, G * n, std::max<int64_t>(1, 16384 / std::max<int64_t>(kend, 1)), [&](int64_t b, int64_t e) {
      std::vector<scalar_t> tmp(kend);
      for (int64_t row = b; row < e; ++row) {
        scalar_t* g = gp + row * kend;
        backward_row<scalar_t>(pp + row * kend, g, tmp.data(), kend, a[row / n]);
        for (int64_t j = 0; j < kend; ++j) g[j] = tmp[j] * sc;
      }
    });
  });
}

}  // namespace longsparse
