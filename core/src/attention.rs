//! The argument checks every attention entry point shares, so that the reference and each
//! kernel reject the same inputs with the same errors, and the default score scale.

use crate::error::{expect_dim, expect_finite, Error, Result};
use crate::mask::Mask;
use crate::shape::{TensorMut, TensorRef};

/// The default score scale `1/√d_k` (1 for `d_k = 0`).
pub fn default_scale(dk: usize) -> f32 {
    if dk == 0 {
        1.0
    } else {
        (1.0 / (dk as f64).sqrt()) as f32
    }
}

/// Checks the operands of an attention call and returns `(batch, q_heads, kv_heads, nq, nk, dk,
/// dv)`. Shared by every attention entry point so they all reject the same inputs.
///
/// `q: [batch, hq, nq, dk]`, `k: [batch, hkv, nk, dk]`, `v: [batch, hkv, nk, dv]`,
/// `o: [batch, hq, nq, dv]`, mask over `[batch, hq, nq, nk]`, `lse` of `batch·hq·nq` elements.
pub fn check_attention(
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    v: &TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: &TensorMut<'_>,
    lse: Option<&[f32]>,
) -> Result<[usize; 7]> {
    expect_finite("scale", scale)?;
    let [batch, hq, nq, dk] = q.layout.dims;
    let [_, hkv, nk, _] = k.layout.dims;
    let dv = v.layout.dims[3];
    check_heads(hq, hkv)?;
    k.layout.expect_dims("k", [batch, hkv, nk, dk])?;
    v.layout.expect_dims("v", [batch, hkv, nk, dv])?;
    o.layout.expect_dims("o", [batch, hq, nq, dv])?;
    q.check("q")?;
    k.check("k")?;
    v.check("v")?;
    o.check("o")?;
    mask.check(batch, hq, nq, nk)?;
    if let Some(l) = lse {
        // Saturating: a product past usize::MAX can match no slice length.
        expect_dim("lse", "len", batch.saturating_mul(hq).saturating_mul(nq), l.len())?;
    }
    Ok([batch, hq, hkv, nq, nk, dk, dv])
}

/// The head counts of an attention call: `ZeroHeads` for no query (`q`) or K/V (`k`) head,
/// `KvHeadsNotDividing` when the K/V heads do not divide the query heads (GQA/MQA groups).
pub fn check_heads(hq: usize, hkv: usize) -> Result<()> {
    if hq == 0 {
        return Err(Error::ZeroHeads { arg: "q" });
    }
    if hkv == 0 {
        return Err(Error::ZeroHeads { arg: "k" });
    }
    if !hq.is_multiple_of(hkv) {
        return Err(Error::KvHeadsNotDividing { q_heads: hq, kv_heads: hkv });
    }
    Ok(())
}
