//! Layer norm over the last dimension, in f32.

use attn_core::check_eps;
use attn_core::error::expect_dim;
use attn_core::{LayerNormWeights, MatMut, MatRef, Result};

use crate::arch::convert::Convertible;

/// Independent partial sums per row: breaks the add dependency chain so the sums vectorise,
/// and (as a pairwise-ish split) shortens the rounding-error chain from `d` to `d/LANES + LANES`.
const LANES: usize = 16;

/// Layer norm of each row of `x: [n, d]` into `y: [n, d]`:
/// `y_rj = (x_rj − μ_r) / √(σ²_r + eps) · γ_j + β_j`, `μ_r = Σ_j x_rj / d`, biased variance
/// `σ²_r = Σ_j (x_rj − μ_r)² / d` (PyTorch's `LayerNorm`, `attn_reference::layer_norm`).
///
/// Two passes in f32 (mean, then the centred sum of squares, so there is no `E[x²] − μ²`
/// cancellation), each summed over 16 partial sums. `eps = 0` and a constant row give
/// `0/0 = NaN`, as the reference and PyTorch. `d = 0` or `n = 0` writes nothing. Rows are
/// independent: `x` and `y` may be any strided views. Allocates nothing; runs on the calling
/// thread (it is one read and one write of `n·d` elements, a small share of any layer).
///
/// `x`, the weights and `y` may each be f32, bf16 or f16: inputs are widened exactly, the
/// arithmetic is f32, and each output is rounded once to `y`'s type (to nearest even).
///
/// Errors: those of the reference's `layer_norm`, in the same order.
pub fn layer_norm<X: Convertible, W: Convertible, Y: Convertible>(
    x: MatRef<'_, X>,
    norm: &LayerNormWeights<'_, W>,
    eps: f32,
    y: MatMut<'_, Y>,
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
    let (xl, yl) = (x.layout, y.layout);
    for r in 0..n {
        if xl.col_stride == 1 && yl.col_stride == 1 {
            let xs = &x.data[xl.index(r, 0)..][..d];
            let ys = &mut y.data[yl.index(r, 0)..][..d];
            let (mean, inv) = row_stats(d, |j| xs[j].widen(), eps);
            for (j, out) in ys.iter_mut().enumerate() {
                *out = Y::from_f32(normalized(xs[j].widen(), mean, inv, norm, j));
            }
        } else {
            let get = |j| x.data[xl.index(r, j)].widen();
            let (mean, inv) = row_stats(d, get, eps);
            for j in 0..d {
                y.data[yl.index(r, j)] = Y::from_f32(normalized(get(j), mean, inv, norm, j));
            }
        }
    }
    Ok(())
}

/// `(x − μ)·inv·γ_j + β_j` in f32.
#[inline(always)]
fn normalized<W: Convertible>(
    x: f32,
    mean: f32,
    inv: f32,
    norm: &LayerNormWeights<'_, W>,
    j: usize,
) -> f32 {
    (x - mean) * inv * norm.gamma[j].widen() + norm.beta[j].widen()
}

/// Mean and `1/√(σ² + eps)` of a row of `d ≥ 1` elements read through `get`.
#[inline(always)]
fn row_stats(d: usize, get: impl Fn(usize) -> f32, eps: f32) -> (f32, f32) {
    let mean = lane_sum(d, &get) / d as f32;
    let var = lane_sum(d, |j| {
        let c = get(j) - mean;
        c * c
    }) / d as f32;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `Σ_j f(j)` for `j < d` over [`LANES`] partial sums.
#[inline(always)]
fn lane_sum(d: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let full = d - d % LANES;
    for base in (0..full).step_by(LANES) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a += f(base + l);
        }
    }
    for (l, j) in (full..d).enumerate() {
        acc[l] += f(j);
    }
    acc.iter().sum()
}
