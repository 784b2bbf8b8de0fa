//! Shared helpers for the workspace tests: input generators, tolerance bounds from error
//! analysis, and guard-banded buffers.
pub mod attention_support;
pub mod fuzz_decode;
pub mod gemm_support;
pub mod numerics;
pub mod reference_support;

use attn_kernels::Isa;

/// The ISAs this CPU can run, printing once per `suite` (a module of the test binary) each ISA
/// it cannot, so that a run names the paths it left to another machine.
pub fn supported_isas(suite: &str) -> Vec<Isa> {
    static REPORTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let s = Isa::supported();
    let mut reported = REPORTED.lock().unwrap_or_else(|e| e.into_inner());
    if !reported.iter().any(|r| r == suite) {
        reported.push(suite.to_string());
        for isa in Isa::ALL.into_iter().filter(|i| !s.contains(i)) {
            eprintln!("{suite} tests: skipping {isa} (not supported by this CPU)");
        }
    }
    s
}
