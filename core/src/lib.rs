//! # attn-core: the vocabulary of the attention kernels
//!
//! The types and checks that the naive reference (`attn-reference`) and the optimised kernels
//! (`attn-kernels`) share, so that both take the same arguments and reject the same inputs with
//! the same errors. Nothing here computes an operation.
//!
//! | module | what |
//! | --- | --- |
//! | [`shape`] | strided 2-D and 4-D views of flat slices ([`MatRef`], [`TensorRef`], …) and their bounds checks |
//! | [`mask`] | the attention mask ([`Mask`]): none, causal with offset, keep-mask, additive bias |
//! | [`error`] | the typed [`Error`], and the small checks every entry point runs |
//! | [`attention`](mod@attention) | the argument check of every attention call, the default scale |
//! | [`batch`] | packed variable-length batches (`cu_seqlens`) and the paged K/V cache |
//! | [`variants`] | attention variants on top of a mask: sliding window, softcap, sinks, ALiBi |
//! | [`layers`] | layer configs and caller-owned weights: MHA, feed-forward, layer norm, encoder, positional encodings |
//!
//! Every view is of `f32` today; half-precision element types and quantised K/V layouts belong
//! here too, beside the views that carry them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod attention;
pub mod batch;
pub mod error;
pub mod layers;
pub mod mask;
pub mod shape;
pub mod variants;

pub use attention::{check_attention, default_scale};
pub use batch::{packed_seq, PagedKv, SeqOffsets};
pub use error::{checked_product, expect_dim, expect_finite, Error, Result};
pub use layers::{
    check_eps, Activation, EncoderConfig, EncoderWeights, FeedForwardWeights, LayerNormWeights,
    MhaConfig, MhaWeights, PositionalEncoding,
};
pub use mask::Mask;
pub use shape::{MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};
pub use variants::{alibi_slopes, Variants, Window};
