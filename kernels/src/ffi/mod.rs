//! The C ABI: `extern "C"` entry points for sgemm, scale-mask-softmax, attention (with its
//! decode path), layer norm,
//! multi-head / cross-attention and the encoder block (with attention variants through
//! `AttnVariants`), with explicit dims and strides.
//! `include/attn_kernels.h` is generated from this file by cbindgen (`cbindgen.toml`); a test
//! regenerates it and fails when the committed header differs (`ATTN_BLESS=1` rewrites it).
//!
//! The contract every function shares is written on [`AttnStatus`] (the first item of the
//! header), so that C users read it there: statuses and messages, views, null pointers,
//! overlap, overflow, enum and bool fields, thread counts.
//!
//! The unsafe operations (pointer + implied length → slice) live in `raw`; the functions here
//! only forward the caller's contract to them, after the null, value and overlap checks, and
//! then go through the safe Rust API, which checks shapes exactly as for Rust callers.

pub mod additive;
pub mod batch;
mod raw;

use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null;

use attn_core::{
    Activation, AnyMut, AnyRef, EncoderConfig, EncoderWeights, Error, FeedForwardWeights, KvRef,
    LayerNormWeights, Mask, MatLayout, MatMut, MatRef, MhaConfig, MhaWeights, Q8Ref, Tensor4Layout,
    TensorMut, TensorRef, Variants,
};

use crate::attention::{Attention, Path};
use crate::gemm::HalfPath;
use crate::par::Parallelism;
use raw::{disjoint, mat_len, slice, slice_mut, span, tensor_len, Failure, Span};

/// The outcome of a C call. What every function of this header shares:
///
/// **Statuses.** Every function returns an `AttnStatus` (never unwinds into C: a panic inside
/// is caught and reported as `ATTN_STATUS_PANIC`, a bug). After a failure,
/// `attn_last_error_message` gives a message naming the argument at fault (per thread).
/// Functions are reentrant: concurrent calls from several threads are fine when their outputs
/// are distinct.
///
/// **Views.** A matrix view `{data, rows, cols, row_stride, col_stride, offset}` reads element
/// `(i, j)` at `data[offset + i·row_stride + j·col_stride]`; a 4-D view likewise with four dims
/// and strides (in elements, not bytes). No buffer length is passed: the caller guarantees that
/// `data` addresses every element from `data[0]` to the last one the view reaches, initialised
/// and aligned for the element type: `float` unless the call takes a `*_dtype` for the view
/// (then `data` is a `void*` to elements of that type; see [`AttnDtype`]). So
/// `ATTN_STATUS_OUT_OF_BOUNDS` never comes from a view (the library computes each view's extent
/// and trusts it); it comes only from a caller workspace shorter than its `*_workspace_len`. A
/// view with a zero dimension is empty: its `data` may be NULL and is never read. An extent that
/// overflows `size_t`, or exceeds `PTRDIFF_MAX` bytes or the address space, is
/// `ATTN_STATUS_INDEX_OVERFLOW` naming the view. An output view must map distinct positions to
/// distinct elements (no zero stride on a dimension longer than 1), else
/// `ATTN_STATUS_ALIASED_OUTPUT`.
///
/// **Null pointers.** A NULL `data` (or vector pointer) where at least one element is needed is
/// `ATTN_STATUS_NULL_POINTER` naming it. Optional pointers (biases, `lse`, `mask`) mean "none"
/// when NULL; their lengths are then ignored (a NULL `lse` with any `lse_len` computes no
/// logsumexp).
///
/// **Overlap.** Outputs (output views, `lse`, the workspace) may share no byte with any other
/// operand of the call: checked before anything is read, `ATTN_STATUS_ALIASED_OUTPUT`, and the
/// message names the two arguments ("argument `y` overlaps argument `x`"). Empty and NULL
/// ranges overlap nothing. Inputs may overlap each other freely. The one in-place operation is
/// `attn_softmax` with `y` exactly `x` (same data, dims, strides and offset).
///
/// **Enum and bool fields** (`AttnMask.kind`, `AttnMask.causal_default_offset`, keep-mask
/// bytes, `AttnEncoderConfig.activation`, `AttnAttentionArgs.path`, `.has_scale` and
/// `.has_window`, `AttnVariants.has_window`) are
/// fixed-width integers, validated before use: any value that is not listed is
/// `ATTN_STATUS_INVALID_PARAMETER` naming the field.
///
/// **Growing.** `attn_attention_run` takes its operands and settings in one struct,
/// `AttnAttentionArgs`, that starts with its own `struct_size` and grows only at its end; new
/// attention settings are added there, never as new positional functions (see the struct).
/// The layers (`attn_*_forward_with_variants`) take their attention settings the same way, in
/// `AttnVariants` (its own `struct_size`; NULL for none).
///
/// **Threads.** `threads` is a request, the same policy as the Rust API's
/// `Parallelism::threads`: 0 = every available core, 1 = the calling thread only, n ≥ 2 = at
/// most `min(n, available cores)` threads. Any value is safe (`SIZE_MAX` included): the count is
/// clamped, the worker pools are bounded (one of all the cores for the whole process, and a
/// few smaller ones, the least recently used released), and small problems stay on the
/// calling thread. Every function gives bitwise identical results for every thread count
/// (the decode path splits keys into chunks fixed by the problem, not by the threads).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnStatus {
    /// Success.
    Ok = 0,
    /// `Error::ShapeMismatch`: a dimension does not match the others.
    ShapeMismatch = 1,
    /// `Error::OutOfBounds`: the workspace is shorter than the call needs (views have no
    /// length to check: see above).
    OutOfBounds = 2,
    /// `Error::IndexOverflow`: a view's offset and strides, or a length, overflow `size_t`,
    /// `PTRDIFF_MAX` bytes or the address space.
    IndexOverflow = 3,
    /// `Error::AliasedOutput`: an output view maps two positions to one element (a zero
    /// stride), or an output overlaps another operand (the message names both).
    AliasedOutput = 4,
    /// `Error::ZeroHeads`.
    ZeroHeads = 5,
    /// `Error::HeadsNotDivisible`.
    HeadsNotDivisible = 6,
    /// `Error::KvHeadsNotDividing`.
    KvHeadsNotDividing = 7,
    /// `Error::NonFinite`: a scale or epsilon is NaN or infinite.
    NonFinite = 8,
    /// `Error::InvalidParameter`: a scalar out of range, an enum or bool field with a value
    /// not listed, a keep-mask byte other than 0 or 1, a misaligned pointer, a buffer that
    /// cannot be allocated.
    InvalidParameter = 9,
    /// A required pointer is null.
    NullPointer = 10,
    /// A panic was caught at the boundary (a bug: please report it).
    Panic = 11,
    /// An element type (`AttnDtype`) that the operand cannot take: int8 for the queries or the
    /// output of attention (only K and V may be int8-quantised). The message names the field.
    UnsupportedDtype = 12,
}

impl AttnStatus {
    /// The status of a Rust API error.
    pub fn of(e: &Error) -> Self {
        match e {
            Error::ShapeMismatch { .. } => AttnStatus::ShapeMismatch,
            Error::OutOfBounds { .. } => AttnStatus::OutOfBounds,
            Error::IndexOverflow { .. } => AttnStatus::IndexOverflow,
            Error::AliasedOutput { .. } => AttnStatus::AliasedOutput,
            Error::ZeroHeads { .. } => AttnStatus::ZeroHeads,
            Error::HeadsNotDivisible { .. } => AttnStatus::HeadsNotDivisible,
            Error::KvHeadsNotDividing { .. } => AttnStatus::KvHeadsNotDividing,
            Error::NonFinite { .. } => AttnStatus::NonFinite,
            Error::InvalidParameter { .. } => AttnStatus::InvalidParameter,
        }
    }
}

/// A read-only matrix view: element `(i, j)` at `data[offset + i·row_stride + j·col_stride]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnMat {
    /// The elements (may be null when the view is empty): `float`s, or of the element type
    /// that the call's `*_dtype` argument names.
    pub data: *const c_void,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Distance between rows, in elements.
    pub row_stride: usize,
    /// Distance between columns, in elements.
    pub col_stride: usize,
    /// Index of element `(0, 0)`.
    pub offset: usize,
}

/// A writable matrix view (see [`AttnMat`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnMatMut {
    /// The elements (may be null when the view is empty): `float`s, or of the element type
    /// that the call's `*_dtype` argument names.
    pub data: *mut c_void,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Distance between rows, in elements.
    pub row_stride: usize,
    /// Distance between columns, in elements.
    pub col_stride: usize,
    /// Index of element `(0, 0)`.
    pub offset: usize,
}

/// A read-only `[batch, heads, seq, dim]` view: element `(b, h, s, d)` at
/// `data[offset + b·strides[0] + h·strides[1] + s·strides[2] + d·strides[3]]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnTensor {
    /// The elements (may be null when the view is empty): `float`s, or of the element type
    /// that the call's `*_dtype` argument names.
    pub data: *const c_void,
    /// `[batch, heads, seq, dim]`.
    pub dims: [usize; 4],
    /// Element strides of the four dimensions.
    pub strides: [usize; 4],
    /// Index of element `(0, 0, 0, 0)`.
    pub offset: usize,
}

/// A writable `[batch, heads, seq, dim]` view (see [`AttnTensor`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnTensorMut {
    /// The elements (may be null when the view is empty): `float`s, or of the element type
    /// that the call's `*_dtype` argument names.
    pub data: *mut c_void,
    /// `[batch, heads, seq, dim]`.
    pub dims: [usize; 4],
    /// Element strides of the four dimensions.
    pub strides: [usize; 4],
    /// Index of element `(0, 0, 0, 0)`.
    pub offset: usize,
}

/// The values of [`AttnMask::kind`]. The field itself is an `int32_t`: any other value is
/// refused with `ATTN_STATUS_INVALID_PARAMETER` naming `mask.kind`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnMaskKind {
    /// Every key visible.
    None = 0,
    /// Key `j` visible to query `i` iff `j ≤ i + offset`.
    Causal = 1,
    /// Byte keep-mask in `keep` (1 = attend, 0 = masked).
    Keep = 2,
    /// Additive bias in `bias`.
    Bias = 3,
}

impl AttnMaskKind {
    /// The kind `v` stands for, or the error naming `mask.kind`.
    fn from_c(v: i32) -> Result<Self, Failure> {
        Ok(match v {
            0 => AttnMaskKind::None,
            1 => AttnMaskKind::Causal,
            2 => AttnMaskKind::Keep,
            3 => AttnMaskKind::Bias,
            _ => {
                return Err(Failure::BadValue {
                    arg: "mask.kind",
                    value: i64::from(v),
                    allowed: "must be ATTN_MASK_KIND_NONE (0), ATTN_MASK_KIND_CAUSAL (1), \
                              ATTN_MASK_KIND_KEEP (2) or ATTN_MASK_KIND_BIAS (3)",
                })
            }
        })
    }
}

/// A mask over the `[batch, heads, nq, nk]` scores (softmax: `[batch, heads, rows, cols]`). A
/// null `const AttnMask*` means no mask. A masked position gets exactly zero weight; a row whose
/// every position is masked gives an all-zero output row and logsumexp −∞ (never NaN, never a
/// uniform average). Only the fields of the chosen `kind` are read (zero-initialise the rest).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnMask {
    /// Which mask: one of the [`AttnMaskKind`] values (`ATTN_MASK_KIND_*`), read as an
    /// `int32_t`; any other value is `ATTN_STATUS_INVALID_PARAMETER` naming `mask.kind`.
    pub kind: i32,
    /// Causal: 1 = use the default offset `nk − nq` (bottom-right, for a KV cache) and ignore
    /// `causal_offset`; 0 = use `causal_offset`. A byte (C `bool` values): any other value is
    /// `ATTN_STATUS_INVALID_PARAMETER` naming `mask.causal_default_offset`.
    pub causal_default_offset: u8,
    /// Causal: the diagonal offset when `causal_default_offset` is 0 (0 = PyTorch's
    /// `is_causal`; negative values hide more keys).
    pub causal_offset: isize,
    /// Keep: the elements, one byte each: 1 = attend, 0 = masked (a C `bool` array fits).
    /// Validated, not coerced: every byte of the range the view spans (from `keep[0]` to the
    /// last element it reaches, gaps between strided elements included) must be 0 or 1, else
    /// `ATTN_STATUS_INVALID_PARAMETER` naming `mask.keep`. Null with a non-empty view is
    /// `ATTN_STATUS_NULL_POINTER`.
    pub keep: *const u8,
    /// Bias: the elements, added to the scaled scores (−∞ masks a position).
    pub bias: *const f32,
    /// Keep / bias: must be `[batch, heads, nq, nk]`; zero strides broadcast.
    pub dims: [usize; 4],
    /// Keep / bias: element strides.
    pub strides: [usize; 4],
    /// Keep / bias: index of element `(0, 0, 0, 0)`.
    pub offset: usize,
}

/// The values of [`AttnAttentionArgs::path`]: which algorithm runs the call. The field itself is
/// an `int32_t`: any other value is refused with `ATTN_STATUS_INVALID_PARAMETER` naming
/// `args.path`. Every path has the same contract, checks and statuses.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnPath {
    /// The decode path for nq ≤ 16, the flash path otherwise (what [`attn_attention`] runs).
    Auto = 0,
    /// The flash (streaming, online-softmax) path, for any nq.
    Flash = 1,
    /// The decode path (keys split into chunks fixed by nk, partial results merged by
    /// logsumexp), for any nq; meant for a few queries over many keys (what [`attn_decode`]
    /// runs).
    Decode = 2,
    /// The unfused path: per head, the `nq × nk` scores are materialised, softmaxed and
    /// multiplied by V (memory `O(nq·nk)` per thread); for tests and comparisons.
    Unfused = 3,
}

impl AttnPath {
    /// The Rust path `v` stands for, or the error naming `args.path`.
    fn from_c(v: i32) -> Result<Path, Failure> {
        Ok(match v {
            0 => Path::Auto,
            1 => Path::Flash,
            2 => Path::Decode,
            3 => Path::Unfused,
            _ => {
                return Err(Failure::BadValue {
                    arg: "args.path",
                    value: i64::from(v),
                    allowed: "must be ATTN_PATH_AUTO (0), ATTN_PATH_FLASH (1), ATTN_PATH_DECODE \
                              (2) or ATTN_PATH_UNFUSED (3)",
                })
            }
        })
    }
}

/// The operands and settings of one [`attn_attention_run`] call,
/// `O = softmax(scale·Q·Kᵀ + mask)·V`.
///
/// **Versioning.** The struct starts with `struct_size` and only ever grows at its end: a
/// setting added later (attention variants, other element types, varlen offsets, page tables)
/// is a field appended in a later version of this header, whose zero value means "as before".
/// So zero-initialise the whole struct (`AttnAttentionArgs args = {0};`, or designated
/// initialisers), set `struct_size = sizeof(AttnAttentionArgs)`, then the fields you need, by
/// name. The library reads the fields it knows that `struct_size` covers (one that it does
/// not cover keeps its zero value), so a program built against an older header runs
/// unchanged on a newer library. Refused with `ATTN_STATUS_INVALID_PARAMETER` naming
/// `args.struct_size`: a size below the first version's (`struct_size` through `threads`,
/// 376 bytes on 64-bit targets) or above 4096, one between two versions' sizes, and a larger
/// struct (from a newer header) with a nonzero byte past the fields this library knows, since
/// that would be a setting it would ignore.
///
/// Fields left zero give: no mask, scale `1/√dk`, no logsumexp, every available core, path
/// `ATTN_PATH_AUTO`, (version 2) no window, softcap, sinks or ALiBi, (version 3) f32 operands,
/// and (version 4) bf16 operands widened to f32.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnAttentionArgs {
    /// `sizeof(AttnAttentionArgs)` in the caller's header (see the versioning rule above).
    pub struct_size: usize,
    /// Queries `[batch, hq, nq, dk]`.
    pub q: AttnTensor,
    /// Keys `[batch, hkv, nk, dk]` (hkv divides hq; query head `h` reads K/V head
    /// `h / (hq / hkv)`).
    pub k: AttnTensor,
    /// Values `[batch, hkv, nk, dv]`.
    pub v: AttnTensor,
    /// The output `[batch, hq, nq, dv]`, written (only) within its view.
    pub o: AttnTensorMut,
    /// The mask over `[batch, hq, nq, nk]`, or NULL for none (see [`AttnMask`]).
    pub mask: *const AttnMask,
    /// The score scale when `has_scale` is 1 (then it must be finite, else
    /// `ATTN_STATUS_NON_FINITE`); ignored when `has_scale` is 0.
    pub scale: f32,
    /// 0 = the default scale `1/√dk` (1 for dk = 0), `scale` ignored; 1 = use `scale`. A byte
    /// (C `bool` values): any other value is `ATTN_STATUS_INVALID_PARAMETER` naming
    /// `args.has_scale`.
    pub has_scale: u8,
    /// The algorithm: one of the [`AttnPath`] values (`ATTN_PATH_*`, 0 = auto), read as an
    /// `int32_t`; any other value is `ATTN_STATUS_INVALID_PARAMETER` naming `args.path`.
    pub path: i32,
    /// NULL for no logsumexp (then `lse_len` is ignored); otherwise `lse_len` must equal
    /// `batch·hq·nq` (`ATTN_STATUS_SHAPE_MISMATCH`) and `lse[(b·hq + h)·nq + i]` receives
    /// `ln Σ_j exp(scale·q_i·k_j + mask_ij)` for query `i` of head `h` of batch `b` (row-major
    /// over `[batch, hq, nq]`; −∞ for a fully masked row).
    pub lse: *mut f32,
    /// The number of floats at `lse`.
    pub lse_len: usize,
    /// Threads: 0 = every available core, 1 = the calling thread, n = at most n (see
    /// [`AttnStatus`]); the result is bitwise the same for every count.
    pub threads: usize,
    // Version 2: the attention variants (see the Rust `Variants`). Zero: none of them.
    /// 1 = a sliding window of `window_left` keys before and `window_right` keys after the
    /// causal diagonal (key `j` visible to query `i` when
    /// `i + off − window_left ≤ j ≤ i + off + window_right`, `off` the causal offset: the
    /// causal mask's, else `nk − nq`; `SIZE_MAX` is unbounded); 0 = no window, the two
    /// fields ignored. Any other value is `ATTN_STATUS_INVALID_PARAMETER` naming
    /// `args.has_window`.
    pub has_window: u8,
    /// Keys visible before the diagonal (when `has_window` is 1).
    pub window_left: usize,
    /// Keys visible after the diagonal (when `has_window` is 1); 0 with a causal mask is
    /// Mistral's window of `window_left + 1` keys.
    pub window_right: usize,
    /// Logit softcap `c`: scores become `c·tanh(s/c)` after scaling, before the mask. 0 = none;
    /// otherwise finite and `> 0` (`ATTN_STATUS_NON_FINITE` / `ATTN_STATUS_INVALID_PARAMETER`
    /// naming `softcap`).
    pub softcap: f32,
    /// NULL, or `hq` finite sink logits (one per query head) that join each row's softmax
    /// denominator and its logsumexp, carrying no value; a row with no visible key is then
    /// zeros with logsumexp `sinks[h]`.
    pub sinks: *const f32,
    /// NULL, or `hq` finite ALiBi slopes: `slope_h·(j − i − off)` is added to each score.
    pub alibi: *const f32,
    // Version 3: element types. Zero: f32 operands, as before.
    /// The element type of `q` (an [`AttnDtype`] value, `ATTN_DTYPE_*`, read as an `int32_t`):
    /// f32, bf16 or f16; `ATTN_DTYPE_Q8` is `ATTN_STATUS_UNSUPPORTED_DTYPE`. A view's `data`
    /// pointer (`void*`) then addresses elements of that type and its strides and offset
    /// count those elements.
    pub q_dtype: i32,
    /// The element type of `k`: f32, bf16, f16, or int8 blocks (`ATTN_DTYPE_Q8`, scales in
    /// `k_scales`).
    pub k_dtype: i32,
    /// The element type of `v`, as `k_dtype` (scales in `v_scales`).
    pub v_dtype: i32,
    /// The element type of `o`: f32, bf16 or f16 (rounded to nearest even; f16 overflows to
    /// `±∞` from 65520 on); `ATTN_DTYPE_Q8` is `ATTN_STATUS_UNSUPPORTED_DTYPE`.
    pub o_dtype: i32,
    /// With `k_dtype = ATTN_DTYPE_Q8`: the f32 scales of `k`, `[batch, hkv, nk, ⌈dk/32⌉]`, one
    /// per block of 32 values along `dk` (value = int8 · scale, exactly; see the Rust
    /// `attn_core::quant`). Ignored (may be all zero) otherwise.
    pub k_scales: AttnTensor,
    /// With `v_dtype = ATTN_DTYPE_Q8`: the scales of `v`, `[batch, hkv, nk, ⌈dv/32⌉]`.
    pub v_scales: AttnTensor,

    // Version 4: how bf16 operands are multiplied. Zero: widened to f32, as before.
    /// One of the [`AttnHalfPath`] values (`ATTN_HALF_PATH_*`, 0 = auto), read as an `int32_t`;
    /// any other value is `ATTN_STATUS_INVALID_PARAMETER` naming `args.half_path`.
    /// `ATTN_HALF_PATH_DOT` runs the flash path's products and the decode path's scores on
    /// `vdpbf16ps` (bf16 Q, K and V, a CPU with AVX512_BF16, else
    /// `ATTN_STATUS_INVALID_PARAMETER`; the bound it costs is in the Rust `Attention` docs,
    /// "bf16 on `vdpbf16ps`").
    pub half_path: i32,
}

/// The values of [`AttnAttentionArgs::half_path`] (the Rust `HalfPath`): how the flash and
/// decode paths multiply bf16 operands. The field is an `int32_t`: any other value is refused with
/// `ATTN_STATUS_INVALID_PARAMETER` naming `args.half_path`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnHalfPath {
    /// The library's choice: today, widen to f32 (0, the default).
    Auto = 0,
    /// Widen every operand to f32 and run the f32 kernels.
    Widen = 1,
    /// Both flash block products on the AVX512_BF16 `vdpbf16ps` kernel, the probabilities
    /// rounded to bf16; on the decode path the scores only (an even `dk`). bf16 Q, K and V
    /// only.
    Dot = 2,
}

impl AttnHalfPath {
    /// The Rust setting `v` stands for, or the error naming `args.half_path`.
    fn from_c(v: i32) -> Result<HalfPath, Failure> {
        Ok(match v {
            0 => HalfPath::Auto,
            1 => HalfPath::Widen,
            2 => HalfPath::Dot,
            _ => {
                return Err(Failure::BadValue {
                    arg: "args.half_path",
                    value: i64::from(v),
                    allowed: "must be ATTN_HALF_PATH_AUTO (0), ATTN_HALF_PATH_WIDEN (1) or \
                              ATTN_HALF_PATH_DOT (2)",
                })
            }
        })
    }
}

/// The values of the `*_dtype` fields of [`AttnAttentionArgs`] (and of the other argument
/// structs: paged, varlen, cache writes, [`AttnLayerOptions`]): the element type of an
/// operand. The fields are `int32_t`: any other value is `ATTN_STATUS_INVALID_PARAMETER`
/// naming the field. Accumulation and the softmax are f32 whatever the operands' types.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnDtype {
    /// `float` (the default: 0).
    F32 = 0,
    /// bfloat16, as `uint16_t` bits (the top half of an f32).
    Bf16 = 1,
    /// IEEE binary16, as `uint16_t` bits.
    F16 = 2,
    /// Symmetric int8 (`int8_t` values) in blocks of 32 along the last dimension, with one f32
    /// scale per block in a separate view: K and V only.
    Q8 = 3,
}

impl AttnDtype {
    /// The value of the field `arg`.
    fn from_c(arg: &'static str, v: i32) -> Result<Self, Failure> {
        Ok(match v {
            0 => AttnDtype::F32,
            1 => AttnDtype::Bf16,
            2 => AttnDtype::F16,
            3 => AttnDtype::Q8,
            v => {
                return Err(Failure::BadValue {
                    arg,
                    value: i64::from(v),
                    allowed: "must be ATTN_DTYPE_F32 (0), ATTN_DTYPE_BF16 (1), ATTN_DTYPE_F16 \
                              (2) or ATTN_DTYPE_Q8 (3)",
                })
            }
        })
    }

    /// The type of a query or output operand (`arg`), which cannot be int8.
    fn floating(arg: &'static str, v: i32) -> Result<Self, Failure> {
        let what = "ATTN_DTYPE_Q8: the queries and the output of attention are f32, bf16 or f16 \
                    (only K and V may be int8-quantised)";
        Self::not_q8(arg, v, what)
    }

    /// The value of the field `arg`, with [`AttnDtype::Q8`] refused as unsupported (`what`
    /// says why).
    fn not_q8(arg: &'static str, v: i32, what: &'static str) -> Result<Self, Failure> {
        match Self::from_c(arg, v)? {
            AttnDtype::Q8 => Err(Failure::Unsupported { arg, what }),
            t => Ok(t),
        }
    }
}

/// Runs `$body` with the type alias `$T` naming the Rust element type of `$t`, a floating
/// [`AttnDtype`] (`AttnDtype::Q8` was refused before, as [`AttnDtype::floating`] does; it maps
/// to `f32` here as in [`AttnTensor::any_view`]).
macro_rules! with_dtype {
    ($t:expr, $T:ident => $body:expr) => {
        match $t {
            AttnDtype::Bf16 => {
                type $T = half::bf16;
                $body
            }
            AttnDtype::F16 => {
                type $T = half::f16;
                $body
            }
            AttnDtype::F32 | AttnDtype::Q8 => {
                type $T = f32;
                $body
            }
        }
    };
}

/// The smallest `struct_size` [`attn_attention_run`] accepts: the first version of
/// [`AttnAttentionArgs`], `struct_size` through `threads`. Fixed for good: fields appended later
/// are read only when `struct_size` covers them.
const ATTENTION_ARGS_MIN_SIZE: usize =
    std::mem::offset_of!(AttnAttentionArgs, threads) + std::mem::size_of::<usize>();

/// The size of version 2 of [`AttnAttentionArgs`] (through `alibi`), which version 3 (the
/// element types) extends.
const ATTENTION_ARGS_V2_SIZE: usize =
    std::mem::offset_of!(AttnAttentionArgs, alibi) + std::mem::size_of::<*const f32>();

/// The size of version 3 of [`AttnAttentionArgs`] (through `v_scales`), which version 4
/// (`half_path`) extends.
const ATTENTION_ARGS_V3_SIZE: usize =
    std::mem::offset_of!(AttnAttentionArgs, v_scales) + std::mem::size_of::<AttnTensor>();

/// The shape of a multi-head attention layer (see the Rust `MhaConfig`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnMhaConfig {
    /// Width of the query-side input and of the output.
    pub in_dim: usize,
    /// Width of the key/value-side input (`in_dim` for self-attention).
    pub kv_in_dim: usize,
    /// Per-head width of queries and keys.
    pub k_dim: usize,
    /// Per-head width of values.
    pub v_dim: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub kv_heads: usize,
}

/// The attention variants of a layer (see the Rust `Variants`), for
/// [`attn_mha_forward_with_variants`], [`attn_cross_attention_forward_with_variants`] and
/// [`attn_encoder_forward_with_variants`]: the same settings as the variant fields of
/// [`AttnAttentionArgs`], applied to every head of the layer. A NULL `const AttnVariants*`
/// means none (plain attention, as the entry points without `_with_variants`).
///
/// **Versioning** as [`AttnAttentionArgs`]: the struct starts with `struct_size` and only ever
/// grows at its end (new attention settings of the layers are appended here, so the layer
/// entry points keep their arguments). Zero-initialise it, set
/// `struct_size = sizeof(AttnVariants)`, then the fields you need. Refused with
/// `ATTN_STATUS_INVALID_PARAMETER` naming `variants.struct_size`: a size below this first
/// version's (the whole struct, 56 bytes on 64-bit targets; it ends with a pointer, so a
/// field appended later always grows `sizeof`) or above 4096, and a larger struct
/// with a nonzero byte past the fields this library knows. (The config and weight structs of
/// the layers have no size field and stay as they are: that is why the variants come in a
/// struct of their own, through new entry points, and a caller of the old ones is unaffected.)
///
/// Fields left zero give no window, no softcap, no sinks and no ALiBi.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnVariants {
    /// `sizeof(AttnVariants)` in the caller's header (see the versioning rule above).
    pub struct_size: usize,
    /// 1 = a sliding window of `window_left` keys before and `window_right` keys after the
    /// causal diagonal (key `j` visible to query `i` when
    /// `i + off − window_left ≤ j ≤ i + off + window_right`, `off` the causal offset: the
    /// causal mask's, else `n_kv − n_q`, so 0 for self-attention; `SIZE_MAX` is unbounded);
    /// 0 = no window, the two fields ignored. Any other value is
    /// `ATTN_STATUS_INVALID_PARAMETER` naming `variants.has_window`.
    pub has_window: u8,
    /// Keys visible before the diagonal (when `has_window` is 1).
    pub window_left: usize,
    /// Keys visible after the diagonal (when `has_window` is 1).
    pub window_right: usize,
    /// Logit softcap `c`: scores become `c·tanh(s/c)` after scaling, before the mask. 0 = none;
    /// otherwise finite and `> 0` (`ATTN_STATUS_NON_FINITE` / `ATTN_STATUS_INVALID_PARAMETER`
    /// naming `softcap`).
    pub softcap: f32,
    /// NULL, or `num_heads` finite sink logits (one per query head) that join each row's
    /// softmax denominator and carry no value (else `ATTN_STATUS_NON_FINITE` naming `sinks`).
    pub sinks: *const f32,
    /// NULL, or `num_heads` finite ALiBi slopes: `slope_h·(j − i − off)` is added to each score
    /// (else `ATTN_STATUS_NON_FINITE` naming `alibi`).
    pub alibi: *const f32,
}

/// The smallest `struct_size` the layer entry points accept for [`AttnVariants`]: its first
/// version, the whole struct. Fixed for good.
const VARIANTS_MIN_SIZE: usize = std::mem::size_of::<AttnVariants>();

/// The options of a layer call that are not attention variants, for
/// [`attn_mha_forward_with_options`], [`attn_cross_attention_forward_with_options`] and
/// [`attn_encoder_forward_with_options`]; so far the element types. A NULL
/// `const AttnLayerOptions*` means the defaults (f32 weights and activations, as the entry
/// points without `_with_options`).
///
/// **Versioning** as [`AttnVariants`]: `struct_size` first, the struct only grows at its end.
/// Zero-initialise it, set `struct_size = sizeof(AttnLayerOptions)`, then the fields you need.
/// The first version is the whole struct (16 bytes on 64-bit targets). A wrong `struct_size`
/// is `ATTN_STATUS_INVALID_PARAMETER` naming `options.struct_size`.
///
/// **Element types.** A typed layer computes what the f32 layer computes on the exact values
/// its operands hold (every weight and input widened to f32 exactly), and rounds each output
/// element once to the activations' type, to nearest even (an f16 output beyond ±65504 rounds
/// to ±infinity). Accumulation, the workspace (still `float`, of the length the
/// `*_workspace_len` functions give whatever the types) and the attention inside are f32.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnLayerOptions {
    /// `sizeof(AttnLayerOptions)` in the caller's header (see the versioning rule above).
    pub struct_size: usize,
    /// The element type of every weight matrix, bias and layer-norm vector of the layer: an
    /// [`AttnDtype`] value, `ATTN_DTYPE_F32` (0, the default), `ATTN_DTYPE_BF16` or
    /// `ATTN_DTYPE_F16`; the pointers of the weights struct then address elements of that
    /// type (`uint16_t` bits for the half types; the pointers are `void*`).
    /// `ATTN_DTYPE_Q8` is `ATTN_STATUS_UNSUPPORTED_DTYPE`, an unknown value
    /// `ATTN_STATUS_INVALID_PARAMETER`, both naming `options.weights_dtype`.
    pub weights_dtype: i32,
    /// The element type of the inputs (`x`, `x1`, `x2`) and of the output `y`, as
    /// `weights_dtype` (errors name `options.activations_dtype`).
    pub activations_dtype: i32,
}

/// The smallest `struct_size` the layer entry points accept for [`AttnLayerOptions`]: its first
/// version, the whole struct. Fixed for good.
const LAYER_OPTIONS_MIN_SIZE: usize = std::mem::size_of::<AttnLayerOptions>();

/// Caller-owned MHA weights, each `[in, out]` (`y = x·W + b`): `wq: [in_dim, heads·k_dim]`,
/// `wk: [kv_in_dim, kv_heads·k_dim]`, `wv: [kv_in_dim, kv_heads·v_dim]`,
/// `wo: [heads·v_dim, in_dim]`. Biases may be null (none); otherwise they hold the matching
/// output width. The elements are `float`s, or of the type [`AttnLayerOptions::weights_dtype`]
/// names for the `_with_options` entry points (all of one type).
///
/// `wq`, `wk`, `wv` that are adjacent column blocks of one buffer run as one GEMM (self-
/// attention; `wk`, `wv` alone for cross-attention): same `rows`, `row_stride`, `col_stride`,
/// each block's first element (`data + offset`) exactly `cols·col_stride` elements after the
/// previous block's, and either the same `data` pointer (offsets selecting the blocks: e.g. a
/// row-major `[in, 3·w]` weight with offsets 0, w, 2w, or PyTorch's `in_proj_weight [3·w, in]`
/// read column-major with offsets 0, w·in, 2·w·in) or byte ranges that overlap (e.g. `data`
/// pointing at each block of a row-major `[in, 3·w]` weight). Blocks at different `data`
/// pointers whose ranges merely touch are not known to be one buffer and run as separate
/// GEMMs; the results agree within rounding either way.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnMhaWeights {
    /// Query projection.
    pub wq: AttnMat,
    /// Key projection.
    pub wk: AttnMat,
    /// Value projection.
    pub wv: AttnMat,
    /// Output projection.
    pub wo: AttnMat,
    /// Query bias or null.
    pub bq: *const c_void,
    /// Key bias or null.
    pub bk: *const c_void,
    /// Value bias or null.
    pub bv: *const c_void,
    /// Output bias or null.
    pub bo: *const c_void,
}

/// The values of [`AttnEncoderConfig::activation`]. The field itself is an `int32_t`: any
/// other value is refused with `ATTN_STATUS_INVALID_PARAMETER` naming `cfg.activation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnActivation {
    /// `max(x, 0)`.
    Relu = 0,
    /// GELU, tanh approximation.
    GeluTanh = 1,
}

/// The shape of a post-norm encoder block.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnEncoderConfig {
    /// The self-attention layer (`kv_in_dim = in_dim = d`).
    pub attn: AttnMhaConfig,
    /// Feed-forward hidden width.
    pub ff_dim: usize,
    /// Feed-forward activation: one of the [`AttnActivation`] values (`ATTN_ACTIVATION_*`),
    /// read as an `int32_t`; any other value is `ATTN_STATUS_INVALID_PARAMETER` naming
    /// `cfg.activation`.
    pub activation: i32,
    /// Layer-norm epsilon (finite, ≥ 0).
    pub eps: f32,
}

/// Caller-owned encoder weights: attention, norms (`[d]` each), feed-forward
/// (`w1: [d, ff_dim]`, `b1: [ff_dim]`, `w2: [ff_dim, d]`, `b2: [d]`; biases may be null).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnEncoderWeights {
    /// Self-attention weights.
    pub attn: AttnMhaWeights,
    /// First layer norm's scale.
    pub norm1_gamma: *const c_void,
    /// First layer norm's shift.
    pub norm1_beta: *const c_void,
    /// Feed-forward first layer.
    pub w1: AttnMat,
    /// Feed-forward first bias or null.
    pub b1: *const c_void,
    /// Feed-forward second layer.
    pub w2: AttnMat,
    /// Feed-forward second bias or null.
    pub b2: *const c_void,
    /// Second layer norm's scale.
    pub norm2_gamma: *const c_void,
    /// Second layer norm's shift.
    pub norm2_beta: *const c_void,
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs `f`, turning its failure or panic into a status and recording the message.
fn guard(f: impl FnOnce() -> Result<(), Failure>) -> AttnStatus {
    let (status, msg) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return AttnStatus::Ok,
        Ok(Err(Failure::Api(e))) => (AttnStatus::of(&e), e.to_string()),
        Ok(Err(Failure::Null(arg))) => {
            (AttnStatus::NullPointer, format!("argument `{arg}`: null pointer"))
        }
        Ok(Err(Failure::Overlap { output, other })) => (
            AttnStatus::AliasedOutput,
            format!(
                "argument `{output}` overlaps argument `{other}`: an output may share no memory \
                 with another operand of the call"
            ),
        ),
        Ok(Err(Failure::BadValue { arg, value, allowed })) => {
            (AttnStatus::InvalidParameter, format!("argument `{arg}`: got {value}; {allowed}"))
        }
        Ok(Err(Failure::Unsupported { arg, what })) => {
            (AttnStatus::UnsupportedDtype, format!("argument `{arg}`: {what}"))
        }
        Err(_) => (AttnStatus::Panic, "internal panic caught at the C boundary".to_string()),
    };
    // Formatting cannot unwind here (the message is built already); a failed access to the
    // thread-local during thread teardown only loses the message.
    let _ = LAST_ERROR.try_with(|m| *m.borrow_mut() = msg);
    status
}

fn threads(n: usize) -> Parallelism {
    Parallelism::threads(n)
}

/// The layout, byte span and Rust view of C view types sharing one layout kind: `$len` counts
/// the elements a layout reaches (`mat_len` / `tensor_len`); per type, `$slice` makes the slice
/// (`slice` for read-only views, `slice_mut` for writable ones) that its Rust view `$View` wraps,
/// under the caller's contract `$safety`.
macro_rules! c_views {
    (
        layout($s:ident) -> $Layout:ty { $layout:expr }, $len:ident;
        $($C:ident => $View:ident, $slice:ident, $safety:literal;)+
    ) => {$(
        impl $C {
            fn layout(&self) -> $Layout {
                let $s = self;
                $layout
            }
            /// The span of f32 elements and, after the overlap check, the view.
            fn span(&self, arg: &'static str) -> Result<Span, Failure> {
                self.span_as::<f32>(arg)
            }
            /// The byte span of the view when its elements are `T`s (`data` then addresses
            /// elements of that type, whatever its declared pointee).
            fn span_as<T>(&self, arg: &'static str) -> Result<Span, Failure> {
                span(arg, self.data.cast::<T>(), $len(arg, &self.layout())?)
            }
            /// # Safety
            #[doc = $safety]
            unsafe fn view<'a>(&self, arg: &'static str) -> Result<$View<'a>, Failure> {
                // SAFETY: forwarded from the caller.
                unsafe { self.view_as(arg) }
            }
            /// The view over elements of type `T` at `data`.
            ///
            /// # Safety
            #[doc = $safety]
            /// The elements are of type `T`.
            unsafe fn view_as<'a, T: Copy>(
                &self,
                arg: &'static str,
            ) -> Result<$View<'a, T>, Failure> {
                let l = self.layout();
                // SAFETY: forwarded from the caller.
                Ok($View::new(unsafe { $slice(arg, self.data.cast::<T>(), $len(arg, &l)?)? }, l))
            }
        }
    )+};
}

c_views! {
    layout(m) -> MatLayout {
        MatLayout::strided(m.rows, m.cols, m.row_stride, m.col_stride, m.offset)
    }, mat_len;
    AttnMat => MatRef, slice, "`data` addresses the view's elements, unwritten during the call.";
    AttnMatMut => MatMut, slice_mut,
        "`data` addresses the view's elements, used by nothing else during the call.";
}

c_views! {
    layout(t) -> Tensor4Layout { Tensor4Layout::strided(t.dims, t.strides, t.offset) }, tensor_len;
    AttnTensor => TensorRef, slice,
        "`data` addresses the view's elements, unwritten during the call.";
    AttnTensorMut => TensorMut, slice_mut,
        "`data` addresses the view's elements, used by nothing else during the call.";
}

impl AttnTensor {
    /// The empty view (null data, zero dims): an unused field.
    pub const EMPTY: AttnTensor =
        AttnTensor { data: null(), dims: [0; 4], strides: [0; 4], offset: 0 };

    /// The byte span of the view when its elements are of type `t` (`data` then addresses
    /// elements of that type, whatever its declared pointee).
    fn typed_span(&self, arg: &'static str, t: AttnDtype) -> Result<Span, Failure> {
        let (p, n) = (self.data, tensor_len(arg, &self.layout())?);
        match t {
            AttnDtype::F32 => span(arg, p, n),
            AttnDtype::Bf16 | AttnDtype::F16 => span(arg, p.cast::<u16>(), n),
            AttnDtype::Q8 => span(arg, p.cast::<i8>(), n),
        }
    }

    /// The query operand of floating type `t` (never [`AttnDtype::Q8`]: see
    /// [`AttnDtype::floating`]).
    ///
    /// # Safety
    /// As [`view_as`](Self::view_as) for the type `t` names.
    unsafe fn any_view<'a>(&self, arg: &'static str, t: AttnDtype) -> Result<AnyRef<'a>, Failure> {
        // SAFETY: forwarded from the caller.
        unsafe {
            Ok(match t {
                AttnDtype::Bf16 => AnyRef::BF16(self.view_as(arg)?),
                AttnDtype::F16 => AnyRef::F16(self.view_as(arg)?),
                AttnDtype::F32 | AttnDtype::Q8 => AnyRef::F32(self.view_as(arg)?),
            })
        }
    }

    /// A K or V operand of type `t`, with its f32 block scales (`scales`, named `sarg`) for
    /// [`AttnDtype::Q8`].
    ///
    /// # Safety
    /// As [`view_as`](Self::view_as) for the type `t` names, and for `f32` of `scales` when `t`
    /// is [`AttnDtype::Q8`].
    unsafe fn kv_view<'a>(
        &self,
        arg: &'static str,
        t: AttnDtype,
        (scales, sarg): (&AttnTensor, &'static str),
    ) -> Result<KvRef<'a>, Failure> {
        // SAFETY: forwarded from the caller.
        unsafe {
            Ok(match t {
                AttnDtype::F32 => KvRef::F32(self.view_as(arg)?),
                AttnDtype::Bf16 => KvRef::BF16(self.view_as(arg)?),
                AttnDtype::F16 => KvRef::F16(self.view_as(arg)?),
                AttnDtype::Q8 => {
                    KvRef::Q8(Q8Ref { values: self.view_as(arg)?, scales: scales.view_as(sarg)? })
                }
            })
        }
    }
}

impl AttnTensorMut {
    /// As [`AttnTensor::typed_span`], for an output of floating type `t`.
    fn typed_span(&self, arg: &'static str, t: AttnDtype) -> Result<Span, Failure> {
        let AttnTensorMut { data, dims, strides, offset } = *self;
        AttnTensor { data: data.cast_const(), dims, strides, offset }.typed_span(arg, t)
    }

    /// The output of floating type `t` (never [`AttnDtype::Q8`]: see [`AttnDtype::floating`]).
    ///
    /// # Safety
    /// As [`view_as`](Self::view_as) for the type `t` names.
    unsafe fn any_view<'a>(&self, arg: &'static str, t: AttnDtype) -> Result<AnyMut<'a>, Failure> {
        // SAFETY: forwarded from the caller.
        unsafe {
            Ok(match t {
                AttnDtype::Bf16 => AnyMut::BF16(self.view_as(arg)?),
                AttnDtype::F16 => AnyMut::F16(self.view_as(arg)?),
                AttnDtype::F32 | AttnDtype::Q8 => AnyMut::F32(self.view_as(arg)?),
            })
        }
    }
}

/// The mask's element span (empty for none/causal), after checking its kind.
///
/// # Safety
/// `mask` is null or points to a valid [`AttnMask`].
unsafe fn mask_span(mask: *const AttnMask) -> Result<Option<Span>, Failure> {
    // SAFETY: forwarded from the caller.
    let Some(m) = (unsafe { mask.as_ref() }) else { return Ok(None) };
    let l = Tensor4Layout::strided(m.dims, m.strides, m.offset);
    Ok(match AttnMaskKind::from_c(m.kind)? {
        AttnMaskKind::Keep => Some(span("mask", m.keep, tensor_len("mask", &l)?)?),
        AttnMaskKind::Bias => Some(span("mask", m.bias, tensor_len("mask", &l)?)?),
        AttnMaskKind::None | AttnMaskKind::Causal => None,
    })
}

/// The Rust mask, every enum and bool of it validated first.
///
/// # Safety
/// `mask` is null or points to a valid [`AttnMask`] whose `keep`/`bias` addresses its view.
unsafe fn mask_view<'a>(mask: *const AttnMask) -> Result<Mask<'a>, Failure> {
    // SAFETY: forwarded from the caller.
    let Some(m) = (unsafe { mask.as_ref() }) else { return Ok(Mask::None) };
    let layout = Tensor4Layout::strided(m.dims, m.strides, m.offset);
    Ok(match AttnMaskKind::from_c(m.kind)? {
        AttnMaskKind::None => Mask::None,
        AttnMaskKind::Causal => {
            let default = match m.causal_default_offset {
                0 => false,
                1 => true,
                v => {
                    return Err(Failure::BadValue {
                        arg: "mask.causal_default_offset",
                        value: i64::from(v),
                        allowed: "must be 0 (use causal_offset) or 1 (default offset nk - nq)",
                    })
                }
            };
            Mask::Causal { offset: (!default).then_some(m.causal_offset) }
        }
        AttnMaskKind::Keep => {
            // SAFETY: forwarded from the caller.
            let bytes = unsafe { slice("mask", m.keep, tensor_len("mask", &layout)?)? };
            Mask::Keep { keep: raw::bools("mask.keep", bytes)?, layout }
        }
        AttnMaskKind::Bias => {
            // SAFETY: forwarded from the caller.
            let bias = unsafe { slice("mask", m.bias, tensor_len("mask", &layout)?)? };
            Mask::Bias { bias, layout }
        }
    })
}

/// # Safety
/// `p` is null or points to a valid `T`.
unsafe fn deref<'a, T>(arg: &'static str, p: *const T) -> Result<&'a T, Failure> {
    // SAFETY: forwarded from the caller.
    unsafe { p.as_ref() }.ok_or(Failure::Null(arg))
}

/// # Safety
/// `p` is null or points to a valid `T` that nothing else uses during the call.
unsafe fn deref_mut<'a, T>(arg: &'static str, p: *mut T) -> Result<&'a mut T, Failure> {
    // SAFETY: forwarded from the caller.
    unsafe { p.as_mut() }.ok_or(Failure::Null(arg))
}

impl AttnMhaConfig {
    fn to_rust(self) -> MhaConfig {
        MhaConfig {
            in_dim: self.in_dim,
            kv_in_dim: self.kv_in_dim,
            k_dim: self.k_dim,
            v_dim: self.v_dim,
            num_heads: self.num_heads,
            kv_heads: self.kv_heads,
        }
    }
}

/// A layer's C weights and the C config they come with: what [`layer_operands`] needs to
/// check them and make their Rust views.
trait CWeights {
    /// The C config of the layer.
    type CConfig: Copy;
    /// The Rust config.
    type Config;
    /// The Rust weights, of element type `T`.
    type Weights<'a, T: 'a>;
    /// The Rust config of `c`, checked (the lengths of the weights' vectors are products of its
    /// sizes that must not overflow).
    fn config(c: Self::CConfig) -> Result<Self::Config, Failure>;
    /// Spans of the weights and vectors, of elements `T` (lengths from `cfg`).
    fn spans<T>(&self, cfg: &Self::Config) -> Result<Vec<Span>, Failure>;
    /// # Safety
    /// Every non-null pointer addresses its view (vectors: the width `cfg` implies) of
    /// elements `T`.
    unsafe fn view<'a, T: Copy>(&self, cfg: &Self::Config)
        -> Result<Self::Weights<'a, T>, Failure>;
    /// Query heads of the layer's attention (the length of its sinks and slopes).
    fn heads(cfg: &Self::Config) -> usize;
    /// Sets the attention variants of the weights.
    fn set_variants<'a, T>(w: &mut Self::Weights<'a, T>, v: Variants<'a>);
}

impl CWeights for AttnMhaWeights {
    type CConfig = AttnMhaConfig;
    type Config = MhaConfig;
    type Weights<'a, T: 'a> = MhaWeights<'a, T>;
    fn config(c: AttnMhaConfig) -> Result<MhaConfig, Failure> {
        let c = c.to_rust();
        c.check()?;
        Ok(c)
    }
    /// Spans of the weights and biases (bias lengths from `cfg`, checked first).
    fn spans<T>(&self, cfg: &MhaConfig) -> Result<Vec<Span>, Failure> {
        let [wq, wk, wv] = self.qkv::<T>();
        Ok(vec![
            wq.span_as::<T>("wq")?,
            wk.span_as::<T>("wk")?,
            wv.span_as::<T>("wv")?,
            self.wo.span_as::<T>("wo")?,
            span("bq", self.bq.cast::<T>(), cfg.q_width())?,
            span("bk", self.bk.cast::<T>(), cfg.k_width())?,
            span("bv", self.bv.cast::<T>(), cfg.v_width())?,
            span("bo", self.bo.cast::<T>(), cfg.in_dim)?,
        ])
    }
    /// # Safety
    /// Every non-null pointer addresses its view (biases: the width `cfg` implies) of
    /// elements `T`.
    unsafe fn view<'a, T: Copy>(&self, cfg: &MhaConfig) -> Result<MhaWeights<'a, T>, Failure> {
        // The bias lengths below are products that must not overflow.
        cfg.check()?;
        let [wq, wk, wv] = self.qkv::<T>();
        // SAFETY: forwarded from the caller (`qkv` only rebases views inside one buffer).
        unsafe {
            Ok(MhaWeights {
                wq: wq.view_as("wq")?,
                wk: wk.view_as("wk")?,
                wv: wv.view_as("wv")?,
                wo: self.wo.view_as("wo")?,
                bq: opt("bq", self.bq.cast::<T>(), cfg.q_width())?,
                bk: opt("bk", self.bk.cast::<T>(), cfg.k_width())?,
                bv: opt("bv", self.bv.cast::<T>(), cfg.v_width())?,
                bo: opt("bo", self.bo.cast::<T>(), cfg.in_dim)?,
                variants: Variants::NONE,
            })
        }
    }
    fn heads(cfg: &MhaConfig) -> usize {
        cfg.num_heads
    }
    fn set_variants<'a, T>(w: &mut MhaWeights<'a, T>, v: Variants<'a>) {
        w.variants = v;
    }
}

impl AttnMhaWeights {
    /// `wq`, `wk`, `wv`, with each run of adjacent column blocks of one buffer rebased onto one
    /// `data` pointer (the lowest of the run, offsets adjusted), so that the layer sees them as
    /// views of one slice and runs them as one GEMM (`layers::mha`'s `project`). A run is
    /// consecutive views in that order with equal `rows`, `row_stride` and `col_stride`, each
    /// starting (by address: `data + offset`) exactly `cols · col_stride` elements after the
    /// previous one starts, and known to share a buffer: the same `data`, or byte ranges that
    /// overlap (two valid ranges that overlap belong to one allocation). Views merely next to
    /// each other in memory with different `data` pointers are left alone (three GEMMs, same
    /// results): C cannot say they are one buffer.
    /// `T` is the type of the elements the views address.
    fn qkv<T>(&self) -> [AttnMat; 3] {
        let mut w = [self.wq, self.wk, self.wv];
        let mut start = 0;
        for end in 1..=w.len() {
            if end == w.len() || !joins::<T>(&w[end - 1], &w[end]) {
                rebase::<T>(&mut w[start..end]);
                start = end;
            }
        }
        w
    }
}

/// Byte address of element `(0, 0)` of a non-empty view of `T`s, if it does not overflow.
fn first_addr<T>(m: &AttnMat) -> Option<usize> {
    (m.data as usize).checked_add(m.offset.checked_mul(std::mem::size_of::<T>())?)
}

/// True when `b` is the column block right after `a`'s, in the same buffer of `T`s (see
/// [`AttnMhaWeights::qkv`]).
fn joins<T>(a: &AttnMat, b: &AttnMat) -> bool {
    let non_empty = |m: &AttnMat| !m.data.is_null() && m.rows > 0 && m.cols > 0;
    if !(non_empty(a) && non_empty(b))
        || (a.rows, a.row_stride, a.col_stride) != (b.rows, b.row_stride, b.col_stride)
    {
        return false;
    }
    let next = a
        .cols
        .checked_mul(a.col_stride)
        .and_then(|e| e.checked_mul(std::mem::size_of::<T>()))
        .and_then(|bytes| first_addr::<T>(a)?.checked_add(bytes));
    if next.is_none() || next != first_addr::<T>(b) {
        return false;
    }
    match (a.span_as::<T>("a"), b.span_as::<T>("b")) {
        (Ok(sa), Ok(sb)) => std::ptr::eq(a.data, b.data) || raw::overlap(&sa, &sb),
        _ => false,
    }
}

/// Rebases the views of `run` (of `T`s) onto the lowest `data` pointer among them, keeping
/// every element's address; leaves them as they are when that is not exact (a pointer not
/// aligned for `T`, an offset that overflows).
fn rebase<T>(run: &mut [AttnMat]) {
    let Some(base) = run.iter().map(|m| m.data).min_by_key(|p| *p as usize) else { return };
    let size = std::mem::size_of::<T>();
    let moved: Option<Vec<usize>> = run
        .iter()
        .map(|m| {
            let bytes = m.data as usize - base as usize;
            bytes.is_multiple_of(size).then_some(())?;
            m.offset.checked_add(bytes / size)
        })
        .collect();
    if let Some(offsets) = moved {
        for (m, offset) in run.iter_mut().zip(offsets) {
            m.data = base;
            m.offset = offset;
        }
    }
}

/// An optional vector: null is `None`.
///
/// # Safety
/// A non-null `p` addresses `len` elements.
unsafe fn opt<'a, T>(
    arg: &'static str,
    p: *const T,
    len: usize,
) -> Result<Option<&'a [T]>, Failure> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded from the caller.
    Ok(Some(unsafe { slice(arg, p, len)? }))
}

/// An optional output vector: null is `None`.
///
/// # Safety
/// A non-null `p` addresses `len` elements that nothing else uses during the call.
unsafe fn opt_mut<'a>(
    arg: &'static str,
    p: *mut f32,
    len: usize,
) -> Result<Option<&'a mut [f32]>, Failure> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded from the caller.
    Ok(Some(unsafe { slice_mut(arg, p, len)? }))
}

impl AttnEncoderConfig {
    /// The Rust config, after checking `activation` (the only field that is not a size).
    fn to_rust(self) -> Result<EncoderConfig, Failure> {
        let activation = match self.activation {
            0 => Activation::Relu,
            1 => Activation::GeluTanh,
            v => {
                return Err(Failure::BadValue {
                    arg: "cfg.activation",
                    value: i64::from(v),
                    allowed: "must be ATTN_ACTIVATION_RELU (0) or ATTN_ACTIVATION_GELU_TANH (1)",
                })
            }
        };
        Ok(EncoderConfig {
            attn: self.attn.to_rust(),
            ff_dim: self.ff_dim,
            activation,
            eps: self.eps,
        })
    }
}

impl CWeights for AttnEncoderWeights {
    type CConfig = AttnEncoderConfig;
    type Config = EncoderConfig;
    type Weights<'a, T: 'a> = EncoderWeights<'a, T>;
    fn config(c: AttnEncoderConfig) -> Result<EncoderConfig, Failure> {
        let c = c.to_rust()?;
        c.check()?;
        Ok(c)
    }
    fn spans<T>(&self, cfg: &EncoderConfig) -> Result<Vec<Span>, Failure> {
        let d = cfg.attn.in_dim;
        let mut s = self.attn.spans::<T>(&cfg.attn)?;
        s.extend([
            span("norm1.gamma", self.norm1_gamma.cast::<T>(), d)?,
            span("norm1.beta", self.norm1_beta.cast::<T>(), d)?,
            self.w1.span_as::<T>("w1")?,
            span("b1", self.b1.cast::<T>(), cfg.ff_dim)?,
            self.w2.span_as::<T>("w2")?,
            span("b2", self.b2.cast::<T>(), d)?,
            span("norm2.gamma", self.norm2_gamma.cast::<T>(), d)?,
            span("norm2.beta", self.norm2_beta.cast::<T>(), d)?,
        ]);
        Ok(s)
    }
    /// # Safety
    /// Every non-null pointer addresses its view (vectors: the width `cfg` implies) of
    /// elements `T`.
    unsafe fn view<'a, T: Copy>(
        &self,
        cfg: &EncoderConfig,
    ) -> Result<EncoderWeights<'a, T>, Failure> {
        let d = cfg.attn.in_dim;
        // SAFETY: forwarded from the caller.
        unsafe {
            Ok(EncoderWeights {
                attn: self.attn.view(&cfg.attn)?,
                norm1: LayerNormWeights {
                    gamma: slice("norm1.gamma", self.norm1_gamma.cast::<T>(), d)?,
                    beta: slice("norm1.beta", self.norm1_beta.cast::<T>(), d)?,
                },
                ff: FeedForwardWeights {
                    w1: self.w1.view_as("w1")?,
                    b1: opt("b1", self.b1.cast::<T>(), cfg.ff_dim)?,
                    w2: self.w2.view_as("w2")?,
                    b2: opt("b2", self.b2.cast::<T>(), d)?,
                },
                norm2: LayerNormWeights {
                    gamma: slice("norm2.gamma", self.norm2_gamma.cast::<T>(), d)?,
                    beta: slice("norm2.beta", self.norm2_beta.cast::<T>(), d)?,
                },
            })
        }
    }
    fn heads(cfg: &EncoderConfig) -> usize {
        cfg.attn.num_heads
    }
    fn set_variants<'a, T>(w: &mut EncoderWeights<'a, T>, v: Variants<'a>) {
        w.attn.variants = v;
    }
}

/// The name of a status, e.g. `"ATTN_STATUS_SHAPE_MISMATCH"`, as a static NUL-terminated
/// string; any integer that is not an [`AttnStatus`] value gives `"unknown status"` (never
/// null). The argument is an `int32_t`, so any value may be passed.
#[no_mangle]
pub extern "C" fn attn_status_name(status: i32) -> *const c_char {
    const NAMES: [&[u8]; 13] = [
        b"ATTN_STATUS_OK\0",
        b"ATTN_STATUS_SHAPE_MISMATCH\0",
        b"ATTN_STATUS_OUT_OF_BOUNDS\0",
        b"ATTN_STATUS_INDEX_OVERFLOW\0",
        b"ATTN_STATUS_ALIASED_OUTPUT\0",
        b"ATTN_STATUS_ZERO_HEADS\0",
        b"ATTN_STATUS_HEADS_NOT_DIVISIBLE\0",
        b"ATTN_STATUS_KV_HEADS_NOT_DIVIDING\0",
        b"ATTN_STATUS_NON_FINITE\0",
        b"ATTN_STATUS_INVALID_PARAMETER\0",
        b"ATTN_STATUS_NULL_POINTER\0",
        b"ATTN_STATUS_PANIC\0",
        b"ATTN_STATUS_UNSUPPORTED_DTYPE\0",
    ];
    let s: &'static [u8] = usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or(b"unknown status\0");
    s.as_ptr().cast()
}

/// Copies the message of this thread's last failed call (NUL-terminated, truncated to
/// `cap − 1` bytes) into `buf`, and returns the full message length in bytes (0 if none).
/// `buf` may be null when `cap` is 0, to query the length.
///
/// # Safety
///
/// `buf` addresses `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn attn_last_error_message(buf: *mut c_char, cap: usize) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR
            .try_with(|m| {
                let m = m.borrow();
                if cap > 0 && !buf.is_null() {
                    let n = m.len().min(cap - 1);
                    // SAFETY: the caller guarantees `cap` writable bytes at `buf`.
                    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), cap) };
                    out[..n].copy_from_slice(&m.as_bytes()[..n]);
                    out[n] = 0;
                }
                m.len()
            })
            .unwrap_or(0)
    }))
    .unwrap_or(0)
}

/// `C ← α·A·B + β·C` (`A: m×k`, `B: k×n`, `C: m×n`, any strides and offsets: a transposed or
/// column-major operand is just other strides).
///
/// - `alpha`, `beta` must be finite (`ATTN_STATUS_NON_FINITE` naming them).
/// - β = 0: C is not read (a NaN already in C does not reach the result).
/// - α = 0 or k = 0: `A·B` is not computed, as in BLAS: `C ← β·C` (NaN or ∞ in A or B do not
///   matter; with β = 0 too, C is set to zeros).
/// - m = 0 or n = 0: nothing is read or written.
/// - Nothing outside C's view is written, nothing outside the three views is read.
/// - `threads`: see [`AttnStatus`] (0 = all cores, 1 = this thread, n = at most n). The
///   result is bitwise the same for every thread count.
///
/// # Safety
///
/// Each view's `data` addresses the elements the view reaches; `c` overlaps neither `a` nor
/// `b` (checked).
#[no_mangle]
pub unsafe extern "C" fn attn_sgemm(
    alpha: f32,
    a: AttnMat,
    b: AttnMat,
    beta: f32,
    c: AttnMatMut,
    threads: usize,
) -> AttnStatus {
    guard(|| {
        disjoint(&[c.span("c")?], &[a.span("a")?, b.span("b")?])?;
        // SAFETY: the caller's contract; outputs checked disjoint from inputs.
        let (a, b, c) = unsafe { (a.view("a")?, b.view("b")?, c.view("c")?) };
        Ok(crate::gemm::sgemm(alpha, a, b, beta, c, self::threads(threads))?)
    })
}

/// Fused `y = softmax(scale·x + mask)` over the last dimension of a `[batch, heads, rows,
/// cols]` view (`mask` null for none, else over `[batch, heads, rows, cols]`).
///
/// - `scale` must be finite. Logits are `scale·x` (plus the bias of a bias mask) in f32.
/// - `lse` may be NULL (then `lse_len` is ignored); otherwise `lse_len` must equal
///   `batch·heads·rows` (`ATTN_STATUS_SHAPE_MISMATCH`) and `lse[(b·heads + h)·rows + i]`
///   receives row `(b, h, i)`'s logsumexp `ln Σ_j exp(logit_j)` (row-major over
///   `[batch, heads, rows]`, whatever the strides of `x` and `y`).
/// - Masked positions get exactly 0. A row whose every position is masked or `−∞` (or that
///   is empty, `cols = 0`) is all zeros with logsumexp −∞, never NaN.
/// - `+∞` logits share the row's weight evenly (`1/count` each, 0 elsewhere), logsumexp +∞;
///   `−∞` logits get weight 0; a NaN visible logit makes the whole row NaN.
/// - In place: pass `y` exactly equal to `x` (same data, dims, strides, offset); bit for bit
///   the out-of-place result. Any other overlap of `y` (or `lse`) with `x` or the mask is
///   `ATTN_STATUS_ALIASED_OUTPUT`.
/// - `threads`: see [`AttnStatus`]; the result is bitwise the same for every thread count.
///
/// # Safety
///
/// Views address their elements, `lse` addresses `lse_len` floats, `mask` is null or valid;
/// outputs overlap nothing else (checked).
#[no_mangle]
pub unsafe extern "C" fn attn_softmax(
    x: AttnTensor,
    scale: f32,
    mask: *const AttnMask,
    y: AttnTensorMut,
    lse: *mut f32,
    lse_len: usize,
    threads: usize,
) -> AttnStatus {
    // SAFETY: the caller's contract (f32 elements at `x.data` and `y.data`).
    guard(|| unsafe {
        softmax_call(x, AttnDtype::F32, scale, mask, y, AttnDtype::F32, lse, lse_len, threads)
    })
}

/// [`attn_softmax`] with the element types of `x` and `y`: `x_dtype`, `y_dtype` are
/// [`AttnDtype`] values (`int32_t`), each f32, bf16 or f16; `x.data` and `y.data` then address
/// elements of those types (they are `void*`), and strides and offsets
/// count elements. bf16/f16 logits are widened exactly; the result is the f32 softmax of those
/// values with each output rounded once (to nearest even) to `y_dtype`; logsumexps stay
/// `float`. `ATTN_DTYPE_Q8` is `ATTN_STATUS_UNSUPPORTED_DTYPE`, any other value
/// `ATTN_STATUS_INVALID_PARAMETER`, each naming `x_dtype` or `y_dtype`. In place: `y` exactly
/// `x` with the same type; overlaps are measured in each view's own bytes.
///
/// # Safety
///
/// As [`attn_softmax`], each view addressing elements of its type.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_softmax_typed(
    x: AttnTensor,
    x_dtype: i32,
    scale: f32,
    mask: *const AttnMask,
    y: AttnTensorMut,
    y_dtype: i32,
    lse: *mut f32,
    lse_len: usize,
    threads: usize,
) -> AttnStatus {
    guard(|| {
        let what = "ATTN_DTYPE_Q8: softmax logits and outputs are f32, bf16 or f16";
        let xt = AttnDtype::not_q8("x_dtype", x_dtype, what)?;
        let yt = AttnDtype::not_q8("y_dtype", y_dtype, what)?;
        // SAFETY: the caller's contract.
        unsafe { softmax_call(x, xt, scale, mask, y, yt, lse, lse_len, threads) }
    })
}

/// The body of [`attn_softmax`] and [`attn_softmax_typed`] (neither type int8).
///
/// # Safety
/// As [`attn_softmax_typed`].
#[allow(clippy::too_many_arguments)]
unsafe fn softmax_call(
    x: AttnTensor,
    xt: AttnDtype,
    scale: f32,
    mask: *const AttnMask,
    y: AttnTensorMut,
    yt: AttnDtype,
    lse: *mut f32,
    lse_len: usize,
    threads: usize,
) -> Result<(), Failure> {
    with_dtype!(xt, X => with_dtype!(yt, Y => {
        // In place when `y` is `x` exactly (same data, dims, strides, offset and type).
        let in_place = std::ptr::eq(x.data, y.data)
            && (x.dims, x.strides, x.offset) == (y.dims, y.strides, y.offset)
            && xt == yt;
        // SAFETY: the caller's contract.
        let mask_span = unsafe { mask_span(mask)? };
        let inputs: Vec<Span> = if in_place { vec![] } else { vec![x.span_as::<X>("x")?] };
        let inputs: Vec<Span> = inputs.into_iter().chain(mask_span).collect();
        disjoint(&[y.span_as::<Y>("y")?, span("lse", lse, lse_len)?], &inputs)?;
        // SAFETY: the caller's contract; outputs checked disjoint from everything else.
        let (mask, y) = unsafe { (mask_view(mask)?, y.view_as::<Y>("y")?) };
        // SAFETY: as above.
        let lse = unsafe { opt_mut("lse", lse, lse_len)? };
        let par = self::threads(threads);
        if in_place {
            return Ok(crate::softmax::scale_mask_softmax_inplace(y, scale, &mask, lse, par)?);
        }
        // SAFETY: as above (`x` is not `y` and overlaps no output).
        let x = unsafe { x.view_as::<X>("x")? };
        Ok(crate::softmax::scale_mask_softmax(x, scale, &mask, y, lse, par)?)
    }))
}

/// `O = softmax(scale·Q·Kᵀ + mask)·V` over `[batch, heads]`, every operand and setting in one
/// [`AttnAttentionArgs`] (the call shape new settings go into; see the struct's versioning
/// rule). For `args = {struct_size, q, k, v, o}` and every other field zero: no mask, scale
/// `1/√dk`, no logsumexp, every available core, the decode path for nq ≤ 16 and the flash
/// path otherwise.
///
/// - `q: [b, hq, nq, dk]`, `k: [b, hkv, nk, dk]`, `v: [b, hkv, nk, dv]`, `o: [b, hq, nq, dv]`;
///   GQA/MQA when hkv < hq: hkv must divide hq, query head `h` reads K/V head `h / (hq / hkv)`.
/// - A fully masked row (every key masked, or nk = 0) gives an all-zero output row and
///   logsumexp −∞. A key of zero weight contributes exactly 0 even if its value is ±∞ or NaN.
///   A `−∞` bias masks its position. A score (`scale·q·k + mask`) beyond the f32 range is
///   `±∞`, as a `±∞` bias is: the `+∞` scores of a row share its weight evenly (the output
///   row is the mean of their values, logsumexp `+∞`); a NaN score gives a NaN row.
/// - nq = 0 or an empty head dimension is fine (nothing, or zeros, to write).
/// - Statuses: `ATTN_STATUS_NULL_POINTER` naming `args` for a NULL `args`;
///   `ATTN_STATUS_INVALID_PARAMETER` naming `args` for a pointer not aligned for the struct,
///   naming `args.struct_size`, `args.path` or `args.has_scale` for a value those fields may
///   not take; then those of [`attn_attention`], in the same order.
///
/// # Safety
///
/// `args` is null or addresses `args->struct_size` readable, initialised bytes (a whole
/// `AttnAttentionArgs` of the caller's header); each view's `data` addresses the elements the
/// view reaches, `lse` addresses `lse_len` floats, `mask` is null or valid; outputs overlap
/// nothing else (checked).
#[no_mangle]
pub unsafe extern "C" fn attn_attention_run(args: *const AttnAttentionArgs) -> AttnStatus {
    guard(|| {
        // SAFETY: the caller's contract; `AttnAttentionArgs` is `repr(C)`, starts with its
        // `size_t struct_size`, and is valid when all-zero (integers, floats, raw pointers).
        let args = unsafe {
            let versions =
                [ATTENTION_ARGS_MIN_SIZE, ATTENTION_ARGS_V2_SIZE, ATTENTION_ARGS_V3_SIZE];
            raw::read_sized(("args", "args.struct_size"), args, &versions)?
        };
        // SAFETY: forwarded from the caller.
        unsafe { attention_call(&args) }
    })
}

/// `O = softmax(scale·Q·Kᵀ + mask)·V` with positional arguments: [`attn_attention_run`] with
/// `has_scale = 1` and `path = ATTN_PATH_AUTO` (the decode path for nq ≤ 16, the flash path
/// otherwise), the same checks, statuses and results. Kept for existing callers; settings
/// added later (variants, element types, varlen and paged operands) go only into
/// [`AttnAttentionArgs`].
///
/// - `scale` must be finite (1/√dk is the usual choice).
/// - `mask` may be NULL (none); otherwise over `[b, hq, nq, nk]` (see [`AttnMask`]).
/// - `lse` may be NULL (then `lse_len` is ignored); otherwise `lse_len` must equal `b·hq·nq`
///   and `lse[(b·hq + h)·nq + i]` receives `ln Σ_j exp(scale·q_i·k_j + mask_ij)` for query `i`
///   of head `h` of batch `b` (row-major over `[b, hq, nq]`).
/// - `threads`: see [`AttnStatus`]; the result is bitwise the same for every thread count.
///
/// # Safety
///
/// Each view's `data` addresses the elements the view reaches, `lse` addresses `lse_len`
/// floats, `mask` is null or valid; outputs overlap nothing else (checked).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_attention(
    q: AttnTensor,
    k: AttnTensor,
    v: AttnTensor,
    scale: f32,
    mask: *const AttnMask,
    o: AttnTensorMut,
    lse: *mut f32,
    lse_len: usize,
    threads: usize,
) -> AttnStatus {
    let args = AttnAttentionArgs::positional([q, k, v], scale, mask, o, (lse, lse_len), threads, 0);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { attention_call(&args) })
}

/// Decode-step attention: [`attn_attention`] forced onto the decode path (few queries over
/// many keys: keys split across threads, partial results merged by logsumexp), for any nq;
/// [`attn_attention_run`] with `has_scale = 1` and `path = ATTN_PATH_DECODE`. Same arguments,
/// conventions and statuses as [`attn_attention`], bitwise the same for every thread count.
/// Kept for existing callers (new settings go only into [`AttnAttentionArgs`]).
///
/// # Safety
///
/// As [`attn_attention`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_decode(
    q: AttnTensor,
    k: AttnTensor,
    v: AttnTensor,
    scale: f32,
    mask: *const AttnMask,
    o: AttnTensorMut,
    lse: *mut f32,
    lse_len: usize,
    threads: usize,
) -> AttnStatus {
    let path = AttnPath::Decode as i32;
    let args =
        AttnAttentionArgs::positional([q, k, v], scale, mask, o, (lse, lse_len), threads, path);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { attention_call(&args) })
}

impl AttnAttentionArgs {
    /// The arguments of the positional entry points, with an explicit scale.
    fn positional(
        [q, k, v]: [AttnTensor; 3],
        scale: f32,
        mask: *const AttnMask,
        o: AttnTensorMut,
        (lse, lse_len): (*mut f32, usize),
        threads: usize,
        path: i32,
    ) -> Self {
        AttnAttentionArgs {
            struct_size: std::mem::size_of::<Self>(),
            q,
            k,
            v,
            o,
            mask,
            scale,
            has_scale: 1,
            path,
            lse,
            lse_len,
            threads,
            has_window: 0,
            window_left: 0,
            window_right: 0,
            softcap: 0.0,
            sinks: std::ptr::null(),
            alibi: std::ptr::null(),
            q_dtype: 0,
            k_dtype: 0,
            v_dtype: 0,
            o_dtype: 0,
            k_scales: AttnTensor::EMPTY,
            v_scales: AttnTensor::EMPTY,
            half_path: 0,
        }
    }
}

/// The one body of every attention entry point: the enum and bool fields validated, then the
/// null, bounds and overlap checks, then the Rust [`Attention`]
/// problem, which checks shapes as for Rust callers.
///
/// # Safety
/// As [`attn_attention_run`] (after `args` was read).
unsafe fn attention_call(a: &AttnAttentionArgs) -> Result<(), Failure> {
    let path = AttnPath::from_c(a.path)?;
    let half = AttnHalfPath::from_c(a.half_path)?;
    let scale = match a.has_scale {
        0 => None,
        1 => Some(a.scale),
        v => {
            return Err(Failure::BadValue {
                arg: "args.has_scale",
                value: i64::from(v),
                allowed: "must be 0 (the default scale 1/sqrt(dk)) or 1 (use args.scale)",
            })
        }
    };
    let variants = CVariants {
        has_window: (a.has_window, "args.has_window"),
        window: (a.window_left, a.window_right),
        softcap: a.softcap,
        sinks: a.sinks,
        alibi: a.alibi,
    };
    variants.window()?;
    // Sinks and slopes: one per query head (the view's dims, checked against the other
    // operands by the Rust problem).
    let (qt, ot) = (
        AttnDtype::floating("args.q_dtype", a.q_dtype)?,
        AttnDtype::floating("args.o_dtype", a.o_dtype)?,
    );
    let kv = [
        (AttnDtype::from_c("args.k_dtype", a.k_dtype)?, &a.k, &a.k_scales, ["k", "k_scales"]),
        (AttnDtype::from_c("args.v_dtype", a.v_dtype)?, &a.v, &a.v_scales, ["v", "v_scales"]),
    ];
    let hq = a.q.dims[1];
    let mut inputs = vec![a.q.typed_span("q", qt)?];
    for (t, x, scales, [arg, sarg]) in kv {
        inputs.push(x.typed_span(arg, t)?);
        if t == AttnDtype::Q8 {
            inputs.push(scales.span(sarg)?);
        }
    }
    inputs.extend(variants.spans(hq)?);
    // SAFETY: forwarded from the caller.
    inputs.extend(unsafe { mask_span(a.mask)? });
    disjoint(&[a.o.typed_span("o", ot)?, span("lse", a.lse, a.lse_len)?], &inputs)?;
    // SAFETY: the caller's contract; outputs checked disjoint from everything else.
    let (q, k, v, mask, o) = unsafe {
        let [k, v] = kv.map(|(t, x, scales, [arg, sarg])| x.kv_view(arg, t, (scales, sarg)));
        (a.q.any_view("q", qt)?, k?, v?, mask_view(a.mask)?, a.o.any_view("o", ot)?)
    };
    // SAFETY: as above.
    let lse = unsafe { opt_mut("lse", a.lse, a.lse_len)? };
    let mut p = Attention::new(q, k, v)
        .mask(mask)
        .parallelism(threads(a.threads))
        .path(path)
        .half_path(half);
    if let Some(scale) = scale {
        p = p.scale(scale);
    }
    if let Some(lse) = lse {
        p = p.lse(lse);
    }
    // SAFETY: the caller's contract (`hq` floats at each non-null pointer); inputs only.
    p = p.variants(unsafe { variants.view(hq)? });
    Ok(p.run(o)?)
}

/// The variant fields of a C struct ([`AttnAttentionArgs`] from version 2, [`AttnVariants`]),
/// one body for both: `has_window` comes with the name its error reports.
struct CVariants {
    has_window: (u8, &'static str),
    window: (usize, usize),
    softcap: f32,
    sinks: *const f32,
    alibi: *const f32,
}

impl CVariants {
    /// The variants of a layer call: none for a NULL pointer, else the struct read by its
    /// `struct_size`.
    ///
    /// # Safety
    /// `p` is null or addresses `p->struct_size` readable, initialised bytes.
    unsafe fn of_layer(p: *const AttnVariants) -> Result<Self, Failure> {
        let v = if p.is_null() {
            AttnVariants {
                struct_size: VARIANTS_MIN_SIZE,
                has_window: 0,
                window_left: 0,
                window_right: 0,
                softcap: 0.0,
                sinks: std::ptr::null(),
                alibi: std::ptr::null(),
            }
        } else {
            // SAFETY: the caller's contract; `AttnVariants` is `repr(C)`, starts with its
            // `size_t struct_size`, and is valid when all-zero.
            unsafe {
                raw::read_sized(("variants", "variants.struct_size"), p, &[VARIANTS_MIN_SIZE])?
            }
        };
        Ok(CVariants {
            has_window: (v.has_window, "variants.has_window"),
            window: (v.window_left, v.window_right),
            softcap: v.softcap,
            sinks: v.sinks,
            alibi: v.alibi,
        })
    }

    /// The window, after checking the `has_window` byte.
    fn window(&self) -> Result<Option<(usize, usize)>, Failure> {
        match self.has_window.0 {
            0 => Ok(None),
            1 => Ok(Some(self.window)),
            v => Err(Failure::BadValue {
                arg: self.has_window.1,
                value: i64::from(v),
                allowed: "must be 0 (no window) or 1 (window_left, window_right)",
            }),
        }
    }

    /// Spans of the sinks and slopes, `hq` floats each (inputs of the call).
    fn spans(&self, hq: usize) -> Result<[Span; 2], Failure> {
        Ok([span("sinks", self.sinks, hq)?, span("alibi", self.alibi, hq)?])
    }

    /// The Rust variants (softcap 0 is none; the values are checked by the Rust call).
    ///
    /// # Safety
    /// Non-null `sinks` and `alibi` address `hq` floats, unwritten during the call.
    unsafe fn view<'a>(&self, hq: usize) -> Result<Variants<'a>, Failure> {
        let mut v = Variants::NONE;
        if let Some((left, right)) = self.window()? {
            v = v.window(left, right);
        }
        if self.softcap != 0.0 {
            v = v.softcap(self.softcap);
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            if let Some(s) = opt("sinks", self.sinks, hq)? {
                v = v.sinks(s);
            }
            if let Some(a) = opt("alibi", self.alibi, hq)? {
                v = v.alibi(a);
            }
        }
        Ok(v)
    }
}

/// Layer norm of each row of `x: [n, d]` into `y: [n, d]` with `gamma`, `beta` of `d` floats:
/// `y = (x − mean)/√(var + eps)·gamma + beta` (`eps` finite and ≥ 0). Runs on the calling
/// thread.
///
/// # Safety
///
/// Views address their elements, `gamma`/`beta` address `x.cols` floats; `y` overlaps nothing
/// else (checked).
#[no_mangle]
pub unsafe extern "C" fn attn_layer_norm(
    x: AttnMat,
    gamma: *const f32,
    beta: *const f32,
    eps: f32,
    y: AttnMatMut,
) -> AttnStatus {
    let f32 = AttnDtype::F32 as i32;
    // SAFETY: the caller's contract (f32 elements everywhere).
    unsafe { attn_layer_norm_typed(x, f32, gamma.cast(), beta.cast(), f32, eps, y, f32) }
}

/// [`attn_layer_norm`] with element types: `x_dtype` for `x`, `w_dtype` for `gamma` and
/// `beta` (each `d` elements of that type, aligned for it), `y_dtype` for `y` ([`AttnDtype`]
/// values, each f32, bf16 or f16; `x.data` and `y.data` then address elements of those types).
/// Inputs are widened exactly, the arithmetic is f32, and each output is rounded once (to
/// nearest even) to `y_dtype`: bit for bit the Rust `layers::layer_norm` on the same typed
/// views. `ATTN_DTYPE_Q8` is `ATTN_STATUS_UNSUPPORTED_DTYPE`, any other value
/// `ATTN_STATUS_INVALID_PARAMETER`, each naming its field. Overlaps are measured in each view's
/// own bytes.
///
/// # Safety
///
/// As [`attn_layer_norm`], each pointer addressing elements of its type.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_layer_norm_typed(
    x: AttnMat,
    x_dtype: i32,
    gamma: *const c_void,
    beta: *const c_void,
    w_dtype: i32,
    eps: f32,
    y: AttnMatMut,
    y_dtype: i32,
) -> AttnStatus {
    guard(|| {
        let what = "ATTN_DTYPE_Q8: layer norm operands are f32, bf16 or f16";
        let xt = AttnDtype::not_q8("x_dtype", x_dtype, what)?;
        let wt = AttnDtype::not_q8("w_dtype", w_dtype, what)?;
        let yt = AttnDtype::not_q8("y_dtype", y_dtype, what)?;
        with_dtype!(xt, X => with_dtype!(wt, W => with_dtype!(yt, Y => {
            let d = x.cols;
            let (gamma, beta) = (gamma.cast::<W>(), beta.cast::<W>());
            let ins = [x.span_as::<X>("x")?, span("gamma", gamma, d)?, span("beta", beta, d)?];
            disjoint(&[y.span_as::<Y>("y")?], &ins)?;
            // SAFETY: the caller's contract; the output checked disjoint.
            let (x, gamma, beta, y) = unsafe {
                let x = x.view_as::<X>("x")?;
                (x, slice("gamma", gamma, d)?, slice("beta", beta, d)?, y.view_as::<Y>("y")?)
            };
            Ok(crate::layers::layer_norm(x, &LayerNormWeights { gamma, beta }, eps, y)?)
        })))
    })
}

/// Writes the workspace size (in floats) of [`attn_mha_forward`] (`n_q = n_kv = n`) or
/// [`attn_cross_attention_forward`] into `*out`.
///
/// # Safety
///
/// `cfg` is null or valid; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn attn_mha_workspace_len(
    cfg: *const AttnMhaConfig,
    batch: usize,
    n_q: usize,
    n_kv: usize,
    out: *mut usize,
) -> AttnStatus {
    // SAFETY: forwarded from the caller.
    unsafe {
        write_len(cfg, out, |c: AttnMhaConfig| {
            Ok(crate::layers::mha_workspace_len(&c.to_rust(), batch, n_q, n_kv))
        })
    }
}

/// The body of the `*_workspace_len` entry points: `*out = len(*cfg)` (the sizes are not
/// checked: they saturate; enum fields are), after the null checks of `cfg` then `out`.
///
/// # Safety
/// `cfg` is null or valid; `out` is null or writable.
unsafe fn write_len<C: Copy>(
    cfg: *const C,
    out: *mut usize,
    len: impl FnOnce(C) -> Result<usize, Failure>,
) -> AttnStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let (cfg, out) = unsafe { (deref("cfg", cfg)?, deref_mut("out", out)?) };
        *out = len(*cfg)?;
        Ok(())
    })
}

/// Fills `*out` with PyTorch's `nn.MultiheadAttention(embed_dim, num_heads)` shape.
///
/// # Safety
///
/// `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn attn_mha_config_from_embed_dim(
    embed_dim: usize,
    num_heads: usize,
    out: *mut AttnMhaConfig,
) -> AttnStatus {
    guard(|| {
        let c = MhaConfig::from_embed_dim(embed_dim, num_heads)?;
        // SAFETY: the caller's contract.
        let out = unsafe { deref_mut("out", out)? };
        *out = AttnMhaConfig {
            in_dim: c.in_dim,
            kv_in_dim: c.kv_in_dim,
            k_dim: c.k_dim,
            v_dim: c.v_dim,
            num_heads: c.num_heads,
            kv_heads: c.kv_heads,
        };
        Ok(())
    })
}

/// Multi-head self-attention `y = MHA(x)` (`x`, `y`: `[batch, 1, n, in_dim]`, mask over
/// `[batch, heads, n, n]` or null; scores scaled by 1/√k_dim). `workspace` holds
/// `workspace_len` floats, at least [`attn_mha_workspace_len`] (else
/// `ATTN_STATUS_OUT_OF_BOUNDS`); pass NULL and 0 to let the call allocate (NULL with a nonzero
/// length is `ATTN_STATUS_NULL_POINTER`). The weights' contract, including when the Q/K/V
/// projections run as one GEMM, is on [`AttnMhaWeights`]. `threads`: see [`AttnStatus`].
/// [`attn_mha_forward_with_variants`] with no variants.
///
/// # Safety
///
/// Pointers and views address their elements; `y` and `workspace` overlap nothing else
/// (checked).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_mha_forward(
    cfg: *const AttnMhaConfig,
    weights: *const AttnMhaWeights,
    x: AttnTensor,
    mask: *const AttnMask,
    y: AttnTensorMut,
    workspace: *mut f32,
    workspace_len: usize,
    threads: usize,
) -> AttnStatus {
    let ws = (workspace, workspace_len);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { mha_call(cfg, weights, null(), null(), x, None, mask, y, ws, threads) })
}

/// [`attn_mha_forward`] with the attention variants `variants` (sliding window, softcap,
/// sinks, ALiBi) on every head; NULL is none. See [`AttnVariants`] (its `struct_size` is
/// checked; sinks and slopes hold `cfg->num_heads` floats). Statuses: those of
/// [`attn_mha_forward`], with `variants.struct_size` and `variants.has_window` checked after
/// the config, and the variants' values (`softcap`, `sinks`, `alibi`) after the weights.
///
/// # Safety
///
/// As [`attn_mha_forward`]; `variants` is null or addresses `variants->struct_size` readable,
/// initialised bytes (a whole `AttnVariants`), whose non-null `sinks` and `alibi` address
/// `cfg->num_heads` floats.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_mha_forward_with_variants(
    cfg: *const AttnMhaConfig,
    weights: *const AttnMhaWeights,
    variants: *const AttnVariants,
    x: AttnTensor,
    mask: *const AttnMask,
    y: AttnTensorMut,
    workspace: *mut f32,
    workspace_len: usize,
    threads: usize,
) -> AttnStatus {
    let ws = (workspace, workspace_len);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { mha_call(cfg, weights, variants, null(), x, None, mask, y, ws, threads) })
}

/// [`attn_mha_forward_with_variants`] with the options `options` (NULL: the defaults): the
/// element types of the weights and of `x` and `y` (see [`AttnLayerOptions`]; the workspace
/// stays `float`). Statuses: those of [`attn_mha_forward_with_variants`], with
/// `options.struct_size` and the dtype fields checked after the variants' struct; spans (for
/// the overlap checks) count the bytes of each operand's type.
///
/// # Safety
///
/// As [`attn_mha_forward_with_variants`], with every weight and vector of the weights struct
/// addressing elements of `options->weights_dtype` and `x`, `y` of
/// `options->activations_dtype`; `options` is null or addresses `options->struct_size`
/// readable, initialised bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_mha_forward_with_options(
    cfg: *const AttnMhaConfig,
    weights: *const AttnMhaWeights,
    variants: *const AttnVariants,
    options: *const AttnLayerOptions,
    x: AttnTensor,
    mask: *const AttnMask,
    y: AttnTensorMut,
    workspace: *mut f32,
    workspace_len: usize,
    threads: usize,
) -> AttnStatus {
    let ws = (workspace, workspace_len);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { mha_call(cfg, weights, variants, options, x, None, mask, y, ws, threads) })
}

/// Cross-attention `y = CrossAttention(x1, x2)` (`x1`, `y`: `[batch, 1, n1, in_dim]`, `x2`:
/// `[batch, 1, n2, kv_in_dim]`, mask over `[batch, heads, n1, n2]` or null); workspace,
/// weights and `threads` as [`attn_mha_forward`] (adjacent `wk`/`wv` blocks run as one GEMM).
/// [`attn_cross_attention_forward_with_variants`] with no variants.
///
/// # Safety
///
/// As [`attn_mha_forward`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_cross_attention_forward(
    cfg: *const AttnMhaConfig,
    weights: *const AttnMhaWeights,
    x1: AttnTensor,
    x2: AttnTensor,
    mask: *const AttnMask,
    y: AttnTensorMut,
    workspace: *mut f32,
    workspace_len: usize,
    threads: usize,
) -> AttnStatus {
    let ws = (workspace, workspace_len);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { mha_call(cfg, weights, null(), null(), x1, Some(x2), mask, y, ws, threads) })
}

/// [`attn_cross_attention_forward`] with the attention variants `variants` on every head (NULL
/// is none), as [`attn_mha_forward_with_variants`]; the window and ALiBi measure from the
/// causal offset, `n2 − n1` unless a causal mask gives its own.
///
/// # Safety
///
/// As [`attn_mha_forward_with_variants`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_cross_attention_forward_with_variants(
    cfg: *const AttnMhaConfig,
    weights: *const AttnMhaWeights,
    variants: *const AttnVariants,
    x1: AttnTensor,
    x2: AttnTensor,
    mask: *const AttnMask,
    y: AttnTensorMut,
    workspace: *mut f32,
    workspace_len: usize,
    threads: usize,
) -> AttnStatus {
    let ws = (workspace, workspace_len);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe {
        mha_call(cfg, weights, variants, null(), x1, Some(x2), mask, y, ws, threads)
    })
}

/// [`attn_cross_attention_forward_with_variants`] with the options `options` (NULL: the
/// defaults), as [`attn_mha_forward_with_options`] (`x1`, `x2` and `y` of
/// `options->activations_dtype`).
///
/// # Safety
///
/// As [`attn_mha_forward_with_options`], `x2` included.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_cross_attention_forward_with_options(
    cfg: *const AttnMhaConfig,
    weights: *const AttnMhaWeights,
    variants: *const AttnVariants,
    options: *const AttnLayerOptions,
    x1: AttnTensor,
    x2: AttnTensor,
    mask: *const AttnMask,
    y: AttnTensorMut,
    workspace: *mut f32,
    workspace_len: usize,
    threads: usize,
) -> AttnStatus {
    let ws = (workspace, workspace_len);
    let x2 = Some(x2);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { mha_call(cfg, weights, variants, options, x1, x2, mask, y, ws, threads) })
}

/// # Safety
/// As [`attn_mha_forward_with_options`].
#[allow(clippy::too_many_arguments)]
unsafe fn mha_call(
    cfg: *const AttnMhaConfig,
    weights: *const AttnMhaWeights,
    variants: *const AttnVariants,
    options: *const AttnLayerOptions,
    x1: AttnTensor,
    x2: Option<AttnTensor>,
    mask: *const AttnMask,
    y: AttnTensorMut,
    ws: (*mut f32, usize),
    threads: usize,
) -> Result<(), Failure> {
    // SAFETY: forwarded from the caller.
    let call = unsafe { layer_call(cfg, weights, variants, options)? };
    let [wt, at] = call.types;
    with_dtype!(wt, T => with_dtype!(at, A => {
        // SAFETY: forwarded from the caller; `T` and `A` are the types the options name.
        let LayerOperands { cfg, w, x1, x2, mask, y, ws, par } = unsafe {
            layer_operands::<_, T, A>(call, (x1, "x1"), x2, mask, y, ws, threads)?
        };
        use crate::layers::mha::*;
        Ok(match (x2, ws) {
            (None, None) => multi_head_attention(&cfg, &w, x1, &mask, y, par),
            (None, Some(ws)) => multi_head_attention_in(&cfg, &w, x1, &mask, y, ws, par),
            (Some(x2), None) => cross_attention(&cfg, &w, x1, x2, &mask, y, par),
            (Some(x2), Some(ws)) => cross_attention_in(&cfg, &w, x1, x2, &mask, y, ws, par),
        }?)
    }))
}

/// The settings of a layer call, checked, before its operands: the config, the weights struct,
/// the variants and the element types `[weights, activations]`.
struct LayerCall<'w, W: CWeights> {
    cfg: W::Config,
    weights: &'w W,
    variants: CVariants,
    types: [AttnDtype; 2],
}

/// The first checks of every layer entry point, in this order: null `cfg` and `weights`, the
/// config, the variants' `struct_size` and `has_window` (NULL `variants`: none), the options'
/// `struct_size` and element types (NULL `options`: f32 everywhere).
///
/// # Safety
/// `cfg` and `weights` are null or valid; `variants` and `options` are null or address
/// `struct_size` readable, initialised bytes.
unsafe fn layer_call<'w, W: CWeights>(
    cfg: *const W::CConfig,
    weights: *const W,
    variants: *const AttnVariants,
    options: *const AttnLayerOptions,
) -> Result<LayerCall<'w, W>, Failure> {
    // SAFETY: forwarded from the caller.
    let (cfg, weights) = unsafe { (*deref("cfg", cfg)?, deref("weights", weights)?) };
    let cfg = W::config(cfg)?;
    // SAFETY: forwarded from the caller.
    let variants = unsafe { CVariants::of_layer(variants)? };
    variants.window()?;
    let types = if options.is_null() {
        [AttnDtype::F32; 2]
    } else {
        // SAFETY: the caller's contract; `AttnLayerOptions` is `repr(C)`, starts with its
        // `size_t struct_size`, and is valid when all-zero.
        let o: AttnLayerOptions = unsafe {
            raw::read_sized(("options", "options.struct_size"), options, &[LAYER_OPTIONS_MIN_SIZE])?
        };
        let layer = "ATTN_DTYPE_Q8: the weights and activations of a layer are f32, bf16 or f16";
        [
            AttnDtype::not_q8("options.weights_dtype", o.weights_dtype, layer)?,
            AttnDtype::not_q8("options.activations_dtype", o.activations_dtype, layer)?,
        ]
    };
    Ok(LayerCall { cfg, weights, variants, types })
}

/// The Rust operands of a layer call, checked: no output (`y`, the workspace) overlapping
/// another operand, every view within reach. Weights of type `T`, activations of type `A`.
/// `ws` is `None` when the caller passed a null workspace of length 0 (the call allocates its
/// own).
struct LayerOperands<'a, W: CWeights, T: 'a, A> {
    cfg: W::Config,
    w: W::Weights<'a, T>,
    x1: TensorRef<'a, A>,
    x2: Option<TensorRef<'a, A>>,
    mask: Mask<'a>,
    y: TensorMut<'a, A>,
    ws: Option<&'a mut [f32]>,
    par: Parallelism,
}

/// The marshalling shared by the layer entry points after [`layer_call`]: the overlap check of
/// the outputs (`y`, the workspace) against every input (sinks and slopes included; spans in
/// bytes of the operands' types), then the Rust views, in that order (so a call fails with the
/// same error whichever entry point it came through). `x1` comes with the name its span
/// reports in an error; its view is named `x`.
///
/// # Safety
/// As [`attn_mha_forward_with_options`], for weights of type `T` and activations of type `A`.
#[allow(clippy::too_many_arguments)]
unsafe fn layer_operands<'a, W: CWeights, T: Copy + 'a, A: Copy>(
    call: LayerCall<'_, W>,
    (x1, x1_span): (AttnTensor, &'static str),
    x2: Option<AttnTensor>,
    mask: *const AttnMask,
    y: AttnTensorMut,
    (workspace, workspace_len): (*mut f32, usize),
    threads: usize,
) -> Result<LayerOperands<'a, W, T, A>, Failure> {
    let LayerCall { cfg, weights, variants, .. } = call;
    let heads = W::heads(&cfg);
    let mut inputs = weights.spans::<T>(&cfg)?;
    inputs.extend(variants.spans(heads)?);
    inputs.push(x1.span_as::<A>(x1_span)?);
    if let Some(x2) = &x2 {
        inputs.push(x2.span_as::<A>("x2")?);
    }
    // SAFETY: forwarded from the caller.
    inputs.extend(unsafe { mask_span(mask)? });
    disjoint(&[y.span_as::<A>("y")?, span("workspace", workspace, workspace_len)?], &inputs)?;
    // SAFETY: the caller's contract; outputs checked disjoint from everything else.
    let (mut w, x1, mask, y, ws) = unsafe {
        (
            weights.view::<T>(&cfg)?,
            x1.view_as::<A>("x")?,
            mask_view(mask)?,
            y.view_as::<A>("y")?,
            slice_mut("workspace", workspace, workspace_len)?,
        )
    };
    // SAFETY: as above.
    let x2 = match x2 {
        Some(x2) => Some(unsafe { x2.view_as::<A>("x2")? }),
        None => None,
    };
    // SAFETY: as above (`heads` floats at each non-null pointer).
    W::set_variants(&mut w, unsafe { variants.view(heads)? });
    let allocate = workspace.is_null() && workspace_len == 0;
    let ws = (!allocate).then_some(ws);
    Ok(LayerOperands { cfg, w, x1, x2, mask, y, ws, par: self::threads(threads) })
}

/// Writes the workspace size (in floats) of [`attn_encoder_forward`] into `*out` (sizes
/// saturate at `SIZE_MAX`; `cfg->activation` is validated).
///
/// # Safety
///
/// `cfg` is null or valid; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn attn_encoder_workspace_len(
    cfg: *const AttnEncoderConfig,
    batch: usize,
    n: usize,
    out: *mut usize,
) -> AttnStatus {
    // SAFETY: forwarded from the caller.
    unsafe {
        write_len(cfg, out, |c: AttnEncoderConfig| {
            Ok(crate::layers::encoder_workspace_len(&c.to_rust()?, batch, n))
        })
    }
}

/// One post-norm encoder block `y = LN₂(H + FF(H))`, `H = LN₁(x + MHA(x))` (`x`, `y`:
/// `[batch, 1, n, d]`, mask over `[batch, heads, n, n]` or null); workspace and `threads` as
/// [`attn_mha_forward`] with [`attn_encoder_workspace_len`]. `cfg->activation` is validated
/// (see [`AttnEncoderConfig`]). [`attn_encoder_forward_with_variants`] with no variants.
///
/// # Safety
///
/// As [`attn_mha_forward`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_encoder_forward(
    cfg: *const AttnEncoderConfig,
    weights: *const AttnEncoderWeights,
    x: AttnTensor,
    mask: *const AttnMask,
    y: AttnTensorMut,
    workspace: *mut f32,
    workspace_len: usize,
    threads: usize,
) -> AttnStatus {
    let ws = (workspace, workspace_len);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { encoder_call(cfg, weights, null(), null(), x, mask, y, ws, threads) })
}

/// [`attn_encoder_forward`] with the attention variants `variants` on every head of the
/// block's self-attention (NULL is none), as [`attn_mha_forward_with_variants`]; sinks and
/// slopes hold `cfg->attn.num_heads` floats.
///
/// # Safety
///
/// As [`attn_mha_forward_with_variants`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_encoder_forward_with_variants(
    cfg: *const AttnEncoderConfig,
    weights: *const AttnEncoderWeights,
    variants: *const AttnVariants,
    x: AttnTensor,
    mask: *const AttnMask,
    y: AttnTensorMut,
    workspace: *mut f32,
    workspace_len: usize,
    threads: usize,
) -> AttnStatus {
    let ws = (workspace, workspace_len);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { encoder_call(cfg, weights, variants, null(), x, mask, y, ws, threads) })
}

/// [`attn_encoder_forward_with_variants`] with the options `options` (NULL: the defaults), as
/// [`attn_mha_forward_with_options`]: every weight, bias and layer-norm vector of `weights` of
/// `options->weights_dtype`, `x` and `y` of `options->activations_dtype`.
///
/// # Safety
///
/// As [`attn_mha_forward_with_options`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn attn_encoder_forward_with_options(
    cfg: *const AttnEncoderConfig,
    weights: *const AttnEncoderWeights,
    variants: *const AttnVariants,
    options: *const AttnLayerOptions,
    x: AttnTensor,
    mask: *const AttnMask,
    y: AttnTensorMut,
    workspace: *mut f32,
    workspace_len: usize,
    threads: usize,
) -> AttnStatus {
    let ws = (workspace, workspace_len);
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { encoder_call(cfg, weights, variants, options, x, mask, y, ws, threads) })
}

/// # Safety
/// As [`attn_encoder_forward_with_options`].
#[allow(clippy::too_many_arguments)]
unsafe fn encoder_call(
    cfg: *const AttnEncoderConfig,
    weights: *const AttnEncoderWeights,
    variants: *const AttnVariants,
    options: *const AttnLayerOptions,
    x: AttnTensor,
    mask: *const AttnMask,
    y: AttnTensorMut,
    ws: (*mut f32, usize),
    threads: usize,
) -> Result<(), Failure> {
    // SAFETY: forwarded from the caller.
    let call = unsafe { layer_call(cfg, weights, variants, options)? };
    let [wt, at] = call.types;
    with_dtype!(wt, T => with_dtype!(at, A => {
        // SAFETY: forwarded from the caller; `T` and `A` are the types the options name.
        let LayerOperands { cfg, w, x1: x, mask, y, ws, par, .. } = unsafe {
            layer_operands::<_, T, A>(call, (x, "x"), None, mask, y, ws, threads)?
        };
        Ok(match ws {
            None => crate::layers::encoder_block(&cfg, &w, x, &mask, y, par),
            Some(ws) => crate::layers::encoder_block_in(&cfg, &w, x, &mask, y, ws, par),
        }?)
    }))
}

#[cfg(test)]
mod header;

#[cfg(test)]
mod tests;
