//! The flash path on `vdpbf16ps` (`HalfPath::Dot`: bf16 Q, K and V, the `avx512` ISA) against
//! the reference within that path's bound. It needs a CPU with AVX512_BF16: elsewhere every
//! input returns at once (the proptest twin, `fuzz_attention_dtypes_dot`, says it skipped).
#![no_main]

use attn_kernels::attention::Path;
use attn_kernels::gemm::{bf16_dot_available, HalfPath};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if !bf16_dot_available() {
        return;
    }
    let case = attn_tests::fuzz_decode::DtypeAttentionCase::decode_dot(data);
    let checked = case.check(|a, o| {
        a.isa(attn_kernels::Isa::Avx512).path(Path::Flash).half_path(HalfPath::Dot).run(o)
    });
    if let Err(e) = checked {
        panic!("{e}");
    }
});
