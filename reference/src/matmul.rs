//! Matrix product on strided views, accumulated in f64.

use crate::error::{expect_dim, expect_finite, Result};
use crate::shape::{MatLayout, MatMut, MatRef};

/// `C ← α·A·B + β·C` for `A: m×k`, `B: k×n`, `C: m×n`, each a strided view of its slice.
///
/// Each `c_ij = α·Σ_p a_ip·b_pj + β·c_ij` is accumulated in f64 and rounded to f32 once.
/// `β = 0` means C is not read (a NaN in C does not reach the result); `k = 0` gives `β·C`.
/// α and β must be finite.
///
/// Errors: inner or outer dimensions that disagree (`b` rows ≠ `a` cols, `c` ≠ `m×n`), a view
/// that overruns its slice, an output view with aliased elements, non-finite α or β.
pub fn matmul(alpha: f32, a: MatRef<'_>, b: MatRef<'_>, beta: f32, c: MatMut<'_>) -> Result<()> {
    expect_finite("alpha", alpha)?;
    expect_finite("beta", beta)?;
    let (m, k, n) = (a.layout.rows, a.layout.cols, b.layout.cols);
    expect_dim("b", "rows", k, b.layout.rows)?;
    c.layout.expect_shape("c", m, n)?;
    a.check("a")?;
    b.check("b")?;
    c.check("c")?;
    if c.layout.is_empty() {
        return Ok(());
    }
    for i in 0..m {
        for j in 0..n {
            let acc: f64 = (0..k).map(|p| f64::from(a.at(i, p)) * f64::from(b.at(p, j))).sum();
            let ci = c.layout.index(i, j);
            let prev = if beta == 0.0 { 0.0 } else { f64::from(beta) * f64::from(c.data[ci]) };
            c.data[ci] = (f64::from(alpha) * acc + prev) as f32;
        }
    }
    Ok(())
}

/// Row-major convenience: returns `A·B` for row-major `a: m×k` and `b: k×n`.
pub fn matmul_rm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Result<Vec<f32>> {
    let mut c = vec![0.0; m * n];
    matmul(
        1.0,
        MatRef::row_major(a, m, k),
        MatRef::row_major(b, k, n),
        0.0,
        MatMut::new(&mut c, MatLayout::row_major(m, n)),
    )?;
    Ok(c)
}
