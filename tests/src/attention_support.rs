//! Attention test helpers: a random problem description (sizes, layouts, GQA ratio, mask kind,
//! threads) that owns its buffers, and the error bound every attention path is held to.
//!
//! # The bound
//!
//! With `u = 2⁻²⁴` and scores `s_ij = scale·q_i·k_j + b_ij` (natural log domain), an f32 kernel
//! makes three kinds of error, and the bound adds them up per output element:
//!
//! 1. **Scores.** A length-`dk` dot product is off by at most `γ·dk·u·Σ_d |q_id||k_jd|`; the
//!    kernels also round `scale` into the query before the dot product,
//!    which costs a few `u·(|s_ij| + |b_ij|)` more. So
//!    `δ_i = γ·(dk + 4)·u · max_j (scale·Σ_d |q_id||k_jd| + |b_ij| + |s_ij|)` over visible `j`.
//! 2. **Probabilities.** A perturbation `δ_i` of the logits moves each `p_ij` by a relative
//!    `e^{2δ_i} − 1 ≈ 2δ_i` (once in the numerator, once through the normaliser). The exp itself
//!    is a few ulp, the running sum of `nk` positive terms and the rescales by `2^(m − m')`
//!    add at most `γ·(nk + 8)·u` relative.
//! 3. **P·V.** A sum of `nk` products is off by `γ·nk·u·Σ_j p_ij |v_jd|`.
//!
//! Every term is relative to `A_id = Σ_j p_ij |v_jd|` (computed in f64 from the reference
//! probabilities), so
//! `|ô_id − o_id| ≤ (2δ_i + γ·(2·nk + dk + 16)·u)·A_id + 2⁻¹²⁶ + f·Σ_j |v_jd|` (the last
//! terms: results in the subnormal range, and the weights below `e^(−64)` that every path,
//! flash, decode and unfused, flushes to 0, `f` =
//! [`flushed_weight`](crate::numerics::flushed_weight)), with `γ = 2`. For the logsumexp,
//! `|l̂se_i − lse_i| ≤ δ_i +
//! γ·(nk + 8)·u + u·|lse_i|`. Two kernels compared with each other get the sum of their bounds.

use attn_kernels::attention::Attention;
use attn_kernels::{Mask, Parallelism, Tensor4Layout, Variants};

use crate::fuzz_decode::VariantSpec;
use attn_reference::softmax::saturate_logit;
use attn_reference::{TensorMut, TensorRef};

pub use crate::numerics::{softcap_error, BF16_U, GAMMA, U};

/// How a mask is built for a case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MaskKind {
    /// No mask.
    None,
    /// Causal with this offset (`None`: `nk − nq`).
    Causal(Option<isize>),
    /// Random keep-mask where about `1/density` positions are dropped, plus one fully masked
    /// row per head when there are at least 2 queries; broadcast over heads when `broadcast`.
    Keep {
        /// 1 in `density` positions is masked.
        density: u32,
        /// Same mask for every head (head stride 0).
        broadcast: bool,
    },
    /// Random bias in `[−2, 2]` with some `−∞` entries and one fully `−∞` row per head.
    Bias,
}

/// A small xorshift generator: deterministic inputs from a proptest-chosen seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (0 is remapped).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let t = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * t
    }
    /// Uniform integer in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// One attention problem with owned, randomly filled operands.
#[derive(Clone, Debug)]
pub struct Case {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub hq: usize,
    /// K/V heads.
    pub hkv: usize,
    /// Queries.
    pub nq: usize,
    /// Keys.
    pub nk: usize,
    /// Query/key width.
    pub dk: usize,
    /// Value width.
    pub dv: usize,
    /// `[b, s, h, d]` storage (else `[b, h, s, d]`) for q, k, v and o.
    pub bshd: bool,
    /// Score scale.
    pub scale: f32,
    /// Mask kind.
    pub mask_kind: MaskKind,
    /// Query elements and layout.
    pub q: (Vec<f32>, Tensor4Layout),
    /// Key elements and layout.
    pub k: (Vec<f32>, Tensor4Layout),
    /// Value elements and layout.
    pub v: (Vec<f32>, Tensor4Layout),
    /// Output layout.
    pub o_layout: Tensor4Layout,
    /// Keep-mask elements (when the kind is `Keep`).
    pub keep: Vec<bool>,
    /// Bias elements (when the kind is `Bias`).
    pub bias: Vec<f32>,
    /// Layout of the keep-mask or bias.
    pub mask_layout: Tensor4Layout,
    /// Attention variants (none by default).
    pub variants: VariantSpec,
}

/// Storage layout of a `[batch, heads, seq, dim]` tensor, with `pad` unused elements after
/// every row (odd strides) and `lead` before the first element.
pub fn layout(bshd: bool, dims: [usize; 4], pad: usize, lead: usize) -> Tensor4Layout {
    let [b, h, s, d] = dims;
    let _ = b;
    let row = d + pad;
    let strides =
        if bshd { [s * h * row, row, h * row, 1] } else { [h * s * row, s * row, row, 1] };
    Tensor4Layout::strided(dims, strides, lead)
}

impl Case {
    /// Builds a case; values of q and k are uniform in `[−amp, amp]`, v in `[−1, 1]`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        seed: u64,
        batch: usize,
        hkv: usize,
        group: usize,
        nq: usize,
        nk: usize,
        dk: usize,
        dv: usize,
        bshd: bool,
        pad: usize,
        mask_kind: MaskKind,
        amp: f32,
    ) -> Self {
        let mut rng = Rng::new(seed);
        let hq = hkv * group;
        let mut fill = |l: Tensor4Layout, amp: f32| {
            let n = l.required_len().unwrap_or(0) + 3;
            // NaN in the padding: a kernel that reads outside the view shows it.
            let mut x = vec![f32::NAN; n];
            for b in 0..l.dims[0] {
                for h in 0..l.dims[1] {
                    for s in 0..l.dims[2] {
                        for d in 0..l.dims[3] {
                            x[l.index(b, h, s, d)] = rng.uniform(-amp, amp);
                        }
                    }
                }
            }
            (x, l)
        };
        let q = fill(layout(bshd, [batch, hq, nq, dk], pad, 1), amp);
        let k = fill(layout(bshd, [batch, hkv, nk, dk], pad, 2), amp);
        let v = fill(layout(!bshd, [batch, hkv, nk, dv], pad, 0), 1.0);
        let o_layout = layout(bshd, [batch, hq, nq, dv], pad, 1);
        let scale = attn_reference::attention::default_scale(dk);
        let mut keep = Vec::new();
        let mut bias = Vec::new();
        let mut mask_layout = Tensor4Layout::bhsd(batch, hq, nq, nk);
        match mask_kind {
            MaskKind::Keep { density, broadcast } => {
                if broadcast {
                    mask_layout =
                        Tensor4Layout::strided([batch, hq, nq, nk], [nq * nk, 0, nk, 1], 0);
                }
                let n = mask_layout.required_len().unwrap_or(0);
                keep = (0..n).map(|_| rng.below(u64::from(density.max(1))) != 0).collect();
                if nq >= 2 {
                    let i = (seed as usize) % nq;
                    for b in 0..batch {
                        for h in 0..hq {
                            for j in 0..nk {
                                keep[mask_layout.index(b, h, i, j)] = false;
                            }
                        }
                    }
                }
            }
            MaskKind::Bias => {
                let n = mask_layout.required_len().unwrap_or(0);
                bias =
                    (0..n)
                        .map(|_| {
                            if rng.below(7) == 0 {
                                f32::NEG_INFINITY
                            } else {
                                rng.uniform(-2.0, 2.0)
                            }
                        })
                        .collect();
                if nq >= 2 {
                    let i = (seed as usize / 3) % nq;
                    for b in 0..batch {
                        for h in 0..hq {
                            for j in 0..nk {
                                bias[mask_layout.index(b, h, i, j)] = f32::NEG_INFINITY;
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        Case {
            batch,
            hq,
            hkv,
            nq,
            nk,
            dk,
            dv,
            bshd,
            scale,
            mask_kind,
            q,
            k,
            v,
            o_layout,
            keep,
            bias,
            mask_layout,
            variants: VariantSpec::default(),
        }
    }

    /// The variants of this case as the kernels and the reference take them.
    pub fn variants(&self) -> Variants<'_> {
        self.variants.variants()
    }

    /// The mask view of this case.
    pub fn mask(&self) -> Mask<'_> {
        match self.mask_kind {
            MaskKind::None => Mask::None,
            MaskKind::Causal(offset) => Mask::Causal { offset },
            MaskKind::Keep { .. } => Mask::Keep { keep: &self.keep, layout: self.mask_layout },
            MaskKind::Bias => Mask::Bias { bias: &self.bias, layout: self.mask_layout },
        }
    }

    /// Operand views.
    pub fn qkv(&self) -> (TensorRef<'_>, TensorRef<'_>, TensorRef<'_>) {
        (
            TensorRef::new(&self.q.0, self.q.1),
            TensorRef::new(&self.k.0, self.k.1),
            TensorRef::new(&self.v.0, self.v.1),
        )
    }

    /// A fresh output buffer, NaN-filled (so unwritten elements show), with its length.
    pub fn output(&self) -> Vec<f32> {
        vec![f32::NAN; self.o_layout.required_len().unwrap_or(0) + 2]
    }

    /// Runs an attention entry point `f` on this case; returns the output buffer and lse.
    pub fn run<F>(&self, f: F) -> (Vec<f32>, Vec<f32>)
    where
        F: FnOnce(
            TensorRef<'_>,
            TensorRef<'_>,
            TensorRef<'_>,
            f32,
            &Mask<'_>,
            TensorMut<'_>,
            Option<&mut [f32]>,
        ) -> attn_reference::Result<()>,
    {
        let (q, k, v) = self.qkv();
        let mut o = self.output();
        let mut lse = vec![f32::NAN; self.batch * self.hq * self.nq];
        let mask = self.mask();
        f(q, k, v, self.scale, &mask, TensorMut::new(&mut o, self.o_layout), Some(&mut lse))
            .expect("attention call failed on a valid case");
        (o, lse)
    }

    /// Runs the kernels' [`Attention`] problem of this case (its operands, scale and mask, a
    /// logsumexp output, `par`) through `f`, which may set more (path, ISA) and runs it on the
    /// output; returns the output buffer and lse.
    pub fn run_kernel<F>(&self, par: Parallelism, f: F) -> (Vec<f32>, Vec<f32>)
    where
        F: FnOnce(Attention<'_>, TensorMut<'_>) -> attn_reference::Result<()>,
    {
        self.run(|q, k, v, s, m, o, l| {
            let a = Attention::new(q, k, v)
                .scale(s)
                .mask(*m)
                .variants(self.variants())
                .parallelism(par);
            f(with_lse(a, l), o)
        })
    }

    /// The reference result (with the case's variants).
    pub fn reference(&self) -> (Vec<f32>, Vec<f32>) {
        let variants = self.variants();
        self.run(|q, k, v, s, m, o, l| {
            attn_reference::attention::attention_with_variants(q, k, v, s, m, &variants, o, l)
        })
    }

    /// Per-element bounds `(output bound for each (b, h, i, d) in o_layout order, lse bound for
    /// each (b, h, i))`, from the module docs' analysis. With variants, each visible logit is
    /// `softcap(scale·q·k) + mask + alibi` as the reference computes it; the ALiBi term's two
    /// roundings (distance to f32, product) are covered by counting `|alibi|` in the
    /// magnitude, and a softcap `c` adds [`softcap_error`] to `δ_i`.
    pub fn bounds(&self) -> (Vec<f64>, Vec<f64>) {
        self.bounds_for(false, false)
    }

    /// [`bounds`](Self::bounds) for the flash path on `vdpbf16ps` (`HalfPath::Dot`, bf16
    /// operands), which adds (derivation in `attn_kernels::attention::Attention`'s docs):
    /// - the rounding of the probabilities to bf16 before `P·V`: `2⁻⁸` relative to
    ///   `A_id = Σ_j p_ij |v_jd|` (with the other relative terms taken on the rounded weights,
    ///   `1 + 2⁻⁸` times as large);
    /// - the instruction's flushing: `scale·2⁻¹²⁶·(dk + 1 + Σ_d (|q_id| + |k_jd|))` on each
    ///   score (in `δ_i`), `2⁻¹²⁶·(nk + 2)` on each output.
    pub fn bounds_dot(&self) -> (Vec<f64>, Vec<f64>) {
        self.bounds_for(true, true)
    }

    /// [`bounds`](Self::bounds) for the decode path on `vdpbf16ps` (`HalfPath::Dot`, bf16
    /// operands, even `dk`), which runs only the scores on the instruction: the flushing term
    /// of [`bounds_dot`](Self::bounds_dot) on each score, and `P·V` in f32 as on the f32 path.
    pub fn bounds_dot_scores(&self) -> (Vec<f64>, Vec<f64>) {
        self.bounds_for(true, false)
    }

    /// `dot`: the scores flush as `vdpbf16ps` does; `dot_pv`: so does `P·V`, on probabilities
    /// rounded to bf16.
    fn bounds_for(&self, dot: bool, dot_pv: bool) -> (Vec<f64>, Vec<f64>) {
        let flush = f64::from(f32::MIN_POSITIVE);
        let (q, k, v) = self.qkv();
        let mask = self.mask();
        let var = self.variants();
        let group = self.hq / self.hkv;
        let scale = f64::from(self.scale);
        let off = Variants::offset(&mask, self.nq, self.nk);
        let cap =
            |s: f64| self.variants.softcap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh());
        let mut ob = vec![0.0; self.batch * self.hq * self.nq * self.dv];
        let mut lb = vec![0.0; self.batch * self.hq * self.nq];
        for b in 0..self.batch {
            for h in 0..self.hq {
                let kh = h / group;
                let slope = var.alibi.map_or(0.0, |a| f64::from(a[h]));
                for i in 0..self.nq {
                    let mut logits = Vec::with_capacity(self.nk + 1);
                    let (mut mag, mut flushed_dot): (f64, f64) = (0.0, 0.0);
                    for j in 0..self.nk {
                        let in_window = var.window.is_none_or(|w| w.contains(i, j, off));
                        let t = mask.term(b, h, i, j, self.nq, self.nk).filter(|_| in_window);
                        let (mut dot, mut abs, mut l1) = (0.0f64, 0.0f64, 0.0f64);
                        for d in 0..self.dk {
                            let (x, y) =
                                (f64::from(q.at(b, h, i, d)), f64::from(k.at(b, kh, j, d)));
                            dot += x * y;
                            abs += (x * y).abs();
                            l1 += x.abs() + y.abs();
                        }
                        let alibi = slope * (j as f64 - i as f64 - off as f64);
                        let logit =
                            |t: f32| saturate_logit(cap(scale * dot) + f64::from(t) + alibi);
                        logits.push(t.map(logit));
                        if let Some(t) = t {
                            let s = logit(t);
                            if s.is_finite() {
                                mag = mag
                                    .max(scale * abs + f64::from(t).abs() + s.abs() + alibi.abs());
                                flushed_dot = flushed_dot.max(l1);
                            }
                        }
                    }
                    if let Some(s) = var.sinks {
                        logits.push(Some(f64::from(s[h])));
                    }
                    let (p, lse) = attn_reference::softmax::softmax_row(&logits);
                    let mut delta = GAMMA * (self.dk as f64 + 4.0) * U * mag
                        + self.variants.softcap.map_or(0.0, |c| softcap_error(f64::from(c)));
                    if dot {
                        delta += scale.abs() * flush * (self.dk as f64 + 1.0 + flushed_dot);
                    }
                    let mut rel =
                        2.0 * delta + GAMMA * (2.0 * self.nk as f64 + self.dk as f64 + 16.0) * U;
                    let mut abs_extra = 0.0;
                    if dot_pv {
                        rel = rel * (1.0 + BF16_U) + BF16_U;
                        abs_extra = flush * (self.nk as f64 + 2.0);
                    }
                    let row = (b * self.hq + h) * self.nq + i;
                    for d in 0..self.dv {
                        let vd = |j: usize| f64::from(v.at(b, kh, j, d)).abs();
                        let a: f64 = (0..self.nk).map(|j| p[j] * vd(j)).sum();
                        // Every path (flash, decode, unfused) flushes weights below e^(−64)
                        // to 0, relative to a running max that is at most the row's, against a
                        // row sum ≥ 1: at most that much of each visible |v|.
                        let flushed: f64 =
                            (0..self.nk).filter(|&j| logits[j].is_some()).map(vd).sum();
                        ob[row * self.dv + d] = rel * a
                            + abs_extra
                            + f64::from(f32::MIN_POSITIVE)
                            + crate::numerics::flushed_weight() * flushed;
                    }
                    lb[row] = delta + GAMMA * (self.nk as f64 + 8.0) * U + U * lse.abs();
                }
            }
        }
        (ob, lb)
    }
}

/// Checks `got` against `want` element by element within `bounds` (+`bounds2` when comparing
/// two kernels); NaN must match NaN, −∞ must match −∞ exactly. Returns a description of the
/// first violation.
pub fn compare(
    case: &Case,
    what: &str,
    got: &(Vec<f32>, Vec<f32>),
    want: &(Vec<f32>, Vec<f32>),
    bounds: &(Vec<f64>, Vec<f64>),
    factor: f64,
) -> Result<(), String> {
    let l = case.o_layout;
    for b in 0..case.batch {
        for h in 0..case.hq {
            for i in 0..case.nq {
                let row = (b * case.hq + h) * case.nq + i;
                for d in 0..case.dv {
                    let idx = l.index(b, h, i, d);
                    let (x, y) = (got.0[idx], want.0[idx]);
                    let tol = factor * bounds.0[row * case.dv + d];
                    if !close(x, y, tol) {
                        return Err(format!(
                            "{what}: o[{b},{h},{i},{d}] = {x:e}, want {y:e} (tol {tol:e}); {}",
                            describe(case)
                        ));
                    }
                }
                let (x, y) = (got.1[row], want.1[row]);
                let tol = factor * bounds.1[row];
                if !close(x, y, tol) {
                    return Err(format!(
                        "{what}: lse[{b},{h},{i}] = {x:e}, want {y:e} (tol {tol:e}); {}",
                        describe(case)
                    ));
                }
            }
        }
    }
    // Elements outside the output view must be untouched (still NaN).
    let mut inside = vec![false; got.0.len()];
    for b in 0..case.batch {
        for h in 0..case.hq {
            for i in 0..case.nq {
                for d in 0..case.dv {
                    inside[l.index(b, h, i, d)] = true;
                }
            }
        }
    }
    if let Some(p) = (0..got.0.len()).find(|&p| !inside[p] && !got.0[p].is_nan()) {
        return Err(format!("{what}: wrote outside the output view at {p}; {}", describe(case)));
    }
    Ok(())
}

fn close(x: f32, y: f32, tol: f64) -> bool {
    if x.is_nan() || y.is_nan() {
        return x.is_nan() && y.is_nan();
    }
    if x.is_infinite() || y.is_infinite() {
        return x == y;
    }
    (f64::from(x) - f64::from(y)).abs() <= tol
}

/// One-line description of a case for failure messages.
pub fn describe(c: &Case) -> String {
    format!(
        "batch {} hq {} hkv {} nq {} nk {} dk {} dv {} bshd {} mask {:?}",
        c.batch, c.hq, c.hkv, c.nq, c.nk, c.dk, c.dv, c.bshd, c.mask_kind
    )
}

/// The thread settings the tests run with.
pub fn par(threads: usize) -> Parallelism {
    Parallelism::threads(threads)
}

/// `a` with the logsumexp output `lse` when there is one (the harnesses carry it as an
/// option, the reference's argument).
pub fn with_lse<'a>(a: Attention<'a>, lse: Option<&'a mut [f32]>) -> Attention<'a> {
    match lse {
        Some(l) => a.lse(l),
        None => a,
    }
}

/// A batch's `(queries, keys)` lengths, the largest pair halved (keys to `n/2 + 1`, so a
/// sequence keeps a key) until `Σ hq·nq·nk·(dk + dv)` is at most `work`: the cap that keeps
/// the f64 reference of a proptest case fast.
pub fn cap_batch_work(lens: &mut [(usize, usize)], hq: usize, dk: usize, dv: usize, work: usize) {
    let total = |lens: &[(usize, usize)]| -> usize {
        lens.iter().map(|&(a, b)| hq * a * b * (dk + dv)).sum()
    };
    while total(lens) > work {
        let big = (0..lens.len()).max_by_key(|&s| lens[s].0 * lens[s].1).unwrap_or(0);
        lens[big] = (lens[big].0 / 2, lens[big].1 / 2 + 1);
    }
}

/// The variants a batch proptest draws (`window`, `softcap`, whether sinks and ALiBi are on)
/// made concrete for `hq` heads: sinks uniform in `[−3, 3]` from `seed`, the standard slopes.
pub fn drawn_variants(
    seed: u64,
    hq: usize,
    (window, softcap, sinks, alibi): (Option<(usize, usize)>, Option<f32>, bool, bool),
) -> VariantSpec {
    let mut rng = Rng::new(seed ^ 0xBA7C);
    VariantSpec {
        window,
        softcap,
        sinks: sinks.then(|| (0..hq).map(|_| rng.uniform(-3.0, 3.0)).collect()),
        alibi: alibi.then(|| attn_kernels::alibi_slopes(hq)),
    }
}
