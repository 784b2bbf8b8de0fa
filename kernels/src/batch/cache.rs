//! Cache writes: a batch's new K/V rows copied into their slots of a paged pool.

use attn_core::batch::{PagedKvMut, SeqOffsets};
use attn_core::{Result, TensorRef};

/// Appends new keys and values to a paged cache: sequence `b` gets rows
/// `cu_new[b]..cu_new[b + 1]` of the packed `k_new: [1, kv_heads, total_new, dk]` and
/// `v_new: [1, kv_heads, total_new, dv]` (any strides) as its keys and values
/// `seq_lens[b]..seq_lens[b] + n_b`, in the slots the block table gives them. The caller then
/// adds `n_b` to its lengths.
///
/// Errors, before anything is written: bad offsets (`cu_seqlens_new`, as
/// [`SeqOffsets::new`]); those of [`PagedKvMut::check_append`] (the cache itself, the
/// sequence count, every page written in the pool, every grown sequence within its row of the
/// block table, no slot written twice, no written slot held by any sequence); the views' dims
/// other than `[1, kv_heads, total_new, dk]` / `[.., dv]` with `total_new = cu_new[last]`
/// (`ShapeMismatch` on `k_new`/`v_new`); their bounds.
pub fn append_kv(
    cache: &mut PagedKvMut<'_>,
    k_new: TensorRef<'_>,
    v_new: TensorRef<'_>,
    cu_new: &[usize],
) -> Result<()> {
    let new = SeqOffsets::new("cu_seqlens_new", cu_new)?;
    cache.check_append(&new)?;
    let (hkv, total) = (cache.kv_heads, new.total());
    k_new.layout.expect_dims("k_new", [1, hkv, total, cache.dk])?;
    v_new.layout.expect_dims("v_new", [1, hkv, total, cache.dv])?;
    k_new.check("k_new")?;
    v_new.check("v_new")?;
    for b in 0..new.count() {
        let first = cache.seq_lens[b];
        for (n, t) in new.range(b).enumerate() {
            for h in 0..hkv {
                let (sk, sv) =
                    (cache.slot(b, first + n, h, cache.dk), cache.slot(b, first + n, h, cache.dv));
                copy_row(&k_new, h, t, &mut cache.k[sk..sk + cache.dk]);
                copy_row(&v_new, h, t, &mut cache.v[sv..sv + cache.dv]);
            }
        }
    }
    Ok(())
}

/// Row `(0, h, t)` of a checked view into `out` (its width).
fn copy_row(src: &TensorRef<'_>, h: usize, t: usize, out: &mut [f32]) {
    if out.is_empty() {
        return;
    }
    let start = src.layout.index(0, h, t, 0);
    if src.layout.strides[3] == 1 {
        out.copy_from_slice(&src.data[start..start + out.len()]);
    } else {
        for (d, x) in out.iter_mut().enumerate() {
            *x = src.data[start + d * src.layout.strides[3]];
        }
    }
}
