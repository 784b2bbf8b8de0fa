//! Layer normalisation over the last dimension.

pub use attn_core::layers::{check_eps, LayerNormWeights};

use crate::error::{expect_dim, Result};
use crate::shape::{MatMut, MatRef};

/// Layer norm of each row of `x: [n, d]` into `y: [n, d]`:
/// `y_rj = (x_rj − μ_r) / √(σ²_r + eps) · γ_j + β_j` with `μ_r = Σ_j x_rj / d` and the biased
/// (population) variance `σ²_r = Σ_j (x_rj − μ_r)² / d`, as PyTorch's `LayerNorm`.
///
/// Mean, variance and the normalised value are computed in f64 (two passes, no cancellation)
/// and rounded once. `eps` must be finite and ≥ 0; with `eps = 0` a constant row gives
/// `0/0 = NaN`, as in PyTorch. `d = 0` or `n = 0` writes nothing.
///
/// Errors: non-finite or negative `eps`, `gamma`/`beta` length ≠ `d`, `y` ≠ `[n, d]`, views
/// overrunning their slices, an aliased `y`.
pub fn layer_norm(
    x: MatRef<'_>,
    norm: &LayerNormWeights<'_>,
    eps: f32,
    y: MatMut<'_>,
) -> Result<()> {
    check_eps(eps)?;
    let (n, d) = (x.layout.rows, x.layout.cols);
    expect_dim("gamma", "len", d, norm.gamma.len())?;
    expect_dim("beta", "len", d, norm.beta.len())?;
    y.layout.expect_shape("y", n, d)?;
    x.check("x")?;
    y.check("y")?;
    if d == 0 {
        return Ok(());
    }
    let df = d as f64;
    for r in 0..n {
        let mean = (0..d).map(|j| f64::from(x.at(r, j))).sum::<f64>() / df;
        let var = (0..d).map(|j| (f64::from(x.at(r, j)) - mean).powi(2)).sum::<f64>() / df;
        let inv = 1.0 / (var + f64::from(eps)).sqrt();
        for j in 0..d {
            let v = (f64::from(x.at(r, j)) - mean) * inv * f64::from(norm.gamma[j])
                + f64::from(norm.beta[j]);
            y.data[y.layout.index(r, j)] = v as f32;
        }
    }
    Ok(())
}
