//! Additive (Bahdanau) attention (`attn_kernels::attention::AdditiveAttention`) against the
//! reference: the reference's additive scores (`attn_reference::additive_scores`, f64, one
//! rounding), its masked softmax row (`softmax_row`) and an f64 `P·V`, on every ISA this CPU
//! runs. The bound per element is `attn_tests::numerics::{additive_score_bound,
//! streamed_row_rel_bound, streamed_lse_bound}` (derivations there), plus the reference's own
//! rounding of each score. Also: a golden case checked by hand, exact cases, thread-count
//! invariance, and a table of bad inputs.

use attn_kernels::attention::{AdditiveAttention, AdditiveWeights};
use attn_kernels::{Error, Isa, Mask, MatLayout, MatRef, Parallelism, Tensor4Layout};
use attn_kernels::{TensorMut, TensorRef};
use attn_reference::softmax::{saturate_logit, softmax_row};
use attn_tests::attention_support::Rng;
use attn_tests::numerics::{additive_score_bound, streamed_lse_bound, streamed_row_rel_bound, U};
use attn_tests::supported_isas;
use proptest::prelude::*;

/// Mask kinds of a case.
#[derive(Clone, Copy, Debug)]
enum MaskKind {
    None,
    Causal(Option<isize>),
    /// Random keep-mask (1 in 3 dropped) plus a fully masked row 0 when `nq ≥ 2`.
    Keep,
    /// Random bias in `[−2, 2]`, some `−∞`, row 0 fully `−∞` when `nq ≥ 2`, and one `+∞` entry
    /// when `pos_inf`.
    Bias {
        pos_inf: bool,
    },
}

/// One problem, owning its buffers; `[b, h, s, d]` storage, `v` and the weights random.
#[derive(Debug)]
struct Case {
    dims: [usize; 9], // batch, hq, hkv, nq, nk, dq, dk, dv, da
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    w: Vec<f32>,
    mask: MaskKind,
    keep: Vec<bool>,
    bias: Vec<f32>,
}

impl Case {
    fn new(dims: [usize; 9], mask: MaskKind, seed: u64, amp: f32) -> Case {
        let [batch, hq, hkv, nq, nk, dq, dk, dv, da] = dims;
        let mut rng = Rng::new(seed);
        let mut fill = |n: usize, a: f32| (0..n).map(|_| rng.uniform(-a, a)).collect::<Vec<_>>();
        let q = fill(batch * hq * nq * dq, amp);
        let k = fill(batch * hkv * nk * dk, amp);
        let v = fill(batch * hkv * nk * dv, 1.0);
        let wq = fill(dq * da, 1.0);
        let wk = fill(dk * da, 1.0);
        let w = fill(da, 1.0);
        let n = batch * hq * nq * nk;
        let mut keep: Vec<bool> = (0..n).map(|_| rng.below(3) != 0).collect();
        let mut bias: Vec<f32> = (0..n)
            .map(|_| if rng.below(7) == 0 { f32::NEG_INFINITY } else { rng.uniform(-2.0, 2.0) })
            .collect();
        if nq >= 2 {
            for bh in 0..batch * hq {
                let row = bh * nq * nk;
                keep[row..row + nk].fill(false);
                bias[row..row + nk].fill(f32::NEG_INFINITY);
            }
        }
        if let MaskKind::Bias { pos_inf: true } = mask {
            if n > 0 {
                let at = rng.below(n as u64) as usize;
                bias[at] = f32::INFINITY;
            }
        }
        Case { dims, q, k, v, wq, wk, w, mask, keep, bias }
    }

    fn mask(&self) -> Mask<'_> {
        let [batch, hq, _, nq, nk, ..] = self.dims;
        let l = Tensor4Layout::bhsd(batch, hq, nq, nk);
        match self.mask {
            MaskKind::None => Mask::None,
            MaskKind::Causal(offset) => Mask::Causal { offset },
            MaskKind::Keep => Mask::Keep { keep: &self.keep, layout: l },
            MaskKind::Bias { .. } => Mask::Bias { bias: &self.bias, layout: l },
        }
    }

    fn views(&self) -> (TensorRef<'_>, TensorRef<'_>, TensorRef<'_>, AdditiveWeights<'_>) {
        let [batch, hq, hkv, nq, nk, dq, dk, dv, da] = self.dims;
        (
            TensorRef::new(&self.q, Tensor4Layout::bhsd(batch, hq, nq, dq)),
            TensorRef::new(&self.k, Tensor4Layout::bhsd(batch, hkv, nk, dk)),
            TensorRef::new(&self.v, Tensor4Layout::bhsd(batch, hkv, nk, dv)),
            AdditiveWeights {
                wq: MatRef::new(&self.wq, MatLayout::row_major(dq, da)),
                wk: MatRef::new(&self.wk, MatLayout::row_major(dk, da)),
                w: &self.w,
            },
        )
    }

    fn out_layout(&self) -> Tensor4Layout {
        let [batch, hq, _, nq, _, _, _, dv, _] = self.dims;
        Tensor4Layout::bhsd(batch, hq, nq, dv)
    }

    /// The kernel's output and logsumexps.
    fn run(&self, isa: Isa, par: Parallelism) -> (Vec<f32>, Vec<f32>) {
        let [batch, hq, _, nq, ..] = self.dims;
        let (q, k, v, w) = self.views();
        let mut o = vec![f32::NAN; self.out_layout().len()];
        let mut lse = vec![f32::NAN; batch * hq * nq];
        AdditiveAttention::new(q, k, v, w)
            .mask(self.mask())
            .lse(&mut lse)
            .parallelism(par)
            .isa(isa)
            .run(TensorMut::new(&mut o, self.out_layout()))
            .unwrap();
        (o, lse)
    }

    /// The reference's output and logsumexp (f64) with each element's bound.
    fn reference(&self) -> Vec<(f64, f64, f64, f64)> {
        let [batch, hq, hkv, nq, nk, dq, dk, dv, da] = self.dims;
        let (q, k, v, w) = self.views();
        let rw = attn_reference::AdditiveWeights { wq: w.wq, wk: w.wk, w: w.w };
        let mask = self.mask();
        // Per (b, h, i): (o_d, bound_d) for each d, then (lse, lse bound); flattened as
        // (value, bound, lse, lse bound) per output element, or per row when dv = 0.
        let mut out = Vec::new();
        for b in 0..batch {
            for h in 0..hq {
                let kh = h / (hq / hkv);
                let mut s = vec![0.0f32; nq * nk];
                attn_reference::additive_scores(
                    q.matrix(b, h),
                    k.matrix(b, kh),
                    &rw,
                    attn_kernels::MatMut::row_major(&mut s, nq, nk),
                )
                .unwrap();
                for i in 0..nq {
                    let mut delta: f64 = 0.0;
                    let mut logits = Vec::with_capacity(nk);
                    for j in 0..nk {
                        let t = mask.term(b, h, i, j, nq, nk);
                        logits.push(
                            t.map(|t| saturate_logit(f64::from(s[i * nk + j]) + f64::from(t))),
                        );
                        // Masked and ±∞ logits are matched exactly, not within a bound.
                        let Some(t) = t else { continue };
                        if !logits[j].is_some_and(f64::is_finite) {
                            continue;
                        }
                        let mut x = vec![0.0f64; da];
                        let (mut mq, mut mk) = (vec![0.0f64; da], vec![0.0f64; da]);
                        for a in 0..da {
                            for p in 0..dq {
                                let y =
                                    f64::from(q.at(b, h, i, p)) * f64::from(self.wq[p * da + a]);
                                x[a] += y;
                                mq[a] += y.abs();
                            }
                            for p in 0..dk {
                                let y =
                                    f64::from(k.at(b, kh, j, p)) * f64::from(self.wk[p * da + a]);
                                x[a] += y;
                                mk[a] += y.abs();
                            }
                        }
                        let sc = f64::from(s[i * nk + j]);
                        // The reference rounds its score once, the kernel adds the bias in f32.
                        let d = additive_score_bound(&self.w, &x, &mq, &mk, dq, dk)
                            + 2.0 * U * (sc.abs() + f64::from(t).abs());
                        delta = delta.max(d);
                    }
                    let (p, lse) = softmax_row(&logits);
                    let rel = streamed_row_rel_bound(delta, nk);
                    let lb = streamed_lse_bound(delta, nk, lse);
                    if dv == 0 {
                        out.push((f64::NAN, 0.0, lse, lb));
                    }
                    for d in 0..dv {
                        let (mut o, mut a) = (0.0f64, 0.0f64);
                        for (j, &pj) in p.iter().enumerate() {
                            if pj != 0.0 || pj.is_nan() {
                                let vv = f64::from(v.at(b, kh, j, d));
                                o += pj * vv;
                                a += pj * vv.abs();
                            }
                        }
                        out.push((o, rel * a + f64::from(f32::MIN_POSITIVE), lse, lb));
                    }
                }
            }
        }
        out
    }
}

/// Checks the kernel's result against the reference within the bounds; NaN must match NaN and
/// ±∞ must match exactly.
fn check(case: &Case, isa: Isa, par: Parallelism) -> std::result::Result<(), String> {
    let [_, _, _, nq, nk, _, _, dv, _] = case.dims;
    let (o, lse) = case.run(isa, par);
    let want = case.reference();
    let same = |got: f32, want: f64, bound: f64| {
        if want.is_nan() {
            got.is_nan()
        } else if want.is_infinite() {
            f64::from(got) == want
        } else {
            (f64::from(got) - want).abs() <= bound
        }
    };
    for (e, &(w, wb, l, lb)) in want.iter().enumerate() {
        let row = e.checked_div(dv).unwrap_or(e);
        if dv > 0 && !same(o[e], w, wb) {
            return Err(format!("{isa} nq {nq} nk {nk}: o[{e}] = {:e}, want {w:e} ± {wb:e}", o[e]));
        }
        if !same(lse[row], l, lb) {
            return Err(format!("{isa}: lse[{row}] = {:e}, want {l:e} ± {lb:e}", lse[row]));
        }
    }
    Ok(())
}

fn edge_size() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), Just(1), Just(2), 3usize..10, Just(16), Just(17), 18usize..40]
}

fn mask_kind() -> impl Strategy<Value = MaskKind> {
    prop_oneof![
        Just(MaskKind::None),
        Just(MaskKind::Causal(None)),
        Just(MaskKind::Causal(Some(0))),
        (-5isize..5).prop_map(|o| MaskKind::Causal(Some(o))),
        Just(MaskKind::Keep),
        Just(MaskKind::Bias { pos_inf: false }),
        Just(MaskKind::Bias { pos_inf: true }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn matches_reference(
        (batch, (hq, hkv)) in (1usize..3, prop_oneof![Just((1usize, 1usize)), Just((2, 1)), Just((2, 2)), Just((3, 1))]),
        nq in edge_size(),
        nk in prop_oneof![edge_size(), 250usize..270],
        (dq, dk, dv) in (0usize..5, 0usize..5, prop_oneof![Just(0usize), Just(1), 2usize..20]),
        da in prop_oneof![Just(0usize), Just(1), 2usize..20, Just(33)],
        mask in mask_kind(),
        amp in prop_oneof![Just(1.0f32), Just(30.0)],
        seed in any::<u64>(),
        threads in 1usize..3,
    ) {
        let case = Case::new([batch, hq, hkv, nq, nk, dq, dk, dv, da], mask, seed, amp);
        for isa in supported_isas("additive") {
            check(&case, isa, Parallelism::threads(threads)).map_err(TestCaseError::fail)?;
        }
    }
}

#[test]
fn same_bits_for_every_thread_count() {
    let case = Case::new([2, 2, 1, 37, 300, 3, 5, 7, 9], MaskKind::Causal(None), 7, 1.0);
    for isa in supported_isas("additive") {
        let one = case.run(isa, Parallelism::Sequential);
        let two = case.run(isa, Parallelism::threads(2));
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&one.0), bits(&two.0), "{isa}: output");
        assert_eq!(bits(&one.1), bits(&two.1), "{isa}: lse");
    }
}

/// By hand: one query `q = 0.5`, keys `k = 0, −0.5`, `Wq = Wk = [1]`, `w = [2]`: the
/// pre-activations are 0.5 and 0, the scores `2·tanh(0.5) = 0.92423431` and 0, so the weights
/// are `σ(0.92423431) = 0.71590409` and `0.28409591`; with values 1 and 0 the output is
/// 0.71590409, and the logsumexp `ln(e^0.92423431 + 1) = 1.25844339`. A second query row of
/// `q = 0` under a causal mask of offset 0 sees key 0 only: score `2·tanh(0) = 0`, output 1
/// exactly, logsumexp 0 within the score bound (exactly where the ISA's reciprocal of 2 is).
#[test]
fn golden_by_hand() {
    let (q, k, v) = ([0.5f32, 0.0], [0.0f32, -0.5], [1.0f32, 0.0]);
    let (wq, wk, w) = ([1.0f32], [1.0f32], [2.0f32]);
    for isa in supported_isas("additive") {
        for (mask, nq) in [(Mask::None, 1), (Mask::Causal { offset: Some(-1) }, 2)] {
            let mut o = vec![0.0f32; nq];
            let mut lse = vec![0.0f32; nq];
            AdditiveAttention::new(
                TensorRef::new(&q[..nq], Tensor4Layout::bhsd(1, 1, nq, 1)),
                TensorRef::new(&k, Tensor4Layout::bhsd(1, 1, 2, 1)),
                TensorRef::new(&v, Tensor4Layout::bhsd(1, 1, 2, 1)),
                AdditiveWeights {
                    wq: MatRef::new(&wq, MatLayout::row_major(1, 1)),
                    wk: MatRef::new(&wk, MatLayout::row_major(1, 1)),
                    w: &w,
                },
            )
            .mask(mask)
            .lse(&mut lse)
            .isa(isa)
            .run(TensorMut::new(&mut o, Tensor4Layout::bhsd(1, 1, nq, 1)))
            .unwrap();
            if nq == 1 {
                assert!((f64::from(o[0]) - 0.715_904_090_297_548).abs() < 4e-7, "{isa}: {o:?}");
                assert!((f64::from(lse[0]) - 1.258_443_387_612_291).abs() < 4e-7, "{isa}: {lse:?}");
            } else {
                // Offset −1: row 0 sees no key (zeros, −∞), row 1 (q = 0) sees key 0 only.
                // Its logsumexp is its one score, `2·tanh(0) = 0`, which the exp path forms as
                // `W − 2·w/(e^0·e^0 + 1)`: exact where the reciprocal of 2 is (AVX-512,
                // portable), within the score bound where it is an estimate (AVX2: 2⁻²³).
                assert_eq!(o, [0.0, 1.0], "{isa}");
                assert_eq!(lse[0], f32::NEG_INFINITY, "{isa}");
                let bound = additive_score_bound(&w, &[0.0], &[0.0], &[0.0], 1, 1);
                assert!(f64::from(lse[1]).abs() <= bound, "{isa}: {lse:?} ± {bound:e}");
            }
        }
    }
}

#[test]
fn masked_nonfinite_values_do_not_leak() {
    let mut case = Case::new([1, 1, 1, 4, 20, 3, 3, 5, 8], MaskKind::Causal(Some(0)), 3, 1.0);
    // Keys past query 3's diagonal hold ±∞ and NaN values (an unwritten cache slot).
    for j in 4..20 {
        for d in 0..5 {
            case.v[j * 5 + d] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][(j + d) % 3];
        }
    }
    for isa in supported_isas("additive") {
        check(&case, isa, Parallelism::Sequential).unwrap();
        assert!(case.run(isa, Parallelism::Sequential).0.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn bad_inputs_give_typed_errors() {
    let z = vec![0.0f32; 64];
    let nan = vec![f32::NAN; 64];
    let l = Tensor4Layout::bhsd;
    let m = MatLayout::row_major;
    type Dims =
        ([usize; 4], [usize; 4], [usize; 4], [usize; 4], (usize, usize), (usize, usize), usize);
    // (q, k, v, o, wq, wk, w len), the error's argument; ZeroHeads etc. by variant.
    let good: Dims = ([1, 2, 3, 4], [1, 1, 5, 2], [1, 1, 5, 3], [1, 2, 3, 3], (4, 6), (2, 6), 6);
    type Expect = fn(&Error) -> bool;
    let cases: Vec<(&str, Dims, Expect)> = vec![
        ("wq rows", ([1, 2, 3, 4], good.1, good.2, good.3, (3, 6), good.5, 6), |e| {
            matches!(e, Error::ShapeMismatch { arg: "wq", .. })
        }),
        ("wk rows", (good.0, good.1, good.2, good.3, good.4, (3, 6), 6), |e| {
            matches!(e, Error::ShapeMismatch { arg: "wk", .. })
        }),
        ("wk cols", (good.0, good.1, good.2, good.3, good.4, (2, 5), 6), |e| {
            matches!(e, Error::ShapeMismatch { arg: "wk", .. })
        }),
        ("w len", (good.0, good.1, good.2, good.3, good.4, good.5, 5), |e| {
            matches!(e, Error::ShapeMismatch { arg: "w", .. })
        }),
        ("v keys", (good.0, good.1, [1, 1, 4, 3], good.3, good.4, good.5, 6), |e| {
            matches!(e, Error::ShapeMismatch { arg: "v", .. })
        }),
        ("o dv", (good.0, good.1, good.2, [1, 2, 3, 2], good.4, good.5, 6), |e| {
            matches!(e, Error::ShapeMismatch { arg: "o", .. })
        }),
        ("zero heads", ([1, 0, 3, 4], good.1, good.2, [1, 0, 3, 3], good.4, good.5, 6), |e| {
            matches!(e, Error::ZeroHeads { arg: "q" })
        }),
        (
            "kv heads",
            ([1, 3, 3, 4], [1, 2, 5, 2], [1, 2, 5, 3], [1, 3, 3, 3], good.4, good.5, 6),
            |e| matches!(e, Error::KvHeadsNotDividing { .. }),
        ),
        ("k batch", (good.0, [2, 1, 5, 2], [2, 1, 5, 3], good.3, good.4, good.5, 6), |e| {
            matches!(e, Error::ShapeMismatch { arg: "k", .. })
        }),
    ];
    let run = |d: &Dims, wq: &[f32], w: &[f32]| {
        let mut o = vec![0.0f32; 64];
        AdditiveAttention::new(
            TensorRef::new(&z, l(d.0[0], d.0[1], d.0[2], d.0[3])),
            TensorRef::new(&z, l(d.1[0], d.1[1], d.1[2], d.1[3])),
            TensorRef::new(&z, l(d.2[0], d.2[1], d.2[2], d.2[3])),
            AdditiveWeights {
                wq: MatRef::new(wq, m(d.4 .0, d.4 .1)),
                wk: MatRef::new(&z, m(d.5 .0, d.5 .1)),
                w: &w[..d.6],
            },
        )
        .run(TensorMut::new(&mut o, l(d.3[0], d.3[1], d.3[2], d.3[3])))
    };
    assert!(run(&good, &z, &z).is_ok());
    for (what, d, ok) in &cases {
        let e = run(d, &z, &z).expect_err(what);
        assert!(ok(&e), "{what}: {e:?}");
    }
    let e = run(&good, &nan, &z).unwrap_err();
    assert!(matches!(e, Error::NonFinite { arg: "wq", .. }), "{e:?}");
    let mut inf = z.clone();
    inf[5] = f32::INFINITY;
    let e = run(&good, &z, &inf).unwrap_err();
    assert!(matches!(e, Error::NonFinite { arg: "w", .. }), "{e:?}");
    // An lse of the wrong length.
    let mut o = vec![0.0f32; 64];
    let mut lse = vec![0.0f32; 5];
    let e = AdditiveAttention::new(
        TensorRef::new(&z, l(1, 2, 3, 4)),
        TensorRef::new(&z, l(1, 1, 5, 2)),
        TensorRef::new(&z, l(1, 1, 5, 3)),
        AdditiveWeights { wq: MatRef::new(&z, m(4, 6)), wk: MatRef::new(&z, m(2, 6)), w: &z[..6] },
    )
    .lse(&mut lse)
    .run(TensorMut::new(&mut o, l(1, 2, 3, 3)))
    .unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { arg: "lse", .. }), "{e:?}");
}

/// K and V without elements (`dk = dv = 0`) and no hidden units (`da = 0`) may declare any key
/// count: every score is 0, and the logsumexps come in closed form, not from a loop over
/// `2⁵⁰` keys (which would never return).
#[test]
fn unbounded_key_count_without_elements_returns_at_once() {
    let nk = 1usize << 50;
    let q = [0.5f32; 3];
    let empty: [f32; 0] = [];
    let mut lse = [f32::NAN; 3];
    for (mask, want) in [
        (Mask::None, [50.0 * 2f64.ln(); 3]),
        // Bottom-right causal offset nk − nq: query i sees nk − 3 + i + 1 keys.
        (Mask::CAUSAL, [0, 1, 2].map(|i| ((nk - 2 + i) as f64).ln())),
    ] {
        AdditiveAttention::new(
            TensorRef::new(&q, Tensor4Layout::bhsd(1, 1, 3, 1)),
            TensorRef::new(&empty, Tensor4Layout::bhsd(1, 1, nk, 0)),
            TensorRef::new(&empty, Tensor4Layout::bhsd(1, 1, nk, 0)),
            AdditiveWeights {
                wq: MatRef::new(&empty, MatLayout::row_major(1, 0)),
                wk: MatRef::new(&empty, MatLayout::row_major(0, 0)),
                w: &empty,
            },
        )
        .mask(mask)
        .lse(&mut lse)
        .run(TensorMut::new(&mut [], Tensor4Layout::bhsd(1, 1, 3, 0)))
        .unwrap();
        for (got, want) in lse.iter().zip(want) {
            assert!((f64::from(*got) - want).abs() <= 1e-6 * want, "{mask:?}: {got} vs {want}");
        }
    }
}
