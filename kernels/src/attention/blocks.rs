//! The vector building blocks of the attention kernels, written once over the one vector
//! trait ([`Simd`]): the two block products of the flash loop, which run on the GEMM
//! micro-kernels, the decode tiles, and the row helpers of the decode and unfused paths. All of
//! it is safe code over slices: the block products call the GEMM layer's checked
//! [`panel_product`], and the decode tiles slice their rows once per tile (exactly the length
//! they read), so that the loop bounds imply each index and the per-load checks fold away.
//!
//! The block products are computed **transposed**, so that queries run along the vector
//! lanes: `Sᵀ = K·Q̃ᵀ` and `Oᵀ += Vᵀ·P̃ᵀ`. In GEMM terms the query tile (`NR` queries: the
//! micro-kernel's vector width) is the packed B micro-panel of the first product and the
//! probability block is the packed B micro-panel of the second, while K and V are the
//! broadcast (A) operand, which the micro-kernels read in place through their strides. So:
//! - the only packing is the query tile, once per task, and the probability block, which the
//!   softmax step writes directly in the packed layout;
//! - K and V are never copied or transposed: any strides, GQA sharing and both tensor layouts
//!   come for free. A broadcast operand gains nothing from being contiguous (it is read one
//!   element at a time either way), and packing it costs about two instructions per element
//!   against the strided kernel's integer address arithmetic, which runs beside the FMAs on
//!   the otherwise idle integer ports (measured slower: `docs/perf-journal.md`);
//! - the online softmax needs no horizontal reductions: the running max, sum and rescale
//!   factors of `QR` queries are `QV` vectors.

use super::blocking::QV;
use super::decode::RowMap;
use super::FLUSH_WEIGHTS_BELOW;
use attn_core::quant::{q8_blocks, Q8_BLOCK};
use attn_core::{bf16, MatLayout};
use half::slice::HalfFloatSliceExt;
use wide::bytemuck;

use crate::arch::convert::{bf16_bits, load_operands, SimdElement};
use crate::arch::{bf16_pair_dot, load, prefetch_line, store, Isa, Simd};
use crate::gemm::ukernel::{panel_product, tile_kernel_for, Kernel as GemmKernel};
use crate::math::exp::{exp_neg_lut8_p3, LUT8_MIN};

// ---------------------------------------------------------------------------------------------
// Flash block products on the GEMM micro-kernels

/// A strided matrix operand of the block products and the decode tiles: element `(row, col)`
/// of `data` at `offset + row·rs + col·cs`. f32 for the flash block products; any
/// [`SimdElement`] (or `i8`, the values of a quantised cache) for the decode tiles.
#[derive(Debug)]
pub(crate) struct Strided<'a, T = f32> {
    /// The elements.
    pub data: &'a [T],
    /// Index of element (0, 0).
    pub offset: usize,
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

impl<T> Clone for Strided<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Strided<'_, T> {}

impl<T> Strided<'_, T> {
    /// True when rows `r0..r0 + nr` and columns `0..nc` are inside `data` (no overflow).
    fn covers(&self, r0: usize, nr: usize, nc: usize) -> bool {
        if nr == 0 || nc == 0 {
            return true;
        }
        let last = (r0 + nr - 1)
            .checked_mul(self.rs)
            .and_then(|x| x.checked_add((nc - 1).checked_mul(self.cs)?))
            .and_then(|x| x.checked_add(self.offset));
        matches!(last, Some(i) if i < self.data.len())
    }
}

/// The tile micro-kernel of the ISA `S` (`tile_kernel_for` in [`crate::gemm`]'s `ukernel`
/// module): the flash block products run on it. Its register tile is `MR` rows by
/// `NR = QV·LANES` columns, and the columns are the query tile.
#[inline(always)]
fn gemm_kernel<S: Simd>() -> &'static GemmKernel {
    let kern = tile_kernel_for(S::ISA);
    debug_assert_eq!(kern.nr, QV * S::LANES, "query tile must be the micro-kernel's NR");
    kern
}

/// Query rows per flash tile for `isa`: the column width `NR` of its tile micro-kernel.
pub(crate) fn tile_rows(isa: Isa) -> usize {
    tile_kernel_for(isa).nr
}

/// One block product of the flash loop as the GEMM layer runs it (see [`panel_product`]):
/// `kern` over `depth` steps of the A operand `a` (data, index of element `(0, 0)`, row
/// stride, step stride) and the packed B micro-panel `b` (64-byte aligned), scaled by `alpha`.
/// The f32 kernel's steps are elements; the `vdpbf16ps` kernel's are words of bf16 pairs.
#[derive(Clone, Copy)]
pub(crate) struct Product<'a> {
    /// The micro-kernel: the ISA's f32 kernel, or the `vdpbf16ps` kernel.
    pub kern: &'static GemmKernel,
    /// The scale of the product.
    pub alpha: f32,
    /// Steps of the inner dimension.
    pub depth: usize,
    /// The broadcast operand, read through its strides.
    pub a: (&'a [f32], usize, usize, usize),
    /// The packed B micro-panel.
    pub b: &'a [f32],
}

impl<'a> Product<'a> {
    /// The product on the f32 micro-kernel of the ISA `S`, unscaled (α = 1).
    #[inline(always)]
    fn f32<S: Simd>(depth: usize, a: (&'a [f32], usize, usize, usize), b: &'a [f32]) -> Self {
        Product { kern: gemm_kernel::<S>(), alpha: 1.0, depth, a, b }
    }
}

/// `s[j·QR + r] = Σ_d qp[d·QR + r] · k(j0 + j, d)` for `j < nb`: the scores of one query tile
/// against keys `j0..j0 + nb`, i.e. the block `Sᵀ = K·Q̃ᵀ` on the GEMM macro-kernel: K is the
/// broadcast operand, read in place through its strides, and `qp` (`dk` rows of `QR`
/// pre-scaled queries, 64-byte aligned) is exactly one packed B micro-panel. Panics (never UB)
/// if a buffer is too small, which the callers' sizing rules out. With `dk = 0` the scores are
/// 0 and no key pointer is formed (the K view is empty, so its row stride may be anything,
/// e.g. so large that `j·rs` overflows).
#[inline(always)]
pub(crate) fn qk_block<S: Simd>(
    s: S,
    qp: &[f32],
    dk: usize,
    k: Strided<'_>,
    j0: usize,
    nb: usize,
    out: &mut [f32],
) {
    assert!(k.covers(j0, nb, dk));
    // Wrapping: with `dk = 0` or `nb = 0` the offset may overflow and is never used.
    let a0 = k.offset.wrapping_add(j0.wrapping_mul(k.rs));
    scores(s, Product::f32::<S>(dk, (k.data, a0, k.rs, k.cs), qp), nb, out);
}

/// The scores of one query tile against `nb` keys, `out[j·QR + r]`, from a [`Product`] whose A
/// operand holds the `nb` keys as rows and whose B panel is the query tile: all 0 when the
/// product is empty (`depth = 0`: no A element is addressed). Panics (never UB) if a buffer is
/// too small.
#[inline(always)]
pub(crate) fn scores<S: Simd>(s: S, prod: Product<'_>, nb: usize, out: &mut [f32]) {
    let qr = prod.kern.nr;
    assert!(out.len() >= nb * qr);
    if prod.depth == 0 || nb == 0 {
        out[..nb * qr].fill(0.0);
        return;
    }
    panel_product(s, prod.kern, nb, prod.depth, prod.a, prod.alpha, prod.b, 0.0, out);
}

/// `o[c·QR + r] = alpha[r]·o[c·QR + r] + Σ_j p[j·QR + r] · v(j0 + j, c)` for all `dv` columns:
/// one query tile's output accumulator (`Oᵀ`, `[column][QR]`) rescaled by the online-softmax
/// correction and updated with one block of `nb` value rows, i.e. `Oᵀ += Vᵀ·P̃ᵀ` on the GEMM
/// macro-kernel: V is the broadcast operand, read in place (`Vᵀ` is V with its strides
/// swapped), and the probability block `p` (`nb` rows of `QR`, 64-byte aligned, as
/// [`qk_block`] laid out the scores) is exactly one packed B micro-panel. The guard: see
/// [`pv_update`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pv_block<S: Simd>(
    s: S,
    guard: bool,
    p: &[f32],
    nb: usize,
    v: Strided<'_>,
    j0: usize,
    dv: usize,
    alpha: &[f32],
    o: &mut [f32],
    save: &mut [f32],
) {
    assert!(v.covers(j0, nb, dv));
    // A = Vᵀ: V with its strides swapped (wrapping: unused when the block is empty).
    let a0 = v.offset.wrapping_add(j0.wrapping_mul(v.rs));
    let prod = Product::f32::<S>(nb, (v.data, a0, v.cs, v.rs), p);
    let v_at = |j: usize, c: usize| v.data[a0 + j * v.rs + c * v.cs];
    pv_update(s, guard, prod, p, nb, v_at, dv, alpha, o, save);
}

/// The update of [`pv_block`] with the product given: `o ← alpha·o` per lane (skipped when
/// every lane's `alpha` is exactly 1, which leaves `o` as it is), then
/// `o += prod` (`dv` rows of A, the value columns; B the probabilities in the product's
/// packing), where `p` (`nb` rows of `QR` f32 weights) and `v_at(j, c)` are the same weights
/// and values, for the guard:
///
/// Zero weights contribute exactly nothing, as in the reference, which skips them:
/// - a lane whose `alpha` is 0 has its accumulator cleared rather than multiplied, so an
///   earlier `∞` cannot become NaN;
/// - `guard` must be set when some weight may be 0 (masked or underflowed weights, or a pair's
///   padding). The block then runs on the micro-kernel as usual, and only if that leaves a
///   non-finite accumulator (a `±∞`/NaN value at a zero-weight key gives `0·∞ = NaN`) is it
///   redone from `save` with a loop over `p` and `v_at` that skips zero weights. `save`
///   (`dv·QR` floats) holds the rescaled accumulator meanwhile.
///
/// Panics (never UB) if a buffer is too small, which the callers' sizing rules out.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pv_update<S: Simd>(
    s: S,
    guard: bool,
    prod: Product<'_>,
    p: &[f32],
    nb: usize,
    v_at: impl Fn(usize, usize) -> f32,
    dv: usize,
    alpha: &[f32],
    o: &mut [f32],
    save: &mut [f32],
) {
    let (l, qr) = (S::LANES, prod.kern.nr);
    assert!(p.len() >= nb * qr && alpha.len() >= qr && qr == QV * l);
    let (o, save) = (&mut o[..dv * qr], &mut save[..dv * qr]);
    // Once the running maxima settle, most blocks leave every one of them unchanged: `α = 1`
    // in every lane, and the rescale is skipped (a NaN or 0 `α` always takes it).
    if alpha[..qr].iter().any(|&a| a != 1.0) {
        // Plain loops, not `array::map`: through its closure the mask compare became an
        // out-of-line call without the ISA's features.
        let (mut al, mut live) = ([s.splat(0.0); QV], [s.nonzero(s.splat(0.0)); QV]);
        for vv in 0..QV {
            al[vv] = load(s, &alpha[vv * l..]);
            live[vv] = s.nonzero(al[vv]);
        }
        for col in o.chunks_exact_mut(qr) {
            for vv in 0..QV {
                let x = &mut col[vv * l..];
                store(s, x, s.zero_unless(live[vv], s.mul(al[vv], load(s, x))));
            }
        }
    }
    if dv == 0 || nb == 0 {
        return;
    }
    if guard {
        save.copy_from_slice(o);
    }
    panel_product(s, prod.kern, dv, prod.depth, prod.a, prod.alpha, prod.b, 1.0, o);
    if guard && !all_finite(s, o) {
        o.copy_from_slice(save);
        for j in 0..nb {
            for (r, &w) in p[j * qr..(j + 1) * qr].iter().enumerate() {
                if w != 0.0 {
                    for c in 0..dv {
                        o[c * qr + r] = w.mul_add(v_at(j, c), o[c * qr + r]);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Operands of the `vdpbf16ps` block products: bf16 pairs
//
// The `vdpbf16ps` kernel's operands are 32-bit words, each a pair of bf16 along the inner
// dimension (low half first), held in f32 buffers: the words are only copied, never computed
// on, so their bits pass through unchanged. An odd inner length pads its last pair with +0.

/// The word of the bf16 pair `(lo, hi)` (bit patterns).
#[inline(always)]
pub(crate) fn pair(lo: u16, hi: u16) -> f32 {
    f32::from_bits(u32::from(lo) | (u32::from(hi) << 16))
}

/// Query rows `i0..i0 + rows` of the bf16 `[nq, dk]` matrix `qm` of `data` as the B panel of
/// the paired score product: `qp[w·QR + r]` = the pair `(q(i0 + r, 2w), q(i0 + r, 2w + 1))`
/// for `w < ⌈dk/2⌉`, unscaled (the product's α is the scale). Rows `rows..QR` are left as
/// they are (the caller zeroes them).
#[inline(always)]
pub(crate) fn query_pairs(
    data: &[bf16],
    (qm, i0, rows, dk, qr): (MatLayout, usize, usize, usize, usize),
    qp: &mut [f32],
) {
    if dk == 0 {
        return; // no row index is formed (see `flash::pack_tile`)
    }
    let cs = qm.col_stride;
    for r in 0..rows {
        let at = qm.index(i0 + r, 0);
        let q = |d: usize| if d < dk { data[at + d * cs].to_bits() } else { 0 };
        for w in 0..dk.div_ceil(2) {
            qp[w * qr + r] = pair(q(2 * w), q(2 * w + 1));
        }
    }
}

/// Keys `j0..j0 + nb` of the bf16 matrix `k` (`dk` columns, key `j` at row
/// `map.read_row(j)`: a view's own row, or a pool's slot) as the A operand of the paired score
/// product: row `j` of `out` holds the `⌈dk/2⌉` pairs of key `j0 + j`. Returns that operand
/// (row stride `⌈dk/2⌉`, unit step): `k`'s own memory when its rows are already that (one run
/// of pairs, 4-byte aligned, little-endian), else `out`. Panics unless `out` holds
/// `nb·⌈dk/2⌉` words and `k` the rows.
#[inline(always)]
pub(crate) fn key_pairs<'o>(
    k: Strided<'o, bf16>,
    map: RowMap<'_>,
    j0: usize,
    nb: usize,
    dk: usize,
    out: &'o mut [f32],
) -> Strided<'o> {
    let dkp = dk.div_ceil(2);
    let out = &mut out[..nb * dkp];
    let le = cfg!(target_endian = "little");
    if dkp == 0 || nb == 0 {
        return Strided { data: out, offset: 0, rs: dkp, cs: 1 };
    }
    // Consecutive rows (a view, or a block within one page) are one run of memory.
    if le && k.cs == 1 && k.rs == dk && dk.is_multiple_of(2) && map.one_run(j0, nb) {
        // The rows are one run of memory, and so are their pairs: one copy for the block.
        let first = map.read_row(j0);
        assert!(k.covers(first, nb, dk));
        let at = k.offset + first * k.rs;
        let run: &'o [u16] = k.data[at..at + nb * dk].reinterpret_cast();
        // Aligned to a word: the pairs are read in place, no copy.
        if let Ok(words) = bytemuck::try_cast_slice::<u16, f32>(run) {
            return Strided { data: words, offset: 0, rs: dkp, cs: 1 };
        }
        let halves: &mut [u16] = bytemuck::cast_slice_mut(out);
        halves.copy_from_slice(run);
    } else {
        for (j, dst) in out.chunks_exact_mut(dkp).enumerate() {
            let row = map.read_row(j0 + j);
            assert!(k.covers(row, 1, dk));
            let at = k.offset + row * k.rs;
            if k.cs == 1 && le {
                // Contiguous: the pairs are the row's own bytes (low half first in memory, on
                // a little-endian CPU), so one copy of the row's halves. An element-wise loop
                // stayed word by word (15 % of the flash body's time at d 64).
                let halves: &mut [u16] = bytemuck::cast_slice_mut(dst);
                halves[..dk].copy_from_slice(k.data[at..at + dk].reinterpret_cast());
                halves[dk..].fill(0);
            } else {
                let e = |d: usize| if d < dk { k.data[at + d * k.cs].to_bits() } else { 0 };
                for (w, x) in dst.iter_mut().enumerate() {
                    *x = pair(e(2 * w), e(2 * w + 1));
                }
            }
        }
    }
    Strided { data: out, offset: 0, rs: dkp, cs: 1 }
}

/// Values `j0..j0 + nb` of the bf16 matrix `v` (`dv` columns, value `j` at row
/// `map.read_row(j)`, as in [`key_pairs`]) as the A operand (`Vᵀ`) of the paired output
/// product: `out[w·dv + c]` = the pair `(v(j0 + 2w, c), v(j0 + 2w + 1, c))` for
/// `w < ⌈nb/2⌉` (A's row `c`, step `w`: row stride 1, step stride `dv`). Panics unless `out`
/// holds `⌈nb/2⌉·dv` words and `v` the rows.
#[inline(always)]
pub(crate) fn value_pairs(
    v: Strided<'_, bf16>,
    map: RowMap<'_>,
    j0: usize,
    nb: usize,
    dv: usize,
    out: &mut [f32],
) {
    if dv == 0 || nb == 0 {
        return;
    }
    for (w, dst) in out[..nb.div_ceil(2) * dv].chunks_exact_mut(dv).enumerate() {
        let (j, odd) = (j0 + 2 * w, 2 * w + 1 < nb);
        let r0 = map.read_row(j);
        let r1 = if odd { map.read_row(j + 1) } else { r0 };
        assert!(v.covers(r0, 1, dv) && v.covers(r1, 1, dv));
        let (a0, a1) = (v.offset + r0 * v.rs, v.offset + r1 * v.rs);
        if v.cs == 1 && odd {
            let (r0, r1) = (&v.data[a0..a0 + dv], &v.data[a1..a1 + dv]);
            for ((x, y0), y1) in dst.iter_mut().zip(r0).zip(r1) {
                *x = pair(y0.to_bits(), y1.to_bits());
            }
        } else {
            for (c, x) in dst.iter_mut().enumerate() {
                let hi = if odd { v.data[a1 + c * v.cs].to_bits() } else { 0 };
                *x = pair(v.data[a0 + c * v.cs].to_bits(), hi);
            }
        }
    }
}

/// The probabilities `p[j·QR + r]` (`j < nb`) rounded to bf16 (nearest even, [`bf16_bits`])
/// and paired along the keys as the B panel of the paired output product: `out[w·QR + r]` =
/// `(p(2w, r), p(2w + 1, r))` for `w < ⌈nb/2⌉`. Panics unless the buffers hold that.
#[inline(always)]
pub(crate) fn prob_pairs(p: &[f32], nb: usize, qr: usize, out: &mut [f32]) {
    let b = |x: f32| bf16_bits(x.to_bits());
    for (w, dst) in out[..nb.div_ceil(2) * qr].chunks_exact_mut(qr).enumerate() {
        let p0 = &p[2 * w * qr..(2 * w + 1) * qr];
        if 2 * w + 1 < nb {
            let p1 = &p[(2 * w + 1) * qr..(2 * w + 2) * qr];
            for ((x, &a), &c) in dst.iter_mut().zip(p0).zip(p1) {
                *x = pair(b(a), b(c));
            }
        } else {
            for (x, &a) in dst.iter_mut().zip(p0) {
                *x = pair(b(a), 0);
            }
        }
    }
}

/// True when no half of the bf16 pair words `w` (a [`value_pairs`] operand) is `±∞` or NaN
/// (all exponent bits set). Then a zero weight times any of these values is exactly 0, and
/// the paired output product needs no guard ([`pv_update`]) whatever weights are 0.
#[inline(always)]
pub(crate) fn pairs_finite(w: &[f32]) -> bool {
    const EXP: u32 = 0x7F80;
    // A fold with no early exit, so that it vectorises: one OR per word.
    let bad = w.iter().fold(0u32, |acc, x| {
        let b = x.to_bits();
        acc | u32::from(b & EXP == EXP) | u32::from((b >> 16) & EXP == EXP)
    });
    bad == 0
}

/// Element `(j, c)` of a [`value_pairs`] operand (`dv` columns, key `j` relative to its first
/// key) as f32: the exact value of its bf16 half. For the guarded redo of [`pv_update`].
#[inline(always)]
pub(crate) fn value_pair_at(vp: &[f32], dv: usize, j: usize, c: usize) -> f32 {
    let w = vp[(j / 2) * dv + c].to_bits();
    let half = if j.is_multiple_of(2) { w & 0xFFFF } else { w >> 16 };
    bf16::from_bits(half as u16).to_f32()
}

/// Whether every element of `x` is finite, vectorised: `x·0` is ±0 for a finite `x` and NaN for
/// `±∞` or NaN, and the sum per lane keeps a NaN. No early exit: [`pv_block`] asks this of one
/// accumulator (`dv·QR` floats) per guarded block, where a scalar loop was 7 % of a windowed
/// call's non-GEMM time.
#[inline(always)]
fn all_finite<S: Simd>(s: S, x: &[f32]) -> bool {
    let (zero, mut acc) = (s.splat(0.0), s.splat(0.0));
    let mut chunks = x.chunks_exact(S::LANES);
    for c in &mut chunks {
        acc = s.add(acc, s.mul(load(s, c), zero));
    }
    let mut lanes = [0.0f32; 16];
    store(s, &mut lanes, acc);
    lanes[..S::LANES].iter().all(|v| *v == 0.0) && chunks.remainder().iter().all(|v| v.is_finite())
}

// ---------------------------------------------------------------------------------------------
// Slice helpers for the decode and unfused paths (vectors along the head dimension)

/// `y ← alpha·x + y` over `min(x.len(), y.len())` elements.
#[inline(always)]
pub(crate) fn axpy<S: Simd>(s: S, alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let l = S::LANES;
    let va = s.splat(alpha);
    let mut i = 0;
    while i + l <= n {
        let r = s.fma(va, load(s, &x[i..]), load(s, &y[i..]));
        store(s, &mut y[i..], r);
        i += l;
    }
    for j in i..n {
        y[j] = alpha.mul_add(x[j], y[j]);
    }
}

/// The probabilities `e^d` of `K` vectors of scores `d = S − m ≤ 0` below the running max: every
/// path's softmax weights (flash, decode, unfused)
/// (or NaN, which stays NaN), flushed to 0 below `d <` [`FLUSH_WEIGHTS_BELOW`] (see there for
/// why, and what it costs in accuracy): the softmax's table exp ([`exp_neg_lut8_p3`], 8
/// FMA-pipe operations per vector against the full-range exp's 13) on `max(d, LUT8_MIN)`, its
/// range, since every lane that the clamp moves is flushed anyway. Masked keys (`−∞`) come out
/// 0 the same way.
///
/// The online softmax's rescale factor `α = e^(m − m')` goes through here too: flushing it
/// drops the earlier keys, whose weights `P_j·α ≤ α` are then below the threshold as well, so
/// the same bound covers them (each key is dropped at most once, by one or the other).
#[inline(always)]
pub(crate) fn weights<S: Simd, const K: usize>(s: S, d: [S::V; K]) -> [S::V; K] {
    const { assert!(LUT8_MIN <= FLUSH_WEIGHTS_BELOW) };
    let (lo, flush, zero) = (s.splat(LUT8_MIN), s.splat(FLUSH_WEIGHTS_BELOW), s.splat(0.0));
    let mut c = d;
    for x in &mut c {
        *x = s.max(lo, *x); // a NaN `x` is kept (`max` returns its second operand)
    }
    let mut e = exp_neg_lut8_p3(s, c);
    for (e, d) in e.iter_mut().zip(d) {
        *e = s.select(s.lt(d, flush), zero, *e);
    }
    e
}

/// `x_j ← e^(x_j − m)` in place, flushed to 0 below `e^(−64)` ([`weights`]); returns their sum
/// (f32) and whether some weight is 0 (a masked key, or one flushed: the decode path's P·V
/// then needs its guard), found by one `min` per vector beside the exp rather than a scan.
/// `m` is the row's running maximum (never below `f32::MIN`), so `−∞` scores give exactly 0.
#[inline(always)]
pub(crate) fn exp_row<S: Simd>(s: S, x: &mut [f32], m: f32) -> (f32, bool) {
    let l = S::LANES;
    let vm = s.splat(m);
    // A weight is 0 or at least e^(−64), far above the smallest normal: `p < MIN_POSITIVE`
    // is `p = 0` (and false for NaN, as `== 0` is).
    let tiny = s.splat(f32::MIN_POSITIVE);
    let mut sum = s.splat(0.0);
    let mut low = s.splat(1.0);
    let mut i = 0;
    while i + l <= x.len() {
        let [p] = weights(s, [s.sub(load(s, &x[i..]), vm)]);
        store(s, &mut x[i..], p);
        sum = s.add(sum, p);
        low = s.min_skip_nan(low, p); // a NaN weight never hides a 0 of its lane
        i += l;
    }
    let mut total = s.reduce_add(sum);
    let mut zero = s.any_lt(low, tiny);
    if i < x.len() {
        let mut tail = [f32::NEG_INFINITY; 16];
        let n = x.len() - i;
        tail[..n].copy_from_slice(&x[i..]);
        let mut buf = [0.0f32; 16];
        for (c, chunk) in tail.chunks_exact(l).enumerate() {
            let [p] = weights(s, [s.sub(load(s, chunk), vm)]);
            store(s, &mut buf[c * l..], p);
        }
        x[i..].copy_from_slice(&buf[..n]);
        total += buf[..n].iter().sum::<f32>();
        zero |= buf[..n].contains(&0.0);
    }
    (total, zero)
}

/// The weights `e^(x_j − m)` of `n` scores `x[lane + j·stride]` whose maximum `m` is `+∞` (a
/// score that overflowed f32, or a `+∞` bias), in place: the `+∞` scores share the weight, so
/// each gets 1 (not `e^(∞ − ∞) = NaN`), every finite or `−∞` score 0, and a NaN stays NaN.
/// Returns their sum, the number of `+∞` scores (NaN if a score is NaN). Off the hot path: only
/// rows that reach `+∞` come here.
#[cold]
pub(crate) fn pos_inf_weights(x: &mut [f32], n: usize, stride: usize, lane: usize) -> f32 {
    let mut sum = 0.0f32;
    for j in 0..n {
        let e = &mut x[lane + j * stride];
        *e = if *e == f32::INFINITY {
            1.0
        } else if e.is_nan() {
            f32::NAN
        } else {
            0.0
        };
        sum += *e;
    }
    sum
}

// ---------------------------------------------------------------------------------------------
// Decode micro-kernels (vectors along the head dimension, several rows and keys per tile)
//
// The decode path has few rows (the queries of one GQA group) and streams every key and value
// row once. Its tiles keep `R` rows by `C` keys (or `CT` value vectors) of accumulators in
// registers, so each key/value vector loaded feeds `R` FMAs and each query vector `C`; the
// scores of four (row, key) pairs are finished by one transposed reduction
// ([`Simd::reduce_add4`]) instead of a horizontal sum each. Each tile slices its rows once,
// to exactly the length it reads, so that the loop bounds imply every index inside them and
// the compiler drops the per-load checks.
//
// The K and V rows are read in their stored type through [`KvMat`] / [`KvRow`]: f32 in place;
// bf16/f16 widened in registers (exact, [`SimdElement`]); int8 widened and multiplied by its
// block's scale in registers (`fl(q·scale)`, one rounding: within `2⁻²⁴` relative, or `2⁻¹⁵⁰`
// absolute among subnormals, of the exact value `q·scale`, and `±∞` past `f32::MAX`). No K/V
// row is ever converted in memory on this path. One body per tile for every storage type.

/// One K/V row (or a run of it) as the decode tiles read it: vectors and single elements,
/// widened (or dequantised) to f32.
pub(crate) trait KvRow: Copy {
    /// A row with no element (the initial value of tile arrays).
    fn empty() -> Self;
    /// Elements `start..start + len` of this run (panics unless inside).
    fn sub(self, start: usize, len: usize) -> Self;
    /// `LANES` elements from `at` as f32 (panics unless inside).
    fn vec<S: Simd>(self, s: S, at: usize) -> S::V;
    /// Element `at` as f32, the same value as the lane [`vec`](Self::vec) gives it.
    fn get(self, at: usize) -> f32;
    /// The score tiles' step on a query vector `q` and a vector `k` of this row:
    /// `acc + q·k` by lanes (an FMA).
    #[inline(always)]
    fn mad<S: Simd>(s: S, q: S::V, k: S::V, acc: S::V) -> S::V {
        s.fma(q, k, acc)
    }
    /// [`mad`](Self::mad) on one element (the tiles' scalar tail).
    #[inline(always)]
    fn mad1(q: f32, k: f32, acc: f32) -> f32 {
        q.mul_add(k, acc)
    }
}

impl<T: SimdElement> KvRow for &[T] {
    #[inline(always)]
    fn empty() -> Self {
        &[]
    }
    #[inline(always)]
    fn sub(self, start: usize, len: usize) -> Self {
        &self[start..start + len]
    }
    #[inline(always)]
    fn vec<S: Simd>(self, s: S, at: usize) -> S::V {
        // Operands of the tiles' FMAs only (or stored to a gathered block that only feeds
        // FMAs): a bf16 NaN need not be quieted here (the 3 instructions it takes per vector
        // were most of the widening, perf journal 2026-12-05).
        load_operands(s, &self[at..])
    }
    #[inline(always)]
    fn get(self, at: usize) -> f32 {
        self[at].widen()
    }
}

/// A run of one int8-quantised row: values `v` (starting at column `base` of the row) and the
/// row's scales `sc` from block 0. Element `at` is `v[at]·sc[(base + at)/32]` rounded to f32.
#[derive(Clone, Copy)]
pub(crate) struct Q8Row<'a> {
    v: &'a [i8],
    sc: &'a [f32],
    base: usize,
}

impl KvRow for Q8Row<'_> {
    #[inline(always)]
    fn empty() -> Self {
        Q8Row { v: &[], sc: &[], base: 0 }
    }
    #[inline(always)]
    fn sub(self, start: usize, len: usize) -> Self {
        Q8Row { v: &self.v[start..start + len], sc: self.sc, base: self.base + start }
    }
    #[inline(always)]
    fn vec<S: Simd>(self, s: S, at: usize) -> S::V {
        // A vector never straddles two blocks: the callers load at multiples of LANES from a
        // block boundary (`base` and `at` are multiples of LANES, which divides 32).
        const { assert!(Q8_BLOCK.is_multiple_of(S::LANES)) };
        debug_assert!((self.base + at).is_multiple_of(S::LANES));
        let x = &self.v[at..at + S::LANES];
        let scale = self.sc[(self.base + at) / Q8_BLOCK];
        // SAFETY: `x` has exactly LANES elements.
        let q = unsafe { s.load_i8(x.as_ptr()) };
        s.mul(q, s.splat(scale))
    }
    #[inline(always)]
    fn get(self, at: usize) -> f32 {
        f32::from(self.v[at]) * self.sc[(self.base + at) / Q8_BLOCK]
    }
}

/// The K or V matrix of one `(batch, K/V head)` (`[nk, d]`) as the decode tiles read it in
/// place, and as the flash path converts it block by block ([`KvMat::gather`]).
pub(crate) trait KvMat: Copy {
    /// One row's run.
    type Row: KvRow;
    /// True when the rows can be read in place (contiguous columns for `n` of them); otherwise
    /// only [`at`](Self::at) and [`gather`](Self::gather) may be used.
    fn in_place(&self, n: usize) -> bool;
    /// True when rows `j0..j0 + nb`, columns `0..n` are inside the data (no overflow).
    fn covers(&self, j0: usize, nb: usize, n: usize) -> bool;
    /// Columns `c0..c0 + n` of row `j` (only when [`in_place`](Self::in_place); panics unless
    /// inside).
    fn row(self, j: usize, c0: usize, n: usize) -> Self::Row;
    /// Element `(j, c)` as f32 (widened or dequantised), any strides.
    fn at(self, j: usize, c: usize) -> f32;
    /// Hints that row `j` (`n` columns) will be read soon: into L1, or with `far` into L2.
    /// Any `j`: nothing is read.
    fn prefetch(self, j: usize, n: usize, far: bool);
    /// True when a one-row decode score tile reads its key rows one after the other, front to
    /// back, and leaves the rows after the block to the hardware prefetcher ([`dec_qk_tile`],
    /// [`dec_qk_rows`]): the plain element types. Not int8: its tiles are bound by the
    /// dequantising arithmetic, which the interleaved order's shared query loads serve
    /// better (key by key ran 0.76× on Zen 4, perf journal, 2026-12-04 21:30).
    const STREAMED: bool;
    /// True when a one-row decode score tile keeps its query row in registers for the block,
    /// when the row is 4 or 8 vectors long ([`dec_qk_row_regs`]), and, where the rows continue
    /// in memory, leaves this block's value rows to the hardware prefetcher: the 2-byte types
    /// (bf16, f16, bf16 pairs), whose rows it streams from DRAM 1.4× as fast as the
    /// [`STREAMED`](Self::STREAMED) loop with the value prefetch. Not f32: with the query in
    /// registers it ran 1.31× in L1 but 0.6–0.95× from DRAM (perf journal, 2026-12-05 20:11).
    const QUERY_IN_REGISTERS: bool = false;
    /// True when the multi-row decode score tiles (GQA groups) prefetch their key rows ahead
    /// and the block's value rows into L2 rather than L1: f32 rows (256 lines a block; one
    /// reading, not proven: into L1 they hold the L1 miss buffers the tiles' own loads wait
    /// for), which ran 1.05–1.35× from DRAM and L3 on Zen 4 (perf journal, 2026-12-05
    /// 23:20). Not the 2-byte types (half the lines; with L2 hints they lost 1.4× in one of
    /// two builds) nor int8 (no change).
    const GROUP_PREFETCH_FAR: bool = false;
    /// True for [`Pairs`]: columns are words of bf16 pairs, and the query rows the score tiles
    /// read must be pairs too.
    const PAIRS: bool = false;

    /// Rows `j0..j0 + nb`, columns `0..n`, widened (or dequantised) into `buf` as a contiguous
    /// `nb × n` f32 matrix: by vectors when [`in_place`](Self::in_place), element by element
    /// otherwise. The same values the tiles read.
    #[inline(always)]
    fn gather<S: Simd>(self, s: S, j0: usize, nb: usize, n: usize, buf: &mut [f32]) {
        let l = S::LANES;
        if n == 0 {
            return;
        }
        let contiguous = self.in_place(n);
        for (j, dst) in buf[..nb * n].chunks_exact_mut(n).enumerate() {
            if contiguous {
                let row = self.row(j0 + j, 0, n);
                let mut d = 0;
                while d + l <= n {
                    store(s, &mut dst[d..], row.vec(s, d));
                    d += l;
                }
                for (c, x) in dst.iter_mut().enumerate().skip(d) {
                    *x = row.get(c);
                }
            } else {
                for (c, x) in dst.iter_mut().enumerate() {
                    *x = self.at(j0 + j, c);
                }
            }
        }
    }
}

impl<'a, T: SimdElement> KvMat for Strided<'a, T> {
    type Row = &'a [T];
    const STREAMED: bool = true;
    const QUERY_IN_REGISTERS: bool = T::SIZE == 2;
    const GROUP_PREFETCH_FAR: bool = T::SIZE == 4;
    #[inline(always)]
    fn in_place(&self, n: usize) -> bool {
        self.cs == 1 || n <= 1
    }
    #[inline(always)]
    fn covers(&self, j0: usize, nb: usize, n: usize) -> bool {
        Strided::covers(self, j0, nb, n)
    }
    #[inline(always)]
    fn row(self, j: usize, c0: usize, n: usize) -> &'a [T] {
        &self.data[self.offset + j * self.rs + c0..][..n]
    }
    #[inline(always)]
    fn at(self, j: usize, c: usize) -> f32 {
        self.data[self.offset + j * self.rs + c * self.cs].widen()
    }
    #[inline(always)]
    fn prefetch(self, j: usize, n: usize, far: bool) {
        let at = self.offset.wrapping_add(j.wrapping_mul(self.rs));
        prefetch_bytes(self.data.as_ptr().wrapping_add(at).cast(), n * T::SIZE, far);
    }
}

/// An int8-quantised K/V matrix of one `(batch, K/V head)`: values `[nk, d]` and scales
/// `[nk, ⌈d/32⌉]` (see [`attn_core::quant`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q8Mat<'a> {
    /// The int8 values.
    pub v: Strided<'a, i8>,
    /// The f32 scales, one per block of 32 columns.
    pub sc: Strided<'a, f32>,
}

impl<'a> KvMat for Q8Mat<'a> {
    type Row = Q8Row<'a>;
    const STREAMED: bool = false;
    #[inline(always)]
    fn in_place(&self, n: usize) -> bool {
        (self.v.cs == 1 || n <= 1) && (self.sc.cs == 1 || q8_blocks(n) <= 1)
    }
    #[inline(always)]
    fn covers(&self, j0: usize, nb: usize, n: usize) -> bool {
        self.v.covers(j0, nb, n) && self.sc.covers(j0, nb, q8_blocks(n))
    }
    #[inline(always)]
    fn row(self, j: usize, c0: usize, n: usize) -> Q8Row<'a> {
        let v = &self.v.data[self.v.offset + j * self.v.rs + c0..][..n];
        let sc = &self.sc.data[self.sc.offset + j * self.sc.rs..][..q8_blocks(c0 + n)];
        Q8Row { v, sc, base: c0 }
    }
    #[inline(always)]
    fn at(self, j: usize, c: usize) -> f32 {
        let q = self.v.data[self.v.offset + j * self.v.rs + c * self.v.cs];
        let b = c / Q8_BLOCK;
        f32::from(q) * self.sc.data[self.sc.offset + j * self.sc.rs + b * self.sc.cs]
    }
    #[inline(always)]
    fn prefetch(self, j: usize, n: usize, far: bool) {
        let at = self.v.offset.wrapping_add(j.wrapping_mul(self.v.rs));
        prefetch_bytes(self.v.data.as_ptr().wrapping_add(at).cast(), n, far);
        let at = self.sc.offset.wrapping_add(j.wrapping_mul(self.sc.rs));
        prefetch_bytes(self.sc.data.as_ptr().wrapping_add(at).cast(), 1, far);
    }
}

/// A K or V matrix of one `(batch, K/V head)` in any storage type: what `Problem::keys` and
/// `Problem::values` return; the paths dispatch on it once per task.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KvAny<'a> {
    /// f32.
    F32(Strided<'a, f32>),
    /// bf16.
    BF16(Strided<'a, attn_core::bf16>),
    /// f16.
    F16(Strided<'a, attn_core::f16>),
    /// int8 with block scales.
    Q8(Q8Mat<'a>),
}

impl KvAny<'_> {
    /// [`KvMat::prefetch`] of whichever type this holds (one match per hint, so that the
    /// decode tiles are not instantiated once per value type for their prefetches).
    #[inline(always)]
    fn prefetch(self, j: usize, n: usize, far: bool) {
        match self {
            KvAny::F32(m) => m.prefetch(j, n, far),
            KvAny::BF16(m) => m.prefetch(j, n, far),
            KvAny::F16(m) => m.prefetch(j, n, far),
            KvAny::Q8(m) => m.prefetch(j, n, far),
        }
    }

    /// Prefetches part `part` of `parts` equal parts of the bytes from row `j` to the end of
    /// row `j + n − 1` (whatever lies between the rows too: where the K/V heads interleave,
    /// the same rows of the other heads), for int8 the values and the scales; into L2 with
    /// `far`. A hint: any `j`, nothing is read.
    #[inline(always)]
    pub(crate) fn prefetch_part(self, j: usize, n: usize, part: usize, parts: usize, far: bool) {
        fn span<T>(m: Strided<'_, T>, j: usize, n: usize, part: usize, parts: usize, far: bool) {
            let bytes = n.wrapping_mul(m.rs).wrapping_mul(std::mem::size_of::<T>());
            let piece = bytes.div_ceil(parts.max(1));
            let at = m.offset.wrapping_add(j.wrapping_mul(m.rs));
            let p = m.data.as_ptr().wrapping_add(at).cast::<u8>();
            prefetch_bytes(p.wrapping_add(part.wrapping_mul(piece)), piece, far);
        }
        match self {
            KvAny::F32(m) => span(m, j, n, part, parts, far),
            KvAny::BF16(m) => span(m, j, n, part, parts, far),
            KvAny::F16(m) => span(m, j, n, part, parts, far),
            KvAny::Q8(m) => {
                span(m.v, j, n, part, parts, far);
                span(m.sc, j, n, part, parts, far);
            }
        }
    }

    /// Bytes from one key's row to the next one's (for int8 the values' and the scales'):
    /// what a block takes in cache per key, with whatever lies between the rows (saturating).
    #[inline(always)]
    pub(crate) fn key_bytes(self) -> usize {
        fn stride<T>(m: Strided<'_, T>) -> usize {
            m.rs.saturating_mul(std::mem::size_of::<T>())
        }
        match self {
            KvAny::F32(m) => stride(m),
            KvAny::BF16(m) => stride(m),
            KvAny::F16(m) => stride(m),
            KvAny::Q8(m) => stride(m.v).saturating_add(stride(m.sc)),
        }
    }

    /// [`KvMat::gather`] of whichever type this holds.
    #[inline(always)]
    pub(crate) fn gather<S: Simd>(self, s: S, j0: usize, nb: usize, n: usize, buf: &mut [f32]) {
        match self {
            KvAny::F32(m) => m.gather(s, j0, nb, n, buf),
            KvAny::BF16(m) => m.gather(s, j0, nb, n, buf),
            KvAny::F16(m) => m.gather(s, j0, nb, n, buf),
            KvAny::Q8(m) => m.gather(s, j0, nb, n, buf),
        }
    }
}

/// A bf16 key matrix read as bf16 pairs, for the decode score tiles on `vdpbf16ps`
/// ([`HalfPath::Dot`](crate::gemm::HalfPath)): column `w` is the 32-bit word of elements
/// `2w` (low half) and `2w + 1`, and the tiles' step is [`Simd::dot_bf16`] against query rows
/// of pairs. A value exists only on a CPU with AVX512_BF16 ([`Pairs::new`]), which is what
/// makes that step safe; the caller runs its tiles in
/// [`vectorize_dot`](crate::arch::vectorize_dot).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pairs<'a>(Strided<'a, bf16>);

impl<'a> Pairs<'a> {
    /// `m` read as pairs, when this CPU has AVX512_BF16 (else `None`).
    pub(crate) fn new(m: Strided<'a, bf16>) -> Option<Self> {
        crate::gemm::bf16_dot_available().then_some(Pairs(m))
    }
}

/// A run of one row of [`Pairs`]: `2·n` bf16 elements, `n` words.
#[derive(Clone, Copy)]
pub(crate) struct PairRow<'a>(&'a [bf16]);

impl KvRow for PairRow<'_> {
    #[inline(always)]
    fn empty() -> Self {
        PairRow(&[])
    }
    #[inline(always)]
    fn sub(self, start: usize, len: usize) -> Self {
        PairRow(&self.0[2 * start..2 * (start + len)])
    }
    #[inline(always)]
    fn vec<S: Simd>(self, s: S, at: usize) -> S::V {
        let x = &self.0[2 * at..2 * (at + S::LANES)];
        // SAFETY: `x` holds `2·LANES` bf16, the bytes of `LANES` f32 (read unaligned).
        unsafe { s.load(x.as_ptr().cast()) }
    }
    #[inline(always)]
    fn get(self, at: usize) -> f32 {
        pair(self.0[2 * at].to_bits(), self.0[2 * at + 1].to_bits())
    }
    #[inline(always)]
    fn mad<S: Simd>(s: S, q: S::V, k: S::V, acc: S::V) -> S::V {
        // SAFETY: a `PairRow` comes only from a `Pairs`, which exists only on a CPU with
        // AVX512_BF16 (`Pairs::new`).
        unsafe { s.dot_bf16(acc, q, k) }
    }
    #[inline(always)]
    fn mad1(q: f32, k: f32, acc: f32) -> f32 {
        bf16_pair_dot(acc, q, k)
    }
}

impl<'a> KvMat for Pairs<'a> {
    type Row = PairRow<'a>;
    const STREAMED: bool = true;
    const QUERY_IN_REGISTERS: bool = true;
    const PAIRS: bool = true;
    #[inline(always)]
    fn in_place(&self, n: usize) -> bool {
        self.0.cs == 1 || n == 0
    }
    #[inline(always)]
    fn covers(&self, j0: usize, nb: usize, n: usize) -> bool {
        n.checked_mul(2).is_some_and(|e| self.0.covers(j0, nb, e))
    }
    #[inline(always)]
    fn row(self, j: usize, c0: usize, n: usize) -> PairRow<'a> {
        let m = self.0;
        PairRow(&m.data[m.offset + j * m.rs + 2 * c0..][..2 * n])
    }
    #[inline(always)]
    fn at(self, j: usize, c: usize) -> f32 {
        let e = |d: usize| self.0.data[self.0.offset + j * self.0.rs + d * self.0.cs].to_bits();
        pair(e(2 * c), e(2 * c + 1))
    }
    #[inline(always)]
    fn prefetch(self, j: usize, n: usize, far: bool) {
        self.0.prefetch(j, 2 * n, far);
    }
}

/// Decode score tile: `out[r·os + c] = Σ_d q[r·dk + d] · k(j + c, d)` for `r < R`, `c < C`,
/// `d < dk`: vectors along `d`, one accumulator per (row, key), a scalar tail for
/// `dk mod LANES`. For [`Pairs`] the columns are words of bf16 pairs (`dk` of them, and as
/// many in each query row) and each product is [`KvRow::mad`]'s pair dot product. Panics
/// unless `q` holds the `R` rows, `k` the `C` key rows and `out` the tile.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dec_qk_tile<S: Simd, K: KvMat, const R: usize, const C: usize>(
    s: S,
    dk: usize,
    q: &[f32],
    k: K,
    j: usize,
    out: &mut [f32],
    os: usize,
) {
    debug_assert!(R >= 1 && C >= 1);
    let l = S::LANES;
    // Plain loops, not `array::from_fn`: through its closure the compiler lost the lengths.
    let mut qs = [&[][..]; R];
    for (r, x) in qs.iter_mut().enumerate() {
        *x = &q[r * dk..][..dk];
    }
    let mut ks = [K::Row::empty(); C];
    for (c, x) in ks.iter_mut().enumerate() {
        *x = k.row(j + c, 0, dk);
    }
    let mut acc = [[s.splat(0.0); C]; R];
    let mut d = 0;
    if R == 1 && K::STREAMED {
        // One row: each key row is read front to back before the next, so K streams in
        // address order, which the hardware prefetcher follows (see `dec_qk_rows`). Each
        // accumulator sees the same FMAs in the same order as in the loop below.
        let q = qs[0];
        for (a, kc) in acc[0].iter_mut().zip(&ks) {
            let mut dd = 0;
            while dd + l <= dk {
                *a = K::Row::mad(s, load(s, &q[dd..]), kc.vec(s, dd), *a);
                dd += l;
            }
            d = dd;
        }
    }
    // Windows of U vectors per row: one bounds check per row and window, none per load.
    const U: usize = 4;
    while d + U * l <= dk {
        let mut kw = [K::Row::empty(); C];
        for (w, kc) in kw.iter_mut().zip(&ks) {
            *w = kc.sub(d, U * l);
        }
        let mut qw = [&[][..]; R];
        for (w, qr) in qw.iter_mut().zip(&qs) {
            *w = &qr[d..d + U * l];
        }
        for u in 0..U {
            dec_qk_fma(s, &mut acc, &kw, &qw, u * l);
        }
        d += U * l;
    }
    while d + l <= dk {
        dec_qk_fma(s, &mut acc, &ks, &qs, d);
        d += l;
    }
    let tail = d;
    // The sums, then, when `dk` is not a multiple of LANES, the scalar tail.
    store_sums(s, &acc, out, os);
    if tail < dk {
        for (r, qr) in qs.iter().enumerate() {
            for (c, kc) in ks.iter().enumerate() {
                let o = &mut out[r * os + c];
                let mut x = *o;
                for (dd, qd) in qr.iter().enumerate().skip(tail) {
                    x = K::Row::mad1(*qd, kc.get(dd), x);
                }
                *o = x;
            }
        }
    }
}

/// `out[r·os + c] = Σ lanes of acc[r][c]`: the transposed reduction of a score tile's `R·C`
/// accumulators, four at a time (zero-padded), written straight to their places. Constant trip
/// counts and no data-dependent loop inside, so the loop unrolls and the accumulators stay in
/// registers (see the perf journal, 2026-12-04).
#[inline(always)]
fn store_sums<S: Simd, const R: usize, const C: usize>(
    s: S,
    acc: &[[S::V; C]; R],
    out: &mut [f32],
    os: usize,
) {
    for f in 0..(R * C).div_ceil(4) {
        let mut quad = [s.splat(0.0); 4];
        for (g, x) in quad.iter_mut().enumerate() {
            if 4 * f + g < R * C {
                *x = acc[(4 * f + g) / C][(4 * f + g) % C];
            }
        }
        for (g, &sum) in s.reduce_add4(quad).iter().enumerate() {
            if 4 * f + g < R * C {
                out[(4 * f + g) / C * os + (4 * f + g) % C] = sum;
            }
        }
    }
}

/// The one-row score tile with the query row in registers (`qv`, `dk = NV·LANES`):
/// `out[c] = q · k(j + c)` for `c < C`. Each key row is read front to back as one FMA chain:
/// the same FMAs in the same order as [`dec_qk_tile`]'s one-row loop, so the scores are
/// bitwise the same. With `NV` a constant, the loads need no bounds check and the chains no
/// loop branch.
#[inline(always)]
fn dec_qk_tile_regs<S: Simd, K: KvMat, const NV: usize, const C: usize>(
    s: S,
    qv: &[S::V; NV],
    k: K,
    j: usize,
    out: &mut [f32],
) {
    let l = S::LANES;
    let mut acc = [[s.splat(0.0); C]; 1];
    for (c, a) in acc[0].iter_mut().enumerate() {
        let kr = k.row(j + c, 0, NV * l);
        for (v, q) in qv.iter().enumerate() {
            *a = K::Row::mad(s, *q, kr.vec(s, v * l), *a);
        }
    }
    store_sums(s, &acc, out, 1);
}

/// One vector step of [`dec_qk_tile`]: `acc[r][c] += q_r[at..] · k_c[at..]` (`LANES` lanes).
#[inline(always)]
fn dec_qk_fma<S: Simd, KR: KvRow, const R: usize, const C: usize>(
    s: S,
    acc: &mut [[S::V; C]; R],
    ks: &[KR; C],
    qs: &[&[f32]; R],
    at: usize,
) {
    let mut kv = [s.splat(0.0); C];
    for (x, kc) in kv.iter_mut().zip(ks) {
        *x = kc.vec(s, at);
    }
    for (ar, qr) in acc.iter_mut().zip(qs) {
        let qv = load(s, &qr[at..]);
        for (a, x) in ar.iter_mut().zip(&kv) {
            *a = KR::mad(s, qv, *x, *a);
        }
    }
}

/// Decode P·V tile: `o[r·o_rs + c·LANES + e] += Σ_j p[r·ps + j] · v(j0 + j, c0 + c·LANES + e)`
/// for `r < R`, `c < CT`, `e < LANES`, `j < nb`. With `GUARD` a zero weight contributes exactly
/// nothing even when the value is `±∞`/NaN (a masked key over an unwritten cache slot);
/// without it (no zero weight in the block) the loop is the plain FMA chain. Panics unless
/// `p`, `v` and `o` hold those ranges.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dec_pv_tile<S: Simd, V: KvMat, const R: usize, const CT: usize, const GUARD: bool>(
    s: S,
    nb: usize,
    p: &[f32],
    ps: usize,
    v: V,
    j0: usize,
    c0: usize,
    o: &mut [f32],
    o_rs: usize,
) {
    let l = S::LANES;
    let w = CT * l;
    let mut pr = [&[][..]; R];
    for (r, x) in pr.iter_mut().enumerate() {
        *x = &p[r * ps..][..nb];
    }
    let mut acc = [[s.splat(0.0); CT]; R];
    for (r, ar) in acc.iter_mut().enumerate() {
        let orow = &o[r * o_rs..][..w];
        for (c, a) in ar.iter_mut().enumerate() {
            *a = load(s, &orow[c * l..]);
        }
    }
    for j in 0..nb {
        let vrow = v.row(j0 + j, c0, w);
        let mut vv = [s.splat(0.0); CT];
        for (c, x) in vv.iter_mut().enumerate() {
            *x = vrow.vec(s, c * l);
        }
        for (ar, prow) in acc.iter_mut().zip(&pr) {
            let w = s.splat(prow[j]);
            if GUARD {
                let m = s.nonzero(w);
                for (a, x) in ar.iter_mut().zip(&vv) {
                    *a = s.fma_where(m, w, *x, *a);
                }
            } else {
                for (a, x) in ar.iter_mut().zip(&vv) {
                    *a = s.fma(w, *x, *a);
                }
            }
        }
    }
    for (r, ar) in acc.iter().enumerate() {
        let orow = &mut o[r * o_rs..][..w];
        for (c, a) in ar.iter().enumerate() {
            store(s, &mut orow[c * l..], *a);
        }
    }
}

/// The value rows that [`dec_qk_rows`] prefetches for the P·V pass that follows: rows
/// `j0..j0 + nb` of `v`, `dv` columns.
#[derive(Clone, Copy)]
struct PrefetchV<'a> {
    v: KvAny<'a>,
    j0: usize,
    dv: usize,
}

/// All keys of one row tile of [`decode_qk_block`]: tiles of `C` keys, then single keys
/// (`k` from the block's first key row `j0`, `out` from the tile's first row). Ahead of each
/// tile it prefetches, when `ahead = Some((m, a))` is given, the same keys' rows of the block
/// read next (rows `a + j` of `m`: where that block lives, which need not be `k`, e.g.
/// another head or page; a one-row tile skips them when they follow this block, `a = j0 +
/// nb`) and, when `pv` is given, the value rows of the same keys, which the P·V pass of the
/// block reads next.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dec_qk_rows<S: Simd, K: KvMat, const R: usize, const C: usize>(
    s: S,
    dk: usize,
    q: &[f32],
    k: K,
    j0: usize,
    nb: usize,
    out: &mut [f32],
    os: usize,
    ahead: Option<(K, usize)>,
    pv: Option<PrefetchV<'_>>,
) {
    // A one-row tile of a plain type reads its keys in address order (`dec_qk_tile`); when the
    // rows ahead follow this block's in memory, the hardware prefetcher streams them, and a
    // software prefetch only takes an L1 miss buffer from it. Interleaved multi-row tiles,
    // int8 and the blocks of another page still need it (perf journal, 2026-12-04 21:30). With
    // the query in registers the same holds for the value rows (2026-12-05 20:11).
    let follows = ahead.is_some_and(|(_, a)| a == j0.wrapping_add(nb));
    let ahead = ahead.filter(|_| R > 1 || !K::STREAMED || !follows);
    let far = R > 1 && K::GROUP_PREFETCH_FAR;
    if R == 1 && K::QUERY_IN_REGISTERS {
        let pv = pv.filter(|_| !follows);
        let l = S::LANES;
        if dk == 8 * l {
            return dec_qk_row_regs::<S, K, 8, C>(s, q, k, j0, nb, out, ahead, pv, dk);
        }
        if dk == 4 * l {
            return dec_qk_row_regs::<S, K, 4, C>(s, q, k, j0, nb, out, ahead, pv, dk);
        }
    }
    let mut j = 0;
    while j + C <= nb {
        prefetch_tile(ahead, pv, j, C, dk, far);
        dec_qk_tile::<S, K, R, C>(s, dk, q, k, j0 + j, &mut out[j..], os);
        j += C;
    }
    while j < nb {
        dec_qk_tile::<S, K, R, 1>(s, dk, q, k, j0 + j, &mut out[j..], os);
        j += 1;
    }
}

/// [`dec_qk_rows`] for one query row (`q`) of `dk = NV·LANES` columns: the row is loaded
/// into registers once for the block ([`KvMat::QUERY_IN_REGISTERS`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dec_qk_row_regs<S: Simd, K: KvMat, const NV: usize, const C: usize>(
    s: S,
    q: &[f32],
    k: K,
    j0: usize,
    nb: usize,
    out: &mut [f32],
    ahead: Option<(K, usize)>,
    pv: Option<PrefetchV<'_>>,
    dk: usize,
) {
    let l = S::LANES;
    let q = &q[..NV * l];
    let mut qv = [s.splat(0.0); NV];
    for (v, x) in qv.iter_mut().enumerate() {
        *x = load(s, &q[v * l..]);
    }
    let mut j = 0;
    while j + C <= nb {
        prefetch_tile(ahead, pv, j, C, dk, false);
        dec_qk_tile_regs::<S, K, NV, C>(s, &qv, k, j0 + j, &mut out[j..]);
        j += C;
    }
    while j < nb {
        dec_qk_tile_regs::<S, K, NV, 1>(s, &qv, k, j0 + j, &mut out[j..]);
        j += 1;
    }
}

/// The prefetches ahead of a score tile of `n` keys from the block's key `j` (see
/// [`dec_qk_rows`]). Hints only: the rows may lie past the tensor.
#[inline(always)]
fn prefetch_tile<K: KvMat>(
    ahead: Option<(K, usize)>,
    pv: Option<PrefetchV<'_>>,
    j: usize,
    n: usize,
    dk: usize,
    far: bool,
) {
    for c in 0..n {
        if let Some((m, a)) = ahead {
            m.prefetch(a.wrapping_add(j + c), dk, far);
        }
        if let Some(p) = pv {
            p.v.prefetch(p.j0.wrapping_add(j + c), p.dv, far);
        }
    }
}

/// `GUARD` argument of [`dec_pv_rows`]: zero weights are skipped lane by lane.
const GUARDED: bool = true;
/// `GUARD` argument of [`dec_pv_rows`]: plain FMA loop (no zero weight in the block).
const PLAIN: bool = false;

/// All value columns of one row tile of [`decode_pv_block`]: tiles of `CT` vectors, of 4 and 2
/// (where narrower than `CT`), single vectors, then the `dv mod LANES` scalar columns (`p`,
/// `o` from the tile's first row, `v` from the block's first value row `j0`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dec_pv_rows<S: Simd, V: KvMat, const R: usize, const CT: usize, const GUARD: bool>(
    s: S,
    dv: usize,
    nb: usize,
    p: &[f32],
    ps: usize,
    v: V,
    j0: usize,
    o: &mut [f32],
    o_rs: usize,
) {
    let l = S::LANES;
    let mut c = 0;
    macro_rules! tiles {
        ($w:expr) => {
            while c + $w * l <= dv {
                dec_pv_tile::<S, V, R, { $w }, GUARD>(s, nb, p, ps, v, j0, c, &mut o[c..], o_rs);
                c += $w * l;
            }
        };
    }
    tiles!(CT);
    // Then narrower tiles before single vectors, so that a row shorter than the widest tile
    // (d = 64 against 8 vectors) is still read whole, row after row, rather than one column
    // of vectors at a time over the block: 1.06–1.11× on Zen 4 (perf journal, 2026-12-04).
    if CT > 4 {
        tiles!(4);
    }
    if CT > 2 {
        tiles!(2);
    }
    tiles!(1);
    for col in c..dv {
        for r in 0..R {
            let prow = &p[r * ps..][..nb];
            let mut x = o[r * o_rs + col];
            for (j, &w) in prow.iter().enumerate() {
                // A zero weight is skipped, whatever the value (see dec_pv_tile).
                if w != 0.0 {
                    x = w.mul_add(v.row(j0 + j, col, 1).get(0), x);
                }
            }
            o[r * o_rs + col] = x;
        }
    }
}

/// Decode scores of one key block: `out[r·os + j] = Σ_d q[r·dk + d] · k(j0 + j, d)` for
/// `r < rows`, `j < nb`, where `q` holds `rows` pre-scaled query rows of `dk` floats and `k`
/// is read in place in its storage type (`k.in_place(dk)`; gather otherwise); for [`Pairs`],
/// unscaled rows of `dk` words of bf16 pairs.
/// `ahead = Some((m, a))` prefetches key rows `a..a + nb` of `m`, those of the block read
/// next (the caller says where they are: further on in `k`, another head's, or in another
/// page). `prefetch_v = Some((v, vj0, dv))` also prefetches value rows
/// `vj0..vj0 + nb` of `v` while
/// the scores are computed, so the P·V pass that follows finds them in cache. Rows go in tiles
/// of up to four, keys in tiles of [`DECODE_QK_KEYS`]`[R − 1]`. Panics if a buffer is too
/// small or `k` cannot be read in place, which the caller rules out. With `dk = 0` the scores
/// are 0 and K is not indexed.
///
/// [`DECODE_QK_KEYS`]: super::blocking::DECODE_QK_KEYS
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_qk_block<S: Simd, K: KvMat>(
    s: S,
    q: &[f32],
    rows: usize,
    dk: usize,
    k: K,
    j0: usize,
    nb: usize,
    out: &mut [f32],
    os: usize,
    ahead: Option<(K, usize)>,
    prefetch_v: Option<(KvAny<'_>, usize, usize)>,
) {
    use super::blocking::DECODE_QK_KEYS as W;
    if rows == 0 || nb == 0 {
        return;
    }
    assert!(os >= nb && out.len() >= (rows - 1) * os + nb && q.len() >= rows * dk);
    if dk == 0 {
        for r in 0..rows {
            out[r * os..r * os + nb].fill(0.0);
        }
        return;
    }
    assert!(k.in_place(dk) && k.covers(j0, nb, dk));
    let mut r0 = 0;
    while r0 < rows {
        let rt = (rows - r0).min(4);
        let (qt, ot) = (&q[r0 * dk..], &mut out[r0 * os..]);
        // The key rows ahead and the value rows are prefetched once, with the first row tile.
        let pv = match prefetch_v {
            Some((v, j0, dv)) if r0 == 0 => Some(PrefetchV { v, j0, dv }),
            _ => None,
        };
        let ahead = if r0 == 0 { ahead } else { None };
        match rt {
            1 => dec_qk_rows::<S, K, 1, { W[0] }>(s, dk, qt, k, j0, nb, ot, os, ahead, pv),
            2 => dec_qk_rows::<S, K, 2, { W[1] }>(s, dk, qt, k, j0, nb, ot, os, ahead, pv),
            3 => dec_qk_rows::<S, K, 3, { W[2] }>(s, dk, qt, k, j0, nb, ot, os, ahead, pv),
            _ => dec_qk_rows::<S, K, 4, { W[3] }>(s, dk, qt, k, j0, nb, ot, os, ahead, pv),
        }
        r0 += rt;
    }
}

/// Decode P·V of one value block: `o[r·dv + c] += Σ_j p[r·ps + j] · v(j0 + j, c)` for
/// `r < rows`, `c < dv`, `j < nb`; `v` is read in place in its storage type
/// (`v.in_place(dv)`; gather otherwise). `guard` must be set when some weight of the block
/// may be 0: those then contribute exactly 0 whatever the value (see [`dec_pv_tile`]). Rows go
/// in tiles of up to four, columns in tiles of [`DECODE_PV_VECS`]`[R − 1]` vectors
/// ([`DECODE_PV_VECS_32`] where the ISA has 32 registers). Panics if a buffer is too small or
/// `v` cannot be read in place.
///
/// [`DECODE_PV_VECS`]: super::blocking::DECODE_PV_VECS
/// [`DECODE_PV_VECS_32`]: super::blocking::DECODE_PV_VECS_32
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_pv_block<S: Simd, V: KvMat>(
    s: S,
    guard: bool,
    p: &[f32],
    ps: usize,
    rows: usize,
    nb: usize,
    v: V,
    j0: usize,
    dv: usize,
    o: &mut [f32],
) {
    use super::blocking::{DECODE_PV_VECS as W16, DECODE_PV_VECS_32 as W32};
    if rows == 0 || nb == 0 || dv == 0 {
        return;
    }
    assert!(ps >= nb && p.len() >= (rows - 1) * ps + nb && o.len() >= rows * dv);
    assert!(v.in_place(dv) && v.covers(j0, nb, dv));
    let mut r0 = 0;
    while r0 < rows {
        let rt = (rows - r0).min(4);
        let (pt, ot) = (&p[r0 * ps..], &mut o[r0 * dv..]);
        macro_rules! rows {
            ($r:literal) => {
                if S::REGISTERS >= 32 {
                    rows!($r, W32[$r - 1])
                } else {
                    rows!($r, W16[$r - 1])
                }
            };
            ($r:literal, $ct:expr) => {
                if guard {
                    dec_pv_rows::<S, V, $r, { $ct }, GUARDED>(s, dv, nb, pt, ps, v, j0, ot, dv)
                } else {
                    dec_pv_rows::<S, V, $r, { $ct }, PLAIN>(s, dv, nb, pt, ps, v, j0, ot, dv)
                }
            };
        }
        match rt {
            1 => rows!(1),
            2 => rows!(2),
            3 => rows!(3),
            _ => rows!(4),
        }
        r0 += rt;
    }
}

/// Prefetches the cache lines of the `n` bytes at `p` into L1, or with `far` into L2 (a
/// hint: `p` may lie anywhere).
#[inline(always)]
fn prefetch_bytes(p: *const u8, n: usize, far: bool) {
    let mut d = 0;
    while d < n {
        prefetch_line(p.wrapping_add(d).cast(), far);
        d += LINE_BYTES;
    }
}

/// Bytes per cache line (the prefetch stride).
const LINE_BYTES: usize = 64;

/// `max(init, max_j x_j)` with NaN entries ignored (as `if x > m { m = x }` does), vectorised:
/// the decode path's per-block row maximum. `init` must not be NaN.
#[inline(always)]
pub(crate) fn row_max<S: Simd>(s: S, x: &[f32], init: f32) -> f32 {
    let l = S::LANES;
    let mut acc = s.splat(init);
    let mut i = 0;
    while i + l <= x.len() {
        // max(x, acc) keeps acc where x is NaN (see Simd::max), so the lanes never become NaN.
        acc = s.max(load(s, &x[i..]), acc);
        i += l;
    }
    // The lanes hold no NaN, so the vector reduction is their maximum.
    let m = s.reduce_max(acc);
    x[i..].iter().fold(m, |m, &v| if v > m { v } else { m })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{vectorize, Kernel};
    use half::slice::HalfBitsSliceExt;

    /// The one-row score pass with the query in registers ([`dec_qk_row_regs`], taken for
    /// 2-byte keys `4·LANES` and `8·LANES` long) gives the scores of the plain one-row tile,
    /// bit for bit, whole tiles and single keys alike, on every ISA this CPU runs.
    #[test]
    fn query_in_registers_scores_match_the_plain_tile() {
        struct Scores<'a, T> {
            q: &'a [f32],
            k: &'a [T],
            nv: usize,
            nb: usize,
        }
        impl<T: SimdElement> Kernel for Scores<'_, T> {
            type Output = (Vec<f32>, Vec<f32>);
            fn run<S: Simd>(self, s: S) -> (Vec<f32>, Vec<f32>) {
                let (dk, nb) = (self.nv * S::LANES, self.nb);
                let k = Strided { data: self.k, offset: 3, rs: dk + 5, cs: 1 };
                assert!(<Strided<'_, T> as KvMat>::QUERY_IN_REGISTERS);
                let mut got = vec![f32::NAN; nb];
                decode_qk_block(s, self.q, 1, dk, k, 0, nb, &mut got, nb, None, None);
                let mut want = vec![f32::NAN; nb];
                for j in 0..nb {
                    dec_qk_tile::<S, _, 1, 1>(s, dk, self.q, k, j, &mut want[j..], 1);
                }
                (got, want)
            }
        }
        fn check<T: SimdElement>(from: fn(f32) -> T) {
            let x = |i: usize| ((i.wrapping_mul(0x9E37_79B9) >> 7) % 2001) as f32 / 1000.0 - 1.0;
            let q: Vec<f32> = (0..128).map(|i| x(i + 7)).collect();
            let k: Vec<T> = (0..16 * 133 + 3).map(|i| from(x(i))).collect();
            for isa in Isa::supported() {
                for (nv, nb) in [(4, 16), (8, 16), (8, 7), (4, 1)] {
                    let (got, want) = vectorize(isa, Scores { q: &q, k: &k, nv, nb });
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{isa} nv {nv} nb {nb}");
                }
            }
        }
        check(bf16::from_f32);
        check(half::f16::from_f32);
    }

    /// [`key_pairs`] reads a word-aligned run of key rows in place and copies a misaligned one,
    /// with the same words either way: the pair `(k(j, 2w), k(j, 2w + 1))`, low half first.
    #[test]
    fn key_pairs_in_place_and_copied_agree() {
        let (nb, dk) = (3, 6);
        let words: Vec<u32> =
            (0..(nb * dk / 2 + 1) as u32).map(|i| i.wrapping_mul(0x9E37_79B9)).collect();
        let halves: &[u16] = bytemuck::cast_slice(&words);
        let data: &[bf16] = halves.reinterpret_cast();
        for offset in [0, 1] {
            let k = Strided { data, offset, rs: dk, cs: 1 };
            let mut out = vec![0.0f32; nb * dk / 2];
            let got = key_pairs(k, RowMap::Dense, 0, nb, dk, &mut out);
            let in_place = std::ptr::eq(got.data.as_ptr().cast::<u16>(), halves.as_ptr());
            assert_eq!(in_place, offset == 0 && cfg!(target_endian = "little"), "offset {offset}");
            for j in 0..nb {
                for w in 0..dk / 2 {
                    let e = |d: usize| data[offset + j * dk + d].to_bits();
                    let want = pair(e(2 * w), e(2 * w + 1)).to_bits();
                    let at = got.offset + j * got.rs + w;
                    assert_eq!(got.data[at].to_bits(), want, "offset {offset}, key {j}, pair {w}");
                }
            }
        }
    }
}
