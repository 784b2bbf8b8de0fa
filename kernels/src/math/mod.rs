//! Elementwise math of the kernels beyond the exp: the GELU activation (tanh form).
//!
//! Each function states its error bound as published constants that the tests' bounds are
//! built from. The exp family still lives in [`crate::softmax`] (`EXP_MAX_ULP`,
//! `SOFTMAX_EXP_MAX_ULP`).

mod gelu;

pub use gelu::{gelu_tanh, gelu_tanh_with_isa, GELU_TANH_ARG_ROUNDINGS, GELU_TANH_OUT_ROUNDINGS};
