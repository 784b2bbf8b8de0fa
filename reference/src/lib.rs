//! # attn-reference: the oracle
//!
//! Naive, obviously-correct implementations of every operation of the attention kernels
//! workspace. Plain loops, no SIMD, no unsafe, every sum accumulated in f64 and rounded to f32
//! once. Each function's doc comment states its formula and conventions. The optimised
//! `attn-kernels` crate is proven equivalent to these functions by property tests and fuzzing.
//!
//! The shape descriptors ([`shape`]), masks ([`mask`]), error type ([`error`]) and the layers'
//! config and weight descriptors ([`MhaConfig`], [`MhaWeights`], [`EncoderConfig`], …) are the
//! `attn-core` crate's, the vocabulary the kernels share; they are re-exported here so that a
//! caller of the reference needs one import.
//!
//! | module | operations |
//! | --- | --- |
//! | [`matmul`] | `C ← αAB + βC` on strided views |
//! | [`linear`](mod@linear) | `y = xW + b` |
//! | [`scores`] | dot product, scaled dot product, additive (Bahdanau) scores |
//! | [`softmax`](mod@softmax) | softmax, log-softmax, logsumexp, fused scale-mask-softmax |
//! | [`attention`](mod@attention) | `softmax(scale·QKᵀ + mask)·V` per batch and head, GQA/MQA, and the variants (window, softcap, sinks, ALiBi) |
//! | [`dtype`](mod@dtype) | the exact f64 values of bf16/f16 tensors and of int8-quantised K/V ([`dequantize_q8`]) |
//! | [`batch`] | packed variable-length batches (`cu_seqlens`) and the paged K/V cache, per sequence |
//! | [`mha`] | the seed's `MultiHeadAttention` and `CrossAttention` |
//! | [`posenc`] | sinusoidal and learned positional encodings |
//! | [`norm`] | layer norm |
//! | [`encoder`] | two-layer feed-forward, post-norm encoder block |
//!
//! Conventions shared by all: weights are `[in, out]` (`y = x·W`); activations of the layers
//! are `[batch, 1, seq, dim]` tensors ([`Tensor4Layout::batch_seq`]); a fully masked attention
//! row is zero with logsumexp −∞; zero-length sequences give empty outputs; every buffer the
//! reference allocates is allocated fallibly, so no input makes it panic.
//!
//! Work is proportional to the *logical* sizes. Zero-stride (broadcast) inputs can describe
//! huge logical operands with tiny slices, e.g. an inner dimension of 2⁶⁰ over one element;
//! the reference then loops that long. Callers feeding it arbitrary shapes (fuzzers) should
//! bound the dimensions.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod alloc;
pub mod attention;
pub mod batch;
pub mod dtype;
pub mod encoder;
pub mod linear;
pub mod matmul;
pub mod mha;
pub mod norm;
pub mod posenc;
pub mod scores;
pub mod softmax;

pub use attn_core::{error, mask, quant, shape, variants};
pub use dtype::{dequantize_q8, widen};

pub use error::{Error, Result};
pub use mask::Mask;
pub use shape::{MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};
pub use variants::Variants;

pub use encoder::{
    activate, encoder_block, feed_forward, Activation, EncoderConfig, EncoderWeights,
    FeedForwardWeights,
};
pub use linear::linear;
pub use mha::{cross_attention, multi_head_attention, MhaConfig, MhaWeights};
pub use norm::{layer_norm, LayerNormWeights};
pub use posenc::{add_positional_encoding, sinusoidal_table, PositionalEncoding};
pub use scores::{additive_scores, dot_product_scores, scaled_dot_product_scores, AdditiveWeights};
