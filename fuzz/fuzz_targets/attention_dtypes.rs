//! Attention with Q in f32/bf16/f16 and K, V in f32/bf16/f16/int8, on every path the
//! dispatcher picks, against the reference on the exact values the stored elements represent.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = attn_tests::fuzz_decode::DtypeAttentionCase::decode(data);
    if let Err(e) = case.check(|a, o| a.run(o)) {
        panic!("{e}");
    }
});
