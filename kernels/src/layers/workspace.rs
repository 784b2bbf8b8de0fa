//! Carving a caller-owned workspace into the activation buffers of a layer call.

use attn_core::{Error, MatLayout, Result, Tensor4Layout};

/// The element count of a `[d0, d1, …]` buffer, saturating at `usize::MAX` (which no slice can
/// hold, so a saturated size always reports a too-small workspace instead of wrapping).
pub(crate) fn count(dims: &[usize]) -> usize {
    dims.iter().fold(1usize, |acc, &d| acc.saturating_mul(d))
}

/// Saturating sum of buffer sizes.
pub(crate) fn total(sizes: &[usize]) -> usize {
    sizes.iter().fold(0usize, |acc, &s| acc.saturating_add(s))
}

/// Checks that the workspace holds `required` elements.
pub(crate) fn expect_len(workspace: &[f32], required: usize) -> Result<()> {
    if workspace.len() < required {
        Err(Error::OutOfBounds { arg: "workspace", required, len: workspace.len() })
    } else {
        Ok(())
    }
}

/// A zeroed buffer of `len` elements for the allocating forms; an absurd size is an error (as in
/// the reference), not an abort.
pub(crate) fn alloc(len: usize) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::InvalidParameter {
        arg: "workspace",
        requirement: "the sizes imply a scratch buffer that cannot be allocated",
    })?;
    v.resize(len, 0.0);
    Ok(v)
}

/// Splits `n` elements off the front of `ws` (the caller checked the total).
pub(crate) fn take<'a>(ws: &mut &'a mut [f32], n: usize) -> &'a mut [f32] {
    let (head, tail) = std::mem::take(ws).split_at_mut(n);
    *ws = tail;
    head
}

/// The rows of a `[batch, 1, seq, dim]` activation tensor as one `[batch·seq, dim]` matrix, when
/// the batches are stacked at a constant row stride (always for contiguous storage), so that a
/// projection is one GEMM over every batch instead of one per batch.
pub(crate) fn fold_batch(t: &Tensor4Layout) -> Option<MatLayout> {
    let [batch, _, seq, dim] = t.dims;
    let rows = batch.checked_mul(seq)?;
    let stacked = batch <= 1 || t.strides[0] == seq.checked_mul(t.strides[2])?;
    stacked.then(|| MatLayout::strided(rows, dim, t.strides[2], t.strides[3], t.offset))
}
