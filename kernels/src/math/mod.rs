//! Elementwise math of the kernels, below the softmax and attention modules: the exp family
//! ([`exp`]), tanh, and the GELU activation (tanh form).
//!
//! Each function states its error bound as published constants that the tests' bounds are
//! built from ([`EXP_MAX_ULP`], [`SOFTMAX_EXP_MAX_ULP`], [`TANH_MAX_ULP`], [`TANH_RATIONAL_MAX_ULP`],
//! `GELU_TANH_*`).

pub mod exp;
mod gelu;
pub(crate) mod tanh;

pub use exp::{
    exp_slice, exp_slice_with_isa, softmax_exp_slice_with_isa, EXP_MAX_ULP, SOFTMAX_EXP_MAX_ULP,
};
pub use gelu::{gelu_tanh, gelu_tanh_with_isa, GELU_TANH_ARG_ROUNDINGS, GELU_TANH_OUT_ROUNDINGS};
pub use tanh::{
    tanh, tanh_rational, tanh_rational_with_isa, tanh_with_isa, TANH_MAX_ULP, TANH_RATIONAL_MAX_ULP,
};
