//! Attention over a paged K/V cache (`attn_kernels::batch::PagedAttention`) against the
//! reference's `attention_paged`.
//!
//! - Equivalence: random page layouts (shuffled pages, a prefix page shared by two sequences,
//!   NaN in every slot no sequence holds), page sizes 16 to 256, mixed lengths (0, 1, around a
//!   page and the 16-query piece), decode and chunked prefill, GQA, no mask or causal with
//!   offsets, variants, pools of f32, bf16, f16 and int8 (K and V of one type, read in place,
//!   or of two, gathered), every ISA, one and two threads. Each sequence is one `Case` of
//!   `attn_tests::attention_support`, whose bounds (the attention analysis) hold element by
//!   element; one and two threads agree to the bit.
//! - Bad input: the reference's errors for the same arguments, nothing written.
//! - Stress: many sequences decoding step by step, appending with `append_kv` into pages
//!   taken from a free list (of each pool type), checked against the reference after every
//!   step; appends store each pool type's bits (rounded, or `quantize_q8`'s).
//!
//! # Typed pools and the reference
//!
//! The reference reads f32 pools. A typed pool is drawn as an f32 pool first, whose values are
//! then replaced by those the typed elements represent, exactly as `attention_dtypes` does for
//! dense K/V: bf16/f16 values widen exactly; int8 blocks get scales of at most 8 significant
//! bits (rounded to bf16), so each `q·scale` is an f32 and the kernel's dequantised
//! `fl(q·scale)` is that exact value. The reference then computes on exactly the values the
//! kernel reads, and the f32 attention bounds apply unchanged. Slots no sequence holds stay NaN
//! in every type (an int8 row of them: values 0, scale NaN).
//!
//! Appends (the stress test) quantise with full-precision scales, whose `fl(q·scale)` rounds
//! once (`u` relative, documented with the decode tiles); there the reference is given the
//! f32 pool of the values the kernel reads (`q·scale` rounded once, like the kernel), and the
//! bound is that of the computation on those values. The exact representation of int8 pages
//! is what the proptest above checks.

use attn_kernels::attention::{Attention, Path};
use attn_kernels::batch::{
    append_kv, PagePool, PagePoolMut, PagedAttention, PagedKv, PagedKvMut, PAGED_Q_PIECE,
};
use attn_kernels::gemm::{bf16_dot_available, HalfPath};
use attn_kernels::{
    bf16, f16, quantize_q8, AnyMut, AnyRef, DType, Element, Error, Isa, KvRef, Mask, Parallelism,
    Q8Mut, Q8Ref, Tensor4Layout, TensorMut, TensorRef,
};
use attn_tests::attention_support::{cap_batch_work, drawn_variants, Case, MaskKind, Rng};
use attn_tests::fuzz_decode::VariantSpec;
use attn_tests::supported_isas;
use proptest::prelude::*;

/// Cap on `Σ_s hq·nq_s·nk_s·(dk + dv)` per case, so the f64 reference and bounds stay fast.
const WORK: usize = 2_000_000;

/// Key lengths around the edges: empty, single, one page of 16 ± 1, several pages.
const NK: [usize; 9] = [0, 1, 2, 15, 16, 17, 100, 256, 600];
/// Query lengths: decode (1) mostly, chunked prefill around the 16-query piece.
const NQ: [usize; 7] = [0, 1, 1, 1, 5, 16, 33];

/// The pool types a case runs: each type for K and V alike (read in place), and two mixed
/// pairs (gathered into f32).
const POOL_TYPES: [(DType, DType); 6] = [
    (DType::F32, DType::F32),
    (DType::BF16, DType::BF16),
    (DType::F16, DType::F16),
    (DType::Q8, DType::Q8),
    (DType::Q8, DType::F16),
    (DType::BF16, DType::F32),
];

/// A pool `[pages, page_size, hkv, d]` in one storage type.
#[derive(Clone, Debug)]
enum Pool {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    /// Values and scales (`[pages, page_size, hkv, ⌈d/32⌉]`).
    Q8(Vec<i8>, Vec<f32>),
}

impl Pool {
    fn view(&self) -> PagePool<'_> {
        match self {
            Pool::F32(x) => PagePool::F32(x),
            Pool::BF16(x) => PagePool::BF16(x),
            Pool::F16(x) => PagePool::F16(x),
            Pool::Q8(values, scales) => PagePool::Q8 { values, scales },
        }
    }

    fn view_mut(&mut self) -> PagePoolMut<'_> {
        match self {
            Pool::F32(x) => PagePoolMut::F32(x),
            Pool::BF16(x) => PagePoolMut::BF16(x),
            Pool::F16(x) => PagePoolMut::F16(x),
            Pool::Q8(values, scales) => PagePoolMut::Q8 { values, scales },
        }
    }

    /// A pool of `rows` rows of `d`, all NaN (an int8 row: values 0, scales NaN).
    fn nan(t: DType, rows: usize, d: usize) -> Self {
        match t {
            DType::F32 => Pool::F32(vec![f32::NAN; rows * d]),
            DType::BF16 => Pool::BF16(vec![bf16::NAN; rows * d]),
            DType::F16 => Pool::F16(vec![f16::NAN; rows * d]),
            DType::Q8 => Pool::Q8(vec![0; rows * d], vec![f32::NAN; rows * d.div_ceil(32)]),
        }
    }

    /// The rows of keys `0..nk` of every head of the sequence whose pages are `table`
    /// (`page_size` slots of `hkv` rows of `d`), gathered in `[hkv, nk, d]` order.
    fn gather(&self, table: &[u32], page_size: usize, hkv: usize, nk: usize, d: usize) -> Pool {
        let slot = |h: usize, j: usize| {
            (table[j / page_size] as usize * page_size + j % page_size) * hkv + h
        };
        let slots = || (0..hkv).flat_map(move |h| (0..nk).map(move |j| slot(h, j)));
        fn rows<T: Copy>(x: &[T], n: usize, slots: impl Iterator<Item = usize>) -> Vec<T> {
            slots.flat_map(|s| x[s * n..(s + 1) * n].iter().copied()).collect()
        }
        match self {
            Pool::F32(x) => Pool::F32(rows(x, d, slots())),
            Pool::BF16(x) => Pool::BF16(rows(x, d, slots())),
            Pool::F16(x) => Pool::F16(rows(x, d, slots())),
            Pool::Q8(q, sc) => Pool::Q8(rows(q, d, slots()), rows(sc, d.div_ceil(32), slots())),
        }
    }

    /// This pool's rows as a dense `[1, hkv, nk, d]` K or V operand.
    fn dense(&self, hkv: usize, nk: usize, d: usize) -> KvRef<'_> {
        let l = Tensor4Layout::bhsd(1, hkv, nk, d);
        match self {
            Pool::F32(x) => AnyRef::from(TensorRef::new(x, l)).into(),
            Pool::BF16(x) => AnyRef::from(TensorRef::new(x, l)).into(),
            Pool::F16(x) => AnyRef::from(TensorRef::new(x, l)).into(),
            Pool::Q8(q, sc) => Q8Ref::bhsd(q, sc, 1, hkv, nk, d).into(),
        }
    }

    /// The values the elements represent, as the kernel reads them: widened, or
    /// `fl(q·scale)` (rows of `d`).
    fn to_f32(&self, d: usize) -> Vec<f32> {
        match self {
            Pool::F32(x) => x.clone(),
            Pool::BF16(x) => x.iter().map(|v| v.to_f32()).collect(),
            Pool::F16(x) => x.iter().map(|v| v.to_f32()).collect(),
            Pool::Q8(q, sc) => {
                let nb = d.div_ceil(32);
                q.iter()
                    .enumerate()
                    .map(|(i, &q)| f32::from(q) * sc[i / d * nb + i % d / 32])
                    .collect()
            }
        }
    }
}

/// The f32 pool `x` (rows of `d`) stored as type `t`; `x` is overwritten by the values the
/// stored elements represent, exactly (module docs): rounded to bf16/f16, or int8 blocks with
/// a bf16-rounded scale. A row holding a NaN stays NaN (an int8 row: values 0, scale NaN).
fn typed_pool(t: DType, x: &mut [f32], d: usize) -> Pool {
    match t {
        DType::F32 => Pool::F32(x.to_vec()),
        DType::BF16 => {
            let b: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            x.iter_mut().zip(&b).for_each(|(x, b)| *x = b.to_f32());
            Pool::BF16(b)
        }
        DType::F16 => {
            let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            x.iter_mut().zip(&h).for_each(|(x, h)| *x = h.to_f32());
            Pool::F16(h)
        }
        DType::Q8 => {
            let nb = d.div_ceil(32);
            let rows = x.len().checked_div(d).unwrap_or(0);
            let (mut qv, mut sc) = (vec![0i8; x.len()], vec![0.0f32; rows * nb]);
            for r in 0..rows {
                for k in 0..nb {
                    let blk = r * d + k * 32..r * d + (k * 32 + 32).min(d);
                    if x[blk.clone()].iter().any(|v| v.is_nan()) {
                        sc[r * nb + k] = f32::NAN;
                        x[blk].fill(f32::NAN);
                        continue;
                    }
                    let m = x[blk.clone()].iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let scale = bf16::from_f32(m / 127.0).to_f32();
                    sc[r * nb + k] = scale;
                    for i in blk {
                        let q = if scale == 0.0 {
                            0
                        } else {
                            (x[i] / scale).round_ties_even().clamp(-127.0, 127.0) as i8
                        };
                        qv[i] = q;
                        let exact = f64::from(q) * f64::from(scale);
                        x[i] = exact as f32;
                        assert_eq!(f64::from(x[i]), exact, "q8_exact");
                    }
                }
            }
            Pool::Q8(qv, sc)
        }
    }
}

fn cumulative(lens: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut cu = vec![0];
    for n in lens {
        cu.push(cu[cu.len() - 1] + n);
    }
    cu
}

/// `[total, heads, d]` storage, as a packed view.
fn packed(heads: usize, total: usize, d: usize) -> Tensor4Layout {
    Tensor4Layout::strided([1, heads, total, d], [0, d, heads * d, 1], 0)
}

/// A paged batch: one `Case` per sequence (its queries, keys, values, mask and variants), the
/// queries packed `[total, hq, dk]`, and the keys and values in the pages of a pool.
struct Batch {
    cases: Vec<Case>,
    hq: usize,
    hkv: usize,
    dk: usize,
    dv: usize,
    page_size: usize,
    cu_q: Vec<usize>,
    q: Vec<f32>,
    /// The pools as f32: the values the typed pools represent (the reference's operands).
    k: Vec<f32>,
    v: Vec<f32>,
    /// The pools in their storage types (the kernel's operands).
    kt: Pool,
    vt: Pool,
    table: Vec<u32>,
    max_pages: usize,
    lens: Vec<usize>,
    mask: MaskKind,
    shared: bool,
}

impl Batch {
    /// With `share`, the second sequence (when both first sequences hold a whole page) takes
    /// the first sequence's first page as its own first page: its first `page_size` keys and
    /// values are made equal to the first sequence's. The pools are stored as `types` (keys,
    /// values), and the cases then hold the values the stored elements represent.
    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        lens: &[(usize, usize)],
        hkv: usize,
        group: usize,
        dk: usize,
        dv: usize,
        page_size: usize,
        share: bool,
        mask: MaskKind,
        variants: &VariantSpec,
        types: (DType, DType),
    ) -> Self {
        let hq = hkv * group;
        let mut cases: Vec<Case> = lens
            .iter()
            .enumerate()
            .map(|(s, &(nq, nk))| {
                let mut c =
                    Case::new(seed + s as u64, 1, hkv, group, nq, nk, dk, dv, true, 0, mask, 2.0);
                c.variants = variants.clone();
                c
            })
            .collect();
        let shared =
            share && cases.len() >= 2 && cases[0].nk >= page_size && cases[1].nk >= page_size;
        if shared {
            let (first, rest) = cases.split_at_mut(1);
            let (a, b) = (&first[0], &mut rest[0]);
            for j in 0..page_size {
                for h in 0..hkv {
                    for e in 0..dk {
                        b.k.0[b.k.1.index(0, h, j, e)] = a.k.0[a.k.1.index(0, h, j, e)];
                    }
                    for e in 0..dv {
                        b.v.0[b.v.1.index(0, h, j, e)] = a.v.0[a.v.1.index(0, h, j, e)];
                    }
                }
            }
        }
        let mut rng = Rng::new(seed ^ 0x9A6E);
        let need: Vec<usize> = lens.iter().map(|l| l.1.div_ceil(page_size)).collect();
        let max_pages = need.iter().copied().max().unwrap_or(0) + 1;
        let pages = need.iter().sum::<usize>() + 3;
        let mut order: Vec<u32> = (0..pages as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        // Rows past a sequence's pages hold pages out of the pool: never to be read.
        let mut table = vec![u32::MAX; lens.len() * max_pages];
        let mut next = order.into_iter();
        for (b, &n) in need.iter().enumerate() {
            for p in 0..n {
                table[b * max_pages + p] = if shared && b == 1 && p == 0 {
                    table[0]
                } else {
                    next.next().expect("enough pages")
                };
            }
        }
        let mut k = vec![f32::NAN; pages * page_size * hkv * dk];
        let mut v = vec![f32::NAN; pages * page_size * hkv * dv];
        for (b, c) in cases.iter().enumerate() {
            for j in 0..c.nk {
                let page = table[b * max_pages + j / page_size] as usize;
                for h in 0..hkv {
                    let slot = (page * page_size + j % page_size) * hkv + h;
                    for e in 0..dk {
                        k[slot * dk + e] = c.k.0[c.k.1.index(0, h, j, e)];
                    }
                    for e in 0..dv {
                        v[slot * dv + e] = c.v.0[c.v.1.index(0, h, j, e)];
                    }
                }
            }
        }
        let (kt, vt) = (typed_pool(types.0, &mut k, dk), typed_pool(types.1, &mut v, dv));
        // The cases' keys and values: the represented values, read back from the pools.
        for (b, c) in cases.iter_mut().enumerate() {
            for j in 0..c.nk {
                let page = table[b * max_pages + j / page_size] as usize;
                for h in 0..hkv {
                    let slot = (page * page_size + j % page_size) * hkv + h;
                    for e in 0..dk {
                        c.k.0[c.k.1.index(0, h, j, e)] = k[slot * dk + e];
                    }
                    for e in 0..dv {
                        c.v.0[c.v.1.index(0, h, j, e)] = v[slot * dv + e];
                    }
                }
            }
        }
        let cu_q = cumulative(lens.iter().map(|l| l.0));
        let tq = cu_q[lens.len()];
        let ql = packed(hq, tq, dk);
        let mut q = vec![f32::NAN; ql.required_len().unwrap_or(0)];
        for (s, c) in cases.iter().enumerate() {
            for i in 0..c.nq {
                for h in 0..hq {
                    for e in 0..dk {
                        q[ql.index(0, h, cu_q[s] + i, e)] = c.q.0[c.q.1.index(0, h, i, e)];
                    }
                }
            }
        }
        let lens = lens.iter().map(|l| l.1).collect();
        Batch {
            cases,
            hq,
            hkv,
            dk,
            dv,
            page_size,
            cu_q,
            q,
            k,
            v,
            kt,
            vt,
            table,
            max_pages,
            lens,
            mask,
            shared,
        }
    }

    fn total_q(&self) -> usize {
        self.cu_q[self.cu_q.len() - 1]
    }

    /// The cache over the typed pools (the kernel's).
    fn cache(&self) -> PagedKv<'_> {
        PagedKv { k: self.kt.view(), v: self.vt.view(), ..self.cache_f32() }
    }

    /// The cache over the f32 pools of the represented values (the reference's).
    fn cache_f32(&self) -> PagedKv<'_> {
        PagedKv {
            k: PagePool::F32(&self.k),
            v: PagePool::F32(&self.v),
            page_size: self.page_size,
            kv_heads: self.hkv,
            dk: self.dk,
            dv: self.dv,
            block_table: &self.table,
            max_pages: self.max_pages,
            seq_lens: &self.lens,
        }
    }

    fn mask(&self) -> Mask<'static> {
        match self.mask {
            MaskKind::Causal(offset) => Mask::Causal { offset },
            _ => Mask::None,
        }
    }

    fn scale(&self) -> f32 {
        self.cases.first().map_or(1.0, |c| c.scale)
    }

    /// The reference's output (NaN past the view) and `[hq, total_q]` logsumexps.
    fn reference(&self) -> (Vec<f32>, Vec<f32>) {
        let (tq, l) = (self.total_q(), packed(self.hq, self.total_q(), self.dv));
        let mut o = vec![f32::NAN; l.required_len().unwrap_or(0) + 3];
        let mut lse = vec![f32::NAN; self.hq * tq];
        let var = self.cases.first().map(|c| c.variants()).unwrap_or_default();
        attn_reference::batch::attention_paged(
            TensorRef::new(&self.q, packed(self.hq, tq, self.dk)),
            &self.cu_q,
            &self.cache_f32(),
            self.scale(),
            &self.mask(),
            &var,
            TensorMut::new(&mut o, l),
            Some(&mut lse),
        )
        .expect("the reference failed on a valid batch");
        (o, lse)
    }

    /// The kernel's output and logsumexps.
    fn kernel(&self, isa: Isa, threads: usize) -> (Vec<f32>, Vec<f32>) {
        self.kernel_typed(isa, threads, &self.q)
    }

    /// Rounds the queries (the batch's and each case's) to the bf16 values they are nearest,
    /// so that the reference sees the values bf16 queries represent.
    fn round_queries_to_bf16(&mut self) {
        let round = |x: &mut f32| *x = bf16::from_f32(*x).to_f32();
        self.q.iter_mut().for_each(round);
        for c in &mut self.cases {
            c.q.0.iter_mut().for_each(round);
        }
    }

    /// The kernel's output and logsumexps with bf16 queries (the batch's, which must be
    /// bf16 values) and `HalfPath::Dot`, on `threads` threads.
    fn kernel_dot(&self, threads: usize) -> (Vec<f32>, Vec<f32>) {
        let qb: Vec<bf16> = self.q.iter().map(|&x| bf16::from_f32(x)).collect();
        self.run_with(&qb, |p| {
            p.isa(Isa::Avx512).half_path(HalfPath::Dot).parallelism(Parallelism::threads(threads))
        })
    }

    /// The kernel's output in `O` and logsumexps, for the queries `q` (in `Q`, the batch's
    /// query layout).
    fn kernel_typed<Q: Element, O: Element>(
        &self,
        isa: Isa,
        threads: usize,
        q: &[Q],
    ) -> (Vec<O>, Vec<f32>)
    where
        for<'a> TensorRef<'a, Q>: Into<AnyRef<'a>>,
        for<'a> TensorMut<'a, O>: Into<AnyMut<'a>>,
    {
        self.run_with(q, |p| p.isa(isa).parallelism(Parallelism::threads(threads)))
    }

    /// The kernel's output in `O` and logsumexps for the queries `q`, with the batch's
    /// settings and then those `how` adds.
    fn run_with<Q: Element, O: Element>(
        &self,
        q: &[Q],
        how: impl FnOnce(PagedAttention<'_>) -> PagedAttention<'_>,
    ) -> (Vec<O>, Vec<f32>)
    where
        for<'a> TensorRef<'a, Q>: Into<AnyRef<'a>>,
        for<'a> TensorMut<'a, O>: Into<AnyMut<'a>>,
    {
        let (tq, l) = (self.total_q(), packed(self.hq, self.total_q(), self.dv));
        let mut o = vec![O::from_f32(f32::NAN); l.required_len().unwrap_or(0) + 3];
        let mut lse = vec![f32::NAN; self.hq * tq];
        let var = self.cases.first().map(|c| c.variants()).unwrap_or_default();
        let p = PagedAttention::new(
            TensorRef::new(q, packed(self.hq, tq, self.dk)),
            &self.cu_q,
            self.cache(),
        )
        .scale(self.scale())
        .mask(self.mask())
        .variants(var)
        .lse(&mut lse);
        how(p).run(TensorMut::new(&mut o, l)).expect("paged attention failed on a valid batch");
        (o, lse)
    }

    /// Checks `got` against `want` with each sequence's case bounds; elements past the output
    /// view must still be NaN.
    fn compare(
        &self,
        what: &str,
        got: &(Vec<f32>, Vec<f32>),
        want: &(Vec<f32>, Vec<f32>),
    ) -> Result<(), String> {
        self.compare_by(what, got, want, Case::bounds)
    }

    /// [`compare`](Self::compare) with each sequence's bounds from `bounds`.
    fn compare_by(
        &self,
        what: &str,
        got: &(Vec<f32>, Vec<f32>),
        want: &(Vec<f32>, Vec<f32>),
        bounds: impl Fn(&Case) -> (Vec<f64>, Vec<f64>),
    ) -> Result<(), String> {
        let tq = self.total_q();
        let l = packed(self.hq, tq, self.dv);
        for (s, c) in self.cases.iter().enumerate() {
            let (ob, lb) = bounds(c);
            for h in 0..self.hq {
                for i in 0..c.nq {
                    let (t, row) = (self.cu_q[s] + i, h * c.nq + i);
                    for d in 0..self.dv {
                        let at = l.index(0, h, t, d);
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
        let end = l.required_len().unwrap_or(0);
        if got.0[end..].iter().any(|x| !x.is_nan()) {
            return Err(format!("{what}: wrote past the output view; {}", self.describe()));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let lens: Vec<_> = self.cases.iter().map(|c| (c.nq, c.nk)).collect();
        let var = self.cases.first().map(|c| format!("{:?}", c.variants));
        let types = (self.cache().k.dtype(), self.cache().v.dtype());
        format!(
            "lens {lens:?} hq {} hkv {} dk {} dv {} page {} shared {} mask {:?} variants {var:?} \
             pools {types:?}",
            self.hq, self.hkv, self.dk, self.dv, self.page_size, self.shared, self.mask
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
        prop::sample::select(vec![None, None, Some(0), Some(-3), Some(40)])
            .prop_map(MaskKind::Causal),
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

    /// Paged attention against the reference within each sequence's bound, on every ISA, one
    /// and two threads (the same bits).
    #[test]
    fn paged_matches_reference(
        seed in any::<u64>(),
        lens in prop::collection::vec(
            (prop::sample::select(NQ.to_vec()), prop::sample::select(NK.to_vec())), 1..7),
        (hkv, group) in prop::sample::select(vec![(1usize, 1usize), (2, 2), (1, 3), (2, 1), (1, 8)]),
        (dk, dv) in prop::sample::select(vec![(1usize, 1usize), (16, 16), (64, 64), (8, 24), (40, 0)]),
        page_size in prop::sample::select(vec![16usize, 32, 64, 128, 256]),
        share in any::<bool>(),
        mask in mask_kind(),
        (window, softcap, sinks, alibi) in variant_spec(),
        types in prop::sample::select(POOL_TYPES.to_vec()),
    ) {
        let variants = (window, softcap, sinks, alibi);
        let batch = drawn(seed, lens, (hkv, group, dk, dv), page_size, share, mask, variants, types);
        let want = batch.reference();
        for isa in supported_isas("paged") {
            let one = batch.kernel(isa, 1);
            batch.compare(&format!("{isa}"), &one, &want).map_err(TestCaseError::fail)?;
            let two = batch.kernel(isa, 2);
            prop_assert_eq!(bits(&one.0), bits(&two.0), "threads: {}", isa);
            prop_assert_eq!(bits(&one.1), bits(&two.1), "threads: {}", isa);
            typed_queries_and_output::<bf16>(&batch, isa)?;
            typed_queries_and_output::<f16>(&batch, isa)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// bf16 queries and pools with `HalfPath::Dot`, where this CPU has AVX512_BF16 (else
    /// `dot_path_not_runnable_here_is_named` says so): each decode piece (at most
    /// `PAGED_Q_PIECE` queries) within the bound of the decode path's scores on `vdpbf16ps`
    /// (`Case::bounds_dot_scores`), each chunked-prefill piece within the flash path's
    /// (`Case::bounds_dot`, probabilities rounded to bf16); one and two threads agree to the
    /// bit.
    #[test]
    fn paged_dot_matches_reference(
        seed in any::<u64>(),
        lens in prop::collection::vec(
            (prop::sample::select(NQ.to_vec()), prop::sample::select(NK.to_vec())), 1..6),
        (hkv, group) in prop::sample::select(vec![(1usize, 1usize), (2, 2), (1, 4)]),
        (dk, dv) in prop::sample::select(vec![(1usize, 1usize), (16, 16), (64, 64), (7, 24)]),
        page_size in prop::sample::select(vec![16usize, 32, 128]),
        share in any::<bool>(),
        mask in mask_kind(),
        (window, softcap, sinks, alibi) in variant_spec(),
    ) {
        if !bf16_dot_available() {
            return Ok(());
        }
        let variants = (window, softcap, sinks, alibi);
        let types = (DType::BF16, DType::BF16);
        let mut batch =
            drawn(seed, lens, (hkv, group, dk, dv), page_size, share, mask, variants, types);
        batch.round_queries_to_bf16();
        let want = batch.reference();
        let one = batch.kernel_dot(1);
        batch
            .compare_by("avx512 HalfPath::Dot", &one, &want, |c| {
                if c.nq <= PAGED_Q_PIECE { c.bounds_dot_scores() } else { c.bounds_dot() }
            })
            .map_err(TestCaseError::fail)?;
        let two = batch.kernel_dot(2);
        prop_assert_eq!(bits(&one.0), bits(&two.0), "threads");
        prop_assert_eq!(bits(&one.1), bits(&two.1), "threads");
    }
}

/// Names the path `paged_dot_matches_reference` could not run on this CPU.
#[test]
fn dot_path_not_runnable_here_is_named() {
    if !bf16_dot_available() {
        eprintln!(
            "paged: the decode and flash paths on vdpbf16ps (HalfPath::Dot) need AVX-512F and \
             AVX512_BF16, which this CPU lacks; paged_dot_matches_reference skipped them"
        );
    }
}

/// The batch of a proptest case: the lengths halved until the work is under [`WORK`], and the
/// variants drawn (`window`, `softcap`, whether sinks and ALiBi slopes are on) made concrete
/// for `hq = hkv·group` heads.
#[allow(clippy::too_many_arguments)]
fn drawn(
    seed: u64,
    mut lens: Vec<(usize, usize)>,
    (hkv, group, dk, dv): (usize, usize, usize, usize),
    page_size: usize,
    share: bool,
    mask: MaskKind,
    variants: (Option<(usize, usize)>, Option<f32>, bool, bool),
    types: (DType, DType),
) -> Batch {
    let hq = hkv * group;
    cap_batch_work(&mut lens, hq, dk, dv, WORK);
    let spec = drawn_variants(seed, hq, variants);
    Batch::new(seed, &lens, hkv, group, dk, dv, page_size, share, mask, &spec, types)
}

/// Queries and output in the half type `T`: bit for bit the f32 call on the widened queries
/// with each output value rounded once to `T` (and the same logsumexps), which the f32 call's
/// check against the reference covers. Q in `T` with an f32 output, and f32 Q with an output
/// in `T`, likewise.
fn typed_queries_and_output<T: Element>(batch: &Batch, isa: Isa) -> Result<(), TestCaseError>
where
    for<'a> TensorRef<'a, T>: Into<AnyRef<'a>>,
    for<'a> TensorMut<'a, T>: Into<AnyMut<'a>>,
{
    let qt: Vec<T> = batch.q.iter().map(|&x| T::from_f32(x)).collect();
    let qw: Vec<f32> = qt.iter().map(|x| x.to_f32()).collect();
    let (o32, lse32) = batch.kernel_typed::<f32, f32>(isa, 1, &qw);
    let rounded: Vec<u32> = o32.iter().map(|&x| T::from_f32(x).to_f32().to_bits()).collect();
    let widen = |o: &[T]| o.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<_>>();
    let what = format!("{isa} {:?}: {}", T::DTYPE, batch.describe());
    let (ot, lt) = batch.kernel_typed::<T, T>(isa, 2, &qt);
    prop_assert!(widen(&ot) == rounded, "typed Q and O: {}", what);
    prop_assert_eq!(bits(&lt), bits(&lse32), "typed Q and O, lse: {}", what);
    let (of, _) = batch.kernel_typed::<T, f32>(isa, 1, &qt);
    prop_assert_eq!(bits(&of), bits(&o32), "typed Q, f32 O: {}", what);
    let (ot, _) = batch.kernel_typed::<f32, T>(isa, 1, &batch.q);
    let (of, _) = batch.kernel_typed::<f32, f32>(isa, 1, &batch.q);
    let rounded: Vec<u32> = of.iter().map(|&x| T::from_f32(x).to_f32().to_bits()).collect();
    prop_assert!(widen(&ot) == rounded, "f32 Q, typed O: {}", what);
    Ok(())
}

/// Long sequences (several key chunks, so the split and its merge run) in pages of every size,
/// decode and a chunked prefill, GQA, a shared prefix, pools of each type (one per page size):
/// against the reference, and the same bits at 1, 2 and 3 threads.
#[test]
fn long_sequences_every_page_size() {
    let lens = [(1usize, 3000usize), (1, 700), (20, 1200), (0, 50), (1, 1), (3, 0)];
    for (page_size, types) in [16usize, 32, 64, 128, 256].into_iter().zip(POOL_TYPES) {
        let spec = VariantSpec::default();
        let causal = MaskKind::Causal(None);
        let batch = Batch::new(7, &lens, 2, 4, 64, 64, page_size, true, causal, &spec, types);
        assert!(batch.shared);
        let want = batch.reference();
        for isa in supported_isas("paged") {
            let one = batch.kernel(isa, 1);
            batch.compare(&format!("{isa} page {page_size}"), &one, &want).unwrap();
            for threads in [2, 3] {
                let more = batch.kernel(isa, threads);
                assert_eq!(bits(&one.0), bits(&more.0), "{isa} page {page_size} threads {threads}");
                assert_eq!(bits(&one.1), bits(&more.1), "{isa} page {page_size} threads {threads}");
            }
        }
    }
}

/// Decode over a pool gives the bits that decode over the same stored keys and values,
/// gathered into dense `[hkv, nk, d]` tensors of the pool's type, gives: a block's tiles run
/// over it page by page and its softmax once, as over a dense view (and head groups change no
/// head's arithmetic). Every page size, the pool types read in place, lengths around the
/// 64-key block and over several key chunks, GQA, every ISA.
#[test]
fn paged_decode_is_dense_decode_bitwise() {
    let lens = [(1usize, 3000usize), (1, 700), (1, 129), (1, 64), (1, 17), (1, 1)];
    let spec = VariantSpec::default();
    for page_size in [16usize, 32, 64, 128, 256] {
        for types in POOL_TYPES.into_iter().filter(|t| t.0 == t.1) {
            let b =
                Batch::new(11, &lens, 2, 4, 64, 64, page_size, false, MaskKind::None, &spec, types);
            let (hq, tq) = (b.hq, b.total_q());
            let (ql, ol) = (packed(hq, tq, b.dk), packed(hq, tq, b.dv));
            for isa in supported_isas("paged") {
                let (po, plse) = b.kernel(isa, 1);
                for (s, &nk) in b.lens.iter().enumerate() {
                    let pages = &b.table[s * b.max_pages..];
                    let k = b.kt.gather(pages, page_size, b.hkv, nk, b.dk);
                    let v = b.vt.gather(pages, page_size, b.hkv, nk, b.dv);
                    let tok = b.cu_q[s];
                    let q: Vec<f32> = (0..hq)
                        .flat_map(|h| (0..b.dk).map(move |e| (h, e)))
                        .map(|(h, e)| b.q[ql.index(0, h, tok, e)])
                        .collect();
                    let mut o = vec![f32::NAN; hq * b.dv];
                    let mut lse = vec![f32::NAN; hq];
                    Attention::new(
                        TensorRef::new(&q, Tensor4Layout::bhsd(1, hq, 1, b.dk)),
                        k.dense(b.hkv, nk, b.dk),
                        v.dense(b.hkv, nk, b.dv),
                    )
                    .scale(b.scale())
                    .path(Path::Decode)
                    .isa(isa)
                    .parallelism(Parallelism::threads(1))
                    .lse(&mut lse)
                    .run(TensorMut::new(&mut o, Tensor4Layout::bhsd(1, hq, 1, b.dv)))
                    .expect("dense decode failed");
                    let what = format!("{isa} page {page_size} {types:?} sequence {s} ({nk} keys)");
                    for h in 0..hq {
                        let got: Vec<u32> =
                            (0..b.dv).map(|e| po[ol.index(0, h, tok, e)].to_bits()).collect();
                        assert_eq!(got, bits(&o[h * b.dv..][..b.dv]), "{what}, head {h}");
                        assert_eq!(plse[h * tq + tok].to_bits(), lse[h].to_bits(), "{what}, lse");
                    }
                }
            }
        }
    }
}

/// Bad arguments: the reference's error for the same call, and nothing written.
#[test]
fn bad_input_is_the_references_error() {
    let (hq, hkv, d, ps) = (2usize, 1usize, 4usize, 16usize);
    let q = vec![0.5f32; 3 * hq * d];
    let pool = vec![0.25f32; 3 * ps * hkv * d];
    let keep = vec![true; 64];
    let sinks = [0.0f32; 3];
    let good_table = [0u32, 1, 2, 2];
    let good_lens = [20usize, 5];
    let cache = PagedKv {
        k: PagePool::F32(&pool),
        v: PagePool::F32(&pool),
        page_size: ps,
        kv_heads: hkv,
        dk: d,
        dv: d,
        block_table: &good_table,
        max_pages: 2,
        seq_lens: &good_lens,
    };
    let qlay = packed(hq, 3, d);
    let good_q: &[usize] = &[0, 1, 3];
    let far = [0u32, 7, 2, 2];
    // Typed pools of the same 3 pages (d = 4: one scale block per slot), and one of 4 pages.
    let (qv, qs, qs4) =
        (vec![3i8; 3 * ps * hkv * d], vec![0.5f32; 3 * ps * hkv], vec![0.5f32; 4 * ps * hkv]);
    let bv = vec![bf16::from_f32(0.25); 3 * ps * hkv * d];
    let hv4 = vec![f16::from_f32(0.25); 4 * ps * hkv * d];
    let q8 = |values, scales| PagePool::Q8 { values, scales };
    let f32s = PagePool::F32;
    let long = [40usize, 5];
    let three = [20usize, 5, 0];
    type Args<'a> =
        (&'a str, PagedKv<'a>, &'a [usize], Mask<'a>, Tensor4Layout, Option<&'a [f32]>, usize);
    let cases: Vec<Args<'_>> = vec![
        (
            "page out of the pool",
            PagedKv { block_table: &far, ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        (
            "sequence past its row",
            PagedKv { seq_lens: &long, ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        ("page size 24", PagedKv { page_size: 24, ..cache }, good_q, Mask::None, qlay, None, 6),
        (
            "short value pool",
            PagedKv { v: f32s(&pool[1..]), ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        (
            "int8 key scales short",
            PagedKv { k: q8(&qv, &qs[1..]), ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        (
            "int8 value scales long",
            PagedKv { v: q8(&qv, &qs4), ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        (
            "int8 keys not whole pages",
            PagedKv { k: q8(&qv[1..], &qs), ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        (
            "bf16 values short",
            PagedKv { v: PagePool::BF16(&bv[4..]), ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        (
            "f16 keys of 4 pages, values of 3",
            PagedKv { k: PagePool::F16(&hv4), ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        (
            "int8 keys, bf16 values, page out of the pool",
            PagedKv { k: q8(&qv, &qs), v: PagePool::BF16(&bv), block_table: &far, ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        (
            "short block table",
            PagedKv { block_table: &good_table[1..], ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        ("zero kv heads", PagedKv { kv_heads: 0, ..cache }, good_q, Mask::None, qlay, None, 6),
        ("decreasing cu_q", cache, &[0, 2, 1], Mask::None, qlay, None, 6),
        ("cu_q not from 0", cache, &[1, 2, 3], Mask::None, qlay, None, 6),
        ("empty cu_q", cache, &[], Mask::None, qlay, None, 6),
        ("cu_q total", cache, &[0, 1, 2], Mask::None, qlay, None, 6),
        ("cu_q overflowing total", cache, &[0, usize::MAX, 3], Mask::None, qlay, None, 6),
        ("sequence counts", cache, &[0, 3], Mask::None, qlay, None, 6),
        (
            "batch mismatch",
            PagedKv { seq_lens: &three, block_table: &[0, 1, 2, 2, 2, 2], ..cache },
            good_q,
            Mask::None,
            qlay,
            None,
            6,
        ),
        (
            "keep mask",
            cache,
            good_q,
            Mask::Keep { keep: &keep, layout: Tensor4Layout::bhsd(1, hq, 3, 20) },
            qlay,
            None,
            6,
        ),
        (
            "batch of 2",
            cache,
            good_q,
            Mask::None,
            Tensor4Layout::strided([2, hq, 3, d], [0, d, hq * d, 1], 0),
            None,
            6,
        ),
        ("query width", cache, good_q, Mask::None, packed(hq, 3, d - 1), None, 6),
        (
            "query heads not a multiple",
            cache,
            good_q,
            Mask::None,
            Tensor4Layout::strided([1, 3, 3, d], [0, d, 2 * d, 1], 0),
            None,
            6,
        ),
        ("sinks of 3 heads", cache, good_q, Mask::CAUSAL, qlay, Some(&sinks[..]), 6),
        ("lse length", cache, good_q, Mask::CAUSAL, qlay, None, 5),
    ];
    for (name, cache, cu_q, mask, ql, sinks, lse_len) in cases {
        let var =
            sinks.map_or(attn_kernels::Variants::NONE, |s| attn_kernels::Variants::NONE.sinks(s));
        let ol = packed(hq, 3, d);
        let (mut o, mut lse) = (vec![f32::NAN; 40], vec![f32::NAN; lse_len]);
        let want = attn_reference::batch::attention_paged(
            TensorRef::new(&q, ql),
            cu_q,
            &cache,
            0.5,
            &mask,
            &var,
            TensorMut::new(&mut o, ol),
            Some(&mut lse),
        )
        .unwrap_err();
        let got = PagedAttention::new(TensorRef::new(&q, ql), cu_q, cache)
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

/// Appends to typed pools: half-precision new rows into pools of another type (rounded once
/// from the exact value), and the checks that refuse before anything is written: a NaN or
/// infinite row bound for an int8 pool (its block scale cannot represent it; a float pool
/// stores it), scale pools of the wrong length.
#[test]
fn typed_appends_and_their_errors() {
    const PS: usize = 16;
    const D: usize = 40;
    let (ps, hkv, d) = (PS, 1usize, D);
    let table = [1u32, 0];
    let lens = [0usize];
    let cu = [0usize, 2];
    let l = packed(hkv, 2, d);
    let new: Vec<f32> = (0..2 * d).map(|i| (i as f32 - 37.0) / 7.0).collect();
    let new_bf16: Vec<bf16> = new.iter().map(|&x| bf16::from_f32(x)).collect();
    let mut bad = new.clone();
    bad[d + 5] = f32::INFINITY;
    // bf16 rows into an f16 and an int8 pool: the f16 pool holds each widened value rounded to
    // f16; the int8 pool quantize_q8's bits of the widened row.
    let (mut k, mut v) =
        (Pool::nan(DType::F16, 2 * ps * hkv, d), Pool::nan(DType::Q8, 2 * ps * hkv, d));
    let mut cache = PagedKvMut {
        k: k.view_mut(),
        v: v.view_mut(),
        page_size: ps,
        kv_heads: hkv,
        dk: d,
        dv: d,
        block_table: &table,
        max_pages: 2,
        seq_lens: &lens,
    };
    let src = TensorRef::new(&new_bf16[..], l);
    append_kv(&mut cache, src, src, &cu).unwrap();
    let cache = cache.as_ref();
    let widened: Vec<f32> = new_bf16.iter().map(|x| x.to_f32()).collect();
    for j in 0..2 {
        let row = &widened[j * d..(j + 1) * d];
        expect_stored(&cache.k, &cache, 0, j, 0, row, DType::F16, 0);
        expect_stored(&cache.v, &cache, 0, j, 0, row, DType::Q8, 0);
    }
    // Slot 2 on is untouched.
    let PagePool::Q8 { scales, .. } = cache.v else { unreachable!() };
    assert!(scales[ps * 2 + 2 * 2..].iter().all(|x| x.is_nan()));

    // Refusals: the pools keep their bits.
    type Make = fn() -> (Pool, Pool);
    let cases: [(&str, Make, &[f32], Error); 4] = [
        (
            "infinity into int8 values",
            || (Pool::nan(DType::F32, 2 * PS, D), Pool::nan(DType::Q8, 2 * PS, D)),
            &bad,
            Error::NonFinite { arg: "v_new", value: f32::INFINITY },
        ),
        (
            "infinity into int8 keys",
            || (Pool::nan(DType::Q8, 2 * PS, D), Pool::nan(DType::BF16, 2 * PS, D)),
            &bad,
            Error::NonFinite { arg: "k_new", value: f32::INFINITY },
        ),
        (
            "int8 key scales short",
            || {
                let Pool::Q8(q, sc) = Pool::nan(DType::Q8, 2 * PS, D) else { unreachable!() };
                (Pool::Q8(q, sc[1..].to_vec()), Pool::nan(DType::F32, 2 * PS, D))
            },
            &new,
            Error::ShapeMismatch { arg: "k_scales", dim: "len", expected: 64, actual: 63 },
        ),
        (
            "int8 value scales of another page count",
            || {
                let Pool::Q8(q, sc) = Pool::nan(DType::Q8, 2 * PS, D) else { unreachable!() };
                let sc = [sc.clone(), sc].concat();
                (Pool::nan(DType::F16, 2 * PS, D), Pool::Q8(q, sc))
            },
            &new,
            Error::ShapeMismatch { arg: "v_scales", dim: "len", expected: 64, actual: 128 },
        ),
    ];
    for (name, make, rows, want) in cases {
        let (mut k, mut v) = make();
        let before = (format!("{k:?}"), format!("{v:?}"));
        let mut cache = PagedKvMut {
            k: k.view_mut(),
            v: v.view_mut(),
            page_size: ps,
            kv_heads: hkv,
            dk: d,
            dv: d,
            block_table: &table,
            max_pages: 2,
            seq_lens: &lens,
        };
        let src = TensorRef::new(rows, l);
        let got = append_kv(&mut cache, src, src, &cu).unwrap_err();
        assert_eq!(got, want, "{name}");
        assert_eq!((format!("{k:?}"), format!("{v:?}")), before, "{name}: wrote on error");
    }
}

/// Many sequences decoding step by step, in pools of each type: a prompt (chunked prefill: its
/// K/V appended, then its queries against the cache), then one token at a time, new pages taken
/// from a shuffled free list as sequences grow, some sequences idle some steps. After every
/// append, each written slot holds the pool type's bits for its row (rounded, or
/// `quantize_q8`'s); the step's queries against the reference on the values the pools hold
/// (module docs), within the bounds of each sequence's dense case over the keys it holds.
#[test]
fn stress_decode_step_by_step() {
    for t in DType::ALL {
        stress_pool_type(t);
    }
}

fn stress_pool_type(t: DType) {
    let (batch, ps, hkv, group, d, max_pages) = (10usize, 16usize, 2usize, 2usize, 40usize, 8usize);
    let hq = hkv * group;
    let pages = batch * max_pages;
    let mut rng = Rng::new(23);
    let mut free: Vec<u32> = (0..pages as u32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let (mut k, mut v) = (Pool::nan(t, pages * ps * hkv, d), Pool::nan(t, pages * ps * hkv, d));
    let mut table = vec![u32::MAX; batch * max_pages];
    let mut lens = vec![0usize; batch];
    let rows =
        |rng: &mut Rng, n: usize| -> Vec<f32> { (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect() };
    for step in 0..40 {
        let n: Vec<usize> = (0..batch)
            .map(|b| match step {
                0 => rng.below(40) as usize,
                _ if (b + step) % 4 == 0 => 0,
                _ => 1,
            })
            .collect();
        for (b, &nb) in n.iter().enumerate() {
            for p in lens[b].div_ceil(ps)..(lens[b] + nb).div_ceil(ps) {
                table[b * max_pages + p] = free.pop().expect("pool exhausted");
            }
        }
        let cu = cumulative(n.iter().copied());
        let total = cu[batch];
        let (kn, vn) = (rows(&mut rng, total * hkv * d), rows(&mut rng, total * hkv * d));
        let mut cache = PagedKvMut {
            k: k.view_mut(),
            v: v.view_mut(),
            page_size: ps,
            kv_heads: hkv,
            dk: d,
            dv: d,
            block_table: &table,
            max_pages,
            seq_lens: &lens,
        };
        let l = packed(hkv, total, d);
        append_kv(&mut cache, TensorRef::new(&kn, l), TensorRef::new(&vn, l), &cu).unwrap();
        let cache = cache.as_ref();
        for b in 0..batch {
            for (i, tok) in (cu[b]..cu[b + 1]).enumerate() {
                for h in 0..hkv {
                    let row = |x: &[f32]| x[l.index(0, h, tok, 0)..][..d].to_vec();
                    let j = lens[b] + i;
                    expect_stored(&cache.k, &cache, b, j, h, &row(&kn), t, step);
                    expect_stored(&cache.v, &cache, b, j, h, &row(&vn), t, step);
                }
            }
        }
        for (l, nb) in lens.iter_mut().zip(&n) {
            *l += nb;
        }
        // The step's queries (as many as the new tokens) against every key held.
        let q = rows(&mut rng, total * hq * d);
        let (kf, vf) = (k.to_f32(d), v.to_f32(d));
        let typed = PagedKv {
            k: k.view(),
            v: v.view(),
            page_size: ps,
            kv_heads: hkv,
            dk: d,
            dv: d,
            block_table: &table,
            max_pages,
            seq_lens: &lens,
        };
        let cache = PagedKv { k: PagePool::F32(&kf), v: PagePool::F32(&vf), ..typed };
        let (ql, ol) = (packed(hq, total, d), packed(hq, total, d));
        let mut want = (vec![0.0f32; total * hq * d], vec![0.0f32; hq * total]);
        attn_reference::batch::attention_paged(
            TensorRef::new(&q, ql),
            &cu,
            &cache,
            0.25,
            &Mask::CAUSAL,
            &attn_kernels::Variants::NONE,
            TensorMut::new(&mut want.0, ol),
            Some(&mut want.1),
        )
        .unwrap();
        for isa in supported_isas("paged") {
            let mut got = (vec![f32::NAN; total * hq * d], vec![f32::NAN; hq * total]);
            PagedAttention::new(TensorRef::new(&q, ql), &cu, typed)
                .scale(0.25)
                .mask(Mask::CAUSAL)
                .lse(&mut got.1)
                .isa(isa)
                .parallelism(attn_kernels::Parallelism::threads(2))
                .run(TensorMut::new(&mut got.0, ol))
                .unwrap();
            // Each sequence's bound: its dense case (same shapes and magnitudes) bounds the
            // error of the same computation; values are within ±2 like the case's.
            for b in 0..batch {
                let nq = n[b];
                if nq == 0 {
                    continue;
                }
                let bound = step_bound(hq, hkv, nq, lens[b], d, &q, &cu, b, &cache, (&kf, &vf));
                for h in 0..hq {
                    for i in 0..nq {
                        let tk = cu[b] + i;
                        for e in 0..d {
                            let at = ql.index(0, h, tk, e);
                            let tol = bound.0[(h * nq + i) * d + e];
                            assert!(
                                close(got.0[at], want.0[at], tol),
                                "{t} {isa} step {step} seq {b} o[{h},{i},{e}] = {}, want {} \
                                 (tol {tol:e})",
                                got.0[at],
                                want.0[at]
                            );
                        }
                        let tol = bound.1[h * nq + i];
                        assert!(
                            close(got.1[h * total + tk], want.1[h * total + tk], tol),
                            "{t} {isa} step {step} seq {b} lse[{h},{i}]"
                        );
                    }
                }
            }
        }
    }
}

/// Checks that slot `j` of sequence `b`, head `h`, of `pool` holds `row` stored in type `t`:
/// exactly for f32, rounded to nearest for bf16/f16, `quantize_q8`'s values and scales for
/// int8.
#[allow(clippy::too_many_arguments)]
fn expect_stored(
    pool: &PagePool<'_>,
    cache: &PagedKv<'_>,
    b: usize,
    j: usize,
    h: usize,
    row: &[f32],
    t: DType,
    step: usize,
) {
    let d = row.len();
    let at = cache.slot(b, j, h, d);
    let what = format!("{t} step {step} seq {b} slot {j} head {h}");
    match *pool {
        PagePool::F32(x) => assert_eq!(bits(&x[at..at + d]), bits(row), "{what}"),
        PagePool::BF16(x) => {
            let want: Vec<u16> = row.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
            let got: Vec<u16> = x[at..at + d].iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{what}");
        }
        PagePool::F16(x) => {
            let want: Vec<u16> = row.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
            let got: Vec<u16> = x[at..at + d].iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{what}");
        }
        PagePool::Q8 { values, scales } => {
            let nb = d.div_ceil(32);
            let (mut q, mut sc) = (vec![0i8; d], vec![0.0f32; nb]);
            let src = TensorRef::new(row, Tensor4Layout::bhsd(1, 1, 1, d));
            quantize_q8(src, Q8Mut::bhsd(&mut q, &mut sc, 1, 1, 1, d)).unwrap();
            assert_eq!(&values[at..at + d], &q[..], "{what}");
            let sat = cache.slot(b, j, h, nb);
            assert_eq!(bits(&scales[sat..sat + nb]), bits(&sc), "{what}");
        }
    }
}

/// The attention bounds of sequence `b`'s queries against its cache: a `Case` of the same
/// shape whose operands are replaced by the gathered ones, so its bounds are those of this
/// computation.
#[allow(clippy::too_many_arguments)]
fn step_bound(
    hq: usize,
    hkv: usize,
    nq: usize,
    nk: usize,
    d: usize,
    q: &[f32],
    cu: &[usize],
    b: usize,
    cache: &PagedKv<'_>,
    (kf, vf): (&[f32], &[f32]),
) -> (Vec<f64>, Vec<f64>) {
    let mut c = Case::new(1, 1, hkv, hq / hkv, nq, nk, d, d, true, 0, MaskKind::Causal(None), 2.0);
    c.scale = 0.25;
    let ql = packed(hq, cu[cu.len() - 1], d);
    for h in 0..hq {
        for i in 0..nq {
            for e in 0..d {
                c.q.0[c.q.1.index(0, h, i, e)] = q[ql.index(0, h, cu[b] + i, e)];
            }
        }
    }
    for h in 0..hkv {
        for j in 0..nk {
            let s = cache.slot(b, j, h, d);
            for e in 0..d {
                c.k.0[c.k.1.index(0, h, j, e)] = kf[s + e];
                c.v.0[c.v.1.index(0, h, j, e)] = vf[s + e];
            }
        }
    }
    c.bounds()
}
