//! Fused scale-mask-softmax with a vectorised exp, log-softmax and logsumexp.
//!
//! Files: `mod.rs` (public API, argument checks, row iteration and threading), `row.rs` (row
//! primitives generic over the ISA, with per-ISA `#[target_feature]` wrappers and dispatch),
//! `exp.rs` (the vectorised exp and its stated accuracy), `vector.rs` (the [`SimdF32`] trait and
//! its AVX-512, AVX2 and portable implementations: the only intrinsics of the softmax).
//! The ISA is chosen by [`crate::arch`] (the one place for GEMM and softmax alike).
//!
//! # Crate-internal contract for the attention kernels
//!
//! Flash attention fuses softmax pieces into its own loops; it uses, and may rely on:
//! - `row_max(isa, &[f32]) -> f32`: the max of a contiguous row, NaN skipped, `−∞` if empty;
//! - `exp_sub_sum(isa, &mut [f32], m) -> f32`: `x_j ← exp(x_j − m)` in place, returns the f32
//!   sum of the new values (for finite `m`; `m = −∞` follows IEEE and gives NaN/∞);
//! - `scale_row(isa, &mut [f32], s)`: `x_j ← s·x_j`;
//! - the vector exp itself, 1 ULP (see [`exp`]): `exp_ps_avx512(__m512)`, `exp_ps_avx2(__m256)`
//!   (`unsafe`, `#[inline(always)]`: call them from inside a function compiled with
//!   `#[target_feature(enable = "avx512f")]` / `"avx2,fma"` on a CPU that has it), the safe
//!   `exp_f32x8(wide::f32x8)`, and the generic `exp_v::<S: SimdF32>(S::V)` for code written
//!   over the [`SimdF32`] trait (`Avx512`, `Avx2`, `Portable` implement it).
//!
//! The dispatched functions take an [`Isa`] that the caller obtained from
//! [`arch::selected`](crate::arch::selected) or checked with [`Isa::require`]; an unsupported
//! ISA falls back to the portable code (never undefined behaviour). None of them allocates.

pub mod exp;
mod row;
mod vector;

pub use exp::{exp_slice, exp_slice_with_isa, EXP_MAX_ULP};

#[allow(unused_imports)] // the attention kernel's API (module docs)
pub(crate) use exp::{exp_f32x8, exp_v};
#[cfg(target_arch = "x86_64")]
#[allow(unused_imports)]
pub(crate) use exp::{exp_ps_avx2, exp_ps_avx512};
#[allow(unused_imports)]
pub(crate) use row::{exp_sub_sum, row_max, scale as scale_row};
#[cfg(target_arch = "x86_64")]
#[allow(unused_imports)]
pub(crate) use vector::{Avx2, Avx512};
#[allow(unused_imports)]
pub(crate) use vector::{Portable, SimdF32};

use crate::arch::Isa;
