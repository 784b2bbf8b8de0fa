//! Paged attention with `HalfPath::Dot` (bf16 queries and pools, the `avx512` ISA): decode
//! pieces run their scores on `vdpbf16ps`, prefill pieces both flash products, each sequence
//! against the reference on the gathered cache within its piece's bound. It needs a CPU with
//! AVX512_BF16: elsewhere every input returns at once (the proptest twin, `fuzz_paged_dot`,
//! says it skipped).
#![no_main]

use attn_kernels::gemm::{bf16_dot_available, HalfPath};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if !bf16_dot_available() {
        return;
    }
    let case = attn_tests::fuzz_decode::PagedCase::decode_dot(data);
    if let Err(e) =
        case.check(|a, o| a.isa(attn_kernels::Isa::Avx512).half_path(HalfPath::Dot).run(o))
    {
        panic!("{e}");
    }
});
