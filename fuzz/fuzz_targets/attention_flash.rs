//! The flash (streaming) attention path, forced for every query count, against the reference.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = attn_tests::fuzz_decode::AttentionCase::decode(data);
    let isa = attn_kernels::arch::selected();
    if let Err(e) = case.check(|q, k, v, s, m, o, l, p| {
        attn_kernels::attention::flash(isa, q, k, v, s, m, o, l, p)
    }) {
        panic!("{e}");
    }
});
