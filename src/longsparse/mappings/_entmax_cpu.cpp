// Fused CPU kernel for α-entmax rows (forward and backward), compiled on first use by
// longsparse/mappings/_kernel.py. One row at a time, rows in parallel:
//   forward:  one vectorised max pass; a pass collecting the candidates X_j > -1 (τ ≥ -1 always,
//             so nothing else can be in the support); a bracketed Newton solve for τ in double on
//             the candidates only; zero the row and write the candidates. α = 1.5 and 2 finish in
//             closed form on the support (exact); other α renormalise.
//   backward: dz = u ⊙ g − u · (Σ u g)/(Σ u), u = p^{2−α}, two passes.
// Fully masked rows (all -inf) give zeros. The caller passes each row's max and rejects NaN / +inf.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <type_traits>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <cmath>
#include <limits>
#include <vector>

namespace {

inline int row_mode(double alpha) { return alpha == 1.5 ? 1 : (alpha == 2.0 ? 2 : 0); }

// Bracketed Newton for Σ [X − τ]₊^e = 1 over the candidates X (all > -1, max 0), paired with their
// column indices idx. The lower bracket only rises and τ* ≥ lo, so candidates at or below lo can never
// be in the support: they are dropped as the solve goes, which keeps late iterations tiny.
double solve_tau(std::vector<double>& X, std::vector<int64_t>& idx, double alpha, int mode) {
  const double am1 = alpha - 1.0, e = 1.0 / am1;
  // For α ≤ 2 Newton from the left never passes τ*, so every iterate is a valid drop threshold.
  const bool monotone = alpha <= 2.0;
  double lo = -1.0, hi = -std::pow(static_cast<double>(X.size()), -am1);
  double tau = lo, width = 2.0 * (hi - lo);
  for (int it = 0; it < 400; ++it) {
    double f = -1.0, fp = 0.0;
    size_t kept = 0;
    if (mode == 1) {
      double s1 = 0, s2 = 0;
      for (size_t i = 0; i < X.size(); ++i) {
        double d = X[i] - tau;
        if (d > 0) { s1 += d; s2 += d * d; }
        if (X[i] > (monotone ? tau : lo)) { X[kept] = X[i]; idx[kept++] = idx[i]; }
      }
      f += s2; fp = -2.0 * s1;
    } else if (mode == 2) {
      double s1 = 0; int64_t k = 0;
      for (size_t i = 0; i < X.size(); ++i) {
        double d = X[i] - tau;
        if (d > 0) { s1 += d; ++k; }
        if (X[i] > (monotone ? tau : lo)) { X[kept] = X[i]; idx[kept++] = idx[i]; }
      }
      f += s1; fp = -static_cast<double>(k);
    } else {
      // For α ≤ 2, Newton on F(τ) = (Σ d^e)^{1/e} − 1 instead of f = Σ d^e − 1: F is a norm of d, convex
      // and decreasing (so still monotone from the left), but nearly linear, which takes far fewer
      // steps than f when e = 1/(α−1) is large. Expressed as (f, f') of the same root below.
      double s0 = 0, s1 = 0;
      for (size_t i = 0; i < X.size(); ++i) {
        double d = X[i] - tau;
        if (d > 0) { double pe = std::pow(d, e); s0 += pe; s1 += pe / d; }
        if (X[i] > (monotone ? tau : lo)) { X[kept] = X[i]; idx[kept++] = idx[i]; }
      }
      if (!monotone) {
        f += s0; fp = -e * s1;                         // α > 2: plain bracketed Newton on f
      } else if (s0 > 0) {
        const double norm = std::pow(s0, am1);          // (Σ d^e)^{1/e}
        f = norm - 1.0;                                // same sign as Σ d^e − 1
        fp = -norm / s0 * s1;                          // F'(τ) = −(Σ d^e)^{1/e − 1} Σ d^{e−1}
      } else {
        fp = 0.0;                                      // past every candidate: bisect
      }
    }
    X.resize(kept); idx.resize(kept);
    if (f == 0.0) break;
    if (f > 0) lo = tau; else hi = tau;
    double step = fp < 0 ? tau - f / fp : 0.5 * (lo + hi);
    double next = (step >= lo && step <= hi) ? step : 0.5 * (lo + hi);
    if (!monotone) {
      // α > 2: Newton can crawl (f' blows up at the support boundary), so a step that did not
      // halve the bracket is replaced by bisection, and only a closed bracket ends the solve.
      if (hi - lo > 0.5 * width) next = 0.5 * (lo + hi);
      width = hi - lo;
      tau = next;
      if (hi - lo <= 4e-16 * std::max(1.0, std::fabs(lo))) break;
      continue;
    }
    double moved = std::fabs(next - tau);
    tau = next;
    if (moved <= 1e-15 || hi - lo <= 1e-15) break;
  }
  // exact finish on the support for α = 1.5 and 2
  if (mode == 1 || mode == 2) {
    double k = 0, s1 = 0;
    for (double x : X) if (x > tau) { k += 1; s1 += x; }
    if (k > 0) {
      if (mode == 2) {
        tau = (s1 - 1.0) / k;
      } else {
        double mean = s1 / k, ss = 0;
        for (double x : X) if (x > tau) ss += (x - mean) * (x - mean);
        tau = mean - std::sqrt(std::max(1.0 - ss, 0.0) / k);
      }
    }
  }
  return tau;
}

// Appends (j, (α−1)(x_j − m)) for every x_j > thr.
template <typename scalar_t>
inline void collect_candidates(const scalar_t* x, int64_t n, scalar_t thr, double am1, double m,
                               std::vector<int64_t>& idx, std::vector<double>& X) {
  int64_t j = 0;
#if defined(__AVX2__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    const __m256 t = _mm256_set1_ps(thr);
    for (; j + 8 <= n; j += 8) {
      unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), t, _CMP_GT_OQ)));
      while (mask) {
        const int b = __builtin_ctz(mask);
        mask &= mask - 1;
        idx.push_back(j + b);
        X.push_back(am1 * (static_cast<double>(x[j + b]) - m));
      }
    }
  }
#endif
  for (; j < n; ++j)
    if (x[j] > thr) { idx.push_back(j); X.push_back(am1 * (static_cast<double>(x[j]) - m)); }
}

// One row; m is its max (finite: NaN, +inf and all -inf rows are handled by the caller).
template <typename scalar_t>
void forward_row(const scalar_t* x, scalar_t* p, int64_t n, double alpha, double m,
                 std::vector<int64_t>& idx, std::vector<double>& X) {
  // p may be x itself (in place): read the candidates out before zeroing
  if (!std::isfinite(m)) { std::fill(p, p + n, scalar_t(0)); return; }   // all -inf: a zero row
  const int mode = row_mode(alpha);
  const double am1 = alpha - 1.0;
  // τ ≥ -1, so only X_j > -1 can be in the support; the float threshold is widened by a few ulps
  // and the exact test is repeated in double inside the solve.
  const scalar_t thr = static_cast<scalar_t>(m - 1.0 / am1 - 1e-6 * (1.0 + std::fabs(m)));
  idx.clear(); X.clear();
  collect_candidates<scalar_t>(x, n, thr, am1, m, idx, X);
  std::fill(p, p + n, scalar_t(0));
  const double tau = solve_tau(X, idx, alpha, mode);
  const int64_t c = static_cast<int64_t>(X.size());
  if (mode == 1) {
    for (int64_t i = 0; i < c; ++i) { double d = X[i] - tau; if (d > 0) p[idx[i]] = static_cast<scalar_t>(d * d); }
  } else if (mode == 2) {
    for (int64_t i = 0; i < c; ++i) { double d = X[i] - tau; if (d > 0) p[idx[i]] = static_cast<scalar_t>(d); }
  } else {
    const double e = 1.0 / am1;
    double s = 0;
    for (int64_t i = 0; i < c; ++i) { double d = X[i] - tau; X[i] = d > 0 ? std::pow(d, e) : 0.0; s += X[i]; }
    const double inv = s > 0 ? 1.0 / s : 0.0;
    for (int64_t i = 0; i < c; ++i) if (X[i] > 0) p[idx[i]] = static_cast<scalar_t>(X[i] * inv);
  }
}

template <typename scalar_t>
void backward_row(const scalar_t* p, const scalar_t* g, scalar_t* dz, int64_t n, double alpha) {
  const int mode = row_mode(alpha);
  using acc_t = double;
  acc_t su = 0, sug = 0;
  if (mode == 1) {
    for (int64_t j = 0; j < n; ++j) { scalar_t u = std::sqrt(p[j]); dz[j] = u; su += u; sug += u * g[j]; }
  } else if (mode == 2) {
    for (int64_t j = 0; j < n; ++j) { scalar_t u = p[j] > 0 ? scalar_t(1) : scalar_t(0); dz[j] = u; su += u; sug += u * g[j]; }
  } else {
    const double ex = 2.0 - alpha;
    for (int64_t j = 0; j < n; ++j) {
      scalar_t u = p[j] > 0 ? static_cast<scalar_t>(std::pow(static_cast<double>(p[j]), ex)) : scalar_t(0);
      dz[j] = u; su += u; sug += u * g[j];
    }
  }
  const scalar_t q = static_cast<scalar_t>(su > 0 ? sug / su : 0.0);
  for (int64_t j = 0; j < n; ++j) dz[j] = dz[j] * (g[j] - q);
}

// x: (R, n) contiguous; row_max: (R,) float64, finite or -inf; alpha: (R,) float64 per-row α.
torch::Tensor entmax_forward(torch::Tensor x, torch::Tensor row_max, torch::Tensor alpha) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "entmax kernel: x must be a contiguous 2-D tensor");
  for (const auto& t : {row_max, alpha})
    TORCH_CHECK(t.dim() == 1 && t.size(0) == x.size(0) && t.scalar_type() == torch::kFloat64 && t.is_contiguous(),
                "entmax kernel: row_max and alpha must be contiguous float64 of shape (rows,)");
  auto p = torch::empty_like(x);
  const int64_t R = x.size(0), n = x.size(1);
  const double* a = alpha.data_ptr<double>();
  const double* mx = row_max.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "entmax_forward", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* pp = p.data_ptr<scalar_t>();
    at::parallel_for(0, R, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
      std::vector<int64_t> idx; std::vector<double> X;
      for (int64_t r = b; r < e; ++r) forward_row<scalar_t>(xp + r * n, pp + r * n, n, a[r], mx[r], idx, X);
    });
  });
  return p;
}

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

// x_j ← x_j·scale − slope·(pos − j) for j < limit, tracking the max and whether a NaN was seen.
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
      __m256 v = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), vs), _mm256_mul_ps(vslope, dist));
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
    scalar_t v = x[j] * sc - slope * static_cast<scalar_t>(pos - j);
    x[j] = v; nan |= (v != v); m = v > m ? v : m;
  }
}

// ----------------------------------------------------------------------------- attention scores
// z: (G, n, kend) raw q·kᵀ products of G (batch × head) rows-blocks; row r of block g is the query at
// absolute position first_pos + r. In place: x = z·scale − slope_g·(pos − j), −inf for j > pos when
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
      std::vector<int64_t> idx; std::vector<double> X;
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
        forward_row<scalar_t>(x, x, limit, a[g], static_cast<double>(m), idx, X);
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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("entmax_forward", &entmax_forward, "α-entmax forward over rows of a contiguous 2-D tensor");
  m.def("entmax_backward", &entmax_backward, "α-entmax backward over rows");
  m.def("entmax_scores_forward", &entmax_scores_forward, "scale + ALiBi + causal mask + α-entmax, in place");
  m.def("entmax_scores_backward", &entmax_scores_backward, "α-entmax backward on attention scores, in place");
}
