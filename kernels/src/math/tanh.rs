//! Hyperbolic tangent, vectorised: [`tanh_simd`] per vector (for kernels that need it inside
//! their own loops, e.g. a logit softcap `c·tanh(s/c)` or additive attention scores) and the
//! slice functions [`tanh`] and [`tanh_with_isa`].
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
/// Measured by the ignored test `exhaustive_tanh` in `tests/tests/math.rs` (every
/// non-negative f32 against f64 `tanh`; the function is odd lane by lane, so the negative half
/// gives the same magnitudes), run with `cargo test --release -p attn-tests --test math --
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
    vectorize(crate::arch::selected(), Tanh(x));
}

/// [`tanh`] on an explicit ISA; `InvalidParameter { arg: "isa" }` when the CPU lacks it.
/// Every ISA gives a result within [`TANH_MAX_ULP`]; the bits may differ (FMA or not).
pub fn tanh_with_isa(isa: Isa, x: &mut [f32]) -> Result<()> {
    vectorize(isa.require()?, Tanh(x));
    Ok(())
}

struct Tanh<'a>(&'a mut [f32]);

impl Kernel for Tanh<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let mut chunks = self.0.chunks_exact_mut(S::LANES);
        for c in &mut chunks {
            store(s, c, tanh_simd(s, load(s, c)));
        }
        // The tail through a padded copy: lanes are independent, so a value gets the same bits
        // wherever it sits in the slice.
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let mut buf = [0.0f32; 16];
            buf[..tail.len()].copy_from_slice(tail);
            let t = tanh_simd(s, load(s, &buf));
            store(s, &mut buf, t);
            tail.copy_from_slice(&buf[..tail.len()]);
        }
    }
}
