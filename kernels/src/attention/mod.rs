//! Scaled dot-product attention `O = softmax(scale·Q·Kᵀ + mask)·V` over `[batch, heads]`.
//!
//! The entry point is the problem value [`Attention`]: built from the Q, K, V views, with the
//! scale, mask, logsumexp output, threads, ISA and [`Path`] set by name, then
//! [`run`](Attention::run) on the output view. Three algorithms run it:
//!
//! - [`Path::Flash`]: the streaming kernel. Each task takes one tile of queries of one head and
//!   streams the keys in blocks, keeping a running row maximum `m` and sum `l` (online
//!   softmax): when a block raises the maximum, the partial output is rescaled by
//!   `e^(m_old − m_new)`; the division by `l` happens once at the end. Memory beyond the
//!   operands is per-thread scratch (a few tiles), never `Nq × Nk`. Causal blocks entirely above
//!   the diagonal are never visited. Tasks are `(batch, head, query tile)`, spread over rayon.
//! - [`Path::Decode`]: for a handful of queries over many keys (`Nq ≤ 16`, generation with a KV
//!   cache). All query heads of a GQA group and all queries form the rows, the keys of each
//!   `(batch, K/V head)` are split into chunks fixed by `Nk` (threads take whole chunks, so the
//!   result does not depend on the thread count), and the chunks' partial results
//!   are merged by their logsumexp (flash-decoding). Each key/value row is read once.
//! - [`Path::Unfused`]: scores materialised per head, then softmax, then `P·V`; kept as a
//!   second implementation for equivalence tests and benchmarks.
//!
//! [`Path::Auto`] (the default) picks the decode path for `Nq ≤ 16` and the flash path
//! otherwise. Every path has the semantics, checks and errors of
//! `attn_reference::attention::attention` (they share [`check_attention`](attn_core::check_attention)): any strides (so
//! `[b, s, h, d]` and `[b, h, s, d]` storage both work without copies), `Nq ≠ Nk`, `d_k ≠ d_v`,
//! GQA/MQA (query head `h` reads K/V head `h / (H_q / H_kv)`, no copies), every [`Mask`]; a
//! fully masked row gives zeros and logsumexp −∞; `Nq = 0` or `Nk = 0` are fine. A call with
//! nothing to write (an empty output view and no logsumexp entry) returns at once whatever its
//! other dimensions (`2⁴⁰` rows of width 0, `2⁵⁰` keys of width 0), as the reference does; with
//! `d_k = d_v = 0` the logsumexps are computed without visiting the keys. No allocation or loop
//! is sized by a dimension whose product with a zero dimension is empty.
//!
//! Numerics: the query tile is packed pre-multiplied by `scale` (a nonzero product that would
//! underflow to zero is kept as the smallest subnormal of its sign, so an underflow cannot turn
//! `scale·q·(±∞)` into `0·∞ = NaN`; see `scale_query`); accumulation is f32; the
//! exponential is the softmax module's: its table exp (1.5 ULP) on key blocks whose scores all
//! lie within 87 of the running max, the full-range 1-ULP exp elsewhere.
//!
//! Overflow (one convention for every path and the reference, see
//! `attn_reference::softmax::saturate_logit`): a score `scale·q·k + mask` is an f32 value; one
//! that overflows f32 is `±∞`, like a `±∞` bias. `−∞` scores get weight 0 (a row of only `−∞`
//! is fully masked: zeros, logsumexp −∞); the `+∞` scores of a row share its weight evenly (the
//! output row is the mean of their values, the logsumexp `+∞`); a NaN score gives a NaN row.
//! The reference rounds its f64 scores to `±∞` where f32 would overflow. Where an
//! intermediate of the f32 dot product overflows although the score itself would not
//! (`|scale|·Σ_d |q_d·k_d|` or `|scale·q_d|` near `f32::MAX`), the score can come out `±∞` or
//! NaN depending on the summation order: that is outside the supported range. A key of zero
//! weight (masked, or whose weight
//! underflows) contributes exactly 0 even when its value is `±∞`/NaN (an unwritten KV-cache
//! slot), as in the reference; empty head dimensions (`d_k = 0`, `d_v = 0`) accept any strides.
//!
//! Layout of this module: `blocking` (block sizes and thresholds, with their cache
//! reasoning), `blocks` (the flash block products on the GEMM micro-kernels, the decode tiles
//! and row helpers, over [`crate::arch::Simd`]), `sink` (the shared row writer of the
//! parallel loops, which claims each output row once), `flash`, `decode`, `unfused` (the
//! three algorithms, each written once over the vector trait, in safe code).

mod additive;
mod blocking;
pub(crate) use blocking::DECODE_MAX_Q;
mod blocks;
mod decode;
mod flash;
mod mask;
mod sink;
mod unfused;
mod variants;

use attn_core::attention::check_attention_any;
use attn_core::{
    default_scale, AnyMut, AnyRef, Element, Error, KvRef, Mask, MatLayout, Result, Tensor4Layout,
    TensorRef, Variants,
};

use crate::arch::convert::{load_elems, SimdElement};
use crate::arch::{self, store, Isa, Simd};
use crate::gemm::ukernel::{bf16_dot_kernel, Kernel as GemmKernel};
use crate::gemm::HalfPath;
use crate::par::Parallelism;
use blocks::{KvAny, Q8Mat, Strided};

pub use additive::{AdditiveAttention, AdditiveWeights};
pub(crate) use decode::{run_paged, PagedPiece};
pub(crate) use flash::{worth_copying, HEAD_COPY_MAX};

/// Every attention path (flash, decode, unfused) flushes a probability `e^(s − m)` (the
/// score's distance below its row's running maximum `m`) to 0 when `s − m` is below this:
/// `e^(−64) ≈ 1.6·10⁻²⁸`.
///
/// Why: a tiny weight times a value of ordinary size is a subnormal product, and every
/// multiply-add that makes or reads a subnormal costs a microcode assist (about a hundred
/// cycles). ALiBi rows meet this on every block of a steep head: a fresh accumulator takes
/// its keys' weights in ascending order, `e^(−87) … 1`, so its first sums were subnormal, and
/// causal ALiBi at N = 2048 ran at 0.68× of plain attention on a Sapphire-Rapids-class Xeon.
/// With the threshold at `e^(−64)`, `p·v` stays normal for every `|v| ≥ 2⁻³³`.
///
/// What it costs: a flushed key contributes at most `e^(−64)·|v_j|` less to the unnormalised
/// output, against a row sum `l ≥ 1` (the row's maximum contributes 1), so each output is off
/// by at most `e^(−64)·Σ_j |v_jd|` beyond the rounding bound, 10²⁰ times below f32's
/// resolution for values of one magnitude.
pub const FLUSH_WEIGHTS_BELOW: f32 = -64.0;

/// Which algorithm runs an [`Attention`] problem. Every path has the same contract, checks and
/// errors; they differ in speed and memory, and in rounding within the stated bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Path {
    /// The decode path for `Nq ≤ 16` queries, the flash path otherwise.
    #[default]
    Auto,
    /// The flash (streaming, online-softmax) path, for any `Nq`. Memory: a few tiles per
    /// thread, and, when f32 K/V rows are not consecutive (token-major `[seq, heads, d]`
    /// storage) and at least 4 tasks read a K/V head, a consecutive copy of that head's rows,
    /// at most 16 MiB per thread.
    Flash,
    /// The decode (split-keys, logsumexp-merge) path, for any `Nq`; meant for `Nq ≤ 16`.
    Decode,
    /// The unfused path: per head, the `Nq × Nk` score matrix is materialised, softmaxed and
    /// multiplied by V; memory `O(Nq·Nk)` per thread. Kept for equivalence tests and benchmarks.
    Unfused,
}

impl Path {
    /// The path that runs a problem of `nq` queries: [`Path::Auto`] resolved, any other as is.
    fn resolve(self, nq: usize) -> Path {
        match self {
            Path::Auto if nq <= blocking::DECODE_MAX_Q => Path::Decode,
            Path::Auto => Path::Flash,
            p => p,
        }
    }

    /// How many flash tasks read each K/V head in a call of `nq` queries with `group` query
    /// heads per K/V head on `isa`, when this path runs it on the flash path; `None` on any
    /// other path. Only flash's arithmetic is the same for every K/V layout (decode's block
    /// size depends on the rows' stride, see `decode_block_keys`).
    pub(crate) fn flash_reads(self, isa: Isa, nq: usize, group: usize) -> Option<usize> {
        (self.resolve(nq) == Path::Flash).then(|| flash::readers(isa, nq, group))
    }
}

/// One attention call `O = softmax(scale·Q·Kᵀ + mask)·V`: the operands, with every other
/// setting named and defaulted, run by [`run`](Self::run).
///
/// `q: [batch, hq, nq, dk]`, `k: [batch, hkv, nk, dk]`, `v: [batch, hkv, nk, dv]` and the
/// output `o: [batch, hq, nq, dv]` are strided views; GQA/MQA when `hkv < hq` (`hkv` divides
/// `hq`). The settings and their defaults:
///
/// | method | default |
/// | --- | --- |
/// | [`scale`](Self::scale) | [`default_scale`]`(dk)` = `1/√dk` |
/// | [`mask`](Self::mask) | [`Mask::None`] |
/// | [`lse`](Self::lse) | no logsumexp output |
/// | [`parallelism`](Self::parallelism) | [`Parallelism::Sequential`] (the calling thread) |
/// | [`isa`](Self::isa) | [`arch::selected`] at [`run`](Self::run) |
/// | [`path`](Self::path) | [`Path::Auto`] |
/// | [`half_path`](Self::half_path) | [`HalfPath::Auto`] (widen) |
/// | [`variants`](Self::variants) (or [`window`](Self::window), [`softcap`](Self::softcap), [`sinks`](Self::sinks), [`alibi`](Self::alibi)) | [`Variants::NONE`] |
///
/// ```
/// use attn_kernels::attention::Attention;
/// use attn_kernels::{Mask, Parallelism, Tensor4Layout, TensorMut, TensorRef};
///
/// // One batch, one head, 2 queries, 3 keys, d = 4, stored [b, h, s, d].
/// let (q, k, v) = (vec![0.5f32; 8], vec![0.25f32; 12], vec![1.0f32; 12]);
/// let (mut o, mut lse) = (vec![0.0f32; 8], vec![0.0f32; 2]);
/// Attention::new(
///     TensorRef::new(&q, Tensor4Layout::bhsd(1, 1, 2, 4)),
///     TensorRef::new(&k, Tensor4Layout::bhsd(1, 1, 3, 4)),
///     TensorRef::new(&v, Tensor4Layout::bhsd(1, 1, 3, 4)),
/// )
/// .mask(Mask::CAUSAL)
/// .lse(&mut lse)
/// .parallelism(Parallelism::threads(2))
/// .run(TensorMut::new(&mut o, Tensor4Layout::bhsd(1, 1, 2, 4)))?;
/// // Every value row is ones, so is every output row; query 0 sees 2 keys of equal score.
/// assert!(o.iter().all(|x| (x - 1.0).abs() < 1e-6));
/// assert!((lse[0] - (0.25f32 + 2f32.ln())).abs() < 1e-6);
/// # Ok::<(), attn_kernels::Error>(())
/// ```
///
/// **Variants** ([`Variants`]: sliding window, logit softcap, attention sinks, ALiBi) combine
/// with every mask, GQA, both layouts and every path. For query `i` and key `j` of head `h`
/// the logit is `softcap(scale·q·k) + mask_ij + slope_h·(j − i − off)`, visible when the mask
/// and the window allow; a sink joins each row's denominator (and its logsumexp) and carries
/// no value. `off` is the causal offset ([`Variants::offset`]). Key blocks outside a row
/// tile's window are never visited: a window of width `w` costs `O(Nq·w)`. A row with no
/// visible key is zero with logsumexp −∞, or with a sink, zero with logsumexp `sink_h`.
/// The softcap's tanh adds its [`TANH_MAX_ULP`](crate::math::TANH_MAX_ULP) to each capped
/// score; the ALiBi term is `slope·(j − i − off)` rounded once in f32.
///
/// **Element types.** Q and the output are f32, bf16 or f16 views (`TensorRef<'_, bf16>`, …),
/// K and V any of those or an int8 cache ([`Q8Ref`](attn_core::Q8Ref): blocks of 32 along `d`,
/// one f32 scale each), every combination on every path; an f32 view converts by `Into`, so
/// f32 callers write nothing new. The result is the f32 computation on the exact values the
/// operands represent (half types widened exactly, an int8 element `q` of scale `s` read as
/// `fl(q·s)`, within `2⁻²⁴` relative of `q·s`): scores, softmax and weighted sums in f32, the
/// bound of the f32 call; the output is then rounded once to its type (nearest, ties to
/// even: half an ULP more, at most `2⁻⁸` relative for bf16, `2⁻¹¹` for f16), so an f16 output
/// overflows to `±∞` where the f32 result reaches 65520 (bf16 near `f32::MAX`). The logsumexp
/// stays f32. Decode reads bf16/f16/int8 K/V in place and widens (or dequantises) in
/// registers; flash and unfused convert K/V to f32 one key block (flash) or head (unfused) at
/// a time. K and V of different types, or with non-contiguous columns, are converted block by
/// block on the decode path too. Scales are checked for shape and bounds (`k_scales`,
/// `v_scales`), not values: a scale of 0, `±∞` or NaN acts as the f32 values it produces.
///
/// **bf16 on `vdpbf16ps`** ([`half_path`](Self::half_path)`(`[`HalfPath::Dot`]`)`, all of Q,
/// K and V bf16, the `avx512` ISA on a CPU with AVX512_BF16): the flash path runs both block
/// products on the `vdpbf16ps` micro-kernel, two multiply-adds per f32 lane and instruction.
/// The scores are `scale·(q·k)` (the scale applied to the f32 sum, not folded into the
/// queries), and the probabilities are rounded to bf16 (nearest even) before `P·V`, while
/// the row sum `l` keeps the f32 probabilities: each output moves by at most `2⁻⁸` relative to
/// `Σ_j p_j·|v_j|` beyond the f32 bound. The instruction treats subnormal bf16 inputs as 0 and
/// flushes results below `2⁻¹²⁶` (see [`crate::gemm`]): each score may be off by
/// `scale·2⁻¹²⁶·(dk + 1 + Σ_d (|q_d| + |k_d|))` more, each output by `2⁻¹²⁶·(nk + 2)`, and a
/// subnormal query or key element meeting an infinite one gives NaN (`0·∞`) where the exact
/// product is infinite. The decode path (for an even `dk`) runs its scores on the instruction
/// in the same way, `scale·(q·k)` with the same flushing term on each score, and keeps `P·V`
/// in f32 on the unrounded probabilities: only the score terms above apply. With an odd `dk`
/// the decode path, and the unfused path always, widen, as with [`HalfPath::Widen`].
///
/// **Growing.** New settings are new methods with a default that leaves every existing call as
/// it is, never a new function per combination; varlen batches as a method taking
/// `cu_seqlens_q`/`cu_seqlens_k`; a paged KV cache as a method taking the block table, with
/// `k`/`v` viewing the page pool; other element types as views of those types passed to
/// [`new`](Self::new). The fields are private, so adding one breaks no caller. The C ABI
/// mirrors this with `AttnAttentionArgs` (`attn_attention_run`), a struct that grows at its end.
#[derive(Debug)]
#[must_use = "an attention problem computes nothing until `run`"]
pub struct Attention<'a> {
    q: AnyRef<'a>,
    k: KvRef<'a>,
    v: KvRef<'a>,
    /// `None`: `default_scale(dk)`.
    scale: Option<f32>,
    mask: Mask<'a>,
    lse: Option<&'a mut [f32]>,
    par: Parallelism,
    /// `None`: `arch::selected()` when the problem runs.
    isa: Option<Isa>,
    path: Path,
    half: HalfPath,
    variants: Variants<'a>,
}

impl<'a> Attention<'a> {
    /// The problem over these operands, every setting at its default (see [`Attention`]).
    /// Nothing is checked until [`run`](Self::run). Each operand may be a [`TensorRef`] of
    /// `f32`, `bf16` or `f16`, and K and V also a [`Q8Ref`](attn_core::Q8Ref) (see
    /// "Element types" in [`Attention`]).
    pub fn new(q: impl Into<AnyRef<'a>>, k: impl Into<KvRef<'a>>, v: impl Into<KvRef<'a>>) -> Self {
        Attention {
            q: q.into(),
            k: k.into(),
            v: v.into(),
            scale: None,
            mask: Mask::None,
            lse: None,
            par: Parallelism::Sequential,
            isa: None,
            path: Path::Auto,
            half: HalfPath::Auto,
            variants: Variants::NONE,
        }
    }

    /// The score scale (default `1/√dk`, see [`default_scale`]); any
    /// finite value, else [`run`](Self::run) fails with `Error::NonFinite { arg: "scale" }`.
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// The mask over `[batch, hq, nq, nk]` (default [`Mask::None`]).
    pub fn mask(mut self, mask: Mask<'a>) -> Self {
        self.mask = mask;
        self
    }

    /// Where to write the logsumexp of every query row: `batch·hq·nq` floats, row-major over
    /// `[batch, hq, nq]`, receiving `ln Σ_j exp(scale·q_i·k_j + mask_ij)` (−∞ for a fully masked
    /// row). Another length is `Error::ShapeMismatch { arg: "lse", .. }` at [`run`](Self::run).
    pub fn lse(mut self, lse: &'a mut [f32]) -> Self {
        self.lse = Some(lse);
        self
    }

    /// How many threads the call may use (default [`Parallelism::Sequential`]). The result is
    /// bitwise the same for every thread count.
    pub fn parallelism(mut self, par: Parallelism) -> Self {
        self.par = par;
        self
    }

    /// The ISA to run on (default [`arch::selected`], read when the problem runs); one this CPU
    /// does not support is `Error::InvalidParameter { arg: "isa", .. }` at [`run`](Self::run).
    pub fn isa(mut self, isa: Isa) -> Self {
        self.isa = Some(isa);
        self
    }

    /// The algorithm (default [`Path::Auto`]).
    pub fn path(mut self, path: Path) -> Self {
        self.path = path;
        self
    }

    /// How the flash and decode paths multiply bf16 operands (default [`HalfPath::Auto`], which
    /// widens them to f32 as [`HalfPath::Widen`] does). [`HalfPath::Dot`] runs the flash path's
    /// block products and the decode path's scores on `vdpbf16ps` (see "bf16 on `vdpbf16ps`"
    /// above); it needs bf16 Q, K and V, the
    /// `avx512` ISA and a CPU with AVX512_BF16, else [`run`](Self::run) fails with
    /// `InvalidParameter { arg: "path", .. }`.
    pub fn half_path(mut self, half: HalfPath) -> Self {
        self.half = half;
        self
    }

    /// All the variants at once (default [`Variants::NONE`]); replaces any set before.
    pub fn variants(mut self, variants: Variants<'a>) -> Self {
        self.variants = variants;
        self
    }

    /// A sliding window: key `j` is visible to query `i` when
    /// `i + off − left ≤ j ≤ i + off + right` (see [`attn_core::Window`]; any values are valid,
    /// `usize::MAX` meaning unbounded). `window(w − 1, 0)` with a causal mask is Mistral's
    /// window of `w` keys.
    pub fn window(mut self, left: usize, right: usize) -> Self {
        self.variants = self.variants.window(left, right);
        self
    }

    /// A logit softcap: scores become `c·tanh(s/c)` after scaling, before the mask (Gemma 2).
    /// `c` must be finite and `> 0`, else `InvalidParameter`/`NonFinite { arg: "softcap" }`.
    pub fn softcap(mut self, c: f32) -> Self {
        self.variants = self.variants.softcap(c);
        self
    }

    /// Attention sinks: one finite logit per query head (`hq` values) that joins the row's
    /// softmax denominator and carries no value (gpt-oss).
    pub fn sinks(mut self, sinks: &'a [f32]) -> Self {
        self.variants = self.variants.sinks(sinks);
        self
    }

    /// ALiBi: one finite slope per query head (`hq` values), adding `slope·(j − i − off)` to
    /// each score; [`attn_core::alibi_slopes`] gives the standard ones.
    pub fn alibi(mut self, slopes: &'a [f32]) -> Self {
        self.variants = self.variants.alibi(slopes);
        self
    }

    /// Checks the problem against the output `o: [batch, hq, nq, dv]` and computes it into `o`
    /// (and the logsumexps, if asked). Nothing is written when a check fails.
    ///
    /// Errors: an unsupported [`isa`](Self::isa) first, then those of [`check_attention_any`]
    /// (shapes, bounds, aliasing output, zero heads, K/V heads not dividing query heads,
    /// non-finite scale, `lse` length), then those of [`Variants::check`] (softcap, the
    /// length and finiteness of sinks and slopes), the same errors as the reference's for the
    /// same operands; and `InvalidParameter` when the per-thread scratch (a few query tiles of
    /// `d_k` and `d_v` floats) cannot be allocated, which only a broadcast operand declaring an
    /// absurd head dimension can cause (the output is then unspecified).
    pub fn run<'o>(mut self, o: impl Into<AnyMut<'o>>) -> Result<()> {
        let o = o.into();
        let isa = self.isa.unwrap_or_else(arch::selected).require()?;
        let path = self.path.resolve(self.q.layout().seq());
        let par = self.par;
        let mut lse = self.lse.take();
        let mut p = Problem::new(&self, &o, lse.as_deref())?;
        p.dot = self.dot_kernel(isa)?;
        if p.trivial(o.layout(), lse.as_deref_mut()) {
            return Ok(());
        }
        match path {
            Path::Decode => decode::run(isa, &p, o, lse, par),
            Path::Unfused => unfused::run(isa, &p, &sink::Sink::new_any(o, lse), par),
            // `Auto` is resolved above.
            Path::Flash | Path::Auto => flash::run(isa, &p, &sink::Sink::new_any(o, lse), par),
        }
    }
}

impl Attention<'_> {
    /// The `vdpbf16ps` kernel when [`HalfPath::Dot`] is asked for and can run (else the
    /// `InvalidParameter` error of [`half_path`](Self::half_path)); `None` for the other paths.
    fn dot_kernel(&self, isa: Isa) -> Result<Option<&'static GemmKernel>> {
        let bf16 = matches!(
            (&self.q, &self.k, &self.v),
            (AnyRef::BF16(_), KvRef::BF16(_), KvRef::BF16(_))
        );
        dot_kernel(self.half, bf16, isa)
    }
}

/// The `vdpbf16ps` kernel for `half` = [`HalfPath::Dot`] when it can run: `bf16` (Q, K and V
/// are all bf16), the `avx512` ISA and a CPU with AVX512_BF16; else `InvalidParameter { arg:
/// "path" }`. `None` for the other paths. Dense and paged attention share the rule.
pub(crate) fn dot_kernel(
    half: HalfPath,
    bf16: bool,
    isa: Isa,
) -> Result<Option<&'static GemmKernel>> {
    if half != HalfPath::Dot {
        return Ok(None);
    }
    match bf16_dot_kernel() {
        Some(kern) if bf16 && isa == Isa::Avx512 => Ok(Some(kern)),
        _ => Err(Error::InvalidParameter {
            arg: "path",
            requirement: "the vdpbf16ps path needs bf16 Q, K and V, the avx512 ISA and a \
                          CPU with AVX512_BF16",
        }),
    }
}

/// A block of scores: queries `i0..i0 + rows` of head `(b, h)` against keys `j0..j0 + nb`,
/// as the paths hand it to [`Problem::apply_mask`], [`Problem::apply_variants`] and
/// [`Problem::hides_block`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScoreBlock {
    b: usize,
    h: usize,
    i0: usize,
    rows: usize,
    j0: usize,
    nb: usize,
}

impl ScoreBlock {
    /// Where the block starts in a mask of this layout, and the mask's query and key strides:
    /// `(index of (b, h, i0, j0), s2, s3)`.
    fn origin(&self, layout: &Tensor4Layout) -> (usize, usize, usize) {
        let [.., s2, s3] = layout.strides;
        (layout.index(self.b, self.h, self.i0, self.j0), s2, s3)
    }
}

/// A checked attention problem: operands, sizes and mask.
pub(crate) struct Problem<'a> {
    q: AnyRef<'a>,
    k: KvRef<'a>,
    v: KvRef<'a>,
    mask: &'a Mask<'a>,
    /// The score scale, folded into the packed queries.
    scale2: f32,
    batch: usize,
    hq: usize,
    hkv: usize,
    /// Query heads per K/V head.
    group: usize,
    variants: Variants<'a>,
    /// The causal offset the window and ALiBi measure from ([`Variants::offset`]).
    off: i128,
    nq: usize,
    nk: usize,
    dk: usize,
    dv: usize,
    /// The `vdpbf16ps` kernel when the flash path runs its block products on bf16 pairs
    /// ([`HalfPath::Dot`], checked: Q, K and V are bf16 and the ISA is `avx512`).
    dot: Option<&'static GemmKernel>,
}

impl<'a> Problem<'a> {
    /// The operands of `a`, checked against the output `o` and `lse` by
    /// [`check_attention_any`], with the default scale resolved.
    fn new(a: &'a Attention<'_>, o: &AnyMut<'_>, lse: Option<&[f32]>) -> Result<Self> {
        let scale = a.scale.unwrap_or_else(|| default_scale(a.q.layout().dims[3]));
        let [batch, hq, hkv, nq, nk, dk, dv] =
            check_attention_any(&a.q, &a.k, &a.v, scale, &a.mask, o, lse)?;
        a.variants.check(hq)?;
        Ok(Problem {
            variants: a.variants,
            off: Variants::offset(&a.mask, nq, nk) as i128,
            q: a.q,
            k: a.k,
            v: a.v,
            mask: &a.mask,
            scale2: scale,
            batch,
            hq,
            hkv,
            group: hq / hkv,
            nq,
            nk,
            dk,
            dv,
            dot: None,
        })
    }

    /// One piece of a paged batch (see [`decode::run_paged`]): queries `q: [1, hq, nq, dk]`
    /// against `nk` keys that the caller reads from pages, with the piece's `mask` and the
    /// variants' offset `off`. The K/V views carry the shapes `[1, hkv, nk, d]` only (no
    /// data): nothing may read them. `dot`: the `vdpbf16ps` kernel ([`dot_kernel`]) when the
    /// batch runs on it. Unchecked: the caller checked the batch they come from.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn piece(
        q: AnyRef<'a>,
        hkv: usize,
        nk: usize,
        dv: usize,
        scale: f32,
        mask: &'a Mask<'a>,
        off: isize,
        variants: Variants<'a>,
        dot: Option<&'static GemmKernel>,
    ) -> Self {
        let [_, hq, nq, dk] = q.layout().dims;
        let shape = |d| KvRef::F32(TensorRef::new(&[], Tensor4Layout::bhsd(1, hkv, nk, d)));
        Problem {
            q,
            k: shape(dk),
            v: shape(dv),
            mask,
            scale2: scale,
            batch: 1,
            hq,
            hkv,
            group: hq / hkv,
            variants,
            off: off as i128,
            nq,
            nk,
            dk,
            dv,
            dot,
        }
    }

    /// Handles the calls whose answer needs no key or value element, and says whether it did:
    /// nothing to write (the output view is empty and there is no logsumexp entry), or
    /// `d_k = d_v = 0` with logsumexp entries (every score is `softcap(scale·0) = 0` plus the
    /// mask and the ALiBi term, so `lse = ln(Σ_j e^(mask_ij + alibi_ij) + e^sink)`, in closed
    /// form for no mask and a causal one). Such a call may carry dimensions no slice bounds
    /// (`2⁴⁰` rows of width 0, `2⁵⁰` keys of width 0), so nothing here allocates or loops in
    /// proportion to a dimension whose product with a zero one is empty: the loop below runs
    /// over the `lse` slice, and over the keys only to read a keep-mask or bias, which has
    /// that many (broadcast) elements.
    fn trivial(&self, o: &Tensor4Layout, lse: Option<&mut [f32]>) -> bool {
        let lse = lse.filter(|l| !l.is_empty());
        if o.is_empty() && lse.is_none() {
            return true;
        }
        let Some(out) = lse else { return false };
        if self.dk != 0 || self.dv != 0 {
            return false;
        }
        // `out.len() = batch·hq·nq` was checked, so row indices decompose without overflow.
        for (row, l) in out.iter_mut().enumerate() {
            let (bh, i) = (row / self.nq, row % self.nq);
            let (b, h) = (bh / self.hq, bh % self.hq);
            let (j0, j1) = (self.key_start(i), self.key_end(i));
            let slope = self.variants.alibi.map_or(0.0, |a| f64::from(a[h]));
            // ALiBi distance of key j, exact in f64 up to 2⁵³.
            let dist = |j: usize| (j as i128 - i as i128 - self.off) as f64;
            let keyed = |t: Option<f64>, j: usize| t.map(|t| t + slope * dist(j));
            let lse_keys = match self.mask {
                Mask::None | Mask::Causal { .. } => {
                    lse_arithmetic(slope, dist(j0), j1.saturating_sub(j0) as f64)
                }
                Mask::Keep { keep, layout } => lse_f64(
                    (j0..j1).map(|j| keyed(keep[layout.index(b, h, i, j)].then_some(0.0), j)),
                ),
                Mask::Bias { bias, layout } => lse_f64(
                    (j0..j1).map(|j| keyed(Some(f64::from(bias[layout.index(b, h, i, j)])), j)),
                ),
            };
            let sink = self.variants.sinks.map(|s| f64::from(s[h]));
            *l = match sink {
                Some(s) if lse_keys.is_finite() || lse_keys == f64::NEG_INFINITY => {
                    let m = lse_keys.max(s);
                    (m + ((lse_keys - m).exp() + (s - m).exp()).ln()) as f32
                }
                _ => lse_keys as f32,
            };
        }
        true
    }

    /// Keys of K/V head `kh` of batch `b` as a `[nk, dk]` strided matrix of their type.
    fn keys(&self, b: usize, kh: usize) -> KvAny<'a> {
        kv_matrix(&self.k, b, kh)
    }

    /// Values of K/V head `kh` of batch `b` as a `[nk, dv]` strided matrix of their type.
    fn values(&self, b: usize, kh: usize) -> KvAny<'a> {
        kv_matrix(&self.v, b, kh)
    }

    /// Exclusive end of the keys any of the queries `0..=i_last` may see: `nk`, cut at the
    /// causal diagonal of query `i_last` for a causal mask and at its window's right edge
    /// (keys beyond are never visited).
    fn key_end(&self, i_last: usize) -> usize {
        let mut end = self.nk as i128;
        if let Mask::Causal { .. } = self.mask {
            end = end.min(i_last as i128 + self.off + 1);
        }
        if let Some(w) = self.variants.window {
            end = end.min(i_last as i128 + self.off + w.right as i128 + 1);
        }
        end.clamp(0, self.nk as i128) as usize
    }

    /// First key any of the queries `i_first..` may see: 0, or the left edge of the window of
    /// query `i_first` (keys before are never visited).
    fn key_start(&self, i_first: usize) -> usize {
        match self.variants.window {
            Some(w) => {
                (i_first as i128 + self.off - w.left as i128).clamp(0, self.nk as i128) as usize
            }
            None => 0,
        }
    }

    /// Applies the mask to a block of scaled scores: `s[j·stride + r]` holds the score
    /// of query `i0 + r` (`r < rows`) and key `j0 + j` (`j < nb`) of the block's head. Masked
    /// scores become −∞ (overwritten, so a NaN score at a masked position is dropped as the
    /// reference drops it), a bias is added. Rows `rows..stride` are padding and
    /// may be touched.
    #[inline(always)] // into the ISA's kernel body, so that the mask walk uses its vectors
    fn apply_mask<S: Simd>(&self, simd: S, blk: ScoreBlock, stride: usize, s: &mut [f32]) {
        let ScoreBlock { i0, rows, j0, nb, .. } = blk;
        match self.mask {
            Mask::None => {}
            Mask::Causal { offset } => {
                let off = Mask::causal_offset(*offset, self.nq, self.nk) as i128;
                // Keys up to `i0 + off` are visible to every row: start after them (a block
                // left of the diagonal, most of a causal call's, has nothing to mask).
                let start = (i0 as i128 + off + 1 - j0 as i128).clamp(0, nb as i128) as usize;
                for j in start..nb {
                    // Query i sees key j0 + j iff i ≥ j0 + j − off: rows below that are masked.
                    let first = (j0 + j) as i128 - off - i0 as i128;
                    if first > 0 {
                        let n = (first as usize).min(stride);
                        s[j * stride..j * stride + n].fill(f32::NEG_INFINITY);
                    }
                }
            }
            Mask::Keep { keep, layout } => {
                mask::apply(simd, *keep, blk.origin(layout), rows, nb, stride, s)
            }
            Mask::Bias { bias, layout } => {
                mask::apply(simd, *bias, blk.origin(layout), rows, nb, stride, s)
            }
        }
    }

    /// Applies the ALiBi term and the window to a block of masked scores laid out as for
    /// [`apply_mask`](Self::apply_mask): `s[j·stride + r] += slope·(j0 + j − i0 − r − off)`
    /// (the distance rounded to f32, exact below 2²⁴, then one rounded product), and −∞
    /// outside the window. A −∞ score (a key the mask hides, or a bias of −∞) stays −∞: the
    /// reference gives such a key no logit, or `−∞ + finite` in f64, while `−∞ + slope·d` is
    /// NaN in f32 once the product overflows to `+∞`.
    /// Nothing to do (and nothing read) without those variants.
    #[inline(always)] // into the ISA's kernel body, so that the row loops use its vectors
    fn apply_variants(&self, blk: ScoreBlock, stride: usize, s: &mut [f32]) {
        let ScoreBlock { h, i0, rows, j0, nb, .. } = blk;
        if let Some(slopes) = self.variants.alibi {
            let slope = slopes[h];
            // Distances of the block: d(j, r) = base + j − r, base = j0 − i0 − off.
            let base = j0 as i128 - i0 as i128 - self.off;
            let exact_f32 = (1i128 << 24) - (nb + rows) as i128;
            if base.abs() < exact_f32 && rows <= RAMP.len() {
                // Every distance and partial sum is an integer below 2²⁴: exact in f32, so
                // this is the same value as below, vectorised along the rows.
                let (ramp, base) = (&RAMP[..rows], base as i32);
                for j in 0..nb {
                    let dj = (base + j as i32) as f32;
                    for (x, r) in s[j * stride..j * stride + rows].iter_mut().zip(ramp) {
                        *x = alibi(*x, slope * (dj - r));
                    }
                }
            } else {
                for j in 0..nb {
                    for (r, x) in s[j * stride..j * stride + rows].iter_mut().enumerate() {
                        *x = alibi(*x, slope * ((base + j as i128 - r as i128) as f64) as f32);
                    }
                }
            }
        }
        if let Some(w) = self.variants.window {
            // Query i0 + r sees key j0 + j iff j0 + j − off − right ≤ i0 + r ≤ j0 + j − off + left.
            // Keys j with `rows − 1 − left ≤ d ≤ right` (d below) are visible to every row of
            // the block: only the keys before and after that run are touched.
            let d0 = j0 as i128 - self.off - i0 as i128;
            let clamp = |x: i128| x.clamp(0, nb as i128) as usize;
            let first = clamp(rows as i128 - 1 - w.left as i128 - d0);
            let last = clamp(w.right as i128 - d0 + 1).max(first);
            for j in (0..first).chain(last..nb) {
                let d = d0 + j as i128;
                let lo = (d - w.right as i128).clamp(0, rows as i128) as usize;
                let hi = (d + w.left as i128 + 1).clamp(0, rows as i128) as usize;
                let row = &mut s[j * stride..j * stride + rows];
                row[..lo].fill(f32::NEG_INFINITY);
                row[hi.max(lo)..].fill(f32::NEG_INFINITY);
            }
        }
    }

    /// Whether a keep-mask hides every key `j0..j0 + nb` from every query `i0..i0 + rows` of
    /// head `(b, h)`: then the block contributes nothing (its weights are all 0, whatever its
    /// scores, and masked keys' values are never weighed), and the paths skip it before its
    /// scores, as they skip keys past a causal diagonal (a padded batch's key padding). Only a
    /// keep-mask says so ahead of the scores: a −∞ bias added to a NaN or `+∞` score gives
    /// NaN, as in the reference. Stops at the first visible pair: a block whose first key is
    /// visible costs one read, one whose leading keys are hidden at most what `apply_mask`
    /// reads.
    fn hides_block(&self, blk: ScoreBlock) -> bool {
        let Mask::Keep { keep, layout } = self.mask else {
            return false;
        };
        let (a0, s2, s3) = blk.origin(layout);
        // A key-padding mask (`s2 = 0`) has one element per key for all the rows.
        let rows = if s2 == 0 { blk.rows.min(1) } else { blk.rows };
        (0..blk.nb).all(|j| (0..rows).all(|r| !keep[a0 + r * s2 + j * s3]))
    }

    /// True when a block of scores needs [`apply_mask`](Self::apply_mask) or
    /// [`apply_variants`](Self::apply_variants) at all.
    fn masks_scores(&self) -> bool {
        !matches!(self.mask, Mask::None)
            || self.variants.alibi.is_some()
            || self.variants.window.is_some()
    }

    /// The normalisation of output row `(·, h, ·)` from its online-softmax state, the maximum
    /// `m` of its visible scores (`f32::MIN` when none) and `l = Σ_j e^(s_j − m)`: returns
    /// `(inv, lse)` such that the row is `inv·Σ_j e^(s_j − m)·v_j`. Without a sink,
    /// `inv = 1/l` and `lse = m + ln l` (0 and −∞ for an empty row). With a sink `σ` the
    /// denominator is `l·e^(m − M) + e^(σ − M)` for `M = max(m, σ)`, evaluated in f64 so that
    /// neither term overflows: `inv = e^(m − M)/denominator`, `lse = M + ln denominator`; an
    /// empty row is zeros with logsumexp `σ`, and a row with a `+∞` or NaN state ignores the
    /// sink (its `+∞` keys take all the weight, or it is NaN anyway). Without `with_lse` the
    /// caller writes no logsumexp, and a row without a sink skips its logarithm (NaN instead:
    /// `ln` per row was 0.7 % of a causal flash call on `vdpbf16ps` at d 64).
    fn finish(&self, h: usize, m: f32, l: f32, with_lse: bool) -> (f32, f32) {
        let sink = self.variants.sinks.map(|s| s[h]);
        match sink {
            Some(sigma) if l == 0.0 => (0.0, sigma),
            Some(sigma) if m.is_finite() && l.is_finite() => {
                let (m, sigma) = (f64::from(m), f64::from(sigma));
                let top = m.max(sigma);
                let a = (m - top).exp();
                let den = f64::from(l) * a + (sigma - top).exp();
                ((a / den) as f32, (top + den.ln()) as f32)
            }
            _ => finish_plain(m, l, with_lse),
        }
    }

    /// Query row `(b, h, i)` widened to f32 and times `scale`, into `out[..dk]` (see
    /// [`scale_query`]), through [`scale_row`]. It runs per row and key chunk of a decode
    /// call: element by element it was 3–4 % of a 32-head, 8-K/V-head decode (perf journal,
    /// 2026-12-06 16:53).
    #[inline(always)]
    fn scaled_query<S: Simd>(&self, s: S, b: usize, h: usize, i: usize, out: &mut [f32]) {
        let (qm, out) = (matrix(self.q.layout(), b, h), &mut out[..self.dk]);
        match &self.q {
            AnyRef::F32(q) => scale_row(s, q.data, (qm, i, self.scale2), out),
            AnyRef::BF16(q) => scale_row(s, q.data, (qm, i, self.scale2), out),
            AnyRef::F16(q) => scale_row(s, q.data, (qm, i, self.scale2), out),
        }
    }
}

impl Problem<'_> {
    /// Query row `(b, h, i)` of a bf16 Q as `dk/2` words of bf16 pairs (elements `2w`, low
    /// half, and `2w + 1`), unscaled: the query rows of the decode score tiles on `vdpbf16ps`
    /// (`dk` even). Leaves `out` alone for another element type, which `HalfPath::Dot` rules
    /// out.
    fn query_pairs(&self, b: usize, h: usize, i: usize, out: &mut [f32]) {
        if let AnyRef::BF16(q) = &self.q {
            for (w, x) in out[..self.dk / 2].iter_mut().enumerate() {
                let e = |d: usize| q.at(b, h, i, d).to_bits();
                *x = blocks::pair(e(2 * w), e(2 * w + 1));
            }
        }
    }
}

/// K/V head `kh` of batch `b` of `t` as a strided matrix of its storage type (the scales of a
/// quantised one as a second matrix, `[nk, ⌈d/32⌉]`).
fn kv_matrix<'a>(t: &KvRef<'a>, b: usize, kh: usize) -> KvAny<'a> {
    fn strided<'a, T: Element>(t: &TensorRef<'a, T>, b: usize, kh: usize) -> Strided<'a, T> {
        let m = matrix(&t.layout, b, kh);
        Strided { data: t.data, offset: m.offset, rs: m.row_stride, cs: m.col_stride }
    }
    match t {
        KvRef::F32(t) => KvAny::F32(strided(t, b, kh)),
        KvRef::BF16(t) => KvAny::BF16(strided(t, b, kh)),
        KvRef::F16(t) => KvAny::F16(strided(t, b, kh)),
        KvRef::Q8(q) => {
            let (v, s) = (matrix(&q.values.layout, b, kh), matrix(&q.scales.layout, b, kh));
            KvAny::Q8(Q8Mat {
                v: Strided {
                    data: q.values.data,
                    offset: v.offset,
                    rs: v.row_stride,
                    cs: v.col_stride,
                },
                sc: Strided {
                    data: q.scales.data,
                    offset: s.offset,
                    rs: s.row_stride,
                    cs: s.col_stride,
                },
            })
        }
    }
}

/// `score + term`, except that a −∞ score (hidden) stays −∞ whatever the term: see
/// [`Problem::apply_variants`]. A select, so the row loops still vectorise.
#[inline(always)]
fn alibi(score: f32, term: f32) -> f32 {
    if score == f32::NEG_INFINITY {
        score
    } else {
        score + term
    }
}

/// `0, 1, 2, …` as f32: the row offsets of a score block's ALiBi distances (a block has at
/// most as many rows as the widest query tile).
const RAMP: [f32; 64] = {
    let mut r = [0.0f32; 64];
    let mut i = 0;
    while i < 64 {
        r[i] = i as f32;
        i += 1;
    }
    r
};

/// One query element pre-multiplied by the score scale, `x·scale` rounded to f32, except that a
/// product of two nonzero factors that underflows to zero becomes the smallest subnormal of its
/// sign (2⁻¹⁴⁹, off by at most that much). So a scaled query element is zero only when the
/// element or the scale is, and an infinite key element meets it as in the reference's
/// `scale·(q·k)` (`±∞`, never the `0·∞ = NaN` of an underflowed factor).
#[inline(always)]
pub(crate) fn scale_query(x: f32, scale: f32) -> f32 {
    let y = x * scale;
    if y == 0.0 && x != 0.0 && scale != 0.0 {
        f32::from_bits(1).copysign(y)
    } else {
        y
    }
}

/// [`scale_query`] on every lane of `x`, with the same bits: where `x·scale` is ±0 but `x` is
/// not (and the scale is not 0), the smallest subnormal with the sign of `x·scale`. A NaN lane
/// counts as nonzero and stays `x·scale`.
#[inline(always)]
pub(crate) fn scale_query_lanes<S: Simd>(s: S, x: S::V, scale: f32) -> S::V {
    let y = s.mul(x, s.splat(scale));
    if scale == 0.0 {
        return y;
    }
    let tiny = f32::from_bits(1).copysign(scale);
    let under = s.select(s.lt(x, s.splat(0.0)), s.splat(-tiny), s.splat(tiny));
    let fixed = s.select(s.nonzero(x), under, y);
    s.select(s.nonzero(y), y, fixed)
}

/// `out[d] = scale_query(x, scale)` for the elements `x` of row `i` of the matrix `qm` of
/// `data`, widened (`out.len()` of them): by vectors ([`scale_query_lanes`]) where the row is
/// contiguous, element by element otherwise and for the tail. An empty row may have any
/// strides: its indices are never formed (the packed-batch fuzzer found one overflowing).
#[inline(always)]
pub(crate) fn scale_row<S: Simd, T: SimdElement>(
    s: S,
    data: &[T],
    (qm, i, scale): (MatLayout, usize, f32),
    out: &mut [f32],
) {
    let n = out.len();
    if n == 0 {
        return;
    }
    let (at, cs, l) = (qm.index(i, 0), qm.col_stride, S::LANES);
    let mut d = 0;
    if cs == 1 {
        let row = &data[at..at + n];
        while d + l <= n {
            store(s, &mut out[d..], scale_query_lanes(s, load_elems(s, &row[d..]), scale));
            d += l;
        }
    }
    for (d, x) in out.iter_mut().enumerate().skip(d) {
        *x = scale_query(data[at + d * cs].widen(), scale);
    }
}

/// `(1/l, m + ln l)` of a finished softmax row without sinks (running maximum `m`, sum `l`):
/// `(0, −∞)` when no key was visible (`l = 0`); the logsumexp only `with_lse` (NaN otherwise:
/// the `ln` costs a call per row).
pub(super) fn finish_plain(m: f32, l: f32, with_lse: bool) -> (f32, f32) {
    if l == 0.0 {
        (0.0, f32::NEG_INFINITY)
    } else if with_lse {
        (1.0 / l, m + l.ln())
    } else {
        (1.0 / l, f32::NAN)
    }
}

/// A zeroed scratch buffer of `n` floats, or `InvalidParameter { arg, .. }` when it cannot be
/// allocated (`n` overflowed, or the allocation failed). Every path sizes some scratch by a
/// dimension (`dk`, `dv`, or `Nq × Nk` for the unfused one), and a broadcast (zero-stride)
/// operand lets a small buffer declare any such dimension: that is an error, not an abort.
pub(super) fn zeros(arg: &'static str, n: Option<usize>) -> Result<Vec<f32>> {
    let err = Error::InvalidParameter {
        arg,
        requirement: "the sizes imply a scratch buffer that cannot be allocated",
    };
    let n = n.ok_or(err.clone())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| err)?;
    v.resize(n, 0.0);
    Ok(v)
}

/// `l.matrix(b, h)` with the offset in wrapping arithmetic. A checked view with an element
/// has an in-range offset, so this is exact then; an empty view (a zero dimension) may have
/// any strides (e.g. so large that `b·stride` overflows), and its offset is never used to
/// index, so wrapping only avoids the overflow panic.
fn matrix(l: &Tensor4Layout, b: usize, h: usize) -> MatLayout {
    let offset = l
        .offset
        .wrapping_add(b.wrapping_mul(l.strides[0]))
        .wrapping_add(h.wrapping_mul(l.strides[1]));
    MatLayout::strided(l.dims[2], l.dims[3], l.strides[2], l.strides[3], offset)
}

/// Row `row` of a strided matrix as a contiguous slice of `n` floats: borrowed when the columns
/// are contiguous, gathered into `tmp` otherwise. An empty row (`n = 0`) is the empty slice:
/// the matrix then has no element, and its offset and row stride may point anywhere.
fn row_of<'t>(m: &Strided<'t>, row: usize, n: usize, tmp: &'t mut [f32]) -> &'t [f32] {
    if n == 0 {
        return &[];
    }
    let start = m.offset + row * m.rs;
    if m.cs == 1 || n <= 1 {
        &m.data[start..start + n]
    } else {
        for (c, x) in tmp[..n].iter_mut().enumerate() {
            *x = m.data[start + c * m.cs];
        }
        &tmp[..n]
    }
}

/// `ln Σ_{k<n} e^(slope·(a + k))` in f64: the logsumexp of `n` scores of 0 plus an ALiBi term
/// over consecutive keys, in closed form (a geometric series), so that no loop runs over keys
/// no slice bounds. −∞ for `n = 0`.
fn lse_arithmetic(slope: f64, a: f64, n: f64) -> f64 {
    if n == 0.0 {
        return f64::NEG_INFINITY;
    }
    if slope == 0.0 {
        return n.ln();
    }
    // Factor out the largest term, then Σ_{k<n} r^k = (1 − rⁿ)/(1 − r) with r = e^(−|slope|).
    let top = if slope > 0.0 { slope * (a + n - 1.0) } else { slope * a };
    let s = slope.abs();
    top + (-(-s * n).exp_m1()).ln() - (-(-s).exp_m1()).ln()
}

/// The logsumexp of a row of optional (masked when `None`) f64 logits, as the reference's
/// softmax row computes it: NaN when any is NaN, `±∞` when the maximum is, −∞ when none is
/// visible.
pub(super) fn lse_f64(logits: impl Iterator<Item = Option<f64>> + Clone) -> f64 {
    let visible = logits.flatten();
    if visible.clone().any(f64::is_nan) {
        return f64::NAN;
    }
    let m = visible.clone().fold(f64::NEG_INFINITY, f64::max);
    if m.is_infinite() {
        return m;
    }
    m + visible.map(|t| (t - m).exp()).sum::<f64>().ln()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::arch::{vectorize, Kernel};
    use half::{bf16, f16};

    /// Query elements for the bit-for-bit tests of the scaled query: zeros, subnormals,
    /// infinities, NaNs of both signs and values near the f32 and f16 range limits.
    pub(crate) const SPECIAL_QUERIES: [f32; 15] = [
        0.0,
        -0.0,
        f32::from_bits(1),
        -f32::from_bits(1),
        1e-40,
        -3e-39,
        f32::MIN_POSITIVE,
        1.5,
        -2.25,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MAX,
        6.0e4,
    ];

    /// Scales of both signs, two that make products underflow (2⁻²⁰ and 2·10⁻²⁰), 0 and +∞.
    pub(crate) const SCALES: [f32; 8] =
        [0.125, -0.125, 9.536_743e-7, 2e-20, -1e-30, 3.0, 0.0, f32::INFINITY];

    /// Asserts that `got` has the bits of `scale_query(x, scale)`.
    pub(crate) fn assert_scaled(got: f32, x: f32, scale: f32, what: std::fmt::Arguments<'_>) {
        let want = scale_query(x, scale);
        assert_eq!(got.to_bits(), want.to_bits(), "{what}: x {x} scale {scale}: {got} vs {want}");
    }

    /// [`Problem::scaled_query`] gives the bits of [`scale_query`] on each widened element, by
    /// vectors (contiguous rows) and element by element (a column stride, the tail), on every
    /// ISA this CPU runs.
    #[test]
    fn scaled_query_rows_are_scale_query_bit_for_bit() {
        struct Rows<'p, 'a> {
            p: &'p Problem<'a>,
        }
        impl Kernel for Rows<'_, '_> {
            type Output = Vec<f32>;
            fn run<S: Simd>(self, s: S) -> Vec<f32> {
                let (hq, nq, dk) = (self.p.hq, self.p.nq, self.p.dk);
                let mut out = vec![f32::NAN; hq * nq * dk];
                for (r, row) in out.chunks_exact_mut(dk).enumerate() {
                    self.p.scaled_query(s, 0, r / nq, r % nq, row);
                }
                out
            }
        }
        fn check<T: SimdElement>(from: fn(f32) -> T)
        where
            for<'a> TensorRef<'a, T>: Into<AnyRef<'a>>,
        {
            let data: Vec<T> =
                (0..2 * 5 * 80).map(|i| from(SPECIAL_QUERIES[(i * 7 + i / 13) % 15])).collect();
            // (dk, strides): whole vectors with a tail, a column stride, a row shorter than a
            // vector.
            let shapes =
                [(37, [400, 80, 1]), (64, [400, 80, 1]), (9, [3, 45, 5]), (3, [400, 80, 1])];
            for isa in Isa::supported() {
                for scale in SCALES {
                    for (dk, [hs, rs, cs]) in shapes {
                        let layout = Tensor4Layout {
                            dims: [1, 2, 5, dk],
                            strides: [0, hs, rs, cs],
                            offset: 1,
                        };
                        let q = TensorRef::new(&data[..], layout);
                        let none = Mask::None;
                        let p = Problem::piece(
                            q.into(),
                            1,
                            1,
                            1,
                            scale,
                            &none,
                            0,
                            Variants::default(),
                            None,
                        );
                        let got = vectorize(isa, Rows { p: &p });
                        for (r, row) in got.chunks_exact(dk).enumerate() {
                            for (d, g) in row.iter().enumerate() {
                                let x = q.at(0, r / 5, r % 5, d).widen();
                                assert_scaled(*g, x, scale, format_args!("{isa} dk {dk} cs {cs}"));
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
