//! Paged decode: one query per sequence for 32 sequences of a fixed mix of lengths (1..8192),
//! 16 query heads over 2 K/V heads (GQA), d = 128, their K/V in a paged pool (shuffled pages
//! of 16 and of 128 slots) read in place by `PagedAttention`. Bandwidth-bound, so the figure
//! is GB/s of K/V.
//!
//! Beside it, in alternating calls, the same K/V bytes stored dense (each sequence's keys
//! contiguous, `[len, kv_heads, d]`) run by the existing decode path, one `Attention` call per
//! sequence (`dense` in the ratios): the same kernel body on the same values, only the storage
//! differs, and a per-sequence call is how an engine without a paged kernel runs its batch
//! (a batch padded to the longest sequence would read 4× the bytes of this mix and flatter the
//! paged call). Target: paged ≥ 0.9× of dense. With several threads the dense calls each
//! split their own keys, while the paged call shares all sequences' chunks in one loop.

use attn_kernels::attention::{Attention, Path};
use attn_kernels::batch::{packed_seq, PagePool, PagedAttention, PagedKv};
use attn_kernels::Parallelism;
use attn_reference::attention::default_scale;
use attn_reference::{Mask, Tensor4Layout, TensorMut, TensorRef};

use super::{Call, Ctx, Work};
use crate::check::{attention_bound, compare, Rng, Verdict};
use crate::record::Shape;

const OP: &str = "paged";

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

/// One decode step of a batch: the dense K/V (sequences packed `[total, hkv, d]`), the same
/// rows in a paged pool with shuffled pages, and one query per sequence.
struct Batch {
    lens: Vec<usize>,
    cu_k: Vec<usize>,
    cu_q: Vec<usize>,
    hq: usize,
    hkv: usize,
    d: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    page_size: usize,
    pool_k: Vec<f32>,
    pool_v: Vec<f32>,
    table: Vec<u32>,
    max_pages: usize,
}

impl Batch {
    fn new(lens: &[usize], hq: usize, hkv: usize, d: usize, page_size: usize, seed: u64) -> Batch {
        let cu_k = cumulative(lens);
        let total = cu_k[lens.len()];
        let mut rng = Rng::new(seed);
        let (q, k, v) =
            (rng.vec(lens.len() * hq * d), rng.vec(total * hkv * d), rng.vec(total * hkv * d));
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
        let slot = page_size * hkv * d;
        let (mut pool_k, mut pool_v) = (vec![0.0f32; pages * slot], vec![0.0f32; pages * slot]);
        for (b, &n) in need.iter().enumerate() {
            for p in 0..n {
                let page = next.next().unwrap_or(0);
                table[b * max_pages + p] = page;
                let rows = (lens[b] - p * page_size).min(page_size) * hkv * d;
                let src = (cu_k[b] + p * page_size) * hkv * d;
                let dst = page as usize * slot;
                pool_k[dst..dst + rows].copy_from_slice(&k[src..src + rows]);
                pool_v[dst..dst + rows].copy_from_slice(&v[src..src + rows]);
            }
        }
        let cu_q = (0..=lens.len()).collect();
        Batch {
            lens: lens.to_vec(),
            cu_k,
            cu_q,
            hq,
            hkv,
            d,
            q,
            k,
            v,
            page_size,
            pool_k,
            pool_v,
            table,
            max_pages,
        }
    }

    fn cache(&self) -> PagedKv<'_> {
        PagedKv {
            k: PagePool::F32(&self.pool_k),
            v: PagePool::F32(&self.pool_v),
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
        2.0 * (self.cu_k[self.lens.len()] * self.hkv * self.d * 4) as f64
    }

    fn shape(&self) -> Shape {
        Shape::Attn {
            batch: self.lens.len(),
            heads: self.hq,
            kv_heads: self.hkv,
            nq: 1,
            nk: self.cu_k[self.lens.len()],
            dk: self.d,
            dv: self.d,
            mask: if self.page_size == 16 { "paged 16" } else { "paged 128" },
        }
    }

    fn q_layout(&self) -> Tensor4Layout {
        packed(self.hq, self.lens.len(), self.d)
    }

    fn paged(&self, o: &mut [f32], threads: usize) -> attn_kernels::Result<()> {
        PagedAttention::new(TensorRef::new(&self.q, self.q_layout()), &self.cu_q, self.cache())
            .mask(Mask::CAUSAL)
            .parallelism(Parallelism::threads(threads))
            .run(TensorMut::new(o, self.q_layout()))
    }

    /// The existing decode path, one call per sequence over its dense K/V.
    fn dense(&self, o: &mut [f32], threads: usize) -> attn_kernels::Result<()> {
        let (ql, kl) = (self.q_layout(), packed(self.hkv, self.cu_k[self.lens.len()], self.d));
        for b in 0..self.lens.len() {
            let kv = self.cu_k[b]..self.cu_k[b + 1];
            Attention::new(
                TensorRef::new(&self.q, packed_seq(&ql, b..b + 1)),
                TensorRef::new(&self.k, packed_seq(&kl, kv.clone())),
                TensorRef::new(&self.v, packed_seq(&kl, kv)),
            )
            .mask(Mask::CAUSAL)
            .path(Path::Decode)
            .parallelism(Parallelism::threads(threads))
            .run(TensorMut::new(&mut *o, packed_seq(&ql, b..b + 1)))?;
        }
        Ok(())
    }
}

/// Checks the paged call against the reference's paged attention on a small mix (lengths 0, 1
/// and across pages), each sequence within the bound of its dense problem.
fn check(ctx: &mut Ctx) {
    let p = Batch::new(&[37, 0, 1, 300, 16, 129], 8, 2, 64, 16, 0x9a6e);
    let (sh, ql, scale) = (p.shape(), p.q_layout(), default_scale(p.d));
    let mut want = vec![0.0f32; p.q.len()];
    let reference = attn_reference::batch::attention_paged(
        TensorRef::new(&p.q, ql),
        &p.cu_q,
        &p.cache(),
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
    let abs_v: Vec<f32> = p.v.iter().map(|x| x.abs()).collect();
    let mut bound = vec![0.0f64; p.q.len()];
    for b in 0..p.lens.len() {
        let (qs, ks) = (packed_seq(&ql, b..b + 1), packed_seq(&kl, p.cu_k[b]..p.cu_k[b + 1]));
        let dense = Tensor4Layout::bhsd(1, p.hq, 1, p.d);
        let mut w = vec![0.0f32; p.hq * p.d];
        let (q, k) = (TensorRef::new(&p.q, qs), TensorRef::new(&p.k, ks));
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
            for e in 0..p.d {
                bound[qs.index(0, h, 0, e)] = bb[dense.index(0, h, 0, e)];
            }
        }
    }
    for &t in &ctx.threads.clone() {
        let mut got = vec![f32::NAN; p.q.len()];
        let verdict: Result<Verdict, String> =
            p.paged(&mut got, t).map(|()| compare(&got, &want, &bound)).map_err(|e| e.to_string());
        ctx.check(OP, "attn-kernels", sh.clone(), t, verdict);
    }
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    check(ctx);
    let threads = ctx.threads.clone();
    let mix: &[usize] = if ctx.quick { &MIX_QUICK } else { &MIX };
    for page_size in [16, 128] {
        let p = Batch::new(mix, 16, 2, 128, page_size, 0x7a6e);
        ctx.progress.log(&format!(
            "{OP}: {} sequences, {:.0} MiB of K/V, pages of {page_size}",
            mix.len(),
            p.kv_bytes() / (1u64 << 20) as f64
        ));
        let work = Work::Bytes(p.kv_bytes());
        let (mut o1, mut o2) = (vec![0.0f32; p.q.len()], vec![0.0f32; p.q.len()]);
        for &t in &threads {
            let mut ours = || p.paged(&mut o1, t).map_err(|e| e.to_string());
            let mut dense = || p.dense(&mut o2, t).map_err(|e| e.to_string());
            let imps: &mut [(&'static str, Call<'_>)] =
                &mut [("attn-kernels", &mut ours), ("dense", &mut dense)];
            ctx.bench_alternating(OP, p.shape(), t, work, None, imps);
        }
    }
}
