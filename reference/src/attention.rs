//! Scaled dot-product attention over `[batch, heads]`, in f64.

pub use attn_core::attention::{check_attention, default_scale};
pub use attn_core::variants::{alibi_slopes, Variants, Window};

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
    lse: Option<&mut [f32]>,
) -> Result<()> {
    attention_with_variants(q, k, v, scale, mask, &Variants::NONE, o, lse)
}

/// [`attention`] with the [`Variants`] of current models, exactly as that module defines them:
/// for query `i`, key `j` of head `h` and causal offset `off` ([`Variants::offset`]), the logit
/// is `softcap(scale·q_i·k_j) + mask_ij + slope_h·(j − i − off)` where the mask and the window
/// let `j` through, all in f64 ([`saturate_logit`] applied to the sum); a sink joins each row's
/// softmax as one more logit whose weight multiplies no value. The logsumexp includes the sink;
/// a row with no visible key is zero, with logsumexp `sink_h` (−∞ without sinks).
///
/// Errors: those of [`check_attention`], then of [`Variants::check`].
#[allow(clippy::too_many_arguments)]
pub fn attention_with_variants(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    variants: &Variants<'_>,
    o: TensorMut<'_>,
    mut lse: Option<&mut [f32]>,
) -> Result<()> {
    let [batch, hq, hkv, nq, nk, dk, dv] =
        check_attention(&q, &k, &v, scale, mask, &o, lse.as_deref())?;
    variants.check(hq)?;
    // Nothing to write. (With dv = 0 the dims of `o` are unbounded by its slice, so the loop
    // below must not run for nothing.)
    if o.layout.is_empty() && lse.as_deref().map_or(0, <[f32]>::len) == 0 {
        return Ok(());
    }
    let group = hq / hkv;
    let off = Variants::offset(mask, nq, nk);
    let softcap = |s: f64| variants.softcap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh());
    for b in 0..batch {
        for h in 0..hq {
            let kh = h / group;
            let slope = variants.alibi.map_or(0.0, |a| f64::from(a[h]));
            let sink = variants.sinks.map(|s| f64::from(s[h]));
            for i in 0..nq {
                // nk is unbounded by any slice when dk = dv = 0: allocate fallibly.
                let len = nk.checked_add(usize::from(sink.is_some()));
                let mut logits = crate::alloc::filled("k", len.unwrap_or(usize::MAX), None)?;
                for (j, l) in logits.iter_mut().enumerate().take(nk) {
                    let in_window = variants.window.is_none_or(|w| w.contains(i, j, off));
                    *l = mask.term(b, h, i, j, nq, nk).filter(|_| in_window).map(|t| {
                        let dot: f64 = (0..dk)
                            .map(|d| f64::from(q.at(b, h, i, d)) * f64::from(k.at(b, kh, j, d)))
                            .sum();
                        let distance = j as i128 - i as i128 - off as i128;
                        let alibi = if slope == 0.0 { 0.0 } else { slope * distance as f64 };
                        saturate_logit(softcap(f64::from(scale) * dot) + f64::from(t) + alibi)
                    });
                }
                if let Some(s) = sink {
                    logits[nk] = Some(s);
                }
                let (p, l) = softmax_row(&logits);
                for d in 0..dv {
                    // Folded from +0.0: an empty f64 `sum()` is −0.0, and a fully masked row
                    // must be +0.0 like the kernels' zero-initialised accumulators. The sink's
                    // weight (position nk) multiplies no value.
                    let acc: f64 = p[..nk]
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
