//! Paged decode: one query per sequence for 32 sequences of a fixed mix of lengths (1..8192),
//! 16 query heads over 2 K/V heads (GQA), d = 128, their K/V in a paged pool (shuffled pages
//! of 16 and of 128 slots) read in place by `PagedAttention`. Bandwidth-bound, so the figure
//! is GB/s of the K/V bytes read (`DType::row_bytes`: values, plus the scales of int8).
//!
//! Beside it, in alternating calls, the same K/V bytes stored dense (each sequence's keys
//! contiguous, `[len, kv_heads, d]`) run by the existing decode path, one `Attention` call per
//! sequence (`dense` in the ratios): the same kernel body on the same values, only the storage
//! differs, and a per-sequence call is how an engine without a paged kernel runs its batch
//! (a batch padded to the longest sequence would read 4× the bytes of this mix and flatter the
//! paged call). Target: paged ≥ 0.9× of dense. With several threads the dense calls each
//! split their own keys, while the paged call shares all sequences' chunks in one loop.
//!
//! Each page type is a pair of rows: f32 (`attn-kernels` beside `dense`), bf16
//! (`attn-kernels-bf16` beside `dense-bf16`) and int8 with f32 block scales
//! (`attn-kernels-q8` beside `dense-q8`: `PagePool::Q8` against `KvRef::Q8` on the same bytes).
//!
//! Chunked prefill: 4 sequences of 512..2048 cached keys plus 128 new queries each (their
//! keys the last 128 of the sequence, causal), f32 pages of 16 and 128: `PagedAttention` runs
//! them on the flash path reading the pages, beside dense flash attention (`Path::Auto`) per
//! sequence on the same values (`prefill` / `dense-prefill`), in GFLOP/s of the causal work.
//!
//! Checks: both rows of each type on a small mix (lengths 0, 1 and across pages) against the
//! reference's paged attention on the values the stored elements represent (widened, or
//! `fl(q·scale)`), each sequence within the bound of its dense problem on those values.

use std::ops::Range;

use attn_kernels::attention::{Attention, Path};
use attn_kernels::batch::{packed_seq, PagePool, PagedAttention, PagedKv};
use attn_kernels::{bf16, quantize_q8, DType, KvRef, Parallelism, Q8Mut, Q8Ref};
use attn_reference::attention::default_scale;
use attn_reference::quant::q8_blocks;
use attn_reference::{Mask, Tensor4Layout, TensorMut, TensorRef};

use super::{Call, Ctx, Work};
use crate::check::{attention_bound, compare, Rng, Verdict};
use crate::record::Shape;

const OP: &str = "paged";

/// Cached keys of the prefill sequences (each then gets [`PREFILL_Q`] new queries and keys),
/// and a smaller mix for `--quick`.
const PREFILL: [usize; 4] = [512, 2048, 1024, 1536];
const PREFILL_QUICK: [usize; 2] = [256, 512];
/// New queries per prefill sequence.
const PREFILL_Q: usize = 128;

/// Key lengths of the 32 sequences (one query each), and a smaller mix for `--quick`.
const MIX: [usize; 32] = [
    1, 8192, 17, 4096, 300, 2048, 64, 1000, 5000, 128, 7000, 33, 2500, 512, 6000, 250, 3000, 16,
    1500, 8000, 700, 90, 3500, 200, 4500, 1024, 2, 6500, 400, 2200, 800, 5500,
];
const MIX_QUICK: [usize; 8] = [1, 1024, 17, 300, 64, 700, 2, 128];

/// `[total, heads, d]` storage as a packed view.
fn packed(heads: usize, total: usize, d: usize) -> Tensor4Layout {
    Tensor4Layout::strided([1, heads, total, d], [0, d, heads * d, 1], 0)
}

fn cumulative(lens: &[usize]) -> Vec<usize> {
    let mut cu = vec![0];
    for &n in lens {
        cu.push(cu[cu.len() - 1] + n);
    }
    cu
}

/// An element type of the pages (and of the dense K/V beside them): f32, bf16, or int8 with one
/// f32 scale per block of 32 values along `d` (`Scales` holds them; empty for the others).
trait Elem: Copy + Default {
    /// The element type.
    const DTYPE: DType;
    /// The names of its rows: the paged call and the dense one.
    const IMPS: [&'static str; 2];
    /// Rows of `d` values stored: the elements, and their scales (int8 only).
    fn store(x: &[f32], d: usize) -> Stored<Self>;
    /// The value element `i` represents (rows of `d`), as the kernels compute on it.
    fn value(s: &Stored<Self>, i: usize, d: usize) -> f32;
    /// A pool of pages of these elements.
    fn pool(s: &Stored<Self>) -> PagePool<'_>;
    /// A dense K/V view: `values`, and `scales` (int8 only).
    fn kv<'a>(values: TensorRef<'a, Self>, scales: TensorRef<'a, f32>) -> KvRef<'a>;
}

/// Scales per token row of `d` values: `⌈d/32⌉` for int8, none for the float types.
fn scale_width<T: Elem>(d: usize) -> usize {
    if T::DTYPE == DType::Q8 {
        q8_blocks(d)
    } else {
        0
    }
}

/// Elements in one storage type, and their int8 block scales (empty for the float types).
struct Stored<T> {
    values: Vec<T>,
    scales: Vec<f32>,
}

impl<T: Elem> Stored<T> {
    /// The K/V view of `tokens` of dense rows laid out as `values` (and `scales`, int8 only).
    fn tokens(
        &self,
        values: &Tensor4Layout,
        scales: &Tensor4Layout,
        tokens: Range<usize>,
    ) -> KvRef<'_> {
        T::kv(
            TensorRef::new(&self.values, packed_seq(values, tokens.clone())),
            TensorRef::new(&self.scales, packed_seq(scales, tokens)),
        )
    }
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    const IMPS: [&'static str; 2] = ["attn-kernels", "dense"];
    fn store(x: &[f32], _: usize) -> Stored<f32> {
        Stored { values: x.to_vec(), scales: Vec::new() }
    }
    fn value(s: &Stored<f32>, i: usize, _: usize) -> f32 {
        s.values[i]
    }
    fn pool(s: &Stored<f32>) -> PagePool<'_> {
        PagePool::F32(&s.values)
    }
    fn kv<'a>(values: TensorRef<'a, f32>, _: TensorRef<'a, f32>) -> KvRef<'a> {
        values.into()
    }
}

impl Elem for bf16 {
    const DTYPE: DType = DType::BF16;
    const IMPS: [&'static str; 2] = ["attn-kernels-bf16", "dense-bf16"];
    fn store(x: &[f32], _: usize) -> Stored<bf16> {
        Stored { values: x.iter().map(|&v| bf16::from_f32(v)).collect(), scales: Vec::new() }
    }
    fn value(s: &Stored<bf16>, i: usize, _: usize) -> f32 {
        s.values[i].to_f32()
    }
    fn pool(s: &Stored<bf16>) -> PagePool<'_> {
        PagePool::BF16(&s.values)
    }
    fn kv<'a>(values: TensorRef<'a, bf16>, _: TensorRef<'a, f32>) -> KvRef<'a> {
        values.into()
    }
}

impl Elem for i8 {
    const DTYPE: DType = DType::Q8;
    const IMPS: [&'static str; 2] = ["attn-kernels-q8", "dense-q8"];
    fn store(x: &[f32], d: usize) -> Stored<i8> {
        let rows = x.len() / d;
        let mut s = Stored { values: vec![0; x.len()], scales: vec![0.0; rows * q8_blocks(d)] };
        let dst = Q8Mut::bhsd(&mut s.values, &mut s.scales, 1, 1, rows, d);
        quantize_q8(TensorRef::new(x, Tensor4Layout::bhsd(1, 1, rows, d)), dst)
            .expect("finite inputs quantise");
        s
    }
    fn value(s: &Stored<i8>, i: usize, d: usize) -> f32 {
        f32::from(s.values[i]) * s.scales[(i / d) * q8_blocks(d) + (i % d) / 32]
    }
    fn pool(s: &Stored<i8>) -> PagePool<'_> {
        PagePool::Q8 { values: &s.values, scales: &s.scales }
    }
    fn kv<'a>(values: TensorRef<'a, i8>, scales: TensorRef<'a, f32>) -> KvRef<'a> {
        Q8Ref::new(values, scales).into()
    }
}

/// One step of a batch: the dense K/V (sequences packed `[total, hkv, d]`), the same elements
/// in a paged pool with shuffled pages, and `nq` queries per sequence (its last `nq` keys'
/// positions: one for decode, a chunk for prefill).
struct Batch<T> {
    lens: Vec<usize>,
    nq: usize,
    cu_k: Vec<usize>,
    cu_q: Vec<usize>,
    hq: usize,
    hkv: usize,
    d: usize,
    q: Vec<f32>,
    k: Stored<T>,
    v: Stored<T>,
    page_size: usize,
    pages: usize,
    pool_k: Stored<T>,
    pool_v: Stored<T>,
    table: Vec<u32>,
    max_pages: usize,
}

impl<T: Elem> Batch<T> {
    /// `lens[b]` keys for sequence `b` (at least `nq` where it has queries: every sequence has
    /// `nq`), `hq` query heads over `hkv` K/V heads of width `d`.
    #[allow(clippy::too_many_arguments)]
    fn new(
        lens: &[usize],
        nq: usize,
        hq: usize,
        hkv: usize,
        d: usize,
        page_size: usize,
        seed: u64,
    ) -> Self {
        let cu_k = cumulative(lens);
        let total = cu_k[lens.len()];
        let mut rng = Rng::new(seed);
        let (q, k, v) =
            (rng.vec(lens.len() * nq * hq * d), rng.vec(total * hkv * d), rng.vec(total * hkv * d));
        let need: Vec<usize> = lens.iter().map(|n| n.div_ceil(page_size)).collect();
        let max_pages = need.iter().copied().max().unwrap_or(0).max(1);
        let pages: usize = need.iter().sum();
        // A shuffled pool: page p of sequence b is a random free page.
        let mut order: Vec<u32> = (0..pages as u32).collect();
        for i in (1..order.len()).rev() {
            let j = (rng.vec(1)[0].abs() * (i + 1) as f32) as usize;
            order.swap(i, j.min(i));
        }
        let mut table = vec![0u32; lens.len() * max_pages];
        let mut next = order.into_iter();
        for (b, &n) in need.iter().enumerate() {
            for p in 0..n {
                table[b * max_pages + p] = next.next().unwrap_or(0);
            }
        }
        let empty = || Stored { values: Vec::new(), scales: Vec::new() };
        let mut batch = Batch {
            lens: lens.to_vec(),
            nq,
            cu_k,
            cu_q: (0..=lens.len()).map(|b| b * nq).collect(),
            hq,
            hkv,
            d,
            q,
            k: T::store(&k, d),
            v: T::store(&v, d),
            page_size,
            pages,
            pool_k: empty(),
            pool_v: empty(),
            table,
            max_pages,
        };
        batch.pool_k = batch.paginate(&batch.k);
        batch.pool_v = batch.paginate(&batch.v);
        batch
    }

    /// The pages of the dense `x` (values and scales), as the block table places them.
    fn paginate<E: Elem>(&self, x: &Stored<E>) -> Stored<E> {
        Stored {
            values: self.pages_of(&x.values, self.hkv * self.d),
            scales: self.pages_of(&x.scales, self.hkv * scale_width::<E>(self.d)),
        }
    }

    /// The pages of dense rows of `width` elements per token.
    fn pages_of<E: Copy + Default>(&self, x: &[E], width: usize) -> Vec<E> {
        let slot = self.page_size * width;
        let mut pool = vec![E::default(); self.pages * slot];
        for (b, &n) in self.lens.iter().enumerate() {
            for p in 0..n.div_ceil(self.page_size) {
                let rows = (n - p * self.page_size).min(self.page_size) * width;
                let src = (self.cu_k[b] + p * self.page_size) * width;
                let dst = self.table[b * self.max_pages + p] as usize * slot;
                pool[dst..dst + rows].copy_from_slice(&x[src..src + rows]);
            }
        }
        pool
    }

    fn cache<'a>(&'a self, k: PagePool<'a>, v: PagePool<'a>) -> PagedKv<'a> {
        PagedKv {
            k,
            v,
            page_size: self.page_size,
            kv_heads: self.hkv,
            dk: self.d,
            dv: self.d,
            block_table: &self.table,
            max_pages: self.max_pages,
            seq_lens: &self.lens,
        }
    }

    fn kv_bytes(&self) -> f64 {
        2.0 * (self.cu_k[self.lens.len()] * self.hkv * T::DTYPE.row_bytes(self.d)) as f64
    }

    /// Multiply-adds ×2 of the causal attention: each query sees the keys up to its own.
    fn flops(&self) -> f64 {
        let visible: usize = self
            .lens
            .iter()
            .map(|&n| (0..self.nq).map(|i| n - self.nq + i + 1).sum::<usize>())
            .sum();
        2.0 * (self.hq * 2 * self.d * visible) as f64
    }

    fn shape(&self) -> Shape {
        Shape::Attn {
            batch: self.lens.len(),
            heads: self.hq,
            kv_heads: self.hkv,
            nq: self.nq,
            nk: self.cu_k[self.lens.len()],
            dk: self.d,
            dv: self.d,
            mask: if self.page_size == 16 { "paged 16" } else { "paged 128" },
        }
    }

    fn q_layout(&self) -> Tensor4Layout {
        packed(self.hq, self.lens.len() * self.nq, self.d)
    }

    fn paged(&self, o: &mut [f32], threads: usize) -> attn_kernels::Result<()> {
        let cache = self.cache(T::pool(&self.pool_k), T::pool(&self.pool_v));
        PagedAttention::new(TensorRef::new(&self.q, self.q_layout()), &self.cu_q, cache)
            .mask(Mask::CAUSAL)
            .parallelism(Parallelism::threads(threads))
            .run(TensorMut::new(o, self.q_layout()))
    }

    /// One `Attention` call per sequence over its dense K/V: the decode path for one query,
    /// the dispatcher's choice (flash for a prefill chunk) otherwise.
    fn dense(&self, o: &mut [f32], threads: usize) -> attn_kernels::Result<()> {
        let total = self.cu_k[self.lens.len()];
        let (ql, kl) = (self.q_layout(), packed(self.hkv, total, self.d));
        let sl = packed(self.hkv, total, scale_width::<T>(self.d));
        let path = if self.nq == 1 { Path::Decode } else { Path::Auto };
        for b in 0..self.lens.len() {
            let (kv, qs) = (self.cu_k[b]..self.cu_k[b + 1], self.cu_q[b]..self.cu_q[b + 1]);
            Attention::new(
                TensorRef::new(&self.q, packed_seq(&ql, qs.clone())),
                self.k.tokens(&kl, &sl, kv.clone()),
                self.v.tokens(&kl, &sl, kv),
            )
            .mask(Mask::CAUSAL)
            .path(path)
            .parallelism(Parallelism::threads(threads))
            .run(TensorMut::new(&mut *o, packed_seq(&ql, qs)))?;
        }
        Ok(())
    }

    /// The values the dense K or V elements represent, as f32.
    fn exact(&self, x: &Stored<T>) -> Stored<f32> {
        let values = (0..x.values.len()).map(|i| T::value(x, i, self.d)).collect();
        Stored { values, scales: Vec::new() }
    }
}

/// Checks both rows of type `T` (the paged call and the dense calls) against the reference's
/// paged attention on a small mix (lengths 0, 1 and across pages), run on the values the
/// stored elements represent; each sequence within the bound of its dense problem on them.
fn check<T: Elem>(ctx: &mut Ctx) {
    let p = Batch::<T>::new(&[37, 0, 1, 300, 16, 129], 1, 8, 2, 64, 16, 0x9a6e);
    check_batch(ctx, &p, T::IMPS);
}

/// Checks the prefill rows (f32 pages, 40 new queries per sequence: the flash path).
fn check_prefill(ctx: &mut Ctx) {
    let p = Batch::<f32>::new(&[40, 300, 57], 40, 8, 2, 64, 16, 0x9a6f);
    check_batch(ctx, &p, PREFILL_IMPS);
}

/// The row names of the prefill pair.
const PREFILL_IMPS: [&str; 2] = ["attn-kernels-prefill", "dense-prefill"];

/// Checks the paged call and the dense calls on `p` (rows `imps`) against the reference's
/// paged attention on the values the stored elements represent, each sequence within the bound
/// of its dense problem on them.
fn check_batch<T: Elem>(ctx: &mut Ctx, p: &Batch<T>, imps: [&'static str; 2]) {
    let (sh, ql, scale) = (p.shape(), p.q_layout(), default_scale(p.d));
    let (k, v) = (p.exact(&p.k), p.exact(&p.v));
    let (pool_k, pool_v) = (p.paginate(&k), p.paginate(&v));
    let mut want = vec![0.0f32; p.q.len()];
    let reference = attn_reference::batch::attention_paged(
        TensorRef::new(&p.q, ql),
        &p.cu_q,
        &p.cache(PagePool::F32(&pool_k.values), PagePool::F32(&pool_v.values)),
        scale,
        &Mask::CAUSAL,
        &attn_reference::attention::Variants::NONE,
        TensorMut::new(&mut want, ql),
        None,
    );
    if let Err(e) = reference {
        ctx.check(OP, "reference", sh, 1, Err(e.to_string()));
        return;
    }
    // Per sequence: the bound of its dense problem (weights from |V|), at its packed rows.
    let kl = packed(p.hkv, p.cu_k[p.lens.len()], p.d);
    let abs_v: Vec<f32> = v.values.iter().map(|x| x.abs()).collect();
    let mut bound = vec![0.0f64; p.q.len()];
    for b in 0..p.lens.len() {
        let qs = packed_seq(&ql, p.cu_q[b]..p.cu_q[b + 1]);
        let ks = packed_seq(&kl, p.cu_k[b]..p.cu_k[b + 1]);
        let dense = Tensor4Layout::bhsd(1, p.hq, p.nq, p.d);
        let mut w = vec![0.0f32; p.hq * p.nq * p.d];
        let (q, k) = (TensorRef::new(&p.q, qs), TensorRef::new(&k.values, ks));
        let r = attn_reference::attention::attention(
            q,
            k,
            TensorRef::new(&abs_v, ks),
            scale,
            &Mask::CAUSAL,
            TensorMut::new(&mut w, dense),
            None,
        );
        if let Err(e) = r {
            ctx.check(OP, "reference", sh, 1, Err(e.to_string()));
            return;
        }
        let bb = attention_bound(&q, &k, scale, &TensorRef::new(&w, dense));
        for h in 0..p.hq {
            for i in 0..p.nq {
                for e in 0..p.d {
                    bound[qs.index(0, h, i, e)] = bb[dense.index(0, h, i, e)];
                }
            }
        }
    }
    for &t in &ctx.threads.clone() {
        for (imp, dense) in imps.into_iter().zip([false, true]) {
            let mut got = vec![f32::NAN; p.q.len()];
            let r = if dense { p.dense(&mut got, t) } else { p.paged(&mut got, t) };
            let verdict: Result<Verdict, String> =
                r.map(|()| compare(&got, &want, &bound)).map_err(|e| e.to_string());
            ctx.check(OP, imp, sh.clone(), t, verdict);
        }
    }
}

/// Times the rows of type `T`: the paged call beside the dense calls on the same bytes, in
/// alternating calls, for each page size and thread count.
fn bench<T: Elem>(ctx: &mut Ctx) {
    let threads = ctx.threads.clone();
    let mix: &[usize] = if ctx.quick { &MIX_QUICK } else { &MIX };
    let [paged, dense] = T::IMPS;
    for page_size in [16, 128] {
        let p = Batch::<T>::new(mix, 1, 16, 2, 128, page_size, 0x7a6e);
        ctx.progress.log(&format!(
            "{OP}: {} sequences, {:.0} MiB of {} K/V, pages of {page_size}",
            mix.len(),
            p.kv_bytes() / (1u64 << 20) as f64,
            T::DTYPE,
        ));
        let work = Work::Bytes(p.kv_bytes());
        let (mut o1, mut o2) = (vec![0.0f32; p.q.len()], vec![0.0f32; p.q.len()]);
        for &t in &threads {
            let mut ours = || p.paged(&mut o1, t).map_err(|e| e.to_string());
            let mut plain = || p.dense(&mut o2, t).map_err(|e| e.to_string());
            let imps: &mut [(&'static str, Call<'_>)] =
                &mut [(paged, &mut ours), (dense, &mut plain)];
            ctx.bench_alternating(OP, p.shape(), t, work, None, imps);
        }
    }
}

/// Times the prefill pair: the paged call (flash path) beside dense flash per sequence, in
/// alternating calls, for each page size and thread count.
fn bench_prefill(ctx: &mut Ctx) {
    let threads = ctx.threads.clone();
    let cached: &[usize] = if ctx.quick { &PREFILL_QUICK } else { &PREFILL };
    let lens: Vec<usize> = cached.iter().map(|n| n + PREFILL_Q).collect();
    let [paged, dense] = PREFILL_IMPS;
    for page_size in [16, 128] {
        let p = Batch::<f32>::new(&lens, PREFILL_Q, 16, 2, 128, page_size, 0x7a70);
        ctx.progress.log(&format!(
            "{OP}: prefill of {PREFILL_Q} queries into {} sequences, pages of {page_size}",
            lens.len()
        ));
        let work = Work::Flops(p.flops());
        let (mut o1, mut o2) = (vec![0.0f32; p.q.len()], vec![0.0f32; p.q.len()]);
        for &t in &threads {
            let mut ours = || p.paged(&mut o1, t).map_err(|e| e.to_string());
            let mut plain = || p.dense(&mut o2, t).map_err(|e| e.to_string());
            let imps: &mut [(&'static str, Call<'_>)] =
                &mut [(paged, &mut ours), (dense, &mut plain)];
            ctx.bench_alternating(OP, p.shape(), t, work, None, imps);
        }
    }
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    check::<f32>(ctx);
    check::<bf16>(ctx);
    check::<i8>(ctx);
    check_prefill(ctx);
    bench::<f32>(ctx);
    bench::<bf16>(ctx);
    bench::<i8>(ctx);
    bench_prefill(ctx);
}
