//! Attention (an `attention::Attention` problem on its default path: decode for ≤ 16 queries,
//! flash otherwise) against the reference on decoded hostile calls (see
//! `attn_tests::fuzz_decode`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = attn_tests::fuzz_decode::AttentionCase::decode(data);
    if let Err(e) = case.check(|a, o| a.run(o)) {
        panic!("{e}");
    }
});
