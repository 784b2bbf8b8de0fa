//! The softmax row entry points: the jobs `mod.rs` builds ([`RowJob`], [`RowsJob`]), the loops
//! over a block of rows (in cache, or streamed with the mechanisms of `stream.rs`), and one
//! [`Kernel`] per entry point, run by [`vectorize`] on the caller's [`Isa`]. The passes
//! themselves are `passes.rs`'s.

use super::passes::{range_pass, softmax_row_body, softmax_sum, Bias, Keep, Logits, Plain};
use super::stream::{phase_skip, stage_len, Drain, PREFETCH_ROWS};
use crate::arch::{store_fence, vectorize, Isa, Kernel, Simd};

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
    /// fenced per row: the caller runs [`store_fence`](store_fence) on this
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

/// Builds the [`Logits`] for a job and runs the fused row by itself: [`softmax_row_body`],
/// streamed when the job has a stage and the ISA has non-temporal stores (the test of
/// `S::HAS_STREAM` comes first so that the portable ISA does not compile the streamed body at
/// all), its pass C then written at once.
///
/// # Safety
/// The job's lengths validated by [`softmax_row`].
#[inline(always)]
unsafe fn softmax_job<S: Simd>(s: S, job: RowJob<'_>) -> f32 {
    let RowJob { src, y, visible: n, mask, scale, stage, next, want_lse } = job;
    let next = next.unwrap_or(&[]);
    let total = y.len();
    let yp = y.as_mut_ptr();
    let x = src.map_or(yp as *const f32, <[f32]>::as_ptr);
    let stage = stage.map_or(std::ptr::null_mut(), <[f32]>::as_mut_ptr);
    // SAFETY: forwarded contract; lengths checked by the caller; the drain is finished
    // before returning.
    unsafe {
        let sc = s.splat(scale);
        let mut drain = Drain::none(s);
        macro_rules! body {
            ($z:expr, $stream:literal) => {
                softmax_row_body::<S, _, $stream>(
                    s, &$z, scale, n, yp, total, stage, next, want_lse, &mut drain,
                )
            };
        }
        macro_rules! once {
            ($z:expr) => {
                if S::HAS_STREAM && !stage.is_null() {
                    let v = body!($z, true);
                    drain.finish();
                    v
                } else {
                    body!($z, false)
                }
            };
        }
        match mask {
            RowMask::None => once!(Plain::<S> { s, x, scale: sc }),
            RowMask::Keep(k) => once!(Keep::<S> { s, x, keep: k.as_ptr(), scale: sc }),
            RowMask::Bias(b) => once!(Bias::<S> { s, x, bias: b.as_ptr(), scale: sc }),
        }
    }
}

/// The rows of a [`RowsJob`] with no mask or a causal one, each by [`softmax_row_body`],
/// prefetching the next row's input (so that its pass A reads L1). The loop is written out
/// rather than run through [`rows_loop`]: with the logits formed by a closure the compiler
/// allocated registers differently, one more instruction per exp group.
///
/// # Safety
/// The job's lengths validated by [`softmax_rows`].
#[inline(always)]
unsafe fn softmax_rows_body<S: Simd>(s: S, job: RowsJob<'_>) {
    let RowsJob { src, y, cols, mask, scale, mut lse, .. } = job;
    let RowsMask::Causal(causal) = mask else { return };
    let rows = y.len() / cols;
    let yp = y.as_mut_ptr();
    let xp = src.map_or(yp as *const f32, <[f32]>::as_ptr);
    // SAFETY: every row `r < rows` spans `[r·cols, (r + 1)·cols)` of both buffers. In place
    // (`xp == yp`), `next` views row `r + 1` while row `r` is written: disjoint ranges, and
    // `next` is only prefetched.
    unsafe {
        let sc = s.splat(scale);
        let mut none = Drain::none(s);
        for r in 0..rows {
            let visible =
                causal.map_or(cols, |(off, q, i0)| causal_visible((i0 + r) % q, off, cols));
            let next = if r + 1 < rows {
                std::slice::from_raw_parts(xp.add((r + 1) * cols), cols)
            } else {
                &[]
            };
            let z = Plain::<S> { s, x: xp.add(r * cols), scale: sc };
            let want_lse = lse.is_some();
            let v = softmax_row_body::<S, _, false>(
                s,
                &z,
                scale,
                visible,
                yp.add(r * cols),
                cols,
                std::ptr::null_mut(),
                next,
                want_lse,
                &mut none,
            );
            if let Some(l) = lse.as_deref_mut() {
                l[r] = v;
            }
        }
    }
}

/// The rows of a [`RowsJob`] with a keep-mask or a bias, each by [`softmax_row_body`]: its
/// own `#[target_feature]` function, apart from [`softmax_rows_body`], so that the unmasked
/// rows' code is compiled as it was measured. Its loop, [`rows_loop`], repeats the one
/// written out in [`softmax_rows_body`] on purpose (see there; a macro shared by both cost the
/// unmasked rows instructions too).
///
/// # Safety
/// The job's lengths validated by [`softmax_rows`].
#[inline(always)]
unsafe fn masked_rows_body<S: Simd>(s: S, job: RowsJob<'_>) {
    // SAFETY: forwarded contract; `softmax_rows` checked every mask row against its slice.
    unsafe {
        let sc = s.splat(job.scale);
        match job.mask {
            RowsMask::Causal(_) => {}
            RowsMask::Keep { keep, starts } => {
                let keep = keep.as_ptr();
                rows_loop::<S, _>(s, job, |r, x| Keep::<S> {
                    s,
                    x,
                    keep: keep.add(starts[r]),
                    scale: sc,
                })
            }
            RowsMask::Bias { bias, starts } => {
                let bias = bias.as_ptr();
                rows_loop::<S, _>(s, job, |r, x| Bias::<S> {
                    s,
                    x,
                    bias: bias.add(starts[r]),
                    scale: sc,
                })
            }
        }
    }
}

/// The loop over a masked [`RowsJob`]'s rows: row `r` forms its logits by
/// `logits(r, input row)` over all `cols` columns; the next row's input is prefetched
/// meanwhile.
///
/// # Safety
/// The job's lengths validated by [`softmax_rows`]; the `L` of each row
/// valid for `cols` logits.
#[inline(always)]
unsafe fn rows_loop<S: Simd, L: Logits<S>>(
    s: S,
    job: RowsJob<'_>,
    logits: impl Fn(usize, *const f32) -> L,
) {
    let RowsJob { src, y, cols, scale, mut lse, .. } = job;
    let rows = y.len() / cols;
    let yp = y.as_mut_ptr();
    let xp = src.map_or(yp as *const f32, <[f32]>::as_ptr);
    // SAFETY: every row `r < rows` spans `[r·cols, (r + 1)·cols)` of both buffers. In place
    // (`xp == yp`), `next` views row `r + 1` while row `r` is written: disjoint ranges, and
    // `next` is only prefetched.
    unsafe {
        let mut none = Drain::none(s);
        for r in 0..rows {
            let next = if r + 1 < rows {
                std::slice::from_raw_parts(xp.add((r + 1) * cols), cols)
            } else {
                &[]
            };
            let z = logits(r, xp.add(r * cols));
            let want_lse = lse.is_some();
            let v = softmax_row_body::<S, _, false>(
                s,
                &z,
                scale,
                cols,
                yp.add(r * cols),
                cols,
                std::ptr::null_mut(),
                next,
                want_lse,
                &mut none,
            );
            if let Some(l) = lse.as_deref_mut() {
                l[r] = v;
            }
        }
    }
}

/// The rows of a streamed [`RowsJob`]: each by [`softmax_row_body`], its pass C left in a
/// [`Drain`] that the next row writes during its passes A and B, the row [`PREFETCH_ROWS`]
/// ahead prefetched into L2 meanwhile. Every row stages its terms in the same buffer, in phase
/// with its output row, behind the previous row's drain ([`stage_len`]). The last row's pass C
/// is written at the end and the stores fenced: the job's output is complete and ordered when
/// it returns.
///
/// # Safety
/// The job's lengths validated by [`softmax_rows`]; `stage` valid for
/// [`stage_len`]`(cols)` writes and reads and disjoint from the rows; the `L` of row `r` valid
/// for its `visible(r) ≤ cols` logits.
#[inline(always)]
unsafe fn streamed_rows_loop<S: Simd, L: Logits<S>>(
    s: S,
    job: RowsJob<'_>,
    stage: *mut f32,
    logits: impl Fn(usize, *const f32) -> L,
    visible: impl Fn(usize) -> usize,
) {
    let RowsJob { src, y, cols, scale, mut lse, .. } = job;
    let rows = y.len() / cols;
    let yp = y.as_mut_ptr();
    let xp = src.map_or(yp as *const f32, <[f32]>::as_ptr);
    // SAFETY: row `r < rows` spans `[r·cols, (r + 1)·cols)` of both buffers; its stage, at a
    // skip below `PAGE_BYTES / 4` into `stage`, holds `cols` floats. The drain pending on
    // entry to row `r` reads the stage and writes row `r − 1`: disjoint from row `r`'s input
    // and output (in place, row `r − 1`'s input was consumed by its pass B); row `r`'s pass B
    // writes the stage only behind it (`Drain::clear`). `next` is only prefetched.
    unsafe {
        let mut drain = Drain::<S>::none(s);
        for r in 0..rows {
            let ahead = (r + PREFETCH_ROWS).min(rows - 1);
            let next = if ahead > r {
                std::slice::from_raw_parts(xp.add(ahead * cols), cols)
            } else {
                &[]
            };
            let yr = yp.add(r * cols);
            let w = stage.add(phase_skip(stage, yr));
            let v = softmax_row_body::<S, _, true>(
                s,
                &logits(r, xp.add(r * cols)),
                scale,
                visible(r),
                yr,
                cols,
                w,
                next,
                lse.is_some(),
                &mut drain,
            );
            if let Some(l) = lse.as_deref_mut() {
                l[r] = v;
            }
        }
        drain.finish();
    }
    store_fence();
}

/// A streamed [`RowsJob`] (`stage` given), every mask kind, by [`streamed_rows_loop`].
///
/// # Safety
/// The job's lengths validated by [`softmax_rows`].
#[inline(always)]
unsafe fn streamed_rows_body<S: Simd>(s: S, mut job: RowsJob<'_>) {
    let Some(stage) = job.stage.take() else { return };
    let stage = stage.as_mut_ptr();
    let cols = job.cols;
    // SAFETY: forwarded contract; `softmax_rows` checked the stage and every mask row.
    unsafe {
        let sc = s.splat(job.scale);
        match job.mask {
            RowsMask::Causal(causal) => {
                let visible =
                    |r| causal.map_or(cols, |(off, q, i0)| causal_visible((i0 + r) % q, off, cols));
                streamed_rows_loop::<S, _>(
                    s,
                    job,
                    stage,
                    |_, x| Plain::<S> { s, x, scale: sc },
                    visible,
                )
            }
            RowsMask::Keep { keep, starts } => {
                let keep = keep.as_ptr();
                let z = |r: usize, x| Keep::<S> { s, x, keep: keep.add(starts[r]), scale: sc };
                streamed_rows_loop::<S, _>(s, job, stage, z, |_| cols)
            }
            RowsMask::Bias { bias, starts } => {
                let bias = bias.as_ptr();
                let z = |r: usize, x| Bias::<S> { s, x, bias: bias.add(starts[r]), scale: sc };
                streamed_rows_loop::<S, _>(s, job, stage, z, |_| cols)
            }
        }
    }
}

/// Logsumexp of a row (`x` unscaled, unmasked); writes `y_j = x_j − lse` when `y` is given.
///
/// # Safety
/// `y`, when given, has `x.len()` elements.
#[inline(always)]
unsafe fn lse_row_body<S: Simd>(s: S, x: &[f32], y: Option<&mut [f32]>) -> f32 {
    let n = x.len();
    // SAFETY: forwarded contract; indices below `n`.
    unsafe {
        let z = Plain::<S> { s, x: x.as_ptr(), scale: s.splat(1.0) };
        let none = &mut Drain::none(s);
        let (m, lo) = range_pass::<S, _, false>(s, &z, n, none);
        let lse = if m.is_finite() {
            let w = std::ptr::null_mut();
            let sum =
                softmax_sum::<S, _, false, false>(s, &z, n, (m, lo), (None, 1.0), w, (&[], none));
            (f64::from(m) + f64::from(sum).ln()) as f32
        } else if x.iter().any(|v| v.is_nan()) {
            f32::NAN
        } else {
            m // −∞ (empty or all −∞) or +∞
        };
        if let Some(y) = y {
            debug_assert_eq!(y.len(), n);
            let l = S::LANES;
            let (xp, yp, lv) = (x.as_ptr(), y.as_mut_ptr(), s.splat(lse));
            let n = n.min(y.len());
            let mut j = 0;
            while j + l <= n {
                s.store(yp.add(j), s.sub(s.load(xp.add(j)), lv));
                j += l;
            }
            if j < n {
                s.store_tail(yp.add(j), n - j, s.sub(s.load_tail(xp.add(j), n - j), lv));
            }
        }
        lse
    }
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
        // SAFETY: `softmax_rows` validated the job's lengths.
        unsafe { softmax_rows_body(s, self.0) }
    }
}
impl Kernel for MaskedRows<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        // SAFETY: `softmax_rows` validated the job's lengths and mask rows.
        unsafe { masked_rows_body(s, self.0) }
    }
}
impl Kernel for StreamedRows<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        // Only ISAs with non-temporal stores stream (the test is on a constant, so the portable
        // instance compiles nothing).
        if S::HAS_STREAM {
            // SAFETY: `softmax_rows` validated the job's lengths, mask rows and stage.
            unsafe { streamed_rows_body(s, self.0) }
        }
    }
}
impl Kernel for SoftmaxRow<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> f32 {
        // SAFETY: `softmax_row` validated the job's lengths.
        unsafe { softmax_job(s, self.0) }
    }
}
impl Kernel for LseRow<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> f32 {
        // SAFETY: `lse_row` checked `y.len() == x.len()`.
        unsafe { lse_row_body(s, self.0, self.1) }
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
