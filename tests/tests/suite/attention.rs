//! Attention kernels against the reference: the flash path, the decode path and the unfused
//! path, over every supported ISA, both tensor layouts, odd strides, GQA ratios, every mask kind
//! (fully masked rows included) and 1 or 2 threads; tolerances from
//! `attn_tests::attention_support` (see its docs for the error analysis). Exact checks where the
//! arithmetic is exact, error tables, and an ignored memory test (see `memory_n131072`).

use attn_kernels::attention::{Attention, Path, FLUSH_WEIGHTS_BELOW};
use attn_kernels::{Isa, Mask, Parallelism, Tensor4Layout};
use attn_reference::{Error, TensorMut, TensorRef};
use attn_tests::attention_support::{compare, describe, par, Case, MaskKind, Rng};
use proptest::prelude::*;

const DIMS: [usize; 7] = [1, 3, 16, 64, 80, 128, 256];
/// Sequence lengths around the tile (16/32 queries) and block (128 keys) edges.
const SEQS: [usize; 16] = [1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 65, 127, 128, 129, 200, 257];
/// Cap on `batch·hq·nq·nk·(dk + dv)` per case, so the f64 reference keeps the suite fast.
const WORK: usize = 4_000_000;

fn mask_kind() -> impl Strategy<Value = MaskKind> {
    prop_oneof![
        Just(MaskKind::None),
        prop::sample::select(vec![None, Some(0), Some(-3), Some(5), Some(-40), Some(300)])
            .prop_map(MaskKind::Causal),
        (2u32..6, any::<bool>())
            .prop_map(|(density, broadcast)| MaskKind::Keep { density, broadcast }),
        Just(MaskKind::Bias),
    ]
}

/// `(hkv, group)`: MHA, GQA 2 and 4, MQA.
fn heads() -> impl Strategy<Value = (usize, usize)> {
    prop::sample::select(vec![(1, 1), (2, 1), (2, 2), (1, 4), (1, 3)])
}

fn isa() -> impl Strategy<Value = Isa> {
    prop::sample::select(Isa::supported())
}

#[allow(clippy::too_many_arguments)]
fn sized_case(
    seed: u64,
    batch: usize,
    (hkv, group): (usize, usize),
    mut nq: usize,
    mut nk: usize,
    dk: usize,
    dv: usize,
    bshd: bool,
    pad: usize,
    mask: MaskKind,
    amp: f32,
) -> Case {
    while batch * hkv * group * nq * nk * (dk + dv) > WORK {
        if nq >= nk {
            nq = nq / 2 + 1;
        } else {
            nk = nk / 2 + 1;
        }
    }
    Case::new(seed, batch, hkv, group, nq, nk, dk, dv, bshd, pad, mask, amp)
}

fn general_case() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        1usize..=2,
        heads(),
        prop::sample::select(SEQS.to_vec()),
        prop::sample::select(SEQS.to_vec()),
        prop::sample::select(DIMS.to_vec()),
        prop_oneof![Just(None), prop::sample::select(DIMS.to_vec()).prop_map(Some)],
        any::<bool>(),
        prop::sample::select(vec![0usize, 1, 3]),
        mask_kind(),
        prop::sample::select(vec![1.0f32, 3.0]),
    )
        .prop_map(|(seed, batch, h, nq, nk, dk, dv, bshd, pad, mask, amp)| {
            sized_case(seed, batch, h, nq, nk, dk, dv.unwrap_or(dk), bshd, pad, mask, amp)
        })
}

fn decode_case() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        heads(),
        1usize..=16,
        prop::sample::select(vec![1usize, 17, 300, 1100, 2100]),
        prop::sample::select(vec![1usize, 16, 64, 80, 128]),
        any::<bool>(),
        mask_kind(),
    )
        .prop_map(|(seed, h, nq, nk, d, bshd, mask)| {
            sized_case(seed, 1, h, nq, nk, d, d, bshd, 1, mask, 2.0)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// Flash and unfused paths against the reference, and against each other.
    #[test]
    fn flash_and_unfused_match_reference(
        case in general_case(), isa in isa(), threads in 1usize..=2,
    ) {
        let want = case.reference();
        let bounds = case.bounds();
        let p = par(threads);
        let got = case.run_kernel(p, |a, o| a.path(Path::Flash).isa(isa).run(o));
        compare(&case, "flash", &got, &want, &bounds, 1.0).map_err(TestCaseError::fail)?;
        let unf = case.run_kernel(p, |a, o| a.path(Path::Unfused).isa(isa).run(o));
        compare(&case, "unfused", &unf, &want, &bounds, 1.0).map_err(TestCaseError::fail)?;
        compare(&case, "flash vs unfused", &got, &unf, &bounds, 2.0)
            .map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Decode path (keys split across threads, merged by logsumexp) against the reference and
    /// against the flash path.
    #[test]
    fn decode_matches_reference_and_flash(
        case in decode_case(), isa in isa(), threads in 1usize..=2,
    ) {
        let want = case.reference();
        let bounds = case.bounds();
        let p = par(threads);
        let got = case.run_kernel(p, |a, o| a.path(Path::Decode).isa(isa).run(o));
        compare(&case, "decode", &got, &want, &bounds, 1.0).map_err(TestCaseError::fail)?;
        let fl = case.run_kernel(p, |a, o| a.path(Path::Flash).isa(isa).run(o));
        compare(&case, "decode vs flash", &got, &fl, &bounds, 2.0)
            .map_err(TestCaseError::fail)?;
    }
}

/// K/V stored sequence-major (`[seq, kv_heads, d]`) runs the decode tasks over groups of
/// heads, block by block across the group, and the group size follows the thread count; no
/// head's arithmetic changes. So every thread count and either layout of the same values give
/// bitwise the head-major sequential result: GQA groups, one and several key chunks (512 keys
/// each), tails of columns (`d = 24` and `80`), uneven head groups (8 heads in groups of 3 at
/// two threads), a causal mask, on every ISA. This holds while both layouts get the same
/// decode block size, which shrinks when a block's rows of all the interleaved heads would
/// take more than half the L2 (`decode_block_keys`: 32 heads of d 128 on a 2 MiB L2). Here
/// every case keeps `kv_heads·d ≤ 256`, 2 KiB of K and V a key, so 64 keys of them fit in
/// half of any L2 of 256 KiB or more.
#[test]
fn decode_head_groups_are_bitwise_head_major() {
    let cases = [(8, 1, 1300, 24), (3, 2, 600, 80), (2, 4, 1100, 16), (4, 1, 40, 64)];
    token_major_is_bitwise_head_major(Path::Decode, &cases, &[1, 3], Mask::Causal { offset: None });
}

/// The flash path copies a head's f32 K/V rows consecutive when the views' are not (a
/// token-major `[seq, kv_heads, d]` tensor) and at least 4 tasks read the head, once per thread
/// and head, growing the copy as the causal tasks reach further keys; the block products then
/// run on the copy as on a head-major view. So both layouts of the same values give bitwise
/// the same result, at every thread count: GQA groups (query heads sharing a copied head),
/// several heads per thread, key blocks with a tail, a causal diagonal with an offset and
/// without a mask, heads copied (300 queries) and read in place (37 queries, 2 or 3 query
/// heads per K/V head), on every ISA.
#[test]
fn flash_token_major_is_bitwise_head_major() {
    let cases = [(3, 4, 300, 64), (2, 3, 700, 80), (4, 2, 170, 16)];
    for mask in [Mask::Causal { offset: None }, Mask::None] {
        token_major_is_bitwise_head_major(Path::Flash, &cases, &[300, 37], mask);
    }
}

/// Runs `path` over K/V stored head-major and sequence-major, for each `(kv heads, group,
/// keys, d)` of `cases` and each query count of `nqs`, and asserts bitwise equal outputs at
/// one, two and three threads, on every ISA.
fn token_major_is_bitwise_head_major(
    path: Path,
    cases: &[(usize, usize, usize, usize)],
    nqs: &[usize],
    mask: Mask<'static>,
) {
    let mut rng = Rng::new(23);
    for &(hkv, group, nk, d) in cases {
        let hq = hkv * group;
        for &nq in nqs {
            let q: Vec<f32> = (0..hq * nq * d).map(|_| rng.below(64) as f32 / 32.0 - 1.0).collect();
            let k: Vec<f32> =
                (0..hkv * nk * d).map(|_| rng.below(64) as f32 / 32.0 - 1.0).collect();
            let v: Vec<f32> = (0..hkv * nk * d).map(|_| rng.below(64) as f32 - 32.0).collect();
            // The same values sequence-major: element (h, j, c) at (j·hkv + h)·d + c.
            let seq_major = |x: &[f32]| {
                let mut y = vec![0.0f32; x.len()];
                for h in 0..hkv {
                    for j in 0..nk {
                        let (src, dst) = ((h * nk + j) * d, (j * hkv + h) * d);
                        y[dst..dst + d].copy_from_slice(&x[src..src + d]);
                    }
                }
                y
            };
            let (ks, vs) = (seq_major(&k), seq_major(&v));
            let (bhsd, bshd) =
                (Tensor4Layout::bhsd(1, hkv, nk, d), Tensor4Layout::bshd(1, nk, hkv, d));
            let (lq, lo) = (Tensor4Layout::bhsd(1, hq, nq, d), Tensor4Layout::bhsd(1, hq, nq, d));
            let run = |k: &[f32], v: &[f32], l: Tensor4Layout, isa: Isa, threads: usize| {
                let mut o = vec![f32::NAN; hq * nq * d];
                Attention::new(TensorRef::new(&q, lq), TensorRef::new(k, l), TensorRef::new(v, l))
                    .mask(mask)
                    .path(path)
                    .isa(isa)
                    .parallelism(par(threads))
                    .run(TensorMut::new(&mut o, lo))
                    .unwrap();
                o
            };
            for isa in Isa::supported() {
                let want = run(&k, &v, bhsd, isa, 1);
                assert!(want.iter().all(|x| x.is_finite()));
                for threads in [1, 2, 3] {
                    for (name, got) in [
                        ("bhsd", run(&k, &v, bhsd, isa, threads)),
                        ("bshd", run(&ks, &vs, bshd, isa, threads)),
                    ] {
                        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{path:?} hkv {hkv} group {group} nk {nk} nq {nq} {name} {isa} \
                             {threads}t"
                        );
                    }
                }
            }
        }
    }
}

/// The flash kernel's online softmax runs the table exp on a key block when every score of the
/// block lies within 87 of the running max, and the full-range exp otherwise. Amplitudes from 2
/// to 12 (dk = 16, scale 1/4: score ranges per block from ~10 to far beyond 87), with and
/// without a causal mask (its diagonal blocks hold `−∞`), put blocks on both sides; every
/// result must stay within the derived bound. Letting the table exp take ranges down to −200
/// makes this fail.
#[test]
fn flash_blocks_on_both_sides_of_the_table_exp_range() {
    for amp in [2.0f32, 5.0, 8.0, 12.0] {
        for mask in [MaskKind::None, MaskKind::Causal(None)] {
            let case = Case::new(11, 1, 2, 1, 70, 400, 16, 16, false, 0, mask, amp);
            let (want, bounds) = (case.reference(), case.bounds());
            for isa in Isa::supported() {
                let p = Parallelism::Sequential;
                let got = case.run_kernel(p, |a, o| a.path(Path::Flash).isa(isa).run(o));
                if let Err(e) = compare(&case, "flash", &got, &want, &bounds, 1.0) {
                    panic!("amp {amp}, {mask:?}, {isa}: {e}");
                }
            }
        }
    }
}

/// Every path flushes a weight below `e^(−64)` ([`FLUSH_WEIGHTS_BELOW`]) to 0, and keeps one
/// just above: keys at scores 0, −62 and −66 with values 0, 1 and 10²⁰ give
/// `o = e^(−62)/(1 + e^(−62)) ≈ 1.2·10⁻²⁷`, not the `+ e^(−66)·10²⁰ ≈ 2·10⁻⁹` of an unflushed
/// weight. That gap is within the bound's `f·Σ|v|` term
/// ([`flushed_weight`](attn_tests::numerics::flushed_weight), checked too), so the flushing is
/// allowed, and the value shows that it happened. Also with 20 padding keys at score −∞ (the
/// vector loop, not only the tail).
#[test]
fn weights_below_the_threshold_flush_to_zero_on_every_path() {
    assert_eq!(FLUSH_WEIGHTS_BELOW, -64.0, "the keys below sit on either side of it");
    for pad in [0usize, 20] {
        let nk = 3 + pad;
        let mut k = vec![0.0f32, -62.0, -66.0];
        k.resize(nk, f32::NEG_INFINITY);
        let mut v = vec![0.0f32, 1.0, 1e20];
        v.resize(nk, 0.0);
        let want = (-62f64).exp() / (1.0 + (-62f64).exp() + (-66f64).exp());
        let bound =
            f64::from(f32::MIN_POSITIVE) + attn_tests::numerics::flushed_weight() * (1.0 + 1e20);
        for (name, path) in PATHS {
            for isa in Isa::supported() {
                let mut o = [f32::NAN];
                Attention::new(
                    TensorRef::new(&[1.0], Tensor4Layout::bhsd(1, 1, 1, 1)),
                    TensorRef::new(&k, Tensor4Layout::bhsd(1, 1, nk, 1)),
                    TensorRef::new(&v, Tensor4Layout::bhsd(1, 1, nk, 1)),
                )
                .scale(1.0)
                .path(path)
                .isa(isa)
                .run(TensorMut::new(&mut o, Tensor4Layout::bhsd(1, 1, 1, 1)))
                .unwrap();
                let got = f64::from(o[0]);
                let unflushed = want + (-66f64).exp() * 1e20;
                assert!((got - want).abs() <= 1e-5 * want, "{name}/{isa} pad {pad}: {got:e}");
                assert!((got - unflushed).abs() <= bound, "{name}/{isa}: outside the bound");
            }
        }
    }
}

/// `Path::Auto` (the default) takes the decode path up to 16 queries and the flash path above:
/// its results are bit-identical to the explicit path's, with the default ISA or an explicit one.
#[test]
fn dispatch_by_query_count() {
    for (nq, via_decode) in [(1, true), (16, true), (17, false), (40, false)] {
        let case = Case::new(7, 1, 2, 2, nq, 300, 64, 64, true, 0, MaskKind::None, 1.0);
        let p = Parallelism::Sequential;
        let isa = attn_kernels::arch::selected();
        let auto = case.run_kernel(p, |a, o| a.run(o));
        let with = case.run_kernel(p, |a, o| a.path(Path::Auto).isa(isa).run(o));
        let explicit = if via_decode {
            case.run_kernel(p, |a, o| a.path(Path::Decode).isa(isa).run(o))
        } else {
            case.run_kernel(p, |a, o| a.path(Path::Flash).isa(isa).run(o))
        };
        assert!(bits(&auto.0) == bits(&explicit.0) && bits(&auto.1) == bits(&explicit.1));
        assert!(bits(&with.0) == bits(&explicit.0), "nq {nq}");
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

const PATHS: [(&str, Path); 3] =
    [("flash", Path::Flash), ("decode", Path::Decode), ("unfused", Path::Unfused)];

/// `Attention` on the views `[q, k, v]` (data, layout) with `scale` and `mask`, on `path`,
/// `isa` and `threads`, into a NaN-filled output of layout `lo` (contiguous), returned.
fn run_views(
    [q, k, v]: [(&[f32], Tensor4Layout); 3],
    lo: Tensor4Layout,
    scale: f32,
    mask: &Mask<'_>,
    (path, isa, threads): (Path, Isa, usize),
) -> Vec<f32> {
    let mut o = vec![f32::NAN; lo.len()];
    Attention::new(TensorRef::new(q.0, q.1), TensorRef::new(k.0, k.1), TensorRef::new(v.0, v.1))
        .scale(scale)
        .mask(*mask)
        .path(path)
        .isa(isa)
        .parallelism(par(threads))
        .run(TensorMut::new(&mut o, lo))
        .unwrap();
    o
}

/// Every path, ISA and thread count on one case, checked with `check(path, output, lse)`.
fn all_paths(case: &Case, check: impl Fn(&str, &[f32], &[f32])) {
    for (name, path) in PATHS {
        for isa in Isa::supported() {
            for threads in [1, 2] {
                let p = par(threads);
                let (o, l) = case.run_kernel(p, |a, o| a.path(path).isa(isa).run(o));
                check(&format!("{name}/{isa}/{threads}t"), &o, &l);
            }
        }
    }
}

/// The design's golden example (from the seed "8 steps" article), scale 1 and 1/√3.
#[test]
fn golden_example() {
    use attn_tests::reference_support::golden;
    let (queries, keys, values) = (golden::QUERIES, golden::KEYS, golden::VALUES);
    let (want1, want3) = (golden::OUTPUT_SCALE_1, golden::OUTPUT_SCALE_RSQRT3);
    let l = Tensor4Layout::bhsd(1, 1, 3, 3);
    for (scale, want) in [(1.0f32, want1), (attn_reference::attention::default_scale(3), want3)] {
        for (name, path) in PATHS {
            for isa in Isa::supported() {
                let mut o = [0.0f32; 9];
                Attention::new(
                    TensorRef::new(&queries, l),
                    TensorRef::new(&keys, l),
                    TensorRef::new(&values, l),
                )
                .scale(scale)
                .path(path)
                .isa(isa)
                .run(TensorMut::new(&mut o, l))
                .unwrap();
                for (x, y) in o.iter().zip(want) {
                    // Scores up to 16 and values up to 8: a few ulp of 8 (2⁻²⁰ each).
                    assert!(
                        (f64::from(*x) - y).abs() <= 8.0 * 2f64.powi(-20),
                        "{name}/{isa}: {o:?}"
                    );
                }
            }
        }
    }
}

/// With all scores equal the weights are exactly `1/nk`; for `nk = 64` and small-integer
/// values the output is an exactly representable mean, so every path must match the reference
/// bit for bit (and the exp2 of 0 must be exactly 1).
#[test]
fn uniform_weights_are_exact() {
    let mut case = Case::new(3, 1, 2, 2, 37, 64, 16, 24, false, 1, MaskKind::None, 1.0);
    for x in case.q.0.iter_mut().filter(|x| !x.is_nan()) {
        *x = 0.0;
    }
    let mut rng = Rng::new(9);
    for x in case.v.0.iter_mut().filter(|x| !x.is_nan()) {
        *x = rng.below(17) as f32 - 8.0;
    }
    let want = case.reference();
    all_paths(&case, |name, o, l| {
        assert_eq!(bits(o), bits(&want.0), "{name}");
        for (x, y) in l.iter().zip(&want.1) {
            // ln 64 rounded: the kernels compute it as ln 2 · log₂ 64.
            assert!((x - y).abs() <= 2.0 * f32::EPSILON * y.abs(), "{name}: {x} vs {y}");
        }
    });
}

/// Fully masked rows give exact zeros and logsumexp −∞ on every path: a causal offset that
/// hides every key from the first queries, a keep-mask row of `false`, a bias row of −∞, and
/// `nk = 0`.
#[test]
fn fully_masked_rows_are_exactly_zero() {
    let cases = [
        Case::new(1, 1, 1, 2, 40, 50, 16, 8, true, 0, MaskKind::Causal(Some(-45)), 1.0),
        Case::new(
            2,
            2,
            1,
            1,
            20,
            33,
            8,
            8,
            false,
            1,
            MaskKind::Keep { density: 3, broadcast: true },
            1.0,
        ),
        Case::new(3, 1, 2, 1, 19, 70, 8, 5, true, 0, MaskKind::Bias, 1.0),
        Case::new(4, 1, 1, 1, 20, 0, 8, 5, true, 0, MaskKind::None, 1.0),
    ];
    for case in &cases {
        let want = case.reference();
        let mut masked_rows = 0;
        for row in 0..want.1.len() {
            masked_rows += usize::from(want.1[row] == f32::NEG_INFINITY);
        }
        assert!(masked_rows > 0, "case has no fully masked row: {}", describe(case));
        all_paths(case, |name, o, l| {
            let lo = case.o_layout;
            for b in 0..case.batch {
                for h in 0..case.hq {
                    for i in 0..case.nq {
                        let row = (b * case.hq + h) * case.nq + i;
                        if want.1[row] == f32::NEG_INFINITY {
                            assert_eq!(l[row], f32::NEG_INFINITY, "{name}");
                            for d in 0..case.dv {
                                assert_eq!(o[lo.index(b, h, i, d)].to_bits(), 0, "{name}");
                            }
                        }
                    }
                }
            }
        });
    }
}

/// `nq = 0` writes nothing and succeeds.
#[test]
fn empty_queries() {
    let case = Case::new(5, 1, 1, 1, 0, 10, 8, 8, true, 0, MaskKind::None, 1.0);
    all_paths(&case, |name, o, _| assert!(o.iter().all(|x| x.is_nan()), "{name}"));
}

/// A NaN in a query makes that row NaN (as in the reference), and only that row.
#[test]
fn nan_query_poisons_its_row_only() {
    let mut case = Case::new(6, 1, 1, 1, 40, 300, 16, 16, false, 0, MaskKind::None, 1.0);
    let idx = case.q.1.index(0, 0, 5, 3);
    case.q.0[idx] = f32::NAN;
    let want = case.reference();
    all_paths(&case, |name, o, l| {
        for i in 0..case.nq {
            let row_nan = (0..case.dv).all(|d| o[case.o_layout.index(0, 0, i, d)].is_nan());
            let row_num = (0..case.dv).all(|d| o[case.o_layout.index(0, 0, i, d)].is_finite());
            assert!(if i == 5 { row_nan && l[i].is_nan() } else { row_num }, "{name} row {i}");
            assert_eq!(want.1[i].is_nan(), l[i].is_nan());
        }
    });
}

/// Bad inputs give the reference's error on every path.
#[test]
fn bad_inputs_give_the_reference_errors() {
    let data = vec![0.0f32; 4096];
    let l = |b, h, s, d| Tensor4Layout::bhsd(b, h, s, d);
    let q_ok = l(1, 4, 5, 8);
    type Bad = (Tensor4Layout, Tensor4Layout, Tensor4Layout, Tensor4Layout, f32, usize);
    let bad: Vec<(&str, Bad)> = vec![
        ("k dim", (q_ok, l(1, 2, 6, 7), l(1, 2, 6, 8), l(1, 4, 5, 8), 1.0, 20)),
        ("kv heads", (q_ok, l(1, 3, 6, 8), l(1, 3, 6, 8), l(1, 4, 5, 8), 1.0, 20)),
        ("zero q heads", (l(1, 0, 5, 8), l(1, 2, 6, 8), l(1, 2, 6, 8), l(1, 0, 5, 8), 1.0, 0)),
        ("v seq", (q_ok, l(1, 2, 6, 8), l(1, 2, 7, 8), l(1, 4, 5, 8), 1.0, 20)),
        ("o dim", (q_ok, l(1, 2, 6, 8), l(1, 2, 6, 8), l(1, 4, 5, 9), 1.0, 20)),
        ("scale", (q_ok, l(1, 2, 6, 8), l(1, 2, 6, 8), l(1, 4, 5, 8), f32::NAN, 20)),
        ("lse len", (q_ok, l(1, 2, 6, 8), l(1, 2, 6, 8), l(1, 4, 5, 8), 1.0, 19)),
        ("q bounds", (l(1, 4, 5, 300), l(1, 2, 6, 300), l(1, 2, 6, 8), l(1, 4, 5, 8), 1.0, 20)),
        (
            "aliased o",
            (
                q_ok,
                l(1, 2, 6, 8),
                l(1, 2, 6, 8),
                Tensor4Layout::strided([1, 4, 5, 8], [0, 0, 8, 1], 0),
                1.0,
                20,
            ),
        ),
        (
            "overflow",
            (
                Tensor4Layout::strided([1, 4, 5, 8], [0, usize::MAX / 2, 8, 1], 0),
                l(1, 2, 6, 8),
                l(1, 2, 6, 8),
                l(1, 4, 5, 8),
                1.0,
                20,
            ),
        ),
    ];
    for (what, (ql, kl, vl, ol, scale, nlse)) in bad {
        let run = |f: &dyn Fn(TensorMut<'_>, &mut [f32]) -> attn_reference::Result<()>| {
            let mut o = vec![0.0f32; 4096];
            let mut lse = vec![0.0f32; nlse];
            f(TensorMut::new(&mut o, ol), &mut lse)
        };
        let (q, k, v) =
            (TensorRef::new(&data, ql), TensorRef::new(&data, kl), TensorRef::new(&data, vl));
        let want: Error = run(&|o, lse| {
            attn_reference::attention::attention(q, k, v, scale, &Mask::None, o, Some(lse))
        })
        .expect_err(what);
        for (name, path) in PATHS {
            for isa in Isa::supported() {
                let got = run(&|o, lse| {
                    Attention::new(q, k, v).scale(scale).lse(lse).path(path).isa(isa).run(o)
                });
                // Debug text, since a NaN scale inside the error is not == itself.
                assert_eq!(
                    format!("{got:?}"),
                    format!("{:?}", Err::<(), _>(&want)),
                    "{what}: {name}/{isa}"
                );
            }
        }
        let got = run(&|o, lse| Attention::new(q, k, v).scale(scale).lse(lse).run(o));
        assert_eq!(format!("{got:?}"), format!("{:?}", Err::<(), _>(&want)), "{what}: attention");
    }
    // A mask of the wrong shape.
    let keep = vec![true; 100];
    let mask = Mask::Keep { keep: &keep, layout: l(1, 4, 5, 5) };
    let (q, k, v) = (
        TensorRef::new(&data, q_ok),
        TensorRef::new(&data, l(1, 2, 6, 8)),
        TensorRef::new(&data, l(1, 2, 6, 8)),
    );
    let mut o = vec![0.0f32; 160];
    let want = attn_reference::attention::attention(
        q,
        k,
        v,
        1.0,
        &mask,
        TensorMut::new(&mut o, l(1, 4, 5, 8)),
        None,
    );
    assert!(want.is_err());
    for (name, path) in PATHS {
        let got = Attention::new(q, k, v)
            .scale(1.0)
            .mask(mask)
            .path(path)
            .isa(Isa::Portable)
            .run(TensorMut::new(&mut o, l(1, 4, 5, 8)));
        assert_eq!(got, want.clone(), "mask: {name}");
    }
}

/// Memory: attention at N = 131072, one head, d = 64 never materialises the 64 GiB score
/// matrix. Peak RSS (VmHWM) must stay within the size of Q, K, V and O (128 MiB) plus 64 MiB.
/// Takes about a minute on 2 threads; run with
/// `cargo test --release -p attn-tests --test suite -- --ignored memory_n131072`.
#[test]
#[ignore = "long-running (≈1 min): run explicitly, see the doc comment"]
fn memory_n131072() {
    const N: usize = 131_072;
    const D: usize = 64;
    let l = Tensor4Layout::bhsd(1, 1, N, D);
    let mut rng = Rng::new(1);
    let mut fill = || (0..N * D).map(|_| rng.uniform(-1.0, 1.0)).collect::<Vec<f32>>();
    let (q, k, v) = (fill(), fill(), fill());
    let mut o = vec![0.0f32; N * D];
    Attention::new(TensorRef::new(&q, l), TensorRef::new(&k, l), TensorRef::new(&v, l))
        .parallelism(Parallelism::threads(2))
        .run(TensorMut::new(&mut o, l))
        .unwrap();
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let hwm_kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM line");
    let operands = 4 * N * D * 4;
    let limit = operands + (64 << 20);
    eprintln!(
        "peak RSS {} MiB; Q+K+V+O {} MiB; limit {} MiB",
        hwm_kib >> 10,
        operands >> 20,
        limit >> 20
    );
    assert!(hwm_kib * 1024 <= limit);
    assert!(o.iter().all(|x| x.is_finite()));
    // Spot-check a few rows against the reference on a key prefix would be too slow at this
    // size; the proptests cover correctness, this test covers memory.
}

/// Keys of zero weight never read their values: `±∞`/NaN values at keys no query sees (a
/// keep mask, a −∞ bias, keys past every causal diagonal, like unwritten KV-cache slots) leave
/// the output finite and equal to the reference (which skips zero weights), on every path, ISA
/// and thread count. Scores are O(1) and values small integers, so the outputs agree to a few
/// ulp of the largest value.
#[test]
fn masked_nonfinite_values_do_not_leak() {
    let (hq, nk, dk, dv) = (2, 45, 8, 12);
    let hidden = |j: usize| j % 5 == 4 || j >= 40;
    let mut rng = Rng::new(17);
    for nq in [1, 20, 37] {
        let q: Vec<f32> = (0..hq * nq * dk).map(|_| rng.below(5) as f32 / 4.0 - 0.5).collect();
        let k: Vec<f32> = (0..nk * dk).map(|_| rng.below(5) as f32 / 4.0 - 0.5).collect();
        let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        let v: Vec<f32> = (0..nk * dv)
            .map(|x| if hidden(x / dv) { specials[x % 3] } else { rng.below(17) as f32 - 8.0 })
            .collect();
        // for the causal mask only keys 40.. are hidden: finite values elsewhere
        let v_causal: Vec<f32> = v
            .iter()
            .enumerate()
            .map(|(x, &y)| if x / dv < 40 && !y.is_finite() { 1.0 } else { y })
            .collect();
        let ml = Tensor4Layout::bhsd(1, hq, nq, nk);
        let keep: Vec<bool> = (0..hq * nq * nk).map(|x| !hidden(x % nk)).collect();
        let bias: Vec<f32> =
            keep.iter().map(|&k| if k { 0.0 } else { f32::NEG_INFINITY }).collect();
        // query i sees keys j ≤ i + 35 − nq ≤ 34: never keys 40.. (the first rows see none)
        let causal = Mask::Causal { offset: Some(35 - nq as isize) };
        let masks = [
            ("keep", Mask::Keep { keep: &keep, layout: ml }, &v),
            ("bias", Mask::Bias { bias: &bias, layout: ml }, &v),
            ("causal", causal, &v_causal),
        ];
        let (lq, lk, lv) = (
            Tensor4Layout::bhsd(1, hq, nq, dk),
            Tensor4Layout::bhsd(1, 1, nk, dk),
            Tensor4Layout::bhsd(1, 1, nk, dv),
        );
        let lo = Tensor4Layout::bhsd(1, hq, nq, dv);
        for (kind, mask, v) in &masks {
            let mut want = vec![0.0f32; hq * nq * dv];
            attn_reference::attention::attention(
                TensorRef::new(&q, lq),
                TensorRef::new(&k, lk),
                TensorRef::new(v, lv),
                1.0,
                mask,
                TensorMut::new(&mut want, lo),
                None,
            )
            .unwrap();
            assert!(want.iter().all(|x| x.is_finite()), "reference {want:?}");
            for (name, path) in PATHS {
                for isa in Isa::supported() {
                    for threads in [1, 2] {
                        let views = [(&q[..], lq), (&k[..], lk), (&v[..], lv)];
                        let o = run_views(views, lo, 1.0, mask, (path, isa, threads));
                        for (x, y) in o.iter().zip(&want) {
                            // |values| ≤ 8, ≤ 45 keys: far inside 64 ulp of 8.
                            assert!(
                                (x - y).abs() <= 64.0 * 8.0 * f32::EPSILON,
                                "{name}/{isa}/{threads}t nq {nq} {kind}: {x} vs {y}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A mask over every (query, key) pair gives the same bits whichever way it is laid out: with
/// its keys contiguous (`[.., nq, nk]`, which the flash path applies by transposed blocks of
/// `LANES × LANES`) and with its queries contiguous (which it applies element by element).
/// Every path, ISA and thread count; sizes around the block edges, with row tiles that end in
/// a partial group of `LANES` rows (29 queries: tiles of 16 + 13 or one of 29); biases with
/// −∞. For the keep-mask, two keys hidden from every query have scores of ±∞ and NaN: the
/// mask must overwrite them, so the output stays finite (an added −∞ would make NaN of +∞).
#[test]
fn full_masks_give_the_same_bits_in_either_layout() {
    let (hq, dk, dv) = (2, 8, 8);
    let mut rng = Rng::new(0x3a5c);
    for (nq, nk) in [(16, 16), (33, 47), (8, 64), (64, 17), (40, 100), (29, 40)] {
        let q: Vec<f32> = (0..hq * nq * dk).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let k: Vec<f32> = (0..nk * dk).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let v: Vec<f32> = (0..nk * dv).map(|_| rng.uniform(-1.0, 1.0)).collect();
        // Keys 1 and nk − 1 of `k_special` score ±∞ and NaN against every query.
        let (inf_key, nan_key) = (1, nk - 1);
        let mut k_special = k.clone();
        k_special[inf_key * dk] = f32::INFINITY;
        k_special[nan_key * dk + 2] = f32::NAN;
        // Element (h, i, j) at h·nq·nk + i·nk + j (keys contiguous) or h·nq·nk + j·nq + i.
        let by_key = Tensor4Layout::bhsd(1, hq, nq, nk);
        let by_query = Tensor4Layout::strided([1, hq, nq, nk], [hq * nq * nk, nq * nk, 1, nq], 0);
        let hide = |h: usize, i: usize, j: usize| {
            j == inf_key || j == nan_key || ((h + 3 * i + 7 * j).is_multiple_of(5) && j != i % nk)
        };
        let (mut bias_k, mut bias_q) = (vec![0.0f32; hq * nq * nk], vec![0.0f32; hq * nq * nk]);
        let (mut keep_k, mut keep_q) = (vec![true; hq * nq * nk], vec![true; hq * nq * nk]);
        for h in 0..hq {
            for i in 0..nq {
                for j in 0..nk {
                    let b = if hide(h, i, j) { f32::NEG_INFINITY } else { rng.uniform(-2.0, 2.0) };
                    bias_k[by_key.index(0, h, i, j)] = b;
                    bias_q[by_query.index(0, h, i, j)] = b;
                    keep_k[by_key.index(0, h, i, j)] = !hide(h, i, j);
                    keep_q[by_query.index(0, h, i, j)] = !hide(h, i, j);
                }
            }
        }
        let cases = [
            (
                "bias",
                &k,
                Mask::Bias { bias: &bias_k, layout: by_key },
                Mask::Bias { bias: &bias_q, layout: by_query },
            ),
            (
                "keep",
                &k_special,
                Mask::Keep { keep: &keep_k, layout: by_key },
                Mask::Keep { keep: &keep_q, layout: by_query },
            ),
        ];
        let (lq, lk, lv) = (
            Tensor4Layout::bhsd(1, hq, nq, dk),
            Tensor4Layout::bhsd(1, 1, nk, dk),
            Tensor4Layout::bhsd(1, 1, nk, dv),
        );
        let lo = Tensor4Layout::bhsd(1, hq, nq, dv);
        for (kind, k, a, b) in &cases {
            for (name, path) in PATHS {
                for isa in Isa::supported() {
                    for threads in [1, 2] {
                        let views = [(&q[..], lq), (&k[..], lk), (&v[..], lv)];
                        let scale = attn_reference::attention::default_scale(dk);
                        let run = |mask| run_views(views, lo, scale, mask, (path, isa, threads));
                        let (x, y) = (run(a), run(b));
                        let what = format!("{name}/{isa}/{threads}t {nq}×{nk} {kind}");
                        assert!(x.iter().all(|x| x.is_finite()), "{what}: {x:?}");
                        let same = x.iter().zip(&y).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "{what}: {x:?} vs {y:?}");
                    }
                }
            }
        }
    }
}

/// Blocks that a keep-mask hides from every query of a tile are skipped before their scores
/// (`Problem::hides_block`): key padding (`[b, 1, 1, nk]`, each batch padded from its own
/// length, one batch with every key hidden) and a block-diagonal mask over every pair (query
/// `i` sees keys `j` with `j / 70 = i / 70`, so whole tiles see whole blocks of nothing).
/// The hidden keys' K and V hold ±∞ and NaN, which a block that is not skipped overwrites or
/// weighs 0. Every path, ISA and thread count, against the reference within the derived
/// bounds; decode with 1 and 3 queries, GQA.
#[test]
fn blocks_hidden_by_a_keep_mask_are_skipped() {
    for (nq, nk, diagonal) in
        [(1, 700, false), (3, 700, false), (200, 333, false), (150, 420, true)]
    {
        let (batch, hkv, group) = (3, 2, 2);
        let mut case = Case::new(
            0x5c1b + nq as u64,
            batch,
            hkv,
            group,
            nq,
            nk,
            32,
            24,
            false,
            0,
            MaskKind::Keep { density: 2, broadcast: false },
            1.0,
        );
        let lens = [nk / 3, 0, nk - 5];
        let hidden = |b: usize, i: usize, j: usize| {
            if diagonal {
                j / 70 != i / 70
            } else {
                j >= lens[b]
            }
        };
        if diagonal {
            case.mask_layout =
                Tensor4Layout::strided([batch, case.hq, nq, nk], [nq * nk, 0, nk, 1], 0);
            case.keep = (0..batch * nq * nk).map(|x| !hidden(0, x / nk % nq, x % nk)).collect();
        } else {
            case.mask_layout = Tensor4Layout::strided([batch, case.hq, nq, nk], [nk, 0, 0, 1], 0);
            case.keep = (0..batch * nk).map(|x| !hidden(x / nk, 0, x % nk)).collect();
        }
        // The bounds of the finite values: hidden keys add nothing to them (the ±∞ and NaN
        // put there next would make the magnitudes they sum non-finite).
        let bounds = case.bounds();
        // Non-finite K and V at keys no query of their batch sees (every K/V head).
        let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        for b in 0..batch {
            for h in 0..hkv {
                for j in (0..nk).filter(|&j| (0..nq).all(|i| hidden(b, i, j))) {
                    let (kl, vl) = (case.k.1, case.v.1);
                    case.k.0[kl.index(b, h, j, j % 32)] = specials[j % 3];
                    case.v.0[vl.index(b, h, j, (j + 1) % 24)] = specials[(j + 1) % 3];
                }
            }
        }
        let want = case.reference();
        all_paths(&case, |what, o, l| {
            let got = (o.to_vec(), l.to_vec());
            if let Err(e) = compare(&case, what, &got, &want, &bounds, 1.0) {
                panic!("nq {nq} nk {nk} diagonal {diagonal}: {e}");
            }
        });
    }
}
