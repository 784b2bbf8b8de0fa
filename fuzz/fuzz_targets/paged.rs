//! Paged attention (`PagedAttention`) over f32, bf16, f16 and int8 pools with shuffled,
//! shared and out-of-range pages, each sequence against the reference on the gathered cache.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = attn_tests::fuzz_decode::PagedCase::decode(data);
    if let Err(e) = case.check(|a, o| a.run(o)) {
        panic!("{e}");
    }
});
