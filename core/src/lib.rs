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
//! | [`dtype`] | element types: the [`DType`] tag, the [`Element`] trait of `f32`, [`bf16`], [`f16`](struct@f16) |
//! | [`quant`] | the int8 K/V cache layout (blocks of 32 along `d`, one f32 scale each), its quantiser and dequantisation |
//! | [`error`] | the typed [`Error`], and the small checks every entry point runs |
//! | [`attention`](mod@attention) | the argument check of every attention call, the default scale |
//! | [`batch`] | packed variable-length batches (`cu_seqlens`) and the paged K/V cache |
//! | [`variants`] | attention variants on top of a mask: sliding window, softcap, sinks, ALiBi |
//! | [`layers`] | layer configs and caller-owned weights: MHA, feed-forward, layer norm, encoder, positional encodings |
//!
//! Views are generic over their element type, `f32` by default (`TensorRef<'_, bf16>`); the
//! kernels accumulate in f32 whatever the storage type.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod attention;
pub mod batch;
pub mod dtype;
pub mod error;
pub mod layers;
pub mod mask;
pub mod quant;
pub mod shape;
pub mod variants;

pub use attention::{check_attention, check_attention_any, default_scale, AnyMut, AnyRef, KvRef};
pub use batch::{packed_seq, PagePool, PagePoolMut, PagedKv, PagedKvMut, SeqOffsets};
pub use dtype::{bf16, f16, DType, Element};
pub use error::{checked_product, expect_dim, expect_finite, Error, Result};
pub use layers::{
    check_eps, Activation, EncoderConfig, EncoderWeights, FeedForwardWeights, LayerNormWeights,
    MhaConfig, MhaWeights, PositionalEncoding,
};
pub use mask::Mask;
pub use quant::{
    q8_blocks, q8_dequantize, q8_round_trip_bound, quantize_q8, quantize_q8_block, Q8Mut, Q8Ref,
    Q8_BLOCK,
};
pub use shape::{MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};
pub use variants::{alibi_slopes, Variants, Window};
