//! The passes of one fused softmax row, written once over [`Simd`] (run by `dispatch.rs`).
//!
//! The fused softmax row makes three passes over the row, reading the input
//! (and mask) twice while it sits in L1/L2 and writing the output once:
//! - pass A: `m = max_j z_j` and `min_j z_j`, where `z_j = scale·x_j (+ bias_j)`, masked
//!   `z_j = −∞`, NaN skipped;
//! - pass B: `e_j = exp(z_j − m)` by the softmax's exp (1.5 ULP, arguments `≤ 0`): the table
//!   exp when `min − m ≥ LUT8_MIN` (8 FMA-pipe operations per vector); when the min is `−∞`
//!   (masked logits) the table exp with those lanes zeroed, group by group, unless the group
//!   holds a finite lane below its range ([`MaskedTableExp`]); else the full-range one (13),
//!   stored to the output row (or to a staging buffer when streaming), `s = Σ e_j`.
//!   With a power-of-two scale (`1/√d_k` for `d_k` = 16, 64, 256) the table exp runs on
//!   `x_j − max_j x_j` with the scale folded into its constants (the same bits, one multiply
//!   per vector fewer);
//! - pass C: `y_j = e_j · (1/s)`; when streaming, with non-temporal stores, and in a block of
//!   rows (`RowsJob::stage`) deferred into the next row's passes A and B ([`Drain`]), so
//!   that the row's write stream overlaps the next row's reads and exp; the next row stages
//!   its terms in the same buffer, behind the drain ([`Drain::clear`]).
//!
//! Costs: the exp is about half of the time, passes A and C a sixth each. One exp is a
//! dependency chain of ~35 cycles, so pass B runs [`EXP_UNROLL`] vectors interleaved per
//! iteration; pass A takes the max of the raw input and scales it once when `scale > 0` (no
//! multiply per element); pass C is a load, a multiply and a store. Per row, nothing divides
//! and the f64 logsumexp is only formed when the caller asks for it. Alternatives that were
//! measured and dropped are in `docs/perf-journal.md`.
//!
//! `z_j` is recomputed in pass B rather than stored in pass A, which saves one store and one
//! load per element; both passes compute it by the same [`Logits`] code, so the values agree
//! bit for bit. Rows whose max is not finite, or whose sum is NaN, take a slow scalar path that
//! implements the reference's conventions (see `softmax/mod.rs`).

use std::cell::Cell;

use super::stream::{Drain, FarOrder, DRAIN_PER_A, DRAIN_PER_B};
use crate::arch::{
    keep, keep_tail, load, load_cells, load_tail, load_tail_cells, store, store_cells,
    store_tail_cells, Floats, Simd,
};
use crate::math::exp::{exp_neg_lut8_p3_folded, exp_neg_rr2_p6, Lut8Consts, EXP_UNROLL, LUT8_MIN};

/// How the logits `z_j` of a row are formed from the input and the mask, one vector at a time,
/// for `j <` [`len`](Self::len) (the row's visible length; indices beyond it panic).
/// Implementations are the only place the mask kinds differ.
pub(super) trait Logits<S: Simd>: Copy {
    /// The row's visible length `n`.
    fn len(&self) -> usize;
    /// The logits `j..j + len` of the row, or `None` when they are not all inside. Loops take
    /// a window per iteration (its test is the loop condition) and index it at constant
    /// offsets, so that no load needs a bounds check of its own.
    fn window(&self, j: usize, len: usize) -> Option<Self>;
    /// `z[j .. j + LANES]`.
    fn vec(&self, j: usize) -> S::V;
    /// `z[j .. j + k]`, `k < LANES`, lanes `≥ k` set to `−∞`.
    fn tail(&self, j: usize, k: usize) -> S::V;
    /// True when `z_j = scale·u_j` with `u_j` what [`raw`](Self::raw) returns (masked lanes
    /// `−∞`): then for `scale > 0` the row max is `scale·max_j u_j`, bit for bit (rounding is
    /// monotone), and pass A needs no multiply.
    const SCALE_AFTER: bool;
    /// `u[j .. j + LANES]` (only called when [`SCALE_AFTER`](Self::SCALE_AFTER)).
    fn raw(&self, j: usize) -> S::V;
    /// `u[j .. j + k]`, lanes `≥ k` set to `−∞`.
    fn raw_tail(&self, j: usize, k: usize) -> S::V;
    /// The input row (`x`), for its alignment.
    fn input(&self) -> Floats<'_>;
}

/// The unscaled values of a [`Logits::SCALE_AFTER`] row, as logits of their own.
#[derive(Clone, Copy)]
struct Raw<L>(L);

impl<S: Simd, L: Logits<S>> Logits<S> for Raw<L> {
    const SCALE_AFTER: bool = false;
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn window(&self, j: usize, len: usize) -> Option<Self> {
        Some(Raw(self.0.window(j, len)?))
    }
    #[inline(always)]
    fn vec(&self, j: usize) -> S::V {
        self.0.raw(j)
    }
    #[inline(always)]
    fn tail(&self, j: usize, k: usize) -> S::V {
        self.0.raw_tail(j, k)
    }
    #[inline(always)]
    fn raw(&self, j: usize) -> S::V {
        self.0.raw(j)
    }
    #[inline(always)]
    fn raw_tail(&self, j: usize, k: usize) -> S::V {
        self.0.raw_tail(j, k)
    }
    #[inline(always)]
    fn input(&self) -> Floats<'_> {
        self.0.input()
    }
}

/// Unmasked logits `z_j = scale·x_j` (a causal mask is a shorter row).
#[derive(Clone, Copy)]
pub(super) struct Plain<'a, S: Simd> {
    s: S,
    x: Floats<'a>,
    scale: S::V,
}
/// Keep-masked logits: `z_j = scale·x_j` where `keep_j`, `−∞` elsewhere.
#[derive(Clone, Copy)]
pub(super) struct Keep<'a, S: Simd> {
    s: S,
    x: Floats<'a>,
    keep: &'a [bool],
    scale: S::V,
}
/// Biased logits: `z_j = fma(scale, x_j, bias_j)`.
#[derive(Clone, Copy)]
pub(super) struct Bias<'a, S: Simd> {
    s: S,
    x: Floats<'a>,
    bias: &'a [f32],
    scale: S::V,
}

impl<'a, S: Simd> Plain<'a, S> {
    /// The logits of the row `x` (its length is the row's).
    #[inline(always)]
    pub(super) fn new(s: S, x: Floats<'a>, scale: S::V) -> Self {
        Plain { s, x, scale }
    }
}
impl<'a, S: Simd> Keep<'a, S> {
    /// The logits of the row `x` under the mask row `keep` (at least as long; panics otherwise).
    #[inline(always)]
    pub(super) fn new(s: S, x: Floats<'a>, keep: &'a [bool], scale: S::V) -> Self {
        Keep { s, x, keep: &keep[..x.len()], scale }
    }
}
impl<'a, S: Simd> Bias<'a, S> {
    /// The logits of the row `x` plus the bias row `bias` (at least as long; panics otherwise).
    #[inline(always)]
    pub(super) fn new(s: S, x: Floats<'a>, bias: &'a [f32], scale: S::V) -> Self {
        Bias { s, x, bias: &bias[..x.len()], scale }
    }
}

impl<S: Simd> Logits<S> for Plain<'_, S> {
    const SCALE_AFTER: bool = true;
    #[inline(always)]
    fn len(&self) -> usize {
        self.x.len()
    }
    #[inline(always)]
    fn window(&self, j: usize, len: usize) -> Option<Self> {
        Some(Plain { x: self.x.window(j, len)?, ..*self })
    }
    #[inline(always)]
    fn vec(&self, j: usize) -> S::V {
        self.s.mul(self.scale, self.x.load(self.s, j))
    }
    #[inline(always)]
    fn tail(&self, j: usize, k: usize) -> S::V {
        let s = self.s;
        let z = s.mul(self.scale, self.x.load_tail(s, j, k));
        s.select(s.first(k), z, s.splat(f32::NEG_INFINITY))
    }
    #[inline(always)]
    fn raw(&self, j: usize) -> S::V {
        self.x.load(self.s, j)
    }
    #[inline(always)]
    fn raw_tail(&self, j: usize, k: usize) -> S::V {
        let s = self.s;
        s.select(s.first(k), self.x.load_tail(s, j, k), s.splat(f32::NEG_INFINITY))
    }
    #[inline(always)]
    fn input(&self) -> Floats<'_> {
        self.x
    }
}
impl<S: Simd> Logits<S> for Keep<'_, S> {
    const SCALE_AFTER: bool = true;
    #[inline(always)]
    fn len(&self) -> usize {
        self.x.len()
    }
    #[inline(always)]
    fn window(&self, j: usize, len: usize) -> Option<Self> {
        let x = self.x.window(j, len)?;
        Some(Keep { x, keep: self.keep.get(j..j + len)?, ..*self })
    }
    #[inline(always)]
    fn vec(&self, j: usize) -> S::V {
        // The mask is applied after the scale: `0·(−∞)` would be NaN.
        let s = self.s;
        let z = s.mul(self.scale, self.x.load(s, j));
        s.select(keep(s, &self.keep[j..]), z, s.splat(f32::NEG_INFINITY))
    }
    #[inline(always)]
    fn tail(&self, j: usize, k: usize) -> S::V {
        let s = self.s;
        let z = s.mul(self.scale, self.x.load_tail(s, j, k));
        s.select(keep_tail(s, &self.keep[j..j + k]), z, s.splat(f32::NEG_INFINITY))
    }
    #[inline(always)]
    fn raw(&self, j: usize) -> S::V {
        let s = self.s;
        s.select(keep(s, &self.keep[j..]), self.x.load(s, j), s.splat(f32::NEG_INFINITY))
    }
    #[inline(always)]
    fn raw_tail(&self, j: usize, k: usize) -> S::V {
        let s = self.s;
        let u = self.x.load_tail(s, j, k);
        s.select(keep_tail(s, &self.keep[j..j + k]), u, s.splat(f32::NEG_INFINITY))
    }
    #[inline(always)]
    fn input(&self) -> Floats<'_> {
        self.x
    }
}
impl<S: Simd> Logits<S> for Bias<'_, S> {
    const SCALE_AFTER: bool = false;
    #[inline(always)]
    fn len(&self) -> usize {
        self.x.len()
    }
    #[inline(always)]
    fn window(&self, j: usize, len: usize) -> Option<Self> {
        let x = self.x.window(j, len)?;
        Some(Bias { x, bias: self.bias.get(j..j + len)?, ..*self })
    }
    #[inline(always)]
    fn raw(&self, j: usize) -> S::V {
        self.vec(j)
    }
    #[inline(always)]
    fn raw_tail(&self, j: usize, k: usize) -> S::V {
        self.tail(j, k)
    }
    #[inline(always)]
    fn vec(&self, j: usize) -> S::V {
        let s = self.s;
        s.fma(self.scale, self.x.load(s, j), load(s, &self.bias[j..]))
    }
    #[inline(always)]
    fn tail(&self, j: usize, k: usize) -> S::V {
        let s = self.s;
        let z = s.fma(self.scale, self.x.load_tail(s, j, k), load_tail(s, &self.bias[j..j + k]));
        s.select(s.first(k), z, s.splat(f32::NEG_INFINITY))
    }
    #[inline(always)]
    fn input(&self) -> Floats<'_> {
        self.x
    }
}

/// Vectors per iteration of the light loops (passes A and C): their bodies are a few
/// instructions per vector, so loop control is amortised over four (at one or two vectors
/// per iteration it was a fifth of the softmax's instructions).
pub(super) const UNROLL: usize = 4;
const _: () = assert!(UNROLL == 4, "range_pass reduces four accumulators by hand");

/// Pass A: `(max_j z_j, min_j z_j)` over the row's logits, NaN skipped, `(−∞, +∞)` when
/// empty. Four accumulators of each kind, one per vector of an iteration. With `DRAIN`, each
/// iteration also writes [`DRAIN_PER_A`] vectors of `drain` (the previous streamed row's
/// pass C).
///
/// The elements before the input's first `LANES × 4`-byte boundary come first, on their own,
/// so that the loop's loads do not straddle cache lines (max and min are exact in any order:
/// the result is the same bits). Pass A is the first read of a row, from L2 or memory, where a
/// load across two lines holds two fill buffers.
#[inline(always)]
pub(super) fn range_pass<S: Simd, L: Logits<S>, const DRAIN: bool>(
    s: S,
    z: &L,
    drain: &mut Drain<'_, S>,
) -> (f32, f32) {
    let (l, n) = (S::LANES, z.len());
    let mut hi = [s.splat(f32::NEG_INFINITY); UNROLL];
    let mut lo = [s.splat(f32::INFINITY); UNROLL];
    let head = z.input().lanes_to_boundary::<S>();
    if head > 0 {
        let v = z.tail(0, head);
        hi[0] = s.max_skip_nan(hi[0], v);
        lo[0] = s.min_skip_nan(lo[0], s.select(s.first(head), v, s.splat(f32::INFINITY)));
    }
    let mut j = head;
    while let Some(zw) = z.window(j, UNROLL * l) {
        for u in 0..UNROLL {
            let v = zw.vec(u * l);
            hi[u] = s.max_skip_nan(hi[u], v);
            lo[u] = s.min_skip_nan(lo[u], v);
        }
        if DRAIN {
            drain.step::<DRAIN_PER_A>();
        }
        j += UNROLL * l;
    }
    for u in 0..UNROLL {
        if j + l <= n {
            let v = z.vec(j);
            hi[u] = s.max_skip_nan(hi[u], v);
            lo[u] = s.min_skip_nan(lo[u], v);
            j += l;
        } else if j < n {
            let k = n - j;
            let v = z.tail(j, k);
            hi[u] = s.max_skip_nan(hi[u], v);
            // The padding lanes are −∞ too: only the first k count for the min.
            lo[u] = s.min_skip_nan(lo[u], s.select(s.first(k), v, s.splat(f32::INFINITY)));
            j = n;
        }
    }
    let hi = s.max_skip_nan(s.max_skip_nan(hi[0], hi[1]), s.max_skip_nan(hi[2], hi[3]));
    let lo = s.min_skip_nan(s.min_skip_nan(lo[0], lo[1]), s.min_skip_nan(lo[2], lo[3]));
    (s.reduce_max(hi), s.reduce_min(lo))
}

/// Pass A with the scale taken out where that is exact (module docs): `(max_j z_j, min_j z_j)`,
/// and the max of the raw input when it was taken on that (`scale` is the scale `z` applies).
#[inline(always)]
fn logits_range<S: Simd, L: Logits<S>, const DRAIN: bool>(
    s: S,
    z: &L,
    scale: f32,
    drain: &mut Drain<'_, S>,
) -> ((f32, f32), Option<f32>) {
    if L::SCALE_AFTER && scale > 0.0 {
        let (hi, lo) = range_pass::<S, _, DRAIN>(s, &Raw(*z), drain);
        ((scale * hi, scale * lo), Some(hi))
    } else {
        (range_pass::<S, L, DRAIN>(s, z, drain), None)
    }
}

/// The exp pass B applies to a group of [`EXP_UNROLL`] vectors of `z_j − m`.
trait GroupExp {
    /// `exp` of each lane (times the scale folded into `c`, for the table exp); lanes outside
    /// the implementation's domain give unspecified values.
    fn exp<S: Simd>(s: S, d: [S::V; EXP_UNROLL], c: &Lut8Consts<S>) -> [S::V; EXP_UNROLL];
    /// True when pass B runs the lanes below its threshold on 0, zeroes their result and
    /// notes whether any of them was finite ([`exp_sum_pass`]).
    const MASKED: bool = false;
}

/// The softmax's table exp ([`exp_neg_lut8_p3_folded`]): every lane `≥ LUT8_MIN` or NaN (after
/// the folded scale). Rows whose range `min_j z_j − m` is at least [`LUT8_MIN`] (no `−∞`, no
/// masked lane) run on it.
struct TableExp;
/// [`TableExp`] for rows that hold `−∞` (masked logits): `−∞` lanes give 0, and pass B runs a
/// group that holds a finite lane below [`LUT8_MIN`] on [`FullExp`] ([`exp_sum_pass`]). About
/// six operations per vector on top of the table exp's 8, against the full-range exp's 13
/// and its own select.
struct MaskedTableExp;
/// The softmax's full-range exp ([`exp_neg_rr2_p6`]): any lane `≤ 0`, `−∞` included.
struct FullExp;

impl GroupExp for TableExp {
    #[inline(always)]
    fn exp<S: Simd>(s: S, d: [S::V; EXP_UNROLL], c: &Lut8Consts<S>) -> [S::V; EXP_UNROLL] {
        exp_neg_lut8_p3_folded::<S, EXP_UNROLL>(s, d, c)
    }
}
impl GroupExp for MaskedTableExp {
    const MASKED: bool = true;
    #[inline(always)]
    fn exp<S: Simd>(s: S, d: [S::V; EXP_UNROLL], c: &Lut8Consts<S>) -> [S::V; EXP_UNROLL] {
        exp_neg_lut8_p3_folded::<S, EXP_UNROLL>(s, d, c)
    }
}
impl GroupExp for FullExp {
    #[inline(always)]
    fn exp<S: Simd>(s: S, d: [S::V; EXP_UNROLL], _: &Lut8Consts<S>) -> [S::V; EXP_UNROLL] {
        exp_neg_rr2_p6::<S, EXP_UNROLL>(s, d)
    }
}

/// Pass B: `w_j = exp(z_j − m)` for `j < n` (stored when `STORE`) by the exp `E` (of the
/// scale folded into `c` times `z_j − m`, for the table exp); returns `Σ w_j`. Prefetches
/// `next` along the way, one cache line per 16 floats, in order into L1, or into L2 in
/// [`FarOrder`] when `FAR` (a row several rows ahead in a streamed call), then also writing
/// [`DRAIN_PER_B`] vectors of `drain` per whole group, and before each group's stores as many
/// more as [`Drain::clear`] needs (`w` is then the stage the drain reads, at `w_at` in it).
/// With `E::MASKED`, `−∞` lanes give 0 and groups holding a finite difference below
/// `dead_below` (the table's range) take the full-range exp of `d_scale` times the differences.
///
/// Every `z_j − m` must be in `E`'s domain (for [`MaskedTableExp`], `≤ 0`: the pass checks the
/// rest itself), else the terms are unspecified. `w` (when `STORE`, `n` cells) may be the input
/// row itself: each vector is read before it is written.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn exp_sum_pass<S: Simd, L: Logits<S>, E: GroupExp, const STORE: bool, const FAR: bool>(
    s: S,
    z: &L,
    m: f32,
    (w, w_at): (&[Cell<f32>], usize),
    next: Floats<'_>,
    c: &Lut8Consts<S>,
    (dead_below, d_scale): (f32, f32),
    drain: &mut Drain<'_, S>,
) -> f32 {
    let (l, n) = (S::LANES, z.len());
    let w = &w[..if STORE { n } else { 0 }];
    let mv = s.splat(m);
    // The exp of a group of differences `d`. With `E::MASKED`, lanes below `dead_below`
    // run on 0 and give 0; a group where one of them is finite (its exp is not 0) runs on
    // the full-range exp of `d_scale·d` (the scale the table exp folds in) instead, before
    // anything of it is stored.
    let (below, dsc) = (s.splat(dead_below), s.splat(d_scale));
    macro_rules! exp {
        ($d:expr) => {{
            let d = $d;
            if E::MASKED {
                let (mut live, mut dead) = (d, [s.first(0); EXP_UNROLL]);
                let mut finite = s.splat(0.0);
                for (u, du) in d.iter().enumerate() {
                    dead[u] = s.lt(*du, below);
                    live[u] = s.select(dead[u], s.splat(0.0), *du);
                    let f = s.select(s.lt(*du, s.splat(f32::MIN)), s.splat(0.0), *du);
                    finite = s.min_skip_nan(finite, f);
                }
                if s.any_lt(finite, below) {
                    let mut full = d;
                    for fu in &mut full {
                        *fu = s.mul(*fu, dsc);
                    }
                    FullExp::exp::<S>(s, full, c)
                } else {
                    let mut e = E::exp::<S>(s, live, c);
                    for (eu, mu) in e.iter_mut().zip(&dead) {
                        *eu = s.select(*mu, s.splat(0.0), *eu);
                    }
                    e
                }
            } else {
                E::exp::<S>(s, d, c)
            }
        }};
    }
    let (mut s0, mut s1) = (s.splat(0.0), s.splat(0.0));
    // Two accumulators: the adds are a chain of their own (four take registers from the
    // exp that cost more than the shorter chains gain). Macros,
    // not closures, here and below: closures do not inherit `#[target_feature]`, so the
    // intrinsics in one that the compiler leaves out of line become calls.
    macro_rules! add {
        ($e:expr) => {
            for (u, eu) in $e.iter().enumerate() {
                if u % 2 == 0 {
                    s0 = s.add(s0, *eu);
                } else {
                    s1 = s.add(s1, *eu);
                }
            }
        };
    }
    let g = EXP_UNROLL * l;
    // One whole group at `j`, whose logits are the window `zw`.
    macro_rules! group {
        ($j:expr, $zw:expr) => {{
            let (j, zw) = ($j, $zw);
            let mut d = [s.splat(0.0); EXP_UNROLL];
            for (u, du) in d.iter_mut().enumerate() {
                *du = s.sub(zw.vec(u * l), mv);
            }
            let e = exp!(d);
            if STORE {
                if FAR {
                    drain.clear(w_at + j + g);
                }
                let wg = &w[j..j + g];
                for (u, eu) in e.iter().enumerate() {
                    store_cells(s, &wg[u * l..], *eu);
                }
            }
            add!(e);
        }};
    }
    // Whole groups: the first `prefetched` of them also prefetch `next` (no per-group test),
    // one line per 16 floats: in order, or when `FAR` in `FarOrder`.
    let mut far = FarOrder::new(next.len());
    let len = if FAR { far.span() } else { next.len() };
    let prefetched = n.min(len.next_multiple_of(g));
    let mut j = 0;
    while j + g <= prefetched {
        let Some(zw) = z.window(j, g) else { break };
        let mut k = 0;
        while k < g {
            if FAR {
                next.prefetch_far(s, far.next());
            } else {
                next.prefetch(s, j + k);
            }
            k += 16;
        }
        group!(j, zw);
        if FAR {
            drain.step::<DRAIN_PER_B>();
        }
        j += g;
    }
    while let Some(zw) = z.window(j, g) {
        group!(j, zw);
        if FAR {
            drain.step::<DRAIN_PER_B>();
        }
        j += g;
    }
    if j < n {
        // The last `< EXP_UNROLL` vectors, the partial one included, as one more
        // interleaved group (ragged rows, such as causal ones, pay one group, not a
        // chain per vector). Padding vectors hold 0 and the partial vector's padding lanes
        // the −∞ that `tail` pads with (on which the table exp is not defined); both are
        // zeroed after the exp.
        let mut d = [s.splat(0.0); EXP_UNROLL];
        for (u, du) in d.iter_mut().enumerate() {
            let ju = j + u * l;
            if ju + l <= n {
                *du = s.sub(z.vec(ju), mv);
            } else if ju < n {
                *du = s.sub(z.tail(ju, n - ju), mv);
            }
        }
        let mut e = exp!(d);
        if STORE && FAR {
            drain.clear(w_at + n);
        }
        for (u, eu) in e.iter_mut().enumerate() {
            let ju = j + u * l;
            if ju + l <= n {
                if STORE {
                    store_cells(s, &w[ju..], *eu);
                }
            } else if ju < n {
                *eu = s.select(s.first(n - ju), *eu, s.splat(0.0));
                if STORE {
                    store_tail_cells(s, &w[ju..], *eu);
                }
            } else {
                *eu = s.splat(0.0);
            }
        }
        add!(e);
    }
    s.reduce_add(s.add(s0, s1))
}

/// Pass B of a softmax row whose finite max is `m` and min `lo` (`range`): the table exp
/// when every `z_j − m ≥ lo − m` (rounding is monotone) is at least [`LUT8_MIN`]; when `lo` is
/// `−∞` (masked logits) the table exp with the `−∞` lanes zeroed, each group holding a finite
/// lane below the table's range taking the full-range exp ([`MaskedTableExp`]); else the
/// full-range exp. When `z_j = scale·u_j` with `scale` a power of two ([`Lut8Consts::folds`])
/// and `raw_max = max_j u_j`, the table exp runs on `u_j − raw_max` with the scale folded
/// into its constants: `scale·(u_j − raw_max)` is the difference `z_j − m` it would form
/// (bit for bit while the logits are normal), one multiply per vector fewer. Returns
/// `Σ_j exp(z_j − m)`, storing the terms to `w` when `STORE`, and prefetching `next` (into
/// L2, and writing part of `drain` meanwhile, when `FAR`: a streamed row, `w` then at `w_at`
/// in the drain's stage). `STORE` and `FAR` are parameters, not tests of `w` and `drain`, so
/// that each caller compiles only the passes it runs: five exp passes per row body instead of
/// fifteen (build time). `m` and `lo` are the max and min of `z` (NaN skipped), `raw_max` the
/// max of `Raw(z)` when given.
#[inline(always)]
pub(super) fn softmax_sum<S: Simd, L: Logits<S>, const STORE: bool, const FAR: bool>(
    s: S,
    z: &L,
    (m, lo): (f32, f32),
    (raw_max, scale): (Option<f32>, f32),
    w: (&[Cell<f32>], usize),
    (next, d): (Floats<'_>, &mut Drain<'_, S>),
) -> f32 {
    macro_rules! pass {
        ($E:ty, $z:expr, $m:expr, $c:expr, $below:expr) => {
            exp_sum_pass::<S, _, $E, STORE, FAR>(s, $z, $m, w, next, $c, $below, d)
        };
    }
    // The table exp on `z` or, with the scale folded, on `Raw(z)`.
    macro_rules! table {
        ($E:ty) => {
            match raw_max {
                Some(u) if Lut8Consts::<S>::folds(scale) => {
                    pass!($E, &Raw(*z), u, &Lut8Consts::new(s, scale), (LUT8_MIN / scale, scale))
                }
                _ => pass!($E, z, m, &Lut8Consts::new(s, 1.0), (LUT8_MIN, 1.0)),
            }
        };
    }
    // The domain of each exp is what the test establishes (the masked table pass checks its
    // groups itself).
    if lo - m >= LUT8_MIN {
        table!(TableExp)
    } else if lo == f32::NEG_INFINITY {
        table!(MaskedTableExp)
    } else {
        pass!(FullExp, z, m, &Lut8Consts::new(s, 1.0), (LUT8_MIN, 1.0))
    }
}

/// Pass C in cache: `y_j ← y_j · r` in place (streamed rows write theirs by [`Drain`]).
#[inline(always)]
fn scale_pass<S: Simd>(s: S, y: &[Cell<f32>], r: f32) {
    let (l, n) = (S::LANES, y.len());
    let rv = s.splat(r);
    let mut j = 0;
    while j + UNROLL * l <= n {
        let yg = &y[j..j + UNROLL * l];
        let mut v = [s.splat(0.0); UNROLL];
        for (u, vu) in v.iter_mut().enumerate() {
            *vu = s.mul(load_cells(s, &yg[u * l..]), rv);
        }
        for (u, vu) in v.iter().enumerate() {
            store_cells(s, &yg[u * l..], *vu);
        }
        j += UNROLL * l;
    }
    while j + l <= n {
        store_cells(s, &y[j..], s.mul(load_cells(s, &y[j..]), rv));
        j += l;
    }
    if j < n {
        store_tail_cells(s, &y[j..], s.mul(load_tail_cells(s, &y[j..]), rv));
    }
}

/// `y_j ← v` for every cell of `y`, by vector stores.
#[inline(always)]
fn fill<S: Simd>(s: S, y: &[Cell<f32>], v: f32) {
    let (l, n, vv) = (S::LANES, y.len(), s.splat(v));
    let mut j = 0;
    while j + l <= n {
        store_cells(s, &y[j..], vv);
        j += l;
    }
    if j < n {
        store_tail_cells(s, &y[j..], vv);
    }
}

/// The slow path for rows whose max is `±∞` or NaN-only: scans `z` for NaN and `+∞`, then
/// writes the reference's result to all of `y` (at least `z.len()` cells; it may be the input:
/// the scan finishes before any write, and then each vector is read before it is written).
/// Returns the logsumexp.
#[inline(always)]
pub(super) fn special_row<S: Simd, L: Logits<S>>(s: S, z: &L, y: &[Cell<f32>]) -> f32 {
    let (l, n) = (S::LANES, z.len());
    let mut buf = [0.0f32; 16];
    debug_assert!(l <= buf.len());
    macro_rules! load_z {
        ($j:expr) => {{
            let j = $j;
            let v = if j + l <= n { z.vec(j) } else { z.tail(j, n - j) };
            store(s, &mut buf, v);
        }};
    }
    let (mut nan, mut infs) = (false, 0usize);
    let mut j = 0;
    while j < n {
        load_z!(j);
        let k = l.min(n - j);
        nan |= buf[..k].iter().any(|v| v.is_nan());
        infs += buf[..k].iter().filter(|v| **v == f32::INFINITY).count();
        j += l;
    }
    if nan {
        fill(s, y, f32::NAN);
        return f32::NAN;
    }
    if infs == 0 {
        // Every logit −∞ or masked (or the row is empty).
        fill(s, y, 0.0);
        return f32::NEG_INFINITY;
    }
    // +∞ logits share the weight evenly; writes follow reads vector by vector.
    let w = 1.0 / infs as f32;
    let mut j = 0;
    while j < n {
        load_z!(j);
        let k = l.min(n - j);
        for (v, y) in buf[..k].iter().zip(&y[j..j + k]) {
            y.set(if *v == f32::INFINITY { w } else { 0.0 });
        }
        j += l;
    }
    fill(s, &y[n..], 0.0);
    f32::INFINITY
}

/// The fused row: passes A, B, C (module docs) of the logits `z` (`n = z.len()` of them) into
/// the output row `y` (`total ≥ n` cells; positions `≥ n` get 0). Returns the logsumexp of the
/// row when `want_lse`, else 0. The input may be `y` itself (in place).
///
/// With `STREAM`, pass B writes the `n` cells at `w0` of `stage` and the row's pass C is left in
/// `*drain` for the caller to finish (during the next row, or at once), while passes A and B
/// write the previous row's pending pass C, which `*drain` holds on entry (finished before this
/// row writes its output `y`). Rows with a non-finite max or a NaN sum are written at once.
/// The drain held on entry must write rows other than this row's input and output; its stage
/// may be `stage` (pass B stages each group behind the drain, [`Drain::clear`]). Without
/// `STREAM`, `stage` and `drain` are not used.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn softmax_row_body<'a, S: Simd, L: Logits<S>, const STREAM: bool>(
    s: S,
    z: &L,
    scale: f32,
    y: &'a [Cell<f32>],
    (stage, w0): (&'a [Cell<f32>], usize),
    next: Floats<'_>,
    want_lse: bool,
    drain: &mut Drain<'a, S>,
) -> f32 {
    let n = z.len();
    let ((m, lo), raw_max) = logits_range::<S, L, STREAM>(s, z, scale, drain);
    if !m.is_finite() {
        if STREAM {
            drain.finish();
        }
        return special_row::<S, L>(s, z, y);
    }
    let w = if STREAM { (&stage[w0..w0 + n], w0) } else { (&y[..n], 0) };
    let sum = softmax_sum::<S, L, true, STREAM>(s, z, (m, lo), (raw_max, scale), w, (next, drain));
    if STREAM {
        drain.finish();
    }
    if sum.is_nan() {
        // A NaN logit: with a finite max nothing else makes the sum NaN.
        fill(s, y, f32::NAN);
        return f32::NAN;
    }
    // s ≥ 1: the max contributes exp(0) = 1 exactly.
    if STREAM {
        *drain = Drain::new(s, (stage, w0), &y[..n], 1.0 / sum);
    } else {
        scale_pass::<S>(s, &y[..n], 1.0 / sum);
    }
    fill(s, &y[n..], 0.0);
    // The f64 log costs as much as a short row: only when asked for.
    if want_lse {
        (f64::from(m) + f64::from(sum).ln()) as f32
    } else {
        0.0
    }
}
