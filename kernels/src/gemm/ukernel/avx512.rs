//! AVX-512F micro-kernels, one register tile of 24 zmm accumulators in two shapes:
//! `sgemm_6x64_avx512` for GEMM and `sgemm_12x32_avx512` for the flash block products.
//!
//! A 512-bit FMA has a 4-cycle latency and issues at one (Zen 4, two 256-bit halves) or two
//! (Zen 5, Ice Lake) per cycle, so 24 independent accumulators cover the FMA pipes on all of
//! them; what tells the shapes apart is the load traffic per FMA. Both hold 24 accumulators +
//! the B vectors + 1 broadcast in the 32 zmm registers:
//!
//! - **6 × 64** (6 rows × 4 zmm): 4 vector loads + 6 broadcasts per 24 FMAs. The GEMM kernel:
//!   on Zen 5 it beats the 12 × 32 tile at every shape measured, from 1.02× (1024 × 64 × 1024)
//!   to 1.15× (128³, 256³) and 1.2–1.4× (m = 33, 64) (`docs/perf-journal.md`, 2026-12-04 11:30).
//! - **12 × 32** (12 rows × 2 zmm): 2 vector loads + 12 broadcasts per 24 FMAs. Flash
//!   attention's query tile is the kernel's `NR` and its softmax steps work on two vectors of
//!   queries (`QV` in `attention::blocking`), so the flash products run on this one.
//!
//! The broadcast side (A) is the short one in both, so the row-major C tile is written with
//! full-width stores.

/// `sgemm_6x64_avx512`: the GEMM kernel ([`super::kernel_for`]).
pub(crate) mod wide {
    use crate::arch::Isa;

    crate::gemm::ukernel::define_kernels! {
        isa: Isa::Avx512, simd: crate::arch::Avx512, step: crate::gemm::ukernel::Fma, pairs: false,
        mr: 6, nv: 4,
        packed: sgemm_6x64_avx512, strided: sgemm_6x64_avx512_strided_a, rows: [1, 2, 3, 4, 5],
        name: "sgemm_6x64_avx512",
        #[target_feature(enable = "avx512f")]
    }
}

/// `sgemm_12x32_avx512`: the flash kernel ([`super::tile_kernel_for`]).
pub(crate) mod tile {
    use crate::arch::Isa;

    crate::gemm::ukernel::define_kernels! {
        isa: Isa::Avx512, simd: crate::arch::Avx512, step: crate::gemm::ukernel::Fma, pairs: false,
        mr: 12, nv: 2,
        packed: sgemm_12x32_avx512, strided: sgemm_12x32_avx512_strided_a,
        rows: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        name: "sgemm_12x32_avx512",
        #[target_feature(enable = "avx512f")]
    }
}
