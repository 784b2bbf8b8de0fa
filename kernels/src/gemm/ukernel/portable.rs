//! Portable micro-kernel on `wide::f32x8`: `sgemm_4x16_portable`, 4 rows × 2 vectors.
//!
//! Built for the crate's baseline target, where `f32x8` is a pair of SSE registers and there
//! are only 16 of them: 4 × 2 accumulators (16 halves would not fit with the B vectors, so the
//! tile is smaller than the AVX2 one). `mul_add` is fused only when the build enables FMA;
//! otherwise it rounds twice, which the tests' error bound allows.

use wide::f32x8;

use super::Simd;
use crate::arch::Isa;

/// The `wide` vector ops (8 lanes).
#[derive(Clone, Copy)]
pub(crate) struct Portable;

// SAFETY: plain Rust on any CPU; the pointer methods read/write 8 values as their contract says.
unsafe impl Simd for Portable {
    type V = f32x8;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> f32x8 {
        f32x8::ZERO
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> f32x8 {
        f32x8::splat(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> f32x8 {
        // SAFETY: the caller guarantees 8 readable values at `p`.
        f32x8::from(unsafe { p.cast::<[f32; 8]>().read_unaligned() })
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: f32x8) {
        // SAFETY: the caller guarantees 8 writable values at `p`.
        unsafe { p.cast::<[f32; 8]>().write_unaligned(v.to_array()) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: f32x8, b: f32x8, c: f32x8) -> f32x8 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    unsafe fn prefetch(_p: *const f32) {}
    #[inline(always)]
    unsafe fn mul(a: f32x8, b: f32x8) -> f32x8 {
        a * b
    }
}

super::define_kernels! {
    isa: Isa::Portable, simd: Portable, mr: 4, nv: 2,
    packed: sgemm_4x16_portable, strided: sgemm_4x16_portable_strided_a, rows: [1, 2, 3],
    name: "sgemm_4x16_portable",

}
