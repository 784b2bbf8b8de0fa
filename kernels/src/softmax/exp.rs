//! The vectorised `exp`: one generic body over `SimdF32`, its per-ISA entry points for kernels
//! that fuse it into their own loops (`exp_ps_avx512`, `exp_ps_avx2`, `exp_f32x8`), and a
//! public slice function for testing and for callers who want a plain vector exp.
//!
//! # Algorithm (`f32-exp-rr2-p7`: two-step range reduction, degree-7 polynomial)
//!
//! 1. Clamp `x` to `[−104, 88.9]`, NaN passing through: below −104 the result rounds to 0
//!    (`e^−103.97 = 2^−150` is half the smallest subnormal), above 88.72 = ln(f32::MAX) it is
//!    `+∞`, and the clamp keeps the range reduction away from `±∞`. Lanes below −104 (the
//!    `−∞` of masked logits) are computed on 0 instead and set to `+0` at the end: run on the
//!    clamped value, the final scaling underflows, and each underflowing multiply takes a
//!    microcode assist on this CPU (a softmax row with a keep-mask ran 1.65× slower for it).
//! 2. `n = round(x·log₂e)` by adding `1.5·2^23` (ties to even; `n ∈ [−150, 128]`).
//! 3. Cody–Waite reduction in two steps: `r = (x − n·ln2_hi) − n·ln2_lo`, with `ln2_hi` short
//!    enough (15 significant bits) that `n·ln2_hi` and the first subtraction are exact even
//!    without an FMA; `|r| ≤ ln2/2 + ε`.
//! 4. `e^r ≈ 1 + r + r²·p(r)`, `p` of degree 5 (SLEEF's `expf` coefficients, a minimax fit),
//!    evaluated by Horner with FMA.
//! 5. Scale by `2^n` with one rounding: AVX-512 `vscalefps`; AVX2 and portable multiply by
//!    `2^⌊n/2⌋` (exact) then by `2^(n−⌊n/2⌋)` (the only rounding), both built from exponent
//!    bits and both normal, so subnormal results round correctly and overflow gives `+∞`.
//!
//! # Accuracy
//!
//! Maximum error **1 ULP** over every input whose result is a normal f32, i.e.
//! `x ∈ [−87.33, 88.72]`, checked against f64 `exp` by `tests/tests/exp.rs` (measured 0.86 ULP
//! on AVX2+FMA and 0.94 ULP for the portable build without FMA, which evaluates the last
//! polynomial step differently; AVX-512 runs the AVX2 arithmetic with one `vscalefps` rounding
//! in place of the second multiply, so the same bound). ULP means the spacing of f32 at the
//! exact result. Edges, exactly:
//! `exp(±0) = 1`; `exp(−∞) = 0`; `exp(+∞) = +∞`; `exp(NaN) = NaN`; `x > 88.7228` gives `+∞`;
//! `x < −103.98` gives `+0`; results in the subnormal range (`x ∈ [−103.97, −87.34]`) are within
//! 1 subnormal ULP (`2^−149`) of the exact value.
//!
//! # The softmax's exp
//!
//! The softmax exponentiates `z − max ≤ 0` by its own exp, within [`SOFTMAX_EXP_MAX_ULP`]
//! (1.5 ULP) instead of 1: `exp_neg_lut_n` when every argument is `≥` `LUT_MIN` (−87: no
//! subnormal result, no `−∞`), 8 FMA-pipe operations per vector against 13 (and a compare
//! and two selects for the lanes below −104) for the full-range `exp_neg_scaled_n` below it.
//! The softmax picks one per row from the row's range, except that rows holding `−∞` (masked
//! logits) run the table exp with those lanes zeroed and choose per group of vectors, as
//! [`softmax_exp_slice_with_isa`] does.

use super::row::EXP_UNROLL;
use super::vector::{SimdF32, TWO_POW_M64};
use crate::arch::Isa;
use crate::{Error, Result};

/// `1.5 · 2^23`: adding it to `|v| < 2^22` rounds `v` to an integer (ties to even) held in the
/// low mantissa bits of the sum.
pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0;
/// Below this, `exp` rounds to +0 (`ln 2^−150 = −103.972`).
const EXP_LO: f32 = -104.0;
/// Above this, `exp` is +∞ (`ln f32::MAX = 88.7228`); any value in between works.
const EXP_HI: f32 = 88.9;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split: `LN2_HI` has 15 significant bits so `n·LN2_HI` is exact for `|n| ≤ 512`.
const LN2_HI: f32 = 0.69314575; // bits 0x3F317200
const LN2_LO: f32 = 1.4286068e-6; // bits 0x35BFBE8E
/// SLEEF `expf` coefficients: `e^r ≈ 1 + r + r²·(C2 + C3 r + … + C7 r⁵)` on
/// `|r| ≤ ln2/2`.
const C2: f32 = 0.5;
const C3: f32 = 0.16666667; // bits 0x3E2AAAAB
const C4: f32 = 4.1666485e-2; // bits 0x3D2AAA7A
const C5: f32 = 8.333361e-3; // bits 0x3C0888A6
const C6: f32 = 1.3930436e-3; // bits 0x3AB696C9
const C7: f32 = 1.9852762e-4; // bits 0x39502BDA

/// The exp of each lane of `x`; see the module docs for the algorithm and its accuracy.
///
/// # Safety
/// The CPU must support `S::ISA` (the [`SimdF32`] contract).
#[inline(always)]
pub(crate) unsafe fn exp_v<S: SimdF32>(x: S::V) -> S::V {
    // SAFETY: forwarded contract.
    unsafe { exp_body::<S, false>(x) }
}

/// [`exp_v`] for `x ≤ 43` (the softmax's `z − max ≤ 0`): the same bits there, for three
/// fewer integer operations per vector; larger `x` are clamped to 43.6 (a wrong but finite
/// result), NaN stays NaN.
///
/// # Safety
/// The CPU must support `S::ISA` (the [`SimdF32`] contract).
#[inline(always)]
pub(crate) unsafe fn exp_low_v<S: SimdF32>(x: S::V) -> S::V {
    // SAFETY: forwarded contract.
    unsafe { exp_body::<S, true>(x) }
}

/// Upper clamp of [`exp_low_v`]: `n = round(43.6·log₂e) = 63`, the largest `n` that
/// `ldexp_low` accepts.
const EXP_LOW_HI: f32 = 43.6;

/// The algorithm of the module docs; `LOW` selects the `x ≤ 43` scaling.
///
/// # Safety
/// The CPU must support `S::ISA`.
#[inline(always)]
unsafe fn exp_body<S: SimdF32, const LOW: bool>(x: S::V) -> S::V {
    // SAFETY: forwarded contract; every operation below is a `SimdF32` method.
    unsafe {
        let hi = if LOW { EXP_LOW_HI } else { EXP_HI };
        // Lanes below EXP_LO give +0. They run on 0 and are zeroed at the end: on the clamped
        // argument the last multiply would underflow, and an underflowing multiply takes a
        // microcode assist on this CPU. Masked logits are −∞, so a softmax row with a
        // keep-mask ran at 0.89 G elem/s, 1.9 with the CPU flushing subnormals to zero.
        let lo = S::splat(EXP_LO);
        let dead = S::lt(x, lo);
        let x = S::select(dead, S::splat(0.0), S::clamp_keep_nan(x, lo, S::splat(hi)));
        let t = S::fmadd(x, S::splat(LOG2E), S::splat(ROUND_MAGIC));
        let n = S::sub(t, S::splat(ROUND_MAGIC));
        let r = S::fmadd(n, S::splat(-LN2_HI), x);
        let r = S::fmadd(n, S::splat(-LN2_LO), r);
        let mut p = S::splat(C7);
        p = S::fmadd(p, r, S::splat(C6));
        p = S::fmadd(p, r, S::splat(C5));
        p = S::fmadd(p, r, S::splat(C4));
        p = S::fmadd(p, r, S::splat(C3));
        p = S::fmadd(p, r, S::splat(C2));
        let e = if S::FUSED {
            // 1 + r·(1 + r·p) with one rounding per step: the error of the inner value is
            // scaled by |r| ≤ 0.35 and the last step rounds once (measured 0.86 ULP).
            p = S::fmadd(p, r, S::splat(1.0));
            S::fmadd(p, r, S::splat(1.0))
        } else {
            // Without FMA every multiply-add rounds twice; (r + r²·p) + 1 keeps the small
            // terms together and rounds the big sum once (measured 0.94 ULP against 1.15).
            let r2 = S::mul(r, r);
            S::add(S::fmadd(p, r2, r), S::splat(1.0))
        };
        let e = if LOW { S::ldexp_low(e, n, t) } else { S::ldexp(e, n, t) };
        S::select(dead, S::splat(0.0), e)
    }
}

/// `1.5·2^23 + 191`: rounds `x·log₂e` to an integer `n` like [`ROUND_MAGIC`], and leaves
/// `n + 191` (the biased exponent of `2^(n+64)`) in the low bits, ready to shift into place.
const NEG_MAGIC: f32 = 12_583_103.0;
/// Degree-6 coefficients of `(e^r − 1)/r ≈ K1 + K2 r + … + K6 r⁵` on `|r| ≤ ln2/2 + 10⁻⁴`,
/// a relative-error minimax fit (Lawson's iteration, 30 digits) rounded to f32: the rounded
/// polynomial is within `0.29·2⁻²⁴` relative of `e^r` (degree 5 would be `1.54·2⁻²⁴` before any
/// rounding, about 2 ULP once rounded: measured 1.97 with XNNPACK's `p5` coefficients).
const K1: f32 = 1.0;
const K2: f32 = f32::from_bits(0x3EFF_FFFE); // 0.49999994
const K3: f32 = f32::from_bits(0x3E2A_AA0D); // 0.16666432
const K4: f32 = f32::from_bits(0x3D2A_AC12); // 0.041668005
const K5: f32 = f32::from_bits(0x3C09_33DA); // 0.008374179
const K6: f32 = f32::from_bits(0x3AB5_7381); // 0.0013843627

/// Maximum error of the softmax's exp (`exp_neg_n`: `exp_neg_lut_n` on `[−87, 0]`,
/// `exp_neg_scaled_n` below; [`softmax_exp_slice_with_isa`]) in ULP of the exact result,
/// for `x ≤ 0` whose result is a normal f32, on every ISA; subnormal results are within this
/// many `2^−149`. Checked over every f32 in `[−87.34, 0]` by the ignored test
/// `tests/tests/exp.rs::exhaustive_softmax_exp` (AVX2+FMA: 1.148 ULP; the portable ISA runs
/// `exp_low_v`: 0.952 ULP), and every 11th of them plus the subnormal range in the default
/// test run. The AVX-512 build runs the same arithmetic (not yet run on such a CPU).
pub const SOFTMAX_EXP_MAX_ULP: f64 = 1.5;

/// The softmax's exp of `K` vectors, `x ≤ 0`, within [`SOFTMAX_EXP_MAX_ULP`]:
/// [`exp_neg_lut_n`] when no lane is below [`LUT_MIN`], else [`exp_neg_scaled_n`] for the
/// whole group (subnormal results, `−∞`). The softmax makes the same choice once per row, per
/// group for rows holding `−∞` (`row.rs`); this per-group form serves the slice function, so
/// that its tests sweep both paths. Arguments in `(0, 43.6]` are as accurate but not swept.
///
/// # Safety
/// The CPU must support `S::ISA` (the [`SimdF32`] contract).
#[inline(always)]
pub(crate) unsafe fn exp_neg_n<S: SimdF32, const K: usize>(x: [S::V; K]) -> [S::V; K] {
    // SAFETY: forwarded contract.
    unsafe {
        let mut lo = S::splat(0.0);
        for v in &x {
            lo = S::min_skip_nan(lo, *v);
        }
        if S::any_lt(lo, S::splat(LUT_MIN)) {
            exp_neg_scaled_n::<S, K>(x)
        } else {
            exp_neg_lut_n::<S, K>(x)
        }
    }
}

/// The softmax's exp on its usual range: `K` vectors, every lane NaN or `≥` [`LUT_MIN`]
/// (other lanes give unspecified values), written step by step across the `K` so that the
/// compiler emits `K` independent dependency chains (one is ~35 cycles of latency, more than
/// the out-of-order window overlaps on its own; see `row.rs`, `EXP_UNROLL`).
/// 8 FMA-pipe operations per vector (the full-range [`exp_neg_scaled_n`] takes 13):
/// 1. `t = x·8log₂e + ROUND_MAGIC` rounds `k = round(8x·log₂e)` into the low bits of `t`;
/// 2. `r = x − k·ln2/8` in two FMAs (Cody–Waite), `|r| ≤ ln2/16 + 10⁻⁵`;
/// 3. `s = 2^(k/8)`, exact: the table entry for `k mod 8` with `⌊k/8⌋` added to its exponent
///    bits ([`SimdF32::exp2_k8`]; normal because `k ≥ −1008`);
/// 4. `e^r − 1 ≈ r·(1 + r·(Q2 + Q3 r))` by Horner, then `e = s + s·(e^r − 1)` in one FMA, so
///    the result is rounded once at the end; the other errors are the table entry's rounding
///    (≤ 0.5 ULP), the polynomial's (≤ 0.44·2⁻²⁴ relative) and the small term's roundings.
///
/// ISAs without an FMA (the portable build) use [`exp_low_v`] instead.
///
/// # Safety
/// The CPU must support `S::ISA` (the [`SimdF32`] contract).
#[inline(always)]
pub(crate) unsafe fn exp_neg_lut_n<S: SimdF32, const K: usize>(x: [S::V; K]) -> [S::V; K] {
    // SAFETY: forwarded contract.
    unsafe { exp_neg_lut_folded_n::<S, K>(x, &LutConsts::new(1.0)) }
}

/// The constants of [`exp_neg_lut_n`] with a power-of-two `scale` folded in: for `x = d/scale`,
/// [`exp_neg_lut_folded_n`] returns `exp(d)`, the same bits as [`exp_neg_lut_n`] of `d`
/// (every constant is an exact multiple of its unscaled value, and every step's rounding
/// commutes with a power-of-two scaling while nothing leaves the normal range). The softmax
/// uses it on `x_j − max_j x_j` (its scale a power of two, as `1/√d_k` for `d_k = 16, 64,
/// 256`): `scale·(x_j − max)` is then the logit difference it would have formed, and the
/// multiply by the scale leaves the loop.
pub(crate) struct LutConsts<S: SimdF32> {
    /// `8·log₂e·scale`.
    log2e: S::V,
    /// `−ln2_hi/(8·scale)`, `−ln2_lo/(8·scale)`.
    ln2: (S::V, S::V),
    /// The polynomial `r'·(A + r'·(B + C·r'))` in `r' = r/scale`: `A = scale`,
    /// `B = Q2·scale²`, `C = Q3·scale³`.
    poly: (S::V, S::V, S::V),
}

/// The powers of two that [`LutConsts::folds`] accepts: every folded constant stays normal.
const FOLD_RANGE: std::ops::RangeInclusive<f32> = (1.0 / 65536.0)..=65536.0;

impl<S: SimdF32> LutConsts<S> {
    /// Whether `scale` can be folded: a power of two in `[2^−16, 2^16]`.
    pub(crate) fn folds(scale: f32) -> bool {
        FOLD_RANGE.contains(&scale) && scale.to_bits() & 0x007F_FFFF == 0
    }

    /// The constants for `scale` (`folds(scale)`; `1.0` for [`exp_neg_lut_n`]).
    ///
    /// # Safety
    /// The CPU must support `S::ISA`.
    #[inline(always)]
    pub(crate) unsafe fn new(scale: f32) -> Self {
        debug_assert!(Self::folds(scale));
        let (s2, s3) = (scale * scale, scale * scale * scale);
        // SAFETY: the caller's ISA contract.
        unsafe {
            LutConsts {
                log2e: S::splat(LUT_LOG2E * scale),
                ln2: (S::splat(-LUT_LN2_HI / scale), S::splat(-LUT_LN2_LO / scale)),
                poly: (S::splat(scale), S::splat(LUT_Q2 * s2), S::splat(LUT_Q3 * s3)),
            }
        }
    }
}

/// [`exp_neg_lut_n`] of `scale·x` for the `scale` folded into `c` ([`LutConsts`]).
///
/// # Safety
/// The CPU must support `S::ISA` (the [`SimdF32`] contract).
#[inline(always)]
pub(crate) unsafe fn exp_neg_lut_folded_n<S: SimdF32, const K: usize>(
    x: [S::V; K],
    c: &LutConsts<S>,
) -> [S::V; K] {
    // SAFETY: forwarded contract; every operation below is a `SimdF32` method.
    unsafe {
        if !S::FUSED {
            let mut e = [S::splat(0.0); K];
            for i in 0..K {
                e[i] = exp_low_v::<S>(S::mul(x[i], c.poly.0));
            }
            return e;
        }
        // k = round(8·x·log₂e), held in the low bits of t; x = k·ln2/8 + r, |r| ≤ ln2/16 + ε.
        // s = 2^(k/8) = 2^⌊k/8⌋ · 2^((k mod 8)/8), exact from the table and the exponent bits.
        // e^r − 1 ≈ r·(1 + r·(Q2 + Q3 r)), then e = s + s·(e^r − 1): one rounding at the end.
        // (All in r' = r/scale with the folded constants; loops, not `array::map`: its
        // closure does not inline into `#[target_feature]` code.)
        let table = S::load(LUT_EXP2.as_ptr());
        let (a, b, cc) = c.poly;
        let mut t = [S::splat(0.0); K];
        let mut r = [S::splat(0.0); K];
        let mut e = [S::splat(0.0); K];
        for i in 0..K {
            t[i] = S::fmadd(x[i], c.log2e, S::splat(ROUND_MAGIC));
        }
        for i in 0..K {
            let k = S::sub(t[i], S::splat(ROUND_MAGIC));
            r[i] = S::fmadd(k, c.ln2.0, x[i]);
            r[i] = S::fmadd(k, c.ln2.1, r[i]);
        }
        for i in 0..K {
            let p = S::fmadd(S::fmadd(cc, r[i], b), r[i], a);
            let tail = S::mul(p, r[i]);
            let s = S::exp2_k8(table, t[i]);
            e[i] = S::fmadd(s, tail, s);
        }
        e
    }
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
/// [`SimdF32::exp2_k8`]; checked against `f64::powf` by a unit test.
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
/// The table path ([`exp_neg_lut_n`]) needs every argument `≥ LUT_MIN`: `2^⌊k/8⌋` must stay
/// a normal f32 (`k ≥ −1008`, `x ≳ −87.38`); below, the full-range path runs, and `−∞` lanes
/// are run on 0 and zeroed (`row.rs`'s `MaskedTableExp`) or take the full-range path.
pub(crate) const LUT_MIN: f32 = -87.0;

/// The softmax's exp over its whole domain `x ≤ 0`, for rows (or groups) that hold an
/// argument below [`LUT_MIN`]: a degree-6 polynomial on `|r| ≤ ln2/2` and a scaling by
/// `2^(n+64)` then `2^−64`, the one rounding of a subnormal result; `−∞` gives 0. Portable
/// builds without an FMA run [`exp_low_v`].
///
/// # Safety
/// The CPU must support `S::ISA` (the [`SimdF32`] contract).
#[inline(always)]
pub(crate) unsafe fn exp_neg_scaled_n<S: SimdF32, const K: usize>(x: [S::V; K]) -> [S::V; K] {
    // SAFETY: forwarded contract; every operation below is a `SimdF32` method.
    unsafe {
        if !S::FUSED {
            return x.map(|v| exp_low_v::<S>(v));
        }
        // Lanes below EXP_LO (masked logits: −∞) give +0; they run on 0 and are zeroed at the
        // end, so that no multiply underflows (see `exp_body`).
        let lo = S::splat(EXP_LO);
        let mut dead = [S::first(0); K];
        let mut x = x;
        for k in 0..K {
            dead[k] = S::lt(x[k], lo);
            x[k] = S::select(dead[k], S::splat(0.0), S::max_keep_nan(x[k], lo));
        }
        let t = x.map(|v| S::fmadd(v, S::splat(LOG2E), S::splat(NEG_MAGIC)));
        let n = t.map(|v| S::sub(v, S::splat(NEG_MAGIC)));
        let mut r = [S::splat(0.0); K];
        for k in 0..K {
            r[k] = S::fmadd(n[k], S::splat(-LN2_HI), x[k]);
        }
        for k in 0..K {
            r[k] = S::fmadd(n[k], S::splat(-LN2_LO), r[k]);
        }
        // P = (K1 + K2 r) + r²·((K3 + K4 r) + r²·(K5 + K6 r)) by Estrin (three steps of latency
        // after r instead of Horner's five, for one more multiply), then q = 1 + r·P: the error
        // of P is scaled by |r| ≤ 0.35 and q is rounded once.
        let r2 = r.map(|v| S::mul(v, v));
        let mut a = [S::splat(0.0); K];
        let mut b = [S::splat(0.0); K];
        let mut c = [S::splat(0.0); K];
        for k in 0..K {
            a[k] = S::fmadd(S::splat(K2), r[k], S::splat(K1));
            b[k] = S::fmadd(S::splat(K4), r[k], S::splat(K3));
            c[k] = S::fmadd(S::splat(K6), r[k], S::splat(K5));
        }
        for k in 0..K {
            b[k] = S::fmadd(c[k], r2[k], b[k]);
        }
        for k in 0..K {
            a[k] = S::fmadd(b[k], r2[k], a[k]);
        }
        let mut p = [S::splat(0.0); K];
        for k in 0..K {
            p[k] = S::fmadd(a[k], r[k], S::splat(1.0));
        }
        for k in 0..K {
            p[k] = S::mul(S::mul(p[k], S::shl23(t[k])), S::splat(TWO_POW_M64));
            p[k] = S::select(dead[k], S::splat(0.0), p[k]);
        }
        p
    }
}

/// AVX-512F exp of 16 lanes (the module's algorithm; max error 1 ULP), for kernels that fuse it
/// into their own loops.
///
/// # Safety
/// The CPU must support AVX-512F; call it from a `#[target_feature(enable = "avx512f")]`
/// function so that it inlines.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp_ps_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    debug_assert!(Isa::Avx512.is_supported());
    // SAFETY: forwarded contract.
    unsafe { exp_v::<super::vector::Avx512>(x) }
}

/// AVX2+FMA exp of 8 lanes (the module's algorithm; max error 1 ULP), for kernels that fuse it
/// into their own loops.
///
/// # Safety
/// The CPU must support AVX2 and FMA; call it from a
/// `#[target_feature(enable = "avx2,fma")]` function so that it inlines.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp_ps_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    debug_assert!(Isa::Avx2.is_supported());
    // SAFETY: forwarded contract.
    unsafe { exp_v::<super::vector::Avx2>(x) }
}

/// The softmax's table exp ([`exp_neg_lut_n`], 1.5 ULP) of four AVX-512 vectors whose lanes
/// are NaN or in `[`[`LUT_MIN`]`, 0]`, for kernels that fuse it into their own loops (the
/// attention kernel's online softmax, on blocks whose range allows it).
///
/// # Safety
/// As [`exp_ps_avx512`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp_neg_lut4_avx512(
    x: [std::arch::x86_64::__m512; 4],
) -> [std::arch::x86_64::__m512; 4] {
    // SAFETY: forwarded contract.
    unsafe { exp_neg_lut_n::<super::vector::Avx512, 4>(x) }
}

/// [`exp_neg_lut4_avx512`] for four AVX2 vectors.
///
/// # Safety
/// As [`exp_ps_avx2`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp_neg_lut4_avx2(
    x: [std::arch::x86_64::__m256; 4],
) -> [std::arch::x86_64::__m256; 4] {
    // SAFETY: forwarded contract.
    unsafe { exp_neg_lut_n::<super::vector::Avx2, 4>(x) }
}

/// [`exp_neg_lut4_avx512`] for four `wide::f32x8` (without an FMA this is the 1-ULP
/// [`exp_low_v`]).
#[inline(always)]
pub(crate) fn exp_neg_lut4_f32x8(x: [wide::f32x8; 4]) -> [wide::f32x8; 4] {
    // SAFETY: the portable ISA is supported everywhere.
    unsafe { exp_neg_lut_n::<super::vector::Portable, 4>(x) }
}

/// Portable exp of 8 lanes of `wide::f32x8` (the module's algorithm; max error 1 ULP).
#[inline(always)]
pub(crate) fn exp_f32x8(x: wide::f32x8) -> wide::f32x8 {
    // SAFETY: the portable ISA is supported everywhere.
    unsafe { exp_v::<super::vector::Portable>(x) }
}

/// Maximum error of [`exp_slice`] in ULP of the exact result, for every ISA (see the module
/// docs for the definition and the subnormal range).
pub const EXP_MAX_ULP: f64 = 1.0;

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
    super::row::exp_map(isa, x, y);
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

/// `y[i] = exp(x[i])` by the softmax's exp (`exp_neg_n`), for `x[i] ≤ 0`: maximum error
/// [`SOFTMAX_EXP_MAX_ULP`] (1.5 ULP; subnormal results within 1.5·2^−149); `exp(−∞) = 0`, NaN gives
/// NaN, `x < −103.98` gives `+0`. Positive inputs are outside the stated domain (up to 43.6
/// they are as accurate, beyond that unspecified). Errors as [`exp_slice_with_isa`].
pub fn softmax_exp_slice_with_isa(isa: Isa, x: &[f32], y: &mut [f32]) -> Result<()> {
    check_exp_args(isa, x, y)?;
    super::row::exp_neg_map(isa, x, y);
    Ok(())
}

/// The generic body of [`exp_slice`] (`NEG = false`, [`exp_v`]) and of
/// [`softmax_exp_slice_with_isa`] (`NEG = true`, [`exp_neg_n`] on groups of
/// [`EXP_UNROLL`] vectors, as the softmax's pass B runs it): full groups, then one group
/// holding the rest, its padding lanes 0 and not stored.
///
/// # Safety
/// The CPU must support `S::ISA`; `x` and `y` must have the same length.
#[inline(always)]
pub(crate) unsafe fn exp_map_body<S: SimdF32, const NEG: bool>(x: &[f32], y: &mut [f32]) {
    const G: usize = EXP_UNROLL;
    debug_assert_eq!(x.len(), y.len());
    let (n, l) = (x.len().min(y.len()), S::LANES);
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    // SAFETY: every access is below `n`: whole vectors where `ju + LANES ≤ n`, one masked tail.
    unsafe {
        let mut j = 0;
        while j < n {
            let mut v = [S::splat(0.0); G];
            for (u, vu) in v.iter_mut().enumerate() {
                let ju = j + u * l;
                if ju + l <= n {
                    *vu = S::load(xp.add(ju));
                } else if ju < n {
                    *vu = S::load_tail(xp.add(ju), n - ju);
                }
            }
            // No closures here: they do not inherit `#[target_feature]` (see `row.rs`).
            if NEG {
                v = exp_neg_n::<S, G>(v);
            } else {
                for vu in &mut v {
                    *vu = exp_v::<S>(*vu);
                }
            }
            for (u, eu) in v.iter().enumerate() {
                let ju = j + u * l;
                if ju + l <= n {
                    S::store(yp.add(ju), *eu);
                } else if ju < n {
                    S::store_tail(yp.add(ju), n - ju, *eu);
                }
            }
            j += G * l;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::softmax::vector::Portable;

    /// `exp_low_v` is `exp_v` bit for bit on `x ≤ 43`, on every supported ISA.
    fn same_bits<S: SimdF32>() {
        let mut xs: Vec<f32> =
            (0..200_000).map(|i| -110.0 + i as f32 * (153.5 / 200_000.0)).collect();
        xs.extend([f32::NEG_INFINITY, f32::NAN, -0.0, 0.0, 43.0, -103.97, -87.34, 1e-45]);
        let l = S::LANES;
        xs.truncate(xs.len() / l * l);
        for c in xs.chunks(l) {
            // SAFETY: the caller checked the ISA; `c` has LANES elements, `a`/`b` 16.
            let (mut a, mut b) = ([0.0f32; 16], [0.0f32; 16]);
            unsafe {
                let v = S::load(c.as_ptr());
                S::store(a.as_mut_ptr(), exp_v::<S>(v));
                S::store(b.as_mut_ptr(), exp_low_v::<S>(v));
            }
            for k in 0..l {
                assert_eq!(a[k].to_bits(), b[k].to_bits(), "{:?} x = {}", S::ISA, c[k]);
            }
        }
    }

    /// The folded table exp of `d/scale` is the table exp of `d`, bit for bit, for power-of-two
    /// scales (what lets the softmax drop its multiply by the scale).
    fn folded_same_bits<S: SimdF32>() {
        let l = S::LANES;
        let ds: Vec<f32> = (0..100_000).map(|i| -87.0 * i as f32 / 100_000.0).collect();
        for e in -8..=8 {
            let scale = 2f32.powi(e);
            assert!(LutConsts::<S>::folds(scale));
            for c in ds.chunks_exact(l) {
                let (mut a, mut b) = ([0.0f32; 16], [0.0f32; 16]);
                let scaled: Vec<f32> = c.iter().map(|d| d / scale).collect();
                // SAFETY: the caller checked the ISA; `c` and `scaled` hold LANES elements.
                unsafe {
                    let consts = LutConsts::<S>::new(scale);
                    S::store(a.as_mut_ptr(), exp_neg_lut_n::<S, 1>([S::load(c.as_ptr())])[0]);
                    let v = [S::load(scaled.as_ptr())];
                    S::store(b.as_mut_ptr(), exp_neg_lut_folded_n::<S, 1>(v, &consts)[0]);
                }
                for k in 0..l {
                    assert_eq!(a[k].to_bits(), b[k].to_bits(), "scale {scale} d = {}", c[k]);
                }
            }
        }
        assert!(!LutConsts::<S>::folds(0.125 * 3.0) && !LutConsts::<S>::folds(2f32.powi(17)));
    }

    /// Runs the generic check `$f::<S>()` for every ISA `S` this CPU supports.
    macro_rules! on_every_isa {
        ($f:ident) => {{
            $f::<Portable>();
            #[cfg(target_arch = "x86_64")]
            {
                if Isa::Avx2.is_supported() {
                    $f::<crate::softmax::vector::Avx2>();
                }
                if Isa::Avx512.is_supported() {
                    $f::<crate::softmax::vector::Avx512>();
                }
            }
        }};
    }

    #[test]
    fn folded_table_exp_equals_unfolded() {
        on_every_isa!(folded_same_bits);
    }

    /// The table behind `exp_neg_lut_n`: entry `j` plus `j << 20` in its bits is `2^(j/8)`
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
    fn exp_low_equals_exp() {
        on_every_isa!(same_bits);
    }
}
