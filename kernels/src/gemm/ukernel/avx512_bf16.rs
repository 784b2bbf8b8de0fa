//! AVX512_BF16 micro-kernel for bf16 × bf16: `bf16dot_12x32_avx512bf16`, the 12 × 32 tile of
//! `sgemm_12x32_avx512` (24 zmm accumulators of f32) on `vdpbf16ps`.
//!
//! The panels hold pairs of bf16 steps (`pack::pack_a_pairs` / `pack_b_pairs`): one 32-bit
//! word holds `(x[2q], x[2q + 1])` (low half first), an odd depth's last pair is padded with
//! +0 in both A and B (so the padding adds `0·0 = +0`, never `0·∞`), and the kernel's depth
//! counts pairs. Each step broadcasts a row's word of Ã and runs one `vdpbf16ps` per B̃ vector:
//! 32 multiply-adds per instruction where an f32 FMA does 16.
//!
//! # Accuracy of this path
//!
//! `vdpbf16ps` forms the two products of a pair exactly (two 8-bit significands: 16 bits) and
//! adds them to the f32 accumulator one after the other, each addition rounded to nearest even
//! (measured on this machine: `1 + 2⁻²⁴ + 2⁻²⁴` gives 1, not `1 + 2⁻²³`). So each term of the
//! sum costs one rounding, as an FMA does, and the f32 bound of the module docs holds:
//! `γ·(k + 3)·u·(|α|·(|A||B|)_ij + |β c_ij|)`. The order of the terms differs from the f32
//! kernels (odd step before even within a pair), which the bound does not depend on.
//!
//! Unlike the f32 kernels, `vdpbf16ps` ignores MXCSR and works with DAZ and FTZ (Intel SDM;
//! checked here: a subnormal bf16 input times 1024 gives 0, a product or sum below `2⁻¹²⁶`
//! gives 0). The extra error: a term with a subnormal factor (`|a| < 2⁻¹²⁶`) is dropped, off by
//! `|a·b| < 2⁻¹²⁶·|b|`; each of the at most `k + 1` accumulations may flush a subnormal result,
//! off by less than `2⁻¹²⁶`. In all, after the scaling by α,
//!
//! ```text
//! |ĉ − c| ≤ γ·(k + 3)·u·(|α|·Σ_p |a_ip b_pj| + |β c_ij|) + |α|·2⁻¹²⁶·(k + 1 + Σ_p (|a_ip| + |b_pj|))
//! ```
//!
//! where `a`, `b` are the values the bf16 operands represent. The α/β update runs in ordinary
//! f32 arithmetic (no flushing), as in every kernel.

use std::arch::x86_64::*;

use crate::arch::{Avx512, Isa};

/// The `vdpbf16ps` step: a rank-2 update from one pair of steps.
pub(crate) struct Bf16Pairs;

impl super::Step<Avx512> for Bf16Pairs {
    #[inline(always)]
    unsafe fn step<const MR: usize, const NV: usize>(
        _s: Avx512,
        acc: &mut [[__m512; NV]; MR],
        a: *const f32,
        a_rs: usize,
        b: *const f32,
    ) {
        // SAFETY: the step's contract: `a[i·a_rs]` (one 32-bit pair each) and `NV·16` words at
        // `b` are readable; the caller's `#[target_feature]` includes AVX512_BF16 (only the
        // kernels below instantiate this step, and they are selected only on such CPUs).
        unsafe {
            let mut bv = [pairs(_mm512_setzero_si512()); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = pairs(_mm512_loadu_si512(b.add(v * 16).cast()));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av = pairs(_mm512_set1_epi32(a.add(i * a_rs).cast::<i32>().read()));
                for (acc_v, &b_v) in row.iter_mut().zip(bv.iter()) {
                    *acc_v = _mm512_dpbf16_ps(*acc_v, av, b_v);
                }
            }
        }
    }
}

/// The 32 bf16 of a vector of 16 words (a bit cast).
#[inline(always)]
fn pairs(x: __m512i) -> __m512bh {
    // SAFETY: both are 64-byte vectors with no invalid bit patterns.
    unsafe { core::mem::transmute::<__m512i, __m512bh>(x) }
}

super::define_kernels! {
    isa: Isa::Avx512, simd: crate::arch::Avx512, step: Bf16Pairs, pairs: true,
    mr: 12, nv: 2,
    packed: bf16dot_12x32_avx512bf16, strided: bf16dot_12x32_avx512bf16_strided_a,
    rows: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    name: "bf16dot_12x32_avx512bf16",
    #[target_feature(enable = "avx512f,avx512bf16")]
}

/// True when this CPU runs the kernel (AVX-512F and AVX512_BF16).
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}
