//! Layers for engines: the seed's modules built on the kernels, each taking caller-owned weights.
//!
//! - [`mod@linear`]: `y = x·W + b` on [`crate::gemm::gemm`];
//! - [`norm`]: layer norm over the last dimension;
//! - [`posenc`]: sinusoidal and learned positional encodings;
//! - [`mha`]: `MultiHeadAttention` (self-attention, GQA/MQA) and `CrossAttention`: projections
//!   on the GEMM, heads on the [`Attention`](crate::attention::Attention) kernel;
//! - [`encoder`]: the two-layer feed-forward and the post-norm encoder block.
//!
//! Shapes and weights are the reference crate's descriptors ([`MhaConfig`], [`MhaWeights`],
//! [`EncoderConfig`], [`EncoderWeights`], [`FeedForwardWeights`], [`LayerNormWeights`]), so a
//! layer is set up once and run by either crate, and every call rejects what the reference
//! rejects with the same [`Error`](crate::Error).
//!
//! Every layer that needs intermediate activations comes in two forms: a `*_workspace_len`
//! function that says how many `f32`s a call needs, a `*_in` call that takes them as a
//! caller-owned `&mut [f32]` and allocates no activation buffer (an error if the slice is too
//! short), and the allocating form that sizes a buffer with the former and calls the latter. The
//! two forms run the same code on the same data, so their results are bitwise equal.
//!
//! Weights and activations are f32, bf16 or f16 (engines keep both in half precision): every
//! layer widens them exactly where it reads them (mostly in the GEMM's packing), computes in
//! f32 in the workspace, and rounds each half-precision output once. The weight descriptors
//! take the element type as a parameter (`MhaWeights<'_, bf16>`); a layer's activations may
//! have another type than its weights (f32 activations over bf16 weights, for one).

#[macro_use]
mod forms;
pub(crate) mod kernel_calls;
mod workspace;

pub mod encoder;
pub mod linear;
pub mod mha;
pub mod norm;
pub mod posenc;

pub use attn_core::{
    Activation, EncoderConfig, EncoderWeights, FeedForwardWeights, LayerNormWeights, MhaConfig,
    MhaWeights, PositionalEncoding, Variants,
};
pub use attn_core::{MatMut, MatRef, TensorMut, TensorRef};
pub use encoder::{
    encoder_block, encoder_block_in, encoder_workspace_len, feed_forward, feed_forward_in,
    feed_forward_workspace_len, EncoderLayer,
};
pub use linear::linear;
pub use mha::{
    cross_attention, cross_attention_in, mha_workspace_len, multi_head_attention,
    multi_head_attention_in, CrossAttention, MultiHeadAttention,
};
pub use norm::layer_norm;
pub use posenc::{add_positional_encoding, sinusoidal_table};
