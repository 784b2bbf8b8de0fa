//! AVX2+FMA micro-kernel: `sgemm_6x16_avx2`, 6 rows × 2 ymm (16 columns).
//!
//! The classic Haswell-and-later shape: 12 accumulators + 2 B vectors + 1 broadcast = 15 of the
//! 16 ymm registers; 12 independent FMA chains cover 2 FMA pipes × 4 cycles of latency; 2 loads
//! + 6 broadcasts per 12 FMAs.

use core::arch::x86_64::*;

use super::Simd;
use crate::arch::Isa;

/// The AVX2+FMA vector ops (ymm, 8 lanes).
#[derive(Clone, Copy)]
pub(crate) struct Avx2;

// SAFETY: only used inside `#[target_feature(enable = "avx2,fma")]` functions reached after
// `Isa::Avx2.require()`.
unsafe impl Simd for Avx2 {
    type V = __m256;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        // SAFETY: a prefetch is a hint and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
}

super::define_kernels! {
    isa: Isa::Avx2, simd: Avx2, mr: 6, nv: 2,
    packed: sgemm_6x16_avx2, strided: sgemm_6x16_avx2_strided_a, rows: [1, 2, 3, 4, 5],
    name: "sgemm_6x16_avx2",
    #[target_feature(enable = "avx2,fma")]
}
