//! Shared helpers for the workspace tests: input generators, tolerance bounds from error
//! analysis, and guard-banded buffers.
pub mod attention_support;
pub mod fuzz_decode;
pub mod gemm_support;
pub mod numerics;
pub mod reference_support;

use attn_kernels::Isa;

/// The ISAs this CPU can run, printing once per test binary (under `suite`) each ISA it cannot,
/// so that a run names the paths it left to another machine.
pub fn supported_isas(suite: &str) -> Vec<Isa> {
    static REPORT: std::sync::Once = std::sync::Once::new();
    let s = Isa::supported();
    REPORT.call_once(|| {
        for isa in Isa::ALL.into_iter().filter(|i| !s.contains(i)) {
            eprintln!("{suite} tests: skipping {isa} (not supported by this CPU)");
        }
    });
    s
}
