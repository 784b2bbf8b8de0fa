//! Masks applied to attention scores before the softmax, and their convention.
//!
//! A mask addresses a logical `[batch, heads, nq, nk]` score tensor. A masked position gets
//! exactly zero weight; a row where every position is masked gives an all-zero output row and a
//! logsumexp of −∞ (the PyTorch/ggml/candle convention, not the seed's −1e9 fill, which turns
//! such a row into a plain average).

use crate::error::{expect_dim, Result};
use crate::shape::Tensor4Layout;

/// A mask over a `[batch, heads, nq, nk]` score tensor.
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    /// Every key is visible.
    None,
    /// Key `j` is visible to query `i` iff `j ≤ i + offset`. `offset: None` means the default
    /// `nk − nq` ("bottom-right", what a KV cache needs); `Some(0)` is PyTorch's `is_causal`.
    Causal {
        /// Diagonal offset; `None` for `nk − nq`.
        offset: Option<isize>,
    },
    /// Boolean keep-mask, `true` = attend. Its layout's dims must be `[batch, heads, nq, nk]`;
    /// zero strides broadcast it (e.g. a key-padding mask has strides `[nk, 0, 0, 1]`).
    Keep {
        /// The mask elements.
        keep: &'a [bool],
        /// Where element `(b, h, i, j)` lives in `keep`.
        layout: Tensor4Layout,
    },
    /// Additive f32 bias added to the scaled scores (ALiBi, relative positions, or −∞ to mask).
    /// Same layout rules as [`Mask::Keep`].
    Bias {
        /// The bias elements.
        bias: &'a [f32],
        /// Where element `(b, h, i, j)` lives in `bias`.
        layout: Tensor4Layout,
    },
}

impl<'a> Mask<'a> {
    /// The bottom-right causal mask (offset `nk − nq`), what a KV cache needs.
    pub const CAUSAL: Mask<'static> = Mask::Causal { offset: None };

    /// A key-padding keep-mask: `keep: [batch, nk]` row-major, `true` = attend, broadcast over
    /// heads and queries (layout [`Tensor4Layout::broadcast_rows`]).
    pub const fn key_padding(
        keep: &'a [bool],
        batch: usize,
        heads: usize,
        nq: usize,
        nk: usize,
    ) -> Self {
        Mask::Keep { keep, layout: Tensor4Layout::broadcast_rows(batch, heads, nq, nk) }
    }

    /// One `[nq, nk]` row-major keep-mask shared by every batch and head
    /// (layout [`Tensor4Layout::broadcast_mat`]).
    pub const fn keep_mat(
        keep: &'a [bool],
        batch: usize,
        heads: usize,
        nq: usize,
        nk: usize,
    ) -> Self {
        Mask::Keep { keep, layout: Tensor4Layout::broadcast_mat(batch, heads, nq, nk) }
    }

    /// One `[nq, nk]` row-major additive bias shared by every batch and head
    /// (layout [`Tensor4Layout::broadcast_mat`]).
    pub const fn bias_mat(
        bias: &'a [f32],
        batch: usize,
        heads: usize,
        nq: usize,
        nk: usize,
    ) -> Self {
        Mask::Bias { bias, layout: Tensor4Layout::broadcast_mat(batch, heads, nq, nk) }
    }

    /// The causal diagonal offset for `nq` queries and `nk` keys (`nk − nq` by default).
    /// Saturates at the `isize` range, which only sizes of empty views can reach.
    pub fn causal_offset(offset: Option<isize>, nq: usize, nk: usize) -> isize {
        offset.unwrap_or_else(|| {
            let clamp = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
            clamp(nk).saturating_sub(clamp(nq))
        })
    }

    /// Checks the mask against a `[batch, heads, nq, nk]` score tensor.
    pub fn check(&self, batch: usize, heads: usize, nq: usize, nk: usize) -> Result<()> {
        let dims = [batch, heads, nq, nk];
        match self {
            Mask::None | Mask::Causal { .. } => Ok(()),
            Mask::Keep { keep, layout } => {
                check_mask_layout(layout, dims)?;
                layout.check("mask", keep.len())
            }
            Mask::Bias { bias, layout } => {
                check_mask_layout(layout, dims)?;
                layout.check("mask", bias.len())
            }
        }
    }

    /// The additive term for score `(b, h, i, j)` of an `nq × nk` head: `None` when the position
    /// is masked, `Some(0.0)` when visible, `Some(bias)` for a bias mask. Valid only after
    /// [`check`](Self::check) succeeded for these sizes.
    pub fn term(
        &self,
        b: usize,
        h: usize,
        i: usize,
        j: usize,
        nq: usize,
        nk: usize,
    ) -> Option<f32> {
        match self {
            Mask::None => Some(0.0),
            Mask::Causal { offset } => {
                let off = Self::causal_offset(*offset, nq, nk);
                ((j as isize) <= (i as isize).saturating_add(off)).then_some(0.0)
            }
            Mask::Keep { keep, layout } => keep[layout.index(b, h, i, j)].then_some(0.0),
            Mask::Bias { bias, layout } => Some(bias[layout.index(b, h, i, j)]),
        }
    }
}

fn check_mask_layout(layout: &Tensor4Layout, dims: [usize; 4]) -> Result<()> {
    const NAMES: [&str; 4] = ["batch", "heads", "nq", "nk"];
    for i in 0..4 {
        expect_dim("mask", NAMES[i], dims[i], layout.dims[i])?;
    }
    Ok(())
}
