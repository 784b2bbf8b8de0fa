//! The vectorised part of the attention variants: the logit softcap `c·tanh(s/c)` over a block
//! of scores. (The window, ALiBi and sinks are index arithmetic on the problem, in
//! `Problem::apply_variants` and `Problem::finish`.)

use crate::arch::{load, load_tail, store, store_tail, Simd};
use crate::math::tanh::tanh_simd;
/// `x ← c·tanh(x/c)` for every element, in place (Gemma 2's logit softcap). The quotient and
/// the product are rounded once each and the tanh is within
/// [`TANH_MAX_ULP`](crate::math::TANH_MAX_ULP), so the capped score is off by at most
/// `(2·TANH_MAX_ULP + 1)·u·|c·tanh(x/c)| + u·|x|·sech²(x/c)` (the last term: the quotient's
/// rounding through tanh's slope). `±∞` become `±c`, NaN stays NaN.
#[inline(always)]
pub(crate) fn softcap<S: Simd>(s: S, x: &mut [f32], c: f32) {
    // No closure for the vector body: a closure does not inherit the caller's target
    // features, and its intrinsics would become calls.
    let cv = s.splat(c);
    let mut chunks = x.chunks_exact_mut(S::LANES);
    for v in &mut chunks {
        let y = s.mul(cv, tanh_simd(s, s.div(load(s, v), cv)));
        store(s, v, y);
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let y = s.mul(cv, tanh_simd(s, s.div(load_tail(s, tail), cv)));
        store_tail(s, tail, y);
    }
}
