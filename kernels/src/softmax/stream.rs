//! The mechanisms of streamed softmax rows: a row's pass C deferred into the next row's
//! passes ([`Drain`]), the prefetch order of rows several rows ahead ([`FarOrder`]), and the
//! staging buffer's size and page phase. Calls whose output is too large to stay in cache
//! write it with non-temporal stores through these (`mod.rs`, `STREAM_MIN_BYTES`).

use std::cell::Cell;

use crate::arch::{
    addr, lanes_to_boundary, load_cells, load_tail_cells, store_tail_cells, stream_cells, Simd,
};

/// The order in which a row several rows ahead is prefetched (`FAR`): the row is cut into a
/// power of two of equal runs of at most a 4 KiB page each (a page each for rows of 1, 2, 4, 8
/// pages; 5 pages make 8 runs of 0.6 page), and the prefetches take one line of each run in
/// turn. Each run is then a sequential stream of its own, and the L2 hardware prefetcher runs
/// ahead on every stream at once: four streams in flight instead of one for 16 KiB rows. The
/// power of two makes each offset a mask, a shift and a multiply of a counter.
#[derive(Clone, Copy, Debug)]
pub(super) struct FarOrder {
    /// Runs − 1 (runs are a power of two).
    mask: usize,
    /// log₂ runs.
    shift: u32,
    /// Floats per run (a multiple of 16: whole lines).
    per: usize,
    /// Prefetches so far.
    q: usize,
}

impl FarOrder {
    /// Lines of 16 floats per run, at most: one 4 KiB page.
    const PAGE_LINES: usize = 64;

    /// Inlined so that the `!FAR` instances of `exp_sum_pass`, which never use it, drop it.
    #[inline(always)]
    pub(super) fn new(len: usize) -> Self {
        let lines = len.div_ceil(16);
        let chunks = lines.div_ceil(Self::PAGE_LINES).max(1).next_power_of_two();
        let per = lines.div_ceil(chunks) * 16;
        FarOrder { mask: chunks - 1, shift: chunks.trailing_zeros(), per, q: 0 }
    }

    /// The number of runs.
    #[inline(always)]
    fn chunks(&self) -> usize {
        self.mask + 1
    }

    /// Floats covered by `span() / 16` calls of [`next`](Self::next): every line of the row,
    /// and fewer than `chunks` lines past its end.
    #[inline(always)]
    pub(super) fn span(&self) -> usize {
        self.chunks() * self.per
    }

    /// The offset of the next line to prefetch; a permutation of the lines of `0..span()`.
    #[inline(always)]
    pub(super) fn next(&mut self) -> usize {
        let q = self.q;
        self.q += 1;
        (q & self.mask) * self.per + (q >> self.shift) * 16
    }
}

/// Vectors of the pending pass C that a streamed row writes per iteration of its pass A
/// ([`UNROLL`] vectors read) and per group of its pass B ([`EXP_UNROLL`] vectors): a quarter
/// of it during pass A (a short pass, reading L2) and the rest during pass B. In a row as long
/// as the previous one, this pace keeps the drain ahead of pass B's stores to the shared stage
/// until the last four groups or so, before each of which [`Drain::clear`] writes about one
/// vector more. Writing faster than that during the exp stalls it once the write-combining
/// buffers fill; no other split was measurably better.
///
/// [`UNROLL`]: super::passes::UNROLL
/// [`EXP_UNROLL`]: crate::math::exp::EXP_UNROLL
pub(super) const DRAIN_PER_A: usize = 1;
/// See [`DRAIN_PER_A`].
pub(super) const DRAIN_PER_B: usize = 3;

/// A streamed row's pass C, deferred: `y_j = w_j · r` for `j < end`, written with
/// non-temporal stores a few vectors at a time during the next row's passes A and B
/// ([`DRAIN_PER_A`], [`DRAIN_PER_B`]), so that the row's write stream overlaps the next
/// row's reads and exp instead of following them. The next row stages its terms in the same
/// buffer, so before each group's stores it makes the drain read past them
/// ([`clear`](Self::clear)); [`finish`](Self::finish) writes what is left. Left unfenced: see
/// [`RowJob::stage`]. The stage is shared cells (the drain reads them while the next row's
/// pass B writes the part already read), the output row is this drain's alone.
///
/// [`RowJob::stage`]: super::dispatch::RowJob::stage
pub(super) struct Drain<'a, S: Simd> {
    /// The token.
    s: S,
    /// The row's terms `exp(z_j − m)`: `end` cells of the stage.
    w: &'a [Cell<f32>],
    /// Where `w` starts in the stage (for [`clear`](Self::clear)).
    w0: usize,
    /// The output row, `end` cells.
    y: &'a [Cell<f32>],
    /// The next element to write: `y[at..]` starts on a `LANES × 4`-byte boundary where the
    /// ISA streams.
    at: usize,
    /// `1/Σ` of the row, in every lane.
    r: S::V,
}

impl<'a, S: Simd> Drain<'a, S> {
    /// Nothing pending.
    #[inline(always)]
    pub(super) fn none(s: S) -> Self {
        Drain { s, w: &[], w0: 0, y: &[], at: 0, r: s.splat(0.0) }
    }

    /// The pass C `y_j = w_j · r`, `j < y.len()`, where `w` is the `y.len()` cells at `w0` of
    /// `stage`: writes the elements before `y`'s first `LANES × 4`-byte boundary now (an
    /// ordinary store), the rest later. Until the drain is finished, `stage` should be written
    /// only where the drain has read it ([`clear`](Self::clear)) and `y` not at all (else
    /// the output is wrong, never unsound).
    #[inline(always)]
    pub(super) fn new(
        s: S,
        (stage, w0): (&'a [Cell<f32>], usize),
        y: &'a [Cell<f32>],
        r: f32,
    ) -> Self {
        let n = y.len();
        let w = &stage[w0..w0 + n];
        let r = s.splat(r);
        let head = if S::HAS_STREAM { lanes_to_boundary::<S, _>(y) } else { 0 };
        if head > 0 {
            store_tail_cells(s, &y[..head], s.mul(load_tail_cells(s, &w[..head]), r));
        }
        Drain { s, w, w0, y, at: head, r }
    }

    /// The row's length.
    #[inline(always)]
    fn end(&self) -> usize {
        self.y.len()
    }

    /// Writes pending vectors until every stage element below `p` (an index into the stage)
    /// has been read, or nothing is pending. A streamed row's pass B stages its terms in the
    /// buffer the previous row's drain is still reading ([`streamed_rows_loop`]) and calls this
    /// before each group's stores (and the ragged last group's), so that no store overtakes
    /// the drain. At the drain's pace ([`DRAIN_PER_A`] vectors per iteration of pass A,
    /// [`DRAIN_PER_B`] per group of pass B) it is ahead of pass B's stores in rows of equal
    /// length and page phase until the last few groups; this test makes it hold for any
    /// lengths and phases.
    ///
    /// [`streamed_rows_loop`]: super::dispatch
    #[inline(always)]
    pub(super) fn clear(&mut self, p: usize) {
        let l = S::LANES;
        while self.at < self.end() && self.w0 + self.at < p {
            if self.at + l <= self.end() {
                self.write(self.at);
                self.at += l;
            } else {
                self.finish();
            }
        }
    }

    /// `y_j = w_j · r` for the whole vector at `at` (`at + LANES ≤ end`), by a non-temporal
    /// store.
    #[inline(always)]
    fn write(&self, at: usize) {
        let s = self.s;
        stream_cells(s, &self.y[at..], s.mul(load_cells(s, &self.w[at..]), self.r));
    }

    /// Up to `K` more whole vectors: one test for all `K` while that many are left.
    #[inline(always)]
    pub(super) fn step<const K: usize>(&mut self) {
        let l = S::LANES;
        if self.at + K * l <= self.end() {
            for k in 0..K {
                self.write(self.at + k * l);
            }
            self.at += K * l;
        } else {
            while self.at + l <= self.end() {
                self.write(self.at);
                self.at += l;
            }
        }
    }

    /// Everything left, the partial last vector by an ordinary store; nothing is pending
    /// after it.
    #[inline(always)]
    pub(super) fn finish(&mut self) {
        let (s, l) = (self.s, S::LANES);
        while self.at + l <= self.end() {
            self.write(self.at);
            self.at += l;
        }
        if self.at < self.end() {
            let at = self.at;
            store_tail_cells(s, &self.y[at..], s.mul(load_tail_cells(s, &self.w[at..]), self.r));
        }
        self.at = self.end();
    }
}

/// Bytes per page, for [`phase_skip`].
pub(super) const PAGE_BYTES: usize = 4096;

/// The floats to skip from `buf` to reach the offset within a 4 KiB page that `like` has
/// (why a stage sits in phase with its output row: `same_page_phase` in `mod.rs`).
pub(super) fn phase_skip<T, U>(buf: &[T], like: &[U]) -> usize {
    addr(like).wrapping_sub(addr(buf)) % PAGE_BYTES / 4
}

/// The stage a streamed `RowsJob` with rows of `cols` floats needs: one row, with room to
/// sit in phase with its output row. The row being computed stages its terms in the buffer the
/// previous row's drain is reading, behind it ([`Drain::clear`]): the input row and the stage
/// take 32 KiB of the 48 KiB L1 at 4096 columns, where a stage of two rows (one being
/// computed, one being written) filled it and spilled.
pub(super) fn stage_len(cols: usize) -> usize {
    cols + PAGE_BYTES / 4
}

/// How many rows ahead a streamed call prefetches its input: the row being prefetched plus
/// the ones already in flight stay far inside the 512 KiB L2 for rows up to ~16 K columns
/// (4 × 64 KiB). One row ahead left pass A waiting on DRAM; two, four or eight ahead are within
/// the noise of each other. Those rows go to L2 only (`prefetcht1`, the `FAR` prefetch of
/// `passes::exp_sum_pass`): in L1 they evicted the row being worked on. The in-cache next-row
/// prefetch stays in L1.
pub(super) const PREFETCH_ROWS: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_order_is_a_permutation_covering_the_row() {
        for len in (0..=70).chain([1023, 1024, 1025, 2047, 4095, 4096, 4097, 5000, 16384]) {
            let mut order = FarOrder::new(len);
            let span = order.span();
            assert_eq!(span % 16, 0, "len {len}");
            assert!(span >= len && span < len + 16 * order.chunks(), "len {len}");
            let mut seen = vec![false; span / 16];
            for _ in 0..span / 16 {
                let at = order.next();
                assert_eq!(at % 16, 0, "len {len}");
                assert!(!std::mem::replace(&mut seen[at / 16], true), "len {len}: {at} twice");
            }
            assert!(seen.iter().all(|&s| s), "len {len}");
        }
        // A 16 KiB row: one line of each 4 KiB run in turn.
        let mut order = FarOrder::new(4096);
        let first: Vec<usize> = (0..6).map(|_| order.next()).collect();
        assert_eq!(first, [0, 1024, 2048, 3072, 16, 1040]);
    }
}
