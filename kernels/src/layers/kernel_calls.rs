//! The two kernels the layers stand on, behind one door: [`sgemm`] and [`attention`].
//!
//! TEMPORARY: until the `gemm` and `attn` branches land, these forward to the reference so the
//! layers can be written and tested; they are replaced by the kernels' entry points as soon as
//! those are committed. Nothing else in `layers` calls a matmul or attention routine.

use attn_reference::{Mask, MatMut, MatRef, Result, TensorMut, TensorRef};

use crate::par::Parallelism;

/// `C ← α·A·B + β·C` (β = 0: C is not read).
pub(crate) fn sgemm(
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: MatMut<'_>,
    _par: Parallelism,
) -> Result<()> {
    attn_reference::matmul::matmul(alpha, a, b, beta, c)
}

/// `O = softmax(scale·Q·Kᵀ + mask)·V` over `[batch, heads]`.
pub(crate) fn attention(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: TensorMut<'_>,
    _par: Parallelism,
) -> Result<()> {
    attn_reference::attention::attention(q, k, v, scale, mask, o, None)
}
