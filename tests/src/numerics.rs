//! The numerics kit: the constants every error bound of the workspace is built from, and the
//! bounds that more than one place needs. The tests, the fuzz decoders and the report's
//! correctness check (`attn-bench`) all import these, so their bounds cannot disagree; the
//! kernels' own accuracy enters only through the constants the kernels publish
//! (`EXP_MAX_ULP`, `SOFTMAX_EXP_MAX_ULP`, `TANH_MAX_ULP`, `TANH_RATIONAL_MAX_ULP`,
//! `GELU_TANH_*`, `FLUSH_WEIGHTS_BELOW`, `RECIP_MAX_REL`).

use attn_kernels::arch::RECIP_MAX_REL;
use attn_kernels::attention::FLUSH_WEIGHTS_BELOW;
use attn_kernels::math::{
    EXP_MAX_ULP, GELU_TANH_ARG_ROUNDINGS, GELU_TANH_OUT_ROUNDINGS, SOFTMAX_EXP_MAX_ULP,
    TANH_MAX_ULP, TANH_RATIONAL_MAX_ULP,
};

/// Unit roundoff of f32, `u = 2⁻²⁴`: a correctly rounded operation is off by at most `u`
/// relative (for results in the normal range).
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Unit roundoff of bf16, `2⁻⁸`: rounding to bf16 (nearest even) is off by at most this much
/// relative, for results in its normal range.
pub const BF16_U: f64 = 1.0 / 256.0;

/// Half the spacing of bf16 subnormals, `2⁻¹³⁴` (bf16 has f32's exponent range and 7 stored
/// bits): the absolute rounding error of a bf16 result below `2⁻¹²⁶`.
pub const BF16_SUBNORMAL_HALF: f64 = 4.591_774_807_899_561e-41;

/// Unit roundoff of f16, `2⁻¹¹`, for results in its normal range (`≥ 2⁻¹⁴`).
pub const F16_U: f64 = 1.0 / 2048.0;

/// Half the spacing of f16 subnormals, `2⁻²⁵`: the absolute rounding error of an f16 result
/// below `2⁻¹⁴`.
pub const F16_SUBNORMAL_HALF: f64 = 1.0 / (1u64 << 25) as f64;

/// ULP of the exact value `v` as an f32: `2^(e−23)` for `|v| ∈ [2^e, 2^(e+1))`, `2⁻¹⁴⁹` below
/// `2⁻¹²⁶` (the unit the math functions' published `*_MAX_ULP` bounds are measured in).
pub fn f32_ulp(v: f64) -> f64 {
    let v = v.abs();
    if v < f64::from(f32::MIN_POSITIVE) {
        return SUBNORMAL_ULP;
    }
    2f64.powi(v.log2().floor() as i32 - 23)
}

/// The smallest positive subnormal f32, `2⁻¹⁴⁹`: the absolute rounding error of a result in
/// the subnormal range is at most half of it, an exp's at most one.
pub const SUBNORMAL_ULP: f64 = 1.401_298_464_324_817e-45;

/// The constant `γ` of the bounds `γ·n·u`: the classic bound of an `n`-term sum is `n·u` for
/// any summation order to first order; 2 covers the second-order terms and an unfused
/// multiply-add's two roundings per term (the portable ISA without FMA).
pub const GAMMA: f64 = 2.0;

/// The largest attention weight (relative to its row's maximum, so against a row sum `≥ 1`)
/// that the attention kernels may flush to 0: `e^`[`FLUSH_WEIGHTS_BELOW`] `≈ 1.6·10⁻²⁸`, times 4
/// for the rounding of the score and of its distance to the running maximum (a logit error of
/// up to `ln 4`). A flushed key changes an output by at most this times its `|v|`.
pub fn flushed_weight() -> f64 {
    4.0 * f64::from(FLUSH_WEIGHTS_BELOW).exp()
}

/// `γ·n·u`, the relative error bound of an `n`-term sum or dot product (see [`GAMMA`]).
pub fn gamma(n: usize) -> f64 {
    GAMMA * n as f64 * U
}

/// One ULP of an f32 result is at most `2u` of its value (normal range).
const ULP_REL: f64 = 2.0 * U;

/// Relative error of one exp in the softmax and attention kernels, which run both the 1-ULP
/// exp ([`EXP_MAX_ULP`]) and the softmax's table exp ([`SOFTMAX_EXP_MAX_ULP`]).
pub const EXP_REL: f64 = ULP_REL * max(EXP_MAX_ULP, SOFTMAX_EXP_MAX_ULP);

const fn max(a: f64, b: f64) -> f64 {
    if a > b {
        a
    } else {
        b
    }
}

/// Bound on `|ĉ − c|` for one element of `α·A·B + β·C` with inner length `k`, where
/// `mag = |α|·Σ_p |a_p b_p| + |β c|`: `γ·(k + 3)·u·mag` (the 3 covers α, β and the final add).
pub fn dot_bound(k: usize, mag: f64) -> f64 {
    gamma(k + 3) * mag
}

/// Bound on the error of the kernels' GELU (tanh form) at `x`, against the exact value `g`
/// (both from the published constants; derivation in `attn_kernels::math`'s GELU docs):
/// `((A·|z| + 2)·t + B)·u·|g|` with `z = −2√(2/π)(x + 0.044715x³)`, `t = e^z/(1 + e^z)`,
/// `A` = [`GELU_TANH_ARG_ROUNDINGS`], `B` = [`GELU_TANH_OUT_ROUNDINGS`], the exp's
/// 1 ULP (`2u`) in the `+ 2`, and a 1 % margin for second-order terms; plus `2⁻¹⁴⁹` for results
/// in the subnormal range, and `|g|` itself where `e^z` overflows f32 (the kernel returns −0).
pub fn gelu_tanh_bound(x: f32, g: f64) -> f64 {
    let x = f64::from(x);
    let z = -2.0 * (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    // e^z overflows f32 once the computed argument passes ln(f32::MAX); allow for its error.
    if z * (1.0 - GELU_TANH_ARG_ROUNDINGS * U) > (f32::MAX as f64).ln() {
        return g.abs() + SUBNORMAL_ULP;
    }
    let t = if z > 0.0 { 1.0 / (1.0 + (-z).exp()) } else { z.exp() / (1.0 + z.exp()) };
    let exp_ulps = 2.0 * EXP_MAX_ULP;
    let rel = ((GELU_TANH_ARG_ROUNDINGS * z.abs() + exp_ulps) * t + GELU_TANH_OUT_ROUNDINGS) * U;
    1.01 * rel * g.abs() + SUBNORMAL_ULP
}

/// Bound on the error of the kernels' tanh at `x` against the exact value `t`:
/// [`TANH_MAX_ULP`] ULP of `t` (one ULP is at most `2u·|t|` in the normal range), plus
/// `2⁻¹⁴⁹` for results in the subnormal range. `x` is unused today (the bound is relative
/// everywhere) and kept so that a bound with an argument term needs no new signature.
pub fn tanh_bound(x: f32, t: f64) -> f64 {
    let _ = x;
    TANH_MAX_ULP * ULP_REL * t.abs() + SUBNORMAL_ULP
}

/// [`tanh_bound`] for the rational tanh (`tanh_rational_with_isa`, additive attention's):
/// [`TANH_RATIONAL_MAX_ULP`] ULP of `t` plus `2⁻¹⁴⁹`.
pub fn tanh_rational_bound(x: f32, t: f64) -> f64 {
    let _ = x;
    TANH_RATIONAL_MAX_ULP * ULP_REL * t.abs() + SUBNORMAL_ULP
}

/// The error a softcap `c` adds to a capped score `c·tanh(s/c)`: the tanh's
/// [`TANH_MAX_ULP`] ulp (`2u` each, relative to a result at most `c`), the argument's two
/// roundings (the kernels form `s·(1/c)`; through tanh's slope, at most
/// `2u·|s|·sech²(s/c) ≤ 0.9·u·c`) and one for the product by `c`, with `γ` for the
/// second-order terms. The error of `s` itself
/// reaches the capped score damped by `sech²`, so the uncapped term of `δ` still covers it.
pub fn softcap_error(c: f64) -> f64 {
    GAMMA * (2.0 * TANH_MAX_ULP + 2.0) * U * c
}

/// Bound on `|ŝ − s|` for one additive score `s = Σ_a w_a·tanh(x_a)`, `x_a = A_a + B_a` with
/// the projections `A_a = q·Wq[:, a]` (inner length `dq`) and `B_a = k·Wk[:, a]` (length `dk`),
/// as the kernels compute it: GEMM projections, then either path of
/// `attn_kernels::attention::additive` (the larger of the two bounds, since the kernel picks
/// the path from values the test does not see). Arguments per hidden unit `a`: `w_a`, the
/// exact `x_a`, and the magnitudes `mq_a = Σ_p |q_p·Wq_pa|`, `mk_a = Σ_p |k_p·Wk_pa|`.
///
/// Common to both: the projections are dot products, `|Â_a − A_a| ≤ γ(dq + 3)·u·mq_a`
/// ([`dot_bound`]), the same for `B_a` with `dk`, `mk_a`, and the tanh path's add rounds once:
/// `ε_a = dot_bound(dq, mq_a) + dot_bound(dk, mk_a) + u·(|x_a| + …)`. tanh is 1-Lipschitz, so
/// this moves each term by at most `|w_a|·ε_a`.
///
/// Tanh path (`T` = [`TANH_RATIONAL_MAX_ULP`], the rational tanh; one ULP ≤ `2u` relative):
/// `|t̂_a − tanh x_a| ≤ ε_a + 2T·u` (tanh bounded by 1), and the FMA chain of `da` products
/// adds `γ(da + 1)·Σ_a |w_a|·|t̂_a|`: `δ = Σ_a |w_a|·(ε_a + 2Tu) + γ(da + 1)·Σ_a |w_a|·(|tanh x_a|
/// + ε_a + 2Tu)`.
///
/// Exp path (`S = W − 2·Σ_a w_a·r_a`, `r_a = 1/(e^(2Â_a)·e^(2B̂_a) + 1)`, `W = Σ_a w_a`):
/// each exp is off by `EXP_REL` relative, the multiply-add forming the denominator rounds once
/// and the reciprocal is within [`RECIP_MAX_REL`], so `r̂_a = r_a·(1 + θ_a)` with
/// `|θ_a| ≤ θ = 2·EXP_REL + u + RECIP_MAX_REL` (a relative error `η` of `E` moves `1/(E + 1)`
/// by at most `η·E/(E + 1) ≤ η`); with `r_a ≤ 1`, the chain's `γ(da)·Σ|w_a|·r̂_a`, `W` rounded
/// once (`u·Σ|w_a|`) and the final multiply-add `u·|S| ≤ u·Σ|w_a|` (`|1 − 2r_a| ≤ 1`):
/// `δ = Σ_a |w_a|·(ε_a + 2θ + 2γ(da)·(1 + θ) + 2u)`.
///
/// Each with 1 % added for second-order terms.
pub fn additive_score_bound(
    w: &[f32],
    x: &[f64],
    mq: &[f64],
    mk: &[f64],
    dq: usize,
    dk: usize,
) -> f64 {
    let tanh_err = 2.0 * TANH_RATIONAL_MAX_ULP * U;
    let theta = 2.0 * EXP_REL + U + RECIP_MAX_REL;
    let per_w = 2.0 * theta + 2.0 * gamma(w.len()) * (1.0 + theta) + 2.0 * U;
    let (mut first, mut mag, mut exp_path) = (0.0, 0.0, 0.0);
    for a in 0..w.len() {
        let eps = dot_bound(dq, mq[a]) + dot_bound(dk, mk[a]) + U * (x[a].abs() + mq[a] + mk[a]);
        let wa = f64::from(w[a]).abs();
        first += wa * (eps + tanh_err);
        mag += wa * (x[a].tanh().abs() + eps + tanh_err);
        exp_path += wa * (eps + per_w);
    }
    1.01 * (first + gamma(w.len() + 1) * mag).max(exp_path)
}

/// Relative bound, against `Σ_j p_j·|v_jd|`, on one output element of a streamed attention row
/// over `nk` keys whose scores are each off by at most `delta` (natural-log units): a
/// perturbation `δ` of every logit moves each `p_j` by a relative `e^(2δ) − 1 ≈ 2δ` (numerator
/// and normaliser); each `P_j` carries the exp's error ([`EXP_REL`]) in both; the rescale
/// factors `α` multiply the running sum and the accumulator alike (their own error cancels in
/// `o/l`, the two products round once each per block, at most `nk` blocks); the sums of `nk`
/// positive terms and the `P·V` sums add `γ·nk·u` each; the final division and product `2u`.
/// Total `2δ + 2·EXP_REL + γ·(2·nk + 8)·u`, doubled at the first order for the `e^(2δ)`
/// curvature when `δ` is not small (`δ ≤ 0.1` in the tests).
pub fn streamed_row_rel_bound(delta: f64, nk: usize) -> f64 {
    2.0 * delta * (1.0 + 2.0 * delta) + 2.0 * EXP_REL + gamma(2 * nk + 8)
}

/// Absolute bound on the logsumexp `m + ln l` of the same row: `δ` from the scores, the
/// relative error of `l` (`EXP_REL + γ·(nk + 8)·u`, through `ln`), and the final rounding
/// `u·|lse|`.
pub fn streamed_lse_bound(delta: f64, nk: usize, lse: f64) -> f64 {
    delta + EXP_REL + gamma(nk + 8) + U * lse.abs()
}
