//! Shared, checked destination for the parallel flash loop: the output tensor and the optional
//! logsumexp vector, written row by row by many tasks at once.
//!
//! The output is a strided 4-D view (e.g. `[batch, seq, heads, dim]` storage interleaves the
//! rows of different heads), so it cannot be split into disjoint `&mut` slices per task. The
//! view was checked injective by `check_attention` (distinct `(b, h, i, d)` → distinct
//! elements), and every task owns a distinct set of `(b, h, i)` rows, so concurrent writes
//! never touch the same element. That argument is the one `unsafe` contract of this module.

use std::marker::PhantomData;

use attn_reference::Tensor4Layout;

/// Row writer over the output tensor and the logsumexp vector.
pub(crate) struct Sink<'a> {
    o: *mut f32,
    o_len: usize,
    layout: Tensor4Layout,
    lse: *mut f32,
    lse_len: usize,
    rows: [usize; 2],
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: the sink only hands out writes to rows, and `write_row`'s contract forbids two
// threads writing the same row; the borrowed slices outlive the sink.
unsafe impl Send for Sink<'_> {}
// SAFETY: as above.
unsafe impl Sync for Sink<'_> {}

impl<'a> Sink<'a> {
    /// Wraps the output (already checked by `check_attention`) and the optional logsumexp
    /// vector of `batch·heads·nq` floats.
    pub(crate) fn new(o: &'a mut [f32], layout: Tensor4Layout, lse: Option<&'a mut [f32]>) -> Self {
        let (lse, lse_len) = match lse {
            Some(l) => (l.as_mut_ptr(), l.len()),
            None => (std::ptr::null_mut(), 0),
        };
        Sink {
            o: o.as_mut_ptr(),
            o_len: o.len(),
            layout,
            lse,
            lse_len,
            rows: [layout.dims[1], layout.dims[2]],
            _borrow: PhantomData,
        }
    }

    /// Writes output row `(b, h, i)`: element `d` gets `value(d)` for `d < dv`, and the
    /// logsumexp entry gets `lse` when a logsumexp vector was given. Indices outside the
    /// checked view panic instead of writing.
    ///
    /// # Safety
    /// No other thread may write row `(b, h, i)` during this call.
    pub(crate) unsafe fn write_row(
        &self,
        b: usize,
        h: usize,
        i: usize,
        lse: f32,
        value: impl Fn(usize) -> f32,
    ) {
        let [_, heads, nq, dv] = self.layout.dims;
        assert!(b < self.layout.dims[0] && h < heads && i < nq);
        for d in 0..dv {
            let idx = self.layout.index(b, h, i, d);
            assert!(idx < self.o_len);
            // SAFETY: in bounds (checked); no other thread writes this row (caller), and the
            // view is injective, so no other row maps to this element.
            unsafe { *self.o.add(idx) = value(d) };
        }
        if !self.lse.is_null() {
            let idx = (b * self.rows[0] + h) * self.rows[1] + i;
            assert!(idx < self.lse_len);
            // SAFETY: in bounds; entry (b, h, i) belongs to this row only.
            unsafe { *self.lse.add(idx) = lse };
        }
    }
}
