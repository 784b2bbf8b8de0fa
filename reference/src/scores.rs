//! Attention scores before the softmax: dot product, scaled dot product and additive
//! (Bahdanau). Each writes the `nq × nk` score matrix of one head.

use crate::alloc;
use crate::error::{expect_dim, expect_finite, Result};
use crate::matmul::matmul;
use crate::shape::{MatMut, MatRef};

/// Dot-product scores `s_ij = q_i · k_j` for `q: [nq, d]`, `k: [nk, d]`, `s: [nq, nk]`.
///
/// Each score is accumulated in f64 and rounded once; `d = 0` gives zeros. Kᵀ is a transposed
/// view of `k`, not a copy.
///
/// Errors: `k` cols ≠ `q` cols, `s` ≠ `[nq, nk]`, views overrunning their slices.
pub fn dot_product_scores(q: MatRef<'_>, k: MatRef<'_>, s: MatMut<'_>) -> Result<()> {
    scaled_dot_product_scores(q, k, 1.0, s)
}

/// Scaled dot-product scores `s_ij = scale · (q_i · k_j)` for `q: [nq, d]`, `k: [nk, d]`,
/// `s: [nq, nk]`.
///
/// The usual scale is `1/√d` ([`default_scale`](crate::attention::default_scale)); any finite
/// value is accepted, including 1 (the seed's worked example) and 0. The product and the scaling
/// happen in f64 with one rounding.
///
/// Errors: non-finite `scale`, `k` cols ≠ `q` cols, `s` ≠ `[nq, nk]`, views overrunning their
/// slices.
pub fn scaled_dot_product_scores(
    q: MatRef<'_>,
    k: MatRef<'_>,
    scale: f32,
    s: MatMut<'_>,
) -> Result<()> {
    expect_finite("scale", scale)?;
    expect_dim("k", "cols", q.layout.cols, k.layout.cols)?;
    s.layout.expect_shape("s", q.layout.rows, k.layout.rows)?;
    q.check("q")?;
    k.check("k")?;
    s.check("s")?;
    // Every check `matmul` makes has passed under this function's argument names.
    let kt = MatRef::new(k.data, k.layout.transposed());
    matmul(scale, q, kt, 0.0, s)
}

/// The weights of additive (Bahdanau) scoring: `Wq: [dq, da]`, `Wk: [dk, da]`, `w: [da]`, with
/// `da` the hidden width.
#[derive(Clone, Copy, Debug)]
pub struct AdditiveWeights<'a> {
    /// Query projection `[dq, da]`.
    pub wq: MatRef<'a>,
    /// Key projection `[dk, da]`.
    pub wk: MatRef<'a>,
    /// Output vector `[da]`.
    pub w: &'a [f32],
}

/// Additive (Bahdanau) scores `s_ij = wᵀ tanh(q_i·Wq + k_j·Wk)` for `q: [nq, dq]`,
/// `k: [nk, dk]`, `s: [nq, nk]`; written with row vectors, i.e. `wᵀ tanh(Wqᵀ q_i + Wkᵀ k_j)` in
/// the column-vector notation of the design.
///
/// `dq` and `dk` may differ. The projections, the tanh and the final dot product are all
/// computed in f64 and each score is rounded once. `da = 0` gives zeros.
///
/// Errors: `wq` ≠ `[dq, da]`, `wk` ≠ `[dk, da]`, `w` length ≠ `da`, `s` ≠ `[nq, nk]`, views
/// overrunning their slices.
pub fn additive_scores(
    q: MatRef<'_>,
    k: MatRef<'_>,
    weights: &AdditiveWeights<'_>,
    s: MatMut<'_>,
) -> Result<()> {
    let (nq, dq, nk, dk) = (q.layout.rows, q.layout.cols, k.layout.rows, k.layout.cols);
    let da = weights.wq.layout.cols;
    weights.wq.layout.expect_shape("wq", dq, da)?;
    weights.wk.layout.expect_shape("wk", dk, da)?;
    expect_dim("w", "len", da, weights.w.len())?;
    s.layout.expect_shape("s", nq, nk)?;
    q.check("q")?;
    k.check("k")?;
    weights.wq.check("wq")?;
    weights.wk.check("wk")?;
    s.check("s")?;
    // Project once in f64: pq[i][a] = Σ_p q_ip Wq_pa, pk[j][a] = Σ_p k_jp Wk_pa.
    let project = |m: &MatRef<'_>, w: &MatRef<'_>, arg| -> Result<Vec<f64>> {
        let (rows, inner) = (m.layout.rows, m.layout.cols);
        let mut out = alloc::filled(arg, alloc::product(arg, &[rows, da])?, 0.0f64)?;
        for r in 0..rows {
            for a in 0..da {
                out[r * da + a] =
                    (0..inner).map(|p| f64::from(m.at(r, p)) * f64::from(w.at(p, a))).sum();
            }
        }
        Ok(out)
    };
    let pq = project(&q, &weights.wq, "q")?;
    let pk = project(&k, &weights.wk, "k")?;
    for i in 0..nq {
        for j in 0..nk {
            let acc: f64 = (0..da)
                .map(|a| f64::from(weights.w[a]) * (pq[i * da + a] + pk[j * da + a]).tanh())
                .sum();
            s.data[s.layout.index(i, j)] = acc as f32;
        }
    }
    Ok(())
}
