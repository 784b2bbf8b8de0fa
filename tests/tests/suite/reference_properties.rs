//! Properties of the reference itself: the identities attention must satisfy, checked with
//! proptest on small random problems. Equalities are exact wherever the reference performs the
//! same f64 operations in the same order (layouts, head loops, GQA, one visible key); where the
//! f64 summation order changes (permuted keys) the bound is one f32 rounding flip.

use attn_reference::attention::attention;
use attn_reference::matmul::matmul;
use attn_reference::softmax::{scale_mask_softmax, softmax};
use attn_reference::*;
use proptest::prelude::*;
use proptest::sample::select;

use attn_tests::numerics::U;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, ..ProptestConfig::default() }
}

/// A random attention problem in `[b, h, s, d]` storage.
#[derive(Clone, Debug)]
struct Problem {
    batch: usize,
    hq: usize,
    hkv: usize,
    nq: usize,
    nk: usize,
    dk: usize,
    dv: usize,
    scale: f32,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Problem {
    fn q(&self) -> TensorRef<'_> {
        TensorRef::new(&self.q, Tensor4Layout::bhsd(self.batch, self.hq, self.nq, self.dk))
    }
    fn k(&self) -> TensorRef<'_> {
        TensorRef::new(&self.k, Tensor4Layout::bhsd(self.batch, self.hkv, self.nk, self.dk))
    }
    fn v(&self) -> TensorRef<'_> {
        TensorRef::new(&self.v, Tensor4Layout::bhsd(self.batch, self.hkv, self.nk, self.dv))
    }
    fn o_layout(&self) -> Tensor4Layout {
        Tensor4Layout::bhsd(self.batch, self.hq, self.nq, self.dv)
    }
    fn o_len(&self) -> usize {
        self.batch * self.hq * self.nq * self.dv
    }
    fn rows(&self) -> usize {
        self.batch * self.hq * self.nq
    }
    /// Output and logsumexp under `mask`.
    fn run(&self, mask: &Mask<'_>) -> (Vec<f32>, Vec<f32>) {
        let mut o = vec![f32::NAN; self.o_len()];
        let mut lse = vec![f32::NAN; self.rows()];
        attention(
            self.q(),
            self.k(),
            self.v(),
            self.scale,
            mask,
            TensorMut::new(&mut o, self.o_layout()),
            Some(&mut lse),
        )
        .unwrap();
        (o, lse)
    }
}

fn values(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-2.0f32..2.0, n)
}

/// Sizes biased to the edges: empty and single rows/keys, K/V head ratios 1, 2, 3, 4.
fn problem() -> impl Strategy<Value = Problem> {
    (
        1usize..=2,
        select(vec![(1usize, 1usize), (2, 2), (2, 1), (3, 1), (4, 2), (4, 1)]),
        select(vec![0usize, 1, 2, 3, 5, 8]),
        select(vec![0usize, 1, 2, 3, 6, 9]),
        select(vec![1usize, 2, 3, 5, 8]),
        select(vec![1usize, 2, 3, 4]),
        select(vec![1.0f32, 0.5, 0.35355339]),
    )
        .prop_flat_map(|(batch, (hq, hkv), nq, nk, dk, dv, scale)| {
            (
                values(batch * hq * nq * dk),
                values(batch * hkv * nk * dk),
                values(batch * hkv * nk * dv),
            )
                .prop_map(move |(q, k, v)| Problem {
                    batch,
                    hq,
                    hkv,
                    nq,
                    nk,
                    dk,
                    dv,
                    scale,
                    q,
                    k,
                    v,
                })
        })
}

/// A matrix of logits, rows × cols with cols ≥ 1.
fn logits() -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    (1usize..=6, 1usize..=40).prop_flat_map(|(r, c)| {
        prop::collection::vec(-60.0f32..60.0, r * c).prop_map(move |x| (r, c, x))
    })
}

proptest! {
    #![proptest_config(config(256))]

    /// Each output is one rounding of an f64 probability, so a row sums to 1 within
    /// Σ_j u·p_j = u (plus f64 noise far below it).
    #[test]
    fn softmax_rows_sum_to_one((r, c, x) in logits()) {
        let mut y = vec![f32::NAN; r * c];
        softmax(MatRef::row_major(&x, r, c), MatMut::row_major(&mut y, r, c)).unwrap();
        for row in y.chunks(c) {
            let sum: f64 = row.iter().map(|&p| f64::from(p)).sum();
            prop_assert!((sum - 1.0).abs() <= U * (1.0 + 1e-6), "row sum {sum}");
            prop_assert!(row.iter().all(|&p| (0.0..=1.0).contains(&p)));
        }
    }

    /// softmax(x + c) = softmax(x). Logits on a 1/8 grid and integer shifts keep x + c exact in
    /// f32, and the reference then subtracts the same maximum, so equality is bitwise.
    #[test]
    fn softmax_is_shift_invariant(
        (r, c, x) in logits(),
        shifts in prop::collection::vec(-1000i32..1000, 6),
    ) {
        let x: Vec<f32> = x.iter().map(|v| (v * 8.0).round() / 8.0).collect();
        let shifted: Vec<f32> =
            x.iter().enumerate().map(|(i, v)| v + shifts[i / c] as f32).collect();
        let (mut y, mut ys) = (vec![f32::NAN; r * c], vec![f32::NAN; r * c]);
        softmax(MatRef::row_major(&x, r, c), MatMut::row_major(&mut y, r, c)).unwrap();
        softmax(MatRef::row_major(&shifted, r, c), MatMut::row_major(&mut ys, r, c)).unwrap();
        prop_assert_eq!(y, ys);
    }

    /// Attention is invariant under permuting the keys together with their values. The f64
    /// sums change order (error ~1e-16 relative), so an output may flip by one f32 rounding:
    /// at most 2⁻²³·|o| ≤ 2⁻²³·max_j |v_j| since o is a convex combination of the v_j.
    #[test]
    fn key_value_permutation_invariance(p in problem(), seed in any::<u64>()) {
        let mut perm: Vec<usize> = (0..p.nk).collect();
        let mut s = seed;
        for i in (1..p.nk).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            perm.swap(i, (s >> 33) as usize % (i + 1));
        }
        let mut permuted = p.clone();
        for bh in 0..p.batch * p.hkv {
            for (j, &pj) in perm.iter().enumerate() {
                let (dst, src) = ((bh * p.nk + j), (bh * p.nk + pj));
                permuted.k[dst * p.dk..(dst + 1) * p.dk]
                    .copy_from_slice(&p.k[src * p.dk..(src + 1) * p.dk]);
                permuted.v[dst * p.dv..(dst + 1) * p.dv]
                    .copy_from_slice(&p.v[src * p.dv..(src + 1) * p.dv]);
            }
        }
        let (o, lse) = p.run(&Mask::None);
        let (op, lsep) = permuted.run(&Mask::None);
        let vmax = p.v.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (a, b) in o.iter().zip(&op) {
            prop_assert!(f64::from((a - b).abs()) <= 2.0 * U * f64::from(vmax), "{a} vs {b}");
        }
        for (a, b) in lse.iter().zip(&lsep) {
            prop_assert!(a == b || f64::from((a - b).abs()) <= 2.0 * U * f64::from(a.abs()));
        }
    }

    /// A keep-mask (or a −∞ bias) that leaves one key j per row gives weight exactly 1 to it,
    /// so the output row is v_j bit for bit and the logsumexp is that key's logit.
    #[test]
    fn one_visible_key_returns_its_value(
        p in problem(),
        picks in prop::collection::vec(any::<u16>(), 64),
    ) {
        prop_assume!(p.nk > 0);
        let n = p.batch * p.hq * p.nq * p.nk;
        let pick = |row: usize| picks[row % picks.len()] as usize % p.nk;
        let keep: Vec<bool> = (0..n).map(|i| i % p.nk == pick(i / p.nk)).collect();
        let bias: Vec<f32> =
            keep.iter().map(|&k| if k { 0.0 } else { f32::NEG_INFINITY }).collect();
        let layout = Tensor4Layout::bhsd(p.batch, p.hq, p.nq, p.nk);
        let (ok, _) = p.run(&Mask::Keep { keep: &keep, layout });
        let (ob, _) = p.run(&Mask::Bias { bias: &bias, layout });
        let group = p.hq / p.hkv;
        for b in 0..p.batch {
            for h in 0..p.hq {
                for i in 0..p.nq {
                    let row = (b * p.hq + h) * p.nq + i;
                    let j = pick(row);
                    let vrow = ((b * p.hkv + h / group) * p.nk + j) * p.dv;
                    let want = &p.v[vrow..vrow + p.dv];
                    prop_assert_eq!(&ok[row * p.dv..(row + 1) * p.dv], want);
                    prop_assert_eq!(&ob[row * p.dv..(row + 1) * p.dv], want);
                }
            }
        }
    }

    /// With a causal mask at offset 0, query 0 sees only key 0: output row 0 is v₀ exactly.
    #[test]
    fn causal_row_zero_is_v0(p in problem()) {
        prop_assume!(p.nq > 0 && p.nk > 0);
        let (o, _) = p.run(&Mask::Causal { offset: Some(0) });
        let group = p.hq / p.hkv;
        for b in 0..p.batch {
            for h in 0..p.hq {
                let row = (b * p.hq + h) * p.nq;
                let v0 = ((b * p.hkv + h / group) * p.nk) * p.dv;
                prop_assert_eq!(&o[row * p.dv..(row + 1) * p.dv], &p.v[v0..v0 + p.dv]);
            }
        }
    }

    /// A fully masked row gives an exact zero output row and logsumexp −∞, and leaves the
    /// other rows as they were without the mask. Checked for a keep-mask hiding every key of
    /// chosen rows and for a causal offset that hides everything from the first rows.
    #[test]
    fn fully_masked_rows_give_zeros(
        p in problem(),
        hidden_rows in prop::collection::vec(any::<bool>(), 64),
    ) {
        let rows = p.rows();
        let hide = |r: usize| hidden_rows[r % hidden_rows.len()];
        let keep: Vec<bool> = (0..rows * p.nk).map(|i| !hide(i / p.nk.max(1))).collect();
        let layout = Tensor4Layout::bhsd(p.batch, p.hq, p.nq, p.nk);
        let (o, lse) = p.run(&Mask::Keep { keep: &keep, layout });
        let (o_all, lse_all) = p.run(&Mask::None);
        for r in 0..rows {
            let (got, full) = (&o[r * p.dv..(r + 1) * p.dv], &o_all[r * p.dv..(r + 1) * p.dv]);
            if hide(r) || p.nk == 0 {
                prop_assert!(got.iter().all(|&x| x == 0.0 && x.is_sign_positive()), "{got:?}");
                prop_assert_eq!(lse[r], f32::NEG_INFINITY);
            } else {
                prop_assert_eq!(got, full);
                prop_assert_eq!(lse[r], lse_all[r]);
            }
        }
        // Causal offset −nk: query i sees the keys j ≤ i − nk, so queries i < nk see none.
        let off = -(p.nk as isize);
        let (oc, lsec) = p.run(&Mask::Causal { offset: Some(off) });
        for r in 0..rows {
            let i = r % p.nq.max(1);
            if (i as isize) + off < 0 {
                prop_assert!(oc[r * p.dv..(r + 1) * p.dv].iter().all(|&x| x == 0.0));
                prop_assert_eq!(lsec[r], f32::NEG_INFINITY);
            }
        }
    }

    /// Multi-head (and GQA) attention equals a loop over (batch, head) of single-head calls on
    /// the sub-views; bitwise, since each row is the same f64 computation.
    #[test]
    fn multi_head_equals_loop_of_single_heads(p in problem()) {
        let (o, lse) = p.run(&Mask::Causal { offset: None });
        let group = p.hq / p.hkv;
        for b in 0..p.batch {
            for h in 0..p.hq {
                let mut oh = vec![f32::NAN; p.nq * p.dv];
                let mut lh = vec![f32::NAN; p.nq];
                attention(
                    one_head(p.q(), b, h),
                    one_head(p.k(), b, h / group),
                    one_head(p.v(), b, h / group),
                    p.scale,
                    &Mask::Causal { offset: None },
                    TensorMut::new(&mut oh, Tensor4Layout::bhsd(1, 1, p.nq, p.dv)),
                    Some(&mut lh),
                )
                .unwrap();
                let row = (b * p.hq + h) * p.nq;
                prop_assert_eq!(&o[row * p.dv..(row + p.nq) * p.dv], &oh[..]);
                prop_assert_eq!(&lse[row..row + p.nq], &lh[..]);
            }
        }
    }

    /// GQA equals ordinary multi-head attention on K/V with each head repeated hq/hkv times.
    #[test]
    fn gqa_equals_repeated_kv_heads(p in problem()) {
        let group = p.hq / p.hkv;
        let mut rep = p.clone();
        rep.hkv = p.hq;
        rep.k.clear();
        rep.v.clear();
        for b in 0..p.batch {
            for h in 0..p.hq {
                let g = b * p.hkv + h / group;
                rep.k.extend_from_slice(&p.k[g * p.nk * p.dk..(g + 1) * p.nk * p.dk]);
                rep.v.extend_from_slice(&p.v[g * p.nk * p.dv..(g + 1) * p.nk * p.dv]);
            }
        }
        prop_assert_eq!(p.run(&Mask::None), rep.run(&Mask::None));
    }

    /// The same tensors stored [b, s, h, d] and [b, h, s, d] give the same result (output also
    /// written in the other layout), for every mask kind.
    #[test]
    fn bshd_layout_equals_bhsd(p in problem(), mask_kind in 0usize..4) {
        let to_bshd = |src: &[f32], heads: usize, seq: usize, dim: usize| {
            let from = Tensor4Layout::bhsd(p.batch, heads, seq, dim);
            let to = Tensor4Layout::bshd(p.batch, seq, heads, dim);
            let mut out = vec![f32::NAN; src.len()];
            for b in 0..p.batch {
                for h in 0..heads {
                    for s in 0..seq {
                        for d in 0..dim {
                            out[to.index(b, h, s, d)] = src[from.index(b, h, s, d)];
                        }
                    }
                }
            }
            out
        };
        let n_scores = p.batch * p.hq * p.nq * p.nk;
        let keep: Vec<bool> = (0..n_scores).map(|i| i % 3 != 1).collect();
        let bias: Vec<f32> = (0..n_scores).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
        let ml = Tensor4Layout::bhsd(p.batch, p.hq, p.nq, p.nk);
        let mask = match mask_kind {
            0 => Mask::None,
            1 => Mask::Causal { offset: None },
            2 => Mask::Keep { keep: &keep, layout: ml },
            _ => Mask::Bias { bias: &bias, layout: ml },
        };
        let (o, lse) = p.run(&mask);
        let q = to_bshd(&p.q, p.hq, p.nq, p.dk);
        let k = to_bshd(&p.k, p.hkv, p.nk, p.dk);
        let v = to_bshd(&p.v, p.hkv, p.nk, p.dv);
        let mut o2 = vec![f32::NAN; p.o_len()];
        let mut lse2 = vec![f32::NAN; p.rows()];
        attention(
            TensorRef::new(&q, Tensor4Layout::bshd(p.batch, p.nq, p.hq, p.dk)),
            TensorRef::new(&k, Tensor4Layout::bshd(p.batch, p.nk, p.hkv, p.dk)),
            TensorRef::new(&v, Tensor4Layout::bshd(p.batch, p.nk, p.hkv, p.dv)),
            p.scale,
            &mask,
            TensorMut::new(&mut o2, Tensor4Layout::bshd(p.batch, p.nq, p.hq, p.dv)),
            Some(&mut lse2),
        )
        .unwrap();
        prop_assert_eq!(to_bshd(&o, p.hq, p.nq, p.dv), o2);
        prop_assert_eq!(lse, lse2);
    }

    /// The fused scale-mask-softmax equals softmax of explicitly scaled and masked scores,
    /// and attention equals (scale-mask-softmax of QKᵀ)·V within the rounding of the
    /// materialised probabilities: |Δo| ≤ Σ_j u·p_j·|v_j| + u·|o| ≤ 2u·max|v|.
    #[test]
    fn attention_equals_softmax_then_pv(p in problem()) {
        let (o, _) = p.run(&Mask::Causal { offset: None });
        let group = p.hq / p.hkv;
        let mut s = vec![f32::NAN; p.batch * p.hq * p.nq * p.nk];
        let sl = Tensor4Layout::bhsd(p.batch, p.hq, p.nq, p.nk);
        for b in 0..p.batch {
            for h in 0..p.hq {
                let g = h / group;
                matmul(
                    1.0,
                    p.q().matrix(b, h),
                    MatRef::new(&p.k, p.k().layout.matrix(b, g).transposed()),
                    0.0,
                    MatMut::new(&mut s, sl.matrix(b, h)),
                )
                .unwrap();
            }
        }
        let mut prob = vec![f32::NAN; s.len()];
        scale_mask_softmax(
            TensorRef::new(&s, sl),
            p.scale,
            &Mask::Causal { offset: None },
            TensorMut::new(&mut prob, sl),
            None,
        )
        .unwrap();
        let vmax = p.v.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // The scores above are rounded to f32 before scaling, unlike inside `attention`; with
        // |q|,|k| < 2 and d ≤ 8 that moves each logit by ≤ u·|s|·scale ≤ 32u, so a weight by a
        // relative ≤ e^(2·32u) − 1 ≈ 64u and the output by ≤ 64u·max|v|. Rounding P and P·V
        // to f32 adds ≤ 2u·max|v|.
        let tol = (2.0 + 64.0) * U * f64::from(vmax);
        for b in 0..p.batch {
            for h in 0..p.hq {
                let mut pv = vec![0.0f32; p.nq * p.dv];
                matmul(
                    1.0,
                    MatRef::new(&prob, sl.matrix(b, h)),
                    p.v().matrix(b, h / group),
                    0.0,
                    MatMut::row_major(&mut pv, p.nq, p.dv),
                )
                .unwrap();
                let row = (b * p.hq + h) * p.nq * p.dv;
                for (x, y) in o[row..row + p.nq * p.dv].iter().zip(&pv) {
                    prop_assert!(f64::from((x - y).abs()) <= tol, "{x} vs {y}");
                }
            }
        }
    }
}

/// Head `h` of batch `b` as a `[1, 1, seq, dim]` view of the same slice.
fn one_head(t: TensorRef<'_>, b: usize, h: usize) -> TensorRef<'_> {
    let mut l = t.layout;
    l.offset = t.layout.index(b, h, 0, 0);
    l.dims[0] = 1;
    l.dims[1] = 1;
    TensorRef::new(t.data, l)
}

/// A matrix operand in a random layout: row-major, column-major, or the transpose of a stored
/// matrix, each with padding in the leading dimension and an offset.
fn store(
    m: &[f32],
    rows: usize,
    cols: usize,
    kind: u8,
    pad: usize,
    off: usize,
) -> (Vec<f32>, MatLayout) {
    let layout = match kind % 3 {
        0 => MatLayout::strided(rows, cols, cols + pad, 1, off),
        1 => MatLayout::strided(rows, cols, 1, rows + pad, off),
        // The transpose of a row-major cols × rows matrix.
        _ => MatLayout::strided(cols, rows, rows + pad, 1, off).transposed(),
    };
    let len = layout.required_len().unwrap().max(off);
    let mut data = vec![f32::NAN; len];
    for i in 0..rows {
        for j in 0..cols {
            data[layout.index(i, j)] = m[i * cols + j];
        }
    }
    (data, layout)
}

proptest! {
    #![proptest_config(config(256))]

    /// `C ← αAB + βC` on column-major, transposed and padded views equals the row-major
    /// product bit for bit (the same f64 sums in the same order); padding stays untouched.
    #[test]
    fn matmul_views_equal_row_major(
        (m, k, n) in (0usize..7, 0usize..7, 0usize..7),
        kinds in (any::<u8>(), any::<u8>(), any::<u8>()),
        (pad, off) in (0usize..3, 0usize..4),
        (alpha, beta) in (select(vec![1.0f32, -0.5, 2.0]), select(vec![0.0f32, 1.0, -0.25])),
        seed in prop::collection::vec(-4.0f32..4.0, 3 * 49),
    ) {
        let a = &seed[..m * k];
        let b = &seed[49..49 + k * n];
        let c0 = &seed[98..98 + m * n];
        let mut want = c0.to_vec();
        matmul(alpha, MatRef::row_major(a, m, k), MatRef::row_major(b, k, n), beta,
            MatMut::row_major(&mut want, m, n)).unwrap();
        let (ad, al) = store(a, m, k, kinds.0, pad, off);
        let (bd, bl) = store(b, k, n, kinds.1, pad, off);
        let (mut cd, cl) = store(c0, m, n, kinds.2, pad, off);
        matmul(alpha, MatRef::new(&ad, al), MatRef::new(&bd, bl), beta, MatMut::new(&mut cd, cl))
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                prop_assert_eq!(cd[cl.index(i, j)], want[i * n + j]);
            }
        }
        let touched: std::collections::HashSet<usize> =
            (0..m).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| cl.index(i, j)).collect();
        for (idx, v) in cd.iter().enumerate() {
            if !touched.contains(&idx) {
                prop_assert!(v.is_nan(), "padding {idx} written");
            }
        }
    }
}
