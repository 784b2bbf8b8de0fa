//! What a run produces: measurements and correctness checks, with their shapes, and their JSON
//! form (the single source the JSON, CSV and table outputs are all rendered from).

use serde_json::{json, Map, Value};

use crate::harness::Stats;
use crate::machine::{Machine, PeakRef};

/// The shape of one benchmarked call.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// `C[m×n] = A[m×k]·B[k×n]`; `bt`: B is stored `n×k` row-major and read transposed (the
    /// `Q·Kᵀ` case), otherwise `k×n` row-major.
    Gemm {
        /// Rows of A and C.
        m: usize,
        /// Columns of B and C.
        n: usize,
        /// Inner dimension.
        k: usize,
        /// B read transposed.
        bt: bool,
    },
    /// Attention (and softmax over a score tensor `[batch, heads, nq, nk]`, where `kv_heads`,
    /// `dk` and `dv` are 0).
    Attn {
        /// Batch size.
        batch: usize,
        /// Query heads.
        heads: usize,
        /// K/V heads (GQA/MQA when fewer than `heads`).
        kv_heads: usize,
        /// Queries per head.
        nq: usize,
        /// Keys per head.
        nk: usize,
        /// Query/key width.
        dk: usize,
        /// Value width.
        dv: usize,
        /// "none" or "causal".
        mask: &'static str,
    },
    /// A transformer layer over `batch` sequences of `n` tokens of width `d_model`.
    Layer {
        /// "mha" (self-attention with its projections) or "encoder" (that attention in the
        /// post-norm block with a feed-forward).
        layer: &'static str,
        /// Batch size.
        batch: usize,
        /// Tokens per sequence.
        n: usize,
        /// Model width (of the input, the output and the concatenated heads).
        d_model: usize,
        /// Query heads, each `d_model / heads` wide.
        heads: usize,
        /// K/V heads (GQA/MQA when fewer than `heads`).
        kv_heads: usize,
        /// Feed-forward hidden width (0 for "mha").
        ff: usize,
        /// "none" or "causal".
        mask: &'static str,
    },
}

impl Shape {
    /// Human-readable label for the tables.
    pub fn label(&self) -> String {
        match *self {
            Shape::Gemm { m, n, k, bt } => format!("{m}×{n}×{k}{}", if bt { " Bᵀ" } else { "" }),
            Shape::Attn { batch, heads, kv_heads, nq, nk, dk, dv, mask } => {
                let mut s = String::new();
                if batch != 1 {
                    s += &format!("b{batch} ");
                }
                if dk == 0 {
                    // A score tensor for softmax.
                    if heads != 1 {
                        s += &format!("h{heads} ");
                    }
                    s += &format!("{nq}×{nk}");
                } else {
                    s += &format!("h{heads}");
                    if kv_heads != heads {
                        s += &format!("/kv{kv_heads}");
                    }
                    s += &if nq == nk { format!(" N{nq}") } else { format!(" nq{nq} nk{nk}") };
                    s += &if dk == dv { format!(" d{dk}") } else { format!(" dk{dk} dv{dv}") };
                }
                if mask != "none" {
                    s += &format!(" {mask}");
                }
                s
            }
            Shape::Layer { layer, batch, n, d_model, heads, kv_heads, ff, mask } => {
                let mut s = layer.to_string();
                if batch != 1 {
                    s += &format!(" b{batch}");
                }
                s += &format!(" N{n} d{d_model} h{heads}");
                if kv_heads != heads {
                    s += &format!("/kv{kv_heads}");
                }
                if ff != 0 {
                    s += &format!(" ff{ff}");
                }
                if mask != "none" {
                    s += &format!(" {mask}");
                }
                s
            }
        }
    }

    /// Adds the shape fields to a JSON object.
    fn add_fields(&self, o: &mut Map<String, Value>) {
        match *self {
            Shape::Gemm { m, n, k, bt } => {
                o.insert("m".into(), m.into());
                o.insert("n".into(), n.into());
                o.insert("k".into(), k.into());
                o.insert("b_layout".into(), (if bt { "transposed" } else { "row-major" }).into());
            }
            Shape::Attn { batch, heads, kv_heads, nq, nk, dk, dv, mask } => {
                o.insert("batch".into(), batch.into());
                o.insert("heads".into(), heads.into());
                if dk != 0 {
                    o.insert("kv_heads".into(), kv_heads.into());
                }
                o.insert("nq".into(), nq.into());
                o.insert("nk".into(), nk.into());
                if dk != 0 {
                    o.insert("dk".into(), dk.into());
                    o.insert("dv".into(), dv.into());
                }
                o.insert("mask".into(), mask.into());
            }
            Shape::Layer { layer, batch, n, d_model, heads, kv_heads, ff, mask } => {
                o.insert("layer".into(), layer.into());
                o.insert("batch".into(), batch.into());
                o.insert("n".into(), n.into());
                o.insert("d_model".into(), d_model.into());
                o.insert("heads".into(), heads.into());
                o.insert("kv_heads".into(), kv_heads.into());
                if ff != 0 {
                    o.insert("ff".into(), ff.into());
                }
                o.insert("mask".into(), mask.into());
            }
        }
    }
}

/// The unit of a measurement's rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// 10⁹ floating-point operations per second.
    Gflops,
    /// 10⁹ elements per second.
    GelemS,
    /// 10⁹ bytes per second.
    Gbs,
}

impl Unit {
    /// JSON field name of the rate.
    pub const fn key(self) -> &'static str {
        match self {
            Unit::Gflops => "gflops",
            Unit::GelemS => "gelem_s",
            Unit::Gbs => "gbs",
        }
    }

    /// Column header in the tables.
    pub const fn header(self) -> &'static str {
        match self {
            Unit::Gflops => "GFLOP/s",
            Unit::GelemS => "Gelem/s",
            Unit::Gbs => "GB/s",
        }
    }
}

/// One timed implementation at one shape and thread count.
#[derive(Clone, Debug)]
pub struct Measurement {
    /// Section (`gemm`, `softmax`, ...).
    pub op: &'static str,
    /// Implementation name (`attn-kernels`, `gemm`, `matrixmultiply`, `unfused`, `reference`).
    pub imp: &'static str,
    /// What was computed.
    pub shape: Shape,
    /// Threads the call was allowed.
    pub threads: usize,
    /// Timing summary.
    pub stats: Stats,
    /// Unit of `rate`.
    pub unit: Unit,
    /// Work per second at the median time.
    pub rate: f64,
    /// Bytes per second where the kernel's speed limit is memory (softmax, decode).
    pub gbs: Option<f64>,
    /// Percent of `peak`.
    pub pct_peak: f64,
    /// What `pct_peak` is relative to.
    pub peak: &'static str,
    /// The machine figure `pct_peak` is computed from (recomputed at the end of the run).
    pub peak_ref: PeakRef,
    /// Plot this point in the SVG of this group at this x (size), if any.
    pub plot: Option<(String, f64)>,
}

/// The outcome of comparing one implementation with the reference on a small case.
#[derive(Clone, Debug)]
pub struct Check {
    /// Section.
    pub op: &'static str,
    /// Implementation checked.
    pub imp: &'static str,
    /// The case.
    pub shape: Shape,
    /// Threads the call was allowed.
    pub threads: usize,
    /// Largest |result − reference|.
    pub max_err: f64,
    /// The error bound at the element where error/bound is largest.
    pub bound: f64,
    /// Largest error/bound over all elements (≤ 1 passes).
    pub ratio: f64,
    /// Set when the call itself failed (returned an error); the check then fails.
    pub error: Option<String>,
}

impl Check {
    /// True when the call succeeded and every element is within its bound.
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.ratio <= 1.0
    }

    /// The JSON record.
    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        o.insert("kind".into(), "check".into());
        o.insert("op".into(), self.op.into());
        o.insert("impl".into(), self.imp.into());
        self.shape.add_fields(&mut o);
        o.insert("threads".into(), self.threads.into());
        o.insert("check".into(), (if self.passed() { "pass" } else { "fail" }).into());
        o.insert("max_err".into(), finite(self.max_err));
        o.insert("bound".into(), finite(self.bound));
        o.insert("err_over_bound".into(), finite(self.ratio));
        if let Some(e) = &self.error {
            o.insert("error".into(), e.clone().into());
        }
        Value::Object(o)
    }
}

impl Measurement {
    /// Recomputes `pct_peak` against the machine's final figures.
    pub fn rebase(&mut self, machine: &Machine) {
        let p = machine.peak(self.peak_ref);
        self.pct_peak = 100.0 * self.gbs.unwrap_or(self.rate) / p.value;
        self.peak = p.what;
    }

    /// The JSON record; `vs` are the ratios against the peers of the same run (peer median
    /// time / this median time: above 1 means this implementation is faster).
    pub fn to_json(&self, vs: &[(String, f64)]) -> Value {
        let mut o = Map::new();
        o.insert("kind".into(), "measurement".into());
        o.insert("op".into(), self.op.into());
        o.insert("impl".into(), self.imp.into());
        self.shape.add_fields(&mut o);
        o.insert("threads".into(), self.threads.into());
        o.insert("median_s".into(), finite(self.stats.median_s));
        o.insert("q1_s".into(), finite(self.stats.q1_s));
        o.insert("q3_s".into(), finite(self.stats.q3_s));
        o.insert("min_s".into(), finite(self.stats.min_s));
        o.insert("reps".into(), self.stats.reps.into());
        o.insert(self.unit.key().into(), finite(self.rate));
        if let Some(g) = self.gbs {
            o.insert("gbs".into(), finite(g));
        }
        o.insert("pct_peak".into(), finite(self.pct_peak));
        o.insert("peak".into(), self.peak.into());
        let vs: Map<String, Value> = vs.iter().map(|(k, v)| (k.clone(), finite(*v))).collect();
        o.insert("vs".into(), Value::Object(vs));
        Value::Object(o)
    }
}

/// A JSON number, or null for NaN/∞ (which JSON cannot represent).
pub fn finite(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}
