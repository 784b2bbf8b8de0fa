//! SGEMM against the reference: proptest equivalence over edge-biased shapes, every stride
//! layout, α/β combinations and every ISA this CPU runs; exact equality on small integers; NaN
//! guard bands; β = 0 with a NaN-filled C; threaded vs sequential (bitwise); the pre-packed B
//! path; bad-input errors. The mixed-precision GEMM (A and B of f32, bf16 or f16): within the
//! bound of the reference on the exact values, and bitwise equal to SGEMM on them (packing
//! widens exactly, the micro-kernels are the same).

use attn_kernels::arch::convert::Convertible;
use attn_kernels::gemm::blocking::{Blocking, DIRECT_A_COL_MAJOR_MAX_PANELS};
use attn_kernels::gemm::{gemm_with_isa, sgemm, sgemm_packed_b, sgemm_with_isa, PackedB};
use attn_kernels::{bf16, f16, Isa, Parallelism};
use attn_reference::matmul::matmul;
use attn_reference::{Error, MatLayout, MatMut, MatRef};
use attn_tests::gemm_support::{bound, buffer, outside, Layout, Rng, GEMM_TILES, TILES};
use proptest::prelude::*;

/// The ISAs to test, printing the ones this CPU cannot run.
fn isas() -> Vec<Isa> {
    static REPORT: std::sync::Once = std::sync::Once::new();
    let s = Isa::supported();
    REPORT.call_once(|| {
        for isa in Isa::ALL.into_iter().filter(|i| !s.contains(i)) {
            eprintln!("gemm tests: skipping {isa} (not supported by this CPU)");
        }
    });
    s
}

/// Edge sizes of every kernel: 0, 1, MR±1, NR±1 for each ISA, 17, 63, 257.
fn edge_sizes() -> Vec<usize> {
    let mut v = vec![0, 1, 2, 17, 63, 257];
    for (mr, nr) in TILES {
        v.extend([mr - 1, mr, mr + 1, nr - 1, nr, nr + 1]);
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// A size: mostly edge sizes, sometimes any size up to 80.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![3 => proptest::sample::select(edge_sizes()), 1 => 0usize..80]
}

const ALPHAS: [f32; 4] = [1.0, -0.75, 0.0, 3.0];
const BETAS: [f32; 4] = [0.0, 1.0, -0.5, 2.0];

/// Guard elements after each C view (and the gaps inside padded layouts) that must stay NaN.
const GUARD: usize = 19;

struct Case {
    m: usize,
    n: usize,
    k: usize,
    la: MatLayout,
    lb: MatLayout,
    lc: MatLayout,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl Case {
    #[allow(clippy::too_many_arguments)]
    fn new(
        m: usize,
        n: usize,
        k: usize,
        lay: [Layout; 3],
        beta: f32,
        seed: u64,
        mut val: impl FnMut(&mut Rng) -> f32,
    ) -> Case {
        let mut rng = Rng::new(seed);
        let (la, lb, lc) = (lay[0].view(m, k), lay[1].view(k, n), lay[2].view(m, n));
        let a = buffer(&la, 3, f32::NAN, || val(&mut rng));
        let b = buffer(&lb, 3, f32::NAN, || val(&mut rng));
        // β = 0: C's own elements are NaN too, and must not leak.
        let c = if beta == 0.0 {
            buffer(&lc, GUARD, f32::NAN, || f32::NAN)
        } else {
            buffer(&lc, GUARD, f32::NAN, || val(&mut rng))
        };
        Case { m, n, k, la, lb, lc, a, b, c }
    }

    fn run(&self, isa: Isa, alpha: f32, beta: f32, par: Parallelism) -> Vec<f32> {
        let mut c = self.c.clone();
        sgemm_with_isa(
            isa,
            alpha,
            MatRef::new(&self.a, self.la),
            MatRef::new(&self.b, self.lb),
            beta,
            MatMut::new(&mut c, self.lc),
            par,
        )
        .unwrap();
        c
    }

    fn reference(&self, alpha: f32, beta: f32) -> Vec<f32> {
        let mut c = self.c.clone();
        matmul(
            alpha,
            MatRef::new(&self.a, self.la),
            MatRef::new(&self.b, self.lb),
            beta,
            MatMut::new(&mut c, self.lc),
        )
        .unwrap();
        c
    }

    /// Checks `got` against the reference within the error bound, and the guard band.
    fn check(&self, what: &str, got: &[f32], want: &[f32], alpha: f32, beta: f32) {
        for x in outside(&self.lc, got.len()) {
            assert!(
                got[x].is_nan(),
                "{what}: element {x} outside C's view was written: {}",
                got[x]
            );
        }
        for i in 0..self.m {
            for j in 0..self.n {
                let x = self.lc.index(i, j);
                let tol = bound(alpha, &self.a, &self.la, &self.b, &self.lb, beta, self.c[x], i, j);
                let err = (got[x] as f64 - want[x] as f64).abs();
                assert!(
                    err <= tol,
                    "{what}: ({i},{j}) of {}x{}x{}: got {} want {} (err {err:e} > {tol:e})",
                    self.m,
                    self.n,
                    self.k,
                    got[x],
                    want[x]
                );
            }
        }
    }
}

fn layout() -> impl Strategy<Value = Layout> {
    proptest::sample::select(Layout::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every supported ISA agrees with the f64 reference within the forward error bound, on
    /// every layout, and leaves the guard band untouched.
    #[test]
    fn matches_reference(
        m in size(), n in size(), k in size(),
        la in layout(), lb in layout(), lc in layout(),
        ai in 0..ALPHAS.len(), bi in 0..BETAS.len(),
        seed in any::<u64>(),
    ) {
        // Keep the f64 reference affordable: at most one dimension at 257.
        prop_assume!(m * n * k <= 257 * 80 * 80);
        let (alpha, beta) = (ALPHAS[ai], BETAS[bi]);
        let case = Case::new(m, n, k, [la, lb, lc], beta, seed, Rng::unit);
        let want = case.reference(alpha, beta);
        for isa in isas() {
            let got = case.run(isa, alpha, beta, Parallelism::Sequential);
            case.check(&format!("{isa} {la:?}/{lb:?}/{lc:?} α={alpha} β={beta}"), &got, &want, alpha, beta);
        }
    }
}

/// Rounds the case's A and B to `TA` / `TB` (the guards stay NaN), replaces its f32 buffers by
/// the exact values of the rounded ones, and checks the mixed-precision GEMM on every ISA:
/// within the bound of the reference, and bitwise equal to SGEMM on the same values (including
/// the guard band and, with β = 0, C's NaNs not leaking).
fn check_mixed<TA: Convertible, TB: Convertible>(
    case: &mut Case,
    alpha: f32,
    beta: f32,
    par: Parallelism,
) {
    let a: Vec<TA> = case.a.iter().map(|&v| TA::from_f32(v)).collect();
    let b: Vec<TB> = case.b.iter().map(|&v| TB::from_f32(v)).collect();
    case.a = a.iter().map(|v| v.to_f32()).collect();
    case.b = b.iter().map(|v| v.to_f32()).collect();
    let want = case.reference(alpha, beta);
    let (ta, tb) = (TA::DTYPE, TB::DTYPE);
    for isa in isas() {
        let mut c = case.c.clone();
        gemm_with_isa(
            isa,
            alpha,
            MatRef::new(&a, case.la),
            MatRef::new(&b, case.lb),
            beta,
            MatMut::new(&mut c, case.lc),
            par,
        )
        .unwrap();
        let what =
            format!("{isa} {ta}×{tb} {:?}/{:?}/{:?} α={alpha} β={beta}", case.la, case.lb, case.lc);
        case.check(&what, &c, &want, alpha, beta);
        let f = case.run(isa, alpha, beta, par);
        let same = c.iter().zip(&f).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(
            same,
            "{what}: {}x{}x{} differs from sgemm on the same values",
            case.m, case.n, case.k
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// bf16/f16/f32 operands in the combinations engines pass: all half, or one side f32.
    #[test]
    fn mixed_precision_matches_reference_and_sgemm(
        m in size(), n in size(), k in size(),
        la in layout(), lb in layout(), lc in layout(),
        ai in 0..ALPHAS.len(), bi in 0..BETAS.len(),
        combo in 0..5usize,
        seed in any::<u64>(),
    ) {
        prop_assume!(m * n * k <= 257 * 80 * 80);
        let (alpha, beta) = (ALPHAS[ai], BETAS[bi]);
        let mut case = Case::new(m, n, k, [la, lb, lc], beta, seed, Rng::unit);
        let seq = Parallelism::Sequential;
        match combo {
            0 => check_mixed::<bf16, bf16>(&mut case, alpha, beta, seq),
            1 => check_mixed::<f16, f16>(&mut case, alpha, beta, seq),
            2 => check_mixed::<f32, bf16>(&mut case, alpha, beta, seq),
            3 => check_mixed::<f16, f32>(&mut case, alpha, beta, seq),
            _ => check_mixed::<bf16, f16>(&mut case, alpha, beta, seq),
        }
    }
}

/// Larger mixed-precision products, threaded, past several KC blocks and with a column-major
/// C (the transposed problem, where A and B swap element types).
#[test]
fn mixed_precision_large_and_threaded() {
    // (m, n, k, the layouts of A, B and C). Past KC (512 at most) and MC (at most 256 rows on
    // a 2 MiB L2); C at 1030 columns spans several NC blocks wherever the L2 is at most 2 MiB.
    // The third reads its row-major A in place (widened block by block), the fourth packs its
    // column-major A (C past `DIRECT_A_COL_MAJOR_MAX_PANELS` micro-panels); the fifth has a
    // column-major C, which transposes the problem to 260 × 1030 with the user's B, as a
    // column-major A, packed. Two threads split the third and fourth by rows (264 and 256 on
    // the 6-row tiles), the fifth by columns.
    let (r, c) = (Layout::RowMajor, Layout::ColMajor);
    let shapes = [
        (300, 200, 1100, [r, Layout::PaddedCols(1), r]),
        (150, 301, 200, [r, Layout::PaddedCols(1), c]),
        (520, 1030, 530, [r, Layout::PaddedCols(1), r]),
        (520, 1030, 530, [c, Layout::PaddedCols(1), r]),
        (1030, 260, 530, [r, r, c]),
    ];
    for (m, n, k, lays) in shapes {
        let mut case = Case::new(m, n, k, lays, 0.5, 11, Rng::unit);
        check_mixed::<bf16, f16>(&mut case, 1.5, 0.5, Parallelism::threads(2));
        let mut case = Case::new(m, n, k, lays, 0.0, 12, Rng::unit);
        check_mixed::<f16, bf16>(&mut case, -1.0, 0.0, Parallelism::Sequential);
    }
}

/// A row-major A is read in place at any width, a column-major one while C is at most
/// `DIRECT_A_COL_MAJOR_MAX_PANELS` micro-panels wide, and packed past that (and always when
/// neither of its strides is 1). Both feed the micro-kernel the same steps, so on the same
/// values the results are bitwise equal, and within the reference's bound; half-precision A is
/// widened in place or while packed, bitwise as SGEMM on its values. Shapes on both sides of the
/// column-major width for every ISA's tile, and past several NC blocks.
#[test]
fn a_in_place_and_packed_agree() {
    // Each tile's edge and one past it, for the AVX2 / portable and the AVX-512 widths, and
    // C over two NC blocks and part of a third on this machine.
    let edges = GEMM_TILES.iter().map(|t| DIRECT_A_COL_MAJOR_MAX_PANELS * t.1);
    let caches = attn_kernels::arch::cache::detected();
    let nc = GEMM_TILES.iter().map(|t| Blocking::derive(&caches, t.0, t.1).nc).max();
    let blocks = 2 * nc.unwrap_or(0) + 37;
    let mut widths: Vec<usize> = edges.flat_map(|e| [e, e + 1]).chain([200, blocks]).collect();
    widths.sort_unstable();
    widths.dedup();
    for n in widths {
        for la in [Layout::RowMajor, Layout::ColMajor, Layout::PaddedRows(3), Layout::PaddedCols(5)]
        {
            let lays = [la, Layout::RowMajor, Layout::RowMajor];
            let case = Case::new(7, n, 70, lays, 0.5, 21, Rng::unit);
            let mut general =
                Case::new(7, n, 70, [Layout::General, lays[1], lays[2]], 0.5, 21, Rng::unit);
            for i in 0..7 {
                for p in 0..70 {
                    general.a[general.la.index(i, p)] = case.a[case.la.index(i, p)];
                }
            }
            (general.b, general.c) = (case.b.clone(), case.c.clone());
            let want = case.reference(1.5, 0.5);
            for isa in isas() {
                let got = case.run(isa, 1.5, 0.5, Parallelism::Sequential);
                case.check(&format!("{isa} {la:?} n={n}"), &got, &want, 1.5, 0.5);
                let packed = general.run(isa, 1.5, 0.5, Parallelism::Sequential);
                let same = got.iter().zip(&packed).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{isa} {la:?} 7x{n}x70: A in this layout and packed differ");
            }
        }
        for la in [Layout::RowMajor, Layout::ColMajor] {
            let lays = [la, Layout::RowMajor, Layout::RowMajor];
            let mut case = Case::new(7, n, 70, lays, 0.5, 22, Rng::unit);
            check_mixed::<bf16, f32>(&mut case, 1.5, 0.5, Parallelism::Sequential);
            let mut case = Case::new(7, n, 70, lays, 0.0, 23, Rng::unit);
            check_mixed::<f16, f32>(&mut case, -1.0, 0.0, Parallelism::Sequential);
        }
    }
}

/// Small integers: every partial sum is exact in f32, so the result must be bit-exact.
#[test]
fn exact_on_small_integers() {
    let sizes = [(1, 1, 1), (13, 33, 7), (25, 17, 300), (7, 65, 257), (40, 3, 513)];
    for (idx, &(m, n, k)) in sizes.iter().enumerate() {
        for (li, &lay) in Layout::ALL.iter().enumerate() {
            let lays = [lay, Layout::ALL[(li + 1) % 5], Layout::ALL[(li + 2) % 5]];
            for (alpha, beta) in [(1.0, 0.0), (2.0, 1.0), (-1.0, -3.0)] {
                let case = Case::new(m, n, k, lays, beta, idx as u64, |r| r.small_int(4));
                let want = case.reference(alpha, beta);
                for isa in isas() {
                    let got = case.run(isa, alpha, beta, Parallelism::Sequential);
                    for i in 0..m {
                        for j in 0..n {
                            let x = case.lc.index(i, j);
                            assert_eq!(got[x], want[x], "{isa} {lays:?} {m}x{n}x{k} ({i},{j})");
                        }
                    }
                }
            }
        }
    }
}

/// α = 0: A·B is not computed (BLAS semantics), so NaN and ∞ in A and B do not matter.
#[test]
fn alpha_zero_does_not_touch_the_product() {
    let (m, n, k) = (5, 7, 3);
    let a = vec![f32::NAN; m * k];
    let b = vec![f32::INFINITY; k * n];
    for isa in isas() {
        for beta in [0.0, 2.0] {
            let mut c: Vec<f32> = (0..m * n).map(|x| x as f32).collect();
            sgemm_with_isa(
                isa,
                0.0,
                MatRef::row_major(&a, m, k),
                MatRef::row_major(&b, k, n),
                beta,
                MatMut::row_major(&mut c, m, n),
                Parallelism::Sequential,
            )
            .unwrap();
            for (x, &v) in c.iter().enumerate() {
                assert_eq!(v, beta * x as f32, "{isa} β={beta}");
            }
        }
    }
}

/// Threads only split C between workers; each element sees the same operations in the same
/// order, so the result is bitwise equal to the sequential one. Shapes exercise both splits
/// (rows; columns when m is short, or when C is wide enough that a column split packs much less)
/// and a column-major C (the transposed problem).
#[test]
fn threaded_is_bitwise_sequential() {
    let shapes = [
        (300, 200, 300, Layout::RowMajor),
        (20, 700, 260, Layout::RowMajor),
        (130, 400, 150, Layout::RowMajor),
        (150, 301, 200, Layout::ColMajor),
    ];
    for (m, n, k, lc) in shapes {
        let case =
            Case::new(m, n, k, [Layout::RowMajor, Layout::PaddedCols(1), lc], 0.5, 7, Rng::unit);
        for isa in isas() {
            let seq = case.run(isa, 1.5, 0.5, Parallelism::Sequential);
            for t in [2, 3] {
                let par = case.run(isa, 1.5, 0.5, Parallelism::threads(t));
                let same = seq.iter().zip(&par).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{isa} {m}x{n}x{k} {t} threads differ from sequential");
            }
        }
    }
}

/// The pre-packed path computes exactly what `sgemm` computes (same kernel, same blocking).
#[test]
fn packed_b_equals_sgemm() {
    for (m, n, k) in [(1, 1, 1), (37, 45, 300), (130, 70, 64), (5, 3, 0)] {
        let case = Case::new(
            m,
            n,
            k,
            [Layout::PaddedRows(2), Layout::ColMajor, Layout::RowMajor],
            1.0,
            3,
            Rng::unit,
        );
        for isa in isas() {
            let want = case.run(isa, 0.5, 1.0, Parallelism::Sequential);
            let pb = PackedB::with_isa(isa, MatRef::new(&case.b, case.lb)).unwrap();
            assert_eq!((pb.rows(), pb.cols(), pb.isa()), (k, n, isa));
            for par in [Parallelism::Sequential, Parallelism::threads(2)] {
                let mut c = case.c.clone();
                sgemm_packed_b(
                    0.5,
                    MatRef::new(&case.a, case.la),
                    &pb,
                    1.0,
                    MatMut::new(&mut c, case.lc),
                    par,
                )
                .unwrap();
                assert!(
                    c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{isa} packed B {m}x{n}x{k}"
                );
            }
        }
    }
}

/// `GEMM_TILES` names the kernels the ISAs run (their names carry the tile), so the edge
/// sizes follow the kernels.
#[test]
fn tiles_are_the_kernels() {
    for (isa, (mr, nr)) in Isa::ALL.into_iter().zip(GEMM_TILES) {
        if let Ok(pb) = PackedB::empty(isa) {
            let want = format!("sgemm_{mr}x{nr}_{isa}");
            assert!(format!("{pb:?}").contains(&want), "{pb:?} is not {want}");
        }
    }
}

/// A packed B wider than a B block and deeper than a k-block of this machine's blocking gives
/// the bits of `sgemm`: the loop nest finds each block of the packed operand where it was
/// packed: two whole column blocks and a partial third, one whole k-block and part of a second,
/// for the largest NC and KC of the GEMM tiles.
#[test]
fn packed_b_spans_blocks() {
    let caches = attn_kernels::arch::cache::detected();
    let blocks = GEMM_TILES.map(|(mr, nr)| Blocking::derive(&caches, mr, nr));
    let nc = blocks.iter().map(|b| b.nc).max().unwrap_or(0);
    let kc = blocks.iter().map(|b| b.kc).max().unwrap_or(0);
    let (m, n, k) = (13, 2 * nc + 37, kc + 77);
    let case = Case::new(m, n, k, [Layout::RowMajor; 3], 1.0, 21, Rng::unit);
    for isa in isas() {
        let want = case.run(isa, 1.0, 1.0, Parallelism::Sequential);
        let pb = PackedB::with_isa(isa, MatRef::new(&case.b, case.lb)).unwrap();
        for par in [Parallelism::Sequential, Parallelism::threads(2)] {
            let mut c = case.c.clone();
            let a = MatRef::new(&case.a, case.la);
            sgemm_packed_b(1.0, a, &pb, 1.0, MatMut::new(&mut c, case.lc), par).unwrap();
            assert!(c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "{isa} {par:?}");
        }
    }
}

/// A PackedB repacked with another shape is reused correctly.
#[test]
fn packed_b_repack() {
    let isa = Isa::best();
    let mut pb = PackedB::empty(isa).unwrap();
    for (m, n, k) in [(40, 70, 300), (9, 5, 3), (33, 100, 17)] {
        let case = Case::new(m, n, k, [Layout::RowMajor; 3], 0.0, 11, Rng::unit);
        pb.pack(MatRef::new(&case.b, case.lb)).unwrap();
        let mut c = case.c.clone();
        sgemm_packed_b(
            1.0,
            MatRef::new(&case.a, case.la),
            &pb,
            0.0,
            MatMut::new(&mut c, case.lc),
            Parallelism::Sequential,
        )
        .unwrap();
        case.check("repacked", &c, &case.reference(1.0, 0.0), 1.0, 0.0);
    }
}

/// Bad input gives the same typed error as the reference, before anything is written.
#[test]
fn bad_inputs_are_rejected_like_the_reference() {
    let a = vec![1.0; 12];
    let b = vec![1.0; 12];
    type Args = (f32, MatLayout, MatLayout, f32, MatLayout, usize);
    let cases: Vec<(Args, Error)> = vec![
        (
            (
                f32::NAN,
                MatLayout::row_major(3, 4),
                MatLayout::row_major(4, 3),
                0.0,
                MatLayout::row_major(3, 3),
                9,
            ),
            Error::NonFinite { arg: "alpha", value: f32::NAN },
        ),
        (
            (
                1.0,
                MatLayout::row_major(3, 4),
                MatLayout::row_major(4, 3),
                f32::INFINITY,
                MatLayout::row_major(3, 3),
                9,
            ),
            Error::NonFinite { arg: "beta", value: f32::INFINITY },
        ),
        (
            (
                1.0,
                MatLayout::row_major(3, 4),
                MatLayout::row_major(3, 4),
                0.0,
                MatLayout::row_major(3, 4),
                12,
            ),
            Error::ShapeMismatch { arg: "b", dim: "rows", expected: 4, actual: 3 },
        ),
        (
            (
                1.0,
                MatLayout::row_major(3, 4),
                MatLayout::row_major(4, 3),
                0.0,
                MatLayout::row_major(2, 3),
                9,
            ),
            Error::ShapeMismatch { arg: "c", dim: "rows", expected: 3, actual: 2 },
        ),
        (
            (
                1.0,
                MatLayout::row_major(3, 4),
                MatLayout::row_major(4, 3),
                0.0,
                MatLayout::row_major(3, 2),
                9,
            ),
            Error::ShapeMismatch { arg: "c", dim: "cols", expected: 3, actual: 2 },
        ),
        (
            (
                1.0,
                MatLayout::strided(3, 4, 4, 1, 1),
                MatLayout::row_major(4, 3),
                0.0,
                MatLayout::row_major(3, 3),
                9,
            ),
            Error::OutOfBounds { arg: "a", required: 13, len: 12 },
        ),
        (
            (
                1.0,
                MatLayout::row_major(3, 4),
                MatLayout::strided(4, 3, 4, 1, 0),
                0.0,
                MatLayout::row_major(3, 3),
                9,
            ),
            Error::OutOfBounds { arg: "b", required: 15, len: 12 },
        ),
        (
            (
                1.0,
                MatLayout::row_major(3, 4),
                MatLayout::row_major(4, 3),
                0.0,
                MatLayout::row_major(3, 3),
                8,
            ),
            Error::OutOfBounds { arg: "c", required: 9, len: 8 },
        ),
        (
            (
                1.0,
                MatLayout::row_major(3, 4),
                MatLayout::row_major(4, 3),
                0.0,
                MatLayout::strided(3, 3, 0, 1, 0),
                9,
            ),
            Error::AliasedOutput { arg: "c" },
        ),
        (
            (
                1.0,
                MatLayout::strided(3, 4, usize::MAX / 2, 1, 0),
                MatLayout::row_major(4, 3),
                0.0,
                MatLayout::row_major(3, 3),
                9,
            ),
            Error::IndexOverflow { arg: "a" },
        ),
    ];
    for ((alpha, la, lb, beta, lc, clen), want) in cases {
        let mut c = vec![7.0; clen];
        let r =
            matmul(alpha, MatRef::new(&a, la), MatRef::new(&b, lb), beta, MatMut::new(&mut c, lc));
        assert_eq!(r.map_err(|e| e.to_string()), Err(want.to_string()), "reference");
        for isa in isas() {
            let got = sgemm_with_isa(
                isa,
                alpha,
                MatRef::new(&a, la),
                MatRef::new(&b, lb),
                beta,
                MatMut::new(&mut c, lc),
                Parallelism::threads(2),
            );
            assert_eq!(got.map_err(|e| e.to_string()), Err(want.to_string()), "{isa}");
            assert!(c.iter().all(|&x| x == 7.0), "{isa}: C written on error");
        }
        if let Ok(pb) = PackedB::new(MatRef::new(&b, lb)) {
            let got = sgemm_packed_b(
                alpha,
                MatRef::new(&a, la),
                &pb,
                beta,
                MatMut::new(&mut c, lc),
                Parallelism::Sequential,
            );
            assert_eq!(got.map_err(|e| e.to_string()), Err(want.to_string()), "packed B");
        }
    }
    // Packing an overrunning view is an error too.
    assert!(matches!(
        PackedB::new(MatRef::new(&b, MatLayout::row_major(5, 3))),
        Err(Error::OutOfBounds { arg: "b", .. })
    ));
}

/// The default entry point uses a supported ISA and agrees with the explicit one.
#[test]
fn sgemm_uses_selected_isa() {
    let case = Case::new(33, 47, 29, [Layout::RowMajor; 3], 0.0, 5, Rng::unit);
    let mut c = case.c.clone();
    sgemm(
        1.0,
        MatRef::new(&case.a, case.la),
        MatRef::new(&case.b, case.lb),
        0.0,
        MatMut::new(&mut c, case.lc),
        Parallelism::Sequential,
    )
    .unwrap();
    let want = case.run(attn_kernels::arch::selected(), 1.0, 0.0, Parallelism::Sequential);
    assert!(c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()));
}
