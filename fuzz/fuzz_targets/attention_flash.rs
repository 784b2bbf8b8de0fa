//! The flash (streaming) attention path, forced for every query count, against the reference.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = attn_tests::fuzz_decode::AttentionCase::decode(data);
    let path = attn_kernels::attention::Path::Flash;
    if let Err(e) = case.check(|a, o| a.path(path).run(o)) {
        panic!("{e}");
    }
});
