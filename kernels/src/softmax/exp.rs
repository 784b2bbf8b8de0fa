//! The vectorised `exp`: one generic body over [`SimdF32`], its per-ISA entry points for kernels
//! that fuse it into their own loops (`exp_ps_avx512`, `exp_ps_avx2`, `exp_f32x8`), and a
//! public slice function for testing and for callers who want a plain vector exp.
//!
//! # Algorithm (`f32-exp-rr2-p7`: two-step range reduction, degree-7 polynomial)
//!
//! 1. Clamp `x` to `[−104, 88.9]`, NaN passing through: below −104 the result rounds to 0
//!    (`e^−103.97 = 2^−150` is half the smallest subnormal), above 88.72 = ln(f32::MAX) it is
//!    `+∞`, and the clamp keeps the range reduction away from `±∞`.
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

use super::vector::SimdF32;
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
    // SAFETY: forwarded contract; every operation below is a `SimdF32` method.
    unsafe {
        let x = S::clamp_keep_nan(x, S::splat(EXP_LO), S::splat(EXP_HI));
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
        S::ldexp(e, n, t)
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
#[allow(dead_code)] // the attention kernel's API (softmax/mod.rs)
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
#[allow(dead_code)] // the attention kernel's API (softmax/mod.rs)
pub(crate) unsafe fn exp_ps_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    debug_assert!(Isa::Avx2.is_supported());
    // SAFETY: forwarded contract.
    unsafe { exp_v::<super::vector::Avx2>(x) }
}

/// Portable exp of 8 lanes of `wide::f32x8` (the module's algorithm; max error 1 ULP).
#[inline(always)]
#[allow(dead_code)] // the attention kernel's API (softmax/mod.rs)
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
    isa.require()?;
    if x.len() != y.len() {
        return Err(Error::ShapeMismatch {
            arg: "y",
            dim: "len",
            expected: x.len(),
            actual: y.len(),
        });
    }
    super::row::exp_map(isa, x, y);
    Ok(())
}

/// The generic body of [`exp_slice`]: full vectors, then one masked tail.
///
/// # Safety
/// The CPU must support `S::ISA`; `x` and `y` must have the same length.
#[inline(always)]
pub(crate) unsafe fn exp_map_body<S: SimdF32>(x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    let n = x.len().min(y.len());
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let mut j = 0;
    // SAFETY: every access is below `n`, full vectors only while `j + LANES ≤ n`.
    unsafe {
        while j + S::LANES <= n {
            S::store(yp.add(j), exp_v::<S>(S::load(xp.add(j))));
            j += S::LANES;
        }
        if j < n {
            let k = n - j;
            S::store_tail(yp.add(j), k, exp_v::<S>(S::load_tail(xp.add(j), k)));
        }
    }
}
