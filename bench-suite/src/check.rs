//! Correctness checks: deterministic test data, and the error bounds each implementation is
//! held to against `attn-reference` (which accumulates in f64 and rounds once).
//!
//! Bounds come from first-order error analysis with unit roundoff u = 2⁻²⁴, never from a fixed
//! tolerance; each function below derives its own. A check passes when every element is within
//! its bound; the record keeps the largest error and the largest error/bound ratio.

use attn_reference::{
    LayerNormWeights, Mask, MatLayout, MatMut, MatRef, Result, Tensor4Layout, TensorMut, TensorRef,
};

pub use attn_tests::numerics::{GAMMA, U};
/// The kernels' exp error in units of u (their published ULP bounds, from the numerics kit).
pub const EXP_ULPS: f64 = attn_tests::numerics::EXP_REL / U;
/// Absolute slack for results that underflow f32 (a probability below the smallest normal may
/// flush to zero or keep a few subnormal bits).
pub const TINY: f64 = 2.0 * f32::MIN_POSITIVE as f64;

/// A small deterministic generator (SplitMix64) of test data: values uniform in [−1, 1).
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub const fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `n` values uniform in [−1, 1).
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| (self.next_u64() >> 40) as f32 / (1u32 << 23) as f32 - 1.0).collect()
    }
}

/// The outcome of an element-wise comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// Largest |got − want|.
    pub max_err: f64,
    /// The bound at the element with the largest error/bound ratio.
    pub bound: f64,
    /// Largest error/bound (∞ for a NaN or an error where the bound is 0).
    pub ratio: f64,
}

/// Compares `got` with `want` element by element against `bound`.
pub fn compare(got: &[f32], want: &[f32], bound: &[f64]) -> Verdict {
    let mut v = Verdict { max_err: 0.0, bound: 0.0, ratio: 0.0 };
    if got.len() != want.len() || want.len() != bound.len() {
        return Verdict { max_err: f64::INFINITY, bound: 0.0, ratio: f64::INFINITY };
    }
    for ((&g, &w), &b) in got.iter().zip(want).zip(bound) {
        // Equal values (including equal infinities, whose difference would be NaN) and NaN
        // where the reference has NaN are exact.
        let err = if g == w || (g.is_nan() && w.is_nan()) {
            0.0
        } else {
            (f64::from(g) - f64::from(w)).abs()
        };
        let ratio = if err == 0.0 {
            0.0
        } else if b > 0.0 && err.is_finite() {
            err / b
        } else {
            f64::INFINITY
        };
        v.max_err = if err.is_nan() { f64::INFINITY } else { v.max_err.max(err) };
        if ratio > v.ratio || (ratio.is_nan() && !v.ratio.is_nan()) {
            v.ratio = if ratio.is_nan() { f64::INFINITY } else { ratio };
            v.bound = b;
        }
    }
    v
}

/// Σ_p a(i, p)·|b_pj| for every (i, j), row-major `m × n`, in f64, for a non-negative `m × k`
/// matrix given element-wise by `a` (magnitudes of an operand, or error bounds).
fn abs_products(m: usize, a: impl Fn(usize, usize) -> f64, b: &MatRef<'_>) -> Vec<f64> {
    let (k, n) = (b.layout.rows, b.layout.cols);
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a(i, p) * f64::from(b.at(p, j).abs())).sum();
        }
    }
    out
}

/// Bound for `C = A·B` (α = 1, β = 0), row-major `m × n`: the dot product of length k is off by
/// at most γ·k·u·Σ|a||b|, and the reference's own rounding to f32 adds u·|c| ≤ u·Σ|a||b|.
pub fn gemm_bound(a: &MatRef<'_>, b: &MatRef<'_>) -> Vec<f64> {
    let k = a.layout.cols as f64;
    abs_products(a.layout.rows, |i, p| f64::from(a.at(i, p).abs()), b)
        .into_iter()
        .map(|s| (GAMMA * k + 1.0) * U * s)
        .collect()
}

/// Bound for `y = softmax(scale·x + mask)` (mask: none or causal, so its terms are 0), given the
/// reference probabilities `p` (row-major, `rows × cols` per head, heads in order).
///
/// Per element: the argument `scale·x_j − max` carries an absolute error of at most
/// 3u·(|scale·x_j| + |max|) (scaling, subtraction, and an FMA-or-not difference), which becomes
/// a relative error of the exponential, to which `exp` adds [`EXP_ULPS`]·u: call the row's
/// worst η. The row sum then has relative error ≤ η + (cols − 1)·u·γ, the division one more u,
/// and the reference's rounding one more: |p̂ − p| ≤ p·(2η + (γ·cols + 2)·u) + [`TINY`].
pub fn softmax_bound(x: &TensorRef<'_>, scale: f32, p: &[f32]) -> Vec<f64> {
    let [batch, heads, rows, cols] = x.layout.dims;
    let mut out = Vec::with_capacity(p.len());
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..rows {
                let mag = (0..cols)
                    .map(|j| (f64::from(scale) * f64::from(x.at(b, h, i, j))).abs())
                    .fold(0.0, f64::max);
                let eta = EXP_ULPS * U + 3.0 * U * 2.0 * mag;
                let rel = 2.0 * eta + (GAMMA * cols as f64 + 2.0) * U;
                let base = ((b * heads + h) * rows + i) * cols;
                out.extend(p[base..base + cols].iter().map(|&pj| f64::from(pj) * rel + TINY));
            }
        }
    }
    out
}

/// Bound for attention `O = softmax(scale·QKᵀ + mask)·V` (mask none or causal), given
/// `w[b,h,i,d] = Σ_j p_ij·|v_jd|` (the reference attention of |V|, in a dense layout: the
/// bounds come back in the same layout).
///
/// Per query row i: each score `scale·q_i·k_j` is off by at most (γ·dk + 1)·u·scale·Σ|q||k|
/// (a dot product, then the scale); with the max subtraction and `exp` that gives a relative
/// error η_i ≤ [`EXP_ULPS`]·u + (γ·dk + 4)·u·M_i of each weight, M_i = max_j scale·Σ|q_i||k_j|.
/// The normaliser adds η_i + γ·nk·u; an online (flash) softmax rescales its running sums once
/// per key block, each rescale an `exp` and a multiply, so at most nk·([`EXP_ULPS`] + 2)·u more;
/// the weighted sum of V is a dot product of length nk: γ·nk·u·Σ p|v|. Hence
/// |ô − o| ≤ w·(2η_i + (2γ + EXP_ULPS + 2)·nk·u + 4u) + [`TINY`].
pub fn attention_bound(
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    scale: f32,
    w: &TensorRef<'_>,
) -> Vec<f64> {
    let [batch, hq, nq, dk] = q.layout.dims;
    let [_, hkv, nk, _] = k.layout.dims;
    let dv = w.layout.dim();
    let group = (hq / hkv.max(1)).max(1);
    let mut out = vec![0.0; w.layout.len()];
    for b in 0..batch {
        for h in 0..hq {
            let kh = h / group;
            for i in 0..nq {
                let m_i = (0..nk)
                    .map(|j| {
                        (0..dk)
                            .map(|d| {
                                f64::from(q.at(b, h, i, d).abs())
                                    * f64::from(k.at(b, kh, j, d).abs())
                            })
                            .sum::<f64>()
                            * f64::from(scale.abs())
                    })
                    .fold(0.0, f64::max);
                let eta = EXP_ULPS * U + (GAMMA * dk as f64 + 4.0) * U * m_i;
                let rel = 2.0 * eta + (2.0 * GAMMA + EXP_ULPS + 2.0) * nk as f64 * U + 4.0 * U;
                for d in 0..dv {
                    out[w.layout.index(b, h, i, d)] = f64::from(w.at(b, h, i, d)) * rel + TINY;
                }
            }
        }
    }
    out
}

/// A reference activation `[rows, cols]` (row-major) with, per element, a bound on how far an
/// f32 implementation of the same stages may be from it: the layers' bound. It is built stage
/// by stage (projection, attention, residual, layer norm): a stage carries its inputs' bounds
/// through its exact derivative (first order) and adds its own rounding error; the reference
/// rounds every stage's output to f32 as an f32 engine does, so each stage adds `u·|value|` for
/// that rounding too.
#[derive(Clone, Debug)]
pub struct Staged {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// The reference's values.
    pub val: Vec<f32>,
    /// The bound on |implementation − reference|, per element.
    pub err: Vec<f64>,
}

impl Staged {
    /// An input, the same in both (error 0).
    pub fn exact(val: Vec<f32>, rows: usize, cols: usize) -> Staged {
        Staged { rows, cols, err: vec![0.0; val.len()], val }
    }

    fn mat(&self) -> MatRef<'_> {
        mat(&self.val, self.rows, self.cols, false)
    }

    /// `y = x·W + b` by the reference. Each element of an f32 GEMM with the bias folded in is a
    /// sum of k + 1 terms, off by γ·(k + 1)·u·(Σ_p|x_p||w_pj| + |b_j|); the input's bound is
    /// carried through as Σ_p Δx_p·|w_pj|.
    pub fn linear(&self, w: MatRef<'_>, b: Option<&[f32]>) -> Result<Staged> {
        let (n, k, m) = (self.rows, self.cols, w.layout.cols);
        let mut val = vec![0.0; n * m];
        attn_reference::linear(self.mat(), w, b, mat_mut(&mut val, n, m))?;
        let mag = abs_products(n, |r, p| f64::from(self.val[r * k + p].abs()), &w);
        let prop = abs_products(n, |r, p| self.err[r * k + p], &w);
        let own = GAMMA * (k + 1) as f64 * U;
        let err = (0..n * m)
            .map(|e| {
                let bias = b.map_or(0.0, |b| f64::from(b[e % m].abs()));
                prop[e] + own * (mag[e] + bias) + U * f64::from(val[e].abs())
            })
            .collect();
        Ok(Staged { rows: n, cols: m, val, err })
    }

    /// `self + other` element-wise: the bounds add, and the implementation's and the
    /// reference's roundings of the sum add u·|sum| each.
    pub fn add(&self, other: &Staged) -> Staged {
        let val: Vec<f32> = self.val.iter().zip(&other.val).map(|(a, b)| a + b).collect();
        let err = (0..val.len())
            .map(|e| self.err[e] + other.err[e] + 2.0 * U * f64::from(val[e].abs()))
            .collect();
        Staged { rows: self.rows, cols: self.cols, val, err }
    }

    /// ReLU: exact in both and 1-Lipschitz, so the bound carries over unchanged.
    pub fn relu(mut self) -> Staged {
        self.val.iter_mut().for_each(|v| *v = if *v < 0.0 { 0.0 } else { *v });
        self
    }

    /// Layer norm of each row, `y_j = γ_j·c_j·s + β_j` with `c = x − μ`, `s = 1/√(σ² + eps)`,
    /// by the reference. Bound:
    ///
    /// - carried: the Jacobian `∂y_j/∂x_l = γ_j·s·(δ_jl − 1/d − c_j·c_l·s²/d)` applied to the
    ///   input bounds: `|γ_j|·s·(Δx_j + mean Δx + |c_j|·s²·Σ_l|c_l|·Δx_l/d)`;
    /// - own, for any two-pass f32 implementation (sums in any order): μ off by
    ///   e_μ = (γ·d + 1)·u·mean|x|, each `c_j` by e_μ + u·|c_j|; e_μ moves σ² only at second
    ///   order (Σ c_l = 0), so σ² is off by (γ·d + 4)·u·σ² (centring, squares, sum, division), and
    ///   s relatively by r_s = ½·((γ·d + 4)·u·σ² / (σ² + eps) + u) + 2u (the eps addition, then
    ///   √ and the division); the last three operations add 2u·|γ_j c_j s| + u·|y_j|. Hence
    ///   `|γ_j|·s·(e_μ + u·|c_j|) + |γ_j c_j|·s·(r_s + 2u) + u·|y_j|`, times γ for the
    ///   second-order terms.
    pub fn layer_norm(&self, norm: &LayerNormWeights<'_>, eps: f32) -> Result<Staged> {
        let (n, d) = (self.rows, self.cols);
        let mut val = vec![0.0; n * d];
        attn_reference::layer_norm(self.mat(), norm, eps, mat_mut(&mut val, n, d))?;
        let mut err = Vec::with_capacity(n * d);
        let df = d as f64;
        for r in 0..n {
            let x: Vec<f64> = self.val[r * d..][..d].iter().map(|&v| f64::from(v)).collect();
            let dx = &self.err[r * d..][..d];
            let mu = x.iter().sum::<f64>() / df;
            let c: Vec<f64> = x.iter().map(|v| v - mu).collect();
            let var = c.iter().map(|c| c * c).sum::<f64>() / df;
            let s = 1.0 / (var + f64::from(eps)).sqrt();
            let e_mu = (GAMMA * df + 1.0) * U * x.iter().map(|v| v.abs()).sum::<f64>() / df;
            let r_s = 0.5 * ((GAMMA * df + 4.0) * U * var / (var + f64::from(eps)) + U) + 2.0 * U;
            let mean_dx = dx.iter().sum::<f64>() / df;
            let c_dx = c.iter().zip(dx).map(|(c, e)| c.abs() * e).sum::<f64>() / df;
            for j in 0..d {
                let (g, y) = (f64::from(norm.gamma[j].abs()), f64::from(val[r * d + j].abs()));
                let carried = g * s * (dx[j] + mean_dx + c[j].abs() * s * s * c_dx);
                let own =
                    g * s * (e_mu + U * c[j].abs()) + g * c[j].abs() * s * (r_s + 2.0 * U) + U * y;
                err.push(carried + GAMMA * own + U * y);
            }
        }
        Ok(Staged { rows: n, cols: d, val, err })
    }
}

/// Multi-head attention (mask none or causal) of staged `q: [batch·nq, heads·dk]`,
/// `k: [batch·nk, kv_heads·dk]`, `v: [batch·nk, kv_heads·dv]` (heads side by side in each row,
/// the layers' layout) by the reference, output `[batch·nq, heads·dv]`. Bound per element, with
/// `w_i = Σ_j p_ij·|v_j|`:
///
/// - own: [`attention_bound`] (the kernel's error on exact inputs);
/// - carried from Q and K: each visible score moves by at most
///   Δs_ij = |scale|·Σ_d (Δq_id·|k_jd| + |q_id|·Δk_jd), so each weight by a factor within
///   e^{±2·max_j Δs_ij}, and the output by at most (e^{2·max_j Δs_ij} − 1)·w_i;
/// - carried from V: Σ_j p_ij·Δv_j, the reference attention of the bounds (rounded to f32 on
///   the way in and out, hence the factor 1 + 4u).
#[allow(clippy::too_many_arguments)]
pub fn attention_staged(
    q: &Staged,
    k: &Staged,
    v: &Staged,
    batch: usize,
    heads: usize,
    kv_heads: usize,
    scale: f32,
    mask: &Mask<'_>,
) -> Result<Staged> {
    let (nq, nk) = (q.rows / batch.max(1), k.rows / batch.max(1));
    let (dk, dv) = (q.cols / heads.max(1), v.cols / kv_heads.max(1));
    let group = (heads / kv_heads.max(1)).max(1);
    let lq = Tensor4Layout::bshd(batch, nq, heads, dk);
    let lk = Tensor4Layout::bshd(batch, nk, kv_heads, dk);
    let lv = Tensor4Layout::bshd(batch, nk, kv_heads, dv);
    let lo = Tensor4Layout::bshd(batch, nq, heads, dv);
    let (qt, kt) = (TensorRef::new(&q.val, lq), TensorRef::new(&k.val, lk));
    // The reference attention of `vals` in place of V.
    let attend = |vals: &[f32]| -> Result<Vec<f32>> {
        let mut o = vec![0.0; lo.len()];
        let (vt, ot) = (TensorRef::new(vals, lv), TensorMut::new(&mut o, lo));
        attn_reference::attention::attention(qt, kt, vt, scale, mask, ot, None)?;
        Ok(o)
    };
    let val = attend(&v.val)?;
    let w = attend(&v.val.iter().map(|x| x.abs()).collect::<Vec<_>>())?;
    let carried_v = attend(&v.err.iter().map(|&e| e as f32).collect::<Vec<_>>())?;
    let own = attention_bound(&qt, &kt, scale, &TensorRef::new(&w, lo));
    let mut err = vec![0.0; lo.len()];
    let sc = f64::from(scale.abs());
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..nq {
                let mut ds_max: f64 = 0.0;
                for j in (0..nk).filter(|&j| mask.term(b, h, i, j, nq, nk).is_some()) {
                    let ds: f64 = (0..dk)
                        .map(|d| {
                            let (qi, kj) = (lq.index(b, h, i, d), lk.index(b, h / group, j, d));
                            q.err[qi] * f64::from(k.val[kj].abs())
                                + f64::from(q.val[qi].abs()) * k.err[kj]
                        })
                        .sum();
                    ds_max = ds_max.max(sc * ds);
                }
                let amp = (2.0 * ds_max).exp_m1();
                for d in 0..dv {
                    let e = lo.index(b, h, i, d);
                    err[e] =
                        own[e] + amp * f64::from(w[e]) + (1.0 + 4.0 * U) * f64::from(carried_v[e]);
                }
            }
        }
    }
    Ok(Staged { rows: q.rows, cols: heads * dv, val, err })
}

/// A row-major `rows × cols` matrix view of `data`, or of `data` read transposed when `t`
/// (then `data` holds `cols × rows` row-major).
pub fn mat(data: &[f32], rows: usize, cols: usize, t: bool) -> MatRef<'_> {
    let layout = if t {
        MatLayout::row_major(cols, rows).transposed()
    } else {
        MatLayout::row_major(rows, cols)
    };
    MatRef::new(data, layout)
}

/// A row-major `rows × cols` output view.
pub fn mat_mut(data: &mut [f32], rows: usize, cols: usize) -> MatMut<'_> {
    MatMut::row_major(data, rows, cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_flags_nan_and_zero_bound() {
        let v = compare(&[1.0, f32::NAN], &[1.0, 2.0], &[0.0, 1.0]);
        assert_eq!(v.ratio, f64::INFINITY);
        let v = compare(&[1.0, 2.5], &[1.0, 2.0], &[0.0, 1.0]);
        assert_eq!((v.max_err, v.ratio, v.bound), (0.5, 0.5, 1.0));
        let v = compare(&[1.0], &[1.5], &[0.0]);
        assert_eq!(v.ratio, f64::INFINITY);
        let v = compare(&[f32::INFINITY], &[f32::INFINITY], &[0.0]);
        assert_eq!(v.ratio, 0.0);
    }

    #[test]
    fn rng_is_in_range_and_deterministic() {
        let a = Rng::new(7).vec(1000);
        assert_eq!(a, Rng::new(7).vec(1000));
        assert!(a.iter().all(|&x| (-1.0..1.0).contains(&x)));
        assert!(a.iter().any(|&x| x < -0.9) && a.iter().any(|&x| x > 0.9));
    }

    #[test]
    fn gemm_bound_catches_a_one_ulp_per_term_bias_only_beyond_it() {
        // Exact small-integer products: the reference and an exact f32 product agree bit for
        // bit, and the bound is positive.
        let a: Vec<f32> = (0..12).map(|i| (i % 5) as f32 - 2.0).collect();
        let b: Vec<f32> = (0..20).map(|i| (i % 3) as f32 - 1.0).collect();
        let (am, bm) = (mat(&a, 3, 4, false), mat(&b, 4, 5, false));
        let bound = gemm_bound(&am, &bm);
        let want = attn_reference::matmul::matmul_rm(&a, &b, 3, 4, 5).unwrap();
        assert_eq!(compare(&want, &want, &bound).ratio, 0.0);
        let mut off = want.clone();
        off[7] += 0.5;
        assert!(compare(&off, &want, &bound).ratio > 1.0);
    }
}
