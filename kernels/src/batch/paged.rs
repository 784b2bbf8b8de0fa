//! Attention over a paged K/V cache: the problem value [`PagedAttention`] and its work plan
//! (one piece per sequence with queries), run by the decode path (up to [`PAGED_Q_PIECE`]
//! queries) or the flash path (chunked prefill), both reading the pages in place.

use attn_core::batch::{PagePool, PagedKv, SeqOffsets};
use attn_core::{
    check_attention_any, default_scale, expect_dim, AnyMut, AnyRef, Error, KvRef, Mask, Result,
    Tensor4Layout, TensorRef, Variants,
};

use crate::arch::{self, Isa};
use crate::attention::{dot_kernel, run_paged, PagedPiece};
use crate::gemm::HalfPath;
use crate::par::Parallelism;

/// Most queries of a sequence that the decode path runs: a sequence with more new queries
/// (chunked prefill) runs on the flash path. 16 is where
/// [`Path::Auto`](crate::attention::Path::Auto) leaves the decode path for the flash one. The
/// choice depends only on the sequence, never on the thread count.
pub const PAGED_Q_PIECE: usize = crate::attention::DECODE_MAX_Q;

/// Attention of packed queries against a paged K/V cache (vLLM's PagedAttention): sequence `b`
/// is queries `cu_q[b]..cu_q[b + 1]` of `q` against the `cache.seq_lens[b]` keys and values
/// it holds in its pages, written to the same rows of the output. Decode is one query per
/// sequence; chunked prefill is several (the new tokens, whose K/V were already appended with
/// [`append_kv`](super::append_kv)).
///
/// Operands: `q: [1, hq, total_q, cache.dk]` and the output `o: [1, hq, total_q, cache.dv]`,
/// packed views of any strides (see [`attn_core::batch`]), each f32, bf16 or f16 (an
/// [`AnyRef`] / [`AnyMut`]: `q` widened exactly, each output value the f32 result rounded once
/// to nearest even, as dense attention does); the cache's pools
/// `[num_pages, page_size, kv_heads, d]` and block table ([`PagedKv`]), each pool f32, bf16,
/// f16 or int8 with block scales ([`PagePool`]; keys and values
/// may differ); GQA when `kv_heads < hq`. The semantics are those of dense attention on the
/// values the stored elements represent (widened exactly; `q·scale` for int8, computed in f32
/// as the dense decode path does). The settings are [`VarlenAttention`](super::VarlenAttention)'s, with the
/// same defaults (scale `1/√dk`, no mask, no logsumexp, sequential, the selected ISA, no
/// variants), applied to each sequence with its own sizes:
///
/// - the mask is [`Mask::None`] or [`Mask::Causal`]; the causal offset of sequence `b` is
///   `seq_lens[b] − nq_b` by default (its queries are the last `nq_b` positions of its keys);
/// - variants (window, softcap, sinks, ALiBi) measure from each sequence's offset;
/// - the logsumexps, when asked for, are `[hq, total_q]` row-major.
///
/// Work: the pages are read in place, never gathered into a dense copy of the cache. A
/// sequence of at most [`PAGED_Q_PIECE`] queries (decode) runs on the decode path: its rows
/// (its queries times the query heads of a GQA group) share each key and value row read, in
/// the pages' type (when keys and values share it; of two types, each 16-key block of a page
/// is converted into f32 as it is read), its keys are split into chunks of a length fixed by
/// the keys it may see (as [`Attention`](crate::attention::Attention)'s decode path), and the
/// chunks of every such sequence are the tasks the threads share. A key block of 16 lies in
/// one page (page sizes are powers of two from 16), so its rows are consecutive slots of that
/// page. A sequence with more queries (chunked prefill) runs on the flash path, one sequence
/// after another, its tasks shared by the threads: each key block of the flash loop is read
/// in place when it lies in one page of an f32 pool, else converted page by page into
/// per-thread scratch (as the flash path converts any K/V that is not f32). The result is the reference's
/// `attn_reference::batch::attention_paged` (on f32 pools of the represented values) within
/// the attention bounds, and bitwise the same for every thread count.
///
/// Errors, the reference's for the same arguments: an unsupported ISA; those of
/// [`PagedKv::check`] (page size, pools and int8 scale pools, block table, a sequence past its
/// row, a page outside the pool); a keep or bias mask; a batch other than 1; those of
/// [`check_attention`](attn_core::check_attention) on the packed views (with the cache's heads
/// and widths); bad offsets ([`SeqOffsets::new`]), a total other than `total_q` or a sequence
/// count other than the cache's (`ShapeMismatch` on `cu_seqlens_q`); those of
/// [`Variants::check`]; then [`half_path`](Self::half_path)'s.
/// Nothing is written when a check fails.
///
/// ```
/// use attn_kernels::batch::{PagePool, PagedAttention, PagedKv};
/// use attn_kernels::{Mask, Tensor4Layout, TensorMut, TensorRef};
///
/// // One K/V head, d = 1, pages of 16 slots: sequence 0 holds 2 keys in page 1, sequence 1
/// // holds 1 key in page 0. One query each, stored [total, heads, d].
/// let (mut k, mut v) = (vec![0.0f32; 32], vec![0.0f32; 32]);
/// (v[16], v[17], v[0]) = (1.0, 3.0, 5.0);
/// let table = [1u32, 0];
/// let cache = PagedKv {
///     k: PagePool::F32(&k), v: PagePool::F32(&v), page_size: 16, kv_heads: 1, dk: 1, dv: 1,
///     block_table: &table, max_pages: 1, seq_lens: &[2, 1],
/// };
/// let packed = |t| Tensor4Layout { dims: [1, 1, t, 1], strides: [0, 1, 1, 1], offset: 0 };
/// let (q, mut o) = (vec![0.0f32; 2], vec![0.0f32; 2]);
/// PagedAttention::new(TensorRef::new(&q, packed(2)), &[0, 1, 2], cache)
///     .mask(Mask::CAUSAL)
///     .run(TensorMut::new(&mut o, packed(2)))?;
/// // Equal scores: each query averages its own sequence's values.
/// assert_eq!(o, [2.0, 5.0]);
/// # Ok::<(), attn_kernels::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "an attention problem computes nothing until `run`"]
pub struct PagedAttention<'a> {
    q: AnyRef<'a>,
    cu_q: &'a [usize],
    cache: PagedKv<'a>,
    scale: Option<f32>,
    mask: Mask<'a>,
    lse: Option<&'a mut [f32]>,
    par: Parallelism,
    isa: Option<Isa>,
    half: HalfPath,
    variants: Variants<'a>,
}

impl<'a> PagedAttention<'a> {
    /// The problem over packed queries, their cumulative offsets `cu_q` (`cu_seqlens_q`) and
    /// the cache, every setting at its default. Nothing is checked until [`run`](Self::run).
    pub fn new(q: impl Into<AnyRef<'a>>, cu_q: &'a [usize], cache: PagedKv<'a>) -> Self {
        PagedAttention {
            q: q.into(),
            cu_q,
            cache,
            scale: None,
            mask: Mask::None,
            lse: None,
            par: Parallelism::Sequential,
            isa: None,
            half: HalfPath::Auto,
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

    /// How bf16 operands are multiplied (default [`HalfPath::Auto`], which widens them to f32),
    /// as [`Attention::half_path`](crate::attention::Attention::half_path) says for dense
    /// attention: with [`HalfPath::Dot`] the decode pieces run their scores on `vdpbf16ps`
    /// (for an even `dk`) and the chunked-prefill pieces both block products, with those
    /// paths' bounds. It needs bf16 queries and bf16 key and value pools, the `avx512` ISA and
    /// a CPU with AVX512_BF16, else [`run`](Self::run) fails with `InvalidParameter { arg:
    /// "path", .. }` (after the checks of the operands).
    pub fn half_path(mut self, half: HalfPath) -> Self {
        self.half = half;
        self
    }

    /// The variants (default [`Variants::NONE`]), measured from each sequence's offset.
    pub fn variants(mut self, variants: Variants<'a>) -> Self {
        self.variants = variants;
        self
    }

    /// Checks the problem against the output `o: [1, hq, total_q, dv]` and computes it (see
    /// [`PagedAttention`] for the errors). Nothing is written when a check fails.
    pub fn run<'o>(mut self, o: impl Into<AnyMut<'o>>) -> Result<()> {
        let o = o.into();
        let isa = self.isa.unwrap_or_else(arch::selected).require()?;
        let cache = self.cache;
        cache.check()?;
        let scale = self.scale.unwrap_or_else(|| default_scale(self.q.layout().dims[3]));
        if !matches!(self.mask, Mask::None | Mask::Causal { .. }) {
            return Err(Error::InvalidParameter {
                arg: "mask",
                requirement: "packed and paged batches take no mask, or a causal one",
            });
        }
        expect_dim("q", "batch", 1, self.q.layout().dims[0])?;
        // The packed views checked against a cache of no keys: shapes, heads, bounds, output.
        let none =
            |d| KvRef::F32(TensorRef::new(&[], Tensor4Layout::bhsd(1, cache.kv_heads, 0, d)));
        let lse = self.lse.take();
        let [_, hq, _, total_q, _, _, _] = check_attention_any(
            &self.q,
            &none(cache.dk),
            &none(cache.dv),
            scale,
            &self.mask,
            &o,
            lse.as_deref(),
        )?;
        let sq = SeqOffsets::new("cu_seqlens_q", self.cu_q)?;
        expect_dim("cu_seqlens_q", "total", total_q, sq.total())?;
        expect_dim("cu_seqlens_q", "sequences", cache.batch(), sq.count())?;
        self.variants.check(hq)?;
        let bf16 = matches!(
            (&self.q, cache.k, cache.v),
            (AnyRef::BF16(_), PagePool::BF16(_), PagePool::BF16(_))
        );
        let dot = dot_kernel(self.half, bf16, isa)?;
        if total_q == 0 {
            return Ok(());
        }
        let pieces = plan(&sq, cache.seq_lens, &self.mask);
        let (var, par) = (self.variants, self.par);
        run_paged(isa, self.q, &cache, &pieces, scale, var, dot, o, lse, par)
    }
}

/// The pieces of a batch, in token order: each sequence's queries, with its causal offset
/// `off` (for the causal mask and the variants alike). Sequences without queries have none.
fn plan(sq: &SeqOffsets<'_>, lens: &[usize], mask: &Mask<'_>) -> Vec<PagedPiece<'static>> {
    let causal = matches!(mask, Mask::Causal { .. });
    let mut pieces = Vec::new();
    for (b, &nk) in lens.iter().enumerate() {
        let rq = sq.range(b);
        if rq.is_empty() {
            continue;
        }
        let off = Variants::offset(mask, rq.len(), nk);
        let mask = if causal { Mask::Causal { offset: Some(off) } } else { Mask::None };
        pieces.push(PagedPiece { seq: b, rows: rq, mask, off });
    }
    pieces
}
