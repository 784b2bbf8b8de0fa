//! Matrix product on strided views, accumulated in f64.

use crate::error::{expect_dim, expect_finite, Result};
use crate::shape::MatLayout;

/// `C ← α·A·B + β·C` for `A: m×k`, `B: k×n`, `C: m×n`, each a strided view of its slice.
///
/// Each `c_ij = α·Σ_p a_ip·b_pj + β·c_ij` is accumulated in f64 and rounded to f32 once.
/// `β = 0` means C is not read (a NaN in C does not reach the result); `k = 0` gives `β·C`.
/// α and β must be finite.
///
/// Errors: inner or outer dimensions that disagree (`b` rows ≠ `a` cols, `c` ≠ `m×n`), a view
/// that overruns its slice, an output view with aliased elements, non-finite α or β.
pub fn matmul(
    alpha: f32,
    a: &[f32],
    a_layout: MatLayout,
    b: &[f32],
    b_layout: MatLayout,
    beta: f32,
    c: &mut [f32],
    c_layout: MatLayout,
) -> Result<()> {
    expect_finite("alpha", alpha)?;
    expect_finite("beta", beta)?;
    let (m, k, n) = (a_layout.rows, a_layout.cols, b_layout.cols);
    expect_dim("b", "rows", k, b_layout.rows)?;
    c_layout.expect_shape("c", m, n)?;
    a_layout.check("a", a.len())?;
    b_layout.check("b", b.len())?;
    c_layout.check_output("c", c.len())?;
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f64;
            for p in 0..k {
                acc += f64::from(a[a_layout.index(i, p)]) * f64::from(b[b_layout.index(p, j)]);
            }
            let ci = c_layout.index(i, j);
            let prev = if beta == 0.0 { 0.0 } else { f64::from(beta) * f64::from(c[ci]) };
            c[ci] = (f64::from(alpha) * acc + prev) as f32;
        }
    }
    Ok(())
}

/// Row-major convenience: returns `A·B` for row-major `a: m×k` and `b: k×n`.
pub fn matmul_rm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Result<Vec<f32>> {
    let mut c = vec![0.0; m * n];
    matmul(
        1.0,
        a,
        MatLayout::row_major(m, k),
        b,
        MatLayout::row_major(k, n),
        0.0,
        &mut c,
        MatLayout::row_major(m, n),
    )?;
    Ok(c)
}
