//! Packed variable-length attention (`VarlenAttention`) on hostile offsets, layouts and
//! settings, each sequence against the reference.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = attn_tests::fuzz_decode::VarlenCase::decode(data);
    if let Err(e) = case.check(|a, o| a.run(o)) {
        panic!("{e}");
    }
});
