//! Numerical hostility: long rows (N = 65536) with logits 1e4 apart, every key masked but one,
//! d = 1, scale = 0, values of 1e38 in V, empty dimensions; each against the reference through
//! the fuzz oracle (`attn_tests::fuzz_decode`, derived bounds, guard bands) and, where the answer
//! is known by reasoning, against that exact value. The flash path (`nq > 16`) and the decode
//! path (`nq ≤ 16`) are both exercised.
//!
//! Overflow behaviour (documented here, asserted below): the reference accumulates in f64, the
//! kernels in f32 with weights `e_j ≤ 1` relative to the running maximum, so an output is exact
//! to the bound as long as the unnormalised accumulator `Σ_j e_j·|v_jd|` stays below `f32::MAX`;
//! a single visible key carrying 1e38, or ±1e38 that cancel, is fine.
//!
//! Regression reproducers of faults the fuzzers found are at the end.

use attn_kernels::arch::selected;
use attn_kernels::attention::{Attention, Path};
use attn_kernels::Parallelism;
use attn_reference::{Mask, Tensor4Layout, TensorMut, TensorRef};
use attn_tests::fuzz_decode::{AttentionCase, MaskSpec, TensorOperand};

const N: usize = 65536;

fn t(data: Vec<f32>, dims: [usize; 4]) -> TensorOperand {
    TensorOperand { layout: Tensor4Layout::bhsd(dims[0], dims[1], dims[2], dims[3]), data }
}

/// One head, `nq` queries of width 1 all equal to `q`, keys `k`, values `v` (d = 1).
fn case(nq: usize, q: f32, k: Vec<f32>, v: Vec<f32>, scale: f32, mask: MaskSpec) -> AttentionCase {
    let nk = k.len();
    AttentionCase {
        q: t(vec![q; nq], [1, 1, nq, 1]),
        k: t(k, [1, 1, nk, 1]),
        v: t(v, [1, 1, nk, 1]),
        scale,
        mask,
        o: t(vec![0.0; nq], [1, 1, nq, 1]),
        lse: Some(nq),
        par: Parallelism::Sequential,
        variants: Default::default(),
    }
}

/// The path a test names (`"attention"`: the default, [`Path::Auto`]).
fn path_named(name: &str) -> Path {
    match name {
        "flash" => Path::Flash,
        "decode" => Path::Decode,
        "unfused" => Path::Unfused,
        _ => Path::Auto,
    }
}

/// Runs the kernel on the case (oracle-checked), then once more on fresh buffers, and returns
/// that output and logsumexp (every path is deterministic: the checked call left the same).
fn run(c: &AttentionCase, name: &str) -> (Vec<f32>, Vec<f32>) {
    let (isa, path) = (selected(), path_named(name));
    if let Err(e) = c.check(|a, o| a.isa(isa).path(path).run(o)) {
        panic!("{name}: {e}");
    }
    let mut o = c.o.data.clone();
    let mut lse = vec![0.0; c.lse.unwrap_or(0)];
    let a = Attention::new(
        TensorRef::new(&c.q.data, c.q.layout),
        TensorRef::new(&c.k.data, c.k.layout),
        TensorRef::new(&c.v.data, c.v.layout),
    );
    let a = a.scale(c.scale).mask(c.mask.mask()).parallelism(c.par).isa(isa).path(path);
    let a = if c.lse.is_some() { a.lse(&mut lse) } else { a };
    a.run(TensorMut::new(&mut o, c.o.layout)).expect("the checked call succeeded");
    (o, lse)
}

const PATHS: [(&str, usize); 3] = [("decode", 1), ("flash", 20), ("attention", 3)];

#[test]
fn logits_1e4_apart_over_65536_keys() {
    // logits q·k_j = 1e4 on odd keys, 0 on even ones: the even keys get e^-1e4 = 0 weight, the
    // odd ones 1/32768 each, so o = mean of the odd values = mean(1, 3, …, 65535) = 32768.
    let k: Vec<f32> = (0..N).map(|j| if j % 2 == 1 { 1e4 } else { 0.0 }).collect();
    let v: Vec<f32> = (0..N).map(|j| j as f32).collect();
    for (path, nq) in PATHS {
        let (o, lse) = run(&case(nq, 1.0, k.clone(), v.clone(), 1.0, MaskSpec::None), path);
        for x in &o {
            assert!((x - 32768.0).abs() <= 32768.0 * 1e-4, "{path}: {x}");
        }
        // lse = 1e4 + ln 32768
        let want = 1e4 + (32768f64).ln();
        assert!(lse.iter().all(|&l| (f64::from(l) - want).abs() < 2e-3), "{path}: {lse:?}");
    }
}

#[test]
fn every_key_masked_but_one() {
    // Each query sees exactly one key (a different one per query); p = 1 exactly, so o is that
    // key's value bit for bit whatever the logits, and lse is its logit.
    for (path, nq) in PATHS {
        let k: Vec<f32> = (0..N).map(|j| ((j * 7919) % 1000) as f32 - 500.0).collect();
        let v: Vec<f32> = (0..N).map(|j| (j as f32).sin() * 1e3).collect();
        let visible: Vec<usize> = (0..nq).map(|i| (40_000 + 977 * i) % N).collect();
        let mut keep = vec![false; nq * N];
        for (i, &j) in visible.iter().enumerate() {
            keep[i * N + j] = true;
        }
        let mask = MaskSpec::Keep(keep, Tensor4Layout::bhsd(1, 1, nq, N));
        let (o, lse) = run(&case(nq, 0.5, k.clone(), v.clone(), 1.0, mask), path);
        for (i, &j) in visible.iter().enumerate() {
            assert_eq!(o[i].to_bits(), v[j].to_bits(), "{path}: row {i}");
            assert!((lse[i] - 0.5 * k[j]).abs() <= 1e-4 * (0.5 * k[j]).abs().max(1.0));
        }
    }
}

#[test]
fn scale_zero_gives_the_exact_mean() {
    // scale = 0: every visible logit is 0, weights are exactly 1/N (N a power of two), and with
    // small-integer values every sum is exact: o = Σv / N exactly, lse = ln N. Huge keys do not
    // matter (0·1e38 = 0).
    let k: Vec<f32> = (0..N).map(|j| if j % 3 == 0 { 1e38 } else { -3e37 }).collect();
    let v: Vec<f32> = (0..N).map(|j| (j % 17) as f32).collect();
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / N as f64;
    for (path, nq) in PATHS {
        let (o, lse) = run(&case(nq, 1.0, k.clone(), v.clone(), 0.0, MaskSpec::None), path);
        assert!(o.iter().all(|&x| f64::from(x) == mean), "{path}: {o:?} vs {mean}");
        assert!(lse.iter().all(|&l| (f64::from(l) - (N as f64).ln()).abs() < 1e-5), "{path}");
    }
}

#[test]
fn values_of_1e38() {
    for (path, nq) in PATHS {
        // one visible key carrying 1e38: exact
        let mut k = vec![-1e4f32; N];
        k[123] = 0.0;
        let v = vec![1e38f32; N];
        let (o, _) = run(&case(nq, 1.0, k.clone(), v.clone(), 1.0, MaskSpec::None), path);
        assert!(o.iter().all(|&x| x == 1e38), "{path}: {o:?}");
        // ±1e38 in equal weights cancel: exact 0 within the bound (checked by the oracle)
        let v: Vec<f32> = (0..2).map(|j| if j == 0 { 1e38 } else { -1e38 }).collect();
        let (o, _) = run(&case(nq, 1.0, vec![0.0; 2], v, 0.0, MaskSpec::None), path);
        assert!(o.iter().all(|&x| x.abs() <= 1e38 * 1e-6), "{path}: {o:?}");
        // 1e38 under weights that sum to 1 across many keys: the reference gives 1e38; the
        // kernels' accumulator Σ e_j v_j (e_j ≤ 1) may exceed f32::MAX — see the module docs
        let c = case(nq, 1.0, vec![0.0; 4], vec![1e38; 4], 0.0, MaskSpec::None);
        let (o, _) = run(&c, path);
        for &x in &o {
            assert!(x == 1e38 || x == f32::INFINITY, "{path}: {x}");
        }
        eprintln!("{path}: 4 keys × 1e38 at weight 1/4 → {:e}", o[0]);
    }
}

#[test]
fn empty_dimensions() {
    // nk = 0: zero output rows and lse −∞; nq = 0 / dv = 0: nothing to write.
    for (path, nq) in PATHS {
        let (o, lse) = run(&case(nq, 1.0, vec![], vec![], 1.0, MaskSpec::None), path);
        assert!(
            o.iter().all(|&x| x == 0.0) && lse.iter().all(|&l| l == f32::NEG_INFINITY),
            "{path}"
        );
    }
}

// ---- Regression reproducers (found by the fuzz targets; see the report / README table) ----

/// dk = 0 (empty query/key rows) with contiguous K of `nk ≥ 2` keys and an empty slice: the
/// decode path indexed `k.data[1..1]` of an empty slice and panicked
/// (`range start index 1 out of range for slice of length 0`, attention/mod.rs `row_of`).
/// The reference gives logits 0, i.e. the mean of V.
#[test]
fn zero_width_keys_do_not_panic() {
    for (path, nq) in PATHS {
        let c = AttentionCase {
            q: t(vec![], [1, 1, nq, 0]),
            // a row stride of 1 over zero-width rows: valid (the view is empty), start index 1
            k: TensorOperand {
                data: vec![],
                layout: Tensor4Layout::strided([1, 1, 2, 0], [2, 2, 1, 1], 0),
            },
            v: t(vec![1.0, 3.0], [1, 1, 2, 1]),
            scale: 1.0,
            mask: MaskSpec::None,
            o: t(vec![0.0; nq], [1, 1, nq, 1]),
            lse: Some(nq),
            par: Parallelism::Sequential,
            variants: Default::default(),
        };
        let (o, lse) = run(&c, path);
        assert!(o.iter().all(|&x| x == 2.0), "{path}: {o:?}");
        assert!(lse.iter().all(|&l| (l - std::f32::consts::LN_2).abs() < 1e-6), "{path}");
    }
}

/// nk = 0 and dv = 0 (nothing to write but the logsumexp): the flash path left NaN in `lse`
/// where the convention (and the decode path) give −∞ (found with q `[1, 1, 1, 0]`).
#[test]
fn no_keys_give_minus_infinity_lse() {
    for (dk, dv) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let c = AttentionCase {
            q: t(vec![0.5; 20 * dk], [1, 1, 20, dk]),
            k: t(vec![], [1, 1, 0, dk]),
            v: t(vec![], [1, 1, 0, dv]),
            scale: 1.0,
            mask: MaskSpec::None,
            o: t(vec![7.0; 20 * dv], [1, 1, 20, dv]),
            lse: Some(20),
            par: Parallelism::Sequential,
            variants: Default::default(),
        };
        for path in ["flash", "attention", "decode"] {
            let (o, lse) = run(&c, path);
            assert!(o.iter().all(|&x| x == 0.0), "{path}: {o:?}");
            let ok = lse.iter().all(|&l| l == f32::NEG_INFINITY);
            assert!(ok, "{path}, dk {dk}, dv {dv}: {lse:?}");
        }
    }
}

/// dv = 0 with a logsumexp output, through an output view whose rows start past its (empty)
/// data: only the logsumexps are written. The decode merge sliced each such row out of the
/// data and panicked (found by `fuzz_paged`, 2026-12-07). Oracle-checked by `run`.
#[test]
fn empty_value_rows_in_a_strided_output_write_only_the_lse() {
    let (nq, nk) = (3, 5);
    let keys: Vec<f32> = (0..2 * nk).map(|j| j as f32 * 0.25).collect();
    let o = Tensor4Layout::strided([1, 2, nq, 0], [64, 16, 4, 1], 0);
    for par in [Parallelism::Sequential, Parallelism::threads(2)] {
        let c = AttentionCase {
            q: t(vec![0.5; 2 * nq], [1, 2, nq, 1]),
            k: t(keys.clone(), [1, 2, nk, 1]),
            v: t(vec![], [1, 2, nk, 0]),
            scale: 1.0,
            mask: MaskSpec::None,
            o: TensorOperand { layout: o, data: vec![] },
            lse: Some(2 * nq),
            par,
            variants: Default::default(),
        };
        for path in ["decode", "flash", "attention"] {
            let (o, lse) = run(&c, path);
            assert!(o.is_empty() && lse.iter().all(|l| l.is_finite()), "{path}: {lse:?}");
        }
    }
}

/// A non-finite value at a masked key (e.g. an unwritten KV-cache slot) must not reach the
/// output: the reference skips zero-weight keys, and a fully masked row is all zeros. The flash
/// path computed `0·∞ = NaN` (found with causal offset −17, nq = 23, nk = 6, V[5][1] = ∞).
#[test]
fn nonfinite_values_at_masked_keys_do_not_leak() {
    for (path, nq) in PATHS {
        let v = vec![1.0, 2.0, f32::INFINITY, f32::NAN];
        let mut keep = vec![true; nq * 4];
        for i in 0..nq {
            keep[i * 4 + 2] = false;
            keep[i * 4 + 3] = false;
        }
        let mask = MaskSpec::Keep(keep, Tensor4Layout::bhsd(1, 1, nq, 4));
        let c = case(nq, 1.0, vec![0.0; 4], v.clone(), 1.0, mask);
        let (o, _) = run(&c, path);
        assert!(o.iter().all(|&x| x == 1.5), "{path}: {o:?}");
        // fully masked rows (causal, offset −nq: no query sees a key)
        let c = case(nq, 1.0, vec![0.0; 4], v, 1.0, MaskSpec::Causal(Some(-(nq as isize) - 1)));
        let (o, _) = run(&c, path);
        assert!(o.iter().all(|&x| x == 0.0), "{path}: {o:?}");
    }
}

/// Softmax over rows of zero length (`cols = 0`, empty slices) with `rows ≥ 2`: the kernel
/// sliced `y.data[start..start]` with `start` = the row offset past the empty slice and panicked
/// (`range start index 1 out of range for slice of length 0`, softmax/mod.rs `for_each_row`).
/// Expected: nothing to write, lse −∞ for every row.
#[test]
fn softmax_zero_length_rows_do_not_panic() {
    let x: Vec<f32> = vec![];
    let mut y: Vec<f32> = vec![];
    let mut lse = vec![0.0; 2];
    attn_kernels::softmax::scale_mask_softmax(
        TensorRef::new(&x, Tensor4Layout::strided([1, 1, 2, 0], [2, 2, 1, 1], 0)),
        1.0,
        &Mask::None,
        TensorMut::new(&mut y, Tensor4Layout::strided([1, 1, 2, 0], [2, 2, 1, 1], 0)),
        Some(&mut lse),
        Parallelism::Sequential,
    )
    .unwrap();
    assert!(lse.iter().all(|&l| l == f32::NEG_INFINITY), "{lse:?}");
}

/// dk = 0 with a K view whose (irrelevant) row stride is huge: the view is empty, so it is valid,
/// but the flash path computed `(j0 + j) * k.rs` for the key pointer (attention/blocks.rs
/// `qk_block`): an overflow panic with overflow checks, and a wild `ptr.add` (undefined
/// behaviour even if never dereferenced) without. Found by the proptest-driven fuzz run
/// (20 000 cases). Expected: logits 0 for every key, lse = ln 5.
#[test]
fn zero_width_keys_with_huge_stride() {
    let k = TensorOperand {
        data: vec![],
        layout: Tensor4Layout::strided([1, 1, 5, 0], [5, 5, usize::MAX / 3, 1], 0),
    };
    for path in ["flash", "attention"] {
        let c = AttentionCase {
            q: t(vec![], [1, 1, 17, 0]),
            k: k.clone(),
            v: t(vec![], [1, 1, 5, 0]),
            scale: 1.0,
            mask: MaskSpec::None,
            o: t(vec![], [1, 1, 17, 0]),
            lse: Some(17),
            par: Parallelism::Sequential,
            variants: Default::default(),
        };
        let (_, lse) = run(&c, path);
        assert!(lse.iter().all(|&l| (l - 5f32.ln()).abs() < 1e-6), "{path}: {lse:?}");
    }
}

#[test]
fn underflowing_scaled_query_meets_an_infinite_key() {
    // Fuzz finding (issue 25, item 6): q = 1e-45 (the smallest subnormal) times scale 0.125
    // underflows to 0 in f32, and 0·(−∞) was NaN. The reference computes scale·(q·k) in f64:
    // key 0 gets −∞ (weight 0), keys 1, 2 get logits ≈ 1.75e-46 and 3.5e-46, i.e. 0 within any
    // bound, so o = (1 + 3)/2 = 2 and lse = ln 2 exactly as f32.
    let k = vec![f32::NEG_INFINITY, 1.0, 2.0];
    let v = vec![10.0, 1.0, 3.0];
    for (path, nq) in PATHS.into_iter().chain([("decode", 20), ("flash", 1)]) {
        let (o, lse) = run(&case(nq, 1e-45, k.clone(), v.clone(), 0.125, MaskSpec::None), path);
        assert!(o.iter().all(|&x| x == 2.0), "{path}: {o:?}");
        assert!(lse.iter().all(|&l| l == 2f32.ln()), "{path}: {lse:?}");
    }
    let c = case(20, 1e-45, k, v, 0.125, MaskSpec::None);
    c.check(|a, o| a.path(Path::Unfused).run(o)).unwrap();
}

/// The convention for scores beyond the f32 range (issue 25, item 7; README "Conventions"):
/// such a score is `±∞` in every path and in the reference (`saturate_logit`); `−∞` weighs 0,
/// the `+∞` keys share the row. Keys of ±1e37 against q = 100 give logits ±1e39: +∞, −∞, +∞,
/// and a padded key (masked). Exact answers: o = mean(1, 3) = 2, lse = +∞.
#[test]
fn overflowing_scores_follow_one_convention_in_every_path() {
    let k = vec![1e37, -1e37, 2e37, 5.0];
    let v = vec![1.0, 2.0, 3.0, 4.0];
    let pad = |nq: usize| {
        let keep = vec![true, true, true, false];
        let layout = Tensor4Layout { dims: [1, 1, nq, 4], strides: [0, 0, 0, 1], offset: 0 };
        MaskSpec::Keep(keep, layout)
    };
    let bias = |nq: usize| {
        let b = vec![f32::INFINITY, 0.0, f32::INFINITY, 1.0];
        let layout = Tensor4Layout { dims: [1, 1, nq, 4], strides: [0, 0, 0, 1], offset: 0 };
        MaskSpec::Bias(b, layout)
    };
    for (path, nq) in PATHS {
        // overflow through the scores
        let (o, lse) = run(&case(nq, 100.0, k.clone(), v.clone(), 1.0, pad(nq)), path);
        assert!(o.iter().all(|&x| x == 2.0), "{path}: {o:?}");
        assert!(lse.iter().all(|&l| l == f32::INFINITY), "{path}: {lse:?}");
        // the same rule for a +∞ bias (formerly a NaN row in attention)
        let small = vec![1.0, 2.0, 3.0, 4.0];
        let (o, lse) = run(&case(nq, 0.5, small, v.clone(), 1.0, bias(nq)), path);
        assert!(o.iter().all(|&x| x == 2.0), "{path}: {o:?}");
        assert!(lse.iter().all(|&l| l == f32::INFINITY), "{path}: {lse:?}");
        // every score overflowing downwards: a fully masked row
        let neg = vec![-1e37, -2e37, -3e37, -4e37];
        let (o, lse) = run(&case(nq, 100.0, neg, v.clone(), 1.0, MaskSpec::None), path);
        assert!(o.iter().all(|&x| x == 0.0), "{path}: {o:?}");
        assert!(lse.iter().all(|&l| l == f32::NEG_INFINITY), "{path}: {lse:?}");
    }
    // the unfused path, through the oracle
    let c = case(20, 100.0, k, v, 1.0, pad(20));
    c.check(|a, o| a.path(Path::Unfused).run(o)).unwrap();
}

/// `+∞` scores that appear only in later key blocks (flash: block of 144 keys; decode: blocks
/// of 16 and chunks of 512) after finite ones, and in two different decode chunks: the
/// earlier keys drop to weight 0 and the two `+∞` keys share the row. o = (700 + 1050)/2.
#[test]
fn overflowing_scores_in_later_blocks_and_chunks() {
    let n = 1100;
    let mut k: Vec<f32> = (0..n).map(|j| (j % 13) as f32 * 0.1).collect();
    k[700] = 1e37;
    k[1050] = 3e37;
    let v: Vec<f32> = (0..n).map(|j| j as f32).collect();
    for (path, nq) in PATHS {
        let (o, lse) = run(&case(nq, 100.0, k.clone(), v.clone(), 1.0, MaskSpec::None), path);
        assert!(o.iter().all(|&x| x == 875.0), "{path}: {o:?}");
        assert!(lse.iter().all(|&l| l == f32::INFINITY), "{path}: {lse:?}");
    }
}

#[test]
fn softmax_overflowing_logits_share_the_weight() {
    // scale·x = 6e38 overflows f32 (and is saturated to +∞ in the reference): 1/2 each.
    let x = [3e38f32, 1.0, 3e38, -3e38];
    let l = Tensor4Layout::bhsd(1, 1, 1, 4);
    let mut y = [0.0f32; 4];
    let mut lse = [0.0f32];
    attn_kernels::softmax::scale_mask_softmax(
        TensorRef::new(&x, l),
        2.0,
        &Mask::None,
        TensorMut::new(&mut y, l),
        Some(&mut lse),
        Parallelism::Sequential,
    )
    .unwrap();
    let (mut yr, mut lr) = ([0.0f32; 4], [0.0f32]);
    attn_reference::softmax::scale_mask_softmax(
        TensorRef::new(&x, l),
        2.0,
        &Mask::None,
        TensorMut::new(&mut yr, l),
        Some(&mut lr),
    )
    .unwrap();
    assert_eq!((y, lse), ([0.5, 0.0, 0.5, 0.0], [f32::INFINITY]));
    assert_eq!((yr, lr), (y, lse));
}

/// Issue 25, item 8: a zero-size view beside huge dimensions returns at once, as the
/// reference does (these aborted on a 2⁴⁰-flag allocation, panicked on overflow, or ran for
/// ever); with logsumexps and `d_k = d_v = 0` the answer is in closed form.
#[test]
fn zero_size_views_beside_huge_dimensions_return_at_once() {
    let isa = selected();
    let start = std::time::Instant::now();
    let empty: [f32; 0] = [];
    let t = |dims: [usize; 4]| Tensor4Layout::bhsd(dims[0], dims[1], dims[2], dims[3]);
    let bcast = |dims: [usize; 4]| Tensor4Layout { dims, strides: [0, 0, 0, 1], offset: 0 };
    let q4 = [1.0f32, 2.0, 3.0, 4.0];
    let kv = vec![0.5f32; 12];
    let e = 1usize << 40;
    // (q data, q layout, k/v data, k layout, v layout, o layout)
    type Call<'a> =
        (&'a [f32], Tensor4Layout, &'a [f32], Tensor4Layout, Tensor4Layout, Tensor4Layout);
    let calls: Vec<Call<'_>> = vec![
        // q, o [1, 1, 2⁴⁰, 0] beside k, v [1, 1, 4, 0]
        (&empty, t([1, 1, e, 0]), &empty, t([1, 1, 4, 0]), t([1, 1, 4, 0]), t([1, 1, e, 0])),
        // 2⁴⁰ query heads (broadcast q) on one K/V head, d_v = 0
        (&q4, bcast([1, e, 1, 4]), &kv, t([1, 1, 3, 4]), t([1, 1, 3, 0]), t([1, e, 1, 0])),
        // batch = heads = 2³², 32 queries
        (
            &empty,
            t([1 << 32, 1 << 32, 32, 0]),
            &empty,
            t([1 << 32, 1 << 32, 4, 0]),
            t([1 << 32, 1 << 32, 4, 0]),
            t([1 << 32, 1 << 32, 32, 0]),
        ),
        // 2⁵⁰ keys of width 0, 1 and 20 queries
        (
            &empty,
            t([1, 1, 1, 0]),
            &empty,
            t([1, 1, 1 << 50, 0]),
            t([1, 1, 1 << 50, 0]),
            t([1, 1, 1, 0]),
        ),
        (
            &empty,
            t([1, 1, 20, 0]),
            &empty,
            t([1, 1, 1 << 50, 0]),
            t([1, 1, 1 << 50, 0]),
            t([1, 1, 20, 0]),
        ),
    ];
    for (i, &(qd, ql, kd, kl, vl, ol)) in calls.iter().enumerate() {
        let (q, k, v) = (TensorRef::new(qd, ql), TensorRef::new(kd, kl), TensorRef::new(kd, vl));
        let mut o: [f32; 0] = [];
        let r = attn_reference::attention::attention(
            q,
            k,
            v,
            0.5,
            &Mask::None,
            TensorMut::new(&mut o, ol),
            None,
        );
        assert_eq!(r, Ok(()), "reference, call {i}");
        let seq = Parallelism::Sequential;
        for (path, par) in [("attention", seq), ("flash", seq), ("decode", Parallelism::threads(2))]
        {
            let o = TensorMut::new(&mut o, ol);
            let r = Attention::new(q, k, v).scale(0.5).parallelism(par);
            let r = if path == "attention" { r } else { r.isa(isa).path(path_named(path)) };
            assert_eq!(r.run(o), Ok(()), "{path}, call {i}");
        }
        let o = TensorMut::new(&mut o, ol);
        let unfused = Attention::new(q, k, v).scale(0.5).isa(isa).path(Path::Unfused);
        assert_eq!(unfused.run(o), Ok(()));
    }
    // With logsumexps: 2⁵⁰ keys of width 0 give ln 2⁵⁰ (no mask) and ln(visible) (causal),
    // computed without visiting the keys.
    let nk = 1usize << 50;
    let (q, k) =
        (TensorRef::new(&empty, t([1, 1, 20, 0])), TensorRef::new(&empty, t([1, 1, nk, 0])));
    for (mask, want) in [
        (Mask::None, [(nk as f64).ln() as f32; 20]),
        (Mask::CAUSAL, std::array::from_fn(|i| ((nk - 19 + i) as f64).ln() as f32)),
    ] {
        for path in ["flash", "decode", "unfused"] {
            let mut o: [f32; 0] = [];
            let mut lse = [0.0f32; 20];
            let o = TensorMut::new(&mut o, t([1, 1, 20, 0]));
            Attention::new(q, k, k)
                .scale(0.5)
                .mask(mask)
                .lse(&mut lse)
                .isa(isa)
                .path(path_named(path))
                .run(o)
                .unwrap();
            assert_eq!(lse, want, "{path} {mask:?}");
        }
    }
    // softmax over [1, 1, 2⁴⁰, 0], in place and not, and log-softmax
    let sl = t([1, 1, e, 0]);
    let mut y: [f32; 0] = [];
    let seq = Parallelism::Sequential;
    let x = TensorRef::new(&empty, sl);
    let r = attn_kernels::softmax::scale_mask_softmax(
        x,
        1.0,
        &Mask::None,
        TensorMut::new(&mut y, sl),
        None,
        seq,
    );
    assert_eq!(r, Ok(()));
    let r = attn_kernels::softmax::scale_mask_softmax_inplace(
        TensorMut::new(&mut y, sl),
        1.0,
        &Mask::CAUSAL,
        None,
        seq,
    );
    assert_eq!(r, Ok(()));
    let ml = attn_reference::MatLayout::row_major(e, 0);
    let (xm, ym) =
        (attn_reference::MatRef::new(&empty, ml), attn_reference::MatMut::new(&mut y, ml));
    assert_eq!(attn_kernels::softmax::log_softmax(xm, ym, seq), Ok(()));
    // logsumexp of 2⁴⁰ × 0: a 4 TiB result, which the reference fails to allocate too
    let want = attn_reference::softmax::logsumexp(xm).map(|v| v.len());
    assert!(want.is_err(), "this machine allocated 4 TiB");
    assert_eq!(attn_kernels::softmax::logsumexp(xm, seq).map(|v| v.len()), want);
    // PackedB of a 2⁶² × 16 zero-stride view: too big to pack, an error instead of a panic
    let b =
        attn_reference::MatRef::new(&q4, attn_reference::MatLayout::strided(1 << 62, 16, 0, 0, 0));
    let err = attn_kernels::gemm::PackedB::new(b).map(|_| ()).unwrap_err();
    assert!(matches!(err, attn_reference::Error::InvalidParameter { arg: "b", .. }), "{err:?}");
    // PackedB of 2⁴⁰ × 0: nothing to pack (it walked 2³¹ k-blocks of no columns, minutes)
    let b = attn_reference::MatRef::<f32>::new(&empty, attn_reference::MatLayout::row_major(e, 0));
    let packed = attn_kernels::gemm::PackedB::new(b).unwrap();
    assert_eq!((packed.rows(), packed.cols()), (e, 0));
    // … and so is quantising d = 0 rows, 2⁶⁰ of them (it walked every row)
    let l = Tensor4Layout::bhsd(1 << 20, 1 << 20, 1 << 20, 0);
    let dst = attn_kernels::Q8Mut::bhsd(&mut [], &mut [], 1 << 20, 1 << 20, 1 << 20, 0);
    assert_eq!(attn_kernels::quantize_q8(TensorRef::new(&empty, l), dst), Ok(()));
    assert!(start.elapsed().as_secs() < 10, "took {:?}", start.elapsed());
}

/// Issue 25: a broadcast (zero-stride) operand can declare a head dimension far larger than its
/// buffer, and the flash and decode paths size their per-thread scratch by `d_k` and `d_v`.
/// With `d_k = 2⁴⁰` that scratch cannot exist: every path returns `InvalidParameter` at once,
/// on one thread and on two (where the error comes out of a parallel task), where it aborted
/// the process ("memory allocation of … bytes failed"). The reference would run `2⁴⁰`
/// multiply-adds per score instead; the kernels' documented answer is the error.
#[test]
fn huge_broadcast_head_dimension_is_an_error_not_an_abort() {
    let isa = selected();
    let start = std::time::Instant::now();
    let dk = 1usize << 40;
    let one = [0.5f32];
    let v = vec![1.0f32; 64 * 2];
    let mut o = vec![0.0f32; 40 * 2];
    let bcast = |nq: usize| Tensor4Layout { dims: [1, 1, nq, dk], strides: [0; 4], offset: 0 };
    for nq in [1, 40] {
        let (q, k) = (TensorRef::new(&one, bcast(nq)), TensorRef::new(&one, bcast(64)));
        let v = TensorRef::new(&v, Tensor4Layout::bhsd(1, 1, 64, 2));
        for par in [Parallelism::Sequential, Parallelism::threads(2)] {
            for path in ["attention", "flash", "decode"] {
                let o = TensorMut::new(&mut o[..nq * 2], Tensor4Layout::bhsd(1, 1, nq, 2));
                let a = Attention::new(q, k, v).scale(0.5).mask(Mask::CAUSAL).parallelism(par);
                let err = a.isa(isa).path(path_named(path)).run(o).unwrap_err();
                assert!(
                    matches!(err, attn_reference::Error::InvalidParameter { .. }),
                    "{path} nq={nq} {par:?}: {err:?}"
                );
            }
        }
    }
    assert!(start.elapsed().as_secs() < 10, "took {:?}", start.elapsed());
}

/// The same broadcast head dimension in a packed varlen batch of two one-token sequences
/// with a token-major output, which two threads split item by item: `d_k = 2⁶²` overflowed
/// the byte count of a head's copy (`(d_k + d_v)·4·keys`) in the threaded split before the
/// checks that bound it ran, a panic under overflow checks. Every thread count returns the
/// one-thread answer, `InvalidParameter`.
#[test]
fn huge_broadcast_head_dimension_in_a_varlen_batch_is_an_error() {
    let dk = 1usize << 62;
    let one = [0.5f32];
    let v = [1.0f32, 2.0, 3.0, 4.0];
    let mut o = [0.0f32; 4];
    let bcast = Tensor4Layout { dims: [1, 1, 2, dk], strides: [0; 4], offset: 0 };
    let packed = Tensor4Layout { dims: [1, 1, 2, 2], strides: [0, 2, 2, 1], offset: 0 };
    let cu = [0usize, 1, 2];
    for par in [Parallelism::Sequential, Parallelism::threads(2)] {
        let (q, k) = (TensorRef::new(&one, bcast), TensorRef::new(&one, bcast));
        let call =
            attn_kernels::batch::VarlenAttention::new(q, k, TensorRef::new(&v, packed), &cu, &cu);
        let err = call.scale(0.5).parallelism(par).run(TensorMut::new(&mut o, packed)).unwrap_err();
        assert!(matches!(err, attn_reference::Error::InvalidParameter { .. }), "{par:?}: {err:?}");
        assert_eq!(o, [0.0; 4], "{par:?}: written");
    }
}
