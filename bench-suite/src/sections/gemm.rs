//! SGEMM `C = A·B`: square sizes, and the four products of attention (`Q·Kᵀ` with B read
//! transposed, `P·V`) at two sequence lengths; every implementation at every shape and thread
//! count, the reference only where it finishes in reasonable time.

use attn_kernels::arch::selected;
use attn_kernels::gemm::{bf16_dot_available, gemm, gemm_with_path, HalfPath};
use attn_kernels::{bf16, f16, Isa, Parallelism};
use attn_reference::{MatLayout, MatMut, MatRef, Result};

use super::{Call, Ctx, Work};
use crate::check::{compare, gemm_bound, mat, mat_mut, Rng};
use crate::peers;
use crate::record::Shape;

const OP: &str = "gemm";

/// The reference (f64, naive loops) is timed only up to this many multiply-adds (256³).
const REFERENCE_MAX_MACS: usize = 1 << 24;

/// One SGEMM implementation: `C ← A·B` on `threads` threads.
struct Impl {
    name: &'static str,
    /// False: single-threaded only (measured at 1 thread only).
    threaded: bool,
    call: fn(MatRef<'_>, MatRef<'_>, MatMut<'_>, usize) -> Result<()>,
}

/// The implementations, ours first; each row of the table is compared with the others.
const IMPLS: &[Impl] = &[
    Impl {
        name: "attn-kernels",
        threaded: true,
        call: |a, b, c, t| attn_kernels::gemm::sgemm(1.0, a, b, 0.0, c, Parallelism::threads(t)),
    },
    Impl { name: "gemm", threaded: true, call: |a, b, c, t| peers::gemm(1.0, a, b, 0.0, c, t) },
    Impl {
        name: "matrixmultiply",
        threaded: false,
        call: |a, b, c, _| peers::matrixmultiply(1.0, a, b, 0.0, c),
    },
    Impl {
        name: "reference",
        threaded: false,
        call: |a, b, c, _| attn_reference::matmul::matmul(1.0, a, b, 0.0, c),
    },
];

/// `(m, n, k, B transposed)`.
type Case = (usize, usize, usize, bool);

fn grid(quick: bool) -> (Vec<usize>, Vec<Case>) {
    if quick {
        (vec![64, 128, 256], vec![(256, 256, 64, true), (256, 64, 256, false)])
    } else {
        (
            vec![256, 512, 1024, 2048],
            vec![
                (1024, 1024, 64, true),
                (1024, 64, 1024, false),
                (256, 512, 64, true),
                (256, 64, 512, false),
            ],
        )
    }
}

/// Checks every implementation against the reference on odd sizes (not multiples of any
/// register tile), both B layouts, at each thread count.
fn checks(ctx: &mut Ctx) {
    for (case_idx, &(m, n, k, bt)) in
        [(131, 257, 67, false), (96, 200, 64, true)].iter().enumerate()
    {
        let mut rng = Rng::new(0x6e33 + case_idx as u64);
        let (a, b) = (rng.vec(m * k), rng.vec(k * n));
        let (am, bm) = (mat(&a, m, k, false), mat(&b, k, n, bt));
        let mut want = vec![0.0; m * n];
        if let Err(e) = attn_reference::matmul::matmul(1.0, am, bm, 0.0, mat_mut(&mut want, m, n)) {
            ctx.check(OP, "reference", Shape::Gemm { m, n, k, bt }, 1, Err(e.to_string()));
            continue;
        }
        let bound = gemm_bound(&am, &bm);
        for imp in IMPLS.iter().filter(|i| i.name != "reference") {
            for &t in ctx.threads.clone().iter().filter(|&&t| t == 1 || imp.threaded) {
                let mut got = vec![f32::NAN; m * n];
                let r = Parallelism::threads(t)
                    .install(|| (imp.call)(am, bm, mat_mut(&mut got, m, n), t));
                let v = r.map(|()| compare(&got, &want, &bound)).map_err(|e| e.to_string());
                ctx.check(OP, imp.name, Shape::Gemm { m, n, k, bt }, t, v);
            }
        }
    }
}

/// The half-precision cases (`m, n, k, B transposed`), issue 21: square, the two attention
/// products.
const HALF_CASES: [Case; 4] = [
    (512, 512, 512, false),
    (1024, 1024, 1024, false),
    (1024, 1024, 64, true),
    (1024, 64, 1024, false),
];

/// bf16 and f16 A and B (f32 C) beside our f32 GEMM on the same values, one thread, timed in
/// alternating calls so that their ratios are taken at the same moments of the machine; with
/// AVX512_BF16 also bf16 on the `vdpbf16ps` kernel (`HalfPath::Dot`).
fn half_rows(ctx: &mut Ctx) {
    if !ctx.threads.contains(&1) {
        return;
    }
    let cases: &[Case] = if ctx.quick { &[(256, 256, 256, false)] } else { &HALF_CASES };
    for &(m, n, k, bt) in cases {
        let mut rng = Rng::new((m * 31 + n * 7 + k + 5) as u64);
        let (a, b) = (rng.vec(m * k), rng.vec(k * n));
        let (ah, bh): (Vec<bf16>, Vec<bf16>) = (
            a.iter().map(|&x| bf16::from_f32(x)).collect(),
            b.iter().map(|&x| bf16::from_f32(x)).collect(),
        );
        let (af, bf): (Vec<f16>, Vec<f16>) = (
            a.iter().map(|&x| f16::from_f32(x)).collect(),
            b.iter().map(|&x| f16::from_f32(x)).collect(),
        );
        let seq = Parallelism::Sequential;
        let (la, lb, lc) = (lay(m, k, false), lay(k, n, bt), lay(m, n, false));
        let (mut c1, mut c2, mut c3) = (vec![0.0f32; m * n], vec![0.0f32; m * n], vec![0.0; m * n]);
        let mut f32_call = || {
            gemm(1.0, MatRef::new(&a, la), MatRef::new(&b, lb), 0.0, MatMut::new(&mut c1, lc), seq)
                .map_err(|e| e.to_string())
        };
        let mut bf16_call = || {
            gemm(
                1.0,
                MatRef::new(&ah, la),
                MatRef::new(&bh, lb),
                0.0,
                MatMut::new(&mut c2, lc),
                seq,
            )
            .map_err(|e| e.to_string())
        };
        let mut f16_call = || {
            gemm(
                1.0,
                MatRef::new(&af, la),
                MatRef::new(&bf, lb),
                0.0,
                MatMut::new(&mut c3, lc),
                seq,
            )
            .map_err(|e| e.to_string())
        };
        // With AVX512_BF16, bf16 on the `vdpbf16ps` kernel too (`gemm` widens: see `HalfPath`).
        let mut c4 = vec![0.0f32; m * n];
        let mut dot_call = || {
            let (a, b, c) = (MatRef::new(&ah, la), MatRef::new(&bh, lb), MatMut::new(&mut c4, lc));
            gemm_with_path(Isa::Avx512, HalfPath::Dot, 1.0, a, b, 0.0, c, seq)
                .map_err(|e| e.to_string())
        };
        let work = Work::Flops(2.0 * (m * n * k) as f64);
        let mut rows: Vec<(&'static str, Call<'_>)> = vec![
            ("attn-kernels f32 (vs half)", &mut f32_call),
            ("attn-kernels bf16", &mut bf16_call),
            ("attn-kernels f16", &mut f16_call),
        ];
        if bf16_dot_available() && selected() == Isa::Avx512 {
            rows.push(("attn-kernels bf16 vdpbf16ps", &mut dot_call));
        }
        ctx.bench_alternating(OP, Shape::Gemm { m, n, k, bt }, 1, work, None, &mut rows);
    }
}

/// A dense `rows × cols` layout, row-major or (transposed) column-major.
fn lay(rows: usize, cols: usize, col_major: bool) -> MatLayout {
    if col_major {
        MatLayout::row_major(cols, rows).transposed()
    } else {
        MatLayout::row_major(rows, cols)
    }
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    checks(ctx);
    half_rows(ctx);
    let (square, attn) = grid(ctx.quick);
    let cases: Vec<(Case, Option<String>)> = square
        .iter()
        .map(|&n| ((n, n, n, false), Some("gemm-square".to_string())))
        .chain(attn.into_iter().map(|c| (c, None)))
        .collect();
    for ((m, n, k, bt), plot) in cases {
        let mut rng = Rng::new((m * 31 + n * 7 + k) as u64);
        let (a, b) = (rng.vec(m * k), rng.vec(k * n));
        let mut c = vec![0.0f32; m * n];
        let work = Work::Flops(2.0 * (m * n * k) as f64);
        for &t in &ctx.threads.clone() {
            for imp in IMPLS {
                if (t > 1 && !imp.threaded)
                    || (imp.name == "reference" && m * n * k > REFERENCE_MAX_MACS)
                {
                    continue;
                }
                let shape = Shape::Gemm { m, n, k, bt };
                let plot = plot.clone().map(|g| (g, n as f64));
                let par = Parallelism::threads(t);
                ctx.bench(OP, imp.name, shape, t, work, plot, || {
                    par.install(|| {
                        (imp.call)(
                            mat(&a, m, k, false),
                            mat(&b, k, n, bt),
                            mat_mut(&mut c, m, n),
                            t,
                        )
                    })
                });
            }
        }
    }
}
