//! The two kernels the layers stand on, behind one door: [`sgemm`] and [`attention`].
//!
//! `sgemm` is the GEMM kernel's. TEMPORARY: `attention` forwards to the reference until the
//! attention kernel lands, and is replaced by its entry point as soon as it is committed.
//! Nothing else in `layers` calls a matmul or attention routine.

use attn_reference::{Mask, Result, TensorMut, TensorRef};

use crate::par::Parallelism;

pub(crate) use crate::gemm::sgemm;

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
