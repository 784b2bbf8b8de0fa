//! Portable micro-kernel on `wide::f32x8`: `sgemm_4x16_portable`, 4 rows × 2 vectors.
//!
//! Built for the crate's baseline target, where `f32x8` is a pair of SSE registers and there
//! are only 16 of them: 4 × 2 accumulators (16 halves would not fit with the B vectors, so the
//! tile is smaller than the AVX2 one). `mul_add` is fused only when the build enables FMA;
//! otherwise it rounds twice, which the tests' error bound allows.

use crate::arch::Isa;

super::define_kernels! {
    isa: Isa::Portable, simd: crate::arch::Portable, step: crate::gemm::ukernel::Fma, pairs: false,
    mr: 4, nv: 2,
    packed: sgemm_4x16_portable, strided: sgemm_4x16_portable_strided_a, rows: [1, 2, 3],
    name: "sgemm_4x16_portable",

}
