//! AVX2+FMA micro-kernel: `sgemm_6x16_avx2`, 6 rows × 2 ymm (16 columns).
//!
//! The classic Haswell-and-later shape: 12 accumulators + 2 B vectors + 1 broadcast = 15 of the
//! 16 ymm registers; 12 independent FMA chains cover 2 FMA pipes × 4 cycles of latency; 2 loads
//! + 6 broadcasts per 12 FMAs.

use core::arch::x86_64::*;

use super::{sgemm_body, Kernel, Simd};
use crate::arch::Isa;
use crate::gemm::blocking::Blocking;

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
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
}

const MR: usize = 6;
const NV: usize = 2;

/// `C[6×16] ← α·Ã·B̃ + β·C` (see the `ukernel` module docs for the contract).
///
/// # Safety
///
/// The CPU supports AVX2 and FMA; `a` valid for `k·6` reads, `b` for `k·16` reads, `c` for
/// reads (unless β = 0) and writes of `c[i·rs_c + j]`, `i < 6`, `j < 16`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn sgemm_6x16_avx2(
    k: usize,
    alpha: f32,
    a: *const f32,
    b: *const f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
) {
    debug_assert!(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
    // SAFETY: forwarded contract.
    unsafe { sgemm_body::<Avx2, MR, NV>(k, alpha, a, b, beta, c, rs_c) }
}

/// The AVX2 entry of the kernel table.
pub(crate) static KERNEL: Kernel = Kernel {
    isa: Isa::Avx2,
    name: "sgemm_6x16_avx2",
    mr: MR,
    nr: NV * 8,
    ukr: sgemm_6x16_avx2,
    blocking: Blocking::for_tile(MR, NV * 8),
};
