//! GELU, tanh form (BERT, GPT-2): `g(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
//!
//! Evaluated as `g(x) = x / (1 + e^z)` with `z = −2·√(2/π)·(x + 0.044715·x³)` (the same function:
//! `(1 + tanh(u))/2 = 1/(1 + e^(−2u))`), which needs one exp and one division and no
//! cancellation for either sign of `x`.
//!
//! # Accuracy
//!
//! Computing `z` takes [`GELU_TANH_ARG_ROUNDINGS`] roundings (`x²`, the multiply-add, `x·q`,
//! the product by the rounded constant, and the rounding of each f32 constant), so the computed
//! `ẑ = z(1 + θ)`, `|θ| ≤ 7u` (`u = 2⁻²⁴`; without FMA the multiply-add rounds twice, which the
//! 7 covers). The exp adds [`EXP_MAX_ULP`] (≤ 2u relative), and `1 + e` and the division round
//! once each ([`GELU_TANH_OUT_ROUNDINGS`]). To first order, with `t = e^z / (1 + e^z)`:
//!
//! `|ĝ − g| ≤ ((7·|z| + 2)·t + 2)·u·|g|`
//!
//! for results in the normal range. `t` is the sensitivity of `1 + e^z` to the error of `e^z`:
//! for `x > 0` it is tiny and the bound is a few `u`; for `x < 0` it tends to 1 and the
//! exp's argument error `7u·|z|` dominates (g then decays like `x·e^(−z)`). Below the normal
//! range the division adds at most `2⁻¹⁴⁹`; where `e^ẑ` overflows (`ẑ > 88.72`, i.e.
//! `x < −9.2`) the result is `−0`, within `|g| < 10⁻³⁷` of the exact value. Edges: `g(±0) = ±0`,
//! `g(+∞) = +∞`, `g(−∞) = NaN` (as `0.5·(−∞)·0`), NaN gives NaN.
//!
//! [`EXP_MAX_ULP`]: super::EXP_MAX_ULP

use super::exp::exp_rr2_p7;
use crate::arch::Isa;
use crate::arch::{load, store, vectorize, Kernel, Simd};
use attn_core::Result;

/// Roundings in the computed exp argument of [`gelu_tanh`], as a relative error in units of
/// `u = 2⁻²⁴` (see the module's accuracy section).
pub const GELU_TANH_ARG_ROUNDINGS: f64 = 7.0;
/// Roundings after the exp in [`gelu_tanh`] (`1 + e` and the division), in units of `u`.
pub const GELU_TANH_OUT_ROUNDINGS: f64 = 2.0;

/// `0.044715` and `−2·√(2/π)`, rounded to f32.
const CUBIC: f32 = 0.044715;
const NEG_TWO_SQRT_2_OVER_PI: f32 = -1.595_769;

/// GELU (tanh form) of every element of `x`, in place, with the ISA
/// [`arch::selected`](crate::arch::selected) returns; accuracy in the module docs.
pub fn gelu_tanh(x: &mut [f32]) {
    vectorize(crate::arch::selected(), Gelu(x));
}

/// [`gelu_tanh`] on an explicit ISA; `InvalidParameter { arg: "isa" }` when the CPU lacks it.
/// Every ISA gives a result within the same bound; the bits may differ (FMA or not).
pub fn gelu_tanh_with_isa(isa: Isa, x: &mut [f32]) -> Result<()> {
    vectorize(isa.require()?, Gelu(x));
    Ok(())
}

struct Gelu<'a>(&'a mut [f32]);

impl Kernel for Gelu<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let mut chunks = self.0.chunks_exact_mut(S::LANES);
        for c in &mut chunks {
            store(s, c, gelu_v(s, load(s, c)));
        }
        // The tail through a padded copy: lanes are independent, so a value gets the same bits
        // wherever it sits in the slice.
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let mut buf = [0.0f32; 16];
            buf[..tail.len()].copy_from_slice(tail);
            let g = gelu_v(s, load(s, &buf));
            store(s, &mut buf, g);
            tail.copy_from_slice(&buf[..tail.len()]);
        }
    }
}

#[inline(always)]
fn gelu_v<S: Simd>(s: S, x: S::V) -> S::V {
    let q = s.fma(s.splat(CUBIC), s.mul(x, x), s.splat(1.0));
    let z = s.mul(s.mul(x, q), s.splat(NEG_TWO_SQRT_2_OVER_PI));
    s.div(x, s.add(s.splat(1.0), exp_rr2_p7(s, z)))
}
