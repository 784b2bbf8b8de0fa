//! Cache writes: a batch's new K/V rows stored into their slots of a paged pool, in the pool's
//! storage type (rounded to bf16/f16, or quantised for int8 pages).

use attn_core::batch::{PagePoolMut, PagedKvMut, SeqOffsets};
use attn_core::quant::{q8_blocks, quantize_q8_block, Q8_BLOCK};
use attn_core::{AnyRef, Element, Error, Result, TensorRef};

/// Appends new keys and values to a paged cache: sequence `b` gets rows
/// `cu_new[b]..cu_new[b + 1]` of the packed `k_new: [1, kv_heads, total_new, dk]` and
/// `v_new: [1, kv_heads, total_new, dv]` (f32, bf16 or f16, any strides) as its keys and values
/// `seq_lens[b]..seq_lens[b] + n_b`, in the slots the block table gives them. The caller then
/// adds `n_b` to its lengths.
///
/// Each row is stored in its pool's type: an f32 pool gets the exact (widened) values; a bf16
/// or f16 pool each value rounded to nearest, ties to even ([`Element::from_f32`]); an int8
/// pool each block of 32 along `d` quantised by [`quantize_q8_block`] (the bits
/// [`quantize_q8`](attn_core::quantize_q8) writes for the same row), its scale in the scale
/// pool at the slot's index of width `⌈d/32⌉`.
///
/// Errors, before anything is written: bad offsets (`cu_seqlens_new`, as
/// [`SeqOffsets::new`]); those of [`PagedKvMut::check_append`] (the cache itself, the
/// sequence count, every page written in the pool, every grown sequence within its row of the
/// block table, no slot written twice, no written slot held by any sequence); the views' dims
/// other than `[1, kv_heads, total_new, dk]` / `[.., dv]` with `total_new = cu_new[last]`
/// (`ShapeMismatch` on `k_new`/`v_new`); their bounds; a NaN or infinite new row bound for an
/// int8 pool (`NonFinite` naming `k_new` or `v_new`: a block scale cannot represent it).
pub fn append_kv<'k, 'v>(
    cache: &mut PagedKvMut<'_>,
    k_new: impl Into<AnyRef<'k>>,
    v_new: impl Into<AnyRef<'v>>,
    cu_new: &[usize],
) -> Result<()> {
    let (k_new, v_new) = (k_new.into(), v_new.into());
    let new = SeqOffsets::new("cu_seqlens_new", cu_new)?;
    cache.check_append(&new)?;
    let (hkv, total, dk, dv) = (cache.kv_heads, new.total(), cache.dk, cache.dv);
    k_new.layout().expect_dims("k_new", [1, hkv, total, dk])?;
    v_new.layout().expect_dims("v_new", [1, hkv, total, dv])?;
    k_new.check("k_new")?;
    v_new.check("v_new")?;
    if matches!(cache.k, PagePoolMut::Q8 { .. }) {
        expect_finite_rows("k_new", &k_new)?;
    }
    if matches!(cache.v, PagePoolMut::Q8 { .. }) {
        expect_finite_rows("v_new", &v_new)?;
    }
    for b in 0..new.count() {
        let first = cache.seq_lens[b];
        for (n, t) in new.range(b).enumerate() {
            for h in 0..hkv {
                let j = first + n;
                let (at, sat) = (cache.slot(b, j, h, dk), cache.slot(b, j, h, q8_blocks(dk)));
                store_row(&mut cache.k, at, sat, &k_new, h, t, dk)?;
                let (at, sat) = (cache.slot(b, j, h, dv), cache.slot(b, j, h, q8_blocks(dv)));
                store_row(&mut cache.v, at, sat, &v_new, h, t, dv)?;
            }
        }
    }
    Ok(())
}

/// The first NaN or infinity of a checked view, as [`Error::NonFinite`] naming `arg`.
fn expect_finite_rows(arg: &'static str, x: &AnyRef<'_>) -> Result<()> {
    let [_, heads, total, d] = x.layout().dims;
    for h in 0..heads {
        for t in 0..total {
            for e in 0..d {
                let value = x.at_f64(0, h, t, e);
                if !value.is_finite() {
                    return Err(Error::NonFinite { arg, value: value as f32 });
                }
            }
        }
    }
    Ok(())
}

/// Stores row `(0, h, t)` of a checked view (`d` values) at value index `at` of `pool`, and
/// for an int8 pool its block scales at scale index `sat`. Block by block along `d`: the
/// quantisation's unit, and a bounded buffer whatever `d`.
fn store_row(
    pool: &mut PagePoolMut<'_>,
    at: usize,
    sat: usize,
    src: &AnyRef<'_>,
    h: usize,
    t: usize,
    d: usize,
) -> Result<()> {
    let mut x = [0.0f32; Q8_BLOCK];
    for (k, d0) in (0..d).step_by(Q8_BLOCK).enumerate() {
        let x = &mut x[..(d - d0).min(Q8_BLOCK)];
        match src {
            AnyRef::F32(s) => read(s, h, t, d0, x),
            AnyRef::BF16(s) => read(s, h, t, d0, x),
            AnyRef::F16(s) => read(s, h, t, d0, x),
        }
        let at = at + d0;
        match pool {
            PagePoolMut::F32(p) => narrow(x, &mut p[at..at + x.len()]),
            PagePoolMut::BF16(p) => narrow(x, &mut p[at..at + x.len()]),
            PagePoolMut::F16(p) => narrow(x, &mut p[at..at + x.len()]),
            PagePoolMut::Q8 { values, scales } => {
                scales[sat + k] = quantize_q8_block(x, &mut values[at..at + x.len()])?;
            }
        }
    }
    Ok(())
}

/// Elements `d0..d0 + out.len()` of row `(0, h, t)` of a checked view, widened to f32.
fn read<T: Element>(src: &TensorRef<'_, T>, h: usize, t: usize, d0: usize, out: &mut [f32]) {
    for (i, x) in out.iter_mut().enumerate() {
        *x = src.at(0, h, t, d0 + i).to_f32();
    }
}

/// `x` rounded to `T` into `out` (the same length).
fn narrow<T: Element>(x: &[f32], out: &mut [T]) {
    for (o, &x) in out.iter_mut().zip(x) {
        *o = T::from_f32(x);
    }
}
