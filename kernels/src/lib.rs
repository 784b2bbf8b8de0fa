//! # attn-kernels: SIMD CPU kernels for transformer self-attention
//!
//! Layers, from the bottom:
//! - [`arch`]: CPU feature detection and the cached ISA choice (AVX-512F, AVX2+FMA, portable),
//!   and the one vector trait every kernel is written in, with its `vectorize` dispatch;
//! - [`par`]: the threading policy shared by all kernels;
//! - [`gemm`]: cache-blocked SGEMM (loop nest, packing, per-ISA micro-kernels);
//! - [`math`]: elementwise functions with stated error bounds: the exp family, GELU;
//! - [`softmax`]: fused scale-mask-softmax, log-softmax and logsumexp;
//! - [`attention`]: flash-style streaming attention and the decode path;
//! - [`batch`]: packed variable-length batches and paged K/V cache writes;
//! - [`layers`]: multi-head and cross-attention, the encoder block, layer norm, positional
//!   encodings;
//! - [`ffi`]: the C ABI (`include/attn_kernels.h`).
//!
//! The vocabulary (strided views, masks, errors and argument checks, layer configs and
//! weights) is the `attn-core` crate's, re-exported here whole: the naive reference
//! (`attn-reference`) takes the same types and runs the same checks, so a call that it rejects
//! is rejected here with the same error. The product does not link the reference.
#![deny(unsafe_op_in_unsafe_fn)]
// Module docs describe the internals (the vector trait, the exp family) for maintainers, who
// read them with `cargo doc --document-private-items`, where these links resolve.
#![allow(rustdoc::private_intra_doc_links)]
#![warn(missing_docs)]

pub mod arch;
pub mod attention;
pub mod batch;
pub mod gemm;
pub mod math;
pub mod par;
pub mod softmax;

pub use arch::Isa;
pub use attn_core::{alibi_slopes, Variants, Window};
pub use attn_core::{bf16, f16, DType, Element};
pub use attn_core::{
    check_attention, check_eps, checked_product, default_scale, expect_dim, expect_finite,
    Activation, EncoderConfig, EncoderWeights, Error, FeedForwardWeights, LayerNormWeights, Mask,
    MatLayout, MatMut, MatRef, MhaConfig, MhaWeights, PositionalEncoding, Result, Tensor4Layout,
    TensorMut, TensorRef,
};
pub use attn_core::{quantize_q8, AnyMut, AnyRef, KvRef, Q8Mut, Q8Ref};
pub use par::Parallelism;
pub mod ffi;
pub mod layers;
