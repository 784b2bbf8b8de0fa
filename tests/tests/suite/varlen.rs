//! Packed variable-length attention (`attn_kernels::batch::VarlenAttention`) against the
//! reference's `attention_varlen`, and paged cache writes (`append_kv`) against a dense model.
//!
//! - Equivalence: random batches of mixed lengths (0, 1, around the 256-query chunk, `nq > nk`
//!   and `nq < nk`), GQA, no mask or causal with offsets, variants, token-major outputs (split
//!   among threads) and head-major ones (run item by item), every ISA, one and two threads.
//!   Each sequence is one `Case` of `attn_tests::attention_support`, whose bounds (the
//!   attention analysis) hold element by element; one and two threads agree to the bit.
//! - Bad input: the reference's errors for the same arguments, nothing written.
//! - Cache writes: random page layouts against a dense copy, untouched slots unchanged;
//!   overlapping or out-of-range writes refused with nothing written; a step-by-step stress
//!   test of many sequences appending and checked after every step.

use attn_kernels::attention::Path;
use attn_kernels::batch::{append_kv, PagePool, PagePoolMut, PagedKv, PagedKvMut, VarlenAttention};
use attn_kernels::{Error, Isa, Mask, Tensor4Layout, TensorMut, TensorRef};
use attn_tests::attention_support::{cap_batch_work, drawn_variants, Case, MaskKind, Rng};
use attn_tests::supported_isas;
use proptest::prelude::*;

/// Cap on `Σ_s hq·nq_s·nk_s·(dk + dv)` per case, so the f64 reference and bounds stay fast.
const WORK: usize = 2_000_000;

/// Lengths around the edges: empty, single, one chunk (256) ± 1, longer than a chunk.
const LENS: [usize; 10] = [0, 1, 2, 17, 64, 255, 256, 257, 300, 530];

/// A packed batch: one `Case` per sequence (its operands, mask and variants), and the same
/// values packed `[total, heads, d]` with `pad` unused floats after each token's rows.
struct Batch {
    cases: Vec<Case>,
    hq: usize,
    hkv: usize,
    dk: usize,
    dv: usize,
    pad: usize,
    cu_q: Vec<usize>,
    cu_k: Vec<usize>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    mask: MaskKind,
}

fn cumulative(lens: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut cu = vec![0];
    for n in lens {
        cu.push(cu[cu.len() - 1] + n);
    }
    cu
}

/// `[total, heads, d]` storage with `pad` floats after each token, as a packed view.
fn packed(heads: usize, total: usize, d: usize, pad: usize) -> Tensor4Layout {
    Tensor4Layout::strided([1, heads, total, d], [0, d, heads * d + pad, 1], 0)
}

/// `[heads, total, d]` storage (head-major: the item-by-item path).
fn head_major(heads: usize, total: usize, d: usize) -> Tensor4Layout {
    Tensor4Layout::strided([1, heads, total, d], [0, total * d, d, 1], 0)
}

impl Batch {
    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        lens: &[(usize, usize)],
        hkv: usize,
        group: usize,
        dk: usize,
        dv: usize,
        pad: usize,
        mask: MaskKind,
        variants: &attn_tests::fuzz_decode::VariantSpec,
    ) -> Self {
        let hq = hkv * group;
        let cases: Vec<Case> = lens
            .iter()
            .enumerate()
            .map(|(s, &(nq, nk))| {
                let mut c =
                    Case::new(seed + s as u64, 1, hkv, group, nq, nk, dk, dv, true, 0, mask, 2.0);
                c.variants = variants.clone();
                c
            })
            .collect();
        let cu_q = cumulative(lens.iter().map(|l| l.0));
        let cu_k = cumulative(lens.iter().map(|l| l.1));
        let pack = |total: usize, heads: usize, d: usize, which: usize, cu: &[usize]| {
            let l = packed(heads, total, d, pad);
            let mut x = vec![f32::NAN; l.required_len().unwrap_or(0)];
            for (s, c) in cases.iter().enumerate() {
                let (q, k, v) = c.qkv();
                let t = [q, k, v][which];
                for i in 0..t.layout.dims[2] {
                    for h in 0..heads {
                        for e in 0..d {
                            x[l.index(0, h, cu[s] + i, e)] = t.at(0, h, i, e);
                        }
                    }
                }
            }
            x
        };
        let (tq, tk) = (cu_q[lens.len()], cu_k[lens.len()]);
        let q = pack(tq, hq, dk, 0, &cu_q);
        let k = pack(tk, hkv, dk, 1, &cu_k);
        let v = pack(tk, hkv, dv, 2, &cu_k);
        Batch { cases, hq, hkv, dk, dv, pad, cu_q, cu_k, q, k, v, mask }
    }

    fn total_q(&self) -> usize {
        self.cu_q[self.cu_q.len() - 1]
    }

    fn total_k(&self) -> usize {
        self.cu_k[self.cu_k.len() - 1]
    }

    fn views(&self) -> (TensorRef<'_>, TensorRef<'_>, TensorRef<'_>) {
        let (tq, tk, p) = (self.total_q(), self.total_k(), self.pad);
        (
            TensorRef::new(&self.q, packed(self.hq, tq, self.dk, p)),
            TensorRef::new(&self.k, packed(self.hkv, tk, self.dk, p)),
            TensorRef::new(&self.v, packed(self.hkv, tk, self.dv, p)),
        )
    }

    fn mask(&self) -> Mask<'static> {
        match self.mask {
            MaskKind::Causal(offset) => Mask::Causal { offset },
            _ => Mask::None,
        }
    }

    fn out_layout(&self, head_major_out: bool) -> Tensor4Layout {
        if head_major_out {
            head_major(self.hq, self.total_q(), self.dv)
        } else {
            packed(self.hq, self.total_q(), self.dv, self.pad)
        }
    }

    /// The reference's output (NaN outside the view) and `[hq, total_q]` logsumexps.
    fn reference(&self, head_major_out: bool) -> (Vec<f32>, Vec<f32>) {
        let (q, k, v) = self.views();
        let l = self.out_layout(head_major_out);
        let mut o = vec![f32::NAN; l.required_len().unwrap_or(0) + 3];
        let mut lse = vec![f32::NAN; self.hq * self.total_q()];
        let var = self.cases.first().map(|c| c.variants()).unwrap_or_default();
        attn_reference::batch::attention_varlen(
            q,
            k,
            v,
            &self.cu_q,
            &self.cu_k,
            self.cases.first().map_or(1.0, |c| c.scale),
            &self.mask(),
            &var,
            TensorMut::new(&mut o, l),
            Some(&mut lse),
        )
        .expect("the reference failed on a valid batch");
        (o, lse)
    }

    /// The kernel's output and logsumexps.
    fn kernel(
        &self,
        head_major_out: bool,
        isa: Isa,
        threads: usize,
        path: Path,
    ) -> (Vec<f32>, Vec<f32>) {
        let (_, k, v) = self.views();
        self.kernel_kv(k, v, head_major_out, isa, threads, path)
    }

    /// [`kernel`](Self::kernel) with keys and values from `k` and `v`.
    fn kernel_kv(
        &self,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
        head_major_out: bool,
        isa: Isa,
        threads: usize,
        path: Path,
    ) -> (Vec<f32>, Vec<f32>) {
        let (q, _, _) = self.views();
        let l = self.out_layout(head_major_out);
        let mut o = vec![f32::NAN; l.required_len().unwrap_or(0) + 3];
        let mut lse = vec![f32::NAN; self.hq * self.total_q()];
        let var = self.cases.first().map(|c| c.variants()).unwrap_or_default();
        VarlenAttention::new(q, k, v, &self.cu_q, &self.cu_k)
            .scale(self.cases.first().map_or(1.0, |c| c.scale))
            .mask(self.mask())
            .variants(var)
            .lse(&mut lse)
            .isa(isa)
            .path(path)
            .parallelism(attn_kernels::Parallelism::threads(threads))
            .run(TensorMut::new(&mut o, l))
            .expect("varlen attention failed on a valid batch");
        (o, lse)
    }

    /// Checks `got` against `want` with each sequence's case bounds; elements outside the
    /// output view must still be NaN.
    fn compare(
        &self,
        what: &str,
        head_major_out: bool,
        got: &(Vec<f32>, Vec<f32>),
        want: &(Vec<f32>, Vec<f32>),
    ) -> Result<(), String> {
        let l = self.out_layout(head_major_out);
        let tq = self.total_q();
        let mut inside = vec![false; got.0.len()];
        for (s, c) in self.cases.iter().enumerate() {
            let (ob, lb) = c.bounds();
            for h in 0..self.hq {
                for i in 0..c.nq {
                    let (t, row) = (self.cu_q[s] + i, h * c.nq + i);
                    for d in 0..self.dv {
                        let at = l.index(0, h, t, d);
                        inside[at] = true;
                        let (x, y, tol) = (got.0[at], want.0[at], ob[row * self.dv + d]);
                        if !close(x, y, tol) {
                            return Err(format!(
                                "{what}: seq {s} o[{h},{i},{d}] = {x:e}, want {y:e} (tol {tol:e}); {}",
                                self.describe()
                            ));
                        }
                    }
                    let (x, y, tol) = (got.1[h * tq + t], want.1[h * tq + t], lb[row]);
                    if !close(x, y, tol) {
                        return Err(format!(
                            "{what}: seq {s} lse[{h},{i}] = {x:e}, want {y:e} (tol {tol:e}); {}",
                            self.describe()
                        ));
                    }
                }
            }
        }
        if let Some(p) = (0..got.0.len()).find(|&p| !inside[p] && !got.0[p].is_nan()) {
            return Err(format!(
                "{what}: wrote outside the output view at {p}; {}",
                self.describe()
            ));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let lens: Vec<_> = self.cases.iter().map(|c| (c.nq, c.nk)).collect();
        let var = self.cases.first().map(|c| format!("{:?}", c.variants));
        format!(
            "lens {lens:?} hq {} hkv {} dk {} dv {} pad {} mask {:?} variants {var:?}",
            self.hq, self.hkv, self.dk, self.dv, self.pad, self.mask
        )
    }
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

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn mask_kind() -> impl Strategy<Value = MaskKind> {
    prop_oneof![
        Just(MaskKind::None),
        prop::sample::select(vec![None, Some(0), Some(-3), Some(40)]).prop_map(MaskKind::Causal),
    ]
}

/// Variants, each on about a third of the time.
fn variant_spec() -> impl Strategy<Value = (Option<(usize, usize)>, Option<f32>, bool, bool)> {
    let w = prop::sample::select(vec![0usize, 1, 31, 150, usize::MAX]);
    (
        prop::option::weighted(0.3, (w.clone(), w)),
        prop::option::weighted(0.3, prop::sample::select(vec![0.5f32, 30.0])),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.3),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Varlen against the reference within each sequence's bound, on every ISA, both output
    /// layouts, one and two threads (the same bits), and a random path.
    #[test]
    fn varlen_matches_reference(
        seed in any::<u64>(),
        mut lens in prop::collection::vec(
            (prop::sample::select(LENS.to_vec()), prop::sample::select(LENS.to_vec())), 1..7),
        (hkv, group) in prop::sample::select(vec![(1usize, 1usize), (2, 2), (1, 3), (2, 1)]),
        (dk, dv) in prop::sample::select(vec![(1usize, 1usize), (16, 16), (64, 64), (8, 24)]),
        pad in prop::sample::select(vec![0usize, 3]),
        mask in mask_kind(),
        (window, softcap, sinks, alibi) in variant_spec(),
        path in prop::sample::select(vec![Path::Auto, Path::Flash, Path::Decode, Path::Unfused]),
    ) {
        let hq = hkv * group;
        cap_batch_work(&mut lens, hq, dk, dv, WORK);
        let spec = drawn_variants(seed, hq, (window, softcap, sinks, alibi));
        let batch = Batch::new(seed, &lens, hkv, group, dk, dv, pad, mask, &spec);
        for head_major_out in [false, true] {
            let want = batch.reference(head_major_out);
            for isa in supported_isas("varlen") {
                let one = batch.kernel(head_major_out, isa, 1, path);
                let what = format!("{isa} {path:?} head-major {head_major_out}");
                batch.compare(&what, head_major_out, &one, &want).map_err(TestCaseError::fail)?;
                let two = batch.kernel(head_major_out, isa, 2, path);
                prop_assert_eq!(bits(&one.0), bits(&two.0), "threads: {}", what);
                prop_assert_eq!(bits(&one.1), bits(&two.1), "threads: {}", what);
            }
        }
    }
}

/// Many short sequences and one long one, causal: the threaded split against the reference.
#[test]
fn many_short_sequences_and_a_long_one() {
    let mut lens = vec![(1usize, 1usize); 40];
    lens.extend([(3, 3), (0, 5), (5, 0), (700, 700), (16, 80)]);
    let spec = attn_tests::fuzz_decode::VariantSpec::default();
    let batch = Batch::new(5, &lens, 2, 2, 32, 32, 0, MaskKind::Causal(None), &spec);
    let want = batch.reference(false);
    for isa in supported_isas("varlen") {
        for threads in [1, 2] {
            let got = batch.kernel(false, isa, threads, Path::Auto);
            batch.compare(&format!("{isa} threads {threads}"), false, &got, &want).unwrap();
        }
    }
}

/// Token-major K/V and the same values stored head-major give the same bits, on every ISA,
/// one and two threads, causal and not, with GQA. The long sequences' token-major rows are
/// copied head-major for the call (`KvCopy`: their items read each K/V head at least 4 times);
/// the short ones, and the decode items (one query against 600 keys), are read in place.
#[test]
fn token_major_kv_is_bitwise_head_major() {
    let lens = [(700, 700), (17, 17), (1, 600), (300, 40), (530, 530), (256, 256)];
    let spec = attn_tests::fuzz_decode::VariantSpec::default();
    for (mask, pad) in [(MaskKind::Causal(None), 0), (MaskKind::None, 3)] {
        let batch = Batch::new(11, &lens, 2, 2, 16, 24, pad, mask, &spec);
        let tk = batch.total_k();
        let to_head_major = |x: &[f32], d: usize| {
            let (from, to) = (packed(batch.hkv, tk, d, pad), head_major(batch.hkv, tk, d));
            let mut y = vec![f32::NAN; to.required_len().unwrap_or(0)];
            for h in 0..batch.hkv {
                for t in 0..tk {
                    for e in 0..d {
                        y[to.index(0, h, t, e)] = x[from.index(0, h, t, e)];
                    }
                }
            }
            y
        };
        let (kh, vh) = (to_head_major(&batch.k, batch.dk), to_head_major(&batch.v, batch.dv));
        let k = TensorRef::new(&kh, head_major(batch.hkv, tk, batch.dk));
        let v = TensorRef::new(&vh, head_major(batch.hkv, tk, batch.dv));
        for isa in supported_isas("varlen") {
            for threads in [1, 2] {
                for path in [Path::Auto, Path::Flash] {
                    let want = batch.kernel(false, isa, threads, path);
                    assert!(want.0.iter().any(|x| x.is_finite()));
                    let got = batch.kernel_kv(k, v, false, isa, threads, path);
                    let what = format!("{isa} {threads}t {path:?} {:?}", batch.mask);
                    assert_eq!(bits(&got.0), bits(&want.0), "outputs: {what}");
                    assert_eq!(bits(&got.1), bits(&want.1), "logsumexps: {what}");
                }
            }
        }
    }
}

/// A long token-major sequence with a decode tail (516 queries: chunks of 256, 256 and 4) at
/// 64 K/V heads of d 128. One thread runs its flash chunks head by head on copies of the
/// heads' rows, and the tail as it would alone; two threads run the chunks in rounds, a head
/// a round on one copy, and the tail in place in the first round. Both give the same bits.
/// The decode path's block size depends on the rows' stride (64 KiB a token here), so a tail
/// read from a copy would round differently.
#[test]
fn decode_tail_of_a_copied_sequence_is_read_in_place() {
    let spec = attn_tests::fuzz_decode::VariantSpec::default();
    let batch = Batch::new(13, &[(516, 516)], 64, 1, 128, 128, 0, MaskKind::None, &spec);
    for isa in supported_isas("varlen") {
        let one = batch.kernel(false, isa, 1, Path::Auto);
        let two = batch.kernel(false, isa, 2, Path::Auto);
        assert!(one.0.iter().any(|x| x.is_finite()));
        assert_eq!(bits(&one.0), bits(&two.0), "outputs: {isa}");
        assert_eq!(bits(&one.1), bits(&two.1), "logsumexps: {isa}");
    }
}

/// Bad arguments: the reference's error for the same call, and nothing written.
#[test]
fn bad_input_is_the_references_error() {
    let (hq, hkv, d) = (2usize, 1usize, 4usize);
    let q = vec![0.5f32; 5 * hq * d];
    let kv = vec![0.25f32; 6 * hkv * d];
    let keep = vec![true; 64];
    let sinks = [0.0f32; 3];
    type Args<'a> = (&'a [usize], &'a [usize], Mask<'a>, Tensor4Layout, Option<&'a [f32]>, usize);
    let good_q: &[usize] = &[0, 2, 5];
    let good_k: &[usize] = &[0, 4, 6];
    let qlay = packed(hq, 5, d, 0);
    let cases: Vec<(&str, Args<'_>)> = vec![
        ("decreasing cu_q", (&[0, 3, 2, 5], &[0, 2, 4, 6], Mask::None, qlay, None, 10)),
        ("cu_q not from 0", (&[1, 2, 5], good_k, Mask::None, qlay, None, 10)),
        ("empty cu_k", (good_q, &[], Mask::None, qlay, None, 10)),
        ("cu_q total", (&[0, 2, 4], good_k, Mask::None, qlay, None, 10)),
        ("cu_k total", (good_q, &[0, 4, 7], Mask::None, qlay, None, 10)),
        ("cu_k overflowing total", (good_q, &[0, usize::MAX, 6], Mask::None, qlay, None, 10)),
        ("sequence counts", (good_q, &[0, 6], Mask::None, qlay, None, 10)),
        (
            "keep mask",
            (
                good_q,
                good_k,
                Mask::Keep { keep: &keep, layout: Tensor4Layout::bhsd(1, hq, 5, 6) },
                qlay,
                None,
                10,
            ),
        ),
        (
            "batch of 2",
            (
                good_q,
                good_k,
                Mask::None,
                Tensor4Layout::strided([2, hq, 5, d], [0, d, hq * d, 1], 0),
                None,
                10,
            ),
        ),
        ("sinks of 3 heads", (good_q, good_k, Mask::CAUSAL, qlay, Some(&sinks[..]), 10)),
        ("lse length", (good_q, good_k, Mask::CAUSAL, qlay, None, 9)),
    ];
    for (name, (cu_q, cu_k, mask, ql, sinks, lse_len)) in cases {
        let k = TensorRef::new(&kv, packed(hkv, 6, d, 0));
        let v = TensorRef::new(&kv, packed(hkv, 6, d, 0));
        let var =
            sinks.map_or(attn_kernels::Variants::NONE, |s| attn_kernels::Variants::NONE.sinks(s));
        let ol = packed(hq, 5, d, 0);
        let (mut o, mut lse) = (vec![f32::NAN; 40], vec![f32::NAN; lse_len]);
        let want = attn_reference::batch::attention_varlen(
            TensorRef::new(&q, ql),
            k,
            v,
            cu_q,
            cu_k,
            0.5,
            &mask,
            &var,
            TensorMut::new(&mut o, ol),
            Some(&mut lse),
        )
        .unwrap_err();
        let got = VarlenAttention::new(TensorRef::new(&q, ql), k, v, cu_q, cu_k)
            .scale(0.5)
            .mask(mask)
            .variants(var)
            .lse(&mut lse)
            .parallelism(attn_kernels::Parallelism::threads(2))
            .run(TensorMut::new(&mut o, ol))
            .unwrap_err();
        assert_eq!(got, want, "{name}");
        assert!(o.iter().chain(&lse).all(|x| x.is_nan()), "{name}: wrote on error");
    }
}

/// A pool of `pages` pages with distinct values (so that a wrong or missing write shows), and
/// the dense `[b][j][h][d]` copy of what each sequence holds.
struct Pool {
    page_size: usize,
    hkv: usize,
    dk: usize,
    dv: usize,
    k: Vec<f32>,
    v: Vec<f32>,
    table: Vec<u32>,
    max_pages: usize,
    lens: Vec<usize>,
    dense_k: Vec<Vec<f32>>,
    dense_v: Vec<Vec<f32>>,
}

impl Pool {
    fn new(
        pages: usize,
        page_size: usize,
        hkv: usize,
        dk: usize,
        dv: usize,
        batch: usize,
        max_pages: usize,
    ) -> Self {
        let n = |d: usize| pages * page_size * hkv * d;
        Pool {
            page_size,
            hkv,
            dk,
            dv,
            k: (0..n(dk)).map(|x| -(x as f32) - 1.0).collect(),
            v: (0..n(dv)).map(|x| -(x as f32) - 0.5).collect(),
            table: vec![u32::MAX; batch * max_pages],
            max_pages,
            lens: vec![0; batch],
            dense_k: vec![Vec::new(); batch],
            dense_v: vec![Vec::new(); batch],
        }
    }

    fn cache(&mut self) -> PagedKvMut<'_> {
        PagedKvMut {
            k: PagePoolMut::F32(&mut self.k),
            v: PagePoolMut::F32(&mut self.v),
            page_size: self.page_size,
            kv_heads: self.hkv,
            dk: self.dk,
            dv: self.dv,
            block_table: &self.table,
            max_pages: self.max_pages,
            seq_lens: &self.lens,
        }
    }

    /// Appends `k_new`/`v_new` packed `[total, hkv, d]` per `cu`, to the pool and the dense copy.
    fn append(&mut self, cu: &[usize], k_new: &[f32], v_new: &[f32]) -> attn_kernels::Result<()> {
        let total = cu[cu.len() - 1];
        let (hkv, dk, dv) = (self.hkv, self.dk, self.dv);
        append_kv(
            &mut self.cache(),
            TensorRef::new(k_new, packed(hkv, total, dk, 0)),
            TensorRef::new(v_new, packed(hkv, total, dv, 0)),
            cu,
        )?;
        for b in 0..cu.len() - 1 {
            self.dense_k[b].extend_from_slice(&k_new[cu[b] * hkv * dk..cu[b + 1] * hkv * dk]);
            self.dense_v[b].extend_from_slice(&v_new[cu[b] * hkv * dv..cu[b + 1] * hkv * dv]);
            self.lens[b] += cu[b + 1] - cu[b];
        }
        Ok(())
    }

    /// Every sequence's cache, gathered through `PagedKv::slot`, equals its dense copy, and
    /// every slot that no sequence holds is untouched.
    fn verify(&self, what: &str) {
        let cache = PagedKv {
            k: PagePool::F32(&self.k),
            v: PagePool::F32(&self.v),
            page_size: self.page_size,
            kv_heads: self.hkv,
            dk: self.dk,
            dv: self.dv,
            block_table: &self.table,
            max_pages: self.max_pages,
            seq_lens: &self.lens,
        };
        cache.check().unwrap();
        let mut held_k = vec![false; self.k.len()];
        let mut held_v = vec![false; self.v.len()];
        for b in 0..self.lens.len() {
            for j in 0..self.lens[b] {
                for h in 0..self.hkv {
                    let (sk, sv) = (cache.slot(b, j, h, self.dk), cache.slot(b, j, h, self.dv));
                    let at = |d: usize| (j * self.hkv + h) * d;
                    assert_eq!(
                        &self.k[sk..sk + self.dk],
                        &self.dense_k[b][at(self.dk)..][..self.dk],
                        "{what}: k of seq {b} key {j} head {h}"
                    );
                    assert_eq!(
                        &self.v[sv..sv + self.dv],
                        &self.dense_v[b][at(self.dv)..][..self.dv],
                        "{what}: v of seq {b} key {j} head {h}"
                    );
                    held_k[sk..sk + self.dk].fill(true);
                    held_v[sv..sv + self.dv].fill(true);
                }
            }
        }
        for (x, (&val, &held)) in self.k.iter().zip(&held_k).enumerate() {
            assert!(held || val == -(x as f32) - 1.0, "{what}: free key slot element {x} written");
        }
        for (x, (&val, &held)) in self.v.iter().zip(&held_v).enumerate() {
            assert!(
                held || val == -(x as f32) - 0.5,
                "{what}: free value slot element {x} written"
            );
        }
    }
}

fn rows(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random shuffled page assignments, two appends of random lengths (0 included).
    #[test]
    fn appends_match_a_dense_copy(
        seed in any::<u64>(),
        page_size in prop::sample::select(vec![16usize, 32]),
        lens in prop::collection::vec((0usize..40, 0usize..40), 1..5),
        (hkv, dk, dv) in prop::sample::select(vec![(1usize, 1usize, 1usize), (2, 8, 4), (3, 5, 0)]),
    ) {
        let mut rng = Rng::new(seed);
        let max_pages = 80usize.div_ceil(page_size);
        let pages = lens.len() * max_pages + 2;
        let mut pool = Pool::new(pages, page_size, hkv, dk, dv, lens.len(), max_pages);
        // A shuffled permutation of the pages, handed out row by row.
        let mut order: Vec<u32> = (0..pages as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        pool.table.copy_from_slice(&order[..lens.len() * max_pages]);
        for step in 0..2 {
            let n: Vec<usize> = lens.iter().map(|l| if step == 0 { l.0 } else { l.1 }).collect();
            let cu = cumulative(n.iter().copied());
            let total = cu[n.len()];
            let (k, v) = (rows(&mut rng, total * hkv * dk), rows(&mut rng, total * hkv * dv));
            pool.append(&cu, &k, &v).unwrap();
            pool.verify(&format!("step {step}"));
        }
    }
}

/// Overlapping or out-of-range writes are refused, with nothing written.
#[test]
fn bad_appends_write_nothing() {
    let mut pool = Pool::new(4, 16, 1, 2, 2, 2, 2);
    // Sequence 0: pages 2, 0; sequence 1 shares page 2 (read-only prefix) then page 1.
    pool.table = vec![2, 0, 2, 1];
    let k = vec![1.0f32; 40 * 2];
    pool.append(&[0, 16, 16], &k[..32], &k[..32]).unwrap();
    pool.lens[1] = 16;
    pool.dense_k[1] = pool.dense_k[0].clone();
    pool.dense_v[1] = pool.dense_v[0].clone();
    pool.verify("prefix");
    let before = (pool.k.clone(), pool.v.clone());
    let cases: Vec<(&str, Vec<u32>, Vec<usize>, Error)> = vec![
        (
            "two sequences writing page 0",
            vec![2, 0, 2, 0],
            vec![0, 1, 2],
            Error::InvalidParameter { arg: "block_table", requirement: "" },
        ),
        (
            "writing into the shared prefix",
            vec![2, 0, 2, 2],
            vec![0, 0, 1],
            Error::InvalidParameter { arg: "block_table", requirement: "" },
        ),
        (
            "page out of the pool",
            vec![2, 0, 2, 9],
            vec![0, 0, 1],
            Error::OutOfBounds { arg: "block_table", required: 10, len: 4 },
        ),
        (
            "past the block table",
            vec![2, 0, 2, 1],
            vec![0, 17, 17],
            Error::InvalidParameter { arg: "seq_lens", requirement: "" },
        ),
        (
            "sequence count",
            vec![2, 0, 2, 1],
            vec![0, 1],
            Error::ShapeMismatch { arg: "cu_seqlens_new", dim: "", expected: 0, actual: 0 },
        ),
        (
            "decreasing offsets",
            vec![2, 0, 2, 1],
            vec![0, 2, 1],
            Error::InvalidParameter { arg: "cu_seqlens_new", requirement: "" },
        ),
    ];
    for (name, table, cu, want) in cases {
        pool.table = table;
        let total = cu.iter().copied().max().unwrap_or(0);
        let e = pool.append(&cu, &k[..total * 2], &k[..total * 2]).unwrap_err();
        assert_eq!(std::mem::discriminant(&e), std::mem::discriminant(&want), "{name}: {e:?}");
        assert_eq!(arg(&e), arg(&want), "{name}: {e:?}");
        assert!(pool.k == before.0 && pool.v == before.1, "{name}: wrote on error");
    }
    // A view shorter than its dims: refused after the cache checks, nothing written.
    pool.table = vec![2, 0, 2, 1];
    let short = TensorRef::new(&k[..3], packed(1, 2, 2, 0));
    let e = append_kv(&mut pool.cache(), short, short, &[0, 1, 2]).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { arg: "k_new", .. }), "{e:?}");
    assert!(pool.k == before.0 && pool.v == before.1, "short view: wrote on error");
}

/// The argument an error names.
fn arg(e: &Error) -> &'static str {
    match e {
        Error::InvalidParameter { arg, .. }
        | Error::OutOfBounds { arg, .. }
        | Error::ShapeMismatch { arg, .. } => arg,
        _ => "",
    }
}

/// Many sequences decoding step by step (a prompt, then one token at a time, new pages taken
/// from a free list as sequences grow, some sequences idle some steps), the pool checked
/// against the dense copy after every step; at the end, varlen attention over the gathered
/// cache against the reference's paged attention on the pool.
#[test]
fn stress_step_by_step_appends() {
    let (batch, page_size, hkv, d, max_pages) = (12usize, 16usize, 2usize, 8usize, 6usize);
    let mut pool = Pool::new(batch * max_pages, page_size, hkv, d, d, batch, max_pages);
    let mut free: Vec<u32> = (0..(batch * max_pages) as u32).rev().collect();
    let mut rng = Rng::new(42);
    for step in 0..60 {
        let n: Vec<usize> = (0..batch)
            .map(|b| match step {
                0 => rng.below(20) as usize,
                _ if (b + step) % 5 == 0 => 0,
                _ => 1,
            })
            .collect();
        for (b, &nb) in n.iter().enumerate() {
            let (have, need) =
                (pool.lens[b].div_ceil(page_size), (pool.lens[b] + nb).div_ceil(page_size));
            for p in have..need {
                pool.table[b * max_pages + p] = free.pop().expect("pool exhausted");
            }
        }
        let cu = cumulative(n.iter().copied());
        let total = cu[batch];
        let (k, v) = (rows(&mut rng, total * hkv * d), rows(&mut rng, total * hkv * d));
        pool.append(&cu, &k, &v).unwrap();
        pool.verify(&format!("step {step}"));
    }
    // One query per sequence over its cache: the reference's varlen attention on the
    // gathered dense copy and its paged attention on the pool do the same f64 operations on
    // the same values, so they agree to the bit when the pool holds what the copy does.
    let hq = 2 * hkv;
    let q = rows(&mut rng, batch * hq * d);
    let cu_q: Vec<usize> = (0..=batch).collect();
    let cu_k = cumulative(pool.lens.iter().copied());
    let (kd, vd) = (pool.dense_k.concat(), pool.dense_v.concat());
    let (mut dense, mut paged) = (vec![0.0f32; batch * hq * d], vec![0.0f32; batch * hq * d]);
    let ql = packed(hq, batch, d, 0);
    attn_reference::batch::attention_varlen(
        TensorRef::new(&q, ql),
        TensorRef::new(&kd, packed(hkv, cu_k[batch], d, 0)),
        TensorRef::new(&vd, packed(hkv, cu_k[batch], d, 0)),
        &cu_q,
        &cu_k,
        0.5,
        &Mask::CAUSAL,
        &attn_kernels::Variants::NONE,
        TensorMut::new(&mut dense, ql),
        None,
    )
    .unwrap();
    let cache = PagedKv {
        k: PagePool::F32(&pool.k),
        v: PagePool::F32(&pool.v),
        page_size,
        kv_heads: hkv,
        dk: d,
        dv: d,
        block_table: &pool.table,
        max_pages,
        seq_lens: &pool.lens,
    };
    attn_reference::batch::attention_paged(
        TensorRef::new(&q, ql),
        &cu_q,
        &cache,
        0.5,
        &Mask::CAUSAL,
        &attn_kernels::Variants::NONE,
        TensorMut::new(&mut paged, ql),
        None,
    )
    .unwrap();
    assert_eq!(bits(&dense), bits(&paged));
}
