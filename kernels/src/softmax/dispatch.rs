//! The softmax row entry points: the jobs `mod.rs` builds ([`RowJob`], [`RowsJob`]), the loops
//! over a block of rows (in cache, or streamed with the mechanisms of `stream.rs`), and one
//! [`Kernel`] per entry point, run by [`vectorize`] on the caller's [`Isa`]. The passes
//! themselves are `passes.rs`'s.

use super::passes::{range_pass, softmax_row_body, softmax_sum, Bias, Keep, Logits, Plain};
use super::stream::{phase_skip, stage_len, Drain, PREFETCH_ROWS};
use std::cell::Cell;

use crate::arch::{
    load, load_tail, store, store_fence, store_tail, vectorize, Floats, Isa, Kernel, Simd,
};

/// The mask of one row, as contiguous slices (the caller gathers strided masks first).
#[derive(Clone, Copy, Debug)]
pub(crate) enum RowMask<'a> {
    /// No mask (causal masks become a shorter visible prefix instead).
    None,
    /// Keep-mask, `true` = visible; length ≥ the visible prefix.
    Keep(&'a [bool]),
    /// Additive bias; length ≥ the visible prefix.
    Bias(&'a [f32]),
}

/// One row of the fused scale-mask-softmax.
#[derive(Debug)]
pub(crate) struct RowJob<'a> {
    /// The input row; `None` reads it from `y` (in place).
    pub src: Option<&'a [f32]>,
    /// The output row (all `cols` positions).
    pub y: &'a mut [f32],
    /// Positions `≥ visible` are masked (causal prefix); `visible ≤ y.len()`.
    pub visible: usize,
    /// Mask of the visible prefix.
    pub mask: RowMask<'a>,
    /// Logit scale.
    pub scale: f32,
    /// When given (length ≥ `visible`), pass B writes here and pass C writes `y` with
    /// non-temporal stores: `y` is then written once and never read. Those stores are not
    /// fenced per row: the caller runs [`store_fence`] on this
    /// thread after its last streamed row, before another thread can read `y` (a fence per
    /// row waits for the row's stores to drain, which costs a few percent).
    pub stage: Option<&'a mut [f32]>,
    /// An input row this thread handles later, prefetched during pass B so that its memory
    /// traffic overlaps this row's exp (see [`PREFETCH_ROWS`]).
    pub next: Option<&'a [f32]>,
    /// Whether the caller wants the row's logsumexp (else `softmax_row` returns 0).
    pub want_lse: bool,
}

/// A block of consecutive contiguous rows: `mod.rs`'s fast path, which runs the rows one after
/// another inside one `#[target_feature]` function, with no per-row dispatch, job or closure:
/// only the reductions and the ragged last group remain per row.
#[derive(Debug)]
pub(crate) struct RowsJob<'a> {
    /// The input rows (`y.len()` floats); `None` reads them from `y` (in place).
    pub src: Option<&'a [f32]>,
    /// The output rows, a multiple of `cols` floats.
    pub y: &'a mut [f32],
    /// Row length (`> 0`).
    pub cols: usize,
    /// The mask of the rows.
    pub mask: RowsMask<'a>,
    /// Logit scale.
    pub scale: f32,
    /// Receives each row's logsumexp when given (one per row).
    pub lse: Option<&'a mut [f32]>,
    /// When given (at least [`stage_len`]`(cols)` floats), the rows are streamed: staged here
    /// and written with non-temporal stores, each row's during the next row's passes
    /// ([`Drain`]), fenced before the job returns.
    pub stage: Option<&'a mut [f32]>,
}

/// The mask of a [`RowsJob`]'s rows.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RowsMask<'a> {
    /// No mask (`None`) or a causal one: `(offset, query rows per head, flat index of the
    /// block's first row)`; row `r` of the block is query `(first + r) % rows per head`.
    Causal(Option<(isize, usize, usize)>),
    /// Keep-mask rows with contiguous columns: row `r` of the block reads
    /// `keep[starts[r]..starts[r] + cols]`.
    Keep {
        /// The mask elements.
        keep: &'a [bool],
        /// Where each row's mask starts (one per row).
        starts: &'a [usize],
    },
    /// Additive bias rows with contiguous columns, laid out as for [`RowsMask::Keep`].
    Bias {
        /// The bias elements.
        bias: &'a [f32],
        /// Where each row's bias starts (one per row).
        starts: &'a [usize],
    },
}

/// Visible length of query row `i` under a causal mask with offset `off` over `cols` keys:
/// keys `j ≤ i + off`.
pub(crate) fn causal_visible(i: usize, off: isize, cols: usize) -> usize {
    let last = (i as isize).saturating_add(off);
    if last < 0 {
        0
    } else {
        (last as usize).saturating_add(1).min(cols)
    }
}

/// The cells of `y`, and the rows' input: `src`, or the cells themselves (in place).
#[inline(always)]
fn cells<'a>(src: Option<&'a [f32]>, y: &'a mut [f32]) -> (Floats<'a>, &'a [Cell<f32>]) {
    let y = Cell::from_mut(y).as_slice_of_cells();
    (src.map_or(Floats::from(y), Floats::from), y)
}

/// Builds the [`Logits`] for a job and runs the fused row by itself: [`softmax_row_body`],
/// streamed when the job has a stage and the ISA has non-temporal stores (the test of
/// `S::HAS_STREAM` comes first so that the portable ISA does not compile the streamed body at
/// all), its pass C then written at once. The job's lengths are those [`softmax_row`] checked.
#[inline(always)]
fn softmax_job<S: Simd>(s: S, job: RowJob<'_>) -> f32 {
    let RowJob { src, y, visible: n, mask, scale, stage, next, want_lse } = job;
    let next = Floats::from(next.unwrap_or(&[]));
    let (x, y) = cells(src, y);
    let x = x.slice(0, n);
    let stage = stage.map(|st| Cell::from_mut(st).as_slice_of_cells());
    let sc = s.splat(scale);
    let mut drain = Drain::none(s);
    macro_rules! body {
        ($z:expr, $stage:expr, $stream:literal) => {
            softmax_row_body::<S, _, $stream>(
                s,
                &$z,
                scale,
                y,
                ($stage, 0),
                next,
                want_lse,
                &mut drain,
            )
        };
    }
    macro_rules! once {
        ($z:expr) => {
            match stage {
                Some(st) if S::HAS_STREAM => {
                    let v = body!($z, st, true);
                    drain.finish();
                    v
                }
                _ => body!($z, &[], false),
            }
        };
    }
    match mask {
        RowMask::None => once!(Plain::new(s, x, sc)),
        RowMask::Keep(k) => once!(Keep::new(s, x, k, sc)),
        RowMask::Bias(b) => once!(Bias::new(s, x, b, sc)),
    }
}

/// The rows of a [`RowsJob`] with no mask or a causal one, each by [`softmax_row_body`],
/// prefetching the next row's input (so that its pass A reads L1). The loop is written out
/// rather than run through [`rows_loop`]: with the logits formed by a closure the compiler
/// allocated registers differently, one more instruction per exp group. The job's lengths are
/// those [`softmax_rows`] checked.
#[inline(always)]
fn softmax_rows_body<S: Simd>(s: S, job: RowsJob<'_>) {
    let RowsJob { src, y, cols, mask, scale, mut lse, .. } = job;
    let RowsMask::Causal(causal) = mask else { return };
    let rows = y.len() / cols;
    let (x, y) = cells(src, y);
    let sc = s.splat(scale);
    let mut none = Drain::none(s);
    for (r, yr) in y.chunks_exact(cols).enumerate() {
        let visible = causal.map_or(cols, |(off, q, i0)| causal_visible((i0 + r) % q, off, cols));
        // In place, `next` is row `r + 1` of `y`: only prefetched.
        let next = if r + 1 < rows { x.slice((r + 1) * cols, cols) } else { Floats::empty() };
        let z = Plain::new(s, x.slice(r * cols, visible), sc);
        let want_lse = lse.is_some();
        let v =
            softmax_row_body::<S, _, false>(s, &z, scale, yr, (&[], 0), next, want_lse, &mut none);
        if let Some(l) = lse.as_deref_mut() {
            l[r] = v;
        }
    }
}

/// The rows of a [`RowsJob`] with a keep-mask or a bias, each by [`softmax_row_body`]: its
/// own `#[target_feature]` function, apart from [`softmax_rows_body`], so that the unmasked
/// rows' code is compiled as it was measured. Its loop, [`rows_loop`], repeats the one
/// written out in [`softmax_rows_body`] on purpose (see there; a macro shared by both cost the
/// unmasked rows instructions too). `softmax_rows` checked every mask row against its slice.
#[inline(always)]
fn masked_rows_body<S: Simd>(s: S, job: RowsJob<'_>) {
    let sc = s.splat(job.scale);
    match job.mask {
        RowsMask::Causal(_) => {}
        RowsMask::Keep { keep, starts } => {
            rows_loop::<S, _>(s, job, |r, x| Keep::new(s, x, &keep[starts[r]..], sc))
        }
        RowsMask::Bias { bias, starts } => {
            rows_loop::<S, _>(s, job, |r, x| Bias::new(s, x, &bias[starts[r]..], sc))
        }
    }
}

/// The loop over a masked [`RowsJob`]'s rows: row `r` forms its logits by
/// `logits(r, input row)` over all `cols` columns; the next row's input is prefetched
/// meanwhile.
#[inline(always)]
fn rows_loop<'a, S: Simd, L: Logits<S>>(
    s: S,
    job: RowsJob<'a>,
    logits: impl Fn(usize, Floats<'a>) -> L,
) {
    let RowsJob { src, y, cols, scale, mut lse, .. } = job;
    let rows = y.len() / cols;
    let (x, y) = cells(src, y);
    let mut none = Drain::none(s);
    for (r, yr) in y.chunks_exact(cols).enumerate() {
        // In place, `next` is row `r + 1` of `y`: only prefetched.
        let next = if r + 1 < rows { x.slice((r + 1) * cols, cols) } else { Floats::empty() };
        let z = logits(r, x.slice(r * cols, cols));
        let want_lse = lse.is_some();
        let v =
            softmax_row_body::<S, _, false>(s, &z, scale, yr, (&[], 0), next, want_lse, &mut none);
        if let Some(l) = lse.as_deref_mut() {
            l[r] = v;
        }
    }
}

/// The rows of a streamed [`RowsJob`]: each by [`softmax_row_body`], its pass C left in a
/// [`Drain`] that the next row writes during its passes A and B, the row [`PREFETCH_ROWS`]
/// ahead prefetched into L2 meanwhile. Every row stages its terms in the same buffer, in phase
/// with its output row, behind the previous row's drain ([`stage_len`]). The last row's pass C
/// is written at the end and the stores fenced: the job's output is complete and ordered when
/// it returns. The drain pending on entry to row `r` writes row `r − 1`, never row `r`'s input
/// or output (in place, row `r − 1`'s input was consumed by its pass B). `stage` holds
/// [`stage_len`]`(cols)` cells; `logits(r, x)` forms row `r`'s logits from its visible input
/// `x` (`visible(r) ≤ cols` elements).
#[inline(always)]
fn streamed_rows_loop<'a, S: Simd, L: Logits<S>>(
    s: S,
    job: RowsJob<'a>,
    stage: &'a [Cell<f32>],
    logits: impl Fn(usize, Floats<'a>) -> L,
    visible: impl Fn(usize) -> usize,
) {
    let RowsJob { src, y, cols, scale, mut lse, .. } = job;
    let rows = y.len() / cols;
    let (x, y) = cells(src, y);
    let mut drain = Drain::<S>::none(s);
    for (r, yr) in y.chunks_exact(cols).enumerate() {
        let ahead = (r + PREFETCH_ROWS).min(rows - 1);
        let next = if ahead > r { x.slice(ahead * cols, cols) } else { Floats::empty() };
        let w0 = phase_skip(stage, yr);
        let v = softmax_row_body::<S, _, true>(
            s,
            &logits(r, x.slice(r * cols, visible(r))),
            scale,
            yr,
            (stage, w0),
            next,
            lse.is_some(),
            &mut drain,
        );
        if let Some(l) = lse.as_deref_mut() {
            l[r] = v;
        }
    }
    drain.finish();
    store_fence();
}

/// A streamed [`RowsJob`] (`stage` given), every mask kind, by [`streamed_rows_loop`].
/// `softmax_rows` checked the stage and every mask row.
#[inline(always)]
fn streamed_rows_body<S: Simd>(s: S, mut job: RowsJob<'_>) {
    let Some(stage) = job.stage.take() else { return };
    let stage = Cell::from_mut(stage).as_slice_of_cells();
    let cols = job.cols;
    let sc = s.splat(job.scale);
    match job.mask {
        RowsMask::Causal(causal) => {
            let visible =
                |r| causal.map_or(cols, |(off, q, i0)| causal_visible((i0 + r) % q, off, cols));
            streamed_rows_loop::<S, _>(s, job, stage, |_, x| Plain::new(s, x, sc), visible)
        }
        RowsMask::Keep { keep, starts } => {
            let z = |r: usize, x| Keep::new(s, x, &keep[starts[r]..], sc);
            streamed_rows_loop::<S, _>(s, job, stage, z, |_| cols)
        }
        RowsMask::Bias { bias, starts } => {
            let z = |r: usize, x| Bias::new(s, x, &bias[starts[r]..], sc);
            streamed_rows_loop::<S, _>(s, job, stage, z, |_| cols)
        }
    }
}

/// Logsumexp of a row (`x` unscaled, unmasked); writes `y_j = x_j − lse` when `y` is given
/// (`x.len()` elements).
#[inline(always)]
fn lse_row_body<S: Simd>(s: S, x: &[f32], y: Option<&mut [f32]>) -> f32 {
    let n = x.len();
    let z = Plain::new(s, Floats::from(x), s.splat(1.0));
    let none = &mut Drain::none(s);
    let (m, lo) = range_pass::<S, _, false>(s, &z, none);
    let lse = if m.is_finite() {
        let nothing = Floats::empty();
        let sum = softmax_sum::<S, _, false, false>(
            s,
            &z,
            (m, lo),
            (None, 1.0),
            (&[], 0),
            (nothing, none),
        );
        (f64::from(m) + f64::from(sum).ln()) as f32
    } else if x.iter().any(|v| v.is_nan()) {
        f32::NAN
    } else {
        m // −∞ (empty or all −∞) or +∞
    };
    if let Some(y) = y {
        debug_assert_eq!(y.len(), n);
        let l = S::LANES;
        let n = n.min(y.len());
        let (x, y, lv) = (&x[..n], &mut y[..n], s.splat(lse));
        let mut j = 0;
        while j + l <= n {
            store(s, &mut y[j..], s.sub(load(s, &x[j..]), lv));
            j += l;
        }
        if j < n {
            store_tail(s, &mut y[j..], s.sub(load_tail(s, &x[j..]), lv));
        }
    }
    lse
}

/// The entry points as [`Kernel`]s, run by [`vectorize`] on the caller's ISA.
struct SoftmaxRows<'a>(RowsJob<'a>);
struct MaskedRows<'a>(RowsJob<'a>);
struct StreamedRows<'a>(RowsJob<'a>);
struct SoftmaxRow<'a>(RowJob<'a>);
struct LseRow<'a>(&'a [f32], Option<&'a mut [f32]>);

impl Kernel for SoftmaxRows<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        softmax_rows_body(s, self.0)
    }
}
impl Kernel for MaskedRows<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        masked_rows_body(s, self.0)
    }
}
impl Kernel for StreamedRows<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        // Only ISAs with non-temporal stores stream (the test is on a constant, so the portable
        // instance compiles nothing).
        if S::HAS_STREAM {
            streamed_rows_body(s, self.0)
        }
    }
}
impl Kernel for SoftmaxRow<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> f32 {
        softmax_job(s, self.0)
    }
}
impl Kernel for LseRow<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> f32 {
        lse_row_body(s, self.0, self.1)
    }
}

/// The fused scale-mask-softmax of one row (module docs); returns its logsumexp.
/// Inconsistent lengths are clamped (the callers in `mod.rs` never pass them).
pub(crate) fn softmax_row(isa: Isa, mut job: RowJob<'_>) -> f32 {
    let mut n = job.visible.min(job.y.len());
    if let Some(s) = job.src {
        n = n.min(s.len());
    }
    match job.mask {
        RowMask::None => {}
        RowMask::Keep(k) => n = n.min(k.len()),
        RowMask::Bias(b) => n = n.min(b.len()),
    }
    if job.stage.as_ref().is_some_and(|s| s.len() < n) {
        job.stage = None;
    }
    debug_assert_eq!(n, job.visible, "row job lengths disagree");
    job.visible = n;
    vectorize(isa, SoftmaxRow(job))
}

/// The rows of a [`RowsJob`] (module docs of `mod.rs`). Inconsistent lengths (never passed by
/// `mod.rs`) do nothing.
pub(crate) fn softmax_rows(isa: Isa, job: RowsJob<'_>) {
    let n = job.y.len();
    if n == 0 {
        return;
    }
    let ok = job.cols > 0
        && n.is_multiple_of(job.cols)
        && job.src.is_none_or(|s| s.len() == n)
        && job.lse.as_ref().is_none_or(|l| l.len() == n / job.cols)
        && job.stage.as_ref().is_none_or(|s| s.len() >= stage_len(job.cols))
        && match job.mask {
            RowsMask::Causal(c) => c.is_none_or(|(_, q, _)| q > 0),
            RowsMask::Keep { keep, starts } => mask_rows_fit(keep.len(), starts, n, job.cols),
            RowsMask::Bias { bias, starts } => mask_rows_fit(bias.len(), starts, n, job.cols),
        };
    debug_assert!(ok, "rows job lengths disagree");
    if !ok {
        return;
    }
    // A stage on an ISA without non-temporal stores (never passed by `mod.rs`) is ignored.
    if job.stage.is_some() && isa != Isa::Portable && isa.is_supported() {
        return vectorize(isa, StreamedRows(job));
    }
    match job.mask {
        RowsMask::Causal(_) => vectorize(isa, SoftmaxRows(job)),
        RowsMask::Keep { .. } | RowsMask::Bias { .. } => vectorize(isa, MaskedRows(job)),
    }
}

/// True when there is one start per row of `n / cols` and every mask row
/// `[start, start + cols)` lies inside a slice of `len` elements.
fn mask_rows_fit(len: usize, starts: &[usize], n: usize, cols: usize) -> bool {
    starts.len() == n / cols
        && starts.iter().all(|&s| s.checked_add(cols).is_some_and(|e| e <= len))
}

/// Logsumexp of `x`; with `y` (same length) also writes the log-softmax `y_j = x_j − lse`.
pub(crate) fn lse_row(isa: Isa, x: &[f32], y: Option<&mut [f32]>) -> f32 {
    let y = y.filter(|y| y.len() == x.len());
    vectorize(isa, LseRow(x, y))
}
