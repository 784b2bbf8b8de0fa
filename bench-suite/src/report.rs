//! Rendering a finished run: Markdown tables (stdout and `report.md`), JSON lines, CSV. Ratios
//! against peers are computed here, from measurements of the same run only.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::machine::{Machine, COPY_L2_BYTES, COPY_L3_BYTES};
use crate::record::{Check, Measurement};

/// Everything a run produced.
pub struct Run<'a> {
    /// Machine figures.
    pub machine: &'a Machine,
    /// Measurements, in the order they were taken.
    pub measurements: &'a [Measurement],
    /// Correctness checks.
    pub checks: &'a [Check],
    /// Sections that were asked for but have no kernel yet.
    pub skipped: &'a [&'static str],
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// The command line.
    pub command: String,
    /// 1-minute load average at the start and at the end of the run, where the OS tells it.
    pub load: (Option<f64>, Option<f64>),
}

/// The 1-minute load average from `/proc/loadavg`, where there is one.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// Ratios of measurement `i` against every other implementation of the same op, shape and
/// thread count (peer median / this median: above 1 means `i` is faster), then against itself
/// on one thread (`"1 thread"`, the parallel speed-up) when `i` ran on more.
pub fn ratios(all: &[Measurement], i: usize) -> Vec<(String, f64)> {
    let me = &all[i];
    let mut out: Vec<(String, f64)> = all
        .iter()
        .filter(|o| {
            o.op == me.op && o.shape == me.shape && o.threads == me.threads && o.imp != me.imp
        })
        .map(|o| (o.imp.to_string(), o.stats.median_s / me.stats.median_s))
        .collect();
    if me.threads > 1 {
        if let Some(one) = all
            .iter()
            .find(|o| o.op == me.op && o.shape == me.shape && o.threads == 1 && o.imp == me.imp)
        {
            out.push(("1 thread".to_string(), one.stats.median_s / me.stats.median_s));
        }
    }
    out
}

/// The machine figures as JSON records.
fn machine_json(m: &Machine) -> Vec<Value> {
    let mut v = Vec::new();
    for &(t, g) in &m.fma_gflops {
        v.push(json!({"kind": "machine", "what": "fma_peak", "threads": t, "gflops": g,
                      "probe": m.probe.name(), "cpu": m.cpu, "isa": m.isa.name()}));
    }
    for &(t, g) in &m.copy_dram_gbs {
        v.push(json!({"kind": "machine", "what": "copy_bw_dram", "threads": t, "gbs": g,
                      "buffer_bytes": m.dram_bytes}));
    }
    for &(t, g) in &m.copy_l3_gbs {
        v.push(json!({"kind": "machine", "what": "copy_bw_l3", "threads": t, "gbs": g,
                      "buffer_bytes": COPY_L3_BYTES}));
    }
    for &(t, g) in &m.copy_l2_gbs {
        v.push(json!({"kind": "machine", "what": "copy_bw_l2", "threads": t, "gbs": g,
                      "buffer_bytes": COPY_L2_BYTES * t}));
    }
    v
}

/// Every record of the run as JSON objects: machine, checks, measurements.
pub fn records(run: &Run<'_>) -> Vec<Value> {
    let mut v = machine_json(run.machine);
    v.extend(run.checks.iter().map(Check::to_json));
    v.extend(
        run.measurements.iter().enumerate().map(|(i, m)| m.to_json(&ratios(run.measurements, i))),
    );
    v
}

/// JSON lines: one object per line.
pub fn json_lines(run: &Run<'_>) -> String {
    records(run).iter().map(|r| format!("{r}\n")).collect()
}

/// CSV: one header (every field that occurs, in order of first occurrence) and one row per
/// record. The `vs` ratios are written as `peer=ratio` pairs separated by `;`.
pub fn csv(run: &Run<'_>) -> String {
    let recs = records(run);
    let mut cols: Vec<String> = Vec::new();
    for r in &recs {
        if let Value::Object(o) = r {
            for k in o.keys() {
                if !cols.contains(k) {
                    cols.push(k.clone());
                }
            }
        }
    }
    let mut s = cols.join(",") + "\n";
    for r in &recs {
        let row: Vec<String> = cols
            .iter()
            .map(|c| match r.get(c) {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(x)) => csv_field(x),
                Some(Value::Object(o)) => csv_field(
                    &o.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";"),
                ),
                Some(x) => x.to_string(),
            })
            .collect();
        s += &row.join(",");
        s.push('\n');
    }
    s
}

fn csv_field(x: &str) -> String {
    if x.contains([',', '"', '\n']) {
        format!("\"{}\"", x.replace('"', "\"\""))
    } else {
        x.to_string()
    }
}

/// A Markdown table with padded columns.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([header[i].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    let line = |cells: Vec<String>| {
        let cells: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, &w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        format!("| {} |\n", cells.join(" | "))
    };
    let mut s = line(header.iter().map(|h| h.to_string()).collect());
    s += &line(widths.iter().map(|&w| "-".repeat(w)).collect());
    for r in rows {
        s += &line(r.clone());
    }
    s
}

/// The Markdown report: header, machine figures, checks, one table per section. `plots` are
/// `(section, file name)` pairs to link under their section.
pub fn markdown(run: &Run<'_>, plots: &[(String, String)]) -> String {
    let m = run.machine;
    let mut s = String::new();
    let _ = writeln!(s, "# attn-bench report\n");
    let _ = writeln!(
        s,
        "{} · {} · {} core(s) · kernels' ISA: {} · caches {} · threads {} · run took {:.0} s\n",
        utc_now(),
        m.cpu,
        m.cores,
        m.isa.name(),
        attn_kernels::arch::cache::detected(),
        if m.pinned { "pinned" } else { "NOT pinned" },
        run.seconds
    );
    let _ = writeln!(s, "Command: `{}`\n", run.command);
    if let (Some(a), Some(b)) = (run.load.0, run.load.1) {
        let _ = write!(
            s,
            "1-minute load average: {a:.1} at the start, {b:.1} at the end, on {} core(s).",
            m.cores
        );
        if a.max(b) > m.cores as f64 {
            s += " **The machine was busy during this run**: absolute figures understate an idle \
                  machine; ratios between implementations measured in the same run stay comparable.";
        }
        s += "\n\n";
    }

    let _ = writeln!(s, "## Machine (measured in this run)\n");
    let threads: Vec<usize> = m.fma_gflops.iter().map(|(t, _)| *t).collect();
    let mut header = vec!["figure".to_string()];
    header.extend(threads.iter().map(|t| format!("{t} thread{}", if *t == 1 { "" } else { "s" })));
    let row = |name: String, v: &[(usize, f64)]| {
        let mut r = vec![name];
        r.extend(v.iter().map(|(_, g)| format!("{g:.1}")));
        r
    };
    let mib = |b: usize| format!("{} MiB", b >> 20);
    let rows = vec![
        row(format!("FMA peak, GFLOP/s ({})", m.probe.name()), &m.fma_gflops),
        row(format!("copy, out of cache, GB/s ({0} → {0})", mib(m.dram_bytes)), &m.copy_dram_gbs),
        row(format!("copy, in L3, GB/s ({0} → {0})", mib(COPY_L3_BYTES)), &m.copy_l3_gbs),
        row(
            format!("copy, in L2, GB/s ({0} KiB → {0} KiB per thread)", COPY_L2_BYTES >> 10),
            &m.copy_l2_gbs,
        ),
    ];
    let hdr: Vec<&str> = header.iter().map(String::as_str).collect();
    s += &table(&hdr, &rows);
    s += "\nEach figure is the fastest repetition of its probe, best of the probes run at the start and before each section (the machine is shared: a probe can land in a busy moment). Copy bandwidth counts bytes read + written.\n\n";

    let failed: Vec<&Check> = run.checks.iter().filter(|c| !c.passed()).collect();
    let worst = run.checks.iter().map(|c| c.ratio).fold(0.0, f64::max);
    let _ = writeln!(
        s,
        "## Correctness against attn-reference\n\n{}/{} checks passed (largest error / derived bound: {:.3}).\n",
        run.checks.len() - failed.len(),
        run.checks.len(),
        worst
    );
    if !failed.is_empty() {
        let rows: Vec<Vec<String>> = failed
            .iter()
            .map(|c| {
                vec![
                    c.op.to_string(),
                    c.imp.to_string(),
                    c.shape.label(),
                    c.threads.to_string(),
                    format!("{:.3e}", c.max_err),
                    format!("{:.3e}", c.bound),
                    c.error.clone().unwrap_or_default(),
                ]
            })
            .collect();
        s += "**Failed:**\n\n";
        s += &table(&["op", "impl", "case", "threads", "max err", "bound", "error"], &rows);
        s += "\n";
    }

    let mut sections: Vec<&'static str> = Vec::new();
    for me in run.measurements {
        if !sections.contains(&me.op) {
            sections.push(me.op);
        }
    }
    for op in sections {
        let idx: Vec<usize> =
            (0..run.measurements.len()).filter(|&i| run.measurements[i].op == op).collect();
        let first = &run.measurements[idx[0]];
        let has_gbs = idx.iter().any(|&i| run.measurements[i].gbs.is_some());
        let _ = writeln!(s, "## {op}\n");
        let mut header = vec!["impl", "shape", "threads", "median", "±", first.unit.header()];
        if has_gbs {
            header.push("GB/s");
        }
        header.extend(["% peak", "of", "vs peers (same run; >1 = faster)"]);
        let rows: Vec<Vec<String>> = idx
            .iter()
            .map(|&i| {
                let me = &run.measurements[i];
                let mut r = vec![
                    me.imp.to_string(),
                    me.shape.label(),
                    me.threads.to_string(),
                    format_time(me.stats.median_s),
                    format!("{:.0}%", me.stats.spread() * 100.0),
                    format!("{:.2}", me.rate),
                ];
                if has_gbs {
                    r.push(me.gbs.map_or(String::new(), |g| format!("{g:.1}")));
                }
                r.push(format!("{:.0}%", me.pct_peak));
                r.push(me.peak.to_string());
                r.push(
                    ratios(run.measurements, i)
                        .iter()
                        .map(|(p, x)| format!("{p} {x:.2}×"))
                        .collect::<Vec<_>>()
                        .join(", "),
                );
                r
            })
            .collect();
        s += &table(&header, &rows);
        s += "\n";
        for (_, file) in plots.iter().filter(|(sec, _)| sec == op) {
            let _ = writeln!(s, "![{file}]({file})\n");
        }
    }
    for op in run.skipped {
        let _ = writeln!(s, "## {op}\n\nNot measured: this kernel is not in attn-kernels yet.\n");
    }
    s
}

/// Points of one plot line: `(size, rate)`.
pub type Points = Vec<(f64, f64)>;
/// One plot: the rate's unit and the lines by label.
pub type PlotGroup = (String, BTreeMap<String, Points>);

/// Groups the plottable measurements: group name → series `"impl, N threads"` → (x, rate).
pub fn plot_groups(ms: &[Measurement]) -> BTreeMap<String, PlotGroup> {
    let mut groups: BTreeMap<String, PlotGroup> = BTreeMap::new();
    for m in ms {
        if let Some((g, x)) = &m.plot {
            let entry = groups
                .entry(g.clone())
                .or_insert_with(|| (m.unit.header().to_string(), BTreeMap::new()));
            let series =
                format!("{}, {} thread{}", m.imp, m.threads, if m.threads == 1 { "" } else { "s" });
            entry.1.entry(series).or_default().push((*x, m.rate));
        }
    }
    groups
}

fn format_time(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// The current UTC date and time, `YYYY-MM-DD HH:MM UTC` (no date library needed: days since
/// the epoch to a civil date, after Howard Hinnant's `civil_from_days`).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_commas() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("x\"y"), "\"x\"\"y\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn table_pads_columns() {
        let t = table(&["a", "bb"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "| a   | bb |\n| --- | -- |\n| xyz | 1  |\n");
    }
}
