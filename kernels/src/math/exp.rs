//! The exp family: every vector `e^x` of the crate, generic over [`Simd`], named by algorithm
//! (range reduction `rr2` or table `lut8`, polynomial degree `pN`) and domain, with one table
//! of accuracy bounds; and the public slice functions that the tests sweep.
//!
//! | function                   | domain              | algorithm                            | bound (ULP) | measured            |
//! |----------------------------|---------------------|--------------------------------------|-------------|---------------------|
//! | [`exp_rr2_p7`]             | all f32             | 2-step Cody–Waite, degree 7, `ldexp` | [`EXP_MAX_ULP`] = 1   | 0.86 (FMA), 0.94 (no FMA) |
//! | [`exp_rr2_p7_le43`]        | `x ≤ 43`            | as `exp_rr2_p7`, cheaper `ldexp`      | 1 (same bits)         | as `exp_rr2_p7`     |
//! | [`exp_neg_lut8_p3`]        | `[LUT8_MIN, 0]`, NaN | `2^(k/8)` table, degree 3           | [`SOFTMAX_EXP_MAX_ULP`] = 1.5 | 1.148 (AVX2+FMA) |
//! | [`exp_neg_rr2_p6`]         | `x ≤ 0`             | 2-step Cody–Waite, degree 6, Estrin  | 1.5                   | in the row below    |
//! | [`exp_neg_lut8_or_rr2_p6`] | `x ≤ 0`             | `lut8_p3` per group when it can, else `rr2_p6` | 1.5         | 1.148 (AVX2+FMA)    |
//!
//! ULP means the spacing of f32 at the exact result, for results in the normal range;
//! subnormal results are within the same number of `2^−149`. Without an FMA (the portable
//! build on a baseline target) the `exp_neg_*` functions run [`exp_rr2_p7_le43`] (0.952 ULP on
//! `[−87.34, 0]`). The bounds are checked against f64 `exp` by `tests/tests/suite/exp.rs` (every f32
//! by its ignored exhaustive sweeps); measured figures: `docs/perf-journal.md`.
//!
//! # `exp_rr2_p7` (two-step range reduction, degree-7 polynomial)
//!
//! 1. Clamp `x` to `[−104, 88.9]`, NaN passing through: below −104 the result rounds to 0
//!    (`e^−103.97 = 2^−150` is half the smallest subnormal), above 88.72 = ln(f32::MAX) it is
//!    `+∞`, and the clamp keeps the range reduction away from `±∞`. Lanes below −104 (the
//!    `−∞` of masked logits) are computed on 0 instead and set to `+0` at the end: on the
//!    clamped value the final scaling would underflow, and an underflowing multiply takes a
//!    microcode assist on x86.
//! 2. `n = round(x·log₂e)` by adding `1.5·2^23` (ties to even; `n ∈ [−150, 128]`).
//! 3. Cody–Waite reduction in two steps: `r = (x − n·ln2_hi) − n·ln2_lo`, with `ln2_hi` short
//!    enough (15 significant bits) that `n·ln2_hi` and the first subtraction are exact even
//!    without an FMA; `|r| ≤ ln2/2 + ε`.
//! 4. `e^r ≈ 1 + r + r²·p(r)`, `p` of degree 5 (SLEEF's `expf` coefficients, a minimax fit),
//!    evaluated by Horner with FMA.
//! 5. Scale by `2^n` with one rounding ([`Simd::ldexp`]), so subnormal results round
//!    correctly and overflow gives `+∞`.
//!
//! Edges, exactly: `exp(±0) = 1`; `exp(−∞) = 0`; `exp(+∞) = +∞`; `exp(NaN) = NaN`;
//! `x > 88.7228` gives `+∞`; `x < −103.98` gives `+0`.
//!
//! # The softmax's exp (`exp_neg_*`)
//!
//! The softmax exponentiates `z − max ≤ 0`, within [`SOFTMAX_EXP_MAX_ULP`] instead of 1 ULP
//! for fewer operations: [`exp_neg_lut8_p3`] when every argument is `≥` [`LUT8_MIN`] (no
//! subnormal result, no `−∞`), 8 FMA-pipe operations per vector, against 13 (and a compare
//! and two selects for the lanes below −104) for the full-range [`exp_neg_rr2_p6`] below it.
//! The softmax picks one per row from the row's range; rows holding `−∞` (masked logits) run
//! the table exp with those lanes zeroed and choose per group of vectors, as
//! [`exp_neg_lut8_or_rr2_p6`] does.

use crate::arch::{load, load_tail, store, store_tail, vectorize, Isa, Kernel, Simd};
use crate::arch::{ROUND_MAGIC, TWO_POW_M64};
use crate::{Error, Result};

/// Maximum error of [`exp_rr2_p7`] (and [`exp_slice`]) in ULP of the exact result, for every
/// ISA (see the module docs for the definition and the subnormal range).
pub const EXP_MAX_ULP: f64 = 1.0;

/// Maximum error of the softmax's exp ([`exp_neg_lut8_p3`], [`exp_neg_rr2_p6`],
/// [`softmax_exp_slice_with_isa`]) in ULP of the exact result, for `x ≤ 0` whose result is a
/// normal f32, on every ISA; subnormal results are within this many `2^−149`.
pub const SOFTMAX_EXP_MAX_ULP: f64 = 1.5;

/// Vectors exponentiated together by the softmax's pass B and by the slice functions. One exp
/// is a dependency chain of ~35–45 cycles of FMA latency and the out-of-order window holds
/// about two, so a one-vector loop runs at the chain's latency; four chains written
/// interleaved run at the throughput. Eight would spill: 16 ymm registers hold four chains and
/// the constants.
pub(crate) const EXP_UNROLL: usize = 4;

/// Below this, `exp` rounds to +0 (`ln 2^−150 = −103.972`).
const EXP_LO: f32 = -104.0;
/// Above this, `exp` is +∞ (`ln f32::MAX = 88.7228`); any value in between works.
const EXP_HI: f32 = 88.9;
/// Upper clamp of [`exp_rr2_p7_le43`]: `n = round(43.6·log₂e) = 63`, the largest `n` that
/// [`Simd::ldexp_low`] accepts.
const EXP_LE43_HI: f32 = 43.6;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split: `LN2_HI` has 15 significant bits so `n·LN2_HI` is exact for `|n| ≤ 512`.
const LN2_HI: f32 = 0.69314575; // bits 0x3F317200
const LN2_LO: f32 = 1.4286068e-6; // bits 0x35BFBE8E
/// SLEEF `expf` coefficients: `e^r ≈ 1 + r + r²·(C2 + C3 r + … + C7 r⁵)` on `|r| ≤ ln2/2`.
const C2: f32 = 0.5;
const C3: f32 = 0.16666667; // bits 0x3E2AAAAB
const C4: f32 = 4.1666485e-2; // bits 0x3D2AAA7A
const C5: f32 = 8.333361e-3; // bits 0x3C0888A6
const C6: f32 = 1.3930436e-3; // bits 0x3AB696C9
const C7: f32 = 1.9852762e-4; // bits 0x39502BDA

/// `e^x` of each lane, full range, within [`EXP_MAX_ULP`] (module docs).
#[inline(always)]
pub(crate) fn exp_rr2_p7<S: Simd>(s: S, x: S::V) -> S::V {
    exp_rr2_p7_body::<S, false>(s, x)
}

/// [`exp_rr2_p7`] for `x ≤ 43` (the softmax's `z − max ≤ 0`): the same bits there, for three
/// fewer integer operations per vector; larger `x` are clamped to 43.6 (a wrong but finite
/// result), NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_rr2_p7_le43<S: Simd>(s: S, x: S::V) -> S::V {
    exp_rr2_p7_body::<S, true>(s, x)
}

/// Scalar [`exp_rr2_p7`] through the vector code (lane 0), for the few per-row corrections that
/// must match the vector results bit for bit.
#[inline(always)]
pub(crate) fn exp_rr2_p7_scalar<S: Simd>(s: S, x: f32) -> f32 {
    let mut buf = [0.0f32; 16];
    store(s, &mut buf, exp_rr2_p7(s, s.splat(x)));
    buf[0]
}

/// The algorithm of the module docs; `LE43` selects the `x ≤ 43` scaling.
#[inline(always)]
fn exp_rr2_p7_body<S: Simd, const LE43: bool>(s: S, x: S::V) -> S::V {
    let hi = if LE43 { EXP_LE43_HI } else { EXP_HI };
    // Lanes below EXP_LO give +0; they run on 0 and are zeroed at the end, so that no multiply
    // underflows (module docs).
    let lo = s.splat(EXP_LO);
    let dead = s.lt(x, lo);
    let x = s.select(dead, s.splat(0.0), s.clamp_keep_nan(x, lo, s.splat(hi)));
    let t = s.fma(x, s.splat(LOG2E), s.splat(ROUND_MAGIC));
    let n = s.sub(t, s.splat(ROUND_MAGIC));
    let r = s.fma(n, s.splat(-LN2_HI), x);
    let r = s.fma(n, s.splat(-LN2_LO), r);
    let mut p = s.splat(C7);
    p = s.fma(p, r, s.splat(C6));
    p = s.fma(p, r, s.splat(C5));
    p = s.fma(p, r, s.splat(C4));
    p = s.fma(p, r, s.splat(C3));
    p = s.fma(p, r, s.splat(C2));
    let e = if S::FUSED {
        // 1 + r·(1 + r·p) with one rounding per step: the error of the inner value is scaled
        // by |r| ≤ 0.35 and the last step rounds once.
        p = s.fma(p, r, s.splat(1.0));
        s.fma(p, r, s.splat(1.0))
    } else {
        // Without FMA every multiply-add rounds twice; (r + r²·p) + 1 keeps the small terms
        // together and rounds the big sum once.
        let r2 = s.mul(r, r);
        s.add(s.fma(p, r2, r), s.splat(1.0))
    };
    let e = if LE43 { s.ldexp_low(e, n, t) } else { s.ldexp(e, n, t) };
    s.select(dead, s.splat(0.0), e)
}

/// `1.5·2^23 + 191`: rounds `x·log₂e` to an integer `n` like [`ROUND_MAGIC`], and leaves
/// `n + 191` (the biased exponent of `2^(n+64)`) in the low bits, ready to shift into place.
const NEG_MAGIC: f32 = 12_583_103.0;
/// Degree-6 coefficients of `(e^r − 1)/r ≈ K1 + K2 r + … + K6 r⁵` on `|r| ≤ ln2/2 + 10⁻⁴`,
/// a relative-error minimax fit (Lawson's iteration, 30 digits) rounded to f32: the rounded
/// polynomial is within `0.29·2⁻²⁴` relative of `e^r` (degree 5 would be `1.54·2⁻²⁴` before any
/// rounding, about 2 ULP once rounded).
const K1: f32 = 1.0;
const K2: f32 = f32::from_bits(0x3EFF_FFFE); // 0.49999994
const K3: f32 = f32::from_bits(0x3E2A_AA0D); // 0.16666432
const K4: f32 = f32::from_bits(0x3D2A_AC12); // 0.041668005
const K5: f32 = f32::from_bits(0x3C09_33DA); // 0.008374179
const K6: f32 = f32::from_bits(0x3AB5_7381); // 0.0013843627

/// The softmax's exp of `K` vectors, `x ≤ 0`, within [`SOFTMAX_EXP_MAX_ULP`]:
/// [`exp_neg_lut8_p3`] when no lane is below [`LUT8_MIN`], else [`exp_neg_rr2_p6`] for the
/// whole group (subnormal results, `−∞`). The softmax makes the same choice once per row, per
/// group for rows holding `−∞`; this per-group form serves the slice function, so that its
/// tests sweep both paths. Arguments in `(0, 43.6]` are as accurate but not swept.
#[inline(always)]
pub(crate) fn exp_neg_lut8_or_rr2_p6<S: Simd, const K: usize>(s: S, x: [S::V; K]) -> [S::V; K] {
    let mut lo = s.splat(0.0);
    for v in &x {
        lo = s.min_skip_nan(lo, *v);
    }
    if s.any_lt(lo, s.splat(LUT8_MIN)) {
        exp_neg_rr2_p6::<S, K>(s, x)
    } else {
        exp_neg_lut8_p3::<S, K>(s, x)
    }
}

/// The softmax's exp on its usual range: `K` vectors, every lane NaN or `≥` [`LUT8_MIN`]
/// (other lanes give unspecified values, never undefined behaviour), written step by step
/// across the `K` so that the compiler emits `K` independent dependency chains
/// ([`EXP_UNROLL`]). 8 FMA-pipe operations per vector (the full-range [`exp_neg_rr2_p6`]
/// takes 13):
/// 1. `t = x·8log₂e + ROUND_MAGIC` rounds `k = round(8x·log₂e)` into the low bits of `t`;
/// 2. `r = x − k·ln2/8` in two FMAs (Cody–Waite), `|r| ≤ ln2/16 + 10⁻⁵`;
/// 3. `s = 2^(k/8)`, exact: the table entry for `k mod 8` with `⌊k/8⌋` added to its exponent
///    bits ([`Simd::exp2_k8`]; normal because `k ≥ −1008`);
/// 4. `e^r − 1 ≈ r·(1 + r·(Q2 + Q3 r))` by Horner, then `e = s + s·(e^r − 1)` in one FMA, so
///    the result is rounded once at the end; the other errors are the table entry's rounding
///    (≤ 0.5 ULP), the polynomial's (≤ 0.44·2⁻²⁴ relative) and the small term's roundings.
///
/// ISAs without an FMA (the portable build) use [`exp_rr2_p7_le43`] instead.
#[inline(always)]
pub(crate) fn exp_neg_lut8_p3<S: Simd, const K: usize>(s: S, x: [S::V; K]) -> [S::V; K] {
    exp_neg_lut8_p3_folded::<S, K>(s, x, &Lut8Consts::new(s, 1.0))
}

/// The constants of [`exp_neg_lut8_p3`] with a power-of-two `scale` folded in: for
/// `x = d/scale`, [`exp_neg_lut8_p3_folded`] returns `exp(d)`, the same bits as
/// [`exp_neg_lut8_p3`] of `d` (every constant is an exact multiple of its unscaled value, and
/// every step's rounding commutes with a power-of-two scaling while nothing leaves the normal
/// range). The softmax uses it on `x_j − max_j x_j` (its scale a power of two, as `1/√d_k` for
/// `d_k = 16, 64, 256`): `scale·(x_j − max)` is then the logit difference it would have
/// formed, and the multiply by the scale leaves the loop.
pub(crate) struct Lut8Consts<S: Simd> {
    /// `8·log₂e·scale`.
    log2e: S::V,
    /// `−ln2_hi/(8·scale)`, `−ln2_lo/(8·scale)`.
    ln2: (S::V, S::V),
    /// The polynomial `r'·(A + r'·(B + C·r'))` in `r' = r/scale`: `A = scale`,
    /// `B = Q2·scale²`, `C = Q3·scale³`.
    poly: (S::V, S::V, S::V),
}

/// The powers of two that [`Lut8Consts::folds`] accepts: every folded constant stays normal.
const FOLD_RANGE: std::ops::RangeInclusive<f32> = (1.0 / 65536.0)..=65536.0;

impl<S: Simd> Lut8Consts<S> {
    /// Whether `scale` can be folded: a power of two in `[2^−16, 2^16]`.
    pub(crate) fn folds(scale: f32) -> bool {
        FOLD_RANGE.contains(&scale) && scale.to_bits() & 0x007F_FFFF == 0
    }

    /// The constants for `scale` (`folds(scale)`; `1.0` for [`exp_neg_lut8_p3`]).
    #[inline(always)]
    pub(crate) fn new(s: S, scale: f32) -> Self {
        debug_assert!(Self::folds(scale));
        let (s2, s3) = (scale * scale, scale * scale * scale);
        Lut8Consts {
            log2e: s.splat(LUT_LOG2E * scale),
            ln2: (s.splat(-LUT_LN2_HI / scale), s.splat(-LUT_LN2_LO / scale)),
            poly: (s.splat(scale), s.splat(LUT_Q2 * s2), s.splat(LUT_Q3 * s3)),
        }
    }
}

/// [`exp_neg_lut8_p3`] of `scale·x` for the `scale` folded into `c` ([`Lut8Consts`]).
#[inline(always)]
pub(crate) fn exp_neg_lut8_p3_folded<S: Simd, const K: usize>(
    s: S,
    x: [S::V; K],
    c: &Lut8Consts<S>,
) -> [S::V; K] {
    if !S::FUSED {
        let mut e = [s.splat(0.0); K];
        for i in 0..K {
            e[i] = exp_rr2_p7_le43::<S>(s, s.mul(x[i], c.poly.0));
        }
        return e;
    }
    // k = round(8·x·log₂e), held in the low bits of t; x = k·ln2/8 + r, |r| ≤ ln2/16 + ε.
    // s = 2^(k/8) = 2^⌊k/8⌋ · 2^((k mod 8)/8), exact from the table and the exponent bits.
    // e^r − 1 ≈ r·(1 + r·(Q2 + Q3 r)), then e = s + s·(e^r − 1): one rounding at the end.
    // (All in r' = r/scale with the folded constants; loops, not `array::map`: its closure
    // does not inline into `#[target_feature]` code.)
    let table = load(s, &LUT_EXP2);
    let (a, b, cc) = c.poly;
    let mut t = [s.splat(0.0); K];
    let mut r = [s.splat(0.0); K];
    let mut e = [s.splat(0.0); K];
    for i in 0..K {
        t[i] = s.fma(x[i], c.log2e, s.splat(ROUND_MAGIC));
    }
    for i in 0..K {
        let k = s.sub(t[i], s.splat(ROUND_MAGIC));
        r[i] = s.fma(k, c.ln2.0, x[i]);
        r[i] = s.fma(k, c.ln2.1, r[i]);
    }
    for i in 0..K {
        let p = s.fma(s.fma(cc, r[i], b), r[i], a);
        let tail = s.mul(p, r[i]);
        let s2k = s.exp2_k8(table, t[i]);
        e[i] = s.fma(s2k, tail, s2k);
    }
    e
}

/// `8·log₂e`: `round(x·LUT_LOG2E) = k` indexes eighths of an octave.
const LUT_LOG2E: f32 = 8.0 * LOG2E;
/// `ln2/8` split as [`LN2_HI`] / [`LN2_LO`] (exact scalings by 1/8).
const LUT_LN2_HI: f32 = LN2_HI / 8.0;
const LUT_LN2_LO: f32 = LN2_LO / 8.0;
/// `e^r ≈ 1 + r + r²·(Q2 + Q3 r)` on `|r| ≤ ln2/16 + 10⁻⁵`: a relative-error minimax fit
/// (Lawson's iteration in f64) rounded to f32, within `0.44·2⁻²⁴` of `e^r` after rounding.
const LUT_Q2: f32 = f32::from_bits(0x3F00_043D); // 0.5000647
const LUT_Q3: f32 = f32::from_bits(0x3E2A_AB2B); // 0.16666858
/// `bits(2^(j/8)) − (j << 20)` for `j < 8` (f32 `2^(j/8)` rounded to nearest), twice, for
/// [`Simd::exp2_k8`]; checked against `f64::powf` by a unit test.
static LUT_EXP2: [f32; 16] = {
    const B: [u32; 8] = [
        0x3F80_0000,
        0x3F7B_95C2,
        0x3F78_37F0,
        0x3F75_FED7,
        0x3F75_04F3,
        0x3F75_672A,
        0x3F77_44FD,
        0x3F7A_C0C7,
    ];
    let mut t = [0.0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = f32::from_bits(B[i % 8]);
        i += 1;
    }
    t
};
/// The table path ([`exp_neg_lut8_p3`]) needs every argument `≥ LUT8_MIN`: `2^⌊k/8⌋` must stay
/// a normal f32 (`k ≥ −1008`, `x ≳ −87.38`); below, the full-range path runs, and `−∞` lanes
/// are run on 0 and zeroed, or take the full-range path.
pub(crate) const LUT8_MIN: f32 = -87.0;

/// The softmax's exp over its whole domain `x ≤ 0`, for rows (or groups) that hold an
/// argument below [`LUT8_MIN`]: a degree-6 polynomial on `|r| ≤ ln2/2` and a scaling by
/// `2^(n+64)` then `2^−64`, the one rounding of a subnormal result; `−∞` gives 0. Portable
/// builds without an FMA run [`exp_rr2_p7_le43`].
#[inline(always)]
pub(crate) fn exp_neg_rr2_p6<S: Simd, const K: usize>(s: S, x: [S::V; K]) -> [S::V; K] {
    if !S::FUSED {
        let mut e = [s.splat(0.0); K];
        for k in 0..K {
            e[k] = exp_rr2_p7_le43::<S>(s, x[k]);
        }
        return e;
    }
    // Lanes below EXP_LO (masked logits: −∞) give +0; they run on 0 and are zeroed at the end,
    // so that no multiply underflows (see `exp_rr2_p7_body`).
    let lo = s.splat(EXP_LO);
    let mut dead = [s.first(0); K];
    let mut x = x;
    for k in 0..K {
        dead[k] = s.lt(x[k], lo);
        x[k] = s.select(dead[k], s.splat(0.0), s.max_keep_nan(x[k], lo));
    }
    let mut t = [s.splat(0.0); K];
    let mut n = [s.splat(0.0); K];
    for k in 0..K {
        t[k] = s.fma(x[k], s.splat(LOG2E), s.splat(NEG_MAGIC));
        n[k] = s.sub(t[k], s.splat(NEG_MAGIC));
    }
    let mut r = [s.splat(0.0); K];
    for k in 0..K {
        r[k] = s.fma(n[k], s.splat(-LN2_HI), x[k]);
    }
    for k in 0..K {
        r[k] = s.fma(n[k], s.splat(-LN2_LO), r[k]);
    }
    // P = (K1 + K2 r) + r²·((K3 + K4 r) + r²·(K5 + K6 r)) by Estrin (three steps of latency
    // after r instead of Horner's five, for one more multiply), then q = 1 + r·P: the error
    // of P is scaled by |r| ≤ 0.35 and q is rounded once.
    let mut r2 = [s.splat(0.0); K];
    for k in 0..K {
        r2[k] = s.mul(r[k], r[k]);
    }
    let mut a = [s.splat(0.0); K];
    let mut b = [s.splat(0.0); K];
    let mut c = [s.splat(0.0); K];
    for k in 0..K {
        a[k] = s.fma(s.splat(K2), r[k], s.splat(K1));
        b[k] = s.fma(s.splat(K4), r[k], s.splat(K3));
        c[k] = s.fma(s.splat(K6), r[k], s.splat(K5));
    }
    for k in 0..K {
        b[k] = s.fma(c[k], r2[k], b[k]);
    }
    for k in 0..K {
        a[k] = s.fma(b[k], r2[k], a[k]);
    }
    let mut p = [s.splat(0.0); K];
    for k in 0..K {
        p[k] = s.fma(a[k], r[k], s.splat(1.0));
    }
    for k in 0..K {
        p[k] = s.mul(s.mul(p[k], s.shl23(t[k])), s.splat(TWO_POW_M64));
        p[k] = s.select(dead[k], s.splat(0.0), p[k]);
    }
    p
}

/// `y[i] = exp(x[i])` with the ISA [`arch::selected`](crate::arch::selected) returns.
///
/// Maximum error [`EXP_MAX_ULP`] = **1 ULP** for results in the normal range; `exp(−∞) = 0`,
/// `exp(+∞) = +∞`, NaN gives NaN, `x > 88.7228` gives `+∞`, `x < −103.98` gives `+0`, subnormal
/// results within `2^−149`. Lengths must match (`ShapeMismatch` on `"y"` otherwise).
pub fn exp_slice(x: &[f32], y: &mut [f32]) -> Result<()> {
    exp_slice_with_isa(crate::arch::selected(), x, y)
}

/// [`exp_slice`] on an explicit ISA. Errors: `InvalidParameter { arg: "isa" }` when the CPU
/// lacks it, `ShapeMismatch` when `y.len() != x.len()`. Maximum error 1 ULP, as documented
/// there.
pub fn exp_slice_with_isa(isa: Isa, x: &[f32], y: &mut [f32]) -> Result<()> {
    check_exp_args(isa, x, y)?;
    vectorize(isa, ExpMap::<false> { x, y });
    Ok(())
}

/// `y[i] = exp(x[i])` by the softmax's exp ([`exp_neg_lut8_or_rr2_p6`]), for `x[i] ≤ 0`:
/// maximum error [`SOFTMAX_EXP_MAX_ULP`] (1.5 ULP; subnormal results within 1.5·2^−149);
/// `exp(−∞) = 0`, NaN gives NaN, `x < −103.98` gives `+0`. Positive inputs are outside the
/// stated domain (up to 43.6 they are as accurate, beyond that unspecified). Errors as
/// [`exp_slice_with_isa`].
pub fn softmax_exp_slice_with_isa(isa: Isa, x: &[f32], y: &mut [f32]) -> Result<()> {
    check_exp_args(isa, x, y)?;
    vectorize(isa, ExpMap::<true> { x, y });
    Ok(())
}

/// The checks shared by the exp slice entry points: a supported ISA, `y.len() == x.len()`.
fn check_exp_args(isa: Isa, x: &[f32], y: &[f32]) -> Result<()> {
    isa.require()?;
    if x.len() != y.len() {
        return Err(Error::ShapeMismatch {
            arg: "y",
            dim: "len",
            expected: x.len(),
            actual: y.len(),
        });
    }
    Ok(())
}

/// The body of [`exp_slice`] (`NEG = false`, [`exp_rr2_p7`]) and of
/// [`softmax_exp_slice_with_isa`] (`NEG = true`, [`exp_neg_lut8_or_rr2_p6`] on groups of
/// [`EXP_UNROLL`] vectors, as the softmax's pass B runs it): full groups, then one group
/// holding the rest, its padding lanes 0 and not stored.
struct ExpMap<'a, const NEG: bool> {
    x: &'a [f32],
    y: &'a mut [f32],
}

impl<const NEG: bool> Kernel for ExpMap<'_, NEG> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        const G: usize = EXP_UNROLL;
        let n = self.x.len().min(self.y.len());
        let (x, y, l) = (&self.x[..n], &mut self.y[..n], S::LANES);
        let mut j = 0;
        while j < n {
            let mut v = [s.splat(0.0); G];
            for (u, vu) in v.iter_mut().enumerate() {
                let ju = j + u * l;
                if ju + l <= n {
                    *vu = load(s, &x[ju..]);
                } else if ju < n {
                    *vu = load_tail(s, &x[ju..]);
                }
            }
            if NEG {
                v = exp_neg_lut8_or_rr2_p6::<S, G>(s, v);
            } else {
                for vu in &mut v {
                    *vu = exp_rr2_p7::<S>(s, *vu);
                }
            }
            for (u, eu) in v.iter().enumerate() {
                let ju = j + u * l;
                if ju + l <= n {
                    store(s, &mut y[ju..], *eu);
                } else if ju < n {
                    store_tail(s, &mut y[ju..], *eu);
                }
            }
            j += G * l;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Portable;

    /// `exp_rr2_p7_le43` is `exp_rr2_p7` bit for bit on `x ≤ 43`.
    fn same_bits<S: Simd>(s: S) {
        let mut xs: Vec<f32> =
            (0..200_000).map(|i| -110.0 + i as f32 * (153.5 / 200_000.0)).collect();
        xs.extend([f32::NEG_INFINITY, f32::NAN, -0.0, 0.0, 43.0, -103.97, -87.34, 1e-45]);
        let l = S::LANES;
        xs.truncate(xs.len() / l * l);
        for c in xs.chunks(l) {
            let (mut a, mut b) = ([0.0f32; 16], [0.0f32; 16]);
            let v = load(s, c);
            store(s, &mut a, exp_rr2_p7(s, v));
            store(s, &mut b, exp_rr2_p7_le43(s, v));
            for k in 0..l {
                assert_eq!(a[k].to_bits(), b[k].to_bits(), "{:?} x = {}", S::ISA, c[k]);
            }
        }
    }

    /// The folded table exp of `d/scale` is the table exp of `d`, bit for bit, for power-of-two
    /// scales (what lets the softmax drop its multiply by the scale).
    fn folded_same_bits<S: Simd>(s: S) {
        let l = S::LANES;
        let ds: Vec<f32> = (0..100_000).map(|i| -87.0 * i as f32 / 100_000.0).collect();
        for e in -8..=8 {
            let scale = 2f32.powi(e);
            assert!(Lut8Consts::<S>::folds(scale));
            for c in ds.chunks_exact(l) {
                let (mut a, mut b) = ([0.0f32; 16], [0.0f32; 16]);
                let scaled: Vec<f32> = c.iter().map(|d| d / scale).collect();
                let consts = Lut8Consts::<S>::new(s, scale);
                store(s, &mut a, exp_neg_lut8_p3::<S, 1>(s, [load(s, c)])[0]);
                let v = [load(s, &scaled)];
                store(s, &mut b, exp_neg_lut8_p3_folded::<S, 1>(s, v, &consts)[0]);
                for k in 0..l {
                    assert_eq!(a[k].to_bits(), b[k].to_bits(), "scale {scale} d = {}", c[k]);
                }
            }
        }
        assert!(!Lut8Consts::<S>::folds(0.125 * 3.0) && !Lut8Consts::<S>::folds(2f32.powi(17)));
    }

    /// Runs the generic check `$f(token)` for every ISA this CPU supports.
    macro_rules! on_every_isa {
        ($f:ident) => {{
            $f(Portable);
            #[cfg(target_arch = "x86_64")]
            {
                use crate::arch::{Avx2, Avx512};
                if let Some(s) = Avx2::try_new() {
                    $f(s);
                }
                if let Some(s) = Avx512::try_new() {
                    $f(s);
                }
            }
        }};
    }

    #[test]
    fn folded_table_exp_equals_unfolded() {
        on_every_isa!(folded_same_bits);
    }

    /// The table behind `exp_neg_lut8_p3`: entry `j` plus `j << 20` in its bits is `2^(j/8)`
    /// rounded to f32 (and the second half repeats the first).
    #[test]
    fn lut_table_holds_eighth_powers_of_two() {
        for (j, v) in LUT_EXP2.iter().enumerate() {
            let j8 = (j % 8) as u32;
            let want = 2f64.powf(f64::from(j8) / 8.0) as f32;
            assert_eq!(v.to_bits() + (j8 << 20), want.to_bits(), "entry {j}");
        }
    }

    #[test]
    fn exp_le43_equals_exp() {
        on_every_isa!(same_bits);
    }
}
