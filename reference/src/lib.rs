//! # attn-reference: the oracle
//!
//! Naive, obviously-correct implementations of every operation of the attention kernels
//! workspace. Plain loops, no SIMD, no unsafe, every sum accumulated in f64 and rounded to f32
//! once. Each function's doc comment states its formula and conventions. The optimised
//! `attn-kernels` crate is proven equivalent to these functions by property tests and fuzzing.
//!
//! The shape descriptors ([`shape`]), masks ([`mask`]) and error type ([`error`]) defined here
//! are the vocabulary of the whole workspace; the kernels reuse them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod attention;
pub mod error;
pub mod mask;
pub mod matmul;
pub mod shape;
pub mod softmax;

pub use error::{Error, Result};
pub use mask::Mask;
pub use shape::{MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};
