//! SGEMM against the reference on decoded hostile calls (see `attn_tests::fuzz_decode`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = attn_tests::fuzz_decode::GemmCase::decode(data);
    if let Err(e) = case.check(attn_kernels::gemm::sgemm) {
        panic!("{e}");
    }
});
