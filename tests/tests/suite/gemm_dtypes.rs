//! GEMM with half-precision operands, path by path: bf16 × bf16 on the `vdpbf16ps` kernel
//! (where the CPU has AVX512_BF16; the test says by name when it skips it) and widened to f32
//! on every ISA, f16 × f16 and mixed operands widened on every ISA. Against the f64 reference
//! on the exact values the operands represent, within the numerics kit's bound (plus, for
//! `vdpbf16ps`, the flush term the kernel publishes): edge-biased shapes (odd k, k = 1, m / n
//! off the tiles), every stride layout, α / β; special values (NaN, ±∞, bf16 near the f32
//! maximum, subnormals); the threaded path; errors for an unavailable path.

use attn_kernels::arch::convert::Convertible;
use attn_kernels::gemm::{bf16_dot_available, gemm_with_path, HalfPath, BF16_DOT_FLUSH};
use attn_kernels::{bf16, f16, Isa, Parallelism};
use attn_reference::matmul::matmul;
use attn_reference::{Error, MatLayout, MatMut, MatRef};
use attn_tests::gemm_support::{buffer, outside, Layout, Rng, TILES};
use attn_tests::numerics::{dot_bound, SUBNORMAL_ULP};
use proptest::prelude::*;

/// The (ISA, path) pairs a GEMM with operands `TA`, `TB` can run on this CPU: the widening path
/// on every supported ISA, and `vdpbf16ps` for bf16 × bf16 where available. Prints the ones
/// skipped, by name.
fn paths<TA: Convertible, TB: Convertible>() -> Vec<(Isa, HalfPath)> {
    static REPORT: std::sync::Once = std::sync::Once::new();
    let isas = Isa::supported();
    REPORT.call_once(|| {
        for isa in Isa::ALL.into_iter().filter(|i| !isas.contains(i)) {
            eprintln!(
                "gemm_dtypes: skipping the widening path on {isa} (not supported by this CPU)"
            );
        }
        if !bf16_dot_available() {
            eprintln!(
                "gemm_dtypes: skipping the vdpbf16ps path (bf16dot_12x32_avx512bf16, \
                 HalfPath::Dot): this CPU lacks AVX512_BF16"
            );
        }
    });
    let mut v: Vec<_> = isas.into_iter().map(|i| (i, HalfPath::Widen)).collect();
    if is_bf16::<TA>() && is_bf16::<TB>() && bf16_dot_available() {
        v.push((Isa::Avx512, HalfPath::Dot));
    }
    v
}

fn is_bf16<T: Convertible>() -> bool {
    T::DTYPE == attn_kernels::DType::BF16
}

/// Edge sizes of every kernel tile (4×16, 6×16, 6×64, 12×32, and the pairs of `vdpbf16ps`): 0,
/// 1, 2, 3, MR±1, NR±1, and a few odd ones.
fn edge_sizes() -> Vec<usize> {
    let mut v = vec![0, 1, 2, 3, 5, 17, 63, 65];
    for (mr, nr) in TILES {
        v.extend([mr - 1, mr, mr + 1, nr - 1, nr, nr + 1]);
    }
    v.sort_unstable();
    v.dedup();
    v
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![3 => proptest::sample::select(edge_sizes()), 1 => 0usize..80]
}

/// An odd or tiny depth most of the time: the pair packing's zero padding.
fn depth() -> impl Strategy<Value = usize> {
    prop_oneof![2 => proptest::sample::select(vec![1, 2, 3, 5, 31, 33, 63, 65]), 1 => size()]
}

fn layout() -> impl Strategy<Value = Layout> {
    proptest::sample::select(Layout::ALL.to_vec())
}

const ALPHAS: [f32; 4] = [1.0, -0.75, 0.0, 3.0];
const BETAS: [f32; 4] = [0.0, 1.0, -0.5, 2.0];
const GUARD: usize = 19;

/// One problem with operands of `TA` / `TB` and their exact f32 values.
struct Case<TA, TB> {
    m: usize,
    n: usize,
    k: usize,
    la: MatLayout,
    lb: MatLayout,
    lc: MatLayout,
    a: Vec<TA>,
    b: Vec<TB>,
    /// The exact values of `a` / `b` (guards NaN).
    af: Vec<f32>,
    bf: Vec<f32>,
    c: Vec<f32>,
}

impl<TA: Convertible, TB: Convertible> Case<TA, TB> {
    /// Operands from `aval(rng, i, p)` / `bval(rng, p, j)` rounded to `TA` / `TB`; C random in
    /// its view (NaN everywhere when β = 0, which must not leak), NaN guards around every view.
    fn new(
        (m, n, k): (usize, usize, usize),
        lay: [Layout; 3],
        beta: f32,
        seed: u64,
        mut aval: impl FnMut(&mut Rng, usize, usize) -> f32,
        mut bval: impl FnMut(&mut Rng, usize, usize) -> f32,
    ) -> Self {
        let mut rng = Rng::new(seed);
        let (la, lb, lc) = (lay[0].view(m, k), lay[1].view(k, n), lay[2].view(m, n));
        let mut af = buffer(&la, 3, f32::NAN, || 0.0);
        for i in 0..m {
            for p in 0..k {
                af[la.index(i, p)] = aval(&mut rng, i, p);
            }
        }
        let mut bf = buffer(&lb, 3, f32::NAN, || 0.0);
        for p in 0..k {
            for j in 0..n {
                bf[lb.index(p, j)] = bval(&mut rng, p, j);
            }
        }
        let a: Vec<TA> = af.iter().map(|&v| TA::from_f32(v)).collect();
        let b: Vec<TB> = bf.iter().map(|&v| TB::from_f32(v)).collect();
        let af = a.iter().map(|v| v.to_f32()).collect();
        let bf = b.iter().map(|v| v.to_f32()).collect();
        let c = if beta == 0.0 {
            buffer(&lc, GUARD, f32::NAN, || f32::NAN)
        } else {
            buffer(&lc, GUARD, f32::NAN, || rng.unit())
        };
        Case { m, n, k, la, lb, lc, a, b, af, bf, c }
    }

    fn run(&self, isa: Isa, path: HalfPath, alpha: f32, beta: f32, par: Parallelism) -> Vec<f32> {
        let mut c = self.c.clone();
        let (a, b) = (MatRef::new(&self.a, self.la), MatRef::new(&self.b, self.lb));
        gemm_with_path(isa, path, alpha, a, b, beta, MatMut::new(&mut c, self.lc), par).unwrap();
        c
    }

    /// The f64 reference on the exact values (rounded once to f32).
    fn reference(&self, alpha: f32, beta: f32) -> Vec<f32> {
        let mut c = self.c.clone();
        let (a, b) = (MatRef::new(&self.af, self.la), MatRef::new(&self.bf, self.lb));
        matmul(alpha, a, b, beta, MatMut::new(&mut c, self.lc)).unwrap();
        c
    }

    /// The bound on element (i, j): the f32 dot-product bound ([`dot_bound`]) on the exact
    /// values, plus `k + 3` subnormal ULPs (the relative bound does not cover roundings in the
    /// subnormal range), plus for `vdpbf16ps` its flush term,
    /// `|α|·F·(k + 1 + Σ_p (|a_ip| + |b_pj|))`, `F` = [`BF16_DOT_FLUSH`].
    fn bound(&self, path: HalfPath, alpha: f32, beta: f32, i: usize, j: usize) -> f64 {
        let (mut mag, mut l1) = (0.0f64, 0.0f64);
        for p in 0..self.k {
            let (x, y) =
                (f64::from(self.af[self.la.index(i, p)]), f64::from(self.bf[self.lb.index(p, j)]));
            mag += (x * y).abs();
            l1 += x.abs() + y.abs();
        }
        let c0 =
            if beta == 0.0 { 0.0 } else { f64::from(beta * self.c[self.lc.index(i, j)]).abs() };
        let alpha = f64::from(alpha).abs();
        let mut tol = dot_bound(self.k, alpha * mag + c0) + (self.k + 3) as f64 * SUBNORMAL_ULP;
        if path == HalfPath::Dot {
            tol += alpha * f64::from(BF16_DOT_FLUSH) * ((self.k + 1) as f64 + l1);
        }
        tol
    }

    /// `got` against `want`: the guard band untouched; a non-finite `want` reproduced exactly
    /// (NaN for NaN, the same infinity); a finite one within [`bound`](Self::bound).
    fn check(&self, what: &str, path: HalfPath, got: &[f32], want: &[f32], alpha: f32, beta: f32) {
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
                let (g, w) = (got[x], want[x]);
                let at = format!("{what}: ({i},{j}) of {}x{}x{}", self.m, self.n, self.k);
                if w.is_nan() {
                    assert!(g.is_nan(), "{at}: got {g}, want NaN");
                } else if w.is_infinite() {
                    assert_eq!(g, w, "{at}");
                } else {
                    let tol = self.bound(path, alpha, beta, i, j);
                    let err = (f64::from(g) - f64::from(w)).abs();
                    assert!(err <= tol, "{at}: got {g} want {w} (err {err:e} > {tol:e})");
                }
            }
        }
    }

    /// Every path against the reference.
    fn check_all(&self, alpha: f32, beta: f32, par: Parallelism) {
        let want = self.reference(alpha, beta);
        let (ta, tb) = (TA::DTYPE, TB::DTYPE);
        for (isa, path) in paths::<TA, TB>() {
            let got = self.run(isa, path, alpha, beta, par);
            let (la, lb, lc) = (self.la, self.lb, self.lc);
            let what = format!(
                "{isa} {path:?} {ta}×{tb} α={alpha} β={beta} a {:?} b {:?} c {:?}",
                (la.row_stride, la.col_stride),
                (lb.row_stride, lb.col_stride),
                (lc.row_stride, lc.col_stride)
            );
            self.check(&what, path, &got, &want, alpha, beta);
        }
    }
}

fn unit(r: &mut Rng, _: usize, _: usize) -> f32 {
    r.unit()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Every path, every layout, edge shapes, α / β, against the reference on exact values.
    #[test]
    fn paths_match_reference(
        m in size(), n in size(), k in depth(),
        la in layout(), lb in layout(), lc in layout(),
        ai in 0..ALPHAS.len(), bi in 0..BETAS.len(),
        combo in 0..4usize,
        seed in any::<u64>(),
    ) {
        prop_assume!(m * n * k <= 80 * 80 * 80);
        let (alpha, beta) = (ALPHAS[ai], BETAS[bi]);
        let shape = (m, n, k);
        let lay = [la, lb, lc];
        let seq = Parallelism::Sequential;
        match combo {
            0 | 1 => Case::<bf16, bf16>::new(shape, lay, beta, seed, unit, unit).check_all(alpha, beta, seq),
            2 => Case::<f16, f16>::new(shape, lay, beta, seed, unit, unit).check_all(alpha, beta, seq),
            _ => Case::<bf16, f32>::new(shape, lay, beta, seed, unit, unit).check_all(alpha, beta, seq),
        }
    }
}

/// Deep (several KC blocks, odd), wide and threaded products: the pair packing across blocks,
/// partial panels at both edges, threaded runs bitwise equal to sequential ones.
#[test]
fn large_odd_depth_threaded() {
    for (m, n, k, lay) in [
        (131, 97, 1031, [Layout::RowMajor, Layout::RowMajor, Layout::RowMajor]),
        (200, 70, 777, [Layout::ColMajor, Layout::PaddedCols(5), Layout::ColMajor]),
        (64, 300, 129, [Layout::PaddedRows(3), Layout::ColMajor, Layout::RowMajor]),
    ] {
        let case = Case::<bf16, bf16>::new((m, n, k), lay, 0.5, 7, unit, unit);
        case.check_all(1.5, 0.5, Parallelism::threads(2));
        for (isa, path) in paths::<bf16, bf16>() {
            let t = case.run(isa, path, 1.5, 0.5, Parallelism::threads(2));
            let s = case.run(isa, path, 1.5, 0.5, Parallelism::Sequential);
            let same = t.iter().zip(&s).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{isa} {path:?} {m}x{n}x{k}: threaded differs from sequential");
        }
        Case::<f16, f16>::new((m, n, k), lay, 0.0, 8, unit, unit).check_all(
            -1.0,
            0.0,
            Parallelism::threads(2),
        );
    }
}

/// NaN and ±∞ in A and B: every path gives the reference's NaN / infinities (no `0·∞` from
/// the odd-depth padding) and the other elements within the bound.
#[test]
fn nan_and_infinities() {
    for k in [1, 2, 7, 64] {
        let (m, n) = (13, 33);
        // A row 1 holds a NaN, row 2 a +∞, row 3 a −∞ (at the last step, the padded pair's
        // partner when k is odd); B column 5 holds a +∞ at step 0, column 6 a NaN.
        let aval = move |r: &mut Rng, i: usize, p: usize| match (i, p) {
            (1, 0) => f32::NAN,
            (2, _) if p == k - 1 => f32::INFINITY,
            (3, _) if p == k - 1 => f32::NEG_INFINITY,
            _ => r.unit(),
        };
        let bval = |r: &mut Rng, p: usize, j: usize| match (p, j) {
            (0, 5) => f32::INFINITY,
            (0, 6) => f32::NAN,
            _ => r.unit(),
        };
        let lay = [Layout::RowMajor, Layout::RowMajor, Layout::RowMajor];
        for beta in [0.0, 1.0] {
            Case::<bf16, bf16>::new((m, n, k), lay, beta, 3, aval, bval).check_all(
                1.0,
                beta,
                Parallelism::Sequential,
            );
            Case::<f16, bf16>::new((m, n, k), lay, beta, 4, aval, bval).check_all(
                1.0,
                beta,
                Parallelism::Sequential,
            );
        }
    }
}

/// bf16 values near the f32 maximum (the largest bf16 is `≈ 3.39·10³⁸`), times factors of at
/// most 1 over a short depth, so no partial sum overflows: exact-range products, and the
/// overflow to ∞ when α pushes the result past f32's range.
#[test]
fn bf16_near_f32_max() {
    let big = bf16::from_bits(0x7F7F).to_f32(); // the largest finite bf16
    for k in [1, 2, 3] {
        let aval = move |r: &mut Rng, _: usize, _: usize| if r.below(2) == 0 { big } else { -big };
        let bval = move |r: &mut Rng, _: usize, _: usize| r.unit() / k as f32;
        let lay = [Layout::RowMajor, Layout::ColMajor, Layout::RowMajor];
        let case = Case::<bf16, bf16>::new((14, 35, k), lay, 0.0, 5, aval, bval);
        case.check_all(1.0, 0.0, Parallelism::Sequential);
        case.check_all(-0.5, 0.0, Parallelism::Sequential);
        // A all +big, B all 1: the sum k·big, times α = 4, overflows to +∞ on every path.
        let aval = move |_: &mut Rng, _: usize, _: usize| big;
        let bval = move |_: &mut Rng, _: usize, _: usize| 1.0;
        let case = Case::<bf16, bf16>::new((1, 1, k), lay, 0.0, 6, aval, bval);
        let want = case.reference(4.0, 0.0);
        assert_eq!(want[0], f32::INFINITY);
        case.check_all(4.0, 0.0, Parallelism::Sequential);
    }
}

/// Subnormal operands: the widening paths keep them (f32 FMAs with gradual underflow), the
/// `vdpbf16ps` path flushes them; both within their bounds. A row of only subnormals shows the
/// flush: there the result is the whole (tiny) value, far outside the relative bound, so the
/// flush term is what the `vdpbf16ps` check rests on.
#[test]
fn subnormals() {
    let sub = f32::from_bits(0x0004_0000); // 2⁻¹³¹ (a bf16 subnormal, exact in bf16 and f32)
    for k in [1, 2, 9, 40] {
        let aval = move |r: &mut Rng, i: usize, _: usize| match i {
            0 => sub * (1.0 + r.below(4) as f32),
            1 => f32::MIN_POSITIVE * r.unit(),
            _ => r.unit(),
        };
        let bval = |r: &mut Rng, _: usize, _: usize| 1.0 + r.unit();
        let lay = [Layout::RowMajor, Layout::RowMajor, Layout::PaddedRows(3)];
        let case = Case::<bf16, bf16>::new((5, 34, k), lay, 0.0, 9, aval, bval);
        case.check_all(1.0, 0.0, Parallelism::Sequential);
        // The widening path is accurate on the subnormal row: without the flush term it passes.
        let want = case.reference(1.0, 0.0);
        for isa in Isa::supported() {
            let got = case.run(isa, HalfPath::Widen, 1.0, 0.0, Parallelism::Sequential);
            case.check(&format!("{isa} Widen subnormal"), HalfPath::Widen, &got, &want, 1.0, 0.0);
            assert!(got[case.lc.index(0, 0)] != 0.0, "{isa}: widening lost the subnormal row");
        }
        // f16 subnormals are normal f32 values: exact in every widening path.
        let hsub = f16::from_bits(0x0001).to_f32(); // 2⁻²⁴
        let aval = move |r: &mut Rng, _: usize, _: usize| hsub * (1.0 + r.below(1000) as f32);
        Case::<f16, f16>::new((5, 34, k), lay, 1.0, 10, aval, bval).check_all(
            2.0,
            1.0,
            Parallelism::Sequential,
        );
    }
}

/// `HalfPath::Dot` is an error (naming `path`) wherever it cannot run: non-bf16 operands, an
/// ISA other than AVX-512, or a CPU without AVX512_BF16; argument errors come first.
#[test]
fn dot_path_errors() {
    let (a, b) = (vec![bf16::ONE; 4], vec![bf16::ONE; 4]);
    let (h, f) = (vec![f16::ONE; 4], vec![1.0f32; 4]);
    let mut c = vec![0.0f32; 4];
    let lay = MatLayout::row_major(2, 2);
    let path_err =
        |r: Result<(), Error>| matches!(r, Err(Error::InvalidParameter { arg: "path", .. }));
    let seq = Parallelism::Sequential;
    for isa in Isa::supported() {
        let go = |r: Result<(), Error>, ok: bool, what: &str| {
            if ok {
                assert!(r.is_ok(), "{isa} {what}: {r:?}");
            } else {
                assert!(path_err(r.clone()), "{isa} {what}: {r:?}");
            }
        };
        let cm = MatMut::new(&mut c, lay);
        let r = gemm_with_path(
            isa,
            HalfPath::Dot,
            1.0,
            MatRef::new(&a, lay),
            MatRef::new(&b, lay),
            0.0,
            cm,
            seq,
        );
        go(r, isa == Isa::Avx512 && bf16_dot_available(), "bf16×bf16");
        let cm = MatMut::new(&mut c, lay);
        let r = gemm_with_path(
            isa,
            HalfPath::Dot,
            1.0,
            MatRef::new(&a, lay),
            MatRef::new(&h, lay),
            0.0,
            cm,
            seq,
        );
        go(r, false, "bf16×f16");
        let cm = MatMut::new(&mut c, lay);
        let r = gemm_with_path(
            isa,
            HalfPath::Dot,
            1.0,
            MatRef::new(&f, lay),
            MatRef::new(&b, lay),
            0.0,
            cm,
            seq,
        );
        go(r, false, "f32×bf16");
    }
    // A shape error wins over the path error.
    let cm = MatMut::new(&mut c, lay);
    let bad = MatLayout::row_major(3, 1);
    let r = gemm_with_path(
        Isa::Portable,
        HalfPath::Dot,
        1.0,
        MatRef::new(&a, lay),
        MatRef::new(&b, bad),
        0.0,
        cm,
        seq,
    );
    assert!(matches!(r, Err(Error::ShapeMismatch { arg: "b", .. })), "{r:?}");
}
