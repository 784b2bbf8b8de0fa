//! Fused scale-mask-softmax over score rows, against the same operation written the way an
//! eager framework runs it (one pass over the tensor per elementary operation), a plain
//! iterator version (per row: max, exp and sum, divide) and the reference. The rate is
//! elements per second; the bandwidth (one read and one write of every element) is compared
//! with the copy bandwidth for that working set, since a fused softmax is memory-bound once
//! the rows leave cache, on buffers placed as the copy's are (`run`).
//!
//! Last, the typed calls (bf16 logits, bf16 or f32 output) beside f32 on the same values
//! (`typed`), each with the bytes it moves.

use attn_kernels::softmax::scale_mask_softmax;
use attn_kernels::{bf16, Parallelism};
use attn_reference::{Mask, Result, Tensor4Layout, TensorMut, TensorRef};
use attn_tests::numerics::{BF16_SUBNORMAL_HALF, BF16_U};
use rayon::prelude::*;

use super::{Call, Ctx, Work};
use crate::check::{compare, softmax_bound, Rng};
use crate::machine::{Placed, DESTINATION_PHASE, L3_WORKING_SET, SOURCE_PHASE};
use crate::record::Shape;

const OP: &str = "softmax";
/// The score scale used throughout (1/√64, as for d_k = 64).
const SCALE: f32 = 0.125;
/// The reference is timed only up to this many elements.
const REFERENCE_MAX_ELEMS: usize = 1 << 17;

/// `(rows, cols, causal)`: one head of `rows` query rows over `cols` keys.
type Case = (usize, usize, bool);

fn grid(quick: bool) -> Vec<Case> {
    if quick {
        vec![(64, 256, true), (512, 1024, false)]
    } else {
        // The two target shapes, the unmasked 64×1024 beside the causal one (the causal
        // rows are 94–100 % visible: ragged lengths, not less work), and the row lengths
        // attention uses (8 heads of L×L, L = 64 and 512, as 8·L rows of L).
        vec![
            (64, 1024, true),
            (64, 1024, false),
            (8192, 4096, false),
            (8 * 64, 64, false),
            (8 * 512, 512, false),
        ]
    }
}

/// One implementation: `y = softmax(scale·x + mask)` over `[batch, heads, rows, cols]`.
struct Impl {
    name: &'static str,
    threaded: bool,
    call: fn(TensorRef<'_>, &Mask<'_>, TensorMut<'_>, usize) -> Result<()>,
}

/// Ours, on buffers placed like the copy's (`Placed`).
const OURS: Impl = Impl { name: "attn-kernels", threaded: true, call: ours };
/// Ours on the out-of-cache shape with input and output placed as plain `Vec`s are
/// ([`VEC_PHASE`]).
const OURS_VEC: Impl = Impl { name: "attn-kernels, Vecs", threaded: true, call: ours };

/// Where this machine's allocator starts a large `Vec` in its page: glibc maps it, and the
/// chunk's header takes the first 16 bytes. Two such buffers share the page phase, and most of
/// their vector loads straddle two lines.
const VEC_PHASE: usize = 16;

/// The bandwidth roof on the same buffers: `x` copied into `y` (`copy_from_slice`, rows split
/// over threads), timed in calls alternating with ours ([`Ctx::bench_alternating`]). The
/// machine's copy figure ("% peak") is the best repetition of its own probe; this one is a
/// median, on the buffers and at the moments of ours, so its ratio to ours ("vs peers")
/// compares like with like on a machine whose speed drifts. Not a softmax: it is left out of
/// the correctness checks.
const COPY: Impl = Impl { name: "copy x → y", threaded: true, call: copy };
/// [`COPY`] on the buffers of [`OURS_VEC`].
const COPY_VEC: Impl = Impl { name: "copy x → y, Vecs", threaded: true, call: copy };

fn copy(x: TensorRef<'_>, _: &Mask<'_>, y: TensorMut<'_>, t: usize) -> Result<()> {
    let n = x.layout.len();
    let (x, y) = (&x.data[..n], &mut y.data[..n]);
    if t > 1 {
        let chunk = n.div_ceil(t).max(1);
        Parallelism::threads(t).install(|| {
            y.par_chunks_mut(chunk).zip(x.par_chunks(chunk)).for_each(|(d, s)| d.copy_from_slice(s))
        });
    } else {
        y.copy_from_slice(x);
    }
    Ok(())
}

fn ours(x: TensorRef<'_>, mask: &Mask<'_>, y: TensorMut<'_>, t: usize) -> Result<()> {
    attn_kernels::softmax::scale_mask_softmax(x, SCALE, mask, y, None, Parallelism::threads(t))
}

/// The peers, timed one after the other after ours.
const PEERS: &[Impl] = &[
    Impl { name: "unfused", threaded: true, call: |x, mask, y, t| unfused(x, SCALE, mask, y, t) },
    Impl { name: "iterator", threaded: true, call: |x, mask, y, t| iterator(x, SCALE, mask, y, t) },
    Impl {
        name: "reference",
        threaded: false,
        call: |x, mask, y, _| attn_reference::softmax::scale_mask_softmax(x, SCALE, mask, y, None),
    },
];

/// The unfused chain: scale, mask, row max, exp, row sum, divide, each a separate pass over the
/// whole tensor through a temporary, the way an eager framework without a fused kernel runs it
/// (plain Rust, `f32::exp`; rows split over threads). Contiguous `[batch, heads, rows, cols]`
/// tensors with a `None` or causal mask only; it follows the fully-masked-row convention.
pub fn unfused(
    x: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    y: TensorMut<'_>,
    threads: usize,
) -> Result<()> {
    let Some(Plain { x, y, rows, cols, offset }) = plain_args(x, y, mask)? else {
        return Ok(());
    };
    let n = x.len();
    let n_rows = n / cols;
    let mut t = vec![0.0f32; n];
    let mut max = vec![0.0f32; n_rows];
    let mut sum = vec![0.0f32; n_rows];
    Parallelism::threads(threads).install(|| {
        // 1. t = scale·x
        rows_mut(&mut t, cols, threads, |r, row| {
            for (o, &v) in row.iter_mut().zip(&x[r * cols..(r + 1) * cols]) {
                *o = scale * v;
            }
        });
        // 2. masked scores → −∞
        if let Some(off) = offset {
            rows_mut(&mut t, cols, threads, |r, row| {
                row[first_hidden(r % rows.max(1), off, cols)..].fill(f32::NEG_INFINITY);
            });
        }
        // 3. row max
        rows_mut(&mut max, 1, threads, |r, m| {
            m[0] = t[r * cols..(r + 1) * cols].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        });
        // 4. t = exp(t − max); a fully masked row (max = −∞) becomes zeros, not NaN
        rows_mut(&mut t, cols, threads, |r, row| {
            let m = max[r];
            for v in row.iter_mut() {
                *v = if m == f32::NEG_INFINITY { 0.0 } else { (*v - m).exp() };
            }
        });
        // 5. row sum
        rows_mut(&mut sum, 1, threads, |r, s| s[0] = t[r * cols..(r + 1) * cols].iter().sum());
        // 6. y = t / sum
        rows_mut(y, cols, threads, |r, row| {
            let s = sum[r];
            for (o, &v) in row.iter_mut().zip(&t[r * cols..(r + 1) * cols]) {
                *o = if s > 0.0 { v / s } else { 0.0 };
            }
        });
    });
    Ok(())
}

/// The plain iterator version: per row, the max of the scaled logits, then `exp` and the sum,
/// then `exp` recomputed and divided by the sum (three iterator passes over the row,
/// `f32::exp`, no temporaries; rows split over threads). The same tensors and masks as
/// [`unfused`].
pub fn iterator(
    x: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    y: TensorMut<'_>,
    threads: usize,
) -> Result<()> {
    let Some(Plain { x, y, rows, cols, offset }) = plain_args(x, y, mask)? else {
        return Ok(());
    };
    Parallelism::threads(threads).install(|| {
        rows_mut(y, cols, threads, |r, yr| {
            let xr = &x[r * cols..(r + 1) * cols];
            let vis = offset.map_or(cols, |off| first_hidden(r % rows.max(1), off, cols));
            let m = xr[..vis].iter().map(|v| v * scale).fold(f32::NEG_INFINITY, f32::max);
            if m == f32::NEG_INFINITY {
                yr.fill(0.0); // fully masked (or all −∞): zeros, not NaN
                return;
            }
            let s: f32 = xr[..vis].iter().map(|v| (v * scale - m).exp()).sum();
            for (o, v) in yr[..vis].iter_mut().zip(&xr[..vis]) {
                *o = (v * scale - m).exp() / s;
            }
            yr[vis..].fill(0.0);
        });
    });
    Ok(())
}

/// The plain peers' view of their arguments: the contiguous data, the sizes, the causal offset.
struct Plain<'a> {
    x: &'a [f32],
    y: &'a mut [f32],
    rows: usize,
    cols: usize,
    offset: Option<isize>,
}

/// Checks the plain peers' arguments (contiguous `[batch, heads, rows, cols]` tensors, a `None`
/// or causal mask) and returns their view, `None` when rows are empty (`cols = 0`).
fn plain_args<'a>(
    x: TensorRef<'a>,
    y: TensorMut<'a>,
    mask: &Mask<'_>,
) -> Result<Option<Plain<'a>>> {
    let [batch, heads, rows, cols] = x.layout.dims;
    let contiguous = Tensor4Layout::bhsd(batch, heads, rows, cols);
    if x.layout != contiguous || y.layout != contiguous {
        return Err(attn_reference::Error::InvalidParameter {
            arg: "x",
            requirement: "plain peers: contiguous tensors only",
        });
    }
    let offset = match *mask {
        Mask::None => None,
        Mask::Causal { offset } => Some(Mask::causal_offset(offset, rows, cols)),
        _ => {
            return Err(attn_reference::Error::InvalidParameter {
                arg: "mask",
                requirement: "plain peers: none or causal",
            })
        }
    };
    x.check("x")?;
    y.check("y")?;
    if cols == 0 {
        return Ok(None);
    }
    let n = x.layout.len();
    Ok(Some(Plain { x: &x.data[..n], y: &mut y.data[..n], rows, cols, offset }))
}

/// The first masked column of row `i` under a causal mask with offset `off` (`cols` when none).
fn first_hidden(i: usize, off: isize, cols: usize) -> usize {
    (i as isize).saturating_add(off).saturating_add(1).clamp(0, cols as isize) as usize
}

/// Calls `f(r, row)` for each `cols`-wide row of `data`, over rayon's current pool when
/// `threads > 1`.
fn rows_mut(data: &mut [f32], cols: usize, threads: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if threads > 1 {
        data.par_chunks_mut(cols).enumerate().for_each(|(r, row)| f(r, row));
    } else {
        data.chunks_mut(cols).enumerate().for_each(|(r, row)| f(r, row));
    }
}

fn shape(batch: usize, heads: usize, rows: usize, cols: usize, mask: &'static str) -> Shape {
    Shape::Attn { batch, heads, kv_heads: 0, nq: rows, nk: cols, dk: 0, dv: 0, mask }
}

/// Checks every implementation on odd sizes with several heads: no mask, the default causal
/// mask, and a causal offset of −1, whose first row of every head is fully masked.
fn checks(ctx: &mut Ctx) {
    let (batch, heads, rows, cols) = (2, 3, 37, 301);
    let layout = Tensor4Layout::bhsd(batch, heads, rows, cols);
    let x = Rng::new(0x50f7).vec(layout.len());
    let xr = TensorRef::new(&x, layout);
    let cases: [(Mask<'static>, &'static str); 3] = [
        (Mask::None, "none"),
        (Mask::Causal { offset: None }, "causal"),
        (Mask::Causal { offset: Some(-1) }, "causal, offset -1"),
    ];
    for (mask, label) in cases {
        let mut want = vec![0.0; layout.len()];
        if let Err(e) = attn_reference::softmax::scale_mask_softmax(
            xr,
            SCALE,
            &mask,
            TensorMut::new(&mut want, layout),
            None,
        ) {
            ctx.check(
                OP,
                "reference",
                shape(batch, heads, rows, cols, label),
                1,
                Err(e.to_string()),
            );
            continue;
        }
        let bound = softmax_bound(&xr, SCALE, &want);
        for imp in [&OURS].into_iter().chain(PEERS).filter(|i| i.name != "reference") {
            for &t in ctx.threads.clone().iter().filter(|&&t| t == 1 || imp.threaded) {
                let mut got = vec![f32::NAN; layout.len()];
                let r = (imp.call)(xr, &mask, TensorMut::new(&mut got, layout), t);
                let v = r.map(|()| compare(&got, &want, &bound)).map_err(|e| e.to_string());
                ctx.check(OP, imp.name, shape(batch, heads, rows, cols, label), t, v);
            }
        }
    }
}

/// Runs the section. Every case's input and output are placed as the copy bandwidth's source
/// and destination are (line-aligned, half a page apart: `Placed`), as an engine's tensors
/// are at least line-aligned; ours also runs the out-of-cache shape on buffers placed as
/// plain `Vec`s are (`VEC_PHASE`).
pub fn run(ctx: &mut Ctx) {
    checks(ctx);
    for case in grid(ctx.quick) {
        bench_case(ctx, case, [&OURS, &COPY], PEERS, (SOURCE_PHASE, DESTINATION_PHASE));
    }
    if !ctx.quick {
        let case = (8192, 4096, false);
        bench_case(ctx, case, [&OURS_VEC, &COPY_VEC], &[], (VEC_PHASE, VEC_PHASE));
    }
    typed(ctx);
}

/// Checks the typed calls of [`typed`] on the odd sizes of [`checks`], causal: bf16 logits,
/// bf16 or f32 output, against the reference on the values the bf16 logits represent. An f32
/// output is held to the f32 bound; a bf16 output to that bound plus its one rounding to bf16
/// (`2⁻⁸` of the value, and half the smallest bf16 subnormal).
fn typed_checks(ctx: &mut Ctx) {
    let (batch, heads, rows, cols) = (2, 3, 37, 301);
    let layout = Tensor4Layout::bhsd(batch, heads, rows, cols);
    let n = layout.len();
    let xb: Vec<bf16> = Rng::new(0x50f8).vec(n).into_iter().map(bf16::from_f32).collect();
    let xf: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
    let mask = Mask::Causal { offset: None };
    let shape = shape(batch, heads, rows, cols, "causal");
    let xr = TensorRef::new(&xf[..], layout);
    let mut want = vec![0.0; n];
    let wv = TensorMut::new(&mut want, layout);
    if let Err(e) = attn_reference::softmax::scale_mask_softmax(xr, SCALE, &mask, wv, None) {
        return ctx.check(OP, "reference", shape, 1, Err(e.to_string()));
    }
    let bound = softmax_bound(&xr, SCALE, &want);
    let rounded: Vec<f64> = bound
        .iter()
        .zip(&want)
        .map(|(b, w)| b * (1.0 + BF16_U) + BF16_U * f64::from(w.abs()) + BF16_SUBNORMAL_HALF)
        .collect();
    let x = TensorRef::new(&xb[..], layout);
    for &t in &ctx.threads.clone() {
        let par = Parallelism::threads(t);
        let mut yb = vec![bf16::NAN; n];
        let r = scale_mask_softmax(x, SCALE, &mask, TensorMut::new(&mut yb[..], layout), None, par);
        let got: Vec<f32> = yb.iter().map(|v| v.to_f32()).collect();
        let v = r.map(|()| compare(&got, &want, &rounded)).map_err(|e| e.to_string());
        ctx.check(OP, "attn-kernels bf16 → bf16", shape.clone(), t, v);
        let mut yf = vec![f32::NAN; n];
        let r = scale_mask_softmax(x, SCALE, &mask, TensorMut::new(&mut yf[..], layout), None, par);
        let v = r.map(|()| compare(&yf, &want, &bound)).map_err(|e| e.to_string());
        ctx.check(OP, "attn-kernels bf16 → f32", shape.clone(), t, v);
    }
}

/// Softmax with bf16 logits writing bf16 or f32, beside the f32 call on the same (widened)
/// values: what the half-precision path (chunks of rows widened into an f32 buffer, run in
/// place, the output narrowed back) costs or saves per element. Each row's bandwidth counts
/// the bytes that call moves (8, 4 and 6 per element); the rate is elements per second. The
/// three run in alternating calls, so their ratios compare the same moments of the machine.
fn typed(ctx: &mut Ctx) {
    typed_checks(ctx);
    let cases: &[(usize, usize)] =
        if ctx.quick { &[(512, 1024)] } else { &[(8 * 512, 512), (8192, 4096)] };
    for &(rows, cols) in cases {
        let layout = Tensor4Layout::bhsd(1, 1, rows, cols);
        let n = layout.len();
        let xb: Vec<bf16> =
            Rng::new((rows * cols) as u64).vec(n).into_iter().map(bf16::from_f32).collect();
        let xf: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
        let (mut yf, mut yb, mut yw) = (vec![0.0f32; n], vec![bf16::ZERO; n], vec![0.0f32; n]);
        let shape = shape(1, 1, rows, cols, "none");
        let elems = (rows * cols) as f64;
        let work = |per_elem: f64| Work::Elems { elems, bytes: per_elem * elems };
        let soft = attn_kernels::softmax::scale_mask_softmax::<f32, f32>;
        let soft_bb = attn_kernels::softmax::scale_mask_softmax::<bf16, bf16>;
        let soft_bf = attn_kernels::softmax::scale_mask_softmax::<bf16, f32>;
        for &t in &ctx.threads.clone() {
            let par = Parallelism::threads(t);
            let (x, xh) = (TensorRef::new(&xf[..], layout), TensorRef::new(&xb[..], layout));
            let e = |r: attn_kernels::Result<()>| r.map_err(|e| e.to_string());
            let mut f32_call =
                || e(soft(x, SCALE, &Mask::None, TensorMut::new(&mut yf[..], layout), None, par));
            let mut bb_call = || {
                e(soft_bb(xh, SCALE, &Mask::None, TensorMut::new(&mut yb[..], layout), None, par))
            };
            let mut bf_call = || {
                e(soft_bf(xh, SCALE, &Mask::None, TensorMut::new(&mut yw[..], layout), None, par))
            };
            let imps: &mut [(_, Call<'_>)] = &mut [
                ("attn-kernels f32", &mut f32_call),
                ("attn-kernels bf16 → bf16", &mut bb_call),
                ("attn-kernels bf16 → f32", &mut bf_call),
            ];
            let works = [work(8.0), work(4.0), work(6.0)];
            ctx.bench_alternating_each(OP, shape.clone(), t, &works, None, imps);
        }
    }
}

/// Bytes a softmax of `rows × cols` moves: every element read once and written once.
fn work_bytes(rows: usize, cols: usize) -> usize {
    8 * rows * cols
}

/// Times ours and the copy, then `peers`, on one case, the input and output starting at the
/// given offsets into a page. Out of cache (the case whose figure is a fraction of the copy
/// bandwidth) ours and the copy run in alternating calls; in cache one after the other, so
/// that a call of a few microseconds does not start while the threaded copy's workers are
/// still spinning (rayon's workers spin a while before they sleep) on the core it runs on.
fn bench_case(
    ctx: &mut Ctx,
    (rows, cols, causal): Case,
    [ours, copy]: [&Impl; 2],
    peers: &[Impl],
    (x_phase, y_phase): (usize, usize),
) {
    let layout = Tensor4Layout::bhsd(1, 1, rows, cols);
    let mut x = Placed::at(layout.len(), x_phase);
    x.get_mut().copy_from_slice(&Rng::new((rows * cols) as u64).vec(layout.len()));
    let x = x.get();
    let mut y = Placed::at(layout.len(), y_phase);
    let y = y.get_mut();
    let (mask, label) =
        if causal { (Mask::Causal { offset: None }, "causal") } else { (Mask::None, "none") };
    let elems = (rows * cols) as f64;
    let work = Work::Elems { elems, bytes: work_bytes(rows, cols) as f64 };
    let shape = shape(1, 1, rows, cols, label);
    let out_of_cache = work_bytes(rows, cols) > L3_WORKING_SET;
    for &t in &ctx.threads.clone() {
        // Both write `y`: each closure borrows it for its own call only.
        let y = std::cell::RefCell::new(&mut *y);
        let call = |imp: &Impl| {
            (imp.call)(
                TensorRef::new(x, layout),
                &mask,
                TensorMut::new(&mut y.borrow_mut(), layout),
                t,
            )
        };
        if out_of_cache {
            let mut a = || call(ours).map_err(|e| e.to_string());
            let mut b = || call(copy).map_err(|e| e.to_string());
            let imps: &mut [(_, Call<'_>)] = &mut [(ours.name, &mut a), (copy.name, &mut b)];
            ctx.bench_alternating(OP, shape.clone(), t, work, None, imps);
        } else {
            for imp in [ours, copy] {
                ctx.bench(OP, imp.name, shape.clone(), t, work, None, || call(imp));
            }
        }
        for imp in peers {
            if (t > 1 && !imp.threaded)
                || (imp.name == "reference" && rows * cols > REFERENCE_MAX_ELEMS)
            {
                continue;
            }
            ctx.bench(OP, imp.name, shape.clone(), t, work, None, || call(imp));
        }
    }
}
