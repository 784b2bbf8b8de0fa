//! The vectorised part of the attention variants: the logit softcap `c·tanh(s/c)` over a block
//! of scores. (The window, ALiBi and sinks are index arithmetic on the problem, in
//! `Problem::apply_variants` and `Problem::finish`.)

use crate::arch::{load, load_tail, store, store_tail, Simd};
use crate::math::tanh::{poly_covers, tanh_simd, tanh_small_simd};
/// `x ← c·tanh(x/c)` for every element, in place (Gemma 2's logit softcap), as
/// `c·tanh(x·(1/c))` (or with the quotient when `1/c` is not normal): the reciprocal and the quotient are rounded once each and the tanh is
/// within [`TANH_MAX_ULP`](crate::math::TANH_MAX_ULP), so the capped score is off by at most
/// `(2·TANH_MAX_ULP + 1)·u·|c·tanh(x/c)| + 2u·|x|·sech²(x/c)` (the last term: the argument's
/// roundings through tanh's slope, at most `0.9·u·c`). `±∞` become `±c`, NaN stays NaN.
///
/// A vector whose arguments all lie in tanh's polynomial branch (`|x| < 0.625·c`, the usual
/// case for Gemma's `c = 50`) skips the exp branch: the same bits, a quarter of the work.
#[inline(always)]
pub(crate) fn softcap<S: Simd>(s: S, x: &mut [f32], c: f32) {
    // No closure for the vector body: a closure does not inherit the caller's target
    // features, and its intrinsics would become calls.
    let (cv, rc) = (s.splat(c), s.splat(1.0 / c));
    // A `c` whose reciprocal is not a normal number (`c` below 2⁻¹²⁶ or above 2¹²⁶) divides.
    let recip = (1.0 / c).is_normal();
    let mut chunks = x.chunks_exact_mut(S::LANES);
    for v in &mut chunks {
        let y = if recip { s.mul(load(s, v), rc) } else { s.div(load(s, v), cv) };
        let t = if poly_covers(s, y) { tanh_small_simd(s, y) } else { tanh_simd(s, y) };
        store(s, v, s.mul(cv, t));
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let y = if recip { s.mul(load_tail(s, tail), rc) } else { s.div(load_tail(s, tail), cv) };
        store_tail(s, tail, s.mul(cv, tanh_simd(s, y)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{vectorize, Isa, Kernel};

    /// [`softcap`] against the same arithmetic with tanh's full branch selection on every
    /// vector, bit for bit: the polynomial shortcut must not change a result.
    struct Both<'a>(&'a [f32], f32);

    impl Kernel for Both<'_> {
        type Output = (Vec<f32>, Vec<f32>);

        fn run<S: Simd>(self, s: S) -> Self::Output {
            let (xs, c) = (self.0, self.1);
            let mut fast = xs.to_vec();
            softcap(s, &mut fast, c);
            let (cv, rc) = (s.splat(c), s.splat(1.0 / c));
            let mut full = xs.to_vec();
            for v in full.chunks_mut(S::LANES) {
                let whole = v.len() == S::LANES;
                let x = if whole { load(s, v) } else { load_tail(s, v) };
                let y = if (1.0 / c).is_normal() { s.mul(x, rc) } else { s.div(x, cv) };
                let t = s.mul(cv, tanh_simd(s, y));
                if whole {
                    store(s, v, t)
                } else {
                    store_tail(s, v, t)
                }
            }
            (fast, full)
        }
    }

    #[test]
    fn polynomial_shortcut_keeps_the_bits() {
        let split = 0.625f32;
        for c in [50.0f32, 1.0, 3.0e-3, f32::from_bits(1), 1.0e-39, 3.0e38] {
            // Arguments on both sides of the split, around zero, and the special values.
            let mut xs = vec![0.0f32, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
            for k in -40..=40 {
                let a = split * (1.0 + k as f32 * 1.0e-3);
                xs.extend([a * c, -a * c, a * c * 1.0e-3, a * c * 9.0]);
                let b = (split * c).to_bits() as i64 + k;
                xs.push(f32::from_bits(b.clamp(0, 0x7F7F_FFFF) as u32));
            }
            for isa in Isa::supported() {
                let (fast, full) = vectorize(isa, Both(&xs, c));
                for ((x, f), g) in xs.iter().zip(&fast).zip(&full) {
                    assert_eq!(f.to_bits(), g.to_bits(), "{isa}: softcap {c:e} of {x:e}");
                }
            }
        }
    }
}
