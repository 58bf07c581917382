// The passes over one row of α-entmax: max and NaN / +inf detection, candidate collection and pruning, the
// forward of a row (forward_row) and its backward (backward_row); the fused attention kernel walks its tiles
// with the same passes. Part of the fused CPU kernel (entmax_cpu.cpp describes the algorithm); internal
// linkage, as tau_solve.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "tau_solve.h"

namespace {

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

}  // namespace
