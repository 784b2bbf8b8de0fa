//! The decode path (flash-decoding): few queries, many keys.
//!
//! For each `(batch, K/V head)` the rows are every query of every query head of the GQA group
//! (`group · nq` rows share the same keys, so each key/value row is read once for all of
//! them). The keys are split into chunks; each `(batch, K/V head, chunk)` task runs the online
//! softmax over its chunk in blocks of `DECODE_BC` keys and returns its unnormalised partial
//! state `(m, l, O)`. The partials of a head are then merged by their logsumexp:
//! `M = max_c m_c`, `L = Σ_c e^(m_c − M)·l_c`, `O = Σ_c e^(m_c − M)·O_c / L`.
//!
//! The work is bandwidth-bound (each K/V element feeds `group · nq` FMAs), so the block loop
//! is built to stream: the score pass (`decode_qk_block`) runs register tiles of up to 4 rows ×
//! 2–4 keys with vectors along the head dimension, finished by a transposed reduction, and
//! prefetches the key rows ahead (except where one row's tiles stream a dense K in address
//! order) and the block's value rows (except where one row's tiles over bf16/f16 keys, with the
//! query row in registers, leave dense V to the hardware prefetcher too); the P·V pass
//! (`decode_pv_block`) runs tiles of up to 4 rows × 2–8 value vectors, so each K/V vector is
//! loaded once for all rows. A block is small (16 keys) so its K and V rows are still in L1
//! when the second pass reads them.
//!
//! With [`HalfPath::Dot`](crate::gemm::HalfPath) (bf16 Q, K and V, even `dk`) the score pass
//! reads the key rows as bf16 pairs ([`Pairs`]) against query rows of pairs, one `vdpbf16ps`
//! per 32 elements instead of a widening and two FMAs, and the scale multiplies the scores;
//! `P·V` stays as above.
//!
//! Where the blocks come from is a [`Source`]: the problem's own K/V views, or the pages of a
//! paged cache ([`run_paged`]: each piece of a paged batch is a problem of one sequence). Both
//! give a matrix per `(batch, K/V head)` in its storage type and a [`RowMap`] from a
//! sequence's key index to the matrix row: the identity for a view; for a pool (whose rows are
//! all its slots, page after page) slot `j mod page_size` of page `table[j / page_size]`. A
//! block of 16 keys, 16-aligned, lies in one page, so its rows are consecutive rows of the pool
//! matrix; the key rows prefetched ahead are mapped the same way. The same kernels then read
//! the blocks in place (one storage type for K and V) or gather them into f32 (two types, or
//! strided columns), whichever the source.
//!
//! The split into chunks depends on the visible key range only ([`split`]: all `nk` keys, or
//! those a window or causal mask leaves to the queries), and the merge visits the chunks in
//! order, so the result is bitwise identical whatever the thread count (threads only decide
//! which chunks run where).

use std::ops::Range;

use rayon::prelude::*;

use attn_core::batch::{packed_seq, PagePool, PagedKv};
use attn_core::quant::q8_blocks;
use attn_core::{AnyMut, AnyRef, Element, Mask, Result, TensorMut, Variants};

use super::blocking::{
    DECODE_BC, DECODE_MAX_CHUNKS, DECODE_MAX_Q, DECODE_MIN_CHUNK, DECODE_PREFETCH_KEYS,
};
use super::blocks::{
    axpy, decode_pv_block, decode_qk_block, exp_row, pos_inf_weights, row_max, KvAny, KvMat, Pairs,
    Q8Mat, Strided,
};
use super::sink::Sink;
use super::variants::softcap;
use super::{flash, zeros, Problem};
use crate::arch::{vectorize, vectorize_dot, Isa, Kernel, Simd};
use crate::gemm::ukernel::Kernel as GemmKernel;
use crate::math::exp::exp_rr2_p7_scalar;
use crate::par::Parallelism;

/// Unnormalised online-softmax state of one chunk: per row the running maximum of the
/// scores (`f32::MIN` when nothing was visible), the sum of `e^(s − m)` and the weighted sum
/// of values (`rows × dv`).
struct Partial {
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
}

/// Runs the decode path and writes `o` and `lse`. Fails only when a task's scratch cannot be
/// allocated (see [`Chunk`]); `o` and `lse` are then left untouched.
pub(super) fn run(
    isa: Isa,
    p: &Problem<'_>,
    o: AnyMut<'_>,
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    if p.batch.saturating_mul(p.hkv) == 0 || p.nq == 0 {
        return Ok(());
    }
    let partials = run_tasks(isa, &[(p, Dense)], par)?;
    let lse = lse.map(|out| LseOut { out, base: 0, head_stride: p.nq });
    merge(isa, p, &partials[0], o, lse)
}

/// One piece of a paged batch ([`run_paged`]): queries `rows` of the packed batch, all of
/// sequence `seq`, with the mask and the variants' offset (`off`, [`Variants::offset`]) that
/// give them their positions in that sequence.
pub(crate) struct PagedPiece<'a> {
    /// The sequence.
    pub seq: usize,
    /// Its queries in the packed batch.
    pub rows: Range<usize>,
    /// [`Mask::None`], or [`Mask::Causal`] with the offset of the piece's first query.
    pub mask: Mask<'a>,
    /// The offset the window and ALiBi measure from, for the piece's first query.
    pub off: isize,
}

/// A paged batch: each piece is a problem of one batch whose keys and values are read in
/// place from the pages of its sequence. Pieces of at most [`DECODE_MAX_Q`] queries run on the
/// decode path ([`Pages`]), all their chunk tasks in one parallel loop; longer ones (chunked
/// prefill) on the flash path ([`flash::Source::Pages`]), one after another. `q: [1, hq,
/// total_q, dk]`, `o: [1, hq, total_q, dv]` (each of any floating type) and `lse`
/// (`[hq, total_q]`) were checked against `cache` (already [`PagedKv::check`]ed) by the
/// caller; `hkv` divides `hq`, and `variants` were checked for `hq` heads. `dot`: the
/// `vdpbf16ps` kernel when the batch runs on it (checked: bf16 queries and pools, `avx512`).
/// Fails only when scratch cannot be allocated.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_paged(
    isa: Isa,
    q: AnyRef<'_>,
    cache: &PagedKv<'_>,
    pieces: &[PagedPiece<'_>],
    scale: f32,
    variants: Variants<'_>,
    dot: Option<&'static GemmKernel>,
    mut o: AnyMut<'_>,
    mut lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    let total_q = q.layout().dims[2];
    // The piece's problem (a fn, not a closure: its result borrows `pc`).
    fn problem<'p>(
        q: AnyRef<'p>,
        cache: &PagedKv<'_>,
        pc: &'p PagedPiece<'p>,
        (scale, variants, dot): (f32, Variants<'p>, Option<&'static GemmKernel>),
    ) -> Problem<'p> {
        let qv = q.with_layout(packed_seq(q.layout(), pc.rows.clone()));
        let (nk, hkv, dv) = (cache.seq_lens[pc.seq], cache.kv_heads, cache.dv);
        Problem::piece(qv, hkv, nk, dv, scale, &pc.mask, pc.off, variants, dot)
    }
    let how = (scale, variants, dot);
    let (short, long): (Vec<_>, Vec<_>) =
        pieces.iter().partition(|pc| pc.rows.len() <= DECODE_MAX_Q);
    for pc in long {
        let p = problem(q, cache, pc, how);
        let layout = packed_seq(o.layout(), pc.rows.clone());
        let l = lse.as_deref_mut().map(|out| &mut out[pc.rows.start..]);
        let sink = Sink::new_any(o.with_layout(layout), l).lse_head_stride(total_q);
        flash::run_from(isa, &p, &sink, par, flash::Source::Pages { cache, seq: pc.seq })?;
    }
    let problems: Vec<_> =
        short.iter().map(|pc| (problem(q, cache, pc, how), Pages { cache, seq: pc.seq })).collect();
    let jobs: Vec<_> = problems.iter().map(|(p, src)| (p, *src)).collect();
    let partials = run_tasks(isa, &jobs, par)?;
    for ((p, _), (pc, parts)) in problems.iter().zip(short.iter().zip(&partials)) {
        let layout = packed_seq(o.layout(), pc.rows.clone());
        let lse =
            lse.as_deref_mut().map(|out| LseOut { out, base: pc.rows.start, head_stride: total_q });
        merge(isa, p, parts, o.with_layout(layout), lse)?;
    }
    Ok(())
}

/// Where the keys and values of a problem's `(batch, K/V head)` come from: runs one chunk
/// with that source's blocks.
trait Source: Copy + Sync {
    /// What the first key of a split must be a multiple of: [`DECODE_BC`] for pages (so each
    /// block lies in one page), 1 otherwise. Keys before a window's left edge that the
    /// alignment adds are masked by the window like any other.
    const ALIGN: usize;
    fn chunk(self, isa: Isa, c: Chunk<'_, '_>) -> Result<Partial>;
}

/// The problem's own K/V views (any type and strides).
#[derive(Clone, Copy)]
struct Dense;

impl Source for Dense {
    const ALIGN: usize = 1;
    fn chunk(self, isa: Isa, c: Chunk<'_, '_>) -> Result<Partial> {
        let (keys, values) = (c.p.keys(c.b, c.kh), c.p.values(c.b, c.kh));
        chunk(isa, c, keys, values, RowMap::Dense)
    }
}

/// The pages of sequence `seq` of a checked paged cache, read in place in their type.
#[derive(Clone, Copy)]
struct Pages<'r, 'a> {
    cache: &'r PagedKv<'a>,
    seq: usize,
}

impl Source for Pages<'_, '_> {
    const ALIGN: usize = DECODE_BC;
    fn chunk(self, isa: Isa, c: Chunk<'_, '_>) -> Result<Partial> {
        let (keys, values, rows) = paged_head(self.cache, self.seq, c.kh);
        chunk(isa, c, keys, values, rows)
    }
}

/// K/V head `kh` of sequence `seq` of a checked paged cache: the key and value pool matrices
/// ([`pool_matrix`]) and the map from the sequence's key index to their rows.
pub(super) fn paged_head<'r>(
    cache: &'r PagedKv<'_>,
    seq: usize,
    kh: usize,
) -> (KvAny<'r>, KvAny<'r>, RowMap<'r>) {
    let pages = cache.seq_lens[seq].div_ceil(cache.page_size);
    let table = &cache.block_table[seq * cache.max_pages..][..pages];
    let keys = pool_matrix(cache.k, cache.kv_heads, kh, cache.dk);
    let values = pool_matrix(cache.v, cache.kv_heads, kh, cache.dv);
    (keys, values, RowMap::Paged { table, ps: cache.page_size })
}

/// Head `kh` of a pool of `hkv` heads of width `d` as a matrix whose row `r` is slot
/// `r mod page_size` of page `r / page_size` (every slot of the pool, page after page).
fn pool_matrix(pool: PagePool<'_>, hkv: usize, kh: usize, d: usize) -> KvAny<'_> {
    fn rows<T>(data: &[T], hkv: usize, kh: usize, d: usize) -> Strided<'_, T> {
        Strided { data, offset: kh * d, rs: hkv * d, cs: 1 }
    }
    match pool {
        PagePool::F32(x) => KvAny::F32(rows(x, hkv, kh, d)),
        PagePool::BF16(x) => KvAny::BF16(rows(x, hkv, kh, d)),
        PagePool::F16(x) => KvAny::F16(rows(x, hkv, kh, d)),
        PagePool::Q8 { values, scales } => KvAny::Q8(Q8Mat {
            v: rows(values, hkv, kh, d),
            sc: rows(scales, hkv, kh, q8_blocks(d)),
        }),
    }
}

/// Where key `j` of a problem's `(batch, K/V head)` is in its matrix: row `j` ([`Dense`]), or
/// slot `j mod ps` of page `table[j / ps]`, row `table[j / ps]·ps + j mod ps` of a pool matrix
/// ([`pool_matrix`]). Rows of one 16-aligned block of 16 stay consecutive (`ps` is a power of
/// two ≥ 16).
#[derive(Clone, Copy)]
pub(super) enum RowMap<'t> {
    Dense,
    Paged { table: &'t [u32], ps: usize },
}

impl RowMap<'_> {
    /// The row of key `j`, or `None` past the sequence's pages.
    #[inline(always)]
    fn row(self, j: usize) -> Option<usize> {
        match self {
            RowMap::Dense => Some(j),
            // The page is in the pool (checked), and the pool holds pages·ps rows: no overflow.
            RowMap::Paged { table, ps } => table.get(j / ps).map(|&p| p as usize * ps + j % ps),
        }
    }

    /// True when keys `j0..j0 + n` (`n ≥ 1`) sit in consecutive rows because they are in one
    /// page (or a view): a block that spans pages is not one run even when its first and last
    /// rows happen to be `n − 1` apart.
    #[inline(always)]
    pub(super) fn one_run(self, j0: usize, n: usize) -> bool {
        match self {
            RowMap::Dense => true,
            RowMap::Paged { ps, .. } => j0 / ps == (j0 + n - 1) / ps,
        }
    }

    /// The row of a key that a kernel reads: a block's first key, or any key of a block (the
    /// paired flash operands map each one). Such a key is within the sequence, so always mapped;
    /// past every row otherwise, which the tiles' bounds checks refuse.
    #[inline(always)]
    pub(super) fn read_row(self, j: usize) -> usize {
        let row = self.row(j);
        debug_assert!(row.is_some(), "key {j} past the sequence's pages");
        row.unwrap_or(usize::MAX / 2)
    }
}

/// The logsumexp output of a merge: row `(b, h, i)` goes to
/// `out[base + (b·hq + h)·head_stride + i]`.
struct LseOut<'r> {
    out: &'r mut [f32],
    base: usize,
    head_stride: usize,
}

/// Runs the chunk tasks of every problem (each with its K/V source) in one loop, in order,
/// and returns each problem's partials (`split` chunks of `batch·hkv` heads each,
/// chunk-major: the partial of head `bk`, chunk `c` at `c·heads + bk`). The heads of a chunk
/// run one after another: where the K/V heads interleave in memory (`[seq, kv_heads, d]`
/// caches, the pages of a pool) the lines one head's rows share with the next head's, or that
/// the hardware prefetcher brought in beside them, are then still in cache (head-major order
/// read them again from DRAM: 1.08–1.6× on Zen 4, perf journal 2026-12-05 23:20). The thread
/// count only picks who runs the chunks, never how the keys are split.
fn run_tasks<Src: Source>(
    isa: Isa,
    jobs: &[(&Problem<'_>, Src)],
    par: Parallelism,
) -> Result<Vec<Vec<Partial>>> {
    // Per problem: its first task, the keys any query may see (all of them but for a causal
    // mask or a window) and their split.
    let mut first = Vec::with_capacity(jobs.len() + 1);
    let mut plans = Vec::with_capacity(jobs.len());
    let mut tasks = 0usize;
    for (p, _) in jobs {
        first.push(tasks);
        let (k0, k1) = if p.nq == 0 {
            (0, 0)
        } else {
            let k0 = p.key_start(0) / Src::ALIGN * Src::ALIGN;
            (k0, p.key_end(p.nq - 1).max(k0))
        };
        let (chunks, chunk_len) = split(k1 - k0);
        // Rows (batch·hq·nq) are bounded by the output or lse slice (the caller returned
        // early when neither has an element), so this product is too; saturating all the same.
        let heads = if p.nq == 0 { 0 } else { p.batch.saturating_mul(p.hkv) };
        plans.push((k0, k1, chunk_len, heads));
        tasks = tasks.saturating_add(heads.saturating_mul(chunks));
    }
    first.push(tasks);
    let task = |t: usize| {
        let job = first.partition_point(|&f| f <= t) - 1;
        let ((p, src), (k0, k1, chunk_len, heads)) = (&jobs[job], plans[job]);
        let t = t - first[job];
        let (bk, c) = (t % heads, t / heads);
        let c0 = k0.saturating_add(c * chunk_len).min(k1);
        let c1 = c0.saturating_add(chunk_len).min(k1);
        src.chunk(isa, Chunk { p, b: bk / p.hkv, kh: bk % p.hkv, c0, c1 })
    };
    let mut all: Vec<Partial> = if par.count() == 1 || tasks == 1 {
        (0..tasks).map(task).collect::<Result<_>>()?
    } else {
        par.install(|| (0..tasks).into_par_iter().with_min_len(1).map(task).collect::<Result<_>>())?
    };
    let mut out = Vec::with_capacity(jobs.len());
    for w in first.windows(2).rev() {
        out.push(all.split_off(w[0]));
    }
    out.reverse();
    Ok(out)
}

/// Merges the partials of one problem (as [`run_tasks`] returns them) into `o` and `lse`.
fn merge(
    isa: Isa,
    p: &Problem<'_>,
    partials: &[Partial],
    o: AnyMut<'_>,
    lse: Option<LseOut<'_>>,
) -> Result<()> {
    let heads = if p.nq == 0 { 0 } else { p.batch * p.hkv };
    if heads == 0 {
        return Ok(());
    }
    let acc = zeros("v", Some(p.dv))?;
    match o {
        AnyMut::F32(o) => vectorize(isa, Merge { p, partials, heads, o, lse, acc }),
        AnyMut::BF16(o) => vectorize(isa, Merge { p, partials, heads, o, lse, acc }),
        AnyMut::F16(o) => vectorize(isa, Merge { p, partials, heads, o, lse, acc }),
    }
    Ok(())
}

/// The key split of every `(batch, K/V head)`: `(chunks, keys per chunk)`, a function of `nk`
/// only. Chunks are [`DECODE_MIN_CHUNK`] keys (a multiple of the block, so chunk boundaries
/// fall on block boundaries), longer once a head would have more than [`DECODE_MAX_CHUNKS`];
/// every chunk but the last is full.
fn split(nk: usize) -> (usize, usize) {
    let chunk_len =
        nk.div_ceil(DECODE_MAX_CHUNKS).next_multiple_of(DECODE_BC).max(DECODE_MIN_CHUNK);
    (nk.div_ceil(chunk_len).max(1), chunk_len)
}

/// Merges the chunks of each head by logsumexp and writes the normalised rows. Runs as a
/// [`Kernel`]: the weighted sums of the chunks' output rows are vector FMAs (`axpy`), where
/// `f32::mul_add` outside the ISA's code would be a call to the software `fmaf` per element,
/// which cost more than the chunking itself (the same bits either way: a fused multiply-add
/// is rounded once). Each output value is rounded once to the output type `T`.
struct Merge<'r, 'a, 'o, T> {
    p: &'r Problem<'a>,
    /// Chunk-major, as [`run_tasks`] returns them.
    partials: &'r [Partial],
    /// `batch·hkv`: the partials of head `bk` are every `heads`-th from index `bk`.
    heads: usize,
    o: TensorMut<'o, T>,
    lse: Option<LseOut<'r>>,
    /// One output row's weighted sum, `dv` floats.
    acc: Vec<f32>,
}

impl<T: Element> Kernel for Merge<'_, '_, '_, T> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let Merge { p, partials, heads, o, mut lse, mut acc } = self;
        let rows = p.group * p.nq;
        for bk in 0..heads {
            // The head's chunks, in key order.
            let parts = || partials[bk..].iter().step_by(heads);
            let (b, kh) = (bk / p.hkv, bk % p.hkv);
            for r in 0..rows {
                let (h, i) = (kh * p.group + r / p.nq, r % p.nq);
                let mx = parts().map(|c| c.m[r]).fold(f32::MIN, f32::max);
                let mut total = 0.0f32;
                acc.fill(0.0);
                for c in parts() {
                    // e^(m_c − M) in f64: two scalars per chunk, no need for the vector exp.
                    // Equal maxima weigh 1, also when both are +∞ (the +∞ keys share the
                    // weight).
                    let w = if c.m[r] == mx {
                        1.0
                    } else {
                        (f64::from(c.m[r]) - f64::from(mx)).exp() as f32
                    };
                    if w == 0.0 {
                        continue; // weight 0: contributes nothing, even an ∞ partial (0·∞)
                    }
                    total = w.mul_add(c.l[r], total);
                    axpy(s, w, &c.o[r * p.dv..(r + 1) * p.dv], &mut acc);
                }
                // NaN in any chunk must survive the merge (f32::max above skips NaN maxima).
                if parts().any(|c| c.l[r].is_nan()) {
                    total = f32::NAN;
                }
                let (inv, row_lse) = p.finish(h, mx, total, lse.is_some());
                for (d, a) in acc.iter().enumerate() {
                    let idx = o.layout.index(b, h, i, d);
                    o.data[idx] = T::from_f32(a * inv);
                }
                if let Some(l) = lse.as_mut() {
                    l.out[l.base + (b * p.hq + h) * l.head_stride + i] = row_lse;
                }
            }
        }
    }
}

/// One task: keys `c0..c1` of K/V head `kh` of batch `b`, for all rows of the group. Its
/// scratch grows with `dk` and `dv`, which a zero-stride operand can make huge: allocated
/// fallibly, so such a call fails with `InvalidParameter` rather than aborting.
struct Chunk<'r, 'a> {
    p: &'r Problem<'a>,
    b: usize,
    kh: usize,
    c0: usize,
    c1: usize,
}

/// Runs one chunk on the key and value matrices of its `(batch, K/V head)`, whose rows `rows`
/// maps: dispatches once on the K/V storage types, before entering the ISA's code. K and V of
/// one type whose columns are contiguous are read in place in it (bf16/f16 widened, int8
/// dequantised in registers); otherwise (strided columns, or K and V of two types) both are
/// gathered block by block into f32 (the same values). Each source pair is its own
/// [`Kernel`], shared by dense views and pages, so each ISA compiles five functions of one
/// body each: inlined into one function, the five bodies made that function's optimisation
/// superlinearly slow to compile.
fn chunk(
    isa: Isa,
    c: Chunk<'_, '_>,
    keys: KvAny<'_>,
    values: KvAny<'_>,
    rows: RowMap<'_>,
) -> Result<Partial> {
    let (dk, dv) = (c.p.dk, c.p.dv);
    match (keys, values) {
        (KvAny::F32(k), KvAny::F32(v)) if k.in_place(dk) && v.in_place(dv) => {
            vectorize(isa, in_place(c, k, keys, v, values, rows))
        }
        (KvAny::BF16(k), KvAny::BF16(v)) if k.in_place(dk) && v.in_place(dv) => {
            // `HalfPath::Dot` (bf16 Q, checked): the scores on `vdpbf16ps`, an even `dk` only.
            match c.p.dot.filter(|_| dk.is_multiple_of(2)).and_then(|_| Pairs::new(k)) {
                Some(kp) => vectorize_dot(in_place(c, kp, keys, v, values, rows)),
                None => vectorize(isa, in_place(c, k, keys, v, values, rows)),
            }
        }
        (KvAny::F16(k), KvAny::F16(v)) if k.in_place(dk) && v.in_place(dv) => {
            vectorize(isa, in_place(c, k, keys, v, values, rows))
        }
        (KvAny::Q8(k), KvAny::Q8(v)) if k.in_place(dk) && v.in_place(dv) => {
            vectorize(isa, in_place(c, k, keys, v, values, rows))
        }
        _ => {
            let kb = Gather::new(keys, dk, rows, "k")?;
            let vb = Gather::new(values, dv, rows, "v")?;
            vectorize(isa, Sourced { c, kb, vb })
        }
    }
}

/// The chunk `c` over key and value matrices `k` and `v` read in place (`keys`, `values`: the
/// same matrices, for the value prefetch), their rows mapped by `rows`.
fn in_place<'v, 't, 'r, 'a, K: KvMat, V: KvMat>(
    c: Chunk<'r, 'a>,
    k: K,
    keys: KvAny<'v>,
    v: V,
    values: KvAny<'v>,
    rows: RowMap<'t>,
) -> Sourced<'r, 'a, InPlace<'v, 't, K>, InPlace<'v, 't, V>> {
    Sourced { c, kb: InPlace { m: k, any: keys, rows }, vb: InPlace { m: v, any: values, rows } }
}

/// A chunk with its key and value block sources: the [`Kernel`] of one source pair.
struct Sourced<'r, 'a, KB, VB> {
    c: Chunk<'r, 'a>,
    kb: KB,
    vb: VB,
}

impl<KB: Blocks, VB: Blocks> Kernel for Sourced<'_, '_, KB, VB> {
    type Output = Result<Partial>;

    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> Result<Partial> {
        let Sourced { c, kb, vb } = self;
        c.body(s, kb, vb)
    }
}

/// A block of `nb ≤ DECODE_BC` rows as [`Blocks::block`] gives it: rows `j..j + nb` of `m`,
/// and where the rows [`DECODE_PREFETCH_KEYS`] further on are (`None`: not prefetched).
struct Block<M> {
    m: M,
    j: usize,
    ahead: Option<(M, usize)>,
}

/// Where a task's key (or value) blocks come from: the matrix itself (a view or a pool), read
/// in place; or an f32 copy gathered block by block.
trait Blocks {
    /// True when the blocks are bf16 key rows read as pairs ([`Pairs`]): the query rows are
    /// then bf16 pairs too, unscaled, and the scale multiplies the scores.
    const PAIRS: bool = false;
    /// The matrix the tiles read.
    type M<'b>: KvMat
    where
        Self: 'b;
    /// Rows `j0..j0 + nb` (`j0` a multiple of [`DECODE_BC`], `nb ≤ DECODE_BC`).
    fn block<S: Simd>(&mut self, s: S, j0: usize, nb: usize) -> Block<Self::M<'_>>;
    /// Where row `j0` is read in place, for the score pass to prefetch the value rows of its
    /// block: the matrix and the row's index in it (`None`: not read in place).
    fn hint(&self, j0: usize) -> Option<(KvAny<'_>, usize)>;
}

/// A matrix read in place (`any`: the same matrix, for the value prefetch), its rows mapped by
/// `rows`.
struct InPlace<'v, 't, K> {
    m: K,
    any: KvAny<'v>,
    rows: RowMap<'t>,
}

impl<K: KvMat> Blocks for InPlace<'_, '_, K> {
    const PAIRS: bool = K::PAIRS;
    type M<'b>
        = K
    where
        Self: 'b;
    #[inline(always)]
    fn block<S: Simd>(&mut self, _: S, j0: usize, _: usize) -> Block<K> {
        // The rows ahead are one block (in one page) too; past the pages, no prefetch.
        const { assert!(DECODE_PREFETCH_KEYS.is_multiple_of(DECODE_BC)) };
        let ahead = match self.rows {
            RowMap::Dense => Some(j0.wrapping_add(DECODE_PREFETCH_KEYS)),
            paged => paged.row(j0 + DECODE_PREFETCH_KEYS),
        };
        Block { m: self.m, j: self.rows.read_row(j0), ahead: ahead.map(|j| (self.m, j)) }
    }
    #[inline(always)]
    fn hint(&self, j0: usize) -> Option<(KvAny<'_>, usize)> {
        self.rows.row(j0).map(|j| (self.any, j))
    }
}

/// A matrix (`n` columns, any type and strides, its rows mapped by `rows`) gathered block by
/// block into a contiguous f32 block.
struct Gather<'a, 't> {
    m: KvAny<'a>,
    n: usize,
    rows: RowMap<'t>,
    buf: Vec<f32>,
}

impl<'a, 't> Gather<'a, 't> {
    /// Allocated fallibly: `n` can be huge for a zero-stride operand.
    fn new(m: KvAny<'a>, n: usize, rows: RowMap<'t>, arg: &'static str) -> Result<Self> {
        Ok(Gather { m, n, rows, buf: zeros(arg, DECODE_BC.checked_mul(n))? })
    }
}

impl Blocks for Gather<'_, '_> {
    type M<'b>
        = Strided<'b>
    where
        Self: 'b;
    #[inline(always)]
    fn block<S: Simd>(&mut self, s: S, j0: usize, nb: usize) -> Block<Strided<'_>> {
        let j = self.rows.read_row(j0);
        Block { m: gathered(s, self.m, j, nb, self.n, &mut self.buf), j: 0, ahead: None }
    }
    #[inline(always)]
    fn hint(&self, _: usize) -> Option<(KvAny<'_>, usize)> {
        None
    }
}

impl Chunk<'_, '_> {
    /// The chunk's online softmax with the key and value blocks from `kb` and `vb`.
    #[inline(always)]
    fn body<S: Simd, KB: Blocks, VB: Blocks>(
        self,
        s: S,
        mut kb: KB,
        mut vb: VB,
    ) -> Result<Partial> {
        let Chunk { p, b, kh, c0, c1 } = self;
        let (dk, dv, nq) = (p.dk, p.dv, p.nq);
        let rows = p.group * nq;
        let mut part = Partial {
            m: vec![f32::MIN; rows],
            l: vec![0.0; rows],
            o: zeros("v", rows.checked_mul(dv))?,
        };
        // Rows are (head in group, query); every row is pre-scaled by scale, or, for key
        // pairs, `dk/2` unscaled bf16 pairs (`dq` floats a row).
        let dq = if KB::PAIRS { dk / 2 } else { dk };
        let mut qs = zeros("q", rows.checked_mul(dq))?;
        for (r, row) in qs.chunks_exact_mut(dq.max(1)).enumerate() {
            let h = kh * p.group + r / nq;
            if KB::PAIRS {
                p.query_pairs(b, h, r % nq, row);
            } else {
                p.scaled_query(b, h, r % nq, row);
            }
        }
        let mut sb = zeros("q", rows.checked_mul(DECODE_BC))?;
        let mut j0 = c0;
        while j0 < c1 {
            let nb = (c1 - j0).min(DECODE_BC);
            // Scores of every row against the block's keys: each key row is read once. Value
            // rows read in place are prefetched by the score pass, and so are the key rows
            // of the block DECODE_PREFETCH_KEYS further on, wherever it lives.
            let pf = vb.hint(j0).map(|(v, vj)| (v, vj, dv));
            let Block { m: k, j: kj, ahead } = kb.block(s, j0, nb);
            decode_qk_block(s, &qs, rows, dq, k, kj, nb, &mut sb, DECODE_BC, ahead, pf);
            if KB::PAIRS {
                for srow in sb.chunks_exact_mut(DECODE_BC) {
                    srow[..nb].iter_mut().for_each(|x| *x *= p.scale2);
                }
            }
            if let Some(c) = p.variants.softcap {
                softcap(s, &mut sb[..rows * DECODE_BC], c);
            }
            if p.masks_scores() {
                for r in 0..rows {
                    let h = kh * p.group + r / nq;
                    let srow = &mut sb[r * DECODE_BC..r * DECODE_BC + nb];
                    p.apply_mask(b, h, r % nq, 1, j0, nb, 1, srow);
                    p.apply_variants(h, r % nq, 1, j0, nb, 1, srow);
                }
            }
            // Online softmax per row; the output rows are rescaled before accumulating.
            let mut guard = false;
            for r in 0..rows {
                let srow = &mut sb[r * DECODE_BC..r * DECODE_BC + nb];
                let m_old = part.m[r];
                let m_new = row_max(s, srow, m_old);
                // A +∞ maximum (overflowed score, +∞ bias): the +∞ keys share the weight. A
                // zero weight (masked or underflowed) needs the guarded P·V tile.
                let (sum, zero) = if m_new == f32::INFINITY {
                    let sum = pos_inf_weights(srow, nb, 1, 0);
                    (sum, srow.contains(&0.0))
                } else {
                    exp_row(s, srow, m_new)
                };
                guard |= zero;
                // An unchanged maximum (the common case once it settles) needs no rescale.
                let alpha = if m_new == m_old { 1.0 } else { exp_rr2_p7_scalar(s, m_old - m_new) };
                part.l[r] = alpha.mul_add(part.l[r], sum);
                part.m[r] = m_new;
                // alpha = 0: the earlier keys now weigh 0 and contribute nothing, not 0·∞.
                let o_row = &mut part.o[r * dv..(r + 1) * dv];
                if alpha == 0.0 {
                    o_row.fill(0.0);
                } else if alpha != 1.0 {
                    o_row.iter_mut().for_each(|x| *x *= alpha);
                }
            }
            // Values: each value row is read once for all rows.
            let Block { m: v, j: vj, .. } = vb.block(s, j0, nb);
            decode_pv_block(s, guard, &sb, DECODE_BC, rows, nb, v, vj, dv, &mut part.o);
            j0 += nb;
        }
        Ok(part)
    }
}

/// Rows `j0..j0 + nb` of `m` (`n` columns) widened or dequantised into `buf` (`nb·n` floats):
/// a contiguous f32 view whose row 0 is key `j0`.
#[inline(always)]
fn gathered<'t, S: Simd>(
    s: S,
    m: KvAny<'_>,
    j0: usize,
    nb: usize,
    n: usize,
    buf: &'t mut [f32],
) -> Strided<'t> {
    m.gather(s, j0, nb, n, buf);
    Strided { data: &buf[..nb * n], offset: 0, rs: n, cs: 1 }
}
