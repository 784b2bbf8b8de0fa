//! Shared, checked destination for the parallel flash loop: the output tensor and the optional
//! logsumexp vector, written row by row by many tasks at once.
//!
//! The output is a strided 4-D view (e.g. `[batch, seq, heads, dim]` storage interleaves the
//! rows of different heads), so it cannot be split into disjoint `&mut` slices per task. The
//! view was checked injective by `check_attention` (distinct `(b, h, i, d)` → distinct
//! elements), and each `(b, h, i)` row may be claimed once: the sink records which rows were
//! claimed (one bit per row, set by an atomic `or` per word, so a tile of rows costs one or two)
//! and panics on a second claim, so two tasks can never write the same element, whatever the
//! callers' tiling. A claim ([`Rows`]) writes its rows through `&mut`. That makes
//! [`Sink::claim`] and [`Sink::write_row`] safe; the raw-pointer writes they rest on are the
//! only `unsafe` of this module.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use attn_core::{bf16, f16, AnyMut, Tensor4Layout};

use crate::arch::convert::SimdElement;
use crate::arch::{load, Simd, MAX_LANES};

/// The output's elements, of whichever type: rows are written as f32 values rounded once to
/// it (nearest, ties to even; see [`attn_core::Element::from_f32`]).
#[derive(Clone, Copy)]
enum Out {
    F32(*mut f32),
    BF16(*mut bf16),
    F16(*mut f16),
}

/// Row writer over the output tensor and the logsumexp vector.
pub(crate) struct Sink<'a> {
    o: Out,
    o_len: usize,
    layout: Tensor4Layout,
    lse: *mut f32,
    lse_len: usize,
    rows: [usize; 2],
    /// Entries between the logsumexps of consecutive heads: `nq` unless
    /// [`lse_head_stride`](Self::lse_head_stride) says otherwise.
    lse_stride: usize,
    /// Bit `k mod 64` of word `k / 64`, `k = (b·heads + h)·nq + i`: row `(b, h, i)` has been
    /// claimed by a writer.
    written: Vec<AtomicU64>,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: the sink only hands out writes to rows, and `write_row` claims each row (atomically)
// before writing it, so two threads never write the same element; the borrowed slices outlive
// the sink.
unsafe impl Send for Sink<'_> {}
// SAFETY: as above.
unsafe impl Sync for Sink<'_> {}

impl<'a> Sink<'a> {
    /// Wraps the output (already checked by `check_attention`) and the optional logsumexp
    /// vector of `batch·heads·nq` floats.
    pub(crate) fn new(o: &'a mut [f32], layout: Tensor4Layout, lse: Option<&'a mut [f32]>) -> Self {
        Self::with(Out::F32(o.as_mut_ptr()), o.len(), layout, lse)
    }

    /// [`new`](Self::new) for an output of any element type.
    pub(crate) fn new_any(o: AnyMut<'a>, lse: Option<&'a mut [f32]>) -> Self {
        match o {
            AnyMut::F32(t) => {
                Self::with(Out::F32(t.data.as_mut_ptr()), t.data.len(), t.layout, lse)
            }
            AnyMut::BF16(t) => {
                Self::with(Out::BF16(t.data.as_mut_ptr()), t.data.len(), t.layout, lse)
            }
            AnyMut::F16(t) => {
                Self::with(Out::F16(t.data.as_mut_ptr()), t.data.len(), t.layout, lse)
            }
        }
    }

    /// The sink over `o_len` output elements at `o` (borrowed for `'a` by the caller).
    fn with(o: Out, o_len: usize, layout: Tensor4Layout, lse: Option<&'a mut [f32]>) -> Self {
        let (lse, lse_len) = match lse {
            Some(l) => (l.as_mut_ptr(), l.len()),
            None => (std::ptr::null_mut(), 0),
        };
        Sink {
            o,
            o_len,
            layout,
            lse,
            lse_len,
            rows: [layout.dims[1], layout.dims[2]],
            lse_stride: layout.dims[2],
            // One bit per row. The callers return early when there is nothing to write, so
            // the rows are bounded by the output view (injective, with elements) or by the
            // logsumexp slice; saturating, so a product past usize::MAX cannot wrap.
            written: (0..layout.dims[0]
                .saturating_mul(layout.dims[1])
                .saturating_mul(layout.dims[2])
                .div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            _borrow: PhantomData,
        }
    }

    /// The sink with row `(b, h, i)`'s logsumexp at `(b·heads + h)·stride + i` of the slice
    /// (`stride ≥ nq`): the pieces of a packed batch write their queries' columns of an
    /// `[hq, total_q]` logsumexp matrix, given from the piece's first column on.
    pub(crate) fn lse_head_stride(mut self, stride: usize) -> Self {
        assert!(stride >= self.rows[1], "logsumexp rows overlap");
        self.lse_stride = stride;
        self
    }

    /// True when a logsumexp vector was given (else [`write_row`](Self::write_row) ignores its
    /// `lse`).
    pub(crate) fn has_lse(&self) -> bool {
        !self.lse.is_null()
    }

    /// Claims rows `i0..i0 + n` of head `(b, h)` for the caller, who then writes them through
    /// the returned [`Rows`]. Each row may be claimed once per sink: a second claim of a row,
    /// or rows outside the checked view, panic instead (both would be a bug of the caller's
    /// tiling; the rows of a claim that panicked stay claimed).
    pub(crate) fn claim(&self, b: usize, h: usize, i0: usize, n: usize) -> Rows<'_, 'a> {
        let [batch, heads, nq, _] = self.layout.dims;
        assert!(b < batch && h < heads && i0 <= nq && n <= nq - i0);
        // Bounded by the view's rows (checked above), whose product fits (see `with`).
        let start = (b * self.rows[0] + h) * self.rows[1] + i0;
        let (mut k, end) = (start, start + n);
        while k < end {
            let (w, bit) = (k / 64, k % 64);
            let len = (64 - bit).min(end - k);
            let mask = (u64::MAX >> (64 - len)) << bit;
            let before = self.written[w].fetch_or(mask, Ordering::Relaxed);
            assert!(before & mask == 0, "a row of ({b}, {h}, {i0}..{}) claimed twice", i0 + n);
            k += len;
        }
        Rows { sink: self, b, h, i0, n }
    }

    /// Writes output row `(b, h, i)` (claimed for it alone, see [`claim`](Self::claim)):
    /// element `d` gets `value(d)` for `d < dv`, and the logsumexp entry gets `lse` when a
    /// logsumexp vector was given.
    #[inline(always)]
    pub(crate) fn write_row<S: Simd>(
        &self,
        s: S,
        b: usize,
        h: usize,
        i: usize,
        lse: f32,
        value: impl Fn(usize) -> f32,
    ) {
        self.claim(b, h, i, 1).write(s, 0, lse, value);
    }
}

/// Rows `i0..i0 + n` of head `(b, h)` of a [`Sink`], claimed by one writer
/// ([`Sink::claim`]).
pub(crate) struct Rows<'s, 'a> {
    sink: &'s Sink<'a>,
    b: usize,
    h: usize,
    i0: usize,
    n: usize,
}

impl Rows<'_, '_> {
    /// Writes row `i0 + r` (`r < n`; panics otherwise): element `d` gets `value(d)` for
    /// `d < dv`, and the logsumexp entry gets `lse` when a logsumexp vector was given. A row
    /// with contiguous elements is rounded to the output type and stored with `s`'s vectors.
    /// Through `&mut`: while one claim exists, only its holder writes its rows.
    #[inline(always)]
    pub(crate) fn write<S: Simd>(
        &mut self,
        s: S,
        r: usize,
        lse: f32,
        value: impl Fn(usize) -> f32,
    ) {
        assert!(r < self.n);
        let (sink, b, h, i) = (self.sink, self.b, self.h, self.i0 + r);
        let dv = sink.layout.dims[3];
        match sink.o {
            Out::F32(o) => sink.put(s, o, b, h, i, dv, value),
            Out::BF16(o) => sink.put(s, o, b, h, i, dv, value),
            Out::F16(o) => sink.put(s, o, b, h, i, dv, value),
        }
        if !sink.lse.is_null() {
            // Distinct rows, distinct entries: `i < nq ≤ lse_stride`.
            let row = (b * sink.rows[0] + h).saturating_mul(sink.lse_stride).saturating_add(i);
            assert!(row < sink.lse_len);
            // SAFETY: in bounds; entry (b, h, i) belongs to this row only, claimed by `self`.
            unsafe { *sink.lse.add(row) = lse };
        }
    }
}

impl Sink<'_> {
    /// The elements of row `(b, h, i)`, claimed by the caller ([`Rows`]), rounded to `T` at `o`: by
    /// vectors of `value`s when the row is contiguous (the same bits: [`SimdElement::store`]
    /// rounds as [`attn_core::Element::from_f32`] does), element by element otherwise. A
    /// scalar loop with the index and the rounding per element took 8 % of a causal bf16 flash
    /// call at d 64.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn put<S: Simd, T: SimdElement>(
        &self,
        s: S,
        o: *mut T,
        b: usize,
        h: usize,
        i: usize,
        dv: usize,
        value: impl Fn(usize) -> f32,
    ) {
        if dv == 0 {
            return;
        }
        let (base, cs) = (self.layout.index(b, h, i, 0), self.layout.strides[3]);
        // The row's elements are `base + d·cs`, `d < dv`: all below the last one.
        let last = (dv - 1).checked_mul(cs).and_then(|x| x.checked_add(base));
        assert!(last.is_some_and(|x| x < self.o_len));
        // SAFETY (both writes): in bounds (checked); the caller claimed the row, so no other
        // write of it can happen, and the view is injective, so no other row maps to these
        // elements.
        let (l, mut d) = (S::LANES, 0);
        if cs == 1 {
            let mut lanes = [0.0f32; MAX_LANES];
            while d + l <= dv {
                for (e, x) in lanes[..l].iter_mut().enumerate() {
                    *x = value(d + e);
                }
                unsafe { T::store(s, o.add(base + d), load(s, &lanes)) };
                d += l;
            }
        }
        for d in d..dv {
            unsafe { *o.add(base + d * cs) = T::from_f32(value(d)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Portable;

    #[test]
    fn each_row_is_written_once() {
        let layout = Tensor4Layout::bhsd(1, 2, 3, 4);
        let (mut o, mut lse) = (vec![0.0f32; 24], vec![0.0f32; 6]);
        let sink = Sink::new(&mut o, layout, Some(&mut lse));
        sink.write_row(Portable, 0, 1, 2, -1.5, |d| d as f32);
        let second = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sink.write_row(Portable, 0, 1, 2, 0.0, |_| 9.0)
        }));
        assert!(second.is_err(), "a second write of a row must panic");
        let out_of_view = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sink.write_row(Portable, 0, 2, 0, 0.0, |_| 9.0)
        }));
        assert!(out_of_view.is_err(), "a row outside the view must panic");
        drop(sink);
        assert_eq!(&o[20..24], &[0.0, 1.0, 2.0, 3.0]);
        assert_eq!(lse[5], -1.5);
        assert!(o[..20].iter().all(|&x| x == 0.0) && lse[..5].iter().all(|&x| x == 0.0));
    }

    #[test]
    fn claims_of_ranges_are_exclusive_across_words() {
        // 150 rows: heads of 50 rows straddle the 64-row words of the claim bits.
        let layout = Tensor4Layout::bhsd(1, 3, 50, 2);
        let mut o = vec![0.0f32; 300];
        let sink = Sink::new(&mut o, layout, None);
        let twice = |b, h, i0, n| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                sink.claim(b, h, i0, n);
            }))
            .is_err()
        };
        let mut head1 = sink.claim(0, 1, 0, 50); // rows 50..100: bits 50.. of word 0, ..36 of 1
        head1.write(Portable, 49, 0.0, |d| 1.0 + d as f32);
        sink.claim(0, 0, 10, 40);
        sink.claim(0, 2, 0, 50);
        let mut head0 = sink.claim(0, 0, 0, 10);
        head0.write(Portable, 9, 0.0, |_| 7.0);
        assert!(twice(0, 1, 49, 1), "the last row of a claimed range");
        assert!(twice(0, 0, 9, 2), "a range overlapping claimed ones at both ends");
        assert!(twice(0, 0, 50, 1) && twice(0, 3, 0, 1), "rows outside the view");
        let write_past = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            head0.write(Portable, 10, 0.0, |_| 9.0)
        }));
        assert!(write_past.is_err(), "a row past the claim");
        drop(sink);
        assert_eq!(&o[198..200], &[1.0, 2.0]);
        assert_eq!(&o[18..20], &[7.0, 7.0]);
        assert_eq!(o.iter().filter(|&&x| x != 0.0).count(), 4);
    }
}
