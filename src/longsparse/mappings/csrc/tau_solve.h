// The threshold τ of α-entmax on one row's candidates, in double: the closed forms (α = 1.5, 2), the
// bracketed Newton / Halley solve (other α) with vectorised powers, and a first lower bound of τ (group_bound).
// Part of the fused CPU kernel (entmax_cpu.cpp describes the algorithm). Everything here has internal linkage:
// each translation unit that includes it gets its own copy, inlined and specialised as in a single file.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <xmmintrin.h>
#endif

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


}  // namespace
