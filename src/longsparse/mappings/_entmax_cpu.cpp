// Fused CPU kernel for α-entmax, compiled on first use by longsparse/mappings/_kernel.py. Two parts:
// the rows of the mapping (entmax_forward / _backward; entmax_scores_* map blocks of attention logits in
// place) and flash-style attention (attention_forward / _backward, the fused_cpu backend; its own section
// below). The rows, one at a time, rows in parallel:
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
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <tuple>
#include <type_traits>
#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <xmmintrin.h>
#endif
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// 1: α = 1.5, 2: α = 2 (closed forms), 3: α = 1 (softmax: the threshold solve would divide by α − 1 = 0),
// 0: any other α > 1
inline int row_mode(double alpha) {
  return alpha == 1.5 ? 1 : (alpha == 2.0 ? 2 : (alpha == 1.0 ? 3 : 0));
}

// softmax of a row with finite max m, p_j = e^(x_j − m) / Σ e^(x − m); p may be x (in place)
template <typename scalar_t>
void softmax_row(const scalar_t* x, scalar_t* p, int64_t n, double m) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double e = std::exp(static_cast<double>(x[j]) - m);
    p[j] = static_cast<scalar_t>(e);
    s += e;
  }
  const double inv = 1.0 / s;    // s ≥ 1: the max contributes e^0
  for (int64_t j = 0; j < n; ++j) p[j] = static_cast<scalar_t>(static_cast<double>(p[j]) * inv);
}

// ----------------------------------------------------------------------------- d^e for generic α
// The generic-α solve needs d^e and d^(e−1) for every candidate in every Newton iteration; std::pow is
// scalar (~20 ns). With AVX2 + FMA the powers are taken four lanes at a time as 2^(e·log2 d), in double:
//   log2 d = k + log2 m, m ∈ [√½, √2]: ln m = 2 atanh s, s = (m−1)/(m+1), |s| ≤ 0.172, series to s^15
//            (relative truncation < 4e-14);
//   2^y    = 2^round(y) · exp(f ln2), |f| ≤ ½: Taylor series to f^11 (relative truncation < 7e-15).
// So d^e carries a relative error ≲ 1e-13·max(1, e), far below what the fp32/fp64 outputs (renormalised
// to sum 1) or the solve's stopping rule can see. Inputs must be positive and normal (callers clamp to
// ≥ kTinyD); 2^y below 2^-1022 is returned as 0.
#if defined(__AVX2__) && defined(__FMA__)
#define LONGSPARSE_VEC_POW 1
inline __m256d log2_pd(__m256d x) {
  const __m256i bits = _mm256_castpd_si256(x);
  const __m256d one = _mm256_set1_pd(1.0);
  __m256d m = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000FFFFFFFFFFFFFLL)),
                                                  _mm256_set1_epi64x(0x3FF0000000000000LL)));   // [1, 2)
  const __m256d big = _mm256_cmp_pd(m, _mm256_set1_pd(1.4142135623730951), _CMP_GT_OQ);
  m = _mm256_blendv_pd(m, _mm256_mul_pd(m, _mm256_set1_pd(0.5)), big);                        // [√½, √2]
  // unbiased exponent as a double, exactly: (2^52 | e) − (2^52 + 1023), plus 1 where m was halved
  __m256d k = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(bits, 52),
                                                                _mm256_set1_epi64x(0x4330000000000000LL))),
                            _mm256_set1_pd(4503599627370496.0 + 1023.0));
  k = _mm256_add_pd(k, _mm256_and_pd(big, one));
  const __m256d s = _mm256_div_pd(_mm256_sub_pd(m, one), _mm256_add_pd(m, one));
  const __m256d z = _mm256_mul_pd(s, s), z2 = _mm256_mul_pd(z, z), z4 = _mm256_mul_pd(z2, z2);
  // Σ_{j≤7} z^j/(2j+1), Estrin's scheme (short dependency chains)
  const auto c = [](double v) { return _mm256_set1_pd(v); };
  const __m256d q0 = _mm256_fmadd_pd(c(1.0 / 3), z, one), q1 = _mm256_fmadd_pd(c(1.0 / 7), z, c(1.0 / 5));
  const __m256d q2 = _mm256_fmadd_pd(c(1.0 / 11), z, c(1.0 / 9)), q3 = _mm256_fmadd_pd(c(1.0 / 15), z, c(1.0 / 13));
  const __m256d p = _mm256_fmadd_pd(_mm256_fmadd_pd(q3, z2, q2), z4, _mm256_fmadd_pd(q1, z2, q0));
  return _mm256_fmadd_pd(_mm256_mul_pd(s, p), c(2.8853900817779268), k);                        // 2/ln 2
}

inline __m256d exp2_pd(__m256d y) {
  const auto c = [](double v) { return _mm256_set1_pd(v); };
  const __m256d under = _mm256_cmp_pd(y, c(-1022.0), _CMP_LT_OQ);
  y = _mm256_min_pd(_mm256_max_pd(y, c(-1022.0)), c(1023.0));
  const __m256d kf = _mm256_round_pd(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256d t = _mm256_mul_pd(_mm256_sub_pd(y, kf), c(0.6931471805599453));
  const __m256d t2 = _mm256_mul_pd(t, t), t4 = _mm256_mul_pd(t2, t2), t8 = _mm256_mul_pd(t4, t4);
  // Σ_{j≤11} t^j/j!, Estrin's scheme
  const __m256d q0 = _mm256_fmadd_pd(t, c(1.0), c(1.0)), q1 = _mm256_fmadd_pd(t, c(1.0 / 6), c(1.0 / 2));
  const __m256d q2 = _mm256_fmadd_pd(t, c(1.0 / 120), c(1.0 / 24)), q3 = _mm256_fmadd_pd(t, c(1.0 / 5040), c(1.0 / 720));
  const __m256d q4 = _mm256_fmadd_pd(t, c(1.0 / 362880), c(1.0 / 40320));
  const __m256d q5 = _mm256_fmadd_pd(t, c(1.0 / 39916800), c(1.0 / 3628800));
  const __m256d r0 = _mm256_fmadd_pd(q1, t2, q0), r1 = _mm256_fmadd_pd(q3, t2, q2), r2 = _mm256_fmadd_pd(q5, t2, q4);
  const __m256d p = _mm256_fmadd_pd(r2, t8, _mm256_fmadd_pd(r1, t4, r0));
  const __m256i ki = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(kf));
  const __m256d scale = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(ki, _mm256_set1_epi64x(1023)), 52));
  return _mm256_andnot_pd(under, _mm256_mul_pd(p, scale));
}

// x^e for positive normal x
inline __m256d pow_pd(__m256d x, __m256d e) { return exp2_pd(_mm256_mul_pd(e, log2_pd(x))); }

// all-ones in the lanes start, …, start+3 that are < c
inline __m256d lanes_below(size_t start, size_t c) {
  const __m256i lanes = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(start)), _mm256_setr_epi64x(0, 1, 2, 3));
  return _mm256_castsi256_pd(_mm256_cmpgt_epi64(_mm256_set1_epi64x(static_cast<long long>(c)), lanes));
}

// x^e for one positive normal x, same accuracy as pow_pd
inline double pow_sd(double x, double e) {
  return _mm256_cvtsd_f64(pow_pd(_mm256_set1_pd(x), _mm256_set1_pd(e)));
}

inline double hsum_pd(__m256d v) {
  alignas(32) double b[4];
  _mm256_store_pd(b, v);
  return (b[0] + b[1]) + (b[2] + b[3]);
}
#endif

#ifndef LONGSPARSE_VEC_POW
inline double pow_sd(double x, double e) { return std::pow(x, e); }
#endif

// d (or p) below this is clamped to it before the power, so that log2_pd only sees normal numbers; the
// change to d^e or p^(2−α) is far below anything a row summing to 1 can show.
constexpr double kTinyD = 1e-300;

// Σ w_i d_i^e and Σ w_i d_i^(e−1) over d_i = X_i − τ > 0 (w ≡ 1 when w is null). X is padded: it may be
// read up to the next multiple of 8 (callers keep capacity), the padding is masked out here.
// Also counts into `above` the X_i > keep; with P stores each d_i^e (0 where d_i ≤ 0) in P_i; with s2
// (only for e ≥ 1) also sums d^(e−2), the powers then being taken as d^(e−2)·d·d.
inline void power_sums(const double* X, const double* w, size_t c, double tau, double e, double& s0, double& s1,
                       double keep, size_t& above, double* P = nullptr, double* s2 = nullptr) {
  s0 = 0; s1 = 0; above = 0;
  if (s2) *s2 = 0;
  size_t i = 0;
#ifdef LONGSPARSE_VEC_POW
  const __m256d vt = _mm256_set1_pd(tau), ve1 = _mm256_set1_pd(e - 1.0), zero = _mm256_setzero_pd();
  const __m256d tiny = _mm256_set1_pd(kTinyD);
  const __m256d vk = _mm256_set1_pd(keep), ve2 = _mm256_set1_pd(e - 2.0);
  __m256d a0 = zero, a1 = zero, b0 = zero, b1 = zero, a2 = zero, b2 = zero;
  for (; i < c; i += 8) {   // two independent vectors per step: the polynomial chains overlap
    const __m256d xa = _mm256_loadu_pd(X + i), xb = _mm256_loadu_pd(X + i + 4);
    __m256d da = _mm256_sub_pd(xa, vt), db = _mm256_sub_pd(xb, vt);
    __m256d pa = _mm256_cmp_pd(da, zero, _CMP_GT_OQ), pb = _mm256_cmp_pd(db, zero, _CMP_GT_OQ);
    __m256d ka = _mm256_cmp_pd(xa, vk, _CMP_GT_OQ), kb = _mm256_cmp_pd(xb, vk, _CMP_GT_OQ);
    if (i + 8 > c) {
      const __m256d la = lanes_below(i, c), lb = lanes_below(i + 4, c);
      pa = _mm256_and_pd(pa, la); pb = _mm256_and_pd(pb, lb); ka = _mm256_and_pd(ka, la); kb = _mm256_and_pd(kb, lb);
    }
    above += static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(_mm256_movemask_pd(ka)) |
                                                    (static_cast<unsigned>(_mm256_movemask_pd(kb)) << 4)));
    da = _mm256_max_pd(_mm256_and_pd(pa, da), tiny); db = _mm256_max_pd(_mm256_and_pd(pb, db), tiny);   // masked: tiny
    __m256d ea, eb;
    if (s2) {
      const __m256d ga = _mm256_and_pd(pa, pow_pd(da, ve2)), gb = _mm256_and_pd(pb, pow_pd(db, ve2));   // d^(e−2)
      a2 = _mm256_add_pd(a2, ga); b2 = _mm256_add_pd(b2, gb);
      ea = _mm256_mul_pd(ga, da); eb = _mm256_mul_pd(gb, db);                                          // d^(e−1)
    } else {
      ea = _mm256_and_pd(pa, pow_pd(da, ve1)); eb = _mm256_and_pd(pb, pow_pd(db, ve1));                 // d^(e−1)
    }
    if (w) {
      ea = _mm256_mul_pd(ea, _mm256_loadu_pd(w + i)); eb = _mm256_mul_pd(eb, _mm256_loadu_pd(w + i + 4));
    }
    a1 = _mm256_add_pd(a1, ea); b1 = _mm256_add_pd(b1, eb);
    if (P) {   // (P has the same slack as X)
      const __m256d fa = _mm256_mul_pd(ea, da), fb = _mm256_mul_pd(eb, db);                    // d^e
      _mm256_storeu_pd(P + i, fa); _mm256_storeu_pd(P + i + 4, fb);
      a0 = _mm256_add_pd(a0, fa); b0 = _mm256_add_pd(b0, fb);
    } else {
      a0 = _mm256_fmadd_pd(ea, da, a0); b0 = _mm256_fmadd_pd(eb, db, b0);                     // d^e
    }
  }
  s0 = hsum_pd(_mm256_add_pd(a0, b0)); s1 = hsum_pd(_mm256_add_pd(a1, b1));
  if (s2) *s2 = hsum_pd(_mm256_add_pd(a2, b2));
#else
  for (; i < c; ++i) {
    const double d = X[i] - tau;
    above += X[i] > keep;
    if (P) P[i] = 0.0;
    if (d > 0) {
      const double dd = std::max(d, kTinyD), pe1 = std::pow(dd, e - 1.0) * (w ? w[i] : 1.0);
      s1 += pe1; s0 += pe1 * dd;
      if (P) P[i] = pe1 * dd;
      if (s2) *s2 += pe1 / dd;
    }
  }
#endif
}

// X[i] ← [X[i] − τ]₊^e for i < c (X padded as for power_sums); returns their sum.
inline double power_finish(double* X, size_t c, double tau, double e) {
  double s = 0;
  size_t i = 0;
#ifdef LONGSPARSE_VEC_POW
  const __m256d vt = _mm256_set1_pd(tau), ve = _mm256_set1_pd(e), zero = _mm256_setzero_pd();
  const __m256d tiny = _mm256_set1_pd(kTinyD);
  __m256d acc = zero;
  for (; i < c; i += 8) {   // the padding lanes are written too (zeros): X has the capacity
    const __m256d da = _mm256_sub_pd(_mm256_loadu_pd(X + i), vt), db = _mm256_sub_pd(_mm256_loadu_pd(X + i + 4), vt);
    __m256d ma = _mm256_cmp_pd(da, zero, _CMP_GT_OQ), mb = _mm256_cmp_pd(db, zero, _CMP_GT_OQ);
    if (i + 8 > c) { ma = _mm256_and_pd(ma, lanes_below(i, c)); mb = _mm256_and_pd(mb, lanes_below(i + 4, c)); }
    const __m256d pa = _mm256_and_pd(ma, pow_pd(_mm256_max_pd(_mm256_and_pd(ma, da), tiny), ve));
    const __m256d pb = _mm256_and_pd(mb, pow_pd(_mm256_max_pd(_mm256_and_pd(mb, db), tiny), ve));
    _mm256_storeu_pd(X + i, pa); _mm256_storeu_pd(X + i + 4, pb);
    acc = _mm256_add_pd(acc, _mm256_add_pd(pa, pb));
  }
  s = hsum_pd(acc);
#else
  for (; i < c; ++i) { const double d = X[i] - tau; X[i] = d > 0 ? std::pow(std::max(d, kTinyD), e) : 0.0; s += X[i]; }
#endif
  return s;
}

// The candidates of one row: X_i = (α−1)(x_j − max) and their columns j, the first c entries of two
// buffers that keep 8 entries of slack past the row length (the vector loops work in blocks of 8).
// For the generic monotone solve, P holds d^e of the candidates at the last Newton iterate (has_P).
struct Cands {
  std::vector<double> Xb, Pb;
  std::vector<int64_t> ib;
  size_t c = 0;
  bool has_P = false;
  void reserve(int64_t n) {
    const size_t need = static_cast<size_t>(n) + 8;
    if (Xb.size() < need) { Xb.resize(need); ib.resize(need); Pb.resize(need); }
  }
  double* X() { return Xb.data(); }
  double* P() { return Pb.data(); }
  int64_t* idx() { return ib.data(); }
};

// Keeps the candidates with X > keep (compacted to the front, order kept).
inline void compact(Cands& w, double keep) {
  double* X = w.X();
  double* P = w.P();
  int64_t* idx = w.idx();
  size_t kept = 0;
  if (w.has_P) {
    for (size_t i = 0; i < w.c; ++i) {   // branch-free; kept ≤ i, so nothing unread is overwritten
      const double v = X[i], q = P[i];
      const int64_t j = idx[i];
      X[kept] = v; P[kept] = q; idx[kept] = j; kept += v > keep;
    }
  } else {
    for (size_t i = 0; i < w.c; ++i) {
      const double v = X[i];
      const int64_t j = idx[i];
      X[kept] = v; idx[kept] = j; kept += v > keep;
    }
  }
  w.c = kept;
}

// ----------------------------------------------------------------------------- a first bound on τ
// For 1 < α ≤ 2 (e = 1/(α−1) ≥ 1) the map d ↦ [d]₊^e is convex, so for any group B of entries
// Σ_B [X_i − τ]₊^e ≥ |B|·[mean_B − τ]₊^e (Jensen). Splitting the row into a few groups by value,
// g(τ) = Σ_k c_k [μ_k − τ]₊^e ≤ Σ_i [X_i − τ]₊^e for every τ, so the root τ_g of g = 1 is a lower bound
// of τ*. One vectorised pass over the (fp32) row counts and sums the entries above six thresholds
// t = −0.15, −0.3, …, −0.9 (the groups are the bands between them; entries below −0.9 are left out, which
// only lowers g); a few Newton steps on the 6 groups give τ_g, typically 0.003–0.015 below τ*. Only the
// entries above τ_g are collected: for α = 1.3 on Gaussian rows ~1/5 of those above −1, barely more than
// the support, and the solve on them starts next to τ*. The sums are fp32, so a margin of 1e-4 is taken
// off (the solve still checks f(bound) ≥ 0 and starts over from −1 if not). Returns −1 where it cannot
// help (no AVX2 + FMA).
inline double group_bound(const float* x, int64_t n, double alpha, double m) {
  double best = -1.0;
#if defined(LONGSPARSE_VEC_POW)
  const double am1 = alpha - 1.0, e = 1.0 / am1;
  constexpr int T = 6;
  static constexpr float thr[T] = {-0.15f, -0.3f, -0.45f, -0.6f, -0.75f, -0.9f};
  // (m is the row's fp32 max, so x − m is exact near the max, whatever the logits' scale)
  const __m256 va = _mm256_set1_ps(static_cast<float>(am1)), vm = _mm256_set1_ps(static_cast<float>(m));
  __m256i c[T];   // per-lane counts (n < 2^34)
  __m256 s[T];
  for (int k = 0; k < T; ++k) { c[k] = _mm256_setzero_si256(); s[k] = _mm256_setzero_ps(); }
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 X = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm), va);   // (α−1)(x − m); −inf stays
    for (int k = 0; k < T; ++k) {
      const __m256 gt = _mm256_cmp_ps(X, _mm256_set1_ps(thr[k]), _CMP_GT_OQ);
      c[k] = _mm256_sub_epi32(c[k], _mm256_castps_si256(gt));                      // mask lanes are −1
      s[k] = _mm256_add_ps(s[k], _mm256_and_ps(gt, X));
    }
  }
  double cnt[T] = {}, sum[T] = {};
  for (int k = 0; k < T; ++k) {
    alignas(32) int32_t bc[8];
    alignas(32) float bs[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(bc), c[k]); _mm256_store_ps(bs, s[k]);
    for (int l = 0; l < 8; ++l) { cnt[k] += bc[l]; sum[k] += bs[l]; }
  }
  for (; j < n; ++j) {
    const double X = am1 * (static_cast<double>(x[j]) - m);
    for (int k = 0; k < T; ++k) if (X > thr[k]) { cnt[k] += 1.0; sum[k] += X; }
  }
  // the groups: band k = (t_{k+1}, t_k] (t_0 = 0), counts and sums by differences; empty ones inert
  alignas(32) double w[8] = {}, mu[8] = {-2, -2, -2, -2, -2, -2, -2, -2};
  for (int k = 0; k < T; ++k) {
    w[k] = cnt[k] - (k ? cnt[k - 1] : 0.0);
    if (w[k] > 0.5) mu[k] = (sum[k] - (k ? sum[k - 1] : 0.0)) / w[k];
    else w[k] = 0.0;
  }
  // start: Jensen on the nested sets S_t themselves, τ ≥ mean(S_t) − |S_t|^(1−α) (g there is ≥ 1 too)
  alignas(32) double cn[8] = {1, 1, 1, 1, 1, 1, 1, 1}, pw[8];
  for (int k = 0; k < T; ++k) cn[k] = std::max(cnt[k], 1.0);
  const __m256d ne = _mm256_set1_pd(-am1);
  _mm256_store_pd(pw, pow_pd(_mm256_load_pd(cn), ne));
  _mm256_store_pd(pw + 4, pow_pd(_mm256_load_pd(cn + 4), ne));
  double tau = -1.0;
  for (int k = 0; k < T; ++k) if (cnt[k] > 0.5) tau = std::max(tau, sum[k] / cnt[k] - pw[k]);
  // Newton from the left on G(τ) = g(τ)^(1/e) − 1 (convex, decreasing: the iterates rise towards τ_g
  // without passing it); every iterate with g ≥ 1 (checked) is a valid bound, the last one is returned.
  for (int it = 0; it < 10; ++it) {
    double s0, s1;
    size_t unused;
    power_sums(mu, w, 8, tau, e, s0, s1, 0.0, unused);
    if (!(s0 > 0)) break;
    const double norm = pow_sd(s0, am1);
    if (!(norm >= 1.0)) break;                       // only by round-off next to the root
    best = tau;
    const double next = tau - (norm - 1.0) / (-norm / s0 * s1);
    if (!(next > tau) || next - tau < 1e-6) break;   // good enough: this is only a starting point
    tau = next;
  }
  best = best > -1.0 ? std::max(-1.0, best - 1e-4) : -1.0;
#else
  (void)x; (void)n; (void)alpha; (void)m;
#endif
  return best;
}

// s1 = Σ [X_i − τ]₊, s2 = Σ [X_i − τ]₊², above = #{X_i > τ} and dmin = the least X_i − τ > 0 (+inf if none)
// over i < c, vectorised and branch-free.
inline void positive_moments(const double* X, size_t c, double tau, double& s1, double& s2, size_t& above,
                             double& dmin) {
  size_t i = 0;
  s1 = 0; s2 = 0; above = 0;
  dmin = std::numeric_limits<double>::infinity();
#if defined(__AVX512F__)
  const __m512d vt = _mm512_set1_pd(tau);
  __m512d a1 = _mm512_setzero_pd(), a2 = _mm512_setzero_pd(), mn = _mm512_set1_pd(dmin);
  for (; i < c; i += 8) {
    const __mmask8 live = c - i >= 8 ? __mmask8(0xFF) : static_cast<__mmask8>((1u << (c - i)) - 1);
    const __m512d d = _mm512_sub_pd(_mm512_maskz_loadu_pd(live, X + i), vt);
    const __mmask8 pos = _mm512_mask_cmp_pd_mask(live, d, _mm512_setzero_pd(), _CMP_GT_OQ);
    a1 = _mm512_mask_add_pd(a1, pos, a1, d);
    a2 = _mm512_mask3_fmadd_pd(d, d, a2, pos);
    mn = _mm512_mask_min_pd(mn, pos, mn, d);
    above += static_cast<size_t>(__builtin_popcount(pos));
  }
  s1 = _mm512_reduce_add_pd(a1); s2 = _mm512_reduce_add_pd(a2); dmin = _mm512_reduce_min_pd(mn);
#else
  for (; i < c; ++i) {
    const double d = X[i] - tau;
    const bool pos = d > 0;
    const double dp = pos ? d : 0.0;
    s1 += dp; s2 += dp * dp; above += pos;
    dmin = pos && d < dmin ? d : dmin;
  }
#endif
}

// Bracketed Newton for Σ [X − τ]₊^e = 1 over the candidates X (all > -1, max 0), paired with their
// column indices idx. The lower bracket only rises and τ* ≥ lo, so candidates at or below lo can never
// be in the support: they are dropped as the solve goes, which keeps late iterations tiny.
// lo0: a known lower bound (−1, or group_bound for fp32 rows with 1 < α < 2, the candidates collected above
// it); n_cand: the number of candidates X > −1 or more (for the upper bound). Returns NaN when lo0 > −1
// turns out not to be a lower bound (f(lo0) < 0: fp32 sums or round-off): the caller starts over.
double solve_tau(Cands& w, double alpha, int mode, double lo0, size_t n_cand) {
  const double am1 = alpha - 1.0, e = 1.0 / am1;
  w.has_P = false;
  // For α ≤ 2 Newton from the left never passes τ*, so every iterate is a valid drop threshold.
  const bool monotone = alpha <= 2.0;
  const double nc = static_cast<double>(std::max<size_t>(n_cand, 1));
  double lo = lo0, hi = mode == 1 ? -1.0 / std::sqrt(nc) : (mode == 2 ? -1.0 / nc : -std::pow(nc, -am1));
  bool exact = false;   // α = 1.5, 2: τ found in closed form on a certified support
  double tau = lo, width = 2.0 * (hi - lo);
  double* X = w.X();
  int64_t* idx = w.idx();
  double tau_eval = tau;
  for (int it = 0; it < 400; ++it) {
    double f = -1.0, fp = 0.0, fpp = 0.0;
    size_t kept = 0;
    if (mode == 1 || mode == 2) {
      // one branch-free pass: Σ d₊, Σ d₊² and how many X > τ (the support at τ); α ≤ 2 here, so X ≤ τ is
      // dropped for good, by a compaction only when it removes at least an eighth of the candidates
      double s1, s2, dmin;
      positive_moments(X, w.c, tau, s1, s2, kept, dmin);
      if (it == 0 && lo0 > -1.0 && (mode == 1 ? s2 : s1) < 1.0) return std::numeric_limits<double>::quiet_NaN();
      // The closed form on S = {X > τ}: τ + δ with Σ_S (d − δ)² = 1 (α = 1.5; the smaller root) or
      // Σ_S (d − δ) = 1 (α = 2). With 0 ≤ δ < min_S d every entry of S stays in the support at τ + δ and
      // every other one (X ≤ τ) stays out: τ + δ is the root, exactly (Newton from the left reaches this
      // support in a few steps, long before τ itself stops moving).
      // (The test is decided without a square root: δ ≥ 0 ⇔ Σ d² ≥ 1, δ < dmin ⇔ s1 − k·dmin < √disc; the root
      // is taken once, on success.)
      if (kept > 0) {
        const double k = static_cast<double>(kept);
        if (mode == 2) {
          const double delta = (s1 - 1.0) / k;
          if (delta >= 0 && delta < dmin) { tau += delta; exact = true; break; }
        } else if (s2 >= 1.0) {
          const double disc = s1 * s1 - k * (s2 - 1.0), gap = s1 - k * dmin;
          if (disc >= 0 && (gap < 0 || gap * gap < disc)) {
            tau += std::max(0.0, (s1 - std::sqrt(disc)) / k);
            exact = true;
            break;
          }
        }
      }
      if (mode == 1) {
        // Newton on F(τ) = (Σ d₊²)^½ − 1 (a norm of d: convex, decreasing, nearly linear, so it takes
        // fewer steps from the left than Σ d₊² − 1, and still never passes τ*); f, f' of the same root
        const double norm = std::sqrt(s2);
        f = norm - 1.0;
        fp = norm > 0 ? -s1 / norm : 0.0;
      } else {
        f = s1 - 1.0;
        fp = -static_cast<double>(kept);
      }
      // the masked pass reads entries at or below τ almost for free; compacting them away costs a scalar pass
      if (w.c > 256 && 2 * (w.c - kept) >= w.c) compact(w, tau);
      kept = w.c;
    } else {
      // For α ≤ 2, Newton on F(τ) = (Σ d^e)^{1/e} − 1 instead of f = Σ d^e − 1: F is a norm of d, convex
      // and decreasing (so still monotone from the left), but nearly linear, which takes far fewer
      // steps than f when e = 1/(α−1) is large. Expressed as (f, f') of the same root below.
      double s0, s1, s2 = 0;
      // monotone: keep d^e at this iterate (the output reuses it when the next step is ≤ 1e-12), and
      // take Halley steps (cubic convergence; one evaluation less from the group bound), which can
      // overshoot τ*: only an iterate with f > 0 is a safe drop threshold there
      w.has_P = monotone;
      tau_eval = tau;
      const double keep = monotone ? tau : lo;
      power_sums(X, nullptr, w.c, tau, e, s0, s1, keep, kept, monotone ? w.P() : nullptr, monotone ? &s2 : nullptr);
      if (!monotone) {
        f += s0; fp = -e * s1;                         // α > 2: plain bracketed Newton on f
      } else if (s0 > 0) {
        const double norm = pow_sd(s0, am1);            // (Σ d^e)^{1/e}
        f = norm - 1.0;                                // same sign as Σ d^e − 1
        fp = -norm / s0 * s1;                          // F'(τ) = −(Σ d^e)^{1/e − 1} Σ d^{e−1}
        // F'' = (e−1)(Σ d^e)^{1/e − 1} (Σ d^{e−2} − (Σ d^{e−1})²/Σ d^e) ≥ 0 (Cauchy–Schwarz)
        fpp = (e - 1.0) * norm / s0 * std::max(s2 - s1 * s1 / s0, 0.0);
      } else {
        fp = 0.0;                                      // past every candidate: bisect
      }
      // compacting costs a pass: only when it drops at least an eighth of the candidates
      if ((!monotone || f > 0) && 8 * (w.c - kept) >= w.c) compact(w, keep);
      kept = w.c;
    }
    w.c = kept;
    if (it == 0 && lo0 > -1.0 && f < 0) return std::numeric_limits<double>::quiet_NaN();
    if (f == 0.0) break;
    if (f > 0) lo = tau; else hi = tau;
    double step = 0.5 * (lo + hi);
    if (fp < 0) {
      double dt = -f / fp;
      // Halley: dt / (1 − F F''/(2F'²)); the factor is kept in [½, 2]
      if (fpp > 0) dt /= 1.0 - std::min(std::max(f * fpp / (2.0 * fp * fp), -1.0), 0.5);
      step = tau + dt;
    }
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
    // Halley (generic α ≤ 2) converges cubically here: after a step of ≤ 1e-12 the error is far below 1e-15.
    // (α = 1.5 and 2 keep 1e-15: their exact finish needs the support, not τ, and costs nothing.)
    if (moved <= (mode == 0 ? 1e-12 : 1e-15) || hi - lo <= 1e-15) break;
  }
  // P (d^e at the last evaluated iterate) serves the output when the final τ is within 1e-12 of it
  if (w.has_P && !(std::fabs(tau - tau_eval) <= 1e-12)) w.has_P = false;
  // exact finish on the support for α = 1.5 and 2
  if ((mode == 1 || mode == 2) && !exact) {
    double k = 0, s1 = 0;
    for (size_t i = 0; i < w.c; ++i) if (X[i] > tau) { k += 1; s1 += X[i]; }
    if (k > 0) {
      if (mode == 2) {
        tau = (s1 - 1.0) / k;
      } else {
        double mean = s1 / k, ss = 0;
        for (size_t i = 0; i < w.c; ++i) if (X[i] > tau) ss += (X[i] - mean) * (X[i] - mean);
        tau = mean - std::sqrt(std::max(1.0 - ss, 0.0) / k);
      }
    }
  }
  return tau;
}

#if defined(__AVX2__)
// kPack[mask]: the positions of mask's set bits, in order, one per byte (the AVX2 left-pack shuffle)
struct PackTable {
  uint64_t v[256];
  constexpr PackTable() : v() {
    for (int mask = 0; mask < 256; ++mask) {
      uint64_t r = 0;
      int k = 0;
      for (int b = 0; b < 8; ++b)
        if (mask >> b & 1) r |= static_cast<uint64_t>(b) << (8 * k++);
      v[mask] = r;
    }
  }
};
constexpr PackTable kPack{};
#endif

// ----------------------------------------------------------------------------- row passes
// The max of x[0, n) raised into m; bad is set by a NaN or +inf. With `lanes`, the maxima of the vector lanes
// (16 entries of x at distinct positions, −inf where a lane saw nothing) are stored there and their number
// returned (0 where the pass is not vectorised).
template <typename T>
inline int seg_max(const T* x, int64_t n, T& m, bool& bad, T* lanes = nullptr) {
  int64_t j = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 pinf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
    __m512 vm = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __mmask16 nb = 0;
    for (; j < n; j += 16) {
      const __mmask16 live = n - j >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(live, x + j);
      nb |= _mm512_mask_cmp_ps_mask(live, v, v, _CMP_UNORD_Q) | _mm512_mask_cmp_ps_mask(live, v, pinf, _CMP_EQ_OQ);
      vm = _mm512_mask_max_ps(vm, live, vm, v);
    }
    const float r = _mm512_reduce_max_ps(vm);
    m = r > m ? r : m;
    bad |= nb != 0;
    if (lanes) { _mm512_storeu_ps(lanes, vm); return 16; }
    return 0;
  }
#endif
  for (; j < n; ++j) {
    const T v = x[j];
    bad |= (v != v) || v == std::numeric_limits<T>::infinity();
    m = v > m ? v : m;
  }
  return 0;
}

// x_j ← x_j − slope·|dist0 − j|: symmetric ALiBi for the keys of one tile row (dist0: the query position minus
// the key of x[0]); a causal row only reaches keys with dist ≥ 0, where it is the signed form. The product is
// taken in T, as logits.add_bias_and_masks does.
template <typename T>
inline void add_alibi(T* x, int64_t n, T slope, int64_t dist0) {
  const T d0 = static_cast<T>(dist0);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) x[j] -= slope * std::abs(d0 - static_cast<T>(j));
}

#if defined(__AVX512F__)
// e^x for x ≤ 0 (a shifted logit), ≤ 2 ulp: x = n ln2 + r, |r| ≤ ln2/2, e^r by the Cephes polynomial, 2^n by
// scalef. Results below the smallest normal float (x < −87.33) are flushed to 0: subnormal probabilities
// change no sum visibly, but multiplying them (the p·v product) is many times slower.
inline __m512 exp_nonpos_ps(__m512 x) {
  const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n));
}
#endif

// x_j ← e^(x_j − m) · mul for j < n (x_j ≤ m); returns Σ e^(x_j − m) (before mul).
template <typename T>
inline double exp_shifted(T* x, int64_t n, T m, T mul = T(1)) {
  int64_t j = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 vm = _mm512_set1_ps(m), vmul = _mm512_set1_ps(mul);
    __m512 acc = _mm512_setzero_ps();
    for (; j < n; j += 16) {
      const __mmask16 live = n - j >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
      const __m512 e = exp_nonpos_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, x + j), vm));
      acc = _mm512_mask_add_ps(acc, live, acc, e);
      _mm512_mask_storeu_ps(x + j, live, _mm512_mul_ps(e, vmul));
    }
    return static_cast<double>(_mm512_reduce_add_ps(acc));
  }
#endif
  double s = 0;
  for (; j < n; ++j) {
    const T e = x[j] - m < T(-87.33) ? T(0) : static_cast<T>(std::exp(static_cast<double>(x[j] - m)));
    s += e;
    x[j] = e * mul;
  }
  return s;
}

// Appends (x_j, j0 + j) for every x_j > thr, j < n, at position c of (ox, oj), which have room for c + n + 16
// entries (whole vectors are stored); returns the new count. Order is kept.
template <typename T>
inline size_t collect_above(const T* x, int64_t n, T thr, int64_t j0, T* ox, int32_t* oj, size_t c) {
  int64_t j = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 t = _mm512_set1_ps(thr);
    __m512i jv = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(j0)),
                                  _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m512i sixteen = _mm512_set1_epi32(16);
    // branch-free: whether a block of 16 holds a candidate is close to a coin flip at the thresholds used
    for (; j + 16 <= n; j += 16) {
      const __m512 xv = _mm512_loadu_ps(x + j);
      const __mmask16 hit = _mm512_cmp_ps_mask(xv, t, _CMP_GT_OQ);
      _mm512_storeu_ps(ox + c, _mm512_maskz_compress_ps(hit, xv));
      _mm512_storeu_si512(oj + c, _mm512_maskz_compress_epi32(hit, jv));
      c += static_cast<size_t>(__builtin_popcount(hit));
      jv = _mm512_add_epi32(jv, sixteen);
    }
    if (j < n) {
      const __mmask16 live = static_cast<__mmask16>((1u << (n - j)) - 1);
      const __m512 xv = _mm512_maskz_loadu_ps(live, x + j);
      const __mmask16 hit = _mm512_mask_cmp_ps_mask(live, xv, t, _CMP_GT_OQ);
      _mm512_storeu_ps(ox + c, _mm512_maskz_compress_ps(hit, xv));
      _mm512_storeu_si512(oj + c, _mm512_maskz_compress_epi32(hit, jv));
      c += static_cast<size_t>(__builtin_popcount(hit));
    }
    return c;
  }
#elif defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>) {
    const __m256 t = _mm256_set1_ps(thr);
    __m256i jv = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(j0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i eight = _mm256_set1_epi32(8);
    for (; j + 8 <= n; j += 8) {
      const __m256 xv = _mm256_loadu_ps(x + j);
      const unsigned hit = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(xv, t, _CMP_GT_OQ)));
      if (hit) {
        const __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kPack.v[hit])));
        _mm256_storeu_ps(ox + c, _mm256_permutevar8x32_ps(xv, perm));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(oj + c), _mm256_permutevar8x32_epi32(jv, perm));
        c += static_cast<size_t>(__builtin_popcount(hit));
      }
      jv = _mm256_add_epi32(jv, eight);
    }
  }
#endif
  for (; j < n; ++j) {   // branch-free
    ox[c] = x[j];
    oj[c] = static_cast<int32_t>(j0 + j);
    c += x[j] > thr;
  }
  return c;
}

// ----------------------------------------------------------------------------- row candidates
// The candidates (forward) or the support (attention backward) of one row, collected segment by segment.
template <typename T>
struct RowList {
  std::vector<T> x;          // logits (candidates) or probabilities (support)
  std::vector<int32_t> j;    // their keys, increasing
  size_t c = 0, budget = 0;
  T m = 0, thr = 0;          // running max; collection threshold (x-space)
  double l = 0;              // softmax: running Σ e^(x − m)
  int64_t lo = 0, hi = 0;    // visible keys
  void reset(size_t budget0) {
    c = 0; budget = budget0; l = 0;
    m = thr = -std::numeric_limits<T>::infinity();
  }
  void room(size_t extra) {
    if (x.size() < c + extra + 16) {
      const size_t n = std::max(2 * x.size(), c + extra + 16);
      x.resize(n); j.resize(n);
    }
  }
};

// Moves a row's candidates into the solver's buffers as X = (α−1)(x − m) (those at or below −1, collected
// before the max rose, are dropped by the solve's first pass).
template <typename T>
inline void load_candidates(const RowList<T>& rl, double am1, Cands& w) {
  w.reserve(static_cast<int64_t>(rl.c));
  double* X = w.X();
  int64_t* idx = w.idx();
  const double m = static_cast<double>(rl.m);
#pragma omp simd
  for (size_t i = 0; i < rl.c; ++i) {
    X[i] = am1 * (static_cast<double>(rl.x[i]) - m);
    idx[i] = rl.j[i];
  }
  w.c = rl.c;
}

// τ of the row's candidates, Newton from the row's threshold in X-space (max(−1, (α−1)(thr − m))). NaN when
// that is no lower bound (Σ [X − τ]₊^e < 1 there): some threshold was above the row's τ, and entries below it
// may be missing. Otherwise the candidates' τ is the row's τ: every entry left out is at or below the
// threshold, hence below τ, and adds nothing.
template <typename T>
inline double solve_candidates(const RowList<T>& rl, double alpha, int mode, Cands& w) {
  const double am1 = alpha - 1.0;
  load_candidates(rl, am1, w);
  if (w.c == 0) return std::numeric_limits<double>::quiet_NaN();
  const double lo0 = std::max(-1.0, am1 * (static_cast<double>(rl.thr) - static_cast<double>(rl.m)));
  return solve_tau(w, alpha, mode, lo0, w.c);
}

// A row's candidates are first pruned when they exceed this many, then whenever they have doubled: the pruned
// threshold is close to the support's, so later segments add few candidates.
constexpr size_t kFirstPrune = 64;

// Raises the row's threshold to the τ of its current candidates (a lower bound of the row's τ: adding
// entries only raises Σ [X − τ]₊^e) and drops the candidates at or below it. (X-space thresholds move
// with the max; the x-space threshold t = m + τ/(α−1) does not: p_j = [(α−1)(x_j − t)]₊^e.)
template <typename T>
void prune_candidates(RowList<T>& rl, double alpha, int mode, Cands& w) {
  const double tau = solve_candidates(rl, alpha, mode, w);
  if (std::isfinite(tau)) {
    const double t = static_cast<double>(rl.m) + tau / (alpha - 1.0);
    const T thr = static_cast<T>(t - 1e-6 * (1.0 + std::fabs(t)));   // widened: the exact test is in double
    if (thr > rl.thr) {
      rl.thr = thr;
      size_t kept = 0;
      for (size_t i = 0; i < rl.c; ++i) {   // branch-free, order kept
        const T v = rl.x[i];
        const int32_t jj = rl.j[i];
        rl.x[kept] = v; rl.j[kept] = jj; kept += v > thr;
      }
      rl.c = kept;
    }
  }
  rl.budget = std::max(rl.budget, 2 * rl.c);
}

// The support at τ (solved on the candidates now in w) written over the row's list as (p, key); returns
// 1/normaliser (1 for α = 1.5 and 2, exact on their support).
template <typename T>
double emit_support(RowList<T>& rl, double alpha, int mode, Cands& w, double tau) {
  const size_t c = w.c;
  const double* X = w.X();
  const int64_t* idx = w.idx();
  size_t s = 0;
  double inv = 1.0;
  rl.room(0);
  if (mode == 1 || mode == 2) {
    size_t i = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {   // 8 at a time: d > 0 kept by a compress, in order
      const __m512d vt = _mm512_set1_pd(tau);
      for (; i + 8 <= c; i += 8) {
        const __m512d d = _mm512_sub_pd(_mm512_loadu_pd(X + i), vt);
        const __mmask8 pos = _mm512_cmp_pd_mask(d, _mm512_setzero_pd(), _CMP_GT_OQ);
        if (!pos) continue;
        const __m256 pv = _mm512_cvtpd_ps(mode == 1 ? _mm512_mul_pd(d, d) : d);
        const __m256i jv = _mm512_cvtepi64_epi32(_mm512_loadu_si512(idx + i));
        _mm256_storeu_ps(rl.x.data() + s, _mm256_maskz_compress_ps(pos, pv));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(rl.j.data() + s), _mm256_maskz_compress_epi32(pos, jv));
        s += static_cast<size_t>(__builtin_popcount(pos));
      }
    }
#endif
    for (; i < c; ++i) {
      const double d = X[i] - tau;
      if (d > 0) { rl.x[s] = static_cast<T>(mode == 1 ? d * d : d); rl.j[s] = static_cast<int32_t>(idx[i]); ++s; }
    }
  } else if (w.has_P) {
    // d^e from the last evaluation, ≤ 1e-12 away from the final τ (relative change ≤ e·1e-12/d, and
    // the renormalisation removes its common part); entries at or below the final τ stay exact zeros
    const double* P = w.P();
    double sum = 0;
    for (size_t i = 0; i < c; ++i) if (X[i] > tau) sum += P[i];
    inv = sum > 0 ? 1.0 / sum : 0.0;
    for (size_t i = 0; i < c; ++i)
      if (X[i] > tau) { rl.x[s] = static_cast<T>(P[i] * inv); rl.j[s] = static_cast<int32_t>(idx[i]); ++s; }
  } else {
    const double sum = power_finish(w.X(), c, tau, 1.0 / (alpha - 1.0));   // X[i] ← [X[i] − τ]₊^e
    inv = sum > 0 ? 1.0 / sum : 0.0;
    for (size_t i = 0; i < c; ++i)
      if (X[i] > 0) { rl.x[s] = static_cast<T>(X[i] * inv); rl.j[s] = static_cast<int32_t>(idx[i]); ++s; }
  }
  rl.c = s;
  return inv;
}

// Rows are scanned in segments of this many entries, each read twice in a row (in L1 the second time).
constexpr int64_t kSegment = 2048;

// Collects x's candidates above rl.thr segment by segment, pruning as they grow.
template <typename T>
inline void collect_row(const T* x, int64_t n, double alpha, int mode, RowList<T>& rl, Cands& w) {
  for (int64_t s = 0; s < n; s += kSegment) {
    const int64_t len = std::min(kSegment, n - s);
    rl.room(static_cast<size_t>(len));
    rl.c = collect_above(x + s, len, rl.thr, s, rl.x.data(), rl.j.data(), rl.c);
    if (rl.c > rl.budget && s + len < n) prune_candidates(rl, alpha, mode, w);   // (the last: the solve)
  }
}

// τ of the row's lane maxima (from row_max): a part of the row, so a lower bound of the row's τ (X-space for
// the max m), exact in double. For a Gaussian row of 512 entries it lifts the candidates' threshold from
// m − 2 to about m − 1.1 (α = 1.5), a quarter of the candidates.
template <typename T>
double lane_bound(const T* lanes, int n_lanes, double alpha, int mode, double m, Cands& w) {
  const double am1 = alpha - 1.0;
  w.reserve(n_lanes);
  size_t c = 0;
  for (int i = 0; i < n_lanes; ++i) {
    const double X = am1 * (static_cast<double>(lanes[i]) - m);
    w.X()[c] = X; w.idx()[c] = i; c += X > -1.0;
  }
  w.c = c;
  if (c == 0) return -1.0;
  const double tau = solve_tau(w, alpha, mode, -1.0, c);
  return std::isfinite(tau) ? std::max(-1.0, tau - 1e-9 * (1.0 + std::fabs(tau))) : -1.0;
}

// One row; m is its max (finite: NaN, +inf and all -inf rows are handled by the caller). The candidates are
// the entries above a lower bound of τ — m − 1/(α−1) (τ ≥ −1), or for fp32 rows with α < 2 other than 1.5
// the Jensen bound of group_bound (fp32 sums: checked, see solve_candidates) — pruned as they are collected,
// then solved; the output is zeros and the support.
template <typename scalar_t>
void forward_row(const scalar_t* x, scalar_t* p, int64_t n, double alpha, double m, RowList<scalar_t>& rl, Cands& w,
                 const scalar_t* lanes = nullptr, int n_lanes = 0) {
  // p may be x itself (in place): everything is read before the row is zeroed
  if (!std::isfinite(m)) { std::fill(p, p + n, scalar_t(0)); return; }   // all -inf: a zero row
  const int mode = row_mode(alpha);
  if (mode == 3) { softmax_row<scalar_t>(x, p, n, m); return; }
  const double am1 = alpha - 1.0;
  double lo = -1.0;   // a lower bound of τ (X-space)
  if constexpr (std::is_same_v<scalar_t, float>)
    if (mode == 0 && alpha < 2.0 && n < (int64_t{1} << 31)) lo = group_bound(x, n, alpha, m);
  if (n_lanes > 0 && lo == -1.0) lo = lane_bound(lanes, n_lanes, alpha, mode, m, w);
  double tau;
  for (;;) {
    // (above the group bound the candidates are about the support: pruning them would cost a solve)
    rl.reset(lo > -1.0 ? std::numeric_limits<size_t>::max() : kFirstPrune);
    rl.m = static_cast<scalar_t>(m);
    const double t = m + lo / am1;   // in x; widened by a few ulps (the exact test is in double)
    rl.thr = static_cast<scalar_t>(t - 1e-6 * (1.0 + std::fabs(t)));
    collect_row(x, n, alpha, mode, rl, w);
    tau = solve_candidates(rl, alpha, mode, w);
    if (!std::isnan(tau) || lo == -1.0) break;
    lo = -1.0;   // the group bound failed (fp32 sums): from −1
  }
  if (std::isnan(tau)) {   // only by round-off at the −1 bound itself: solve from below it
    load_candidates(rl, am1, w);
    tau = solve_tau(w, alpha, mode, -1.0, w.c);
  }
  emit_support(rl, alpha, mode, w, tau);
  std::fill(p, p + n, scalar_t(0));   // after the solve: p may be x (in place), read above
  for (size_t i = 0; i < rl.c; ++i) p[rl.j[i]] = rl.x[i];
}

template <typename scalar_t>
void backward_row(const scalar_t* p, const scalar_t* g, scalar_t* dz, int64_t n, double alpha) {
  const int mode = row_mode(alpha);
  using acc_t = double;
  acc_t su = 0, sug = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (mode != 0) {   // u = √p, [p > 0] or p, sixteen at a time (per-lane fp32 sums, added in double)
      __m512 a_su = _mm512_setzero_ps(), a_sug = _mm512_setzero_ps();
      for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 live = n - j >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
        const __m512 pv = _mm512_maskz_loadu_ps(live, p + j), gv = _mm512_maskz_loadu_ps(live, g + j);
        const __m512 u = mode == 1 ? _mm512_sqrt_ps(pv)
                       : mode == 2 ? _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(pv, _mm512_setzero_ps(), _CMP_GT_OQ),
                                                         _mm512_set1_ps(1.0f))
                                   : pv;
        a_su = _mm512_add_ps(a_su, u);
        a_sug = _mm512_fmadd_ps(u, gv, a_sug);
        _mm512_mask_storeu_ps(dz + j, live, u);
      }
      alignas(64) float b1[16], b2[16];
      _mm512_store_ps(b1, a_su); _mm512_store_ps(b2, a_sug);
      for (int l = 0; l < 16; ++l) { su += b1[l]; sug += b2[l]; }
      const float q = static_cast<float>(su > 0 ? sug / su : 0.0);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) dz[j] = dz[j] * (g[j] - q);
      return;
    }
  }
#endif
  if (mode == 1) {
    for (int64_t j = 0; j < n; ++j) { scalar_t u = std::sqrt(p[j]); dz[j] = u; su += u; sug += u * g[j]; }
  } else if (mode == 2) {
    for (int64_t j = 0; j < n; ++j) { scalar_t u = p[j] > 0 ? scalar_t(1) : scalar_t(0); dz[j] = u; su += u; sug += u * g[j]; }
  } else if (mode == 3) {
    for (int64_t j = 0; j < n; ++j) { const scalar_t u = p[j]; dz[j] = u; su += u; sug += u * g[j]; }
  } else {
    const double ex = 2.0 - alpha;
    int64_t j = 0;
#ifdef LONGSPARSE_VEC_POW
    // u = p^(2−α) four at a time; blocks outside the support (all p = 0) skip the power
    const __m256d vex = _mm256_set1_pd(ex), zero = _mm256_setzero_pd(), tiny = _mm256_set1_pd(kTinyD);
    __m256d asu = zero, asug = zero;
    for (; j + 4 <= n; j += 4) {
      __m256d pv, gv;
      if constexpr (std::is_same_v<scalar_t, float>) {
        pv = _mm256_cvtps_pd(_mm_loadu_ps(p + j)); gv = _mm256_cvtps_pd(_mm_loadu_ps(g + j));
      } else {
        pv = _mm256_loadu_pd(p + j); gv = _mm256_loadu_pd(g + j);
      }
      const __m256d pos = _mm256_cmp_pd(pv, zero, _CMP_GT_OQ);
      if (!_mm256_movemask_pd(pos)) { std::fill(dz + j, dz + j + 4, scalar_t(0)); continue; }
      __m256d u = _mm256_and_pd(pos, exp2_pd(_mm256_mul_pd(vex, log2_pd(_mm256_max_pd(pv, tiny)))));
      if constexpr (std::is_same_v<scalar_t, float>) {
        const __m128 uf = _mm256_cvtpd_ps(u);       // u in the row's precision, as the scalar path
        _mm_storeu_ps(dz + j, uf);
        u = _mm256_cvtps_pd(uf);
      } else {
        _mm256_storeu_pd(dz + j, u);
      }
      asu = _mm256_add_pd(asu, u);
      asug = _mm256_fmadd_pd(u, gv, asug);
    }
    su = hsum_pd(asu); sug = hsum_pd(asug);
#endif
    for (; j < n; ++j) {
      scalar_t u = p[j] > 0 ? static_cast<scalar_t>(std::pow(static_cast<double>(p[j]), ex)) : scalar_t(0);
      dz[j] = u; su += u; sug += u * g[j];
    }
  }
  const scalar_t q = static_cast<scalar_t>(su > 0 ? sug / su : 0.0);
  for (int64_t j = 0; j < n; ++j) dz[j] = dz[j] * (g[j] - q);
}

// The max of x[0, n) and a problem code: 0 finite or −inf entries only, 1 a NaN, 2 a +inf (NaN wins).
template <typename scalar_t>
inline int row_max(const scalar_t* x, int64_t n, scalar_t& m, scalar_t* lanes = nullptr, int* n_lanes = nullptr) {
  m = -std::numeric_limits<scalar_t>::infinity();
  bool bad = false;
  const int L = seg_max(x, n, m, bad, lanes);
  if (n_lanes) *n_lanes = L;
  if (!bad) return 0;
  for (int64_t j = 0; j < n; ++j) if (x[j] != x[j]) return 1;
  return 2;
}

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

// ----------------------------------------------------------------------------- attention scores
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


// ============================================================================= fused attention
// Flash-style α-entmax attention (the fused_cpu backend). Work is split into blocks of query rows of one
// (batch, head); a block walks over its visible keys in tiles of `key_tile` columns, and only one tile of
// logits, S = scale·q kᵀ (block rows × key_tile, computed by BLAS), exists at a time: extra memory is
// O(block rows × key_tile) for the logits plus the candidates below, never O(Nq × Nk).
//
//   α > 1, forward: each row keeps a running max m and a threshold below which no entry can be in the
//     support: m − 1/(α−1) (τ ≥ −1 after shifting by the max and scaling by α−1), raised further when the
//     row's candidates are pruned (the τ of any subset of a row is a lower bound of the row's τ: adding
//     entries only raises Σ [X − τ]₊^e). A tile pass per row takes the max and collects the entries above
//     the threshold (a vector compress); after the last tile the candidates are solved for τ exactly as
//     in the mapping (solve_tau), and the output is Σ_support p_j v_j — gathered from the support only, so
//     the p·v product costs O(support × D) instead of a second dense product.
//   α = 1 (softmax), forward: the online softmax of flash attention (running max and sum, the tile's
//     probabilities written over its logits, then p·v by BLAS).
//   α > 1, backward: the tiles of S are recomputed; each row's probabilities follow from its saved (max, τ,
//     1/normaliser) without a solve and are collected as a support list; then per support entry:
//     dp = dout·v_j, u = p^{2−α}, ds = scale·u·(dp − Σu dp / Σu), dq += ds k_j, dk_j += ds q, dv_j += p dout.
//   α = 1, backward: flash attention's, by BLAS on each tile (every key is in the support; dout·out per row
//     replaces Σ p dp, so the forward's output is kept for softmax heads).
//   Blocks of one (batch, head) run in order on one thread (they share dk, dv), heads in parallel.
// Row statistics saved by the forward, (B, H, Nq, 3) float64: (m, τ, 1/normaliser); m = −inf marks a row
// with no visible key (zero output). Softmax rows: (m, 0, 1/Σ e^(x−m)). Key ranges (key_lo, key_hi per
// batch row) limit each row's keys with the causal mask; a block's tiles start at its first visible key. A band
// per row (band_lo, band_hi; the caller's proof that no key outside it is in the support) limits them further:
// a block walks only the tiles from its rows' least band_lo to their greatest band_hi, so a block of an ALiBi
// head reads the few tiles next to the diagonal. The row max lies in the band (it is in the support), so the
// statistics, the support and the outputs are those of the whole row.

extern "C" {
// BLAS as exported by torch's own library (its MKL or OpenBLAS, the LP64 interface: 32-bit integers); weak
// symbols, so that a torch without them still loads this module and falls back to at::mm on the same buffers.
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
            const int*, const double*, const int*, const double*, double*, const int*) __attribute__((weak));
}

template <typename T>
inline bool blas_gemm(const char* ta, const char* tb, int m, int n, int k, T alpha, const T* a, int lda,
                      const T* b, int ldb, T beta, T* c, int ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (!sgemm_) return false;
    sgemm_(ta, tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
  } else {
    if (!dgemm_) return false;
    dgemm_(ta, tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
  }
  return true;
}

template <typename T>
inline torch::Tensor blob(const T* p, at::IntArrayRef sizes, at::IntArrayRef strides) {
  return torch::from_blob(const_cast<T*>(p), sizes, strides, torch::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value));
}

// S[r][j] = alpha · Σ_d Q[r][d] K[j][d] for r < R, j < n (rows of Q and K hold D values; S rows are lds apart)
template <typename T>
void gemm_scores(int64_t R, int64_t n, int64_t D, T alpha, const T* Q, const T* K, T* S, int64_t lds) {
  if (R == 0 || n == 0) return;
  // column-major BLAS: Sᵀ (n × R) = (K as D × n)ᵀ · (Q as D × R)
  if (blas_gemm<T>("T", "N", static_cast<int>(n), static_cast<int>(R), static_cast<int>(D), alpha, K,
                   static_cast<int>(D), Q, static_cast<int>(D), T(0), S, static_cast<int>(lds))) return;
  auto s = blob(S, {R, n}, {lds, 1});
  at::mm_out(s, blob(Q, {R, D}, {D, 1}), blob(K, {n, D}, {D, 1}).t());
  s.mul_(alpha);
}

// O[r][d] = beta · O[r][d] + Σ_j P[r][j] V[j][d] for r < R, j < n (P rows are ldp apart; O, V rows hold D)
template <typename T>
void gemm_accumulate(int64_t R, int64_t n, int64_t D, const T* P, int64_t ldp, const T* V, T beta, T* O) {
  if (R == 0 || n == 0) return;
  // column-major BLAS: Oᵀ (D × R) = (V as D × n) · (P as n × R)
  if (blas_gemm<T>("N", "N", static_cast<int>(D), static_cast<int>(R), static_cast<int>(n), T(1), V,
                   static_cast<int>(D), P, static_cast<int>(ldp), beta, O, static_cast<int>(D))) return;
  blob(O, {R, D}, {D, 1}).addmm_(blob(P, {R, n}, {ldp, 1}), blob(V, {n, D}, {D, 1}), beta, 1);
}

// Subnormal floats flushed to zero while it lives (this thread's MXCSR, restored after). The online softmax
// rescales its accumulators by e^(m_old − m_new) and long ALiBi rows produce probabilities near the bottom of
// the float range: as subnormals they would slow every later product many times over (the p·v product
// ran at half speed at N = 4096), while their share of a row summing to 1 is below 1e-37.
struct FlushSubnormals {
#if defined(__SSE2__)
  unsigned saved;
  FlushSubnormals() : saved(_mm_getcsr()) { _mm_setcsr(saved | 0x8040u); }   // FTZ | DAZ
  ~FlushSubnormals() { _mm_setcsr(saved); }
#endif
};

// ----------------------------------------------------------------------------- per-entry vector work
// Dense vectors of the head dimension; DS > 0 fixes it at compile time (the accumulators then live in
// registers), DS = 0 reads it at run time.
template <typename T, int DS>
struct HeadVec {
  static inline int64_t dim(int64_t D) { return DS > 0 ? DS : D; }
  // out = Σ_i p_i V[j_i]
  static void combine(const T* p, const int32_t* js, size_t s, const T* V, int64_t D_, T* out) {
    const int64_t D = dim(D_);
    if constexpr (DS > 0) {
      T acc[DS] = {};
      for (size_t i = 0; i < s; ++i) {
        const T* vr = V + static_cast<int64_t>(js[i]) * DS;
        const T pi = p[i];
#pragma omp simd
        for (int d = 0; d < DS; ++d) acc[d] += pi * vr[d];
      }
      for (int d = 0; d < DS; ++d) out[d] = acc[d];
    } else {
      std::fill(out, out + D, T(0));
      for (size_t i = 0; i < s; ++i) axpy(p[i], V + static_cast<int64_t>(js[i]) * D, out, D);
    }
  }
  static inline T dot(const T* a, const T* b, int64_t D_) {
    const int64_t D = dim(D_);
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
    return s;
  }
  static inline void axpy(T a, const T* __restrict x, T* __restrict y, int64_t D_) {
    const int64_t D = dim(D_);
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) y[d] += a * x[d];
  }
};

// ----------------------------------------------------------------------------- geometry
struct AttnShape {
  int64_t B, H, Nq, Nk, D, first_pos;
  bool causal;
  const int64_t* key_lo;   // (B,) or null: batch row b sees keys key_lo[b] ≤ j < key_hi[b] (and causal)
  const int64_t* key_hi;
  const double* alpha;     // (H,)
  const double* slopes;    // (H,) or null
  // (B, H, Nq) or null: the keys band_lo ≤ j < band_hi of each row hold its whole support (the caller proves
  // that every other key gets p = 0: attention/band.py), so only they are read
  const int32_t* band_lo;
  const int32_t* band_hi;
  double scale;
  int64_t rows, tile;      // query rows per block, keys per tile

  // keys [lo, hi) that query row i of batch row b, head h reads (empty: lo = hi): the visible ones, within
  // the row's band
  inline void range(int64_t b, int64_t h, int64_t i, int64_t& lo, int64_t& hi) const {
    lo = key_lo ? std::max<int64_t>(0, key_lo[b]) : 0;
    hi = key_hi ? std::min<int64_t>(Nk, key_hi[b]) : Nk;
    if (causal) hi = std::min(hi, first_pos + i + 1);
    if (band_lo) {
      const int64_t t = (b * H + h) * Nq + i;
      lo = std::max<int64_t>(lo, band_lo[t]);
      hi = std::min<int64_t>(hi, band_hi[t]);
    }
    if (hi < lo) hi = lo;
  }
  int64_t blocks() const { return (Nq + rows - 1) / rows; }
};

// ----------------------------------------------------------------------------- forward
// Whether τ_g (X-space, for the max m) is a lower bound of τ, judged on candidates x[c0, c1) that hold every
// entry of some part of the row above it: Σ [(α−1)(x − m) − τ_g]₊^e ≥ 1 over them (a part of the row
// bounds the whole).
template <typename T>
bool bound_holds(const T* x, size_t c0, size_t c1, double m, double tau_g, double alpha) {
  const double am1 = alpha - 1.0, e = 1.0 / am1;
  double f = 0;
  for (size_t i = c0; i < c1; ++i) {
    const double d = am1 * (static_cast<double>(x[i]) - m) - tau_g;
    if (d > 0) f += e == 2.0 ? d * d : pow_sd(d, e);
  }
  return f >= 1.0;
}

// Fewest keys in a row's first segment for which the forward takes group_bound's threshold (see its use).
// 4 ALiBi heads at N = 16384 (bands of ~13-70 keys) spent ~40 % of their kernel time in it.
constexpr int64_t kGroupBoundMinKeys = 256;

template <typename T, int DS>
void forward_block(const AttnShape& g, int64_t b, int64_t h, int64_t blk, const T* q, const T* k, const T* v,
                   T* out, double* stats, std::vector<T>& S, std::vector<T>& acc, std::vector<RowList<T>>& rows,
                   Cands& w, std::atomic<int>& bad) {
  const int64_t D = g.D, Kt = g.tile;
  const int64_t r0 = blk * g.rows, r1 = std::min(g.Nq, r0 + g.rows), R = r1 - r0;
  const int64_t bh = b * g.H + h;
  const T* Q = q + (bh * g.Nq + r0) * D;
  const T* K = k + bh * g.Nk * D;
  const T* V = v + bh * g.Nk * D;
  T* O = out + (bh * g.Nq + r0) * D;
  double* st = stats + (bh * g.Nq + r0) * 3;
  const double alpha = g.alpha[h];
  const int mode = row_mode(alpha);
  const bool soft = mode == 3;
  const T slope = g.slopes ? static_cast<T>(g.slopes[h]) : T(0);
  int64_t blo = g.Nk, bhi = 0;
  for (int64_t r = 0; r < R; ++r) {
    RowList<T>& rl = rows[r];
    rl.reset(kFirstPrune);
    g.range(b, h, r0 + r, rl.lo, rl.hi);
    if (rl.lo < rl.hi) { blo = std::min(blo, rl.lo); bhi = std::max(bhi, rl.hi); }
  }
  if (soft) std::fill(acc.begin(), acc.begin() + R * D, T(0));
  const double inv_am1 = soft ? 0.0 : 1.0 / (alpha - 1.0);
  bool row_bad = false;
  for (int64_t j0 = blo; j0 < bhi; j0 += Kt) {
    const int64_t n = std::min(Kt, bhi - j0);
    gemm_scores<T>(R, n, D, static_cast<T>(g.scale), Q, K + j0 * D, S.data(), Kt);
    for (int64_t r = 0; r < R; ++r) {
      RowList<T>& rl = rows[r];
      T* x = S.data() + r * Kt;
      const int64_t a = std::max(j0, rl.lo), e = std::min(j0 + n, rl.hi);
      if (a >= e) {
        if (soft) std::fill(x, x + n, T(0));
        continue;
      }
      T* xs = x + (a - j0);
      const int64_t len = e - a;
      if (slope != T(0)) add_alibi(xs, len, slope, (g.first_pos + r0 + r) - a);
      T mx = -std::numeric_limits<T>::infinity();
      seg_max(xs, len, mx, row_bad);
      if (soft) {
        // online softmax: rescale what came before to the new max, then this tile's e^(x − m)
        if (mx > rl.m) {
          if (rl.m != -std::numeric_limits<T>::infinity()) {
            const T f = static_cast<T>(std::exp(static_cast<double>(rl.m) - static_cast<double>(mx)));
            rl.l *= f;
            T* ar = acc.data() + r * D;
            for (int64_t d = 0; d < D; ++d) ar[d] *= f;
          }
          rl.m = mx;
        }
        std::fill(x, xs, T(0));
        std::fill(xs + len, x + n, T(0));
        if (rl.m == -std::numeric_limits<T>::infinity()) { std::fill(xs, xs + len, T(0)); continue; }
        rl.l += exp_shifted(xs, len, rl.m);
      } else {
        const auto widened = [](double t) { return static_cast<T>(t - 1e-6 * (1.0 + std::fabs(t))); };
        rl.room(static_cast<size_t>(len));
        bool collected = false;
        if (mx > rl.m) {
          if constexpr (std::is_same_v<T, float>) {
            // a row's first tile, 1 < α < 2: the Jensen bound of its entries (group_bound), far above −1
            // where the support is small; fp32 sums, so checked on the entries it keeps before it is used.
            // Not on short segments (an ALiBi row's band of a few dozen keys), where collecting everything
            // above m − 1/(α−1) costs less than the bound
            if (rl.m == -std::numeric_limits<T>::infinity() && alpha < 2.0 && len >= kGroupBoundMinKeys) {
              const double tg = group_bound(xs, len, alpha, static_cast<double>(mx));
              if (tg > -1.0) {
                const T thr = widened(static_cast<double>(mx) + tg * inv_am1);
                const size_t c1 = collect_above(xs, len, thr, a, rl.x.data(), rl.j.data(), rl.c);
                if (bound_holds(rl.x.data(), rl.c, c1, static_cast<double>(mx), tg, alpha)) {
                  rl.thr = thr;
                  rl.c = c1;
                  collected = true;
                }
              }
            }
          }
          rl.m = mx;
          rl.thr = std::max(rl.thr, widened(static_cast<double>(mx) - inv_am1));   // τ ≥ −1
        }
        if (!collected) rl.c = collect_above(xs, len, rl.thr, a, rl.x.data(), rl.j.data(), rl.c);
        if (rl.c > rl.budget) prune_candidates(rl, alpha, mode, w);
      }
    }
    if (soft) gemm_accumulate<T>(R, n, D, S.data(), Kt, V + j0 * D, T(1), acc.data());
  }
  if (row_bad) bad.store(1);
  for (int64_t r = 0; r < R; ++r) {
    RowList<T>& rl = rows[r];
    T* o = O + r * D;
    double* s3 = st + 3 * r;
    if (rl.lo >= rl.hi || rl.m == -std::numeric_limits<T>::infinity() || row_bad) {
      std::fill(o, o + D, T(0));
      s3[0] = -std::numeric_limits<double>::infinity(); s3[1] = 0; s3[2] = 0;
      continue;
    }
    s3[0] = static_cast<double>(rl.m);
    if (soft) {
      const double inv = 1.0 / rl.l;   // l ≥ 1: the max contributes e^0
      const T* ar = acc.data() + r * D;
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(ar[d] * inv);
      s3[1] = 0; s3[2] = inv;
    } else {
      double tau = solve_candidates(rl, alpha, mode, w);
      if (std::isnan(tau)) {   // only by round-off at a bound (every threshold here is checked): from −1
        load_candidates(rl, alpha - 1.0, w);
        tau = solve_tau(w, alpha, mode, -1.0, w.c);
      }
      const double inv = emit_support(rl, alpha, mode, w, tau);
      HeadVec<T, DS>::combine(rl.x.data(), rl.j.data(), rl.c, V, D, o);
      s3[1] = tau; s3[2] = inv;
    }
  }
}

template <typename T, int DS>
void forward_all(const AttnShape& g, const T* q, const T* k, const T* v, T* out, double* stats, std::atomic<int>& bad) {
  const int64_t nb = g.blocks(), total = g.B * g.H * nb;
  at::parallel_for(0, total, 1, [&](int64_t first, int64_t last) {
    const FlushSubnormals flush;
    std::vector<T> S(static_cast<size_t>(g.rows * g.tile)), acc(static_cast<size_t>(g.rows * g.D));
    std::vector<RowList<T>> rows(static_cast<size_t>(g.rows));
    Cands w;
    for (int64_t t = first; t < last; ++t) {
      const int64_t bh = t / nb, i = t % nb;
      // blocks of a head alternate from both ends (0, nb−1, 1, nb−2, …): under a causal mask block costs
      // grow with their index, so any contiguous range of tasks (one thread's share) is balanced
      const int64_t blk = (i % 2 == 0) ? i / 2 : nb - 1 - i / 2;
      forward_block<T, DS>(g, bh / g.H, bh % g.H, blk, q, k, v, out, stats, S, acc, rows, w, bad);
    }
  });
}

// ----------------------------------------------------------------------------- backward
// x_i ← x_i^e · mul for i < n (x_i > 0), four at a time where vectorised powers exist.
inline void pow_scaled(double* x, size_t n, double e, double mul) {
  size_t i = 0;
#ifdef LONGSPARSE_VEC_POW
  const __m256d ve = _mm256_set1_pd(e), vm = _mm256_set1_pd(mul), tiny = _mm256_set1_pd(kTinyD);
  for (; i + 4 <= n; i += 4)
    _mm256_storeu_pd(x + i, _mm256_mul_pd(pow_pd(_mm256_max_pd(_mm256_loadu_pd(x + i), tiny), ve), vm));
#endif
  for (; i < n; ++i) x[i] = pow_sd(std::max(x[i], kTinyD), e) * mul;
}

// u_i = p_i^(2−α) for the support entries p[0, s) (all > 0)
template <typename T>
inline void support_weights(const T* p, size_t s, int mode, double alpha, T* u, std::vector<double>& scratch) {
  if (mode == 1) { for (size_t i = 0; i < s; ++i) u[i] = std::sqrt(p[i]); return; }
  if (mode == 2) { std::fill(u, u + s, T(1)); return; }
  if (mode == 3) { std::copy(p, p + s, u); return; }
  if (scratch.size() < s) scratch.resize(s);
  for (size_t i = 0; i < s; ++i) scratch[i] = static_cast<double>(p[i]);
  pow_scaled(scratch.data(), s, 2.0 - alpha, 1.0);
  for (size_t i = 0; i < s; ++i) u[i] = static_cast<T>(scratch[i]);
}

// C[j][d] += Σ_r A[r][j] B[r][d] for j < n, d < D, r < R (A rows are lda apart; B, C rows hold D)
template <typename T>
void gemm_transposed_accumulate(int64_t R, int64_t n, int64_t D, const T* A, int64_t lda, const T* B, T* C) {
  if (R == 0 || n == 0) return;
  // column-major BLAS: Cᵀ (D × n) += (B as D × R) · (A as n × R)ᵀ
  if (blas_gemm<T>("N", "T", static_cast<int>(D), static_cast<int>(n), static_cast<int>(R), T(1), B,
                   static_cast<int>(D), A, static_cast<int>(lda), T(1), C, static_cast<int>(D))) return;
  blob(C, {n, D}, {D, 1}).addmm_(blob(A, {R, n}, {lda, 1}).t(), blob(B, {R, D}, {D, 1}));
}

template <typename T>
struct BackwardWork {
  std::vector<T> S, dS, tmp;
  std::vector<double> dbuf;
  std::vector<RowList<T>> rows;
  explicit BackwardWork(const AttnShape& g)
      : S(static_cast<size_t>(g.rows * g.tile)), rows(static_cast<size_t>(g.rows)) {}
};

// Softmax rows (α = 1), every key in the support: the flash-attention backward by BLAS on each tile,
// dS = scale · p ⊙ (dp − dout·out) with dp = dout vᵀ; dq += dS k, dk += dSᵀ q, dv += pᵀ dout.
template <typename T>
void backward_softmax_block(const AttnShape& g, int64_t b, int64_t h, int64_t r0, int64_t R, const T* Q, const T* K, const T* V,
                            const T* dO, const T* O, const double* st, T slope, T* dQ, T* dK, T* dV,
                            BackwardWork<T>& wk) {
  const int64_t D = g.D, Kt = g.tile;
  if (wk.dS.size() < wk.S.size()) wk.dS.resize(wk.S.size());
  if (wk.tmp.size() < static_cast<size_t>(R)) wk.tmp.resize(static_cast<size_t>(R));
  T* delta = wk.tmp.data();   // dout·out per row: Σ_j p_j dp_j
  int64_t blo = g.Nk, bhi = 0;
  for (int64_t r = 0; r < R; ++r) {
    RowList<T>& rl = wk.rows[r];
    g.range(b, h, r0 + r, rl.lo, rl.hi);
    if (st[3 * r] == -std::numeric_limits<double>::infinity()) rl.hi = rl.lo;
    if (rl.lo < rl.hi) { blo = std::min(blo, rl.lo); bhi = std::max(bhi, rl.hi); }
    delta[r] = HeadVec<T, 0>::dot(dO + r * D, O + r * D, D);
  }
  std::fill(dQ, dQ + R * D, T(0));
  const T sc = static_cast<T>(g.scale);
  for (int64_t j0 = blo; j0 < bhi; j0 += Kt) {
    const int64_t n = std::min(Kt, bhi - j0);
    T* P = wk.S.data();
    T* dS = wk.dS.data();
    gemm_scores<T>(R, n, D, sc, Q, K + j0 * D, P, Kt);
    for (int64_t r = 0; r < R; ++r) {
      const RowList<T>& rl = wk.rows[r];
      T* x = P + r * Kt;
      const int64_t a = std::max(j0, rl.lo), end = std::min(j0 + n, rl.hi);
      if (a >= end) { std::fill(x, x + n, T(0)); continue; }
      T* xs = x + (a - j0);
      if (slope != T(0)) add_alibi(xs, end - a, slope, (g.first_pos + r0 + r) - a);
      exp_shifted(xs, end - a, static_cast<T>(st[3 * r]), static_cast<T>(st[3 * r + 2]));
      std::fill(x, xs, T(0));
      std::fill(x + (end - j0), x + n, T(0));
    }
    gemm_scores<T>(R, n, D, T(1), dO, V + j0 * D, dS, Kt);   // dp = dout vᵀ
    for (int64_t r = 0; r < R; ++r) {
      const T* p = P + r * Kt;
      T* ds = dS + r * Kt;
      const T dr = delta[r];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) ds[j] = sc * p[j] * (ds[j] - dr);
    }
    gemm_accumulate<T>(R, n, D, dS, Kt, K + j0 * D, T(1), dQ);
    gemm_transposed_accumulate<T>(R, n, D, dS, Kt, Q, dK + j0 * D);
    gemm_transposed_accumulate<T>(R, n, D, P, Kt, dO, dV + j0 * D);
  }
}

// α > 1 rows: each row's support from its statistics, then the per-entry products (see the section comment).
template <typename T, int DS>
void backward_entmax_block(const AttnShape& g, int64_t b, int64_t h, int64_t r0, int64_t R, const T* Q, const T* K,
                           const T* V, const T* dO, const double* st, double alpha, T slope, T* dQ, T* dK, T* dV,
                           BackwardWork<T>& wk) {
  using HV = HeadVec<T, DS>;
  const int64_t D = g.D, Kt = g.tile;
  const int mode = row_mode(alpha);
  const double am1 = alpha - 1.0, e = 1.0 / am1;
  const T sc = static_cast<T>(g.scale);
  std::vector<double>& dbuf = wk.dbuf;
  int64_t blo = g.Nk, bhi = 0;
  for (int64_t r = 0; r < R; ++r) {
    RowList<T>& rl = wk.rows[r];
    rl.reset(0);
    g.range(b, h, r0 + r, rl.lo, rl.hi);
    if (st[3 * r] == -std::numeric_limits<double>::infinity()) rl.hi = rl.lo;   // zero row: no support
    if (rl.lo < rl.hi) {
      blo = std::min(blo, rl.lo); bhi = std::max(bhi, rl.hi);
      const double t = st[3 * r] + st[3 * r + 1] / am1;   // the support's threshold in x, widened
      rl.thr = static_cast<T>(t - 1e-6 * (1.0 + std::fabs(t)));
    }
  }
  for (int64_t j0 = blo; j0 < bhi; j0 += Kt) {
    const int64_t n = std::min(Kt, bhi - j0);
    gemm_scores<T>(R, n, D, sc, Q, K + j0 * D, wk.S.data(), Kt);
    for (int64_t r = 0; r < R; ++r) {
      RowList<T>& rl = wk.rows[r];
      const int64_t a = std::max(j0, rl.lo), end = std::min(j0 + n, rl.hi);
      if (a >= end) continue;
      T* xs = wk.S.data() + r * Kt + (a - j0);
      const int64_t len = end - a;
      if (slope != T(0)) add_alibi(xs, len, slope, (g.first_pos + r0 + r) - a);
      const double m = st[3 * r], tau = st[3 * r + 1], inv = st[3 * r + 2];
      rl.room(static_cast<size_t>(len));
      const size_t c0 = rl.c;
      const size_t c1 = collect_above(xs, len, rl.thr, a, rl.x.data(), rl.j.data(), c0);
      // the exact test d = (α−1)(x − m) − τ > 0 and p, as the forward's emit_support
      if (dbuf.size() < c1 - c0 + 4) dbuf.resize(c1 - c0 + 4);
      size_t s = 0;
      for (size_t i = c0; i < c1; ++i) {
        const double d = am1 * (static_cast<double>(rl.x[i]) - m) - tau;
        dbuf[s] = d; rl.j[c0 + s] = rl.j[i]; s += d > 0;
      }
      if (mode == 0) pow_scaled(dbuf.data(), s, e, inv);
      for (size_t i = 0; i < s; ++i) rl.x[c0 + i] = static_cast<T>(mode == 1 ? dbuf[i] * dbuf[i] : dbuf[i]);
      rl.c = c0 + s;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    RowList<T>& rl = wk.rows[r];
    const T* qr = Q + r * D;
    const T* gr = dO + r * D;
    T* dqr = dQ + r * D;
    std::fill(dqr, dqr + D, T(0));
    const size_t s = rl.c;
    if (s == 0) continue;
    if (wk.tmp.size() < 2 * s) wk.tmp.resize(2 * s);
    T* dp = wk.tmp.data();
    T* u = wk.tmp.data() + s;
    support_weights(rl.x.data(), s, mode, alpha, u, dbuf);
    double su = 0, sud = 0;
    for (size_t i = 0; i < s; ++i) {
      dp[i] = HV::dot(gr, V + static_cast<int64_t>(rl.j[i]) * D, D);
      su += u[i];
      sud += static_cast<double>(u[i]) * dp[i];
    }
    const T qbar = static_cast<T>(su > 0 ? sud / su : 0.0);
    for (size_t i = 0; i < s; ++i) {
      const int64_t jj = rl.j[i];
      const T ds = sc * u[i] * (dp[i] - qbar);
      HV::axpy(ds, K + jj * D, dqr, D);
      HV::axpy(ds, qr, dK + jj * D, D);
      HV::axpy(rl.x[i], gr, dV + jj * D, D);
    }
  }
}

template <typename T, int DS>
void backward_all(const AttnShape& g, const T* q, const T* k, const T* v, const T* dout, const T* out,
                  const double* stats, T* dq, T* dk, T* dv) {
  at::parallel_for(0, g.B * g.H, 1, [&](int64_t first, int64_t last) {
    const FlushSubnormals flush;
    BackwardWork<T> wk(g);
    for (int64_t t = first; t < last; ++t) {   // one (batch, head): its blocks share dk, dv
      const int64_t b = t / g.H, h = t % g.H, D = g.D;
      const double alpha = g.alpha[h];
      const T slope = g.slopes ? static_cast<T>(g.slopes[h]) : T(0);
      const T* K = k + t * g.Nk * D;
      const T* V = v + t * g.Nk * D;
      for (int64_t blk = 0; blk < g.blocks(); ++blk) {
        const int64_t r0 = blk * g.rows, R = std::min(g.Nq, r0 + g.rows) - r0, row = t * g.Nq + r0;
        if (alpha == 1.0)
          backward_softmax_block<T>(g, b, h, r0, R, q + row * D, K, V, dout + row * D, out + row * D, stats + row * 3,
                                    slope, dq + row * D, dk + t * g.Nk * D, dv + t * g.Nk * D, wk);
        else
          backward_entmax_block<T, DS>(g, b, h, r0, R, q + row * D, K, V, dout + row * D, stats + row * 3, alpha,
                                       slope, dq + row * D, dk + t * g.Nk * D, dv + t * g.Nk * D, wk);
      }
    }
  });
}

AttnShape attn_shape(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& alpha,
                     double scale, bool causal, const torch::Tensor& slopes, const torch::Tensor& key_lo,
                     const torch::Tensor& key_hi, const torch::Tensor& band_lo, const torch::Tensor& band_hi,
                     int64_t block_rows, int64_t key_tile) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.is_contiguous() && k.is_contiguous() &&
              v.is_contiguous(), "attention kernel: q, k, v must be contiguous (B, H, N, D) tensors");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "attention kernel: k and v must be (B, H, Nk, D) with q's B, H and D");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "attention kernel: q, k, v dtypes differ");
  TORCH_CHECK(q.size(2) <= k.size(2), "attention kernel: more queries than keys");
  TORCH_CHECK(k.size(2) < (int64_t{1} << 31) - 64, "attention kernel: at most 2^31 − 64 keys");
  const int64_t B = q.size(0), H = q.size(1);
  TORCH_CHECK(alpha.dim() == 1 && alpha.size(0) == H && alpha.scalar_type() == torch::kFloat64 && alpha.is_contiguous(),
              "attention kernel: alpha must be contiguous float64 of shape (H,)");
  TORCH_CHECK(slopes.numel() == 0 || (slopes.dim() == 1 && slopes.size(0) == H &&
              slopes.scalar_type() == torch::kFloat64 && slopes.is_contiguous()),
              "attention kernel: slopes must be empty or contiguous float64 of shape (H,)");
  for (const auto* t : {&key_lo, &key_hi})
    TORCH_CHECK(t->numel() == 0 || (t->dim() == 1 && t->size(0) == B && t->scalar_type() == torch::kInt64 &&
                t->is_contiguous()), "attention kernel: key ranges must be empty or contiguous int64 of shape (B,)");
  TORCH_CHECK(band_lo.numel() == band_hi.numel(), "attention kernel: band_lo and band_hi must both be given or empty");
  for (const auto* t : {&band_lo, &band_hi})
    TORCH_CHECK(t->numel() == 0 || (t->dim() == 3 && t->size(0) == B && t->size(1) == H && t->size(2) == q.size(2) &&
                t->scalar_type() == torch::kInt32 && t->is_contiguous()),
                "attention kernel: the band must be empty or contiguous int32 of shape (B, H, Nq)");
  TORCH_CHECK(block_rows >= 1 && key_tile >= 1, "attention kernel: block_rows and key_tile must be >= 1");
  AttnShape g;
  g.B = B; g.H = H; g.Nq = q.size(2); g.Nk = k.size(2); g.D = q.size(3); g.first_pos = g.Nk - g.Nq;
  g.causal = causal;
  g.key_lo = key_lo.numel() ? key_lo.data_ptr<int64_t>() : nullptr;
  g.key_hi = key_hi.numel() ? key_hi.data_ptr<int64_t>() : nullptr;
  g.alpha = alpha.data_ptr<double>();
  g.slopes = slopes.numel() ? slopes.data_ptr<double>() : nullptr;
  g.band_lo = band_lo.numel() ? band_lo.data_ptr<int32_t>() : nullptr;
  g.band_hi = band_hi.numel() ? band_hi.data_ptr<int32_t>() : nullptr;
  g.scale = scale;
  g.rows = std::min(block_rows, std::max<int64_t>(g.Nq, 1));
  g.tile = key_tile;
  return g;
}

// The head dimension as a compile-time constant where it is a common one.
template <typename F>
inline void with_head_dim(int64_t D, F&& f) {
  switch (D) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: f(std::integral_constant<int, 0>{});
  }
}

// q (already multiplied by its q-scales), k, v: contiguous (B, H, ·, D) of one floating dtype (k, v with H
// heads); alpha (H,) float64 (1: softmax); slopes (H,) float64 or empty; key_lo, key_hi (B,) int64 or empty;
// band_lo, band_hi (B, H, Nq) int32 or empty: each row's keys outside [band_lo, band_hi) are known to get p = 0
// and are skipped (the backward must get the forward's band).
// Returns (out (B, H, Nq, D), row statistics (B, H, Nq, 3) float64, code): code 1 when a logit was NaN or
// +inf (those blocks' rows are zeros; the caller raises).
std::tuple<torch::Tensor, torch::Tensor, int64_t> attention_forward(
    torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor alpha, double scale, bool causal,
    torch::Tensor slopes, torch::Tensor key_lo, torch::Tensor key_hi, torch::Tensor band_lo, torch::Tensor band_hi,
    int64_t block_rows, int64_t key_tile) {
  const AttnShape g =
      attn_shape(q, k, v, alpha, scale, causal, slopes, key_lo, key_hi, band_lo, band_hi, block_rows, key_tile);
  auto out = torch::empty_like(q);
  auto stats = torch::empty({g.B, g.H, g.Nq, 3}, q.options().dtype(torch::kFloat64));
  std::atomic<int> bad{0};
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention_forward", [&] {
    with_head_dim(g.D, [&](auto ds) {
      forward_all<scalar_t, decltype(ds)::value>(g, q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                                                 v.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                                 stats.data_ptr<double>(), bad);
    });
  });
  return {out, stats, static_cast<int64_t>(bad.load())};
}

// The gradients (of q as given, i.e. of the q-scaled q; of k; of v) from dout (B, H, Nq, D), the forward's
// output `out` (read for softmax heads only: empty when α > 1 on every head) and its row statistics; the
// other arguments as attention_forward's.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> attention_backward(
    torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor dout, torch::Tensor out, torch::Tensor stats,
    torch::Tensor alpha, double scale, bool causal, torch::Tensor slopes, torch::Tensor key_lo, torch::Tensor key_hi,
    torch::Tensor band_lo, torch::Tensor band_hi, int64_t block_rows, int64_t key_tile) {
  const AttnShape g =
      attn_shape(q, k, v, alpha, scale, causal, slopes, key_lo, key_hi, band_lo, band_hi, block_rows, key_tile);
  TORCH_CHECK(dout.sizes() == q.sizes() && dout.scalar_type() == q.scalar_type() && dout.is_contiguous(),
              "attention kernel: dout must be contiguous, of q's shape and dtype");
  TORCH_CHECK(stats.dim() == 4 && stats.size(0) == g.B && stats.size(1) == g.H && stats.size(2) == g.Nq &&
              stats.size(3) == 3 && stats.scalar_type() == torch::kFloat64 && stats.is_contiguous(),
              "attention kernel: stats must be the forward's (B, H, Nq, 3) float64 row statistics");
  const bool softmax_head = (alpha == 1.0).any().item<bool>();
  TORCH_CHECK(!softmax_head || (out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type() && out.is_contiguous()),
              "attention kernel: out (the forward's output) is needed for softmax heads");
  auto dq = torch::empty_like(q);
  auto dk = torch::zeros_like(k);
  auto dv = torch::zeros_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention_backward", [&] {
    with_head_dim(g.D, [&](auto ds) {
      backward_all<scalar_t, decltype(ds)::value>(g, q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                                                  v.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(),
                                                  softmax_head ? out.data_ptr<scalar_t>() : nullptr,
                                                  stats.data_ptr<double>(), dq.data_ptr<scalar_t>(),
                                                  dk.data_ptr<scalar_t>(), dv.data_ptr<scalar_t>());
    });
  });
  return {dq, dk, dv};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("entmax_forward", &entmax_forward, "α-entmax forward over rows of a contiguous 2-D tensor");
  m.def("entmax_backward", &entmax_backward, "α-entmax backward over rows");
  m.def("entmax_scores_forward", &entmax_scores_forward, "scale + ALiBi + causal mask + α-entmax, in place");
  m.def("entmax_scores_backward", &entmax_scores_backward, "α-entmax backward on attention scores, in place");
  m.def("attention_forward", &attention_forward, "flash-style α-entmax attention: output and row statistics");
  m.def("attention_backward", &attention_backward, "gradients of attention_forward (q, k, v)");
}
