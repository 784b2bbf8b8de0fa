//! Smoke test of the report binary: `attn-bench --quick --format json` must exit successfully,
//! print only well-formed JSON lines, include the machine figures, at least one correctness
//! check and one measurement per section it ran (the layers section included), and every check
//! must have passed.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

fn run(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_attn-bench"))
        .args(args)
        .output()
        .expect("the attn-bench binary runs");
    (
        out.status,
        String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    )
}

#[test]
fn quick_json_report_parses_and_every_check_passes() {
    let (status, stdout, stderr) = run(&["--quick", "--format", "json"]);
    assert!(status.success(), "attn-bench failed ({status}); stderr:\n{stderr}");
    assert!(!stderr.is_empty(), "progress is expected on stderr");

    let records: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let kind = |r: &Value| r["kind"].as_str().unwrap_or("").to_string();

    let machine: Vec<&Value> = records.iter().filter(|r| kind(r) == "machine").collect();
    assert!(
        machine
            .iter()
            .any(|r| r["what"] == "fma_peak" && r["gflops"].as_f64().is_some_and(|g| g > 0.0)),
        "no FMA peak among {machine:?}"
    );
    assert!(machine
        .iter()
        .any(|r| r["what"] == "copy_bw_dram" && r["gbs"].as_f64().is_some_and(|g| g > 0.0)));

    let checks: Vec<&Value> = records.iter().filter(|r| kind(r) == "check").collect();
    assert!(!checks.is_empty(), "no correctness check in the output");
    for c in &checks {
        assert_eq!(c["check"], "pass", "failed check: {c}");
        assert!(c["op"].is_string() && c["impl"].is_string(), "{c}");
        let (err, bound) = (c["max_err"].as_f64().unwrap(), c["bound"].as_f64().unwrap());
        assert!(err <= bound || err == 0.0, "{c}");
    }

    let measurements: Vec<&Value> = records.iter().filter(|r| kind(r) == "measurement").collect();
    let ops: BTreeSet<&str> = measurements.iter().filter_map(|m| m["op"].as_str()).collect();
    let checked: BTreeSet<&str> = checks.iter().filter_map(|c| c["op"].as_str()).collect();
    assert!(ops.contains("gemm"), "no gemm measurement");
    assert_eq!(ops, checked, "every section that was timed was also checked");
    // The layers section times both layers, and checks every implementation it times but the
    // reference (which is what it is checked against).
    let layers: Vec<&&Value> = measurements.iter().filter(|m| m["op"] == "layers").collect();
    for layer in ["mha", "encoder"] {
        assert!(layers.iter().any(|m| m["layer"] == layer), "no {layer} layer measured");
    }
    for m in layers.iter().filter(|m| m["impl"] != "reference") {
        let imp = &m["impl"];
        assert!(
            checks.iter().any(|c| c["op"] == "layers" && &c["impl"] == imp),
            "layers: {imp} timed but not checked"
        );
    }
    for m in &measurements {
        for key in ["op", "impl", "threads", "median_s", "pct_peak"] {
            assert!(!m[key].is_null(), "measurement without `{key}`: {m}");
        }
        assert!(m["median_s"].as_f64().unwrap() > 0.0, "{m}");
        let rate = ["gflops", "gelem_s", "gbs"].iter().find_map(|k| m[*k].as_f64());
        assert!(rate.is_some_and(|r| r > 0.0), "measurement without a rate: {m}");
        let shape_ok = match m["op"].as_str().unwrap() {
            "gemm" => ["m", "n", "k"].iter().all(|k| m[*k].is_u64()),
            "layers" => ["layer", "batch", "n", "d_model", "heads", "kv_heads", "mask"]
                .iter()
                .all(|k| !m[*k].is_null()),
            _ => ["batch", "heads", "nq", "nk", "mask"].iter().all(|k| !m[*k].is_null()),
        };
        assert!(shape_ok, "measurement without its shape fields: {m}");
        assert!(m["vs"].is_object(), "{m}");
    }
}

#[test]
fn bad_arguments_are_rejected() {
    let (status, _, stderr) = run(&["--only", "nonsense"]);
    assert!(!status.success());
    assert!(stderr.contains("nonsense"), "{stderr}");
    let (status, _, _) = run(&["--threads", "0"]);
    assert!(!status.success());
}
