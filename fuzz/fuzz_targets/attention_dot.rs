//! The flash and decode paths on `vdpbf16ps` (`HalfPath::Dot`: bf16 Q, K and V, the `avx512`
//! ISA) against the reference within each path's bound, the path picked by the input's last
//! byte. It needs a CPU with AVX512_BF16: elsewhere every input returns at once (the proptest
//! twins, `fuzz_attention_dtypes_dot` and `fuzz_attention_dtypes_dot_decode`, say they
//! skipped).
#![no_main]

use attn_kernels::attention::{Attention, Path};
use attn_kernels::gemm::{bf16_dot_available, HalfPath};
use attn_reference::TensorMut;
use libfuzzer_sys::fuzz_target;

/// The kernel on `path` with `HalfPath::Dot`.
fn run(a: Attention<'_>, path: Path, o: TensorMut<'_>) -> attn_reference::Result<()> {
    a.isa(attn_kernels::Isa::Avx512).path(path).half_path(HalfPath::Dot).run(o)
}

fuzz_target!(|data: &[u8]| {
    if !bf16_dot_available() {
        return;
    }
    let case = attn_tests::fuzz_decode::DtypeAttentionCase::decode_dot(data);
    let checked = if data.last().is_some_and(|b| b & 1 == 1) {
        case.check_scores_dot(|a, o| run(a, Path::Decode, o))
    } else {
        case.check(|a, o| run(a, Path::Flash, o))
    };
    if let Err(e) = checked {
        panic!("{e}");
    }
});
