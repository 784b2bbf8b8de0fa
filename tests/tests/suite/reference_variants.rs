//! The reference's attention variants (issue 22) against what they are defined to be, each
//! written through the plain reference with an explicit mask or extra key, on random problems.
//! The two computations perform the same f64 operations on the same values, so they agree to
//! the bit:
//! - a window is a keep-mask holding the band `i + off − left ≤ j ≤ i + off + right` (and the
//!   causal condition when the mask is causal);
//! - ALiBi is a bias mask holding `slope·(j − i − off)`, exact in f32 for power-of-two slopes
//!   (the standard slopes of 8 heads) and small distances;
//! - a sink is one more key with a zero key vector, a zero value and the sink as its bias;
//! - a softcap turns scores of magnitude ≫ c into exactly ±c.

use attn_reference::attention::{alibi_slopes, attention, attention_with_variants, Variants};
use attn_reference::*;
use proptest::prelude::*;

/// A random problem in `[b, h, s, d]` storage, GQA with `hq = 2·hkv`.
#[derive(Clone, Debug)]
struct Problem {
    hkv: usize,
    nq: usize,
    nk: usize,
    d: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Problem {
    fn hq(&self) -> usize {
        2 * self.hkv
    }
    fn layout(&self, heads: usize, n: usize) -> Tensor4Layout {
        Tensor4Layout::bhsd(1, heads, n, self.d)
    }
    /// Output and logsumexp of the plain reference under `mask`, with `k`, `v` of `nk` keys.
    fn plain(&self, k: &[f32], v: &[f32], nk: usize, mask: &Mask<'_>) -> (Vec<f32>, Vec<f32>) {
        let (hq, hkv) = (self.hq(), self.hkv);
        let mut o = vec![f32::NAN; hq * self.nq * self.d];
        let mut lse = vec![f32::NAN; hq * self.nq];
        attention(
            TensorRef::new(&self.q, self.layout(hq, self.nq)),
            TensorRef::new(k, self.layout(hkv, nk)),
            TensorRef::new(v, self.layout(hkv, nk)),
            0.5,
            mask,
            TensorMut::new(&mut o, self.layout(hq, self.nq)),
            Some(&mut lse),
        )
        .unwrap();
        (o, lse)
    }
    /// Output and logsumexp of the reference with `variants` under `mask`.
    fn with(&self, mask: &Mask<'_>, variants: &Variants<'_>) -> (Vec<f32>, Vec<f32>) {
        let (hq, hkv) = (self.hq(), self.hkv);
        let mut o = vec![f32::NAN; hq * self.nq * self.d];
        let mut lse = vec![f32::NAN; hq * self.nq];
        attention_with_variants(
            TensorRef::new(&self.q, self.layout(hq, self.nq)),
            TensorRef::new(&self.k, self.layout(hkv, self.nk)),
            TensorRef::new(&self.v, self.layout(hkv, self.nk)),
            0.5,
            mask,
            variants,
            TensorMut::new(&mut o, self.layout(hq, self.nq)),
            Some(&mut lse),
        )
        .unwrap();
        (o, lse)
    }
    /// The causal offset as the variants define it, written out: the causal mask's own offset,
    /// `nk − nq` otherwise.
    fn offset(&self, causal: Option<Option<isize>>) -> isize {
        match causal {
            Some(Some(off)) => off,
            _ => self.nk as isize - self.nq as isize,
        }
    }
}

fn problem() -> impl Strategy<Value = Problem> {
    (1usize..3, 0usize..7, 0usize..9, 1usize..4).prop_flat_map(|(hkv, nq, nk, d)| {
        let vals = |n: usize| prop::collection::vec(-3.0f32..3.0, n);
        (vals(2 * hkv * nq * d), vals(hkv * nk * d), vals(hkv * nk * d))
            .prop_map(move |(q, k, v)| Problem { hkv, nq, nk, d, q, k, v })
    })
}

/// `None` (no mask), `Some(None)` (causal, default offset) or `Some(Some(off))`.
fn causal() -> impl Strategy<Value = Option<Option<isize>>> {
    prop_oneof![Just(None), Just(Some(None)), (-3isize..6).prop_map(|o| Some(Some(o)))]
}

fn mask_of(causal: Option<Option<isize>>) -> Mask<'static> {
    causal.map_or(Mask::None, |offset| Mask::Causal { offset })
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()) && a.len() == b.len()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn window_is_a_band_keep_mask(
        p in problem(), causal in causal(), left in 0usize..5, right in 0usize..5,
    ) {
        let off = p.offset(causal);
        let (hq, nq, nk) = (p.hq(), p.nq, p.nk);
        let keep: Vec<bool> = (0..hq * nq * nk)
            .map(|x| {
                let (i, j) = ((x / nk) % nq, x % nk);
                let (i, j) = (i as isize, j as isize);
                let band = i + off - left as isize <= j && j <= i + off + right as isize;
                band && (causal.is_none() || j <= i + off)
            })
            .collect();
        let keep_mask = Mask::Keep { keep: &keep, layout: Tensor4Layout::bhsd(1, hq, nq, nk) };
        let want = p.plain(&p.k, &p.v, nk, &keep_mask);
        let got = p.with(&mask_of(causal), &Variants::default().window(left, right));
        prop_assert!(same_bits(&got.0, &want.0) && same_bits(&got.1, &want.1), "{got:?} {want:?}");
    }

    #[test]
    fn alibi_is_a_distance_bias(p in problem(), causal in causal()) {
        let off = p.offset(causal);
        let (hq, nq, nk) = (p.hq(), p.nq, p.nk);
        let slopes = alibi_slopes(8);
        let bias: Vec<f32> = (0..hq * nq * nk)
            .map(|x| {
                let (h, i, j) = (x / (nq * nk), (x / nk) % nq, x % nk);
                let visible = causal.is_none() || j as isize <= i as isize + off;
                let distance = j as isize - i as isize - off;
                if visible { slopes[h] * distance as f32 } else { f32::NEG_INFINITY }
            })
            .collect();
        let bias_mask = Mask::Bias { bias: &bias, layout: Tensor4Layout::bhsd(1, hq, nq, nk) };
        let want = p.plain(&p.k, &p.v, nk, &bias_mask);
        let got = p.with(&mask_of(causal), &Variants::default().alibi(&slopes[..hq]));
        prop_assert!(same_bits(&got.0, &want.0) && same_bits(&got.1, &want.1), "{got:?} {want:?}");
    }

    #[test]
    fn a_sink_is_one_more_key_without_value(
        p in problem(), causal in causal(), sinks in prop::collection::vec(-4.0f32..4.0, 4),
    ) {
        let off = p.offset(causal);
        let (hq, hkv, nq, nk, d) = (p.hq(), p.hkv, p.nq, p.nk, p.d);
        // Keys and values with one zero row appended per K/V head.
        let extend = |x: &[f32]| -> Vec<f32> {
            x.chunks(nk * d).flat_map(|h| h.iter().copied().chain(vec![0.0; d])).collect()
        };
        let (k, v) = if nk == 0 {
            (vec![0.0; hkv * d], vec![0.0; hkv * d])
        } else {
            (extend(&p.k), extend(&p.v))
        };
        let bias: Vec<f32> = (0..hq * nq * (nk + 1))
            .map(|x| {
                let (h, i, j) = (x / (nq * (nk + 1)), (x / (nk + 1)) % nq, x % (nk + 1));
                if j == nk {
                    sinks[h]
                } else if causal.is_none() || j as isize <= i as isize + off {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        let bias_mask =
            Mask::Bias { bias: &bias, layout: Tensor4Layout::bhsd(1, hq, nq, nk + 1) };
        let want = p.plain(&k, &v, nk + 1, &bias_mask);
        let got = p.with(&mask_of(causal), &Variants::default().sinks(&sinks[..hq]));
        prop_assert!(same_bits(&got.0, &want.0) && same_bits(&got.1, &want.1), "{got:?} {want:?}");
    }
}

/// Scores of ±1e30 under a softcap of 2 are the logits ±2 exactly (`tanh(5·10²⁹) = 1`): the
/// same as zero scores with a bias of ±2.
#[test]
fn softcap_saturates_at_c() {
    let p = Problem {
        hkv: 1,
        nq: 1,
        nk: 3,
        d: 1,
        q: vec![2e30, 2e30],
        k: vec![1.0, -1.0, 0.25],
        v: vec![1.0, 2.0, 4.0],
    };
    let got = p.with(&Mask::None, &Variants::default().softcap(2.0));
    let bias = [2.0f32, -2.0, 2.0];
    let layout = Tensor4Layout { dims: [1, 2, 1, 3], strides: [0, 0, 0, 1], offset: 0 };
    let zero_q = Problem { q: vec![0.0, 0.0], ..p.clone() };
    let want = zero_q.plain(&p.k, &p.v, 3, &Mask::Bias { bias: &bias, layout });
    assert!(same_bits(&got.0, &want.0) && same_bits(&got.1, &want.1), "{got:?} {want:?}");
    // And a small score is nearly itself: c·tanh(s/c) = s·(1 − (s/c)²/3 + …).
    let small = Problem { q: vec![1e-3, 1e-3], ..p };
    let (capped, plain) = (
        small.with(&Mask::None, &Variants::default().softcap(1e3)),
        small.plain(&small.k, &small.v, 3, &Mask::None),
    );
    for (a, b) in capped.0.iter().zip(&plain.0) {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "{a} {b}");
    }
}

/// A row with no visible key is zero; its logsumexp is the sink's logit, or −∞ without one.
#[test]
fn rows_without_visible_keys_follow_the_convention() {
    let p =
        Problem { hkv: 1, nq: 2, nk: 4, d: 2, q: vec![1.0; 8], k: vec![0.5; 8], v: vec![3.0; 8] };
    // A window entirely to the right of every query's diagonal: causal hides all of it.
    let offset = Mask::Causal { offset: Some(-10) };
    let sinks = [0.75f32, -1.5];
    let (o, lse) = p.with(&offset, &Variants::default().sinks(&sinks));
    assert_eq!(o, vec![0.0; 8]);
    assert_eq!(lse, [0.75, 0.75, -1.5, -1.5]);
    let (o, lse) = p.with(&Mask::None, &Variants::default().window(0, 0).alibi(&[1.0, 1.0]));
    // The window [i + 2, i + 2] holds key i + 2 (nk − nq = 2): one key each, weight 1, at
    // distance 0 (no ALiBi term), logit 0.5·q·k = 0.5.
    assert_eq!(o, vec![3.0; 8]);
    assert_eq!(lse, [0.5; 4]);
    let far = Variants::default().window(0, 0);
    let (o, lse) = p.with(&Mask::Causal { offset: Some(100) }, &far);
    assert_eq!(o, vec![0.0; 8]);
    assert_eq!(lse, [f32::NEG_INFINITY; 4]);
}

/// Bad variants are typed errors naming the field, from the reference's own entry point.
#[test]
fn bad_variants_are_typed_errors() {
    let p = Problem { hkv: 1, nq: 1, nk: 1, d: 1, q: vec![1.0; 2], k: vec![1.0], v: vec![1.0] };
    let run = |v: &Variants<'_>| {
        let mut o = [0.0f32; 2];
        attention_with_variants(
            TensorRef::new(&p.q, p.layout(2, 1)),
            TensorRef::new(&p.k, p.layout(1, 1)),
            TensorRef::new(&p.v, p.layout(1, 1)),
            1.0,
            &Mask::None,
            v,
            TensorMut::new(&mut o, p.layout(2, 1)),
            None,
        )
    };
    let e = run(&Variants::default().softcap(-1.0)).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter { arg: "softcap", .. }), "{e:?}");
    let e = run(&Variants::default().sinks(&[0.0])).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { arg: "sinks", .. }), "{e:?}");
    let e = run(&Variants::default().alibi(&[0.0, f32::INFINITY])).unwrap_err();
    assert!(matches!(e, Error::NonFinite { arg: "alibi", .. }), "{e:?}");
}
