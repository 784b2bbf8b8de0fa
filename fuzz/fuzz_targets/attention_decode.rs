//! The decode (split keys, logsumexp merge) attention path on single-query calls over long key
//! sequences, against the reference.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = attn_tests::fuzz_decode::AttentionCase::decode_single_query(data);
    let path = attn_kernels::attention::Path::Decode;
    if let Err(e) = case.check(|a, o| a.path(path).run(o)) {
        panic!("{e}");
    }
});
