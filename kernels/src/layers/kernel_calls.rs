//! The two kernels the layers stand on, behind one door: the GEMM ([`sgemm`]) and the
//! attention kernel ([`attention`], which picks its decode path for few queries and the flash
//! path otherwise). Nothing else in `layers` multiplies matrices or computes attention.

use attn_core::{Mask, Result, TensorMut, TensorRef};

pub(crate) use crate::gemm::sgemm;
use crate::par::Parallelism;

/// `O = softmax(scale·Q·Kᵀ + mask)·V` over `[batch, heads]`, without the logsumexp.
pub(crate) fn attention(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: TensorMut<'_>,
    par: Parallelism,
) -> Result<()> {
    crate::attention::attention(q, k, v, scale, mask, o, None, par)
}
