// Flash-style α-entmax attention on the CPU (the fused_cpu backend, called by attention/chunked.py), part of
// the fused CPU kernel module (longsparse/cpu_kernel/module.cpp); the row solver is the mapping's (mappings/csrc/).
// Work is split into blocks of query rows of one (batch, head); a block walks over its visible keys in tiles of
// `key_tile` columns, and only one tile of logits, S = scale·q kᵀ (block rows × key_tile, computed by BLAS),
// exists at a time: extra memory is O(block rows × key_tile) for the logits plus the candidates below, never
// O(Nq × Nk).
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

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../mappings/csrc/entmax_rows.h"

extern "C" {
// BLAS as exported by torch's own library (its MKL or OpenBLAS, the LP64 interface: 32-bit integers); weak
// symbols, so that a torch without them still loads this module and falls back to at::mm on the same buffers.
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
            const int*, const double*, const int*, const double*, double*, const int*) __attribute__((weak));
}

namespace {

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

}  // namespace

namespace longsparse {

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

}  // namespace longsparse
