//! Packed variable-length batches and the paged K/V cache, in f64: each sequence is cut out of
//! the packed operands, or gathered from its pages into dense K/V, and run through
//! [`attention_with_variants`]. Nothing else happens here.
//!
//! Packed operands are `[1, heads, total_tokens, d]` views (see [`attn_core::batch`]); the
//! logsumexps, when asked for, are `[heads, total_q]` row-major (FlashAttention's varlen
//! `softmax_lse`). The mask is [`Mask::None`] or [`Mask::Causal`], applied to each sequence
//! with its own sizes: the default causal offset of sequence `s` is `nk_s − nq_s`, so its
//! queries are the last `nq_s` positions of its keys (chunked prefill; decode when
//! `nq_s = 1`). Keep and bias masks are per-sequence tensors these calls do not take.

pub use attn_core::batch::{packed_seq, PagePool, PagedKv, SeqOffsets};

use crate::alloc::{filled, product};
use crate::attention::{attention_with_variants, check_attention, Variants};
use crate::error::{expect_dim, Error, Result};
use crate::mask::Mask;
use crate::shape::{Tensor4Layout, TensorMut, TensorRef};

/// Attention over a packed batch: sequence `s` is queries `cu_q[s]..cu_q[s + 1]` of `q` against
/// keys and values `cu_k[s]..cu_k[s + 1]` of `k` and `v`, written to the same rows of `o`.
/// `q: [1, hq, total_q, dk]`, `k: [1, hkv, total_k, dk]`, `v: [1, hkv, total_k, dv]`,
/// `o: [1, hq, total_q, dv]`; see the module docs for the mask and `lse`.
///
/// Errors: those of [`check_attention`] on the packed views, bad offsets
/// ([`SeqOffsets::new`]), offsets whose totals or counts disagree with the views or each other
/// (`ShapeMismatch`), a keep or bias mask (`InvalidParameter { arg: "mask" }`), and those of
/// [`Variants::check`].
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    cu_q: &[usize],
    cu_k: &[usize],
    scale: f32,
    mask: &Mask<'_>,
    variants: &Variants<'_>,
    mut o: TensorMut<'_>,
    mut lse: Option<&mut [f32]>,
) -> Result<()> {
    let [_, hq, _, total_q, total_k, _, _] =
        check_packed(&q, &k, &v, scale, mask, &o, lse.as_deref())?;
    let (sq, sk) = (SeqOffsets::new("cu_seqlens_q", cu_q)?, SeqOffsets::new("cu_seqlens_k", cu_k)?);
    expect_dim("cu_seqlens_q", "total", total_q, sq.total())?;
    expect_dim("cu_seqlens_k", "total", total_k, sk.total())?;
    expect_dim("cu_seqlens_k", "sequences", sq.count(), sk.count())?;
    variants.check(hq)?;
    for s in 0..sq.count() {
        let (rq, rk) = (sq.range(s), sk.range(s));
        let ks = TensorRef::new(k.data, packed_seq(&k.layout, rk.clone()));
        let vs = TensorRef::new(v.data, packed_seq(&v.layout, rk));
        run_sequence(&q, ks, vs, rq, total_q, scale, mask, variants, &mut o, lse.as_deref_mut())?;
    }
    Ok(())
}

/// Attention of packed queries against a paged K/V cache: sequence `b` is queries
/// `cu_q[b]..cu_q[b + 1]` of `q: [1, hq, total_q, cache.dk]` against the `cache.seq_lens[b]`
/// keys and values it holds, written to the same rows of `o: [1, hq, total_q, cache.dv]`. Its
/// pages are gathered into dense K/V first.
///
/// The pools must be f32 ([`PagePool::F32`]): a test of typed pages (bf16, f16, int8) gives
/// the reference the f32 pools of the values its elements represent, which it can build
/// exactly (widened half values; int8 scales chosen so that every `q·scale` is an f32).
///
/// Errors: those of [`PagedKv::check`] and [`check_attention`], bad query offsets or a count
/// other than the cache's batch, a keep or bias mask, and those of [`Variants::check`]; then a
/// pool of another type (`InvalidParameter` naming `k` or `v`).
#[allow(clippy::too_many_arguments)]
pub fn attention_paged(
    q: TensorRef<'_>,
    cu_q: &[usize],
    cache: &PagedKv<'_>,
    scale: f32,
    mask: &Mask<'_>,
    variants: &Variants<'_>,
    mut o: TensorMut<'_>,
    mut lse: Option<&mut [f32]>,
) -> Result<()> {
    cache.check()?;
    let (hkv, dk, dv) = (cache.kv_heads, cache.dk, cache.dv);
    // The packed views checked against a cache of no keys: shapes, heads, bounds, output.
    let none = |d| TensorRef::new(&[], Tensor4Layout::bhsd(1, hkv, 0, d));
    let [_, hq, _, total_q, _, _, _] =
        check_packed(&q, &none(dk), &none(dv), scale, mask, &o, lse.as_deref())?;
    let sq = SeqOffsets::new("cu_seqlens_q", cu_q)?;
    expect_dim("cu_seqlens_q", "total", total_q, sq.total())?;
    expect_dim("cu_seqlens_q", "sequences", cache.batch(), sq.count())?;
    variants.check(hq)?;
    let f32_pool = |arg, pool| match pool {
        PagePool::F32(x) => Ok(x),
        _ => Err(Error::InvalidParameter {
            arg,
            requirement: "the reference reads f32 pools: give it the values typed pages represent",
        }),
    };
    let (kp, vp) = (f32_pool("k", cache.k)?, f32_pool("v", cache.v)?);
    for (b, &len) in cache.seq_lens.iter().enumerate() {
        let gather = |pool: &[f32], d: usize| -> Result<Vec<f32>> {
            let mut dense = filled("k", product("k", &[hkv, len, d])?, 0.0f32)?;
            for h in 0..hkv {
                for j in 0..len {
                    let at = cache.slot(b, j, h, d);
                    dense[(h * len + j) * d..][..d].copy_from_slice(&pool[at..at + d]);
                }
            }
            Ok(dense)
        };
        let (kd, vd) = (gather(kp, dk)?, gather(vp, dv)?);
        let ks = TensorRef::new(&kd, Tensor4Layout::bhsd(1, hkv, len, dk));
        let vs = TensorRef::new(&vd, Tensor4Layout::bhsd(1, hkv, len, dv));
        let rq = sq.range(b);
        run_sequence(&q, ks, vs, rq, total_q, scale, mask, variants, &mut o, lse.as_deref_mut())?;
    }
    Ok(())
}

/// [`check_attention`] on packed views (batch 1), with the mask restricted to none or causal.
fn check_packed(
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    v: &TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: &TensorMut<'_>,
    lse: Option<&[f32]>,
) -> Result<[usize; 7]> {
    if !matches!(mask, Mask::None | Mask::Causal { .. }) {
        return Err(Error::InvalidParameter {
            arg: "mask",
            requirement: "packed and paged batches take no mask, or a causal one",
        });
    }
    expect_dim("q", "batch", 1, q.layout.dims[0])?;
    check_attention(q, k, v, scale, mask, o, lse)
}

/// One sequence: queries `rq` of the packed `q` against the dense or packed `k`, `v`, into the
/// same rows of `o` and of the `[hq, total_q]` logsumexps.
#[allow(clippy::too_many_arguments)]
fn run_sequence(
    q: &TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    rq: std::ops::Range<usize>,
    total_q: usize,
    scale: f32,
    mask: &Mask<'_>,
    variants: &Variants<'_>,
    o: &mut TensorMut<'_>,
    lse: Option<&mut [f32]>,
) -> Result<()> {
    let hq = q.layout.dims[1];
    let qs = TensorRef::new(q.data, packed_seq(&q.layout, rq.clone()));
    let os = TensorMut::new(&mut *o.data, packed_seq(&o.layout, rq.clone()));
    let mut part = filled("lse", product("lse", &[hq, rq.len()])?, 0.0f32)?;
    let want_lse = lse.is_some();
    attention_with_variants(
        qs,
        k,
        v,
        scale,
        mask,
        variants,
        os,
        want_lse.then_some(&mut part[..]),
    )?;
    if let Some(out) = lse {
        for h in 0..hq {
            out[h * total_q + rq.start..][..rq.len()]
                .copy_from_slice(&part[h * rq.len()..][..rq.len()]);
        }
    }
    Ok(())
}
