//! Packed variable-length attention: the problem value [`VarlenAttention`], its work plan
//! (fixed query chunks of each sequence) and the split of the output among the threads.

use std::ops::Range;

use rayon::prelude::*;

use attn_core::batch::{packed_seq, SeqOffsets};
use attn_core::{
    check_attention, default_scale, expect_dim, Error, Mask, Result, Tensor4Layout, TensorMut,
    TensorRef, Variants,
};

use crate::arch::{self, Isa};
use crate::attention::{worth_copying, Attention, Path, HEAD_COPY_MAX};
use crate::par::Parallelism;

/// Queries per work item: a sequence longer than this is cut into chunks of this many queries
/// (its last chunk shorter), each one [`Attention`] call over the keys it may see. The cut
/// depends only on the sequence, never on the thread count, so results are bitwise the same
/// for every [`Parallelism`]. 256 rows are several flash query tiles (so a chunk keeps the
/// kernel's blocking), and a 4096-token sequence gives 16 items to balance.
pub const VARLEN_Q_CHUNK: usize = 256;

/// Attention over a packed batch of sequences of different lengths, FlashAttention's varlen
/// call: sequence `s` is queries `cu_q[s]..cu_q[s + 1]` of `q` against keys and values
/// `cu_k[s]..cu_k[s + 1]` of `k` and `v`, written to the same rows of the output.
///
/// Operands are packed views `q: [1, hq, total_q, dk]`, `k: [1, hkv, total_k, dk]`,
/// `v: [1, hkv, total_k, dv]`, output `o: [1, hq, total_q, dv]` (any strides; `[total, heads,
/// d]` storage is the strides `[0, d, heads·d, 1]`, see [`attn_core::batch`]); GQA when
/// `hkv < hq`. The settings are [`Attention`]'s, with the same defaults (scale `1/√dk`, no
/// mask, no logsumexp, sequential, the selected ISA, [`Path::Auto`], no variants), applied to
/// each sequence with its own sizes:
///
/// - the mask is [`Mask::None`] or [`Mask::Causal`]; the causal offset of sequence `s` is its
///   own, `nk_s − nq_s` by default (its queries are the last `nq_s` positions of its keys);
///   keep and bias masks are per-batch tensors that a packed call cannot take
///   (`InvalidParameter { arg: "mask" }`);
/// - variants measure from each sequence's offset; sinks and slopes are per query head;
/// - the logsumexps, when asked for, are `[hq, total_q]` row-major (FlashAttention's
///   `softmax_lse`).
///
/// Work: only the sequences' own rows (no padding); a sequence of `nq_s` queries is
/// `⌈nq_s / VARLEN_Q_CHUNK⌉` items, and a causal chunk visits only the keys up to its last
/// query's diagonal. The flash items of a sequence whose K/V rows are not consecutive
/// (token-major storage) and which read each K/V head at least 4 times run head by head, on a
/// copy of the head's keys and values in consecutive rows; flash's arithmetic does not depend
/// on the K/V layout, so this changes no bit. On one thread the sequences run in token order,
/// each copied one head at a time (memory: one head of one sequence, at most 16 MiB). With
/// several threads, when the output stores each token's rows apart from other tokens' (its
/// token stride exceeds the extent of one token's heads and values, as in `[total, heads, d]`
/// and `[batch·seq, heads, d]` storage), the output splits into one contiguous piece per item
/// and the items run in rounds, one K/V head a round: the round copies that head of the
/// sequences that run head by head (in groups of consecutive ones that fit together in
/// 16 MiB, a round per head and group), then the threads take their items largest first
/// (the other items, on all heads, in the first round). Otherwise (e.g. head-major
/// `[heads, total, d]` output) the items run one after another, each using the threads
/// itself. The result is the reference's
/// `attn_reference::batch::attention_varlen` within the attention bounds, and bitwise the same
/// for every thread count.
///
/// Errors, the reference's for the same arguments: an unsupported ISA; a keep or bias mask;
/// a batch other than 1; those of [`check_attention`] on the packed views; bad offsets
/// ([`SeqOffsets::new`]: empty, not starting at 0, decreasing); offsets whose totals differ
/// from the views' token counts or whose sequence counts differ (`ShapeMismatch` on
/// `cu_seqlens_q`/`cu_seqlens_k`); those of [`Variants::check`]. Nothing is written when a
/// check fails.
///
/// ```
/// use attn_kernels::batch::VarlenAttention;
/// use attn_kernels::{Mask, Tensor4Layout, TensorMut, TensorRef};
///
/// // Two sequences of 1 and 3 tokens, one head, d = 2, stored [total, heads, d].
/// let packed = |t| Tensor4Layout { dims: [1, 1, t, 2], strides: [0, 2, 2, 1], offset: 0 };
/// let (q, k) = (vec![0.0f32; 8], vec![0.0f32; 8]);
/// let v = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
/// let (cu, mut o) = ([0usize, 1, 4], vec![0.0f32; 8]);
/// VarlenAttention::new(
///     TensorRef::new(&q, packed(4)),
///     TensorRef::new(&k, packed(4)),
///     TensorRef::new(&v, packed(4)),
///     &cu,
///     &cu,
/// )
/// .mask(Mask::CAUSAL)
/// .run(TensorMut::new(&mut o, packed(4)))?;
/// // Equal scores: each query averages the values of its own sequence up to itself.
/// let want = [1.0, 2.0, 3.0, 4.0, 4.0, 5.0, 5.0, 6.0];
/// assert!(o.iter().zip(want).all(|(x, y)| (x - y).abs() < 1e-6), "{o:?}");
/// # Ok::<(), attn_kernels::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "an attention problem computes nothing until `run`"]
pub struct VarlenAttention<'a> {
    q: TensorRef<'a>,
    k: TensorRef<'a>,
    v: TensorRef<'a>,
    cu_q: &'a [usize],
    cu_k: &'a [usize],
    scale: Option<f32>,
    mask: Mask<'a>,
    lse: Option<&'a mut [f32]>,
    par: Parallelism,
    isa: Option<Isa>,
    path: Path,
    variants: Variants<'a>,
}

impl<'a> VarlenAttention<'a> {
    /// The problem over packed operands and their cumulative offsets `cu_q` (`cu_seqlens_q`)
    /// and `cu_k` (`cu_seqlens_k`), every setting at its default. Nothing is checked until
    /// [`run`](Self::run).
    pub fn new(
        q: TensorRef<'a>,
        k: TensorRef<'a>,
        v: TensorRef<'a>,
        cu_q: &'a [usize],
        cu_k: &'a [usize],
    ) -> Self {
        VarlenAttention {
            q,
            k,
            v,
            cu_q,
            cu_k,
            scale: None,
            mask: Mask::None,
            lse: None,
            par: Parallelism::Sequential,
            isa: None,
            path: Path::Auto,
            variants: Variants::NONE,
        }
    }

    /// The score scale (default `1/√dk`); any finite value.
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// [`Mask::None`] (the default) or [`Mask::Causal`], applied to each sequence.
    pub fn mask(mut self, mask: Mask<'a>) -> Self {
        self.mask = mask;
        self
    }

    /// Where to write the logsumexps: `hq·total_q` floats, `[hq, total_q]` row-major.
    pub fn lse(mut self, lse: &'a mut [f32]) -> Self {
        self.lse = Some(lse);
        self
    }

    /// How many threads the call may use (default [`Parallelism::Sequential`]).
    pub fn parallelism(mut self, par: Parallelism) -> Self {
        self.par = par;
        self
    }

    /// The ISA to run on (default [`arch::selected`]).
    pub fn isa(mut self, isa: Isa) -> Self {
        self.isa = Some(isa);
        self
    }

    /// The algorithm of each item (default [`Path::Auto`]: decode for items of at most 16
    /// queries, flash otherwise).
    pub fn path(mut self, path: Path) -> Self {
        self.path = path;
        self
    }

    /// The variants (default [`Variants::NONE`]), measured from each sequence's offset.
    pub fn variants(mut self, variants: Variants<'a>) -> Self {
        self.variants = variants;
        self
    }

    /// Checks the problem against the output `o: [1, hq, total_q, dv]` and computes it (see
    /// [`VarlenAttention`] for the errors). Nothing is written when a check fails.
    pub fn run(mut self, o: TensorMut<'_>) -> Result<()> {
        let isa = self.isa.unwrap_or_else(arch::selected).require()?;
        let scale = self.scale.unwrap_or_else(|| default_scale(self.q.layout.dims[3]));
        if !matches!(self.mask, Mask::None | Mask::Causal { .. }) {
            return Err(Error::InvalidParameter {
                arg: "mask",
                requirement: "packed and paged batches take no mask, or a causal one",
            });
        }
        expect_dim("q", "batch", 1, self.q.layout.dims[0])?;
        let lse = self.lse.take();
        let [_, hq, hkv, total_q, total_k, dk, dv] =
            check_attention(&self.q, &self.k, &self.v, scale, &self.mask, &o, lse.as_deref())?;
        let sq = SeqOffsets::new("cu_seqlens_q", self.cu_q)?;
        let sk = SeqOffsets::new("cu_seqlens_k", self.cu_k)?;
        expect_dim("cu_seqlens_q", "total", total_q, sq.total())?;
        expect_dim("cu_seqlens_k", "total", total_k, sk.total())?;
        expect_dim("cu_seqlens_k", "sequences", sq.count(), sk.count())?;
        self.variants.check(hq)?;
        if total_q == 0 {
            return Ok(());
        }
        let items = plan(&sq, &sk, &self.mask, &self.variants);
        let call = Call {
            q: self.q,
            k: self.k,
            v: self.v,
            scale,
            variants: self.variants,
            isa,
            path: self.path,
            heads: [hq, hkv],
            d: [dk, dv],
        };
        // The logsumexp rows of each item: its range of every head's row of `[hq, total_q]`.
        let mut lse_rows: Vec<Option<Vec<&mut [f32]>>> =
            items.iter().map(|_| lse.is_some().then(Vec::new)).collect();
        if let Some(lse) = lse {
            for row in lse.chunks_mut(total_q) {
                let (mut rest, mut at) = (row, 0);
                for (it, rows) in items.iter().zip(&mut lse_rows) {
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(it.q.start - at);
                    let (mine, tail) = tail.split_at_mut(it.q.len());
                    if let Some(rows) = rows {
                        rows.push(mine);
                    }
                    (rest, at) = (tail, it.q.end);
                }
            }
        }
        let layout = o.layout;
        if self.par.count() == 1 {
            return call.sequential(&items, lse_rows, o);
        }
        if items.len() < 2 || !token_major(&layout) {
            for (it, rows) in items.iter().zip(lse_rows) {
                let out = TensorMut::new(&mut *o.data, packed_seq(&layout, it.q.clone()));
                call.item(it, 0..hq, None, out, rows, self.par)?;
            }
            return Ok(());
        }
        // One contiguous piece of the output per item: items are in token order, disjoint,
        // and a token's rows lie within its token stride (`token_major`), so tokens `t0..t1`
        // own elements `offset + t0·st .. offset + t1·st` (cut at the slice's end).
        let (st, len) = (layout.strides[2], o.data.len());
        let (mut rest, mut at) = (o.data, 0usize);
        let copied = call.copied(&items);
        let mut tasks = Vec::with_capacity(items.len());
        for ((it, lse), group) in items.iter().zip(lse_rows).zip(copied.group) {
            let lo = layout.offset + it.q.start * st;
            let hi = (layout.offset + it.q.end * st).min(len);
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(lo - at);
            let (mine, tail) = tail.split_at_mut(hi - lo);
            (rest, at) = (tail, hi);
            let piece = Tensor4Layout { dims: [1, hq, it.q.len(), dv], offset: 0, ..layout };
            tasks.push(Task { it, out: TensorMut::new(mine, piece), lse, group });
        }
        self.par.install(|| call.rounds(&mut tasks, &copied.groups))
    }
}

/// One item of the threaded split: its piece of the output, its logsumexp rows, and the
/// group of copies it runs on, head by head ([`Call::rounds`]), if any.
struct Task<'i, 'o> {
    it: &'i Item,
    out: TensorMut<'o>,
    lse: Option<Vec<&'o mut [f32]>>,
    group: Option<usize>,
}

/// Which items of a threaded call read copies ([`Call::copied`]).
struct Copied {
    /// Per item: the group whose copies it reads, if any.
    group: Vec<Option<usize>>,
    /// Per group: the keys of its sequences, in token order, one head of them within
    /// [`HEAD_COPY_MAX`] bytes.
    groups: Vec<Vec<Range<usize>>>,
}

/// One work item: packed queries `q` against packed keys `k` (already cut at the causal
/// diagonal of the last query), with the mask that gives those queries their sequence's
/// offset.
#[derive(Debug)]
struct Item {
    seq: usize,
    q: Range<usize>,
    k: Range<usize>,
    mask: Mask<'static>,
}

impl Item {
    /// The item's work, for balancing: `nq·nk` (saturating).
    fn work(&self) -> usize {
        self.q.len().saturating_mul(self.k.len())
    }
}

/// The items of a batch, in token order: each non-empty sequence cut into chunks of
/// [`VARLEN_Q_CHUNK`] queries. A causal chunk starting at query `a` of its sequence is the
/// causal mask of offset `off_s + a` (then its query `i − a` sees key `j` iff
/// `j ≤ i + off_s`, as in the whole sequence). Not cut: a sequence without a causal mask
/// whose variants measure from the offset (window, ALiBi: a chunk's default offset would
/// differ), and one whose chunk offsets would overflow `isize`.
fn plan(
    sq: &SeqOffsets<'_>,
    sk: &SeqOffsets<'_>,
    mask: &Mask<'_>,
    var: &Variants<'_>,
) -> Vec<Item> {
    let mut items = Vec::new();
    for s in 0..sq.count() {
        let (rq, rk) = (sq.range(s), sk.range(s));
        let (nq, nk) = (rq.len(), rk.len());
        if nq == 0 {
            continue;
        }
        let whole = |mask| Item { seq: s, q: rq.clone(), k: rk.clone(), mask };
        let off = match *mask {
            Mask::Causal { offset } => Mask::causal_offset(offset, nq, nk),
            _ if var.window.is_some() || var.alibi.is_some() => {
                items.push(whole(Mask::None));
                continue;
            }
            _ => {
                for a in (0..nq).step_by(VARLEN_Q_CHUNK) {
                    let b = (a + VARLEN_Q_CHUNK).min(nq);
                    items.push(Item {
                        seq: s,
                        q: rq.start + a..rq.start + b,
                        k: rk.clone(),
                        mask: Mask::None,
                    });
                }
                continue;
            }
        };
        if isize::try_from(nq).ok().and_then(|n| off.checked_add(n)).is_none() {
            items.push(whole(Mask::Causal { offset: Some(off) }));
            continue;
        }
        for a in (0..nq).step_by(VARLEN_Q_CHUNK) {
            let b = (a + VARLEN_Q_CHUNK).min(nq);
            let chunk_off = off + a as isize;
            // Keys past the last query's diagonal, `b − 1 + off`, are never visible.
            let end = (b as i128 + off as i128).clamp(0, nk as i128) as usize;
            items.push(Item {
                seq: s,
                q: rq.start + a..rq.start + b,
                k: rk.start..rk.start + end,
                mask: Mask::Causal { offset: Some(chunk_off) },
            });
        }
    }
    items
}

/// True when every token's rows of `o: [1, heads, total, d]` lie within its token stride
/// (`(heads − 1)·st_h + (d − 1)·st_d < st_t`), with at least one element per token: then
/// tokens `t0..t1` own the contiguous elements `offset + t0·st_t .. offset + t1·st_t`.
fn token_major(o: &Tensor4Layout) -> bool {
    let [_, heads, _, d] = o.dims;
    let [_, sh, st, sd] = o.strides;
    let extent = (heads.checked_sub(1), d.checked_sub(1));
    match extent {
        (Some(h), Some(d)) => h
            .checked_mul(sh)
            .zip(d.checked_mul(sd))
            .and_then(|(a, b)| a.checked_add(b))
            .is_some_and(|e| e < st),
        _ => false,
    }
}

/// What every item of one call shares.
struct Call<'a> {
    q: TensorRef<'a>,
    k: TensorRef<'a>,
    v: TensorRef<'a>,
    scale: f32,
    variants: Variants<'a>,
    isa: Isa,
    path: Path,
    /// `[hq, hkv]`.
    heads: [usize; 2],
    /// `[dk, dv]`.
    d: [usize; 2],
}

impl<'a> Call<'a> {
    /// Query heads per K/V head (1 when there are no heads: checked non-zero otherwise).
    fn group(&self) -> usize {
        (self.heads[0] / self.heads[1].max(1)).max(1)
    }

    /// Runs one item on query heads `heads` (and their K/V heads) into its output view
    /// `o: [1, hq, n, dv]` (all heads), and its logsumexps into `lse` (one slice of `n`
    /// entries per head of `heads`) when given. The keys and values come from `copy` (one K/V
    /// head, holding the item's keys) when given, from the packed views otherwise.
    fn item(
        &self,
        it: &Item,
        heads: Range<usize>,
        copy: Option<&KvCopy>,
        o: TensorMut<'_>,
        lse: Option<Vec<&mut [f32]>>,
        par: Parallelism,
    ) -> Result<()> {
        let group = self.group();
        let kv_heads = heads.start / group..heads.end / group;
        let view = |t: &TensorRef<'a>, tokens: Range<usize>, heads: Range<usize>| {
            TensorRef::new(t.data, head_range(packed_seq(&t.layout, tokens), heads))
        };
        let (k, v) = match copy.and_then(|c| c.kv(it.k.clone())) {
            Some(kv) => kv,
            None => (
                view(&self.k, it.k.clone(), kv_heads.clone()),
                view(&self.v, it.k.clone(), kv_heads),
            ),
        };
        let q = view(&self.q, it.q.clone(), heads.clone());
        let o = TensorMut::new(o.data, head_range(o.layout, heads.clone()));
        // Sinks and slopes are per query head (`hq` of them, checked).
        let per_head = |x: Option<&'a [f32]>| x.map(|x| x.get(heads.clone()).unwrap_or(&[]));
        let mut variants = self.variants;
        (variants.sinks, variants.alibi) = (per_head(variants.sinks), per_head(variants.alibi));
        let attention = Attention::new(q, k, v)
            .scale(self.scale)
            .mask(it.mask)
            .variants(variants)
            .isa(self.isa)
            .path(self.path)
            .parallelism(par);
        let Some(rows) = lse else { return attention.run(o) };
        let n = it.q.len();
        let mut part = vec![0.0f32; heads.len() * n];
        attention.lse(&mut part).run(o)?;
        for (row, got) in rows.into_iter().zip(part.chunks_exact(n)) {
            row.copy_from_slice(got);
        }
        Ok(())
    }

    /// Runs the items one after another on this thread, sequence by sequence
    /// ([`run_seq`](Self::run_seq)).
    fn sequential(
        &self,
        items: &[Item],
        mut lse: Vec<Option<Vec<&mut [f32]>>>,
        mut o: TensorMut<'_>,
    ) -> Result<()> {
        let (mut copy, mut at) = (KvCopy::default(), 0);
        for its in sequences(items) {
            let end = at + its.len();
            self.run_seq(its, &mut lse[at..end], &mut o, 0, &mut copy)?;
            at = end;
        }
        Ok(())
    }

    /// Runs consecutive items `its` of one sequence one after another on this thread, into
    /// `o` (whose token 0 is packed token `t0`) and their logsumexp rows `lse`. When the K/V
    /// rows are not consecutive and the flash items read each K/V head at least 4 times
    /// ([`head_by_head`](Self::head_by_head)), those run head by head: each K/V head's rows
    /// are copied into consecutive rows once (into `copy`, [`KvCopy`]), then all the flash
    /// items run on that head and its query heads, the head's keys still in cache from the
    /// item before; the other items (a decode tail) first run as they would alone. Otherwise
    /// the items run one by one, all heads at once, reading in place.
    fn run_seq(
        &self,
        its: &[Item],
        lse: &mut [Option<Vec<&mut [f32]>>],
        o: &mut TensorMut<'_>,
        t0: usize,
        copy: &mut KvCopy,
    ) -> Result<()> {
        let ([hq, hkv], group, seq) = (self.heads, self.group(), Parallelism::Sequential);
        if !self.head_by_head(its) {
            for (it, rows) in its.iter().zip(lse) {
                self.item(it, 0..hq, None, item_out(o, it, t0), rows.take(), seq)?;
            }
            return Ok(());
        }
        for (it, rows) in its.iter().zip(lse.iter_mut()).filter(|(it, _)| !self.on_copy(it)) {
            self.item(it, 0..hq, None, item_out(o, it, t0), rows.take(), seq)?;
        }
        for kh in 0..hkv {
            let copied = copy.fill(&self.k, &self.v, kh, &[keys(its)], self.d, false);
            let heads = kh * group..(kh + 1) * group;
            for (it, rows) in its.iter().zip(lse.iter_mut()).filter(|(it, _)| self.on_copy(it)) {
                let (c, lse) = (copied.then_some(&*copy), head_rows(rows, heads.clone()));
                self.item(it, heads.clone(), c, item_out(o, it, t0), lse, seq)?;
            }
        }
        Ok(())
    }

    /// The items that a threaded call runs on copies: the flash items of the sequences that
    /// run head by head ([`head_by_head`](Self::head_by_head)), in groups of consecutive such
    /// sequences whose one head of keys and values fits in [`HEAD_COPY_MAX`] bytes together.
    fn copied(&self, items: &[Item]) -> Copied {
        let (mut group, mut groups) = (vec![None; items.len()], Vec::<Vec<Range<usize>>>::new());
        let (mut bytes, mut end) = (0usize, 0);
        for its in sequences(items) {
            end += its.len();
            let (Some(more), true) = (self.head_bytes(its), self.head_by_head(its)) else {
                continue;
            };
            // Both at most `HEAD_COPY_MAX` (`head_by_head`), so no overflow.
            if groups.is_empty() || bytes + more > HEAD_COPY_MAX {
                groups.push(Vec::new());
                bytes = 0;
            }
            bytes += more;
            let g = groups.len() - 1;
            groups[g].push(keys(its));
            for (slot, it) in group[end - its.len()..end].iter_mut().zip(its) {
                *slot = self.on_copy(it).then_some(g);
            }
        }
        Copied { group, groups }
    }

    /// Runs a threaded call's items (`tasks`, one output piece each) on the threads of the
    /// current pool, in rounds: for each group of copied sequences (`groups`, see
    /// [`copied`](Self::copied)) one round a K/V head, which copies that head's keys and
    /// values of the group's sequences (keys and values by two tasks), then runs the group's
    /// items on that head and its query heads. The first round also runs the other items, on
    /// all heads, in place; without copies it is the only round. A round's tasks run largest
    /// first, each taken by whichever thread is free.
    fn rounds(&self, tasks: &mut [Task<'_, '_>], groups: &[Vec<Range<usize>>]) -> Result<()> {
        let ([hq, hkv], group, seq) = (self.heads, self.group(), Parallelism::Sequential);
        // A copied item's work a round, against another item's on all heads in the first.
        let weight =
            |t: &Task<'_, '_>| t.it.work().saturating_mul(if t.group.is_some() { 1 } else { hkv });
        tasks.sort_by_key(|t| std::cmp::Reverse(weight(t)));
        let mut copy = KvCopy::default();
        let rounds: Vec<(Option<usize>, usize)> = match groups.len() {
            0 => vec![(None, 0)],
            n => (0..n).flat_map(|g| (0..hkv).map(move |kh| (Some(g), kh))).collect(),
        };
        for (round, &(g, kh)) in rounds.iter().enumerate() {
            let filled =
                g.is_some_and(|g| copy.fill(&self.k, &self.v, kh, &groups[g], self.d, true));
            let (heads, c) = (kh * group..(kh + 1) * group, filled.then_some(&copy));
            let mine = |t: &&mut Task<'_, '_>| match t.group {
                Some(_) => t.group == g,
                None => round == 0,
            };
            let next = std::sync::Mutex::new(tasks.iter_mut().filter(mine));
            let workers = rayon::current_num_threads();
            (0..workers).into_par_iter().with_max_len(1).try_for_each(|_| loop {
                let task = next.lock().unwrap_or_else(|e| e.into_inner()).next();
                let Some(t) = task else { return Ok(()) };
                let o = TensorMut { data: &mut *t.out.data, layout: t.out.layout };
                if t.group.is_some() {
                    let lse = head_rows(&mut t.lse, heads.clone());
                    self.item(t.it, heads.clone(), c, o, lse, seq)?;
                } else {
                    self.item(t.it, 0..hq, None, o, t.lse.take(), seq)?;
                }
            })?;
        }
        Ok(())
    }

    /// The bytes of one K/V head's keys and values that consecutive items `its` of one
    /// sequence read ([`keys`]), `None` past `usize`.
    fn head_bytes(&self, its: &[Item]) -> Option<usize> {
        let nk = keys(its).len();
        self.d[0].checked_add(self.d[1]).and_then(|d| d.checked_mul(nk)?.checked_mul(4))
    }

    /// Whether item `it` runs on flash, so on a head's copy when its sequence runs head by
    /// head (the items on another path, a decode tail, run as they would alone).
    fn on_copy(&self, it: &Item) -> bool {
        self.path.flash_reads(self.isa, it.q.len(), self.group()).is_some()
    }

    /// Whether a sequence's items `its` run head by head with its K/V rows copied (see
    /// [`run_seq`](Self::run_seq)): the rows are not consecutive, one head's keys and values
    /// fit in [`HEAD_COPY_MAX`] bytes, and the flash items read each K/V head often enough
    /// ([`Path::flash_reads`], [`worth_copying`]).
    fn head_by_head(&self, its: &[Item]) -> bool {
        let consecutive = |t: &TensorRef<'_>| t.layout.matrix(0, 0).rows_consecutive();
        let bytes = self.head_bytes(its);
        if self.heads[1] == 0 || (consecutive(&self.k) && consecutive(&self.v)) {
            return false;
        }
        let reads = its.iter().fold(0usize, |r, it| {
            r.saturating_add(self.path.flash_reads(self.isa, it.q.len(), self.group()).unwrap_or(0))
        });
        bytes.is_some_and(|b| b > 0 && b <= HEAD_COPY_MAX) && worth_copying(reads)
    }
}

/// `layout: [1, heads, n, d]` cut to heads `heads` (the offset moved only when the cut view
/// has elements, which the checked view then holds).
fn head_range(layout: Tensor4Layout, heads: Range<usize>) -> Tensor4Layout {
    let [b, _, n, d] = layout.dims;
    let empty = b == 0 || heads.is_empty() || n == 0 || d == 0;
    Tensor4Layout {
        dims: [b, heads.len(), n, d],
        offset: if empty { layout.offset } else { layout.offset + heads.start * layout.strides[1] },
        ..layout
    }
}

/// The items of each sequence, in token order (a sequence's items are consecutive, `plan`).
fn sequences(items: &[Item]) -> impl Iterator<Item = &[Item]> {
    items.chunk_by(|a, b| a.seq == b.seq)
}

/// The keys that consecutive items `its` of one sequence read: every item starts at its
/// sequence's first key (`plan`).
fn keys(its: &[Item]) -> Range<usize> {
    let start = its.first().map_or(0, |it| it.k.start);
    start..its.iter().map(|it| it.k.end).max().unwrap_or(start)
}

/// Item `it`'s rows of `o`, whose token 0 is packed token `t0`.
fn item_out<'o>(o: &'o mut TensorMut<'_>, it: &Item, t0: usize) -> TensorMut<'o> {
    let l = packed_seq(&o.layout, it.q.start - t0..it.q.end - t0);
    TensorMut { data: &mut *o.data, layout: l }
}

/// The logsumexp rows of query heads `heads` of an item's rows (one per query head), when
/// it has them.
fn head_rows<'r>(
    rows: &'r mut Option<Vec<&mut [f32]>>,
    heads: Range<usize>,
) -> Option<Vec<&'r mut [f32]>> {
    rows.as_mut().map(|r| r[heads].iter_mut().map(|x| &mut **x).collect())
}

/// One K/V head's keys and values of some sequences (each a range of keys), copied into
/// consecutive rows (`k: [n, dk]`, `v: [n, dv]`, the ranges one after another), for packed
/// views whose rows are not (token-major `[total, heads, d]` storage, a head's rows `heads·d`
/// apart). The items of a sequence are [`Attention`] calls of a few tasks a head each, too
/// few for flash's own head copy, so each would read the rows from L3 in place. Flash's
/// arithmetic is the same either way; decode's is not (its block size depends on the rows'
/// stride), so decode items never read a copy. One buffer serves every head that a call runs
/// (perf journal, 2026-12-07 01:38).
#[derive(Default)]
struct KvCopy {
    /// The ranges of keys copied (tokens of the packed K/V views), in token order, and the
    /// row of the copy where each starts.
    ranges: Vec<(Range<usize>, usize)>,
    /// Keys copied.
    n: usize,
    /// `[dk, dv]`.
    d: [usize; 2],
    k: Vec<f32>,
    v: Vec<f32>,
}

impl KvCopy {
    /// Copies keys `ranges` (in token order, disjoint) of K/V head `kh` of the packed views
    /// `k` and `v` (`[dk, dv]` wide), the keys and the values by two tasks of the current pool
    /// when `par`; false when the room cannot be allocated (then the copy holds no keys).
    fn fill(
        &mut self,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        kh: usize,
        ranges: &[Range<usize>],
        d: [usize; 2],
        par: bool,
    ) -> bool {
        self.ranges.clear();
        self.d = d;
        self.n = 0;
        for r in ranges {
            self.ranges.push((r.clone(), self.n));
            self.n += r.len();
        }
        let n = self.n;
        let one = |src: &TensorRef<'_>, dst: &mut Vec<f32>, d: usize| {
            dst.clear();
            if dst.try_reserve_exact(n * d).is_err() {
                return false;
            }
            let m = src.layout.matrix(0, kh);
            for t in ranges.iter().flat_map(|r| r.clone()).filter(|_| d > 0) {
                let at = m.index(t, 0);
                if m.col_stride == 1 {
                    dst.extend_from_slice(&src.data[at..at + d]);
                } else {
                    dst.extend((0..d).map(|c| src.data[at + c * m.col_stride]));
                }
            }
            true
        };
        let (kd, vd) = (&mut self.k, &mut self.v);
        let (a, b) = if par {
            rayon::join(|| one(k, kd, d[0]), || one(v, vd, d[1]))
        } else {
            (one(k, kd, d[0]), one(v, vd, d[1]))
        };
        if !(a && b) {
            self.ranges.clear();
            self.n = 0;
        }
        a && b
    }

    /// Keys `range` (tokens of the packed views) and their values, as `[1, 1, len, dk]` and
    /// `[1, 1, len, dv]` views, when they lie within one range copied.
    fn kv(&self, range: Range<usize>) -> Option<(TensorRef<'_>, TensorRef<'_>)> {
        let i = self.ranges.partition_point(|(r, _)| r.start <= range.start).checked_sub(1)?;
        let (r, row) = &self.ranges[i];
        if range.end > r.end {
            return None;
        }
        let row = row + (range.start - r.start);
        let view = |d: usize| Tensor4Layout {
            dims: [1, 1, range.len(), d],
            strides: [0, self.n * d, d, 1],
            offset: row * d,
        };
        Some((TensorRef::new(&self.k, view(self.d[0])), TensorRef::new(&self.v, view(self.d[1]))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which sequences run head by head with their rows copied, and the copies' rows:
    /// token-major K/V of sequences whose items read each K/V head at least 4 times are
    /// copied row for row; a short sequence (one task a query head), a decode sequence (one
    /// query) and head-major K/V are not.
    #[test]
    fn long_token_major_sequences_run_head_by_head_on_copies() {
        let (hkv, hq, dk, dv) = (2usize, 4usize, 3usize, 5usize);
        let (cu_q, cu_k) = ([0usize, 700, 717, 718, 1018], [0usize, 700, 717, 1317, 1617]);
        let tk = cu_k[4];
        let sk = SeqOffsets::new("cu_seqlens_k", &cu_k).unwrap();
        let sq = SeqOffsets::new("cu_seqlens_q", &cu_q).unwrap();
        let layout = |d: usize, token: bool| Tensor4Layout {
            dims: [1, hkv, tk, d],
            strides: if token { [0, d, hkv * d, 1] } else { [0, tk * d, d, 1] },
            offset: 0,
        };
        let kd: Vec<f32> = (0..tk * hkv * dk).map(|x| x as f32).collect();
        let vd: Vec<f32> = (0..tk * hkv * dv).map(|x| -(x as f32)).collect();
        let items = plan(&sq, &sk, &Mask::CAUSAL, &Variants::NONE);
        for (token, want) in [(true, [true, false, false, true]), (false, [false; 4])] {
            let (k, v) =
                (TensorRef::new(&kd, layout(dk, token)), TensorRef::new(&vd, layout(dv, token)));
            let call = Call {
                q: k,
                k,
                v,
                scale: 1.0,
                variants: Variants::NONE,
                isa: arch::selected(),
                path: Path::Auto,
                heads: [hq, hkv],
                d: [dk, dv],
            };
            for (s, want) in want.into_iter().enumerate() {
                // A sequence's items are consecutive.
                let at = items.iter().position(|it| it.seq == s).unwrap();
                let its = &items[at..at + items.iter().filter(|it| it.seq == s).count()];
                assert_eq!(call.head_by_head(its), want, "seq {s} token-major {token}");
            }
            // A threaded call copies the flash items' sequences, all of them at once.
            let copied = call.copied(&items);
            let want: Vec<Option<usize>> =
                items.iter().map(|it| (token && [0, 3].contains(&it.seq)).then_some(0)).collect();
            assert_eq!(copied.group, want, "token-major {token}");
            let ranges = if token { vec![sk.range(0), sk.range(3)] } else { vec![] };
            let groups = if token { vec![ranges.clone()] } else { vec![] };
            assert_eq!(copied.groups, groups);
            // A group's copy holds one head of its sequences within `HEAD_COPY_MAX`: at
            // 20 000 bytes a key, the 700 keys of sequence 0 fit, not the 300 more of
            // sequence 3, which starts a second group.
            let wide = Call { d: [2500, 2500], ..call }.copied(&items);
            let groups: Vec<Vec<_>> = ranges.iter().map(|r| vec![r.clone()]).collect();
            assert_eq!(wide.groups, groups);
            let second: Vec<Option<usize>> = want
                .iter()
                .zip(&items)
                .map(|(w, it)| w.map(|_| usize::from(it.seq == 3)))
                .collect();
            assert_eq!(wide.group, second);
            let mut copy = KvCopy::default();
            for kh in 0..hkv {
                assert!(copy.fill(&k, &v, kh, &ranges, [dk, dv], kh == 1));
                for (i, it) in items.iter().enumerate() {
                    let Some((ck, cv)) = copy.kv(it.k.clone()) else {
                        assert!(copied.group[i].is_none(), "item {i} not in the copy");
                        continue;
                    };
                    assert!(token && [0, 3].contains(&it.seq), "item {i} in the copy");
                    for (j, t) in it.k.clone().enumerate() {
                        for e in 0..dk {
                            assert_eq!(ck.at(0, 0, j, e), k.at(0, kh, t, e));
                        }
                        for e in 0..dv {
                            assert_eq!(cv.at(0, 0, j, e), v.at(0, kh, t, e));
                        }
                    }
                }
                // Keys past a copied range are not in the copy.
                assert!(copy.kv(0..701).is_none() && copy.kv(700..717).is_none());
            }
        }
    }
}
