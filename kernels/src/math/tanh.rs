//! Hyperbolic tangent, vectorised, in two accuracies:
//!
//! - [`tanh_simd`] per vector (for kernels that need it inside their own loops, e.g. a logit
//!   softcap `c·tanh(s/c)`) and the slice functions [`tanh`] and [`tanh_with_isa`]: within
//!   [`TANH_MAX_ULP`] (1.5), by the algorithm below;
//! - [`tanh_rational_simd`] and the slice functions [`tanh_rational`] and [`tanh_rational_with_isa`]: a rational
//!   approximation, about 2.2× the throughput on AVX-512 and 3.9× on AVX2 (one branch, no exp),
//!   within [`TANH_RATIONAL_MAX_ULP`] (8.5). Additive attention uses it: each of its scores
//!   sums `da` (64 and more) weighted tanh values, whose rounding (`γ(da + 1)·u` relative)
//!   outweighs a few ULP per term.
//!
//! # Algorithm (per lane, both branches computed, one chosen by a select)
//!
//! - `|x| < 0.625`: the odd polynomial `x + x·z·P(z)`, `z = x²`, `P` of degree 4 (Cephes
//!   `tanhf`'s minimax coefficients). No cancellation: the correction is below `x/8`, so the
//!   relative error stays small down to the subnormals (where `z` underflows and the result is
//!   `x` exactly).
//! - otherwise: `sign(x)·(1 − 2/(e^(2|x|) + 1))` with the crate's full-range exp
//!   ([`exp_rr2_p7`], [`EXP_MAX_ULP`](super::EXP_MAX_ULP)). `2/(e + 1) ≤ 0.56` there, so its
//!   error (the exp's, `e + 1`'s and the division's roundings) is at most about half the
//!   result, which is what [`TANH_MAX_ULP`] measures. When `e^(2|x|)` overflows (`|x| > 44.4`)
//!   `2/∞ = 0` and the result is exactly `±1` (no `∞/∞`).
//!
//! Edges, exactly: `tanh(±0) = ±0`, `tanh(±∞) = ±1`, NaN gives NaN; the result is exactly `±1`
//! for `|x| ≥ 9.1` (there `2/(e^(2|x|) + 1) < 0.85·2⁻²⁵`, so `1 −` it rounds to 1 whatever the
//! exp's error; exact `tanh` rounds to 1 from 9.011).

use super::exp::exp_rr2_p7;
use crate::arch::Isa;
use crate::arch::{load, store, vectorize, Kernel, Simd};
use attn_core::Result;

/// Maximum error of [`tanh_simd`] (and [`tanh`], [`tanh_with_isa`]) in ULP of the exact result,
/// for results in the normal range, on every ISA; subnormal results (`|x| < 2⁻¹²⁶`) are exact.
///
/// Measured by the ignored test `exhaustive_tanh` in `tests/tests/suite/math.rs` (every
/// non-negative f32 against f64 `tanh`; the function is odd lane by lane, so the negative half
/// gives the same magnitudes), run with `cargo test --release -p attn-tests --test suite --
/// --ignored exhaustive_tanh --nocapture` on an AMD EPYC with AVX-512 (2026-12-02). Worst
/// errors, polynomial branch / exp branch: AVX-512 0.714 / 1.371, AVX2 0.714 / 1.371,
/// portable without FMA 0.776 / 1.330 ULP. The exp branch peaks just above the split
/// (`x ≈ 0.63`), where `2/(e^(2x) + 1) ≈ 0.55` carries the exp's error and two roundings into
/// a result of about the same size. Published with a margin as 1.5 ULP.
pub const TANH_MAX_ULP: f64 = 1.5;

/// Below this `|x|` the polynomial branch runs (Cephes `tanhf`'s split point).
const SMALL: f32 = 0.625;
/// Cephes `tanhf`: `tanh(x) ≈ x + x·z·(P0 + P1 z + P2 z² + P3 z³ + P4 z⁴)`, `z = x²`, `|x| < 0.625`.
const P0: f32 = f32::from_bits(0xBEAA_AA99); // -0.333332819422
const P1: f32 = f32::from_bits(0x3E08_8393); // 0.133314422036
const P2: f32 = f32::from_bits(0xBD5C_1E2D); // -0.0537397155531
const P3: f32 = f32::from_bits(0x3CA9_134E); // 0.0206390887954
const P4: f32 = f32::from_bits(0xBBBA_F0EA); // -0.00570498872745

/// Maximum error of [`tanh_rational_simd`] (and [`tanh_rational_with_isa`]) in ULP of the exact
/// result, for results in the normal range, on every ISA; `|result| ≤ 1` everywhere.
///
/// The approximation is `x·P(x²)/Q(x²)` on `x` clamped to `±7.905311` (`P` of degree 6, `Q` of
/// degree 3 in `x²`: the minimax coefficients Eigen's and XLA's fast `tanh` use), and `x`
/// itself for `|x| < 0.0004` (where `tanh x = x·(1 − x²/3 + …)` is within half an ULP of `x`,
/// and where the rational form would lose subnormal inputs). Measured by the ignored test
/// `exhaustive_tanh` in `tests/tests/suite/math.rs` (every non-negative f32 against f64 `tanh`), on a
/// Sapphire-Rapids-class Xeon (2026-12-02): worst 4.37 ULP below 0.625 (at `x ≈ 0.0154`,
/// the fit's `P(0)/Q(0) = 1 − 1.3·10⁻⁷`) on every ISA, 6.31 ULP above (at `x ≈ 5.08`) with
/// FMA (AVX-512, AVX2), 8.30 ULP without (portable). Published with a margin as 8.5 ULP.
/// Special values: `±0 → ±0`, NaN → NaN, `±∞` (and every `|x| ≥ 7.905311`) → the value at the
/// clamp, within the bound of `±1`.
pub const TANH_RATIONAL_MAX_ULP: f64 = 8.5;

const R_CLAMP: f32 = 7.905_311;
const R_TINY: f32 = 0.0004;
/// Numerator coefficients of `P(z)`, highest degree first (`z¹²/² … z⁰` of `x·P(x²)`).
const R_P: [f32; 7] = [
    -2.760_768_5e-16,
    2.000_188e-13,
    -8.604_672e-11,
    5.122_297e-8,
    1.485_722_4e-5,
    6.372_619_3e-4,
    4.893_524_6e-3,
];
/// Denominator coefficients of `Q(z)`, highest degree first.
const R_Q: [f32; 4] = [1.198_258_4e-6, 1.185_347e-4, 2.268_434_6e-3, 4.893_525e-3];

/// `tanh` of each lane by the rational approximation, within [`TANH_RATIONAL_MAX_ULP`]: 11
/// multiply-adds, two clamps, a division and a select, against [`tanh_simd`]'s two branches.
#[inline(always)]
pub(crate) fn tanh_rational_simd<S: Simd>(s: S, x: S::V) -> S::V {
    let xc = s.clamp_keep_nan(x, s.splat(-R_CLAMP), s.splat(R_CLAMP));
    let z = s.mul(xc, xc);
    let mut p = s.splat(R_P[0]);
    for &c in &R_P[1..] {
        p = s.fma(p, z, s.splat(c));
    }
    let mut q = s.splat(R_Q[0]);
    for &c in &R_Q[1..] {
        q = s.fma(q, z, s.splat(c));
    }
    // Without FMA (portable) the quotient overshoots 1 by an ULP just below the clamp.
    let t = s.clamp_keep_nan(s.div(s.mul(p, xc), q), s.splat(-1.0), s.splat(1.0));
    // |x| < R_TINY (zeros and subnormals among them): x itself. A NaN lane is not `<`, so it
    // keeps the quotient's NaN.
    let a = s.max(x, s.sub(s.splat(0.0), x));
    s.select(s.lt(a, s.splat(R_TINY)), x, t)
}

/// `tanh` of each lane, within [`TANH_MAX_ULP`] (module docs).
#[inline(always)]
pub(crate) fn tanh_simd<S: Simd>(s: S, x: S::V) -> S::V {
    let small = poly(s, x);
    // |x| without a bit operation; a NaN lane stays NaN (max returns its second operand).
    let a = s.max(x, s.sub(s.splat(0.0), x));
    let e = exp_rr2_p7(s, s.add(a, a));
    let big = s.sub(s.splat(1.0), s.div(s.splat(2.0), s.add(e, s.splat(1.0))));
    let big = s.select(s.lt(x, s.splat(0.0)), s.sub(s.splat(0.0), big), big);
    // NaN lanes are not `< SMALL`, so they take the exp branch and stay NaN.
    let t = s.select(s.lt(a, s.splat(SMALL)), small, big);
    // −0 + (+0) would give +0 in the polynomial: zeros are returned as they came.
    s.select(s.nonzero(x), t, x)
}

/// [`tanh_simd`] for a vector that [`poly_covers`]: the polynomial branch alone, the same
/// bits (a quarter of the operations, no exp, no division).
#[inline(always)]
pub(crate) fn tanh_small_simd<S: Simd>(s: S, x: S::V) -> S::V {
    s.select(s.nonzero(x), poly(s, x), x)
}

/// Whether every lane of `x` is within the polynomial branch, `|x| < 0.625`, or NaN (a NaN
/// lane is NaN on either branch), so that [`tanh_small_simd`] gives [`tanh_simd`]'s bits.
#[inline(always)]
pub(crate) fn poly_covers<S: Simd>(s: S, x: S::V) -> bool {
    let a = s.max(x, s.sub(s.splat(0.0), x));
    // `SMALL − a` is exact near SMALL (Sterbenz) and at least an ULP of SMALL when positive,
    // so it is below the smallest normal exactly when `a ≥ SMALL`.
    !s.any_lt(s.sub(s.splat(SMALL), a), s.splat(f32::MIN_POSITIVE))
}

/// The polynomial branch `x + x·z·P(z)`, `z = x²` (module docs), for `|x| < SMALL`.
#[inline(always)]
fn poly<S: Simd>(s: S, x: S::V) -> S::V {
    let z = s.mul(x, x);
    let mut p = s.splat(P4);
    p = s.fma(p, z, s.splat(P3));
    p = s.fma(p, z, s.splat(P2));
    p = s.fma(p, z, s.splat(P1));
    p = s.fma(p, z, s.splat(P0));
    s.fma(s.mul(p, z), x, x)
}

/// `tanh` of every element of `x`, in place, with the ISA
/// [`arch::selected`](crate::arch::selected) returns; accuracy in the module docs
/// ([`TANH_MAX_ULP`]).
pub fn tanh(x: &mut [f32]) {
    vectorize(crate::arch::selected(), Tanh::<false>(x));
}

/// [`tanh`] on an explicit ISA; `InvalidParameter { arg: "isa" }` when the CPU lacks it.
/// Every ISA gives a result within [`TANH_MAX_ULP`]; the bits may differ (FMA or not).
pub fn tanh_with_isa(isa: Isa, x: &mut [f32]) -> Result<()> {
    vectorize(isa.require()?, Tanh::<false>(x));
    Ok(())
}

/// `tanh` of every element of `x`, in place, by the rational approximation
/// ([`TANH_RATIONAL_MAX_ULP`], module docs), with the ISA
/// [`arch::selected`](crate::arch::selected) returns.
pub fn tanh_rational(x: &mut [f32]) {
    vectorize(crate::arch::selected(), Tanh::<true>(x));
}

/// [`tanh_rational`] on an explicit ISA; `InvalidParameter { arg: "isa" }`
/// when the CPU lacks it. The bits may differ between ISAs (FMA or not).
pub fn tanh_rational_with_isa(isa: Isa, x: &mut [f32]) -> Result<()> {
    vectorize(isa.require()?, Tanh::<true>(x));
    Ok(())
}

/// The slice functions' kernel: [`tanh_rational_simd`] when `RATIONAL`, else [`tanh_simd`].
struct Tanh<'a, const RATIONAL: bool>(&'a mut [f32]);

impl<const RATIONAL: bool> Tanh<'_, RATIONAL> {
    #[inline(always)]
    fn one<S: Simd>(s: S, x: S::V) -> S::V {
        if RATIONAL {
            tanh_rational_simd(s, x)
        } else {
            tanh_simd(s, x)
        }
    }
}

impl<const RATIONAL: bool> Kernel for Tanh<'_, RATIONAL> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let mut chunks = self.0.chunks_exact_mut(S::LANES);
        for c in &mut chunks {
            store(s, c, Self::one(s, load(s, c)));
        }
        // The tail through a padded copy: lanes are independent, so a value gets the same bits
        // wherever it sits in the slice.
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let mut buf = [0.0f32; 16];
            buf[..tail.len()].copy_from_slice(tail);
            let t = Self::one(s, load(s, &buf));
            store(s, &mut buf, t);
            tail.copy_from_slice(&buf[..tail.len()]);
        }
    }
}
