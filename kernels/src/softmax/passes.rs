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

use super::stream::{Drain, FarOrder, DRAIN_PER_A, DRAIN_PER_B};
use crate::arch::Simd;
use crate::math::exp::{exp_neg_lut8_p3_folded, exp_neg_rr2_p6, Lut8Consts, EXP_UNROLL, LUT8_MIN};

/// How the logits `z_j` of a row are formed from the input and the mask, one vector at a time.
/// Implementations are the only place the mask kinds differ.
pub(super) trait Logits<S: Simd> {
    /// `z[j .. j + LANES]`.
    ///
    /// # Safety
    /// `j + LANES ≤` the row's visible length.
    unsafe fn vec(&self, j: usize) -> S::V;
    /// `z[j .. j + k]`, lanes `≥ k` set to `−∞`.
    ///
    /// # Safety
    /// `k < LANES`; `j + k ≤` the row's visible length.
    unsafe fn tail(&self, j: usize, k: usize) -> S::V;
    /// True when `z_j = scale·u_j` with `u_j` what [`raw`](Self::raw) returns (masked lanes
    /// `−∞`): then for `scale > 0` the row max is `scale·max_j u_j`, bit for bit (rounding is
    /// monotone), and pass A needs no multiply.
    const SCALE_AFTER: bool;
    /// `u[j .. j + LANES]` (only called when [`SCALE_AFTER`](Self::SCALE_AFTER)).
    ///
    /// # Safety
    /// As [`vec`](Self::vec).
    unsafe fn raw(&self, j: usize) -> S::V;
    /// `u[j .. j + k]`, lanes `≥ k` set to `−∞`.
    ///
    /// # Safety
    /// As [`tail`](Self::tail).
    unsafe fn raw_tail(&self, j: usize, k: usize) -> S::V;
    /// The input row (`x`), for its alignment.
    fn input(&self) -> *const f32;
}

/// The unscaled values of a [`Logits::SCALE_AFTER`] row, as logits of their own.
struct Raw<'a, L>(&'a L);

// SAFETY: forwards the caller's contract.
impl<S: Simd, L: Logits<S>> Logits<S> for Raw<'_, L> {
    const SCALE_AFTER: bool = false;
    #[inline(always)]
    unsafe fn vec(&self, j: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe { self.0.raw(j) }
    }
    #[inline(always)]
    unsafe fn tail(&self, j: usize, k: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe { self.0.raw_tail(j, k) }
    }
    #[inline(always)]
    unsafe fn raw(&self, j: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe { self.0.raw(j) }
    }
    #[inline(always)]
    unsafe fn raw_tail(&self, j: usize, k: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe { self.0.raw_tail(j, k) }
    }
    #[inline(always)]
    fn input(&self) -> *const f32 {
        self.0.input()
    }
}

pub(super) struct Plain<S: Simd> {
    pub(super) s: S,
    pub(super) x: *const f32,
    pub(super) scale: S::V,
}
pub(super) struct Keep<S: Simd> {
    pub(super) s: S,
    pub(super) x: *const f32,
    pub(super) keep: *const bool,
    pub(super) scale: S::V,
}
pub(super) struct Bias<S: Simd> {
    pub(super) s: S,
    pub(super) x: *const f32,
    pub(super) bias: *const f32,
    pub(super) scale: S::V,
}

// SAFETY (the three impls): pointers valid for the visible length, per the trait contract.
impl<S: Simd> Logits<S> for Plain<S> {
    const SCALE_AFTER: bool = true;
    #[inline(always)]
    unsafe fn vec(&self, j: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe { self.s.mul(self.scale, self.s.load(self.x.add(j))) }
    }
    #[inline(always)]
    unsafe fn tail(&self, j: usize, k: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe {
            let z = self.s.mul(self.scale, self.s.load_tail(self.x.add(j), k));
            self.s.select(self.s.first(k), z, self.s.splat(f32::NEG_INFINITY))
        }
    }
    #[inline(always)]
    unsafe fn raw(&self, j: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe { self.s.load(self.x.add(j)) }
    }
    #[inline(always)]
    unsafe fn raw_tail(&self, j: usize, k: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe {
            self.s.select(
                self.s.first(k),
                self.s.load_tail(self.x.add(j), k),
                self.s.splat(f32::NEG_INFINITY),
            )
        }
    }
    #[inline(always)]
    fn input(&self) -> *const f32 {
        self.x
    }
}
impl<S: Simd> Logits<S> for Keep<S> {
    const SCALE_AFTER: bool = true;
    #[inline(always)]
    unsafe fn vec(&self, j: usize) -> S::V {
        // The mask is applied after the scale: `0·(−∞)` would be NaN.
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe {
            let z = self.s.mul(self.scale, self.s.load(self.x.add(j)));
            self.s.select(self.s.keep(self.keep.add(j)), z, self.s.splat(f32::NEG_INFINITY))
        }
    }
    #[inline(always)]
    unsafe fn tail(&self, j: usize, k: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe {
            let z = self.s.mul(self.scale, self.s.load_tail(self.x.add(j), k));
            self.s.select(self.s.keep_tail(self.keep.add(j), k), z, self.s.splat(f32::NEG_INFINITY))
        }
    }
    #[inline(always)]
    unsafe fn raw(&self, j: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe {
            let u = self.s.load(self.x.add(j));
            self.s.select(self.s.keep(self.keep.add(j)), u, self.s.splat(f32::NEG_INFINITY))
        }
    }
    #[inline(always)]
    unsafe fn raw_tail(&self, j: usize, k: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe {
            let u = self.s.load_tail(self.x.add(j), k);
            self.s.select(self.s.keep_tail(self.keep.add(j), k), u, self.s.splat(f32::NEG_INFINITY))
        }
    }
    #[inline(always)]
    fn input(&self) -> *const f32 {
        self.x
    }
}
impl<S: Simd> Logits<S> for Bias<S> {
    const SCALE_AFTER: bool = false;
    #[inline(always)]
    unsafe fn raw(&self, j: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe { self.vec(j) }
    }
    #[inline(always)]
    unsafe fn raw_tail(&self, j: usize, k: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe { self.tail(j, k) }
    }
    #[inline(always)]
    unsafe fn vec(&self, j: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe { self.s.fma(self.scale, self.s.load(self.x.add(j)), self.s.load(self.bias.add(j))) }
    }
    #[inline(always)]
    unsafe fn tail(&self, j: usize, k: usize) -> S::V {
        // SAFETY: the caller's guarantee (the trait method's `# Safety`).
        unsafe {
            let z = self.s.fma(
                self.scale,
                self.s.load_tail(self.x.add(j), k),
                self.s.load_tail(self.bias.add(j), k),
            );
            self.s.select(self.s.first(k), z, self.s.splat(f32::NEG_INFINITY))
        }
    }
    #[inline(always)]
    fn input(&self) -> *const f32 {
        self.x
    }
}

/// Vectors per iteration of the light loops (passes A and C): their bodies are a few
/// instructions per vector, so loop control is amortised over four (at one or two vectors
/// per iteration it was a fifth of the softmax's instructions).
pub(super) const UNROLL: usize = 4;
const _: () = assert!(UNROLL == 4, "range_pass reduces four accumulators by hand");

/// Pass A: `(max_j z_j, min_j z_j)` over `n` logits, NaN skipped, `(−∞, +∞)` when empty.
/// Four accumulators of each kind, one per vector of an iteration. With `DRAIN`, each
/// iteration also writes [`DRAIN_PER_A`] vectors of `drain` (the previous streamed row's
/// pass C).
///
/// The elements before the input's first `LANES × 4`-byte boundary come first, on their own,
/// so that the loop's loads do not straddle cache lines (max and min are exact in any order:
/// the result is the same bits). Pass A is the first read of a row, from L2 or memory, where a
/// load across two lines holds two fill buffers.
///
/// # Safety
/// `z` valid for `n` logits; `drain` as its [`Drain::new`] requires.
#[inline(always)]
pub(super) unsafe fn range_pass<S: Simd, L: Logits<S>, const DRAIN: bool>(
    s: S,
    z: &L,
    n: usize,
    drain: &mut Drain<S>,
) -> (f32, f32) {
    let l = S::LANES;
    // SAFETY: indices stay below `n` (the `head ≤ n` first elements, full vectors below
    // `end`, then at most `UNROLL − 1` full vectors and one tail).
    unsafe {
        let mut hi = [s.splat(f32::NEG_INFINITY); UNROLL];
        let mut lo = [s.splat(f32::INFINITY); UNROLL];
        let head = ((l - (z.input() as usize / 4) % l) % l).min(n);
        if head > 0 {
            let v = z.tail(0, head);
            hi[0] = s.max_skip_nan(hi[0], v);
            lo[0] = s.min_skip_nan(lo[0], s.select(s.first(head), v, s.splat(f32::INFINITY)));
        }
        let mut j = head;
        let end = n - (n - head) % (UNROLL * l);
        while j < end {
            for u in 0..UNROLL {
                let v = z.vec(j + u * l);
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
}

/// Pass A with the scale taken out where that is exact (module docs): `(max_j z_j, min_j z_j)`,
/// and the max of the raw input when it was taken on that.
///
/// # Safety
/// As [`range_pass`]; `scale` is the scale `z` applies.
#[inline(always)]
unsafe fn logits_range<S: Simd, L: Logits<S>, const DRAIN: bool>(
    s: S,
    z: &L,
    n: usize,
    scale: f32,
    drain: &mut Drain<S>,
) -> ((f32, f32), Option<f32>) {
    // SAFETY: forwarded contract.
    unsafe {
        if L::SCALE_AFTER && scale > 0.0 {
            let (hi, lo) = range_pass::<S, _, DRAIN>(s, &Raw(z), n, drain);
            ((scale * hi, scale * lo), Some(hi))
        } else {
            (range_pass::<S, L, DRAIN>(s, z, n, drain), None)
        }
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
/// `next[..next_len]` along the way, one cache line per 16 floats, in order into L1, or into
/// L2 in [`FarOrder`] when `FAR` (a row several rows ahead in a streamed call), then also
/// writing [`DRAIN_PER_B`] vectors of `drain` per whole group, and before each group's stores
/// as many more as [`Drain::clear`] needs (`w` may be the drain's stage). With `E::MASKED`,
/// `−∞` lanes give 0 and groups holding a finite difference below `dead_below` (the table's
/// range) take the full-range exp of `d_scale` times the differences.
///
/// # Safety
/// `z` valid for `n` logits, every `z_j − m` in `E`'s domain (for
/// [`MaskedTableExp`], `≤ 0`: the pass checks the rest itself); `w` (when
/// `STORE`) valid for `n` writes (it may be the input row itself: each vector is read before
/// it is written; when `FAR`, it may overlap the stage `drain` reads: each group's stores wait
/// for [`Drain::clear`]). `next` is only prefetched, never read. `drain` as its [`Drain::new`]
/// requires.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn exp_sum_pass<S: Simd, L: Logits<S>, E: GroupExp, const STORE: bool, const FAR: bool>(
    s: S,
    z: &L,
    n: usize,
    m: f32,
    w: *mut f32,
    next: *const f32,
    next_len: usize,
    c: &Lut8Consts<S>,
    (dead_below, d_scale): (f32, f32),
    drain: &mut Drain<S>,
) -> f32 {
    let l = S::LANES;
    // SAFETY: as in `range_pass`; `w` written at the same indices.
    unsafe {
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
        // One whole group at `j` (`j + g ≤ n`).
        macro_rules! group {
            ($j:expr) => {{
                let j = $j;
                let mut d = [s.splat(0.0); EXP_UNROLL];
                for (u, du) in d.iter_mut().enumerate() {
                    *du = s.sub(z.vec(j + u * l), mv);
                }
                let e = exp!(d);
                if STORE {
                    if FAR {
                        drain.clear(w.add(j + g));
                    }
                    for (u, eu) in e.iter().enumerate() {
                        s.store(w.add(j + u * l), *eu);
                    }
                }
                add!(e);
            }};
        }
        // Whole groups: the first `prefetched` of them also prefetch `next` (no per-group test),
        // one line per 16 floats: in order, or when `FAR` in `FarOrder`.
        let end = n - n % g;
        let mut far = FarOrder::new(next_len);
        let len = if FAR { far.span() } else { next_len };
        let prefetched = end.min(len.next_multiple_of(g));
        let mut j = 0;
        while j < prefetched {
            let mut k = 0;
            while k < g {
                if FAR {
                    s.prefetch_far(next.wrapping_add(far.next()));
                } else {
                    s.prefetch(next.wrapping_add(j + k));
                }
                k += 16;
            }
            group!(j);
            if FAR {
                drain.step::<DRAIN_PER_B>();
            }
            j += g;
        }
        while j < end {
            group!(j);
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
                drain.clear(w.add(n));
            }
            for (u, eu) in e.iter_mut().enumerate() {
                let ju = j + u * l;
                if ju + l <= n {
                    if STORE {
                        s.store(w.add(ju), *eu);
                    }
                } else if ju < n {
                    *eu = s.select(s.first(n - ju), *eu, s.splat(0.0));
                    if STORE {
                        s.store_tail(w.add(ju), n - ju, *eu);
                    }
                } else {
                    *eu = s.splat(0.0);
                }
            }
            add!(e);
        }
        s.reduce_add(s.add(s0, s1))
    }
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
/// L2, and writing part of `drain` meanwhile, when `FAR`: a streamed row). `STORE` and `FAR`
/// are parameters, not tests of `w` and `drain`, so that each caller compiles only the passes
/// it runs: five exp passes per row body instead of fifteen (build time).
///
/// # Safety
/// As [`exp_sum_pass`]; `m` and `lo` are the max and min of `z` (NaN skipped), `raw_max` the
/// max of `Raw(z)` when given.
#[inline(always)]
pub(super) unsafe fn softmax_sum<S: Simd, L: Logits<S>, const STORE: bool, const FAR: bool>(
    s: S,
    z: &L,
    n: usize,
    (m, lo): (f32, f32),
    (raw_max, scale): (Option<f32>, f32),
    w: *mut f32,
    (next, d): (&[f32], &mut Drain<S>),
) -> f32 {
    let (next, next_len) = (next.as_ptr(), next.len());
    macro_rules! pass {
        ($E:ty, $z:expr, $m:expr, $c:expr, $below:expr) => {
            exp_sum_pass::<S, _, $E, STORE, FAR>(s, $z, n, $m, w, next, next_len, $c, $below, d)
        };
    }
    // The table exp on `z` or, with the scale folded, on `Raw(z)`.
    macro_rules! table {
        ($E:ty) => {
            match raw_max {
                Some(u) if Lut8Consts::<S>::folds(scale) => {
                    pass!($E, &Raw(z), u, &Lut8Consts::new(s, scale), (LUT8_MIN / scale, scale))
                }
                _ => pass!($E, z, m, &Lut8Consts::new(s, 1.0), (LUT8_MIN, 1.0)),
            }
        };
    }
    // SAFETY: forwarded contract; the domain of each exp is what the test establishes (the
    // masked table pass checks its groups itself).
    unsafe {
        if lo - m >= LUT8_MIN {
            table!(TableExp)
        } else if lo == f32::NEG_INFINITY {
            table!(MaskedTableExp)
        } else {
            pass!(FullExp, z, m, &Lut8Consts::new(s, 1.0), (LUT8_MIN, 1.0))
        }
    }
}

/// Pass C in cache: `y_j = w_j · r` for `j < n` (streamed rows write theirs by [`Drain`]).
///
/// # Safety
/// `w` valid for `n` reads, `y` for `n` writes (`w == y` allowed).
#[inline(always)]
unsafe fn scale_pass<S: Simd>(s: S, w: *const f32, y: *mut f32, n: usize, r: f32) {
    let l = S::LANES;
    // SAFETY: indices below `n`.
    unsafe {
        let rv = s.splat(r);
        let mut j = 0;
        let end = n - n % (UNROLL * l);
        while j < end {
            let mut v = [s.splat(0.0); UNROLL];
            for (u, vu) in v.iter_mut().enumerate() {
                *vu = s.mul(s.load(w.add(j + u * l)), rv);
            }
            for (u, vu) in v.iter().enumerate() {
                s.store(y.add(j + u * l), *vu);
            }
            j += UNROLL * l;
        }
        while j + l <= n {
            s.store(y.add(j), s.mul(s.load(w.add(j)), rv));
            j += l;
        }
        if j < n {
            let k = n - j;
            s.store_tail(y.add(j), k, s.mul(s.load_tail(w.add(j), k), rv));
        }
    }
}

/// The slow path for rows whose max is `±∞` or NaN-only: scans `z` for NaN and `+∞`, then
/// writes the reference's result to `y[..total]`. Returns the logsumexp.
///
/// # Safety
/// `z` valid for `n` logits; `y` valid for `total ≥ n` writes (may alias
/// the input: the scan finishes before any write).
#[inline(always)]
pub(super) unsafe fn special_row<S: Simd, L: Logits<S>>(
    s: S,
    z: &L,
    n: usize,
    y: *mut f32,
    total: usize,
) -> f32 {
    let l = S::LANES;
    let mut buf = [0.0f32; 16];
    debug_assert!(l <= buf.len());
    // SAFETY: `buf` holds `LANES ≤ 16` floats; indices below `n`.
    let load = |j: usize, buf: &mut [f32; 16]| unsafe {
        let v = if j + l <= n { z.vec(j) } else { z.tail(j, n - j) };
        s.store(buf.as_mut_ptr(), v);
    };
    let (mut nan, mut infs) = (false, 0usize);
    let mut j = 0;
    while j < n {
        load(j, &mut buf);
        let k = l.min(n - j);
        nan |= buf[..k].iter().any(|v| v.is_nan());
        infs += buf[..k].iter().filter(|v| **v == f32::INFINITY).count();
        j += l;
    }
    // Writes go through `y` directly: `z` may read the same memory (in place).
    // SAFETY: `y` valid for `total` writes; no read of `z` happens while a slice is alive.
    let fill = |from: usize, v: f32| unsafe {
        std::slice::from_raw_parts_mut(y.add(from), total - from).fill(v)
    };
    if nan {
        fill(0, f32::NAN);
        return f32::NAN;
    }
    if infs == 0 {
        // Every logit −∞ or masked (or the row is empty).
        fill(0, 0.0);
        return f32::NEG_INFINITY;
    }
    // +∞ logits share the weight evenly; writes follow reads vector by vector.
    let w = 1.0 / infs as f32;
    let mut j = 0;
    while j < n {
        load(j, &mut buf);
        let k = l.min(n - j);
        for (t, v) in buf[..k].iter().enumerate() {
            // SAFETY: `j + t < n ≤ total`.
            unsafe { y.add(j + t).write(if *v == f32::INFINITY { w } else { 0.0 }) };
        }
        j += l;
    }
    fill(n, 0.0);
    f32::INFINITY
}

/// The fused row: passes A, B, C (module docs). Returns the logsumexp of the row.
///
/// With `STREAM`, pass B writes `stage` and the row's pass C is left in `*drain` for the
/// caller to finish (during the next row, or at once), while passes A and B write the
/// previous row's pending pass C, which `*drain` holds on entry (finished before this row
/// writes its output `y`). Rows with a non-finite max or a NaN sum are written at once.
/// Without `STREAM`, `drain` is not used.
///
/// # Safety
/// `z` valid for `n` logits (reading the input from `y` or not); `y` valid
/// for `total ≥ n` writes; with `STREAM`, `stage` valid for `n` writes and reads and disjoint
/// from `y`, both kept (and `stage` written only behind the drain, as [`Drain::new`] requires)
/// until the drain left in `*drain` is finished, and the drain held on entry satisfying
/// [`Drain::new`], its output disjoint from this row's input, output and `stage`, its stage
/// disjoint from this row's input and output (it may overlap `stage`: pass B stages each group
/// behind the drain, [`Drain::clear`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn softmax_row_body<S: Simd, L: Logits<S>, const STREAM: bool>(
    s: S,
    z: &L,
    scale: f32,
    n: usize,
    y: *mut f32,
    total: usize,
    stage: *mut f32,
    next: &[f32],
    want_lse: bool,
    drain: &mut Drain<S>,
) -> f32 {
    // SAFETY: forwarded contract.
    unsafe {
        let ((m, lo), raw_max) = logits_range::<S, L, STREAM>(s, z, n, scale, drain);
        if !m.is_finite() {
            if STREAM {
                drain.finish();
            }
            return special_row::<S, L>(s, z, n, y, total);
        }
        let w = if STREAM { stage } else { y };
        let sum =
            softmax_sum::<S, L, true, STREAM>(s, z, n, (m, lo), (raw_max, scale), w, (next, drain));
        if STREAM {
            drain.finish();
        }
        if sum.is_nan() {
            // A NaN logit: with a finite max nothing else makes the sum NaN.
            std::slice::from_raw_parts_mut(y, total).fill(f32::NAN);
            return f32::NAN;
        }
        // s ≥ 1: the max contributes exp(0) = 1 exactly.
        if STREAM {
            *drain = Drain::new(s, stage, y, n, 1.0 / sum);
        } else {
            scale_pass::<S>(s, w, y, n, 1.0 / sum);
        }
        if total > n {
            std::slice::from_raw_parts_mut(y.add(n), total - n).fill(0.0);
        }
        // The f64 log costs as much as a short row: only when asked for.
        if want_lse {
            (f64::from(m) + f64::from(sum).ln()) as f32
        } else {
            0.0
        }
    }
}
