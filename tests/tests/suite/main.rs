//! The workspace's tests in one binary (`cargo test -p attn-tests --test suite`): one module per
//! kernel family or concern, sharing one build of the kernels, the reference and proptest. As
//! thirty separate binaries each linked its own optimised copy, and their build took most of
//! CI's time. Run one module with a filter: `cargo test -p attn-tests --test suite -- paged::`.

mod additive;
mod attention;
mod attention_dtypes;
mod c_abi;
mod convert;
mod exp;
mod fuzz_equiv;
mod gemm;
mod gemm_dtypes;
mod golden;
mod hostile;
mod layers;
mod layers_dtypes;
mod layers_support;
mod math;
mod paged;
mod quant;
mod reference_batch;
mod reference_errors;
mod reference_layers;
mod reference_properties;
mod reference_variants;
mod softmax;
mod stress;
mod thread_counts;
mod variants;
mod varlen;
