//! Batches as inference engines hold them: sequences of different lengths packed along the
//! token axis ([`SeqOffsets`], FlashAttention's `cu_seqlens`), and a paged K/V cache
//! ([`PagedKv`]: fixed-size pages of a shared pool, a block table per sequence, as vLLM's
//! PagedAttention lays it out).
//!
//! A packed operand is a [`Tensor4Layout`] of dims `[1, heads, total_tokens, d]` (any strides,
//! so `[total_tokens, heads, d]` storage is the strides `[0, d, heads·d, 1]`); sequence `s`
//! owns tokens `cu[s]..cu[s + 1]` ([`packed_seq`] is its view).

use std::ops::Range;

use crate::error::{checked_product, expect_dim, Error, Result};
use crate::shape::Tensor4Layout;

/// Cumulative sequence offsets `cu[0] = 0 ≤ cu[1] ≤ … ≤ cu[n]`: sequence `s` is tokens
/// `cu[s]..cu[s + 1]` of a packed operand of `cu[n]` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqOffsets<'a> {
    cu: &'a [usize],
}

impl<'a> SeqOffsets<'a> {
    /// Checks `cu` (named `arg` in errors): at least one entry, the first 0, never decreasing.
    pub fn new(arg: &'static str, cu: &'a [usize]) -> Result<Self> {
        if cu.first() != Some(&0) || cu.windows(2).any(|w| w[1] < w[0]) {
            return Err(Error::InvalidParameter {
                arg,
                requirement: "cumulative offsets must start at 0 and never decrease",
            });
        }
        Ok(SeqOffsets { cu })
    }

    /// The number of sequences.
    pub fn count(&self) -> usize {
        self.cu.len() - 1
    }

    /// The number of tokens of all sequences.
    pub fn total(&self) -> usize {
        self.cu[self.cu.len() - 1]
    }

    /// The tokens of sequence `s < count()`.
    pub fn range(&self, s: usize) -> Range<usize> {
        self.cu[s]..self.cu[s + 1]
    }
}

/// The view of tokens `tokens` of a packed layout `[1, heads, total, d]`: dims
/// `[1, heads, tokens.len(), d]`, the same strides. `tokens` must lie within `0..total`.
pub fn packed_seq(layout: &Tensor4Layout, tokens: Range<usize>) -> Tensor4Layout {
    let [_, heads, _, d] = layout.dims;
    Tensor4Layout {
        dims: [1, heads, tokens.len(), d],
        strides: layout.strides,
        offset: layout.offset + tokens.start * layout.strides[2],
    }
}

/// A paged K/V cache: key and value pools of `num_pages` pages of `page_size` token slots,
/// each slot `kv_heads` heads of `dk` (keys) or `dv` (values) contiguous floats, so the pools
/// are `[num_pages, page_size, kv_heads, d]` row-major. Sequence `b` holds `seq_lens[b]` keys;
/// its key `j` lives in slot `j mod page_size` of page `block_table[b·max_pages + j /
/// page_size]`. Pages may be shared between sequences (a common prefix) and listed in any
/// order.
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a> {
    /// The key pool, `num_pages·page_size·kv_heads·dk` floats.
    pub k: &'a [f32],
    /// The value pool, `num_pages·page_size·kv_heads·dv` floats.
    pub v: &'a [f32],
    /// Token slots per page: a power of two from 16 to 256.
    pub page_size: usize,
    /// K/V heads per slot.
    pub kv_heads: usize,
    /// Key width (at least 1).
    pub dk: usize,
    /// Value width.
    pub dv: usize,
    /// `[batch, max_pages]` row-major page indices; entries past a sequence's last page are
    /// ignored.
    pub block_table: &'a [u32],
    /// Entries per row of `block_table`.
    pub max_pages: usize,
    /// Keys held by each sequence; its length is the batch.
    pub seq_lens: &'a [usize],
}

impl PagedKv<'_> {
    /// The number of sequences.
    pub fn batch(&self) -> usize {
        self.seq_lens.len()
    }

    /// Checks the cache and returns its page count: page size, head count and widths, pool
    /// lengths (whole pages, the same count for keys and values), the block table's length,
    /// each sequence fitting its row, and every page a sequence uses being in the pool.
    pub fn check(&self) -> Result<usize> {
        if !self.page_size.is_power_of_two() || !(16..=256).contains(&self.page_size) {
            return Err(Error::InvalidParameter {
                arg: "page_size",
                requirement: "must be a power of two from 16 to 256",
            });
        }
        if self.kv_heads == 0 {
            return Err(Error::ZeroHeads { arg: "k" });
        }
        if self.dk == 0 {
            return Err(Error::InvalidParameter { arg: "k", requirement: "dk must be at least 1" });
        }
        let page_k = checked_product("k", &[self.page_size, self.kv_heads, self.dk])?;
        let pages = self.k.len() / page_k;
        expect_dim("k", "len", pages * page_k, self.k.len())?;
        let page_v = checked_product("v", &[self.page_size, self.kv_heads, self.dv])?;
        expect_dim("v", "len", checked_product("v", &[pages, page_v])?, self.v.len())?;
        let rows = checked_product("block_table", &[self.batch(), self.max_pages])?;
        expect_dim("block_table", "len", rows, self.block_table.len())?;
        for (b, &len) in self.seq_lens.iter().enumerate() {
            if len.div_ceil(self.page_size) > self.max_pages {
                return Err(Error::InvalidParameter {
                    arg: "seq_lens",
                    requirement: "a sequence is longer than its row of the block table holds",
                });
            }
            let row = &self.block_table[b * self.max_pages..][..len.div_ceil(self.page_size)];
            if let Some(&p) = row.iter().find(|&&p| p as usize >= pages) {
                return Err(Error::OutOfBounds {
                    arg: "block_table",
                    required: p as usize + 1,
                    len: pages,
                });
            }
        }
        Ok(pages)
    }

    /// The index in the pool of element 0 of slot `j` (key or value `j` of sequence `b`),
    /// head `h`, for a width `d` (`dk` for `k`, `dv` for `v`). Valid after
    /// [`check`](Self::check), for `j < seq_lens[b]`.
    pub fn slot(&self, b: usize, j: usize, h: usize, d: usize) -> usize {
        let page = self.block_table[b * self.max_pages + j / self.page_size] as usize;
        ((page * self.page_size + j % self.page_size) * self.kv_heads + h) * d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_checked() {
        assert!(SeqOffsets::new("cu", &[0, 2, 2, 5]).is_ok());
        for bad in [&[][..], &[1, 2], &[0, 3, 2]] {
            let e = SeqOffsets::new("cu", bad).unwrap_err();
            assert!(matches!(e, Error::InvalidParameter { arg: "cu", .. }), "{bad:?}: {e:?}");
        }
        let s = SeqOffsets::new("cu", &[0, 2, 2, 5]).unwrap();
        assert_eq!((s.count(), s.total(), s.range(1), s.range(2)), (3, 5, 2..2, 2..5));
    }

    #[test]
    fn paged_cache_is_checked() {
        let (k, v) = (vec![0.0f32; 3 * 16 * 2 * 4], vec![0.0f32; 3 * 16 * 2 * 2]);
        let table = [2u32, 0, 9, 9];
        let lens = [20usize, 0];
        let cache = PagedKv {
            k: &k,
            v: &v,
            page_size: 16,
            kv_heads: 2,
            dk: 4,
            dv: 2,
            block_table: &table,
            max_pages: 2,
            seq_lens: &lens,
        };
        assert_eq!(cache.check(), Ok(3));
        // Key 17 of sequence 0: page table[1] = 0, slot 1, head 1: ((0·16 + 1)·2 + 1)·4.
        assert_eq!(cache.slot(0, 17, 1, 4), 12);
        // Key 3: page table[0] = 2, slot 3, head 0: ((2·16 + 3)·2 + 0)·4.
        assert_eq!(cache.slot(0, 3, 0, 4), 280);
        let lens = [20usize, 1];
        let e = PagedKv { seq_lens: &lens, ..cache }.check().unwrap_err();
        assert_eq!(e, Error::OutOfBounds { arg: "block_table", required: 10, len: 3 });
        let lens = [33usize, 0];
        let e = PagedKv { seq_lens: &lens, ..cache }.check().unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { arg: "seq_lens", .. }), "{e:?}");
        let e = PagedKv { page_size: 24, ..cache }.check().unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { arg: "page_size", .. }), "{e:?}");
        let e = PagedKv { v: &v[1..], ..cache }.check().unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { arg: "v", .. }), "{e:?}");
        let e = PagedKv { block_table: &table[1..], ..cache }.check().unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { arg: "block_table", .. }), "{e:?}");
    }
}
