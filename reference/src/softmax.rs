//! Softmax, log-softmax, logsumexp and the fused scale-mask-softmax, in f64.
//!
//! Conventions: rows are stabilised by subtracting the row maximum; a row whose every logit is
//! −∞ or masked (a *fully masked row*) gives all zeros and a logsumexp of −∞. A NaN logit makes
//! the whole row NaN. A +∞ logit (after scale and mask) takes all the weight: the row becomes 1
//! at the +∞ positions split evenly among them, 0 elsewhere, and the logsumexp is +∞.
//!
//! Overflow: a logit is an f32 quantity. The f64 logit `scale·x + mask` (or `scale·q·k + mask`
//! in attention) whose magnitude rounds past `f32::MAX` is taken as `±∞` ([`saturate_logit`]),
//! as the f32 kernels compute it, and then follows the rules above: `+∞` logits share the
//! weight, `−∞` ones get none. Every kernel path follows the same rule.

use crate::error::{expect_finite, Result};
use crate::mask::Mask;
use crate::shape::{MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};

/// A logit computed in f64, as an f32 logit: `±∞` when its magnitude rounds past `f32::MAX`
/// in f32 (so a score that overflows f32 takes the `±∞` rules of this module in every path),
/// the f64 value itself otherwise. NaN stays NaN.
pub fn saturate_logit(x: f64) -> f64 {
    if (x as f32).is_infinite() {
        f64::from(x as f32)
    } else {
        x
    }
}

/// Softmax of one row of f64 logits, where `None` marks a masked position. Returns the
/// probabilities (masked → 0) and the logsumexp `ln Σ exp(x_j)` over the visible positions.
///
/// `p_j = exp(x_j − m) / Σ_l exp(x_l − m)` with `m = max_j x_j`. Fully masked (or all −∞):
/// zeros and −∞. Any NaN: NaN everywhere and a NaN logsumexp. `+∞` positions share weight 1.
pub fn softmax_row(logits: &[Option<f64>]) -> (Vec<f64>, f64) {
    let n = logits.len();
    if logits.iter().any(|x| matches!(x, Some(v) if v.is_nan())) {
        return (vec![f64::NAN; n], f64::NAN);
    }
    let max = logits.iter().flatten().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return (vec![0.0; n], f64::NEG_INFINITY);
    }
    if max == f64::INFINITY {
        let count = logits.iter().filter(|x| **x == Some(f64::INFINITY)).count() as f64;
        let p = logits.iter().map(|x| if *x == Some(f64::INFINITY) { 1.0 / count } else { 0.0 });
        return (p.collect(), f64::INFINITY);
    }
    let e: Vec<f64> = logits.iter().map(|x| x.map_or(0.0, |v| (v - max).exp())).collect();
    let sum: f64 = e.iter().sum();
    (e.iter().map(|v| v / sum).collect(), max + sum.ln())
}

/// Softmax over each row of the matrix view `x`, written to `y` (same shape).
/// `y_ij = exp(x_ij − max_i) / Σ_j exp(x_ij − max_i)`, computed in f64.
pub fn softmax(x: MatRef<'_>, y: MatMut<'_>) -> Result<()> {
    scale_mask_softmax(
        TensorRef::new(x.data, Tensor4Layout::from_mat(x.layout)),
        1.0,
        &Mask::None,
        TensorMut::new(y.data, Tensor4Layout::from_mat(y.layout)),
        None,
    )
}

/// Log-softmax over each row: `y_ij = x_ij − logsumexp_i`; a fully masked row gives −∞.
pub fn log_softmax(x: MatRef<'_>, y: MatMut<'_>) -> Result<()> {
    y.layout.expect_shape("y", x.layout.rows, x.layout.cols)?;
    x.check("x")?;
    y.check("y")?;
    if y.layout.is_empty() {
        return Ok(());
    }
    for i in 0..x.layout.rows {
        let row = row_logits(&x, i);
        let lse = softmax_row(&row).1;
        for j in 0..x.layout.cols {
            y.data[y.layout.index(i, j)] = (f64::from(x.at(i, j)) - lse) as f32;
        }
    }
    Ok(())
}

/// `ln Σ_j exp(x_ij)` for each row of `x` (−∞ for an empty or all −∞ row).
pub fn logsumexp(x: MatRef<'_>) -> Result<Vec<f32>> {
    x.check("x")?;
    // An empty row's logsumexp is −∞; an `r × 0` view may have any `r`, so allocate fallibly.
    let mut out = crate::alloc::filled("x", x.layout.rows, f32::NEG_INFINITY)?;
    if x.layout.cols > 0 {
        for (i, l) in out.iter_mut().enumerate() {
            *l = softmax_row(&row_logits(&x, i)).1 as f32;
        }
    }
    Ok(out)
}

fn row_logits(x: &MatRef<'_>, i: usize) -> Vec<Option<f64>> {
    (0..x.layout.cols).map(|j| Some(f64::from(x.at(i, j)))).collect()
}

/// Fused `y = softmax(scale·x + mask)` over the last dimension of a `[batch, heads, rows, cols]`
/// view. Logits beyond the f32 range are `±∞` (see the module docs). The mask addresses `[batch, heads, rows, cols]` (see [`Mask`]); masked positions get
/// exactly 0 and a fully masked row is all zeros. When `lse` is given it receives the logsumexp
/// of each row of `scale·x + mask`, row-major over `[batch, heads, rows]` (−∞ for a fully masked
/// row). `scale` must be finite. `x` and `y` may not be the same slice here (the kernels offer
/// the in-place form).
pub fn scale_mask_softmax(
    x: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    y: TensorMut<'_>,
    mut lse: Option<&mut [f32]>,
) -> Result<()> {
    expect_finite("scale", scale)?;
    let [batch, heads, rows, cols] = x.layout.dims;
    x.check("x")?;
    y.layout.expect_dims("y", x.layout.dims)?;
    y.check("y")?;
    mask.check(batch, heads, rows, cols)?;
    // Saturating: a product past usize::MAX can match no slice length.
    let n_rows = batch.saturating_mul(heads).saturating_mul(rows);
    if let Some(l) = lse.as_deref() {
        crate::error::expect_dim("lse", "len", n_rows, l.len())?;
    }
    // Nothing to write. (With cols = 0 the dims of `y` are unbounded by its slice, so the loop
    // below must not run for nothing.)
    if y.layout.is_empty() && lse.as_deref().map_or(0, <[f32]>::len) == 0 {
        return Ok(());
    }
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..rows {
                let mut logits = crate::alloc::filled("x", cols, None)?;
                for (j, l) in logits.iter_mut().enumerate() {
                    *l = mask.term(b, h, i, j, rows, cols).map(|t| {
                        saturate_logit(
                            f64::from(scale) * f64::from(x.at(b, h, i, j)) + f64::from(t),
                        )
                    });
                }
                let (p, l) = softmax_row(&logits);
                for (j, v) in p.iter().enumerate() {
                    y.data[y.layout.index(b, h, i, j)] = *v as f32;
                }
                if let Some(out) = lse.as_deref_mut() {
                    out[(b * heads + h) * rows + i] = l as f32;
                }
            }
        }
    }
    Ok(())
}
