//! Scaled dot-product attention over `[batch, heads]`, in f64.

pub use attn_core::attention::{check_attention, default_scale};

use crate::error::Result;
use crate::mask::Mask;
use crate::shape::{TensorMut, TensorRef};
use crate::softmax::{saturate_logit, softmax_row};

/// `O = softmax(scale·Q·Kᵀ + mask)·V` for every batch and query head.
///
/// Query head `h` reads K/V head `h / (hq / hkv)` (GQA; MQA when `hkv = 1`). Scores and the
/// weighted sum of values are computed in f64 and rounded once. The mask follows [`Mask`]: a
/// fully masked row (or `nk = 0`) gives a zero output row and logsumexp −∞. A logit whose
/// magnitude overflows f32 is `±∞` ([`saturate_logit`]): `−∞` gets weight 0, and the `+∞`
/// logits of a row share its weight evenly (the output is the mean of their values, the
/// logsumexp +∞), as in every kernel path. When given, `lse`
/// receives `ln Σ_j exp(scale·q_i·k_j + mask_ij)` row-major over `[batch, hq, nq]`.
/// Layouts are free: `[b, s, h, d]` and `[b, h, s, d]` storage are both strided views.
///
/// Errors: see [`check_attention`].
pub fn attention(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: TensorMut<'_>,
    mut lse: Option<&mut [f32]>,
) -> Result<()> {
    let [batch, hq, hkv, nq, nk, dk, dv] =
        check_attention(&q, &k, &v, scale, mask, &o, lse.as_deref())?;
    // Nothing to write. (With dv = 0 the dims of `o` are unbounded by its slice, so the loop
    // below must not run for nothing.)
    if o.layout.is_empty() && lse.as_deref().map_or(0, <[f32]>::len) == 0 {
        return Ok(());
    }
    let group = hq / hkv;
    for b in 0..batch {
        for h in 0..hq {
            let kh = h / group;
            for i in 0..nq {
                // nk is unbounded by any slice when dk = dv = 0: allocate fallibly.
                let mut logits = crate::alloc::filled("k", nk, None)?;
                for (j, l) in logits.iter_mut().enumerate() {
                    *l = mask.term(b, h, i, j, nq, nk).map(|t| {
                        let dot: f64 = (0..dk)
                            .map(|d| f64::from(q.at(b, h, i, d)) * f64::from(k.at(b, kh, j, d)))
                            .sum();
                        saturate_logit(f64::from(scale) * dot + f64::from(t))
                    });
                }
                let (p, l) = softmax_row(&logits);
                for d in 0..dv {
                    // Folded from +0.0: an empty f64 `sum()` is −0.0, and a fully masked row
                    // must be +0.0 like the kernels' zero-initialised accumulators.
                    let acc: f64 = p
                        .iter()
                        .enumerate()
                        .filter(|(_, w)| **w != 0.0)
                        .map(|(j, w)| w * f64::from(v.at(b, kh, j, d)))
                        .fold(0.0, |s, x| s + x);
                    let oi = o.layout.index(b, h, i, d);
                    o.data[oi] = acc as f32;
                }
                if let Some(out) = lse.as_deref_mut() {
                    out[(b * hq + h) * nq + i] = l as f32;
                }
            }
        }
    }
    Ok(())
}
