//! AVX-512F micro-kernel: `sgemm_12x32_avx512`, 12 rows × 2 zmm (32 columns).
//!
//! Why this shape on Zen 4: 512-bit FMAs issue at one per cycle (two 256-bit halves) with a
//! 4-cycle latency, so any tile with ≥ 8 independent accumulators saturates the FMA pipes; what
//! matters is the load traffic per FMA. 12×32 holds 24 accumulators + 2 B vectors + 1 broadcast
//! = 27 of the 32 zmm registers and issues 2 vector loads + 12 broadcasts per 24 FMAs, well under
//! the load ports' limit. The broadcast side (A) is the short one, so the row-major C tile is
//! written with full-width stores.

use crate::arch::Isa;

super::define_kernels! {
    isa: Isa::Avx512, simd: crate::arch::Avx512, step: super::Fma, pairs: false,
    mr: 12, nv: 2,
    packed: sgemm_12x32_avx512, strided: sgemm_12x32_avx512_strided_a, rows: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    name: "sgemm_12x32_avx512",
    #[target_feature(enable = "avx512f")]
}
