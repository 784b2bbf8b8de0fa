//! AVX2+FMA micro-kernel: `sgemm_6x16_avx2`, 6 rows × 2 ymm (16 columns).
//!
//! The classic Haswell-and-later shape: 12 accumulators + 2 B vectors + 1 broadcast = 15 of the
//! 16 ymm registers; 12 independent FMA chains cover 2 FMA pipes × 4 cycles of latency; 2 loads
//! + 6 broadcasts per 12 FMAs.

use crate::arch::Isa;

super::define_kernels! {
    isa: Isa::Avx2, simd: crate::arch::Avx2, step: crate::gemm::ukernel::Fma, pairs: false,
    mr: 6, nv: 2,
    packed: sgemm_6x16_avx2, strided: sgemm_6x16_avx2_strided_a, rows: [1, 2, 3, 4, 5],
    name: "sgemm_6x16_avx2",
    #[target_feature(enable = "avx2,fma")]
}
