//! # attn-kernels: SIMD CPU kernels for transformer self-attention
//!
//! Layers, from the bottom:
//! - [`arch`]: CPU feature detection and the cached ISA choice (AVX-512F, AVX2+FMA, portable);
//! - [`par`]: the threading policy shared by all kernels;
//! - [`gemm`]: cache-blocked SGEMM (loop nest, packing, per-ISA micro-kernels);
//! - [`softmax`]: fused scale-mask-softmax with a vectorised exp;
//! - [`attention`]: flash-style streaming attention and the decode path.
//!
//! Shapes, masks and errors are the reference crate's ([`attn_reference`]), re-exported here,
//! so a call that the reference rejects is rejected here with the same error.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod arch;
pub mod attention;
pub mod gemm;
pub mod par;
pub mod softmax;

pub use arch::Isa;
pub use attn_reference::{Error, Mask, MatLayout, Result, Tensor4Layout};
pub use par::Parallelism;
pub mod ffi;
pub mod layers;
