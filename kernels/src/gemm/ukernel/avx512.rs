//! AVX-512F micro-kernel: `sgemm_12x32_avx512`, 12 rows × 2 zmm (32 columns).
//!
//! Why this shape on Zen 4: 512-bit FMAs issue at one per cycle (two 256-bit halves) with a
//! 4-cycle latency, so any tile with ≥ 8 independent accumulators saturates the FMA pipes; what
//! matters is the load traffic per FMA. 12×32 holds 24 accumulators + 2 B vectors + 1 broadcast
//! = 27 of the 32 zmm registers and issues 2 vector loads + 12 broadcasts per 24 FMAs, well under
//! the load ports' limit. The broadcast side (A) is the short one, so the row-major C tile is
//! written with full-width stores.

use core::arch::x86_64::*;

use super::Simd;
use crate::arch::Isa;

/// The AVX-512F vector ops (zmm, 16 lanes).
#[derive(Clone, Copy)]
pub(crate) struct Avx512;

// SAFETY: only used inside `#[target_feature(enable = "avx512f")]` functions reached after
// `Isa::Avx512.require()`.
unsafe impl Simd for Avx512 {
    type V = __m512;
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        // SAFETY: a prefetch is a hint and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
}

super::define_kernels! {
    isa: Isa::Avx512, simd: Avx512, mr: 12, nv: 2,
    packed: sgemm_12x32_avx512, strided: sgemm_12x32_avx512_strided_a, rows: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    name: "sgemm_12x32_avx512",
    #[target_feature(enable = "avx512f")]
}
