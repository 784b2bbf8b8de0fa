//! The two kernels the layers stand on, behind one door: the GEMM ([`gemm`]) and the
//! attention kernel ([`attention`]: an [`Attention`] problem on its default path, decode for
//! few queries and flash otherwise). Nothing else in `layers` multiplies matrices or computes attention.

use attn_core::{Mask, MatMut, MatRef, Result, TensorMut, TensorRef, Variants};

use crate::arch::convert::Convertible;
use crate::attention::Attention;
use crate::par::Parallelism;

#[cfg(test)]
thread_local! {
    /// GEMM calls made through [`gemm`] on this thread (unit tests count the projections).
    pub(crate) static GEMM_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// [`crate::gemm::gemm`]: `C ← α·A·B + β·C`, A and B of any element type, C of f32.
pub(crate) fn gemm<TA: Convertible, TB: Convertible>(
    alpha: f32,
    a: MatRef<'_, TA>,
    b: MatRef<'_, TB>,
    beta: f32,
    c: MatMut<'_>,
    par: Parallelism,
) -> Result<()> {
    #[cfg(test)]
    GEMM_CALLS.with(|n| n.set(n.get() + 1));
    crate::gemm::gemm(alpha, a, b, beta, c, par)
}

/// `O = softmax(scale·Q·Kᵀ + mask)·V` over `[batch, heads]` with the `variants`, without the
/// logsumexp.
#[allow(clippy::too_many_arguments)] // the attention problem's operands and settings
pub(crate) fn attention(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    variants: &Variants<'_>,
    o: TensorMut<'_>,
    par: Parallelism,
) -> Result<()> {
    Attention::new(q, k, v).scale(scale).mask(*mask).variants(*variants).parallelism(par).run(o)
}
