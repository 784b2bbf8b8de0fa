//! The decode path (flash-decoding): few queries, many keys.
//!
//! For each `(batch, K/V head)` the rows are every query of every query head of the GQA group
//! (`group · nq` rows share the same keys, so each key/value row is read once for all of
//! them). The keys are split into chunks; each `(batch, K/V head, chunk)` runs the online
//! softmax over its chunk in blocks of `DECODE_BC` keys and returns its unnormalised partial
//! state `(m, l, O)`. A task is one such chunk, or, where the K/V heads of a key lie side by
//! side in memory (`[seq, kv_heads, d]`, a pool's pages), the same chunk of a group of heads,
//! run block by block and each block head after head, so a block's rows of all heads are read
//! together. The partials of a head are then merged by their logsumexp:
//! `M = max_c m_c`, `L = Σ_c e^(m_c − M)·l_c`, `O = Σ_c e^(m_c − M)·O_c / L`.
//!
//! The work is bandwidth-bound (each K/V element feeds `group · nq` FMAs), so the block loop
//! is built to stream: the score pass (`decode_qk_block`) runs register tiles of up to 4 rows ×
//! 2–4 keys with vectors along the head dimension, finished by a transposed reduction, and
//! prefetches the key rows ahead (except where one row's tiles stream a dense K in address
//! order) and the block's value rows (except where one row's tiles over bf16/f16 keys, with the
//! query row in registers, leave dense V to the hardware prefetcher too); the P·V pass
//! (`decode_pv_block`) runs tiles of up to 4 rows × 2–8 value vectors, so each K/V vector is
//! loaded once for all rows. A block is 64 keys (16 for the one-row tiles that leave dense
//! K/V to the hardware prefetcher), so that the per-block softmax bookkeeping is a small part
//! of a block's work while the value rows prefetched during its score pass are still in L1
//! or L2 when the P·V pass reads them.
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
//! block's tiles run over its keys page by page (each page's rows are consecutive rows of the
//! pool matrix), the softmax once for the whole block; the key rows prefetched ahead are
//! mapped the same way. The same kernels then read
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
use attn_core::{AnyMut, AnyRef, Mask, Result, TensorMut, Variants};

use super::blocking::{
    decode_block_keys, DECODE_BC, DECODE_BC_MIN, DECODE_MAX_CHUNKS, DECODE_MAX_Q, DECODE_MIN_CHUNK,
};
use super::blocks::{
    axpy, decode_pv_block, decode_qk_block, exp_row, pos_inf_weights, row_max, KvAny, KvMat, Pairs,
    Q8Mat, Strided,
};
use super::sink::Sink;
use super::variants::softcap;
use super::{flash, zeros, Problem, ScoreBlock};
use crate::arch::convert::{store_elems, store_elems_tail, SimdElement};
use crate::arch::{cache, load, load_tail, vectorize, vectorize_dot, Isa, Kernel, Simd};
use crate::gemm::ukernel::Kernel as GemmKernel;
use crate::math::exp::exp_rr2_p7_scalar;
use crate::par::Parallelism;

/// Unnormalised online-softmax state of one chunk of one head: per row the running maximum
/// of the scores (`m`, `f32::MIN` when nothing was visible), the sum of `e^(s − m)` (`l`) and
/// the weighted sum of values (`o`, `rows × dv`), in one allocation `[m | l | o]` (a short
/// decode call makes one per task and head).
struct Partial {
    rows: usize,
    buf: Vec<f32>,
}

impl Partial {
    /// The state before any key, allocated fallibly (`dv` can be huge, see [`Chunk`]).
    fn new(rows: usize, dv: usize) -> Result<Self> {
        let len = rows.checked_mul(dv).and_then(|o| o.checked_add(rows.checked_mul(2)?));
        let mut buf = zeros("v", len)?;
        buf[..rows].fill(f32::MIN);
        Ok(Partial { rows, buf })
    }
    /// The rows' running maxima.
    fn m(&self) -> &[f32] {
        &self.buf[..self.rows]
    }
    /// The rows' sums of `e^(s − m)`.
    fn l(&self) -> &[f32] {
        &self.buf[self.rows..2 * self.rows]
    }
    /// The rows' weighted sums of values, `dv` floats a row.
    fn o(&self) -> &[f32] {
        &self.buf[2 * self.rows..]
    }
    /// `(m, l, o)`, mutable.
    fn parts_mut(&mut self) -> (&mut [f32], &mut [f32], &mut [f32]) {
        let (m, rest) = self.buf.split_at_mut(self.rows);
        let (l, o) = rest.split_at_mut(self.rows);
        (m, l, o)
    }
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

/// Where the keys and values of a problem's `(batch, K/V head)` come from.
trait Source: Copy + Sync {
    /// What the first key of a split must be a multiple of: [`DECODE_BC_MIN`] for pages (the
    /// smallest page size, so that the blocks' runs of consecutive rows are whole pages of
    /// 16), 1 otherwise. Keys before a window's left edge that the alignment adds are masked
    /// by the window like any other.
    const ALIGN: usize;
    /// True when the K/V heads of one key lie side by side in memory (`[seq, kv_heads, d]`, the
    /// slots of a pool), so that a task runs several heads block by block ([`head_group`]).
    fn interleaved(&self, p: &Problem<'_>) -> bool;
    /// The key and value matrices of K/V head `kh` of batch `b`, and the map from a key index
    /// to their rows.
    fn head<'s>(&'s self, p: &'s Problem<'_>, b: usize, kh: usize) -> Head<'s>;
}

/// One K/V head's key and value matrices and the map from key index to their rows.
type Head<'s> = (KvAny<'s>, KvAny<'s>, RowMap<'s>);

/// The problem's own K/V views (any type and strides).
#[derive(Clone, Copy)]
struct Dense;

impl Source for Dense {
    const ALIGN: usize = 1;
    fn interleaved(&self, p: &Problem<'_>) -> bool {
        let s = p.k.layout().strides;
        p.hkv > 1 && s[1] < s[2]
    }
    fn head<'s>(&'s self, p: &'s Problem<'_>, b: usize, kh: usize) -> Head<'s> {
        (p.keys(b, kh), p.values(b, kh), RowMap::Dense)
    }
}

/// The pages of sequence `seq` of a checked paged cache, read in place in their type.
#[derive(Clone, Copy)]
struct Pages<'r, 'a> {
    cache: &'r PagedKv<'a>,
    seq: usize,
}

impl Source for Pages<'_, '_> {
    const ALIGN: usize = DECODE_BC_MIN;
    fn interleaved(&self, _: &Problem<'_>) -> bool {
        self.cache.kv_heads > 1
    }
    fn head<'s>(&'s self, _: &'s Problem<'_>, _: usize, kh: usize) -> Head<'s> {
        paged_head(self.cache, self.seq, kh)
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

    /// How many of keys `j0..j0 + n` lie in consecutive rows from key `j0`'s: all `n` for a
    /// view, up to the end of `j0`'s page for a pool. The decode tiles run over a block run by
    /// run.
    #[inline(always)]
    fn run_len(self, j0: usize, n: usize) -> usize {
        match self {
            RowMap::Dense => n,
            RowMap::Paged { ps, .. } => n.min(ps - j0 % ps),
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
/// chunk-major: the partial of head `bk`, chunk `c` at `c·heads + bk`). A task runs one chunk
/// of a group of K/V heads of one batch ([`head_group`]: one head unless the heads interleave
/// in memory), and the tasks of a chunk run one after another: where the heads interleave, the
/// lines one head's rows share with the next head's, or that the hardware prefetcher brought
/// in beside them, are then still in cache (head-major order read them again from DRAM:
/// 1.08–1.6× on Zen 4, perf journal 2026-12-05 23:20). The thread count picks who runs the
/// chunks and how heads are grouped, never how the keys are split or the order of any head's
/// arithmetic.
fn run_tasks<Src: Source>(
    isa: Isa,
    jobs: &[(&Problem<'_>, Src)],
    par: Parallelism,
) -> Result<Vec<Vec<Partial>>> {
    // Per problem: its first task, the keys any query may see (all of them but for a causal
    // mask or a window), their split and the head groups.
    let mut first = Vec::with_capacity(jobs.len() + 1);
    let mut plans = Vec::with_capacity(jobs.len());
    let mut tasks = 0usize;
    for (p, src) in jobs {
        first.push(tasks);
        let (k0, k1) = if p.nq == 0 {
            (0, 0)
        } else {
            let k0 = p.key_start(0) / Src::ALIGN * Src::ALIGN;
            (k0, p.key_end(p.nq - 1).max(k0))
        };
        let (chunks, chunk_len) = split(k1 - k0);
        // Rows (batch·hq·nq) are bounded by the output or lse slice (the caller returned
        // early when neither has an element), so these products are too; saturating all
        // the same.
        let hkv = if p.nq == 0 { 0 } else { p.hkv };
        let units = p.batch.saturating_mul(chunks);
        let group = head_group(hkv, units, src.interleaved(p), par.count());
        let groups = hkv.div_ceil(group);
        plans.push(Plan { k0, k1, chunk_len, group, groups, per_chunk: p.batch * groups });
        tasks = tasks.saturating_add(units.saturating_mul(groups));
    }
    first.push(tasks);
    let task = |t: usize| {
        let job = first.partition_point(|&f| f <= t) - 1;
        let ((p, src), pl) = (&jobs[job], plans[job]);
        let t = t - first[job];
        let (u, c) = (t % pl.per_chunk, t / pl.per_chunk);
        let kh0 = u % pl.groups * pl.group;
        let c0 = pl.k0.saturating_add(c * pl.chunk_len).min(pl.k1);
        let c1 = c0.saturating_add(pl.chunk_len).min(pl.k1);
        let heads = kh0..(kh0 + pl.group).min(p.hkv);
        chunk(isa, Chunk { p, b: u / pl.groups, heads, c0, c1 }, src)
    };
    let all: Vec<Vec<Partial>> = if par.count() == 1 || tasks == 1 {
        (0..tasks).map(task).collect::<Result<_>>()?
    } else {
        par.install(|| (0..tasks).into_par_iter().with_min_len(1).map(task).collect::<Result<_>>())?
    };
    // Each problem's tasks, in order, hold its partials in order.
    let mut all = all.into_iter();
    Ok(first.windows(2).map(|w| all.by_ref().take(w[1] - w[0]).flatten().collect()).collect())
}

/// How [`run_tasks`] cuts one problem into tasks: keys `k0..k1` in chunks of `chunk_len`, the
/// K/V heads of a batch in `groups` groups of `group`, `per_chunk = batch·groups` tasks a
/// chunk.
#[derive(Clone, Copy)]
struct Plan {
    k0: usize,
    k1: usize,
    chunk_len: usize,
    group: usize,
    groups: usize,
    per_chunk: usize,
}

/// K/V heads per task, for `hkv` heads a batch and `units` (batch, chunk) pairs on `threads`
/// threads. One where each head's rows are apart from the others'. Where the heads of a key
/// lie side by side (`interleaved`), a task runs all the heads of its chunk block by block,
/// so the rows of a block, contiguous across the heads, are read together (one head at a
/// time jumps a whole key row, a new 4 KiB page at 32 f32 heads, at every key: with the L2
/// block prefetch, groups ran 1.34–1.36× faster, perf journal 2026-12-06 02:18); cut into
/// smaller groups only where fewer tasks would leave a thread idle (four tasks a thread). The
/// grouping changes no head's arithmetic.
fn head_group(hkv: usize, units: usize, interleaved: bool, threads: usize) -> usize {
    if !interleaved || hkv <= 1 {
        return 1;
    }
    let want = if threads <= 1 { 1 } else { threads.saturating_mul(4) };
    let groups = want.div_ceil(units.max(1)).clamp(1, hkv);
    hkv.div_ceil(groups)
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

impl<T: SimdElement> Kernel for Merge<'_, '_, '_, T> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let Merge { p, partials, heads, mut o, mut lse, mut acc } = self;
        let rows = p.group * p.nq;
        for bk in 0..heads {
            // The head's chunks, in key order.
            let parts = || partials[bk..].iter().step_by(heads);
            let (b, kh) = (bk / p.hkv, bk % p.hkv);
            for r in 0..rows {
                let (h, i) = (kh * p.group + r / p.nq, r % p.nq);
                let mx = parts().map(|c| c.m()[r]).fold(f32::MIN, f32::max);
                let mut total = 0.0f32;
                acc.fill(0.0);
                for c in parts() {
                    // e^(m_c − M) in f64: two scalars per chunk, no need for the vector exp.
                    // Equal maxima weigh 1, also when both are +∞ (the +∞ keys share the
                    // weight).
                    let w = if c.m()[r] == mx {
                        1.0
                    } else {
                        (f64::from(c.m()[r]) - f64::from(mx)).exp() as f32
                    };
                    if w == 0.0 {
                        continue; // weight 0: contributes nothing, even an ∞ partial (0·∞)
                    }
                    total = w.mul_add(c.l()[r], total);
                    axpy(s, w, &c.o()[r * p.dv..(r + 1) * p.dv], &mut acc);
                }
                // NaN in any chunk must survive the merge (f32::max above skips NaN maxima).
                if parts().any(|c| c.l()[r].is_nan()) {
                    total = f32::NAN;
                }
                let (inv, row_lse) = p.finish(h, mx, total, lse.is_some());
                put_row(s, &mut o, (b, h, i), &acc, inv);
                if let Some(l) = lse.as_mut() {
                    l.out[l.base + (b * p.hq + h) * l.head_stride + i] = row_lse;
                }
            }
        }
    }
}

/// Output row `(b, h, i)` of `o` ← `acc[d] · inv` for `d < acc.len()`, each rounded once to
/// `T`: by vectors where the row is contiguous (the same bits: [`store_elems`] rounds as
/// [`attn_core::Element::from_f32`] does), element by element otherwise. The element loop,
/// with the layout's index per element, was 10–15 % of an 8-K/V-head decode call at 64 keys
/// (perf journal, 2026-12-07 07:38). The flash sink's `put` is the same write through its
/// raw pointer.
#[inline(always)]
fn put_row<S: Simd, T: SimdElement>(
    s: S,
    o: &mut TensorMut<'_, T>,
    (b, h, i): (usize, usize, usize),
    acc: &[f32],
    inv: f32,
) {
    if acc.is_empty() {
        return; // dv = 0: no element, and the row's first index may lie past the data
    }
    if o.layout.strides[3] != 1 {
        for (d, a) in acc.iter().enumerate() {
            let idx = o.layout.index(b, h, i, d);
            o.data[idx] = T::from_f32(a * inv);
        }
        return;
    }
    let base = o.layout.index(b, h, i, 0);
    let row = &mut o.data[base..base + acc.len()];
    let (l, iv) = (S::LANES, s.splat(inv));
    let mut d = 0;
    while d + l <= acc.len() {
        store_elems(s, &mut row[d..], s.mul(load(s, &acc[d..]), iv));
        d += l;
    }
    if d < acc.len() {
        store_elems_tail(s, &mut row[d..], s.mul(load_tail(s, &acc[d..]), iv));
    }
}

/// One task: keys `c0..c1` of K/V heads `heads` of batch `b`, for all rows of each head's
/// group. Its scratch grows with `dk` and `dv`, which a zero-stride operand can make huge:
/// allocated fallibly, so such a call fails with `InvalidParameter` rather than aborting.
struct Chunk<'r, 'a> {
    p: &'r Problem<'a>,
    b: usize,
    heads: Range<usize>,
    c0: usize,
    c1: usize,
}

/// Runs one chunk of its heads' key and value matrices (from `src`) and returns a partial per
/// head: dispatches once on the K/V storage types, before entering the ISA's code. K and V of
/// one type whose columns are contiguous are read in place in it (bf16/f16 widened, int8
/// dequantised in registers); otherwise (strided columns, or K and V of two types) both are
/// gathered block by block into f32 (the same values). Each source pair is its own
/// [`Kernel`], shared by dense views and pages, so each ISA compiles five functions of one
/// body each: inlined into one function, the five bodies made that function's optimisation
/// superlinearly slow to compile.
fn chunk<Src: Source>(isa: Isa, c: Chunk<'_, '_>, src: &Src) -> Result<Vec<Partial>> {
    let (dk, dv) = (c.p.dk, c.p.dv);
    let heads: Vec<Head<'_>> = c.heads.clone().map(|kh| src.head(c.p, c.b, kh)).collect();
    let Some(&(keys, values, rows)) = heads.first() else {
        return Ok(Vec::new());
    };
    // Every head of a problem has the first one's types and strides; `typed` checks each.
    let (ks, vs) = (|| heads.iter().map(|h| h.0), || heads.iter().map(|h| h.1));
    // K and V of one type, read in place when every head's columns are contiguous.
    macro_rules! same_type {
        ($t:ident) => {{
            let f = |a| if let KvAny::$t(m) = a { Some(m) } else { None };
            if let (Some(k), Some(v)) = (typed(ks(), dk, f), typed(vs(), dv, f)) {
                return vectorize(isa, in_place(c, &heads, rows, k, v));
            }
        }};
    }
    match (keys, values) {
        (KvAny::F32(_), KvAny::F32(_)) => same_type!(F32),
        (KvAny::BF16(_), KvAny::BF16(_)) => {
            let f = |a| if let KvAny::BF16(m) = a { Some(m) } else { None };
            let Some(v) = typed(vs(), dv, f) else { return gathered(isa, c, &heads, rows) };
            // `HalfPath::Dot` (bf16 Q, checked): the scores on `vdpbf16ps`, an even `dk` only.
            if c.p.dot.is_some() && dk.is_multiple_of(2) {
                let pairs = |a| f(a).and_then(Pairs::new);
                if let Some(k) = typed(ks(), dk, pairs) {
                    return vectorize_dot(in_place(c, &heads, rows, k, v));
                }
            }
            if let Some(k) = typed(ks(), dk, f) {
                return vectorize(isa, in_place(c, &heads, rows, k, v));
            }
        }
        (KvAny::F16(_), KvAny::F16(_)) => same_type!(F16),
        (KvAny::Q8(_), KvAny::Q8(_)) => same_type!(Q8),
        _ => {}
    }
    gathered(isa, c, &heads, rows)
}

/// Each of `ms` as the matrix type `K` (`cast`), read in place over `n` columns; `None`
/// unless all are.
fn typed<'v, K: KvMat>(
    ms: impl Iterator<Item = KvAny<'v>>,
    n: usize,
    cast: impl Fn(KvAny<'v>) -> Option<K>,
) -> Option<Vec<K>> {
    ms.map(|m| cast(m).filter(|m| m.in_place(n))).collect()
}

/// The chunk `c` over its heads' key and value matrices `k` and `v` read in place (`heads`:
/// the same matrices, for the prefetches), their rows mapped by `rows`.
fn in_place<'v, 't, 'r, 'a, K: KvMat, V: KvMat>(
    c: Chunk<'r, 'a>,
    heads: &[Head<'v>],
    rows: RowMap<'t>,
    k: Vec<K>,
    v: Vec<V>,
) -> Sourced<'r, 'a, InPlace<'v, 't, K>, InPlace<'v, 't, V>> {
    let (ks, vs) = (heads.iter().map(|h| h.0).collect(), heads.iter().map(|h| h.1).collect());
    Sourced { c, kb: InPlace { m: k, any: ks, rows }, vb: InPlace { m: v, any: vs, rows } }
}

/// The chunk `c` over its heads' key and value matrices gathered block by block into f32.
fn gathered(
    isa: Isa,
    c: Chunk<'_, '_>,
    heads: &[Head<'_>],
    rows: RowMap<'_>,
) -> Result<Vec<Partial>> {
    let (dk, dv) = (c.p.dk, c.p.dv);
    let kb = Gather::new(heads.iter().map(|h| h.0).collect(), dk, rows, "k")?;
    let vb = Gather::new(heads.iter().map(|h| h.1).collect(), dv, rows, "v")?;
    vectorize(isa, Sourced { c, kb, vb })
}

/// A chunk with its key and value block sources: the [`Kernel`] of one source pair.
struct Sourced<'r, 'a, KB, VB> {
    c: Chunk<'r, 'a>,
    kb: KB,
    vb: VB,
}

impl<KB: Blocks, VB: Blocks> Kernel for Sourced<'_, '_, KB, VB> {
    type Output = Result<Vec<Partial>>;

    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> Result<Vec<Partial>> {
        let Sourced { c, kb, vb } = self;
        c.body(s, kb, vb)
    }
}

/// A block of `nb ≤ DECODE_BC` rows as [`Blocks::block`] gives it: rows `j..j + nb` of `m`,
/// and where the key rows the task reads next are (`None`: not prefetched).
struct Block<M> {
    m: M,
    j: usize,
    ahead: Option<(M, usize)>,
}

/// Where a task's key (or value) blocks come from, for each head `i` of the task: the matrix
/// itself (a view or a pool), read in place; or an f32 copy gathered block by block.
trait Blocks {
    /// True when the blocks are bf16 key rows read as pairs ([`Pairs`]): the query rows are
    /// then bf16 pairs too, unscaled, and the scale multiplies the scores.
    const PAIRS: bool = false;
    /// True when one-row score tiles over these blocks keep the query in registers and leave
    /// dense rows to the hardware prefetcher ([`KvMat::QUERY_IN_REGISTERS`]).
    const QUERY_IN_REGISTERS: bool = false;
    /// The matrix the tiles read.
    type M<'b>: KvMat
    where
        Self: 'b;
    /// Rows `j0..j0 + nb` of head `i` (consecutive rows: `nb` at most
    /// [`run_len`](Self::run_len)), and where the rows read next start: head `i + 1`'s of these
    /// keys, or after the last head the first head's from key `next` (the same place in the
    /// next block).
    fn block<S: Simd>(
        &mut self,
        s: S,
        i: usize,
        j0: usize,
        nb: usize,
        next: usize,
    ) -> Block<Self::M<'_>>;
    /// Where row `j0` of head `i` is read in place, for the score pass to prefetch the value
    /// rows of its block: the matrix and the row's index in it (`None`: not read in place).
    fn hint(&self, i: usize, j0: usize) -> Option<(KvAny<'_>, usize)>;
    /// Prefetches into L2 part `part` of `parts` of the rows of keys `j0..j0 + n` (the first
    /// head's rows and all that lies up to its last row's end: where the heads interleave,
    /// every head's rows of the block), for tiles of `rows` query rows. Nothing where the blocks
    /// are gathered, nor for the GQA tiles over f32, which prefetch their own rows into L2
    /// ([`KvMat::GROUP_PREFETCH_FAR`]; both at once ran 0.85–0.93× on Zen 4).
    fn prefetch_block(&self, j0: usize, n: usize, part: usize, parts: usize, rows: usize);
    /// How many of keys `j0..j0 + n` lie in consecutive rows from key `j0`'s
    /// ([`RowMap::run_len`]): what one [`block`](Self::block) may hold.
    fn run_len(&self, j0: usize, n: usize) -> usize;
    /// Bytes from one key's rows to the next key's ([`KvAny::key_bytes`]).
    fn key_bytes(&self) -> usize;
}

/// Matrices read in place, one per head (`any`: the same matrices, for the value prefetch),
/// their rows mapped by `rows`.
struct InPlace<'v, 't, K> {
    m: Vec<K>,
    any: Vec<KvAny<'v>>,
    rows: RowMap<'t>,
}

impl<K: KvMat> Blocks for InPlace<'_, '_, K> {
    const PAIRS: bool = K::PAIRS;
    const QUERY_IN_REGISTERS: bool = K::QUERY_IN_REGISTERS;
    type M<'b>
        = K
    where
        Self: 'b;
    #[inline(always)]
    fn block<S: Simd>(&mut self, _: S, i: usize, j0: usize, _: usize, next: usize) -> Block<K> {
        // The tiles prefetch as many rows from there as they read: those of a page run, or
        // where the next block's run is shorter (a page's end, the chunk's), a few rows past
        // it, only hinted at. Past the pages, no prefetch.
        let ahead = match self.m.get(i + 1) {
            Some(&m) => self.rows.row(j0).map(|j| (m, j)),
            None => match self.rows {
                RowMap::Dense => Some(next),
                paged => paged.row(next),
            }
            .map(|j| (self.m[0], j)),
        };
        Block { m: self.m[i], j: self.rows.read_row(j0), ahead }
    }
    #[inline(always)]
    fn hint(&self, i: usize, j0: usize) -> Option<(KvAny<'_>, usize)> {
        self.rows.row(j0).map(|j| (self.any[i], j))
    }
    #[inline(always)]
    fn prefetch_block(&self, j0: usize, n: usize, part: usize, parts: usize, rows: usize) {
        if rows > 1 && K::GROUP_PREFETCH_FAR {
            return;
        }
        // Run by run: the rows of one page are consecutive.
        let mut at = 0;
        while at < n {
            let len = self.rows.run_len(j0 + at, n - at);
            if let Some(j) = self.rows.row(j0 + at) {
                self.any[0].prefetch_part(j, len, part, parts, true);
            }
            at += len;
        }
    }
    #[inline(always)]
    fn run_len(&self, j0: usize, n: usize) -> usize {
        self.rows.run_len(j0, n)
    }
    #[inline(always)]
    fn key_bytes(&self) -> usize {
        self.any[0].key_bytes()
    }
}

/// Matrices (`n` columns, any type and strides, one per head, their rows mapped by `rows`)
/// gathered block by block into a contiguous f32 block.
struct Gather<'a, 't> {
    m: Vec<KvAny<'a>>,
    n: usize,
    rows: RowMap<'t>,
    buf: Vec<f32>,
}

impl<'a, 't> Gather<'a, 't> {
    /// Allocated fallibly: `n` can be huge for a zero-stride operand.
    fn new(m: Vec<KvAny<'a>>, n: usize, rows: RowMap<'t>, arg: &'static str) -> Result<Self> {
        Ok(Gather { m, n, rows, buf: zeros(arg, DECODE_BC.checked_mul(n))? })
    }
}

impl Blocks for Gather<'_, '_> {
    type M<'b>
        = Strided<'b>
    where
        Self: 'b;
    #[inline(always)]
    fn block<S: Simd>(
        &mut self,
        s: S,
        i: usize,
        j0: usize,
        nb: usize,
        _: usize,
    ) -> Block<Strided<'_>> {
        let j = self.rows.read_row(j0);
        Block { m: gather(s, self.m[i], j, nb, self.n, &mut self.buf), j: 0, ahead: None }
    }
    #[inline(always)]
    fn hint(&self, _: usize, _: usize) -> Option<(KvAny<'_>, usize)> {
        None
    }
    fn prefetch_block(&self, _: usize, _: usize, _: usize, _: usize, _: usize) {}
    #[inline(always)]
    fn run_len(&self, j0: usize, n: usize) -> usize {
        self.rows.run_len(j0, n)
    }
    #[inline(always)]
    fn key_bytes(&self) -> usize {
        self.m[0].key_bytes()
    }
}

impl Chunk<'_, '_> {
    /// The chunk's online softmax for each of its heads, with the key and value blocks from
    /// `kb` and `vb`: block by block, each block for every head in turn.
    #[inline(always)]
    fn body<S: Simd, KB: Blocks, VB: Blocks>(
        self,
        s: S,
        mut kb: KB,
        mut vb: VB,
    ) -> Result<Vec<Partial>> {
        let (p, b, heads) = (self.p, self.b, self.heads.clone());
        let (dk, dv, nq) = (p.dk, p.dv, p.nq);
        let rows = p.group * nq;
        // Per head: its partial, and its rows (head in group, query), every row pre-scaled by
        // scale, or, for key pairs, `dk/2` unscaled bf16 pairs (`dq` floats a row). The rows
        // of every head and the scores' scratch share one allocation.
        let dq = if KB::PAIRS { dk / 2 } else { dk };
        let q_len = rows.checked_mul(dq).and_then(|n| n.checked_mul(heads.len()));
        let len = q_len.and_then(|n| n.checked_add(rows.checked_mul(DECODE_BC)?));
        let mut scratch = zeros("q", len)?;
        // `len` is `Some` past the allocation, so `q_len` is too.
        let (qs, sb) = scratch.split_at_mut(q_len.unwrap_or(0));
        let head_q = rows * dq;
        let mut parts = Vec::with_capacity(heads.len());
        for (i, kh) in heads.clone().enumerate() {
            parts.push(Partial::new(rows, dv)?);
            let qh = &mut qs[i * head_q..(i + 1) * head_q];
            for (r, row) in qh.chunks_exact_mut(dq.max(1)).enumerate() {
                let h = kh * p.group + r / nq;
                if KB::PAIRS {
                    p.query_pairs(b, h, r % nq, row);
                } else {
                    p.scaled_query(s, b, h, r % nq, row);
                }
            }
        }
        let (c0, c1) = (self.c0, self.c1);
        // Blocks of `bc` keys (the tiles run over a block page by page, `head_block`).
        let key_bytes = kb.key_bytes().saturating_add(vb.key_bytes());
        let streamed = rows == 1 && KB::QUERY_IN_REGISTERS;
        let bc = decode_block_keys(&cache::detected(), key_bytes, streamed);
        let mut j0 = c0;
        // A task of every K/V head of its batch also prefetches the next block's rows of all
        // of them into L2, a part per head, front to back: one stream in address order, where
        // the heads' own blocks jump a key row at each key (1.05–1.38× on Zen 4
        // sequence-major, perf journal 2026-12-06 02:18).
        let whole = heads.len() > 1 && heads.len() == p.hkv;
        while j0 < c1 {
            let nb = (c1 - j0).min(bc);
            let next = (j0 + nb < c1).then(|| (j0 + nb, (c1 - j0 - nb).min(bc)));
            for (i, part) in parts.iter_mut().enumerate() {
                if let Some((j, n)) = next.filter(|_| whole) {
                    kb.prefetch_block(j, n, i, p.hkv, rows);
                    vb.prefetch_block(j, n, i, p.hkv, rows);
                }
                let qh = &qs[i * head_q..(i + 1) * head_q];
                self.head_block(s, &mut kb, &mut vb, sb, part, qh, i, j0, nb);
            }
            j0 += nb;
        }
        Ok(parts)
    }

    /// Keys `j0..j0 + nb` of the task's head `i` (`part`, its query rows `qs`): the scores,
    /// the online softmax and P·V (`sb`: the scores' scratch). The tiles run over each run of
    /// consecutive rows (the block's part in one page) in turn, the softmax once for the
    /// block: a block of a pool's pages costs what a dense one does but for the tiles'
    /// set-up per page, and gives the same bits (each key's score and each output
    /// element's FMAs are the same, in the same order).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn head_block<S: Simd, KB: Blocks, VB: Blocks>(
        &self,
        s: S,
        kb: &mut KB,
        vb: &mut VB,
        sb: &mut [f32],
        part: &mut Partial,
        qs: &[f32],
        i: usize,
        j0: usize,
        nb: usize,
    ) {
        let (p, b, kh) = (self.p, self.b, self.heads.start + i);
        let (dk, dv, nq) = (p.dk, p.dv, p.nq);
        let rows = p.group * nq;
        let dq = if KB::PAIRS { dk / 2 } else { dk };
        // Keys that a keep-mask hides from every row (a padded batch's key padding) change
        // nothing: skipped, scores and all.
        let hidden =
            |g| p.hides_block(ScoreBlock { b, h: kh * p.group + g, i0: 0, rows: nq, j0, nb });
        if (0..p.group).all(hidden) {
            return;
        }
        // Scores of every row against the block's keys: each key row is read once.
        // Value rows read in place are prefetched by the score pass, and so are the
        // key rows the task reads next, wherever they live.
        let mut at = 0;
        while at < nb {
            let n = kb.run_len(j0 + at, nb - at);
            let pf = vb.hint(i, j0 + at).map(|(v, vj)| (v, vj, dv));
            let Block { m: k, j: kj, ahead } = kb.block(s, i, j0 + at, n, j0 + nb + at);
            decode_qk_block(s, qs, rows, dq, k, kj, n, &mut sb[at..], DECODE_BC, ahead, pf);
            at += n;
        }
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
                let blk = ScoreBlock { b, h, i0: r % nq, rows: 1, j0, nb };
                p.apply_mask(s, blk, 1, srow);
                p.apply_variants(blk, 1, srow);
            }
        }
        // Online softmax per row; the output rows are rescaled before accumulating.
        let (pm, pl, po) = part.parts_mut();
        let mut guard = false;
        for r in 0..rows {
            let srow = &mut sb[r * DECODE_BC..r * DECODE_BC + nb];
            let m_old = pm[r];
            let m_new = row_max(s, srow, m_old);
            // A +∞ maximum (overflowed score, +∞ bias): the +∞ keys share the weight.
            // A zero weight (masked or underflowed) needs the guarded P·V tile.
            let (sum, zero) = if m_new == f32::INFINITY {
                let sum = pos_inf_weights(srow, nb, 1, 0);
                (sum, srow.contains(&0.0))
            } else {
                exp_row(s, srow, m_new)
            };
            guard |= zero;
            // An unchanged maximum (the common case once it settles) needs no rescale.
            let alpha = if m_new == m_old { 1.0 } else { exp_rr2_p7_scalar(s, m_old - m_new) };
            pl[r] = alpha.mul_add(pl[r], sum);
            pm[r] = m_new;
            // alpha = 0: the earlier keys now weigh 0 and contribute nothing, not 0·∞.
            let o_row = &mut po[r * dv..(r + 1) * dv];
            if alpha == 0.0 {
                o_row.fill(0.0);
            } else if alpha != 1.0 {
                o_row.iter_mut().for_each(|x| *x *= alpha);
            }
        }
        // Values: each value row is read once for all rows.
        let mut at = 0;
        while at < nb {
            let n = vb.run_len(j0 + at, nb - at);
            let Block { m: v, j: vj, .. } = vb.block(s, i, j0 + at, n, j0 + nb + at);
            decode_pv_block(s, guard, &sb[at..], DECODE_BC, rows, n, v, vj, dv, po);
            at += n;
        }
    }
}

/// Rows `j0..j0 + nb` of `m` (`n` columns) widened or dequantised into `buf` (`nb·n` floats):
/// a contiguous f32 view whose row 0 is key `j0`.
#[inline(always)]
fn gather<'t, S: Simd>(
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
