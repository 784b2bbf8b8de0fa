//! Batches as inference engines hold them: sequences of different lengths packed along the
//! token axis ([`SeqOffsets`], FlashAttention's `cu_seqlens`), and a paged K/V cache
//! ([`PagedKv`]: fixed-size pages of a shared pool, a block table per sequence, as vLLM's
//! PagedAttention lays it out).
//!
//! A pool holds its elements in one storage type ([`PagePool`]): f32, bf16, f16, or int8 with
//! one f32 scale per block of 32 values along `d` (the layout of [`crate::quant`], the scales in
//! a pool of their own, `[num_pages, page_size, kv_heads, ⌈d/32⌉]`).
//!
//! A packed operand is a [`Tensor4Layout`] of dims `[1, heads, total_tokens, d]` (any strides,
//! so `[total_tokens, heads, d]` storage is the strides `[0, d, heads·d, 1]`); sequence `s`
//! owns tokens `cu[s]..cu[s + 1]` ([`packed_seq`] is its view).

use std::ops::Range;

use crate::dtype::{bf16, f16, DType};
use crate::error::{checked_product, expect_dim, Error, Result};
use crate::quant::q8_blocks;
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
/// `[1, heads, tokens.len(), d]`, the same strides. `tokens` must lie within `0..total`, and
/// `layout` must have passed its check, so the offset of a sub-view with elements is an index
/// of the checked view and cannot overflow. A sub-view without elements (no tokens, heads or
/// width) keeps `layout`'s offset: its strides may be anything (an empty view's are never
/// checked), and the fuzzer found `start·stride` overflowing there.
pub fn packed_seq(layout: &Tensor4Layout, tokens: Range<usize>) -> Tensor4Layout {
    let [_, heads, _, d] = layout.dims;
    let empty = tokens.is_empty() || heads == 0 || d == 0;
    Tensor4Layout {
        dims: [1, heads, tokens.len(), d],
        strides: layout.strides,
        offset: if empty {
            layout.offset
        } else {
            layout.offset + tokens.start * layout.strides[2]
        },
    }
}

/// One pool of a paged cache (the keys or the values), `[num_pages, page_size, kv_heads, d]`
/// row-major, in its storage type. [`PagePool::Q8`] pairs the int8 values with their scales,
/// `[num_pages, page_size, kv_heads, ⌈d/32⌉]` row-major: the scale of block `k` of a slot's
/// head is at the same `(page, slot, head)` index with width `⌈d/32⌉`, so
/// [`PagedKv::slot`] with that width finds it. Made from a slice of `f32`, [`bf16`] or
/// [`f16`](struct@f16) by `From`/`Into`.
#[derive(Clone, Copy, Debug)]
pub enum PagePool<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// bf16 elements.
    BF16(&'a [bf16]),
    /// f16 elements.
    F16(&'a [f16]),
    /// int8 values and one f32 scale per block of 32 along `d` ([`crate::quant`]).
    Q8 {
        /// The values, `[num_pages, page_size, kv_heads, d]`.
        values: &'a [i8],
        /// The scales, `[num_pages, page_size, kv_heads, ⌈d/32⌉]`.
        scales: &'a [f32],
    },
}

/// A writable pool of a paged cache ([`PagePool`]'s layouts), the destination of an append.
#[derive(Debug)]
pub enum PagePoolMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// bf16 elements.
    BF16(&'a mut [bf16]),
    /// f16 elements.
    F16(&'a mut [f16]),
    /// int8 values and their block scales, as [`PagePool::Q8`].
    Q8 {
        /// The values, `[num_pages, page_size, kv_heads, d]`.
        values: &'a mut [i8],
        /// The scales, `[num_pages, page_size, kv_heads, ⌈d/32⌉]`.
        scales: &'a mut [f32],
    },
}

macro_rules! pool_from {
    ($($t:ty => $v:ident),*) => {$(
        impl<'a> From<&'a [$t]> for PagePool<'a> {
            fn from(x: &'a [$t]) -> Self {
                PagePool::$v(x)
            }
        }
        impl<'a> From<&'a Vec<$t>> for PagePool<'a> {
            fn from(x: &'a Vec<$t>) -> Self {
                PagePool::$v(x)
            }
        }
        impl<'a> From<&'a mut [$t]> for PagePoolMut<'a> {
            fn from(x: &'a mut [$t]) -> Self {
                PagePoolMut::$v(x)
            }
        }
        impl<'a> From<&'a mut Vec<$t>> for PagePoolMut<'a> {
            fn from(x: &'a mut Vec<$t>) -> Self {
                PagePoolMut::$v(x)
            }
        }
    )*};
}
pool_from!(f32 => F32, bf16 => BF16, f16 => F16);

impl PagePool<'_> {
    /// The storage type.
    pub const fn dtype(&self) -> DType {
        match self {
            PagePool::F32(_) => DType::F32,
            PagePool::BF16(_) => DType::BF16,
            PagePool::F16(_) => DType::F16,
            PagePool::Q8 { .. } => DType::Q8,
        }
    }

    /// The number of stored values (not counting [`PagePool::Q8`]'s scales).
    pub const fn len(&self) -> usize {
        match self {
            PagePool::F32(x) => x.len(),
            PagePool::BF16(x) => x.len(),
            PagePool::F16(x) => x.len(),
            PagePool::Q8 { values, .. } => values.len(),
        }
    }

    /// True when the pool holds no value.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks that the pool holds exactly `pages` pages of `page_size·kv_heads` slots of `d`
    /// values (`ShapeMismatch` naming `arg`, dim `len`) and, for [`PagePool::Q8`], as many
    /// scales of width `⌈d/32⌉` (`ShapeMismatch` naming `scales_arg`). The scales' contents are
    /// not read ([`crate::quant`] says what any scale means).
    pub fn expect_pages(
        &self,
        (arg, scales_arg): (&'static str, &'static str),
        pages: usize,
        slots: usize,
        d: usize,
    ) -> Result<()> {
        expect_dim(arg, "len", checked_product(arg, &[pages, slots, d])?, self.len())?;
        if let PagePool::Q8 { scales, .. } = self {
            let n = checked_product(scales_arg, &[pages, slots, q8_blocks(d)])?;
            expect_dim(scales_arg, "len", n, scales.len())?;
        }
        Ok(())
    }
}

impl PagePoolMut<'_> {
    /// The same pool, read-only.
    pub fn as_ref(&self) -> PagePool<'_> {
        match self {
            PagePoolMut::F32(x) => PagePool::F32(x),
            PagePoolMut::BF16(x) => PagePool::BF16(x),
            PagePoolMut::F16(x) => PagePool::F16(x),
            PagePoolMut::Q8 { values, scales } => PagePool::Q8 { values, scales },
        }
    }
}

/// A paged K/V cache: key and value pools of `num_pages` pages of `page_size` token slots,
/// each slot `kv_heads` heads of `dk` (keys) or `dv` (values) contiguous values, so the pools
/// are `[num_pages, page_size, kv_heads, d]` row-major, each in its own storage type
/// ([`PagePool`]: f32, bf16, f16 or int8 with block scales; keys and values may differ). Sequence `b` holds `seq_lens[b]` keys;
/// its key `j` lives in slot `j mod page_size` of page `block_table[b·max_pages + j /
/// page_size]`. Pages may be shared between sequences (a common prefix) and listed in any
/// order.
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a> {
    /// The key pool, `num_pages·page_size·kv_heads·dk` values (and their scales).
    pub k: PagePool<'a>,
    /// The value pool, `num_pages·page_size·kv_heads·dv` values (and their scales).
    pub v: PagePool<'a>,
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
    /// lengths (whole pages, the same count for keys and values; `ShapeMismatch` naming `k` or
    /// `v`, and `k_scales` or `v_scales` for an int8 pool whose scales are not as many slots),
    /// the block table's length, each sequence fitting its row, and every page a sequence uses
    /// being in the pool.
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
        let slots = checked_product("k", &[self.page_size, self.kv_heads])?;
        let pages = self.k.len() / checked_product("k", &[slots, self.dk])?;
        self.k.expect_pages(("k", "k_scales"), pages, slots, self.dk)?;
        self.v.expect_pages(("v", "v_scales"), pages, slots, self.dv)?;
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
    /// head `h`, for a width `d` (`dk` for `k`, `dv` for `v`; `⌈d/32⌉` for the scales of an
    /// int8 pool). Valid after
    /// [`check`](Self::check), for `j < seq_lens[b]`.
    pub fn slot(&self, b: usize, j: usize, h: usize, d: usize) -> usize {
        let page = self.block_table[b * self.max_pages + j / self.page_size] as usize;
        ((page * self.page_size + j % self.page_size) * self.kv_heads + h) * d
    }
}

/// A paged K/V cache to append to: the pools of a [`PagedKv`] borrowed mutably, with the same
/// block table and the lengths *before* the append. Appending `n_b` rows to sequence `b`
/// writes its keys and values `seq_lens[b] .. seq_lens[b] + n_b`; the caller then grows its
/// lengths by `n_b`.
#[derive(Debug)]
pub struct PagedKvMut<'a> {
    /// The key pool, `num_pages·page_size·kv_heads·dk` values (and their scales).
    pub k: PagePoolMut<'a>,
    /// The value pool, `num_pages·page_size·kv_heads·dv` values (and their scales).
    pub v: PagePoolMut<'a>,
    /// Token slots per page: a power of two from 16 to 256.
    pub page_size: usize,
    /// K/V heads per slot.
    pub kv_heads: usize,
    /// Key width (at least 1).
    pub dk: usize,
    /// Value width.
    pub dv: usize,
    /// `[batch, max_pages]` row-major page indices.
    pub block_table: &'a [u32],
    /// Entries per row of `block_table`.
    pub max_pages: usize,
    /// Keys each sequence holds before the append; its length is the batch.
    pub seq_lens: &'a [usize],
}

impl PagedKvMut<'_> {
    /// The same cache, read-only.
    pub fn as_ref(&self) -> PagedKv<'_> {
        PagedKv {
            k: self.k.as_ref(),
            v: self.v.as_ref(),
            page_size: self.page_size,
            kv_heads: self.kv_heads,
            dk: self.dk,
            dv: self.dv,
            block_table: self.block_table,
            max_pages: self.max_pages,
            seq_lens: self.seq_lens,
        }
    }

    /// Checks an append of `new.range(b).len()` rows to each sequence `b` and returns the page
    /// count. Errors, in this order: those of [`PagedKv::check`] on the cache as it is;
    /// `ShapeMismatch { arg: "cu_seqlens_new" }` when `new` counts another number of sequences;
    /// `InvalidParameter { arg: "seq_lens" }` when a grown sequence would overflow `usize` or
    /// outgrow its row of the block table; `OutOfBounds { arg: "block_table" }` when a page it
    /// would write is not in the pool; `InvalidParameter { arg: "block_table" }` when a slot
    /// would be written twice (two sequences, or one through a page listed twice in its row)
    /// or a written slot is one that a sequence already holds (a shared page is read-only).
    pub fn check_append(&self, new: &SeqOffsets<'_>) -> Result<usize> {
        let pages = self.as_ref().check()?;
        expect_dim("cu_seqlens_new", "sequences", self.seq_lens.len(), new.count())?;
        let ps = self.page_size;
        // Slot ranges `(page, first, end, written)`: one per page a sequence holds or writes.
        let mut spans: Vec<(usize, usize, usize, bool)> = Vec::new();
        for (b, &len) in self.seq_lens.iter().enumerate() {
            let end = len.checked_add(new.range(b).len()).ok_or(Error::InvalidParameter {
                arg: "seq_lens",
                requirement: "a sequence's length after the append overflows",
            })?;
            if end.div_ceil(ps) > self.max_pages {
                return Err(Error::InvalidParameter {
                    arg: "seq_lens",
                    requirement: "a sequence is longer than its row of the block table holds",
                });
            }
            let row = &self.block_table[b * self.max_pages..][..end.div_ceil(ps)];
            if let Some(&p) = row.iter().find(|&&p| p as usize >= pages) {
                return Err(Error::OutOfBounds {
                    arg: "block_table",
                    required: p as usize + 1,
                    len: pages,
                });
            }
            for (written, range) in [(false, 0..len), (true, len..end)] {
                let mut j = range.start;
                while j < range.end {
                    let stop = (j / ps + 1) * ps;
                    let stop = stop.min(range.end);
                    spans.push((row[j / ps] as usize, j % ps, j % ps + (stop - j), written));
                    j = stop;
                }
            }
        }
        // Sorted by page and first slot, a span overlaps an earlier one of its page iff it
        // starts before that one's end; a written span may overlap nothing, a held one no
        // written span (held spans may share slots: read-only prefix pages).
        spans.sort_unstable();
        let (mut page, mut end_any, mut end_written) = (usize::MAX, 0, 0);
        for &(p, lo, hi, written) in &spans {
            if p != page {
                (page, end_any, end_written) = (p, 0, 0);
            }
            if lo < end_written || (written && lo < end_any) {
                return Err(Error::InvalidParameter {
                    arg: "block_table",
                    requirement: "a written slot must be written once and held by no sequence",
                });
            }
            end_any = end_any.max(hi);
            if written {
                end_written = end_written.max(hi);
            }
        }
        Ok(pages)
    }

    /// The index in the pool of element 0 of slot `j` of sequence `b`, head `h`, for a width
    /// `d`, as [`PagedKv::slot`]. Valid after [`check_append`](Self::check_append), for
    /// `j < seq_lens[b] + n_b`.
    pub fn slot(&self, b: usize, j: usize, h: usize, d: usize) -> usize {
        self.as_ref().slot(b, j, h, d)
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
            k: PagePool::F32(&k),
            v: PagePool::F32(&v),
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
        let e = PagedKv { v: PagePool::F32(&v[1..]), ..cache }.check().unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { arg: "v", .. }), "{e:?}");
        let e = PagedKv { block_table: &table[1..], ..cache }.check().unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { arg: "block_table", .. }), "{e:?}");
    }

    #[test]
    fn typed_pools_are_checked() {
        // 3 pages of 16 slots, 2 heads; dk = 40 (two scale blocks), dv = 2 (one).
        let (kq, ks) = (vec![0i8; 3 * 16 * 2 * 40], vec![0.0f32; 3 * 16 * 2 * 2]);
        let vh = vec![bf16::ZERO; 3 * 16 * 2 * 2];
        let table = [2u32, 0];
        let lens = [20usize];
        let cache = PagedKv {
            k: PagePool::Q8 { values: &kq, scales: &ks },
            v: PagePool::from(&vh),
            page_size: 16,
            kv_heads: 2,
            dk: 40,
            dv: 2,
            block_table: &table,
            max_pages: 2,
            seq_lens: &lens,
        };
        assert_eq!(cache.check(), Ok(3));
        assert_eq!((cache.k.dtype(), cache.v.dtype()), (DType::Q8, DType::BF16));
        // The scales of key 17, head 1: the slot index at width ⌈40/32⌉ = 2.
        assert_eq!(cache.slot(0, 17, 1, 2), 6);
        let k = PagePool::Q8 { values: &kq, scales: &ks[1..] };
        let e = PagedKv { k, ..cache }.check().unwrap_err();
        assert_eq!(
            e,
            Error::ShapeMismatch { arg: "k_scales", dim: "len", expected: 192, actual: 191 }
        );
        let v = PagePool::Q8 { values: &kq[..3 * 16 * 2 * 2], scales: &ks[..3 * 16 * 2] };
        assert_eq!(PagedKv { v, ..cache }.check(), Ok(3));
        let v = PagePool::Q8 { values: &kq[..3 * 16 * 2 * 2], scales: &ks };
        let e = PagedKv { v, ..cache }.check().unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { arg: "v_scales", .. }), "{e:?}");
        let e = PagedKv { v: PagePool::from(&vh[2..]), ..cache }.check().unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { arg: "v", .. }), "{e:?}");
    }

    #[test]
    fn appends_are_checked() {
        let (mut k, mut v) = (vec![0.0f32; 4 * 16], vec![0.0f32; 4 * 16]);
        // Sequence 0 holds 20 keys in pages 2, 0; sequence 1 shares page 2 as its prefix (16
        // keys) and continues in page 1; page 3 is free.
        let table = [2u32, 0, 2, 1];
        let lens = [20usize, 16];
        let mut cache = PagedKvMut {
            k: PagePoolMut::F32(&mut k),
            v: PagePoolMut::F32(&mut v),
            page_size: 16,
            kv_heads: 1,
            dk: 1,
            dv: 1,
            block_table: &table,
            max_pages: 2,
            seq_lens: &lens,
        };
        let append = |cache: &PagedKvMut<'_>, cu: &[usize]| {
            cache.check_append(&SeqOffsets::new("cu_seqlens_new", cu).unwrap())
        };
        assert_eq!(append(&cache, &[0, 12, 28]), Ok(4));
        assert_eq!(cache.slot(1, 17, 0, 1), 16 + 1);
        let e = append(&cache, &[0, 13, 13]).unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { arg: "seq_lens", .. }), "{e:?}");
        let e = append(&cache, &[0, 1]).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { arg: "cu_seqlens_new", .. }), "{e:?}");
        // Sequence 1 continuing in page 0 would write its slot 0, which sequence 0 holds.
        let shared = [2u32, 0, 2, 0];
        cache.block_table = &shared;
        let e = append(&cache, &[0, 0, 1]).unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { arg: "block_table", .. }), "{e:?}");
        // Both sequences at 16 keys continuing in page 0 would write its slot 0 twice.
        let lens = [16usize, 16];
        cache.seq_lens = &lens;
        let e = append(&cache, &[0, 1, 2]).unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { arg: "block_table", .. }), "{e:?}");
        assert_eq!(append(&cache, &[0, 1, 1]), Ok(4));
        // A page listed twice in one row: the sequence's keys 16.. land on its own prefix.
        let twice = [2u32, 2, 3, 1];
        let lens = [16usize, 0];
        cache.block_table = &twice;
        cache.seq_lens = &lens;
        let e = append(&cache, &[0, 1, 1]).unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { arg: "block_table", .. }), "{e:?}");
        assert_eq!(append(&cache, &[0, 0, 17]), Ok(4));
        let far = [2u32, 7, 3, 1];
        cache.block_table = &far;
        let e = append(&cache, &[0, 1, 1]).unwrap_err();
        assert_eq!(e, Error::OutOfBounds { arg: "block_table", required: 8, len: 4 });
    }
}
