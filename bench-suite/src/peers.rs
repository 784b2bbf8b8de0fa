//! Safe wrappers around the peer libraries' raw-pointer SGEMM entry points, taking the same
//! checked views as `attn_kernels::gemm::sgemm`, so that every implementation in the report is
//! called the same way. The only `unsafe` of the report outside the FMA probe lives here.

use attn_reference::error::{expect_dim, expect_finite};
use attn_reference::{MatMut, MatRef, Result};

/// Checks `C ← α·A·B + β·C` operands the way the reference does and returns `(m, n, k)`.
/// After it succeeds, every index a strided walk of the three views makes is inside its slice,
/// and each stride fits `isize` (a slice never holds more than `isize::MAX` bytes).
fn check(
    alpha: f32,
    a: &MatRef<'_>,
    b: &MatRef<'_>,
    beta: f32,
    c: &MatMut<'_>,
) -> Result<(usize, usize, usize)> {
    expect_finite("alpha", alpha)?;
    expect_finite("beta", beta)?;
    let (m, k, n) = (a.layout.rows, a.layout.cols, b.layout.cols);
    expect_dim("b", "rows", k, b.layout.rows)?;
    c.layout.expect_shape("c", m, n)?;
    a.check("a")?;
    b.check("b")?;
    c.check("c")?;
    Ok((m, n, k))
}

/// `C ← α·A·B + β·C` by `matrixmultiply::sgemm` (single-threaded: its `threading` feature is
/// off, as it is for every user who does not opt in).
pub fn matrixmultiply(
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: MatMut<'_>,
) -> Result<()> {
    let (m, n, k) = check(alpha, &a, &b, beta, &c)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (la, lb, lc) = (a.layout, b.layout, c.layout);
    // SAFETY: `check` proved every element of the three views lies inside its slice (so the
    // offsets are in bounds and the strides fit isize), that C has no aliased elements, and C is
    // borrowed mutably, so it overlaps neither A nor B. With k = 0, A and B are not read.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr().wrapping_add(la.offset),
            la.row_stride as isize,
            la.col_stride as isize,
            b.data.as_ptr().wrapping_add(lb.offset),
            lb.row_stride as isize,
            lb.col_stride as isize,
            beta,
            c.data.as_mut_ptr().wrapping_add(lc.offset),
            lc.row_stride as isize,
            lc.col_stride as isize,
        );
    }
    Ok(())
}

/// `C ← α·A·B + β·C` by the `gemm` crate (with its `x86-v4` AVX-512 kernels), on `threads`
/// threads of the current rayon pool (sequential for 1).
pub fn gemm(
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: MatMut<'_>,
    threads: usize,
) -> Result<()> {
    let (m, n, k) = check(alpha, &a, &b, beta, &c)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (la, lb, lc) = (a.layout, b.layout, c.layout);
    let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    // SAFETY: as in `matrixmultiply` above. The crate's convention is dst ← α·dst + β·lhs·rhs,
    // so our β is its α and our α its β; `read_dst = false` when β = 0 so C is not read.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.data.as_mut_ptr().wrapping_add(lc.offset),
            lc.col_stride as isize,
            lc.row_stride as isize,
            beta != 0.0,
            a.data.as_ptr().wrapping_add(la.offset),
            la.col_stride as isize,
            la.row_stride as isize,
            b.data.as_ptr().wrapping_add(lb.offset),
            lb.col_stride as isize,
            lb.row_stride as isize,
            beta,
            alpha,
            false,
            false,
            false,
            par,
        );
    }
    Ok(())
}
