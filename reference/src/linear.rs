//! The linear (fully connected) layer `y = x·W + b`.

use crate::error::{expect_dim, Result};
use crate::shape::{MatMut, MatRef};

/// `y = x·W (+ b)` for `x: [n, in]`, `W: [in, out]`, `b: [out]`, `y: [n, out]`.
///
/// `y_rj = Σ_p x_rp·W_pj + b_j`, accumulated in f64 (bias included) and rounded to f32 once.
/// The weight is stored `[in, out]` (the seed's `x @ w_key`); a PyTorch `nn.Linear` weight,
/// stored `[out, in]`, is the same operand seen through
/// `MatLayout::row_major(out, in).transposed()`, with no copy. `in = 0` gives `y = b` (or 0);
/// `n = 0` writes nothing.
///
/// Errors: `w` rows ≠ `x` cols, `y` ≠ `[n, out]`, `b` length ≠ `out`, a view overrunning its
/// slice, an aliased `y`.
pub fn linear(x: MatRef<'_>, w: MatRef<'_>, b: Option<&[f32]>, y: MatMut<'_>) -> Result<()> {
    let (n, din, dout) = (x.layout.rows, x.layout.cols, w.layout.cols);
    expect_dim("w", "rows", din, w.layout.rows)?;
    y.layout.expect_shape("y", n, dout)?;
    if let Some(b) = b {
        expect_dim("b", "len", dout, b.len())?;
    }
    x.check("x")?;
    w.check("w")?;
    y.check("y")?;
    if y.layout.is_empty() {
        return Ok(());
    }
    for r in 0..n {
        for j in 0..dout {
            let bias = b.map_or(0.0, |b| f64::from(b[j]));
            let acc: f64 = (0..din).map(|p| f64::from(x.at(r, p)) * f64::from(w.at(p, j))).sum();
            y.data[y.layout.index(r, j)] = (acc + bias) as f32;
        }
    }
    Ok(())
}
