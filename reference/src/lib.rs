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

mod alloc;
pub mod attention;
pub mod encoder;
pub mod error;
pub mod linear;
pub mod mask;
pub mod matmul;
pub mod mha;
pub mod norm;
pub mod posenc;
pub mod scores;
pub mod shape;
pub mod softmax;

pub use error::{Error, Result};
pub use mask::Mask;
pub use shape::{MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};

pub use encoder::{
    encoder_block, feed_forward, Activation, EncoderConfig, EncoderWeights, FeedForwardWeights,
};
pub use linear::linear;
pub use mha::{cross_attention, multi_head_attention, MhaConfig, MhaWeights};
pub use norm::{layer_norm, LayerNormWeights};
pub use posenc::{add_positional_encoding, sinusoidal_table, PositionalEncoding};
pub use scores::{additive_scores, dot_product_scores, scaled_dot_product_scores, AdditiveWeights};
