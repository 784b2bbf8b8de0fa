//! Fused scale-mask-softmax with a vectorised exp, log-softmax and logsumexp.
//!
//! [`scale_mask_softmax`] computes `y = softmax(scale·x + mask)` over the last dimension of a
//! `[batch, heads, rows, cols]` view, with the reference's conventions
//! (`attn_reference::softmax::scale_mask_softmax`) and the same errors:
//! - logits are formed in f32: `z = scale·x` (one rounding), `z = fma(scale, x, bias)` for a
//!   bias mask (one rounding; two on the portable ISA without FMA); masked positions are
//!   skipped, never read into the arithmetic, and get exactly `0`;
//! - the row is stabilised by its max `m`; `y_j = exp(z_j − m) · (1/Σ)`; logsumexp
//!   `m + ln Σ` (rounded from f64);
//! - a row whose every position is masked or `−∞` (or that is empty) is all zeros, lse `−∞`;
//! - a NaN visible logit makes the whole row NaN (masked positions included) and its lse NaN;
//! - `+∞` logits share the weight evenly (`1/count` each, 0 elsewhere), lse `+∞`;
//! - `|z| ≤ 1e30` is ordinary input: `z − m` never overflows to NaN; a logit whose f32 product
//!   `scale·x` (or `scale·x + bias`) overflows becomes `±∞` and follows the rule above; the
//!   f64 reference takes its logits beyond the f32 range as `±∞` too
//!   (`attn_reference::softmax::saturate_logit`), so the two agree; only a logit whose
//!   product overflows while the sum with the bias would not (`|scale·x|`, `|bias|` near
//!   `f32::MAX` with opposite signs) can differ beyond rounding.
//!
//! Accuracy, with `u = 2⁻²⁴`, `E` = [`SOFTMAX_EXP_MAX_ULP`] (1.5 ULP: the softmax passes use
//! their own exp for arguments `z − m ≤ 0`, see [`crate::math::exp`]), `n` visible positions:
//! `ŷ_j = p_j(z̃)·(1 + ε_j)`, `|ε_j| ≤ 2E·u + γ_n + 2u`, where `z̃_j` are the f32 logits and
//! `z̃_j − m` is rounded once; each row sums to `1 ± (γ_n + 2u)`. The tests build their
//! tolerances from exactly these terms.
//!
//! Passes: the input row is read twice (max, then exp) while it sits in L1/L2, and the output
//! written once (costs and where the cycles go: `passes.rs`); calls whose f32 output reaches
//! [`STREAM_MIN_BYTES`] (and whose input is f32 or whose layout is not contiguous) are staged in
//! a per-thread (or per-task) buffer and written with non-temporal stores so the output costs
//! no read-for-ownership. Rows are spread over threads when
//! the call has at least [`PAR_MIN_ELEMENTS`] elements. Contiguous tensors (the attention case)
//! whose mask, if it is a keep-mask or a bias, has contiguous columns (stride 1) run whole blocks
//! of rows per call into the row kernel, where a streamed row's writes overlap the next row's
//! passes; with bf16/f16 input or output they do so on chunks of rows widened into an f32
//! buffer and narrowed back. Other layouts go row by row (gathering strided rows and masks); all
//! give the same bits.
//!
//! Files: `mod.rs` (public API, argument checks, row iteration and threading), `dispatch.rs`
//! (row jobs, row loops and their entry points, run through
//! [`vectorize`](crate::arch::vectorize)), `passes.rs` (the passes of a row, written once over
//! [`crate::arch::Simd`]), `stream.rs` (deferred pass C, far prefetch order, staging). The exps are [`crate::math::exp`]'s; the ISA is
//! chosen by [`crate::arch`] (the one place for every kernel).
//!
//! The passes are safe code over slices. Output rows and the stage are slices of `Cell<f32>`,
//! because they are shared on purpose: a row may be its own input (in place: each vector is
//! read before it is written), and a streamed row's pass B stages its terms in the buffer the
//! previous row's drain still reads, behind it. Inputs are read through `arch::Floats` (made
//! from a `&[f32]` or from those cells); every load and store is one of `crate::arch`'s
//! bounds-checked helpers, and the loops are bounded so that the checks fold away.
//!
//! The dispatched functions take an [`Isa`] that the caller obtained from
//! [`crate::arch::selected`] or checked with [`Isa::require`]; an unsupported
//! ISA falls back to the portable code (never undefined behaviour). None of them allocates.

mod dispatch;
mod passes;
mod stream;

// The exp family lives in `math::exp`; its slice functions and bounds are re-exported here,
// where callers of the softmax have always found them.
pub use crate::math::exp::{
    exp_slice, exp_slice_with_isa, softmax_exp_slice_with_isa, EXP_MAX_ULP, SOFTMAX_EXP_MAX_ULP,
};

use attn_core::error::{expect_dim, expect_finite};
use attn_core::{DType, Error, MatMut, MatRef, TensorMut, TensorRef};
use rayon::prelude::*;

use crate::arch::convert::{convert_into, Convertible};
use crate::arch::{self, Isa};
use crate::par::Parallelism;
use crate::{Mask, Result, Tensor4Layout};
use dispatch::{RowJob, RowMask, RowsJob, RowsMask};

/// Calls with fewer elements than this run on the calling thread whatever the [`Parallelism`]:
/// 128 Ki elements are tens of µs of work, below which a second thread costs more than it
/// saves.
pub const PAR_MIN_ELEMENTS: usize = 1 << 17;
/// Each parallel task gets at least this many elements (whole rows), so that a task outweighs
/// its scheduling cost.
const PAR_MIN_TASK_ELEMENTS: usize = 1 << 13;
/// A streamed call's parallel tasks get at least this many bytes of output (whole rows): each
/// task pipelines its rows' writes into the next row's passes (`stream.rs`'s `Drain`) but writes
/// its last row's alone and fences, so a task of a few rows would lose most of the overlap.
/// 1 MiB is 64 rows of 4096 columns, 128 tasks for 8192 such rows.
const STREAM_TASK_BYTES: usize = 1 << 20;
/// f32 outputs at least this large (bytes) are written with non-temporal stores, but for
/// contiguous calls with a half-precision input (the chunked path, whose output is written
/// right after its chunk is widened; see `Ctx::run_contiguous_half`): with the input it
/// exceeds half of the 32 MiB L3, so it would be evicted before reuse anyway, and skipping the
/// read-for-ownership saves a third of the memory traffic.
///
/// Contiguous streamed calls run as blocks of rows whose pass C is written during the next
/// row's passes A and B (`stream.rs`'s `Drain`); what is left is the passes' memory traffic
/// (the second read of each row), not their arithmetic. A one-pass variant with an online max
/// was slower, and would round differently from the in-cache path. History:
/// `docs/perf-journal.md`.
pub const STREAM_MIN_BYTES: usize = 16 << 20;

/// Elements per chunk of the half-precision fast path (`Ctx::run_contiguous_half`; a chunk
/// is one row when rows are longer): the f32 chunk (16 KiB) and its half-precision rows stay
/// in L1 between the widening, the passes and the narrowing.
const HALF_CHUNK: usize = 4096;

/// `y = softmax(scale·x + mask)` over each row of a `[batch, heads, rows, cols]` view, with the
/// ISA [`arch::selected`] returns. Conventions, accuracy and passes: see the module docs.
///
/// `x` and `y` are each of f32, bf16 or f16 (f32 both: the passes read and write them in
/// place). Half-precision logits are widened exactly; the result is the f32 softmax of those
/// values, each output rounded once to `y`'s type (to nearest even: relative error `2⁻⁸` for
/// bf16, `2⁻¹¹` for f16, besides the f32 bound; among subnormals, `2⁻¹³⁴` absolute for bf16
/// below `2⁻¹²⁶` and `2⁻²⁵` for f16 below `2⁻¹⁴`). The logsumexps stay f32. Bit for bit,
/// the f32 call on the widened `x` followed by [`convert_slice`](crate::arch::convert::convert_slice) of
/// `y`.
///
/// `lse`, when given, receives the logsumexp of each row, row-major over `[batch, heads, rows]`.
/// Errors (as the reference, in its order): `NonFinite` scale; `x` out of bounds; `y` dims
/// differ from `x`; `y` out of bounds or aliased; mask dims or bounds; `lse` length.
pub fn scale_mask_softmax<X: Convertible, Y: Convertible>(
    x: TensorRef<'_, X>,
    scale: f32,
    mask: &Mask<'_>,
    y: TensorMut<'_, Y>,
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    scale_mask_softmax_with_isa(arch::selected(), x, scale, mask, y, lse, par)
}

/// [`scale_mask_softmax`] on an explicit ISA (`InvalidParameter { arg: "isa" }` when the CPU
/// lacks it).
pub fn scale_mask_softmax_with_isa<X: Convertible, Y: Convertible>(
    isa: Isa,
    x: TensorRef<'_, X>,
    scale: f32,
    mask: &Mask<'_>,
    y: TensorMut<'_, Y>,
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    isa.require()?;
    expect_finite("scale", scale)?;
    x.check("x")?;
    y.layout.expect_dims("y", x.layout.dims)?;
    y.check("y")?;
    let [batch, heads, rows, cols] = x.layout.dims;
    mask.check(batch, heads, rows, cols)?;
    check_lse(lse.as_deref(), batch.saturating_mul(heads).saturating_mul(rows))?;
    let ctx = Ctx { isa, x: Some(x), scale, mask, dims: x.layout.dims };
    ctx.run(y, lse, par);
    Ok(())
}

/// In-place [`scale_mask_softmax`]: `x ← softmax(scale·x + mask)`, `x` of f32, bf16 or f16.
/// Same results, bit for bit, as the out-of-place form with `y` of `x`'s type. Errors as
/// there, with `x` checked as an output (bounds and no aliasing).
pub fn scale_mask_softmax_inplace<T: Convertible>(
    x: TensorMut<'_, T>,
    scale: f32,
    mask: &Mask<'_>,
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    scale_mask_softmax_inplace_with_isa(arch::selected(), x, scale, mask, lse, par)
}

/// [`scale_mask_softmax_inplace`] on an explicit ISA.
pub fn scale_mask_softmax_inplace_with_isa<T: Convertible>(
    isa: Isa,
    x: TensorMut<'_, T>,
    scale: f32,
    mask: &Mask<'_>,
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    isa.require()?;
    expect_finite("scale", scale)?;
    x.check("x")?;
    let [batch, heads, rows, cols] = x.layout.dims;
    mask.check(batch, heads, rows, cols)?;
    check_lse(lse.as_deref(), batch.saturating_mul(heads).saturating_mul(rows))?;
    let ctx = Ctx::<T> { isa, x: None, scale, mask, dims: x.layout.dims };
    ctx.run(x, lse, par);
    Ok(())
}

/// Softmax over each row of a matrix (no scale, no mask): [`scale_mask_softmax`] on
/// `Tensor4Layout::from_mat`.
pub fn softmax(x: MatRef<'_>, y: MatMut<'_>, par: Parallelism) -> Result<()> {
    scale_mask_softmax(
        TensorRef::new(x.data, Tensor4Layout::from_mat(x.layout)),
        1.0,
        &Mask::None,
        TensorMut::new(y.data, Tensor4Layout::from_mat(y.layout)),
        None,
        par,
    )
}

/// Log-softmax over each row: `y_ij = x_ij − lse_i` in f32, `lse_i` as in [`logsumexp`].
/// Special rows follow IEEE from there (as the reference): an all-`−∞` row gives NaN
/// (`−∞ − (−∞)`), a row with `+∞` gives NaN there and `−∞` elsewhere, NaN input a NaN row.
/// Errors (reference order): `y` shape, `y` bounds or aliasing, then `x` bounds.
pub fn log_softmax(x: MatRef<'_>, y: MatMut<'_>, par: Parallelism) -> Result<()> {
    log_softmax_with_isa(arch::selected(), x, y, par)
}

/// [`log_softmax`] on an explicit ISA.
pub fn log_softmax_with_isa(
    isa: Isa,
    x: MatRef<'_>,
    y: MatMut<'_>,
    par: Parallelism,
) -> Result<()> {
    isa.require()?;
    y.layout.expect_shape("y", x.layout.rows, x.layout.cols)?;
    y.check("y")?;
    x.check("x")?;
    let yt = TensorMut::new(y.data, Tensor4Layout::from_mat(y.layout));
    let xt = TensorRef::new(x.data, Tensor4Layout::from_mat(x.layout));
    for_each_row(isa, yt, None, par, false, |scratch, pos, yrow, _| {
        let xrow = gather(isa, &xt, pos, &mut scratch.x);
        dispatch::lse_row(isa, xrow, Some(yrow));
    });
    Ok(())
}

/// `ln Σ_j exp(x_ij)` for each row (`−∞` for an empty or all-`−∞` row, `+∞` if a row holds
/// `+∞`, NaN if it holds NaN), computed as `m + ln Σ exp(x_j − m)` with the f32 kernel and the
/// final step in f64. Errors: `x` out of bounds.
pub fn logsumexp(x: MatRef<'_>, par: Parallelism) -> Result<Vec<f32>> {
    logsumexp_with_isa(arch::selected(), x, par)
}

/// [`logsumexp`] on an explicit ISA.
pub fn logsumexp_with_isa(isa: Isa, x: MatRef<'_>, par: Parallelism) -> Result<Vec<f32>> {
    isa.require()?;
    x.check("x")?;
    let xt = TensorRef::new(x.data, Tensor4Layout::from_mat(x.layout));
    let rows = x.layout.rows;
    // An `r × 0` view (or one with a zero row stride) may have any `r`, so the result is
    // allocated fallibly, with the reference's error when it cannot be.
    let mut out = Vec::new();
    out.try_reserve_exact(rows).map_err(|_| Error::InvalidParameter {
        arg: "x",
        requirement: "the sizes imply a scratch buffer that cannot be allocated",
    })?;
    out.resize(rows, f32::NEG_INFINITY);
    if x.layout.cols == 0 {
        return Ok(out); // empty rows: −∞ each, nothing to read
    }
    let f = |scratch: &mut Scratch, (r, l): (usize, &mut f32)| {
        let pos = RowPos { r, b: 0, h: 0, i: r };
        *l = dispatch::lse_row(isa, gather(isa, &xt, pos, &mut scratch.x), None);
    };
    if use_threads(par, x.layout.len()) {
        let min = min_rows_per_task(x.layout.cols);
        par.install(|| {
            out.par_iter_mut().enumerate().with_min_len(min).for_each_init(Scratch::default, f)
        });
    } else {
        let mut scratch = Scratch::default();
        out.iter_mut().enumerate().for_each(|rl| f(&mut scratch, rl));
    }
    Ok(out)
}

fn check_lse(lse: Option<&[f32]>, rows: usize) -> Result<()> {
    match lse {
        Some(l) => expect_dim("lse", "len", rows, l.len()),
        None => Ok(()),
    }
}

fn use_threads(par: Parallelism, elements: usize) -> bool {
    par.count() > 1 && elements >= PAR_MIN_ELEMENTS
}

fn min_rows_per_task(cols: usize) -> usize {
    PAR_MIN_TASK_ELEMENTS.div_ceil(cols.max(1))
}

/// `len` floats of `buf` (grown as needed, contents unspecified) at the same offset within a
/// 4 KiB page as `like`, the output row. A streamed row's pass C loads the stage while its
/// non-temporal stores to the output are still pending, and a load whose address matches a
/// pending store's in the low 12 bits waits on it as if it were the same address ("4K
/// aliasing"). In phase with the output, loading stage element `j` can only alias stores to
/// output elements `j ± 1024·k`, a page away, instead of wherever the allocator's placement
/// puts them. 8192×4096, one thread, the same binary switching per call: 1.5–3 % faster
/// (medians of 40 calls, four runs).
fn same_page_phase<'b>(buf: &'b mut Vec<f32>, len: usize, like: &[f32]) -> &'b mut [f32] {
    let room = len + stream::PAGE_BYTES / 4;
    if buf.len() < room {
        buf.resize(room, 0.0);
    }
    let skip = stream::phase_skip(buf, like);
    &mut buf[skip..skip + len]
}

/// Per-thread buffers for gathered (strided) rows and the streaming stage.
///
/// Each thread's `Scratch` lives exactly as long as its share of the rows (one per sequential
/// call, one per rayon split, dropped on the thread that ran it and before the split's end is
/// signalled), so its drop is where that thread fences the non-temporal stores of its streamed
/// rows (`dispatch::RowJob::stage`): once per thread and call rather than once per row.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    /// A strided output row, or a half-precision one widened.
    y: Vec<f32>,
    bias: Vec<f32>,
    keep: Vec<bool>,
    stage: Vec<f32>,
    /// A row was streamed: fence on drop.
    streamed: bool,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.streamed {
            crate::arch::store_fence();
        }
    }
}

/// A row of a `[batch, heads, rows, cols]` view: its flat index `r` over `[batch, heads, rows]`
/// and its coordinates. Rows are visited by [`RowPos::next`], without the four 64-bit
/// divisions per row that recovering `(b, h, i)` from `r` costs (tens of cycles each, a
/// noticeable share of a short row's softmax).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowPos {
    r: usize,
    b: usize,
    h: usize,
    i: usize,
}

impl RowPos {
    const FIRST: RowPos = RowPos { r: 0, b: 0, h: 0, i: 0 };

    /// The coordinates of flat row `r` (divides: for setting up, not per row).
    fn of(r: usize, dims: [usize; 4]) -> Self {
        let [_, heads, rows, _] = dims;
        let (bh, i) = (r / rows.max(1), r % rows.max(1));
        RowPos { r, b: bh / heads.max(1), h: bh % heads.max(1), i }
    }

    /// The row after this one.
    fn next(self, dims: [usize; 4]) -> Self {
        let [_, heads, rows, _] = dims;
        let RowPos { r, mut b, mut h, mut i } = self;
        i += 1;
        if i >= rows {
            i = 0;
            h += 1;
            if h >= heads {
                h = 0;
                b += 1;
            }
        }
        RowPos { r: r + 1, b, h, i }
    }
}

/// Row `pos` of `t` as f32: the slice itself when it is f32 with contiguous columns, else a
/// copy in `buf` (widened, exactly, for bf16/f16).
fn gather<'a, X: Convertible>(
    isa: Isa,
    t: &TensorRef<'a, X>,
    pos: RowPos,
    buf: &'a mut Vec<f32>,
) -> &'a [f32] {
    // An empty row first: an empty view's offset and strides need not index anything.
    if t.layout.dims[3] == 0 {
        return &[];
    }
    let (start, cols, stride) = row_span(&t.layout, pos);
    buf.clear();
    if stride == 1 || cols <= 1 {
        let row = &t.data[start..start + cols];
        if let Some(row) = X::as_f32(row) {
            return row;
        }
        buf.resize(cols, 0.0);
        convert_into(isa, row, buf);
    } else {
        buf.extend((0..cols).map(|j| t.data[start + j * stride].widen()));
    }
    buf
}

/// Generic gather for mask rows.
fn gather_mask<'a, T: Copy>(
    data: &'a [T],
    layout: &Tensor4Layout,
    pos: RowPos,
    buf: &'a mut Vec<T>,
) -> &'a [T] {
    if layout.dims[3] == 0 {
        return &[]; // as in `gather`
    }
    let (start, cols, stride) = row_span(layout, pos);
    if stride == 1 || cols <= 1 {
        &data[start..start + cols]
    } else {
        buf.clear();
        buf.extend((0..cols).map(|j| data[start + j * stride]));
        buf
    }
}

/// (index of element 0, cols, column stride) of row `pos`.
fn row_span(l: &Tensor4Layout, pos: RowPos) -> (usize, usize, usize) {
    (l.index(pos.b, pos.h, pos.i, 0), l.dims[3], l.strides[3])
}

/// Runs `f(scratch, row, y_row, lse_slot)` for every row of `y`, where `y_row` is a
/// contiguous f32 buffer holding the row: the row itself (f32, contiguous), or a copy (strided,
/// or widened from bf16/f16) written back after `f`, narrowed to `Y`. With `read` false the
/// copy of a contiguous half-precision row starts as zeros rather than the row's values (`f`
/// writes the whole row, unless it only reads the input in place). Rows go to rayon tasks
/// when the call is large enough and the rows are contiguous.
fn for_each_row<Y: Convertible, F>(
    isa: Isa,
    mut y: TensorMut<'_, Y>,
    lse: Option<&mut [f32]>,
    par: Parallelism,
    read: bool,
    f: F,
) where
    F: Fn(&mut Scratch, RowPos, &mut [f32], Option<&mut f32>) + Sync,
{
    let dims = y.layout.dims;
    let [batch, heads, rows, cols] = dims;
    // Bounded by the slices once past the early return below: `y` has `nrows·cols` distinct
    // elements (checked injective) or `lse` has `nrows` entries.
    let nrows = batch.saturating_mul(heads).saturating_mul(rows);
    let mut slots: Vec<Option<&mut f32>> = match lse {
        Some(l) => l.iter_mut().map(Some).collect(),
        None => Vec::new(),
    };
    if cols == 0 {
        // Nothing to index: an empty view's offset and strides need not lie inside its slice.
        // Without logsumexps there is nothing to write, whatever `batch·heads·rows` says (a
        // `[1, 1, 2⁴⁰, 0]` view is legal): return at once, as the reference does.
        if slots.is_empty() {
            return;
        }
        let mut scratch = Scratch::default();
        let mut pos = RowPos::FIRST;
        for r in 0..nrows {
            f(&mut scratch, pos, &mut [], take_slot(&mut slots, r));
            pos = pos.next(dims);
        }
        return;
    }
    let contiguous = y.layout.strides[3] == 1 || cols <= 1;
    if contiguous && use_threads(par, nrows.saturating_mul(cols)) {
        if let Some(mut jobs) = split_rows(y.data, &y.layout) {
            let mut work: Vec<(RowPos, &mut [Y], Option<&mut f32>)> = Vec::with_capacity(nrows);
            for (pos, row) in jobs.drain(..) {
                work.push((pos, row, take_slot(&mut slots, pos.r)));
            }
            let min = min_rows_per_task(cols);
            par.install(|| {
                work.into_par_iter().with_min_len(min).for_each_init(
                    Scratch::default,
                    |s, (r, row, l)| {
                        as_f32_row(isa, s, row, read, |s, row| f(s, r, row, l));
                    },
                )
            });
            return;
        }
    }
    let mut scratch = Scratch::default();
    let mut pos = RowPos::FIRST;
    for r in 0..nrows {
        let (start, _, stride) = row_span(&y.layout, pos);
        let l = take_slot(&mut slots, r);
        if contiguous {
            let row = &mut y.rb().data[start..start + cols];
            as_f32_row(isa, &mut scratch, row, read, |s, row| f(s, pos, row, l));
        } else {
            let mut buf = std::mem::take(&mut scratch.y);
            buf.clear();
            buf.extend((0..cols).map(|j| y.data[start + j * stride].widen()));
            f(&mut scratch, pos, &mut buf, l);
            for (j, v) in buf.iter().enumerate() {
                y.data[start + j * stride] = Y::from_f32(*v);
            }
            scratch.y = buf;
        }
        pos = pos.next(dims);
    }
}

/// Runs `f` on a contiguous output row as f32: the row itself when it is f32, else a copy in
/// the scratch (widened from the row when `read`, zeros otherwise) narrowed back after `f`.
fn as_f32_row<Y: Convertible>(
    isa: Isa,
    scratch: &mut Scratch,
    row: &mut [Y],
    read: bool,
    f: impl FnOnce(&mut Scratch, &mut [f32]),
) {
    if let Some(row) = Y::as_f32_mut(row) {
        return f(scratch, row);
    }
    let mut buf = std::mem::take(&mut scratch.y);
    buf.clear();
    buf.resize(row.len(), 0.0);
    if read {
        convert_into(isa, row, &mut buf);
    }
    f(scratch, &mut buf);
    convert_into(isa, &buf, row);
    scratch.y = buf;
}

/// Runs `f(r0, rows, lse)` on blocks of whole rows of `y` (`cols > 0` elements each), with
/// their logsumexp slots: one block when the call is too small for threads, else blocks of
/// `per_task` rows as rayon tasks.
fn row_blocks<T: Send>(
    y: &mut [T],
    cols: usize,
    lse: Option<&mut [f32]>,
    par: Parallelism,
    per_task: usize,
    f: impl Fn(usize, &mut [T], Option<&mut [f32]>) + Sync,
) {
    if !use_threads(par, y.len()) {
        return f(0, y, lse);
    }
    let mut lse = lse.map(|l| l.chunks_mut(per_task));
    let tasks: Vec<_> = y
        .chunks_mut(per_task * cols)
        .enumerate()
        .map(|(t, yc)| (t * per_task, yc, lse.as_mut().and_then(Iterator::next)))
        .collect();
    par.install(|| tasks.into_par_iter().for_each(|(r0, yc, l)| f(r0, yc, l)));
}

fn take_slot<'a>(slots: &mut [Option<&'a mut f32>], r: usize) -> Option<&'a mut f32> {
    slots.get_mut(r).and_then(Option::take)
}

/// Splits `data` into the disjoint contiguous rows of `layout` (column stride 1), tagged with
/// their position. `None` if two rows overlap (impossible after `check_output`).
fn split_rows<'a, T>(
    data: &'a mut [T],
    layout: &Tensor4Layout,
) -> Option<Vec<(RowPos, &'a mut [T])>> {
    let [batch, heads, rows, cols] = layout.dims;
    let nrows = batch * heads * rows;
    let mut order: Vec<(usize, usize)> =
        (0..nrows).map(|r| (row_span(layout, RowPos::of(r, layout.dims)).0, r)).collect();
    order.sort_unstable();
    let mut out = Vec::with_capacity(nrows);
    let mut rest = data;
    let mut consumed = 0usize;
    for (start, r) in order {
        let skip = start.checked_sub(consumed)?;
        if skip.checked_add(cols)? > rest.len() {
            return None;
        }
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
        let (row, tail) = tail.split_at_mut(cols);
        out.push((RowPos::of(r, layout.dims), row));
        rest = tail;
        consumed = start + cols;
    }
    Some(out)
}

/// What a scale-mask-softmax call needs per row, shared read-only by the threads.
struct Ctx<'a, 'm, X> {
    isa: Isa,
    /// `None`: in place.
    x: Option<TensorRef<'a, X>>,
    scale: f32,
    mask: &'a Mask<'m>,
    dims: [usize; 4],
}

impl<X: Convertible> Ctx<'_, '_, X> {
    /// Rows over all batches and heads.
    fn rows(&self) -> usize {
        self.dims[0].saturating_mul(self.dims[1]).saturating_mul(self.dims[2])
    }

    fn run<Y: Convertible>(&self, y: TensorMut<'_, Y>, lse: Option<&mut [f32]>, par: Parallelism) {
        let [batch, heads, rows, cols] = self.dims;
        // A half-precision output is computed in scratch, and a contiguous half-precision
        // input takes the chunked path, which does not stream: only f32 rows stream.
        let stream = self.isa != Isa::Portable
            && Y::DTYPE == DType::F32
            && y.layout.len().saturating_mul(4) >= STREAM_MIN_BYTES;
        let contiguous = Tensor4Layout::bhsd(batch, heads, rows, cols);
        let mask_rows_contiguous = match self.mask {
            Mask::None | Mask::Causal { .. } => true,
            Mask::Keep { layout, .. } | Mask::Bias { layout, .. } => {
                layout.strides[3] == 1 || cols <= 1
            }
        };
        // The fast path reads and writes f32 in place: `src` is `None` in place, `Some(None)`
        // for a half-precision input.
        let src = self.x.as_ref().map(|x| X::as_f32(x.data));
        if cols > 0
            && mask_rows_contiguous
            && y.layout == contiguous
            && self.x.as_ref().is_none_or(|x| x.layout == contiguous)
            && src.is_none_or(|x| x.is_some())
        {
            if let Some(yd) = Y::as_f32_mut(&mut *y.data) {
                let y = TensorMut::new(yd, y.layout);
                return self.run_contiguous(src.flatten(), y, lse, par, stream);
            }
        }
        if cols > 0
            && mask_rows_contiguous
            && y.layout == contiguous
            && self.x.as_ref().is_none_or(|x| x.layout == contiguous)
        {
            let n = contiguous.len();
            let x = self.x.as_ref().map(|x| &x.data[..n]);
            return self.run_contiguous_half(x, &mut y.data[..n], lse, par);
        }
        for_each_row(self.isa, y, lse, par, self.x.is_none(), |scratch, pos, yrow, l| {
            let v = self.row(scratch, pos, rows, cols, yrow, stream, l.is_some());
            if let Some(l) = l {
                *l = v;
            }
        });
    }

    /// The fast path: contiguous `x` and `y`, mask rows with contiguous columns. Blocks of
    /// whole rows go to [`dispatch::softmax_rows`], one block per thread task, each with a stage of
    /// its own when `stream`.
    fn run_contiguous(
        &self,
        x: Option<&[f32]>,
        y: TensorMut<'_>,
        lse: Option<&mut [f32]>,
        par: Parallelism,
        stream: bool,
    ) {
        let cols = self.dims[3];
        let n = y.layout.len();
        let y = &mut y.data[..n];
        let x = x.map(|x| &x[..n]);
        let task = if stream {
            min_rows_per_task(cols).max(STREAM_TASK_BYTES / 4 / cols)
        } else {
            min_rows_per_task(cols)
        };
        row_blocks(y, cols, lse, par, task, |r0, yc, lse| {
            let src = x.map(|x| &x[r0 * cols..r0 * cols + yc.len()]);
            self.rows_block(r0, src, yc, lse, stream);
        });
    }

    /// Rows `r0..` of the call (`yc`: whole rows) through [`dispatch::softmax_rows`]: their
    /// input `src` (`None`: in place) and logsumexp slots, with a stage of their own when
    /// `stream`.
    fn rows_block(
        &self,
        r0: usize,
        src: Option<&[f32]>,
        yc: &mut [f32],
        lse: Option<&mut [f32]>,
        stream: bool,
    ) {
        let [_, _, rows, cols] = self.dims;
        let count = yc.len() / cols;
        // Where the mask rows of flat rows `r0 .. r0 + count` start in the mask's slice.
        let starts = |layout: &Tensor4Layout| {
            let mut pos = RowPos::of(r0, self.dims);
            let mut v = Vec::with_capacity(count);
            for _ in 0..count {
                v.push(row_span(layout, pos).0);
                pos = pos.next(self.dims);
            }
            v
        };
        let at;
        let mask = match *self.mask {
            Mask::None => RowsMask::Causal(None),
            Mask::Causal { offset } => {
                RowsMask::Causal(Some((Mask::causal_offset(offset, rows, cols), rows, r0)))
            }
            Mask::Keep { keep, layout } => {
                at = starts(&layout);
                RowsMask::Keep { keep, starts: &at }
            }
            Mask::Bias { bias, layout } => {
                at = starts(&layout);
                RowsMask::Bias { bias, starts: &at }
            }
        };
        let mut stage = if stream { vec![0.0; stream::stage_len(cols)] } else { Vec::new() };
        let stage = stream.then_some(&mut stage[..]);
        let job = RowsJob { src, y: yc, cols, mask, scale: self.scale, lse, stage };
        dispatch::softmax_rows(self.isa, job);
    }

    /// The fast path's layouts with a half-precision `x` or `y` (`n` elements each; `x`
    /// `None`: in place): chunks of about [`HALF_CHUNK`] elements are widened into an f32
    /// buffer (or straight into an f32 `y`), run in place there by [`Self::rows_block`], and
    /// narrowed into `y`. The same values as row by row: widening is exact, the in-place
    /// passes compute what they compute from a separate input, and each output is rounded
    /// once.
    fn run_contiguous_half<Y: Convertible>(
        &self,
        x: Option<&[X]>,
        y: &mut [Y],
        lse: Option<&mut [f32]>,
        par: Parallelism,
    ) {
        let cols = self.dims[3];
        let per = (HALF_CHUNK / cols).max(1);
        let isa = self.isa;
        let task = |r0: usize, yt: &mut [Y], mut lse: Option<&mut [f32]>| {
            let mut buf: Vec<f32> = Vec::new();
            for (c, ys) in yt.chunks_mut(per * cols).enumerate() {
                let r = r0 + c * per;
                let count = ys.len() / cols;
                let l = lse.as_deref_mut().map(|l| &mut l[c * per..c * per + count]);
                let xs = x.map(|x| &x[r * cols..r * cols + ys.len()]);
                if let Some(yf) = Y::as_f32_mut(ys) {
                    // A half-precision input widened straight into the f32 output.
                    if let Some(xs) = xs {
                        convert_into(isa, xs, yf);
                    }
                    self.rows_block(r, None, yf, l, false);
                    continue;
                }
                if buf.len() < ys.len() {
                    buf.resize(ys.len(), 0.0);
                }
                let bf = &mut buf[..ys.len()];
                match xs {
                    Some(xs) => match X::as_f32(xs) {
                        Some(xf) => self.rows_block(r, Some(xf), bf, l, false),
                        None => {
                            convert_into(isa, xs, bf);
                            self.rows_block(r, None, bf, l, false);
                        }
                    },
                    None => {
                        convert_into(isa, &*ys, bf);
                        self.rows_block(r, None, bf, l, false);
                    }
                }
                convert_into(isa, &*bf, ys);
            }
        };
        row_blocks(y, cols, lse, par, min_rows_per_task(cols), task);
    }

    #[allow(clippy::too_many_arguments)]
    fn row(
        &self,
        scratch: &mut Scratch,
        pos: RowPos,
        rows: usize,
        cols: usize,
        y: &mut [f32],
        stream: bool,
        want_lse: bool,
    ) -> f32 {
        scratch.streamed |= stream;
        let Scratch { x: xbuf, bias: bbuf, keep: kbuf, stage, .. } = scratch;
        let i = pos.i;
        let (visible, mask) = match self.mask {
            Mask::None => (cols, RowMask::None),
            Mask::Causal { offset } => {
                let off = Mask::causal_offset(*offset, rows, cols);
                (dispatch::causal_visible(i, off, cols), RowMask::None)
            }
            Mask::Keep { keep, layout } => {
                (cols, RowMask::Keep(gather_mask(keep, layout, pos, kbuf)))
            }
            Mask::Bias { bias, layout } => {
                (cols, RowMask::Bias(gather_mask(bias, layout, pos, bbuf)))
            }
        };
        let src = self.x.as_ref().map(|x| gather(self.isa, x, pos, xbuf));
        let stage = stream.then(|| same_page_phase(stage, visible, &*y));
        // Out of cache, a row PREFETCH_ROWS ahead (usually r + PREFETCH_ROWS, or the last row)
        // is prefetched meanwhile (see stream::PREFETCH_ROWS); in cache, the next row, so that
        // its pass A reads L1 (64×1024 from L2: 2.77 → 2.83 G elem/s, best of 2000 calls).
        let next = match &self.x {
            // Not for empty rows: an empty view's strides need not index anything.
            Some(x) if x.layout.strides[3] == 1 && cols > 0 && pos.r + 1 < self.rows() => {
                let mut ahead = pos.next(self.dims);
                for _ in 1..(if stream { stream::PREFETCH_ROWS } else { 1 }) {
                    if ahead.r + 1 < self.rows() {
                        ahead = ahead.next(self.dims);
                    }
                }
                let (start, cols, _) = row_span(&x.layout, ahead);
                x.data.get(start..start + cols).and_then(X::as_f32)
            }
            _ => None,
        };
        let job = RowJob { src, y, visible, mask, scale: self.scale, stage, next, want_lse };
        dispatch::softmax_row(self.isa, job)
    }
}
