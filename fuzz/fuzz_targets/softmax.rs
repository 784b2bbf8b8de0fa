//! Fused scale-mask-softmax against the reference on decoded hostile calls (see
//! `attn_tests::fuzz_decode`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = attn_tests::fuzz_decode::SoftmaxCase::decode(data);
    if let Err(e) = case.check(attn_kernels::softmax::scale_mask_softmax) {
        panic!("{e}");
    }
});
