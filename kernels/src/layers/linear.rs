//! The linear layer `y = x·W + b` on the GEMM.

use attn_core::error::expect_dim;
use attn_core::{MatMut, MatRef, Result};

use super::kernel_calls::gemm;
use crate::arch::convert::Convertible;
use crate::par::Parallelism;

/// `y = x·W (+ b)` for `x: [n, in]`, `W: [in, out]`, `b: [out]`, `y: [n, out]`: one
/// [`crate::gemm::gemm`] call, the bias broadcast into `y` first and accumulated with
/// β = 1 (so the bias costs one pass over `y` and no second read of the product).
///
/// `x` and `W` (with `b`) may each be f32, bf16 or f16: half-precision values are widened
/// exactly while the GEMM packs them, and `y` is f32 (the GEMM's accumulator type).
///
/// Same conventions as `attn_reference::linear()`: the weight is stored `[in, out]` (a PyTorch
/// `[out, in]` weight is its transposed view, no copy); `in = 0` gives `y = b` (or 0); `n = 0`
/// writes nothing. Accumulation is in f32, so each element is within `γ·in·u·(Σ|x||W| + |b|)`
/// of the exact value (of the values `x`, `W` and `b` represent). Allocates nothing (the GEMM's
/// packing buffers aside).
///
/// Errors: those of the reference's `linear`, in the same order.
pub fn linear<X: Convertible, W: Convertible>(
    x: MatRef<'_, X>,
    w: MatRef<'_, W>,
    b: Option<&[W]>,
    mut y: MatMut<'_>,
    par: Parallelism,
) -> Result<()> {
    let (n, din, dout) = (x.layout.rows, x.layout.cols, w.layout.cols);
    expect_dim("w", "rows", din, w.layout.rows)?;
    y.layout.expect_shape("y", n, dout)?;
    if let Some(b) = b {
        expect_dim("b", "len", dout, b.len())?;
    }
    x.check("x")?;
    w.check("w")?;
    y.check("y")?;
    let beta = match b {
        Some(_) => {
            fill_rows(&mut y, b);
            1.0
        }
        None => 0.0,
    };
    gemm(1.0, x, w, beta, y, par)
}

/// Writes `b` widened (zeros for `None`) into every row of `y`, a checked view;
/// `b.len() == y.cols`.
pub(crate) fn fill_rows<T: Convertible>(y: &mut MatMut<'_>, b: Option<&[T]>) {
    let l = y.layout;
    if l.is_empty() {
        return;
    }
    for r in 0..l.rows {
        if l.col_stride == 1 {
            let row = &mut y.data[l.index(r, 0)..][..l.cols];
            match b {
                Some(b) => row.iter_mut().zip(b).for_each(|(y, b)| *y = b.widen()),
                None => row.fill(0.0),
            }
        } else {
            for j in 0..l.cols {
                y.data[l.index(r, j)] = b.map_or(0.0, |b| b[j].widen());
            }
        }
    }
}
