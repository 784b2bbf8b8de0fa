//! The flash path: one task per `(batch, query head, group of QT query tiles)`, streaming
//! the keys in blocks of BC keys with an online softmax per tile; each key block serves all
//! the task's tiles while it is in cache. BC and QT come from the detected caches
//! ([`FlashBlocking::for_isa`]). Written once over the [`Simd`] trait.
//!
//! Per task, with `QR = QV·LANES` queries on the vector lanes (the width `NR` of the ISA's tile
//! micro-kernel, see [`tile_kernel_for`](crate::gemm::ukernel::tile_kernel_for)):
//! 1. pack the query tile transposed and pre-scaled, as a GEMM B micro-panel:
//!    `qp[d·QR + r] = scale·q(i0 + r, d)` (padding rows are 0);
//! 2. for each key block `j0..j0 + nb` (stopping at the causal diagonal of the tile's last
//!    query, so blocks above it are never computed):
//!    `Sᵀ = K·qp` on the micro-kernels (K read in place), mask, then per query lane
//!    `m' = max(m, max_j S_j)`, `α = e^(m − m')`, `P_j = e^(S_j − m')` (in place, which leaves
//!    `P` as the B micro-panel of the next product), `l ← α·l + Σ_j P_j`, and
//!    `Oᵀ ← α·Oᵀ + Vᵀ·P` on the micro-kernels (V read in place);
//!    With variants, a softcap maps the block's scores before the mask, ALiBi and the window
//!    after it, and blocks outside a tile's window are skipped like those past the diagonal,
//!    as are blocks a keep-mask hides from every row of the tile (`Problem::hides_block`);
//! 3. write `O/l` (zeros where `l = 0`: fully masked rows) and `lse = m + ln l`, with a sink
//!    in the denominator when there is one (`Problem::finish`).
//!
//! The running maximum starts at `f32::MIN` rather than −∞, so `m − m'` and `S_j − m'` are never
//! `−∞ − (−∞)`: a block where everything so far is masked gives `α = 1` on an empty sum and
//! `P = e^(−∞) = 0`.
//!
//! Element types: a bf16/f16 query tile is widened while it is packed; K and V of any type
//! other than f32 (bf16, f16, int8) are converted to f32 one key block at a time, into
//! per-thread scratch, once per task and block (the block then serves the task's QT query
//! tiles), with the same values the decode tiles read; the output is rounded at the write.
//!
//! The keys and values come from the problem's views, or ([`run_from`] with [`Source::Pages`])
//! from the pages of one sequence of a paged cache: a block inside one page of an f32 pool is
//! read in place, any other block is gathered page by page into the scratch (converted as
//! above), once per task and block.
//!
//! With [`HalfPath::Dot`](crate::gemm::HalfPath) (bf16 Q, K and V) both products run on the
//! `vdpbf16ps` micro-kernel instead, on bf16 pairs: the query tile is packed as pairs along
//! `d` (unscaled: the score product's α is the scale), each key block's K rows as pairs along
//! `d` and its V rows as pairs along the keys (so a tile's keys start at an even offset in the
//! block: one extra key before a window's edge, masked like every key outside it), and the
//! probabilities are rounded to bf16 and paired along the keys after the softmax step. The
//! running sums keep the f32 probabilities. The bound this costs is stated in
//! [`Attention`](super::Attention)'s docs. From pages, the pairs are read slot by slot through
//! the block table (one copy per block when its rows are consecutive in one page).

use rayon::prelude::*;

use attn_core::batch::PagedKv;
use attn_core::{AnyRef, Error, Result};

use super::blocking::{FlashBlocking, QV};
use super::blocks::{
    key_pairs, pairs_finite, pos_inf_weights, prob_pairs, pv_block, pv_update, qk_block,
    query_pairs, scores, tile_rows, value_pair_at, value_pairs, weights, KvAny, Product, Strided,
};
use super::decode::{paged_head, RowMap};
use super::sink::Sink;
use super::variants::softcap;
use super::{matrix, scale_row, zeros, Problem, ScoreBlock, FLUSH_WEIGHTS_BELOW};
use crate::arch::convert::SimdElement;
use crate::arch::{load, store, transpose_matrix, vectorize, Isa, Kernel, Simd};
use crate::gemm::pack::AlignedBuf;
use crate::gemm::ukernel::Kernel as GemmKernel;
use crate::math::exp::{exp_neg_lut8_p3, exp_rr2_p7_scalar};
use crate::par::Parallelism;

/// Largest query tile of any ISA (AVX-512: 2 × 16 lanes); scratch is sized for it.
const MAX_QR: usize = 32;

/// Most bytes of one `(batch, K/V head)`'s f32 keys and values that a thread copies into
/// consecutive rows ([`HeadCopy`]): a head of 16 384 keys at d 128. Longer heads are read in
/// place. Varlen's copies of one K/V head (of one sequence, or of a group of sequences) have
/// the same limit.
pub(crate) const HEAD_COPY_MAX: usize = 16 << 20;

/// Fewest tasks reading one `(batch, K/V head)` (query tile groups times query heads per K/V
/// head) for which flash copies its rows ([`HeadCopy`]). A copy reads the rows once more than
/// the tasks do: with one task per head (a batch of sequences of 16–128 tokens) it ran 0.90×,
/// with 4 (h8 N 512 in the MHA layer) 1.02×, with 8 and more 1.07–1.08× (perf journal,
/// 2026-12-06 22:57).
const HEAD_COPY_MIN_READERS: usize = 4;

/// One `(batch, K/V head)`'s f32 K and V rows copied consecutive, for views whose rows are not
/// (`row stride ≠ d`: token-major `[seq, heads, d]` tensors, where a head's rows are `heads·d`
/// apart). Read in place, such rows come from L3 on every task of the head: no prefetcher
/// streams them, and a stride that is a multiple of a large power of two folds them onto a
/// fraction of the L2's sets. Copied once, they serve all the head's tasks on this thread as a
/// head-major view's rows would: causal flash at h8 d64 N 4096 took 1.19× the time of the
/// head-major layout read in place and 1.09× with the copy (perf journal, 2026-12-06 22:57).
/// Keys are copied from 0 as far as a task needs; the arithmetic is the same either way.
struct HeadCopy {
    /// The `(batch, K/V head)` copied, if any.
    head: Option<(usize, usize)>,
    /// Keys copied so far (`k: [copied, dk]`, `v: [copied, dv]`).
    copied: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// Per-thread scratch of the flash loop: a few tiles, independent of the sequence lengths. The
/// packed query tiles and the probability block are B micro-panels of the tile micro-kernel,
/// hence 64-byte aligned.
pub(super) struct Scratch {
    /// The task's QT packed query tiles, `dk·QR` floats each.
    qp: AlignedBuf,
    /// The score / probability block of the tile being processed.
    s: AlignedBuf,
    /// The probability block as bf16 pairs (`⌈BC/2⌉·QR` words) on the `vdpbf16ps` path;
    /// empty otherwise.
    pb: AlignedBuf,
    /// Output accumulators, `dv·QR` floats per tile.
    o: Vec<f32>,
    /// Copy of one accumulator while a guarded block runs (see [`pv_block`]).
    save: Vec<f32>,
    /// One tile as rows of queries (`QR·max(dk, dv)` floats): the scaled query rows before
    /// they are packed, and the accumulator's rows before they are written.
    by_row: Vec<f32>,
    /// Running maxima and sums, `QR` per tile.
    m: Vec<f32>,
    l: Vec<f32>,
    /// Rescale factors of the tile being processed.
    alpha: Vec<f32>,
    /// One key block and one value block converted to f32 (`BC·dk`, `BC·dv` floats), when K
    /// or V is stored in another type; empty otherwise. On the `vdpbf16ps` path they hold the
    /// blocks as bf16 pairs (`BC·⌈dk/2⌉` and `⌈BC/2⌉·dv` words).
    kb: Vec<f32>,
    vb: Vec<f32>,
    /// The copied head, when the problem takes one ([`head_copy`]); `None` otherwise.
    head: Option<HeadCopy>,
}

impl Scratch {
    /// The scratch of one thread, or an error when `dk` or `dv` (which a zero-stride operand
    /// can make huge) asks for more than can be allocated.
    /// `gather`: the blocks come from pages, so the f32 blocks need room too.
    /// `readers`: the tasks that read each K/V head.
    fn new(p: &Problem<'_>, fb: FlashBlocking, gather: bool, readers: usize) -> Result<Self> {
        let (dk, dv) = (p.dk, p.dv);
        let convert = |kv: &attn_core::KvRef<'_>, d: usize, arg| match kv {
            attn_core::KvRef::F32(_) if !gather => Ok(Vec::new()),
            _ => zeros(arg, fb.bc.checked_mul(d)),
        };
        let tiles = |d: usize, n: usize| d.checked_mul(n).and_then(|x| x.checked_mul(MAX_QR));
        let (mut qp, mut s, mut pb) =
            (AlignedBuf::default(), AlignedBuf::default(), AlignedBuf::default());
        let pairs = if p.dot.is_some() { fb.bc.div_ceil(2) * MAX_QR } else { 0 };
        if !tiles(dk, fb.qt).is_some_and(|n| qp.try_grow(n))
            || !s.try_grow(fb.bc * MAX_QR)
            || !pb.try_grow(pairs)
        {
            return Err(Error::InvalidParameter {
                arg: "q",
                requirement: "the sizes imply a scratch buffer that cannot be allocated",
            });
        }
        Ok(Scratch {
            qp,
            s,
            pb,
            o: zeros("v", tiles(dv, fb.qt))?,
            save: zeros("v", tiles(dv, 1))?,
            by_row: zeros("q", tiles(dk.max(dv), 1))?,
            m: vec![0.0; fb.qt * MAX_QR],
            l: vec![0.0; fb.qt * MAX_QR],
            alpha: vec![0.0; MAX_QR],
            kb: convert(&p.k, dk, "k")?,
            vb: convert(&p.v, dv, "v")?,
            head: head_copy(p, gather, readers),
        })
    }
}

/// An empty [`HeadCopy`] when the problem's K/V views take one (see there) and `readers`
/// tasks read each head, with room reserved for a head's rows; `None` when they do not, or the
/// room cannot be reserved.
fn head_copy(p: &Problem<'_>, gather: bool, readers: usize) -> Option<HeadCopy> {
    let (attn_core::KvRef::F32(k), attn_core::KvRef::F32(v)) = (&p.k, &p.v) else {
        return None;
    };
    let consecutive = |t: &attn_core::TensorRef<'_, f32>| t.layout.matrix(0, 0).rows_consecutive();
    let (kn, vn) = (p.nk.checked_mul(p.dk)?, p.nk.checked_mul(p.dv)?);
    if gather
        || !worth_copying(readers)
        || (consecutive(k) && consecutive(v))
        || kn.checked_add(vn)?.checked_mul(4)? > HEAD_COPY_MAX
    {
        return None;
    }
    let (mut kc, mut vc) = (Vec::new(), Vec::new());
    (kc.try_reserve_exact(kn).is_ok() && vc.try_reserve_exact(vn).is_ok()).then_some(HeadCopy {
        head: None,
        copied: 0,
        k: kc,
        v: vc,
    })
}

/// Tasks of one query head: query tile groups of QT tiles each.
fn task_groups(isa: Isa, fb: FlashBlocking, nq: usize) -> usize {
    nq.div_ceil(fb.qt * tile_rows(isa))
}

/// How many flash tasks read each K/V head of a problem with `nq` queries and `group` query
/// heads per K/V head on `isa`: each reads the head's rows once.
pub(crate) fn readers(isa: Isa, nq: usize, group: usize) -> usize {
    task_groups(isa, FlashBlocking::for_isa(isa), nq).saturating_mul(group)
}

/// Whether a K/V head read by `readers` tasks is worth copying into consecutive rows, when its
/// rows are not (see [`HEAD_COPY_MIN_READERS`]).
pub(crate) fn worth_copying(readers: usize) -> bool {
    readers >= HEAD_COPY_MIN_READERS
}

/// Where a task's key and value blocks come from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'r, 'a> {
    /// The problem's own K/V views.
    Views,
    /// The pages of sequence `seq` of a checked paged cache: the problem is a piece of a paged
    /// batch ([`Problem::piece`], whose K/V views carry the shapes only).
    Pages {
        /// The cache.
        cache: &'r PagedKv<'a>,
        /// The sequence.
        seq: usize,
    },
}

/// Runs the flash loop over all tasks, writing through `sink`. Fails only when a thread's
/// scratch cannot be allocated ([`Scratch::new`]); rows written before that are unspecified.
pub(super) fn run(isa: Isa, p: &Problem<'_>, sink: &Sink<'_>, par: Parallelism) -> Result<()> {
    run_from(isa, p, sink, par, Source::Views)
}

/// [`run`] with the key and value blocks from `src`.
pub(crate) fn run_from(
    isa: Isa,
    p: &Problem<'_>,
    sink: &Sink<'_>,
    par: Parallelism,
    src: Source<'_, '_>,
) -> Result<()> {
    // dk = 0 or dv = 0 still has logsumexps (and dk = 0 still has outputs) to write.
    if p.nq == 0 {
        return Ok(());
    }
    let fb = FlashBlocking::for_isa(isa);
    let groups = task_groups(isa, fb, p.nq);
    // Bounded by the rows of the output or lse slice (see `Problem::trivial`).
    let tasks = p.batch.saturating_mul(p.hq).saturating_mul(groups);
    let task =
        |scr: &mut Scratch, t: usize| vectorize(isa, Task { p, sink, scr, t, groups, fb, src });
    let gather = matches!(src, Source::Pages { .. });
    let readers = groups.saturating_mul(p.group);
    if par.count() == 1 || tasks == 1 {
        let mut scr = Scratch::new(p, fb, gather, readers)?;
        (0..tasks).for_each(|t| task(&mut scr, t));
        Ok(())
    } else {
        par.install(|| {
            (0..tasks).into_par_iter().with_min_len(1).try_for_each_init(
                || Scratch::new(p, fb, gather, readers),
                |scr, t| {
                    task(scr.as_mut().map_err(|e| e.clone())?, t);
                    Ok(())
                },
            )
        })
    }
}

/// One task: query tiles `QT·(t mod groups) ..` (up to QT of them) of head `t / groups`.
struct Task<'r, 'p, 'a> {
    p: &'r Problem<'a>,
    sink: &'r Sink<'p>,
    scr: &'r mut Scratch,
    t: usize,
    groups: usize,
    fb: FlashBlocking,
    src: Source<'r, 'a>,
}

impl Kernel for Task<'_, '_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let Task { p, sink, scr, t, groups, fb, src } = self;
        let (qt, bc) = (fb.qt, fb.bc);
        let qr = QV * S::LANES;
        debug_assert!(qr <= MAX_QR);
        let (bh, g0) = (t / groups, (t % groups) * qt * qr);
        if g0 >= p.nq {
            return; // only if the caller's tiling disagrees with this ISA; nothing to do
        }
        let (b, h) = (bh / p.hq, bh % p.hq);
        let (dk, dv) = (p.dk, p.dv);
        let tiles = (p.nq - g0).min(qt * qr).div_ceil(qr);
        // Query rows `i0..i0 + rows` of tile u.
        let tile = |u: usize| (g0 + u * qr, (p.nq - g0 - u * qr).min(qr));

        let kh = h / p.group;
        let (keys, values, map) = match src {
            Source::Views => (p.keys(b, kh), p.values(b, kh), RowMap::Dense),
            Source::Pages { cache, seq } => paged_head(cache, seq, kh),
        };
        // The `vdpbf16ps` products: the kernel and the bf16 operands (`Problem::dot` is only set
        // when all three are bf16).
        let dot = match (p.dot, p.q, keys, values) {
            (Some(kern), AnyRef::BF16(q), KvAny::BF16(k), KvAny::BF16(v)) => Some((kern, q, k, v)),
            _ => None,
        };

        // 1. Packed, pre-scaled query tiles (unscaled bf16 pairs for `vdpbf16ps`); fresh
        //    online-softmax states.
        let qps = scr.qp.get(qt * dk * qr);
        let qm = matrix(p.q.layout(), b, h);
        for u in 0..tiles {
            let ((i0, rows), qp) = (tile(u), &mut qps[u * dk * qr..(u + 1) * dk * qr]);
            if rows < qr {
                qp.fill(0.0);
            }
            let (pack, tmp) = ((qm, i0, rows, dk, qr, p.scale2), &mut scr.by_row);
            match (dot, p.q) {
                (Some((_, q, _, _)), _) => query_pairs(q.data, (qm, i0, rows, dk, qr), qp),
                (None, AnyRef::F32(q)) => pack_tile(s, q.data, pack, tmp, qp),
                (None, AnyRef::BF16(q)) => pack_tile(s, q.data, pack, tmp, qp),
                (None, AnyRef::F16(q)) => pack_tile(s, q.data, pack, tmp, qp),
            }
        }
        scr.m[..tiles * qr].fill(f32::MIN);
        scr.l[..tiles * qr].fill(0.0);
        scr.o[..tiles * dv * qr].fill(0.0);

        // 2. Stream the visible key blocks; each block serves every tile of the task while it
        //    is in cache, and a tile stops at its own causal diagonal.
        let (i_last, rows_last) = tile(tiles - 1);
        let kend_task = p.key_end(i_last + rows_last - 1);
        let (keys, values) = match (&mut scr.head, keys, values) {
            (Some(hc), KvAny::F32(_), KvAny::F32(_)) => {
                if hc.head != Some((b, kh)) {
                    (hc.head, hc.copied) = (Some((b, kh)), 0);
                    hc.k.clear();
                    hc.v.clear();
                }
                if hc.copied < kend_task {
                    let (j0, n) = (hc.copied, kend_task - hc.copied);
                    hc.k.resize(kend_task * dk, 0.0);
                    hc.v.resize(kend_task * dv, 0.0);
                    keys.gather(s, j0, n, dk, &mut hc.k[j0 * dk..]);
                    values.gather(s, j0, n, dv, &mut hc.v[j0 * dv..]);
                    hc.copied = kend_task;
                }
                let rows = |data, d| KvAny::F32(Strided { data, offset: 0, rs: d, cs: 1 });
                (rows(&hc.k[..], dk), rows(&hc.v[..], dv))
            }
            _ => (keys, values),
        };
        let mut j0 = p.key_start(g0);
        while j0 < kend_task {
            let nb_task = (kend_task - j0).min(bc);
            // The block's K and V as f32: in place, or converted once for all the tiles (as
            // the keys of the block `js..je` a tile visits lie inside `j0..j0 + nb_task`); or
            // as bf16 pairs for `vdpbf16ps`.
            let mut blk = match dot {
                Some((kern, _, k, v)) => {
                    value_pairs(v, map, j0, nb_task, dv, &mut scr.vb);
                    let kp = key_pairs(k, map, j0, nb_task, dk, &mut scr.kb);
                    Block::Pairs { kern, k: kp, v: &scr.vb, finite: None }
                }
                None => Block::F32(
                    block_f32(s, keys, map, j0, nb_task, dk, &mut scr.kb),
                    block_f32(s, values, map, j0, nb_task, dv, &mut scr.vb),
                ),
            };
            for u in 0..tiles {
                let (i0, rows) = tile(u);
                // The tile's keys in this block, `js..je`: its causal diagonal or window trims
                // the block's end, a window's left edge its start (the task's tiles share its
                // blocks, but each starts at its own edge); blocks outside are skipped. Pairs
                // start at an even offset in the block: the key this may add lies before the
                // window of every row of the tile, so the mask drops it.
                let mut js = j0.max(p.key_start(i0));
                if let Block::Pairs { .. } = blk {
                    js -= (js - j0) % 2;
                }
                let je = (j0 + nb_task).min(p.key_end(i0 + rows - 1));
                if js >= je {
                    continue;
                }
                let nb = je - js;
                let sblk = ScoreBlock { b, h, i0, rows, j0: js, nb };
                if p.hides_block(sblk) {
                    continue;
                }
                let sb = scr.s.get(nb * qr);
                let qpu = &qps[u * dk * qr..(u + 1) * dk * qr];
                match blk {
                    Block::F32(kblk, _) => qk_block(s, qpu, dk, kblk.0, js - kblk.1, nb, sb),
                    Block::Pairs { kern, k, .. } => {
                        let a = (k.data, (js - j0) * k.rs, k.rs, 1);
                        let dkp = dk.div_ceil(2);
                        let b = &qpu[..dkp * qr];
                        scores(s, Product { kern, alpha: p.scale2, depth: dkp, a, b }, nb, sb);
                    }
                }
                if let Some(c) = p.variants.softcap {
                    softcap(s, sb, c);
                }
                p.apply_mask(s, sblk, qr, sb);
                p.apply_variants(sblk, qr, sb);
                let (m, lsum) =
                    (&mut scr.m[u * qr..(u + 1) * qr], &mut scr.l[u * qr..(u + 1) * qr]);
                let guard = softmax_step(s, sb, nb, m, lsum, &mut scr.alpha[..qr]);
                let oacc = &mut scr.o[u * dv * qr..(u + 1) * dv * qr];
                let (alpha, save) = (&scr.alpha, &mut scr.save);
                match blk {
                    Block::F32(_, (vm, vj)) => {
                        pv_block(s, guard, sb, nb, vm, js - vj, dv, alpha, oacc, save)
                    }
                    Block::Pairs { kern, v, ref mut finite, .. } => {
                        // Pair `w0 + w` of the block holds keys `js + 2w`, `js + 2w + 1`; an odd
                        // `nb` pads the last with a zero weight and a zero value. Zero weights
                        // need the guard only when the block holds a non-finite value (asked
                        // once per block, when a tile first has one: the causal diagonal).
                        let (w0, nbp) = ((js - j0) / 2, nb.div_ceil(2));
                        let guard = (guard || nb % 2 == 1)
                            && match *finite {
                                Some(f) => !f,
                                // A plain match, not `get_or_insert_with`: through its closure
                                // the scan ran out of line, without the ISA's vectors.
                                None => !*finite.insert(pairs_finite(v)),
                            };
                        let pb = scr.pb.get(nbp * qr);
                        prob_pairs(sb, nb, qr, pb);
                        let a = (v, w0 * dv, 1, dv);
                        let prod = Product { kern, alpha: 1.0, depth: nbp, a, b: pb };
                        let v_at = |j: usize, c: usize| value_pair_at(v, dv, 2 * w0 + j, c);
                        pv_update(s, guard, prod, sb, nb, v_at, dv, alpha, oacc, save);
                    }
                }
            }
            j0 += nb_task;
        }

        // 3. Normalise once and write, from the accumulator transposed to rows.
        for u in 0..tiles {
            let (i0, rows) = tile(u);
            let acc = &scr.o[u * dv * qr..(u + 1) * dv * qr];
            let by_row = &mut scr.by_row[..qr * dv];
            transpose_matrix(s, acc, (dv, qr, qr), by_row, dv);
            let mut out = sink.claim(b, h, i0, rows);
            for r in 0..rows {
                let row = &by_row[r * dv..(r + 1) * dv];
                let (inv, lse) = p.finish(h, scr.m[u * qr + r], scr.l[u * qr + r], sink.has_lse());
                out.write(s, r, lse, |d| row[d] * inv);
            }
        }
    }
}

/// One key block's K and V as the block products read them.
#[derive(Clone, Copy)]
enum Block<'t> {
    /// f32 matrices, each with the key of its row 0 ([`block_f32`]).
    F32((Strided<'t>, usize), (Strided<'t>, usize)),
    /// bf16 pairs for the `vdpbf16ps` kernel `kern`: K rows ([`key_pairs`]) and V pairs
    /// ([`value_pairs`]), both from the block's first key; `finite`: whether every value of
    /// the block is finite ([`pairs_finite`]), once a tile has asked.
    Pairs { kern: &'static GemmKernel, k: Strided<'t>, v: &'t [f32], finite: Option<bool> },
}

/// Packs query rows `i0..i0 + rows` of the `[nq, dk]` matrix `qm` of `data` into the tile
/// `qp` (`qp[d·QR + r]`), widened to f32 and pre-scaled ([`super::scale_query`]): row by row
/// into `tmp` ([`scale_row`]), then transposed by register blocks. Element-by-element packing
/// took 4 % of a d 64, N = 1024 call, and 5 % of the windowed tiles, which see few blocks
/// (perf journal, 2026-12-06 14:27 and 16:53).
#[inline(always)]
fn pack_tile<S: Simd, T: SimdElement>(
    s: S,
    data: &[T],
    (qm, i0, rows, dk, qr, scale): (attn_core::MatLayout, usize, usize, usize, usize, f32),
    tmp: &mut [f32],
    qp: &mut [f32],
) {
    for (r, out) in tmp[..rows * dk].chunks_exact_mut(dk.max(1)).enumerate() {
        scale_row(s, data, (qm, i0 + r, scale), out);
    }
    transpose_matrix(s, tmp, (rows, dk, dk), qp, qr);
}

/// Keys `j0..j0 + nb` (`n` columns) of a K or V matrix whose rows `map` maps as an f32
/// operand of the block products, and the key whose row is its row 0 (subtract it from key
/// indices): an f32 view matrix itself (any strides, key 0), or the block's rows of an f32
/// pool when they lie in one page (key `j0`); otherwise the rows converted into `buf` (sized
/// `BC·n` by [`Scratch::new`], key `j0`), page by page for a pool.
#[inline(always)]
fn block_f32<'t, S: Simd>(
    s: S,
    m: KvAny<'t>,
    map: RowMap<'_>,
    j0: usize,
    nb: usize,
    n: usize,
    buf: &'t mut [f32],
) -> (Strided<'t>, usize) {
    let gathered =
        |buf: &'t mut [f32]| (Strided { data: &buf[..nb * n], offset: 0, rs: n, cs: 1 }, j0);
    match (m, map) {
        (KvAny::F32(m), RowMap::Dense) => (m, 0),
        (m, RowMap::Dense) => {
            m.gather(s, j0, nb, n, buf);
            gathered(buf)
        }
        (m, RowMap::Paged { ps, .. }) => {
            if let KvAny::F32(f) = m {
                if map.one_run(j0, nb) {
                    // The pool holds the page's rows (checked): no overflow.
                    return (Strided { offset: f.offset + map.read_row(j0) * f.rs, ..f }, j0);
                }
            }
            let mut j = j0;
            while j < j0 + nb {
                let seg = (ps - j % ps).min(j0 + nb - j);
                m.gather(s, map.read_row(j), seg, n, &mut buf[(j - j0) * n..]);
                j += seg;
            }
            gathered(buf)
        }
    }
}

/// The online-softmax step of one tile over a block of `nb` masked scores `sb[j·QR + r]`,
/// per query lane: `m' = max(m, max_j S_j)`, `α = e^(m − m')`, `P_j = e^(S_j − m')` in place,
/// `l ← α·l + Σ_j P_j`, `m ← m'`. Returns whether some probability is 0 (a masked key, or one
/// that underflowed): [`pv_block`] must then guard against `0·∞` (see there). One `min` per
/// probability vector finds out, beside its exp, in the blocks that can hold a 0 (a score more
/// than 64 below the maximum, as a masked key's). The exp is the softmax's table exp (1.5
/// ULP) with the flush ([`weights`]); blocks that nothing flushes skip the clamp and the
/// flush, which change nothing there. `sb` holds at least `nb·QR` floats; only those are
/// touched.
#[inline(always)]
fn softmax_step<S: Simd>(
    s: S,
    sb: &mut [f32],
    nb: usize,
    m: &mut [f32],
    lsum: &mut [f32],
    alpha: &mut [f32],
) -> bool {
    let (l, qr) = (S::LANES, QV * S::LANES);
    let sb = &mut sb[..nb * qr];
    // The block's maximum and minimum of every query vector, in one pass over pairs of keys:
    // two chains per vector for each, so that the `max` latency is covered (a pass per vector
    // with the bounds checks of a strided index was 3.6 % of a d 64 call, perf journal
    // 2026-12-07 22:19).
    let mut his = [[s.splat(0.0); 2]; QV];
    let mut los = [[s.splat(f32::INFINITY); 2]; QV];
    for (v, h) in his.iter_mut().enumerate() {
        *h = [load(s, &m[v * l..]); 2];
    }
    let mut pairs = sb.chunks_exact(2 * qr);
    for pr in &mut pairs {
        for v in 0..QV {
            let (x, y) = (load(s, &pr[v * l..]), load(s, &pr[qr + v * l..]));
            (his[v][0], los[v][0]) = (s.max(his[v][0], x), s.min(los[v][0], x));
            (his[v][1], los[v][1]) = (s.max(his[v][1], y), s.min(los[v][1], y));
        }
    }
    for row in pairs.remainder().chunks_exact(qr) {
        for v in 0..QV {
            let x = load(s, &row[v * l..]);
            (his[v][0], los[v][0]) = (s.max(his[v][0], x), s.min(los[v][0], x));
        }
    }
    let mut pmin = [s.splat(1.0); QV];
    for (v, pm) in pmin.iter_mut().enumerate() {
        let at = v * l;
        let m_old = load(s, &m[at..]);
        let (m_new, lo) = (s.max(his[v][0], his[v][1]), s.min(los[v][0], los[v][1]));
        // A lane whose maximum reaches +∞ (an overflowed score or a +∞ bias) gives its weight
        // to its +∞ keys: those lanes take the scalar step below (rows off the supported range;
        // one store and a few compares per vector on the hot path).
        let mut mx = [0.0f32; MAX_QR];
        store(s, &mut mx, m_new);
        if mx[..l].contains(&f32::INFINITY) {
            if pos_inf_lanes(s, sb, nb, qr, at, m, lsum, alpha) {
                *pm = s.splat(0.0);
            }
            continue;
        }
        // When every `S_j − m'` of these lanes is at or above the flush threshold (no masked
        // key, no score 64 below the max: most blocks) the clamp and the flush of `weights`
        // change nothing, and are left out. A NaN score may drop out of `lo` (`min` keeps
        // either operand), but only in a query lane that holds the NaN, which comes out NaN
        // either way.
        let flush = {
            let mut d = [f32::NEG_INFINITY; MAX_QR];
            store(s, &mut d, s.sub(lo, m_new));
            !d[..l].iter().all(|v| *v >= FLUSH_WEIGHTS_BELOW)
        };
        // Four independent exps per step: one exp is a long chain of dependent operations,
        // and the scheduler overlaps only about two of them on its own.
        let (mut s0, mut s1) = (s.splat(0.0), s.splat(0.0));
        let mut quads = sb.chunks_exact_mut(4 * qr);
        for x in &mut quads {
            let d = [
                s.sub(load(s, &x[at..]), m_new),
                s.sub(load(s, &x[qr + at..]), m_new),
                s.sub(load(s, &x[2 * qr + at..]), m_new),
                s.sub(load(s, &x[3 * qr + at..]), m_new),
            ];
            // Without the flush every weight is at least about e^(−64): none is 0, and the
            // minimum is only tracked with it.
            let [e0, e1, e2, e3] = if flush {
                let e = weights(s, d);
                *pm = s.min(s.min(e[0], e[1]), s.min(s.min(e[2], e[3]), *pm));
                e
            } else {
                exp_neg_lut8_p3(s, d)
            };
            store(s, &mut x[at..], e0);
            store(s, &mut x[qr + at..], e1);
            store(s, &mut x[2 * qr + at..], e2);
            store(s, &mut x[3 * qr + at..], e3);
            s0 = s.add(s0, s.add(e0, e1));
            s1 = s.add(s1, s.add(e2, e3));
        }
        let mut sum = s.add(s0, s1);
        for x in quads.into_remainder().chunks_exact_mut(qr) {
            let [e] = weights(s, [s.sub(load(s, &x[at..]), m_new)]);
            store(s, &mut x[at..], e);
            sum = s.add(sum, e);
            *pm = s.min(e, *pm);
        }
        // The rescale factor is flushed like a weight (see `weights`).
        let [a] = weights(s, [s.sub(m_old, m_new)]);
        store(s, &mut alpha[at..], a);
        store(s, &mut m[at..], m_new);
        let l_new = s.fma(a, load(s, &lsum[at..]), sum);
        store(s, &mut lsum[at..], l_new);
    }
    let mut lanes = [1.0f32; MAX_QR];
    for (v, pm) in pmin.iter().enumerate() {
        store(s, &mut lanes[v * l..], *pm);
    }
    lanes[..qr].contains(&0.0)
}

/// [`softmax_step`] for the lanes `at..at + LANES` of which at least one reaches a `+∞`
/// maximum, one lane at a time: such a lane gives its `+∞` keys weight 1 each and everything
/// else 0 ([`pos_inf_weights`]), its earlier keys weight `α = 0` (or `α = 1` when its maximum
/// was already `+∞`); the other lanes take the ordinary step with the scalar exp. Returns
/// whether some probability is 0.
#[cold]
#[allow(clippy::too_many_arguments)]
fn pos_inf_lanes<S: Simd>(
    s: S,
    sb: &mut [f32],
    nb: usize,
    qr: usize,
    at: usize,
    m: &mut [f32],
    lsum: &mut [f32],
    alpha: &mut [f32],
) -> bool {
    let mut zero = false;
    for r in at..at + S::LANES {
        let m_old = m[r];
        let m_new = (0..nb).map(|j| sb[j * qr + r]).fold(m_old, |a, x| if x > a { x } else { a });
        let (a, sum) = if m_new == f32::INFINITY {
            let sum = pos_inf_weights(sb, nb, qr, r);
            (if m_old == f32::INFINITY { 1.0 } else { 0.0 }, sum)
        } else {
            let mut sum = 0.0f32;
            for j in 0..nb {
                let e = exp_rr2_p7_scalar(s, sb[j * qr + r] - m_new);
                sb[j * qr + r] = e;
                sum += e;
            }
            (exp_rr2_p7_scalar(s, m_old - m_new), sum)
        };
        zero |= (0..nb).any(|j| sb[j * qr + r] == 0.0);
        alpha[r] = a;
        m[r] = m_new;
        lsum[r] = a.mul_add(lsum[r], sum);
    }
    zero
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::tests::{assert_scaled, SCALES, SPECIAL_QUERIES};
    use attn_core::MatLayout;
    use half::{bf16, f16};

    /// [`pack_tile`] gives the bits of `scale_query` on each widened element, by vectors
    /// (contiguous rows) and element by element (a column stride, the tail), on every ISA this
    /// CPU runs: special values, products that underflow to ±0, scales of either sign and 0.
    #[test]
    fn packed_queries_are_scale_query_bit_for_bit() {
        struct Pack<'a, T> {
            data: &'a [T],
            qm: MatLayout,
            qr: usize,
            scale: f32,
        }
        impl<T: SimdElement> Kernel for Pack<'_, T> {
            type Output = Vec<f32>;
            fn run<S: Simd>(self, s: S) -> Vec<f32> {
                let (rows, dk) = (self.qm.rows, self.qm.cols);
                let (mut qp, mut tmp) = (vec![f32::NAN; dk * self.qr], vec![0.0; rows * dk]);
                let pack = (self.qm, 0, rows, dk, self.qr, self.scale);
                pack_tile(s, self.data, pack, &mut tmp, &mut qp);
                qp
            }
        }
        fn check<T: SimdElement>(from: fn(f32) -> T) {
            let data: Vec<T> =
                (0..40 * 70).map(|i| from(SPECIAL_QUERIES[(i * 7 + i / 13) % 15])).collect();
            // (rows, dk, row stride, column stride): whole vectors with a tail, whole
            // transposed blocks with edges, a column stride, a row shorter than a vector.
            let shapes = [
                (5, 37, 70, 1),
                (3, 64, 64, 1),
                (20, 40, 45, 1),
                (16, 32, 32, 1),
                (4, 9, 2, 5),
                (2, 3, 70, 1),
            ];
            for isa in Isa::supported() {
                for scale in SCALES {
                    for (rows, dk, rs, cs) in shapes {
                        let qm =
                            MatLayout { rows, cols: dk, row_stride: rs, col_stride: cs, offset: 1 };
                        let qr = rows + 2;
                        let got = vectorize(isa, Pack { data: &data, qm, qr, scale });
                        for r in 0..rows {
                            for d in 0..dk {
                                let x = data[qm.index(r, d)].widen();
                                let what = format_args!("{isa} ({rows}, {dk}, {cs})");
                                assert_scaled(got[d * qr + r], x, scale, what);
                            }
                        }
                    }
                }
            }
        }
        check(|x| x);
        check(bf16::from_f32);
        check(f16::from_f32);
    }
}
