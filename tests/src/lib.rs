//! Shared helpers for the workspace tests: input generators, tolerance bounds from error
//! analysis, and guard-banded buffers.
pub mod attention_support;
pub mod fuzz_decode;
pub mod gemm_support;
pub mod reference_support;
