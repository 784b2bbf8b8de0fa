//! The C ABI: `extern "C"` entry points for sgemm, scale-mask-softmax, attention (with its
//! decode path), layer norm,
//! multi-head / cross-attention and the encoder block, with explicit dims and strides.
//! `include/attn_kernels.h` is generated from this file by cbindgen (`cbindgen.toml`); a test
//! regenerates it and fails when the committed header differs (`ATTN_BLESS=1` rewrites it).
//!
//! Contract of every function:
//! - returns an [`AttnStatus`]: `ATTN_STATUS_OK`, one code per [`Error`] variant of the Rust API,
//!   `ATTN_STATUS_NULL_POINTER` for a null pointer where at least one element is needed, and
//!   `ATTN_STATUS_PANIC` if anything inside panicked (caught: nothing unwinds into C);
//!   [`attn_last_error_message`] gives the message of the thread's last failure;
//! - a view `{data, dims…, strides…, offset}` reads elements `data[offset + Σ i_k·stride_k]`;
//!   the caller guarantees `data` addresses every element up to the last one the view reaches
//!   (computed here, overflow reported), initialised, aligned for `float`;
//! - outputs (and the workspace) may not overlap any other operand of the call: checked,
//!   `ATTN_STATUS_ALIASED_OUTPUT`;
//! - `threads` ≤ 1 runs on the calling thread, `n` uses a cached pool of `n` threads.
//!
//! The unsafe operations (pointer + implied length → slice) live in `raw`; the functions here
//! only forward the caller's contract to them, after the null and overlap checks, and then go
//! through the safe Rust API, which checks shapes exactly as for Rust callers.

mod raw;

use std::cell::RefCell;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use attn_core::{
    Activation, EncoderConfig, EncoderWeights, Error, FeedForwardWeights, LayerNormWeights, Mask,
    MatLayout, MatMut, MatRef, MhaConfig, MhaWeights, Tensor4Layout, TensorMut, TensorRef,
};

use crate::par::Parallelism;
use raw::{disjoint, mat_len, slice, slice_mut, span, tensor_len, Failure, Span};

/// The outcome of a C call.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnStatus {
    /// Success.
    Ok = 0,
    /// `Error::ShapeMismatch`: a dimension does not match the others.
    ShapeMismatch = 1,
    /// `Error::OutOfBounds`: a view (or the workspace) is larger than its buffer.
    OutOfBounds = 2,
    /// `Error::IndexOverflow`: offset and strides overflow the address range.
    IndexOverflow = 3,
    /// `Error::AliasedOutput`: an output view maps two positions to one element, or overlaps
    /// another operand.
    AliasedOutput = 4,
    /// `Error::ZeroHeads`.
    ZeroHeads = 5,
    /// `Error::HeadsNotDivisible`.
    HeadsNotDivisible = 6,
    /// `Error::KvHeadsNotDividing`.
    KvHeadsNotDividing = 7,
    /// `Error::NonFinite`: a scale or epsilon is NaN or infinite.
    NonFinite = 8,
    /// `Error::InvalidParameter`: a scalar out of range, an unsupported ISA, a misaligned
    /// pointer, a buffer that cannot be allocated.
    InvalidParameter = 9,
    /// A required pointer is null.
    NullPointer = 10,
    /// A panic was caught at the boundary (a bug: please report it).
    Panic = 11,
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
    /// The elements (may be null when the view is empty).
    pub data: *const f32,
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
    /// The elements (may be null when the view is empty).
    pub data: *mut f32,
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
    /// The elements (may be null when the view is empty).
    pub data: *const f32,
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
    /// The elements (may be null when the view is empty).
    pub data: *mut f32,
    /// `[batch, heads, seq, dim]`.
    pub dims: [usize; 4],
    /// Element strides of the four dimensions.
    pub strides: [usize; 4],
    /// Index of element `(0, 0, 0, 0)`.
    pub offset: usize,
}

/// Which mask an [`AttnMask`] is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnMaskKind {
    /// Every key visible.
    None = 0,
    /// Key `j` visible to query `i` iff `j ≤ i + offset`.
    Causal = 1,
    /// Boolean keep-mask (`true` = attend) in `keep`.
    Keep = 2,
    /// Additive bias in `bias`.
    Bias = 3,
}

/// A mask over the `[batch, heads, nq, nk]` scores. A null `const AttnMask*` means no mask.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnMask {
    /// Which mask.
    pub kind: AttnMaskKind,
    /// Causal: use the default offset `nk − nq` (bottom-right, for a KV cache) and ignore
    /// `causal_offset`.
    pub causal_default_offset: bool,
    /// Causal: the diagonal offset when `causal_default_offset` is false (0 = PyTorch's
    /// `is_causal`).
    pub causal_offset: isize,
    /// Keep: the elements (each exactly 0 or 1, C `bool`).
    pub keep: *const bool,
    /// Bias: the elements.
    pub bias: *const f32,
    /// Keep / bias: must be `[batch, heads, nq, nk]`; zero strides broadcast.
    pub dims: [usize; 4],
    /// Keep / bias: element strides.
    pub strides: [usize; 4],
    /// Keep / bias: index of element `(0, 0, 0, 0)`.
    pub offset: usize,
}

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

/// Caller-owned MHA weights, each `[in, out]` (`y = x·W + b`): `wq: [in_dim, heads·k_dim]`,
/// `wk: [kv_in_dim, kv_heads·k_dim]`, `wv: [kv_in_dim, kv_heads·v_dim]`,
/// `wo: [heads·v_dim, in_dim]`. Biases may be null (none); otherwise they hold the matching
/// output width. `wq`, `wk`, `wv` as adjacent column blocks of one buffer run as one GEMM.
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
    pub bq: *const f32,
    /// Key bias or null.
    pub bk: *const f32,
    /// Value bias or null.
    pub bv: *const f32,
    /// Output bias or null.
    pub bo: *const f32,
}

/// The feed-forward activation of the encoder block.
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
    /// Feed-forward activation.
    pub activation: AttnActivation,
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
    pub norm1_gamma: *const f32,
    /// First layer norm's shift.
    pub norm1_beta: *const f32,
    /// Feed-forward first layer.
    pub w1: AttnMat,
    /// Feed-forward first bias or null.
    pub b1: *const f32,
    /// Feed-forward second layer.
    pub w2: AttnMat,
    /// Feed-forward second bias or null.
    pub b2: *const f32,
    /// Second layer norm's scale.
    pub norm2_gamma: *const f32,
    /// Second layer norm's shift.
    pub norm2_beta: *const f32,
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
            /// The span and, after the overlap check, the view.
            fn span(&self, arg: &'static str) -> Result<Span, Failure> {
                Ok(span(arg, self.data, $len(arg, &self.layout())?))
            }
            /// # Safety
            #[doc = $safety]
            unsafe fn view<'a>(&self, arg: &'static str) -> Result<$View<'a>, Failure> {
                let l = self.layout();
                // SAFETY: forwarded from the caller.
                Ok($View::new(unsafe { $slice(arg, self.data, $len(arg, &l)?)? }, l))
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

/// The mask's element span (empty for none/causal).
///
/// # Safety
/// `mask` is null or points to a valid [`AttnMask`].
unsafe fn mask_span(mask: *const AttnMask) -> Result<Option<Span>, Failure> {
    // SAFETY: forwarded from the caller.
    let Some(m) = (unsafe { mask.as_ref() }) else { return Ok(None) };
    let l = Tensor4Layout::strided(m.dims, m.strides, m.offset);
    Ok(match m.kind {
        AttnMaskKind::Keep => Some(span("mask", m.keep, tensor_len("mask", &l)?)),
        AttnMaskKind::Bias => Some(span("mask", m.bias, tensor_len("mask", &l)?)),
        AttnMaskKind::None | AttnMaskKind::Causal => None,
    })
}

/// # Safety
/// `mask` is null or points to a valid [`AttnMask`] whose `keep`/`bias` addresses its view.
unsafe fn mask_view<'a>(mask: *const AttnMask) -> Result<Mask<'a>, Failure> {
    // SAFETY: forwarded from the caller.
    let Some(m) = (unsafe { mask.as_ref() }) else { return Ok(Mask::None) };
    let layout = Tensor4Layout::strided(m.dims, m.strides, m.offset);
    Ok(match m.kind {
        AttnMaskKind::None => Mask::None,
        AttnMaskKind::Causal => {
            Mask::Causal { offset: (!m.causal_default_offset).then_some(m.causal_offset) }
        }
        AttnMaskKind::Keep => {
            // SAFETY: forwarded from the caller.
            let keep = unsafe { slice("mask", m.keep, tensor_len("mask", &layout)?)? };
            Mask::Keep { keep, layout }
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
    /// The Rust weights.
    type Weights<'a>;
    /// The Rust config of `c`, checked (the lengths of the weights' vectors are products of its
    /// sizes that must not overflow).
    fn config(c: Self::CConfig) -> Result<Self::Config, Failure>;
    /// Spans of the weights and vectors (lengths from `cfg`).
    fn spans(&self, cfg: &Self::Config) -> Result<Vec<Span>, Failure>;
    /// # Safety
    /// Every non-null pointer addresses its view (vectors: the width `cfg` implies).
    unsafe fn view<'a>(&self, cfg: &Self::Config) -> Result<Self::Weights<'a>, Failure>;
}

impl CWeights for AttnMhaWeights {
    type CConfig = AttnMhaConfig;
    type Config = MhaConfig;
    type Weights<'a> = MhaWeights<'a>;
    fn config(c: AttnMhaConfig) -> Result<MhaConfig, Failure> {
        let c = c.to_rust();
        c.check()?;
        Ok(c)
    }
    /// Spans of the weights and biases (bias lengths from `cfg`, checked first).
    fn spans(&self, cfg: &MhaConfig) -> Result<Vec<Span>, Failure> {
        Ok(vec![
            self.wq.span("wq")?,
            self.wk.span("wk")?,
            self.wv.span("wv")?,
            self.wo.span("wo")?,
            span("bq", self.bq, cfg.q_width()),
            span("bk", self.bk, cfg.k_width()),
            span("bv", self.bv, cfg.v_width()),
            span("bo", self.bo, cfg.in_dim),
        ])
    }
    /// # Safety
    /// Every non-null pointer addresses its view (biases: the width `cfg` implies).
    unsafe fn view<'a>(&self, cfg: &MhaConfig) -> Result<MhaWeights<'a>, Failure> {
        // The bias lengths below are products that must not overflow.
        cfg.check()?;
        // SAFETY: forwarded from the caller.
        unsafe {
            Ok(MhaWeights {
                wq: self.wq.view("wq")?,
                wk: self.wk.view("wk")?,
                wv: self.wv.view("wv")?,
                wo: self.wo.view("wo")?,
                bq: opt("bq", self.bq, cfg.q_width())?,
                bk: opt("bk", self.bk, cfg.k_width())?,
                bv: opt("bv", self.bv, cfg.v_width())?,
                bo: opt("bo", self.bo, cfg.in_dim)?,
            })
        }
    }
}

/// An optional vector: null is `None`.
///
/// # Safety
/// A non-null `p` addresses `len` elements.
unsafe fn opt<'a>(
    arg: &'static str,
    p: *const f32,
    len: usize,
) -> Result<Option<&'a [f32]>, Failure> {
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
    fn to_rust(self) -> EncoderConfig {
        EncoderConfig {
            attn: self.attn.to_rust(),
            ff_dim: self.ff_dim,
            activation: match self.activation {
                AttnActivation::Relu => Activation::Relu,
                AttnActivation::GeluTanh => Activation::GeluTanh,
            },
            eps: self.eps,
        }
    }
}

impl CWeights for AttnEncoderWeights {
    type CConfig = AttnEncoderConfig;
    type Config = EncoderConfig;
    type Weights<'a> = EncoderWeights<'a>;
    fn config(c: AttnEncoderConfig) -> Result<EncoderConfig, Failure> {
        let c = c.to_rust();
        c.check()?;
        Ok(c)
    }
    fn spans(&self, cfg: &EncoderConfig) -> Result<Vec<Span>, Failure> {
        let d = cfg.attn.in_dim;
        let mut s = self.attn.spans(&cfg.attn)?;
        s.extend([
            span("norm1.gamma", self.norm1_gamma, d),
            span("norm1.beta", self.norm1_beta, d),
            self.w1.span("w1")?,
            span("b1", self.b1, cfg.ff_dim),
            self.w2.span("w2")?,
            span("b2", self.b2, d),
            span("norm2.gamma", self.norm2_gamma, d),
            span("norm2.beta", self.norm2_beta, d),
        ]);
        Ok(s)
    }
    /// # Safety
    /// Every non-null pointer addresses its view (vectors: the width `cfg` implies).
    unsafe fn view<'a>(&self, cfg: &EncoderConfig) -> Result<EncoderWeights<'a>, Failure> {
        let d = cfg.attn.in_dim;
        // SAFETY: forwarded from the caller.
        unsafe {
            Ok(EncoderWeights {
                attn: self.attn.view(&cfg.attn)?,
                norm1: LayerNormWeights {
                    gamma: slice("norm1.gamma", self.norm1_gamma, d)?,
                    beta: slice("norm1.beta", self.norm1_beta, d)?,
                },
                ff: FeedForwardWeights {
                    w1: self.w1.view("w1")?,
                    b1: opt("b1", self.b1, cfg.ff_dim)?,
                    w2: self.w2.view("w2")?,
                    b2: opt("b2", self.b2, d)?,
                },
                norm2: LayerNormWeights {
                    gamma: slice("norm2.gamma", self.norm2_gamma, d)?,
                    beta: slice("norm2.beta", self.norm2_beta, d)?,
                },
            })
        }
    }
}

/// The name of a status, e.g. `"ATTN_STATUS_SHAPE_MISMATCH"` (a static string).
#[no_mangle]
pub extern "C" fn attn_status_name(status: AttnStatus) -> *const c_char {
    let s: &'static [u8] = match status {
        AttnStatus::Ok => b"ATTN_STATUS_OK\0",
        AttnStatus::ShapeMismatch => b"ATTN_STATUS_SHAPE_MISMATCH\0",
        AttnStatus::OutOfBounds => b"ATTN_STATUS_OUT_OF_BOUNDS\0",
        AttnStatus::IndexOverflow => b"ATTN_STATUS_INDEX_OVERFLOW\0",
        AttnStatus::AliasedOutput => b"ATTN_STATUS_ALIASED_OUTPUT\0",
        AttnStatus::ZeroHeads => b"ATTN_STATUS_ZERO_HEADS\0",
        AttnStatus::HeadsNotDivisible => b"ATTN_STATUS_HEADS_NOT_DIVISIBLE\0",
        AttnStatus::KvHeadsNotDividing => b"ATTN_STATUS_KV_HEADS_NOT_DIVIDING\0",
        AttnStatus::NonFinite => b"ATTN_STATUS_NON_FINITE\0",
        AttnStatus::InvalidParameter => b"ATTN_STATUS_INVALID_PARAMETER\0",
        AttnStatus::NullPointer => b"ATTN_STATUS_NULL_POINTER\0",
        AttnStatus::Panic => b"ATTN_STATUS_PANIC\0",
    };
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

/// `C ← α·A·B + β·C` (`A: m×k`, `B: k×n`, `C: m×n`, any strides; β = 0: C is not read).
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
/// cols]` view (`mask` null for none). `lse` may be null; otherwise it receives the
/// `batch·heads·rows` row logsumexps (`lse_len` must equal that). A fully masked row is all
/// zeros with logsumexp −∞.
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
    guard(|| {
        let mut inputs = vec![x.span("x")?];
        // SAFETY: the caller's contract.
        inputs.extend(unsafe { mask_span(mask)? });
        disjoint(&[y.span("y")?, span("lse", lse, lse_len)], &inputs)?;
        // SAFETY: the caller's contract; outputs checked disjoint from everything else.
        let (x, mask, y) = unsafe { (x.view("x")?, mask_view(mask)?, y.view("y")?) };
        // SAFETY: as above.
        let lse = unsafe { opt_mut("lse", lse, lse_len)? };
        let par = self::threads(threads);
        Ok(crate::softmax::scale_mask_softmax(x, scale, &mask, y, lse, par)?)
    })
}

/// `O = softmax(scale·Q·Kᵀ + mask)·V` over `[batch, heads]` (`q: [b, hq, nq, dk]`,
/// `k: [b, hkv, nk, dk]`, `v: [b, hkv, nk, dv]`, `o: [b, hq, nq, dv]`; GQA when hkv < hq).
/// Picks the decode path for nq ≤ 16, the flash path otherwise. `mask` may be null (none).
/// `lse` may be null; otherwise it receives `b·hq·nq` logsumexps (`lse_len` must equal that).
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
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { attention_call(q, k, v, scale, mask, o, lse, lse_len, threads, Path::Auto) })
}

/// Decode-step attention: [`attn_attention`] forced onto the decode path (few queries over
/// many keys: keys split across threads, partial results merged by logsumexp). Same
/// arguments and contract.
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
    // SAFETY: forwarded from the caller.
    guard(|| unsafe {
        attention_call(q, k, v, scale, mask, o, lse, lse_len, threads, Path::Decode)
    })
}

enum Path {
    Auto,
    Decode,
}

/// # Safety
/// As [`attn_attention`].
#[allow(clippy::too_many_arguments)]
unsafe fn attention_call(
    q: AttnTensor,
    k: AttnTensor,
    v: AttnTensor,
    scale: f32,
    mask: *const AttnMask,
    o: AttnTensorMut,
    lse: *mut f32,
    lse_len: usize,
    threads: usize,
    path: Path,
) -> Result<(), Failure> {
    let mut inputs = vec![q.span("q")?, k.span("k")?, v.span("v")?];
    // SAFETY: forwarded from the caller.
    inputs.extend(unsafe { mask_span(mask)? });
    disjoint(&[o.span("o")?, span("lse", lse, lse_len)], &inputs)?;
    // SAFETY: the caller's contract; outputs checked disjoint from everything else.
    let (q, k, v, mask, o) =
        unsafe { (q.view("q")?, k.view("k")?, v.view("v")?, mask_view(mask)?, o.view("o")?) };
    // SAFETY: as above.
    let lse = unsafe { opt_mut("lse", lse, lse_len)? };
    let par = self::threads(threads);
    Ok(match path {
        Path::Auto => crate::attention::attention(q, k, v, scale, &mask, o, lse, par),
        Path::Decode => {
            crate::attention::decode(crate::arch::selected(), q, k, v, scale, &mask, o, lse, par)
        }
    }?)
}

/// Layer norm of each row of `x: [n, d]` into `y: [n, d]` with `gamma`, `beta` of `d` floats.
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
    guard(|| {
        let d = x.cols;
        let ins = [x.span("x")?, span("gamma", gamma, d), span("beta", beta, d)];
        disjoint(&[y.span("y")?], &ins)?;
        // SAFETY: the caller's contract; the output checked disjoint.
        let (x, gamma, beta, y) = unsafe {
            (x.view("x")?, slice("gamma", gamma, d)?, slice("beta", beta, d)?, y.view("y")?)
        };
        Ok(crate::layers::layer_norm(x, &LayerNormWeights { gamma, beta }, eps, y)?)
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
            crate::layers::mha_workspace_len(&c.to_rust(), batch, n_q, n_kv)
        })
    }
}

/// The body of the `*_workspace_len` entry points: `*out = len(*cfg)` (the config is not
/// checked: the sizes saturate), after the null checks of `cfg` then `out`.
///
/// # Safety
/// `cfg` is null or valid; `out` is null or writable.
unsafe fn write_len<C: Copy>(
    cfg: *const C,
    out: *mut usize,
    len: impl FnOnce(C) -> usize,
) -> AttnStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let (cfg, out) = unsafe { (deref("cfg", cfg)?, deref_mut("out", out)?) };
        *out = len(*cfg);
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
/// `[batch, heads, n, n]` or null). `workspace` holds `workspace_len` floats, at least
/// [`attn_mha_workspace_len`]; pass null and 0 to let the call allocate.
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
    // SAFETY: forwarded from the caller.
    guard(|| unsafe { mha_call(cfg, weights, x, None, mask, y, workspace, workspace_len, threads) })
}

/// Cross-attention `y = CrossAttention(x1, x2)` (`x1`, `y`: `[batch, 1, n1, in_dim]`, `x2`:
/// `[batch, 1, n2, kv_in_dim]`, mask over `[batch, heads, n1, n2]` or null); workspace as
/// [`attn_mha_forward`].
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
    // SAFETY: forwarded from the caller.
    guard(|| unsafe {
        mha_call(cfg, weights, x1, Some(x2), mask, y, workspace, workspace_len, threads)
    })
}

/// # Safety
/// As [`attn_mha_forward`].
#[allow(clippy::too_many_arguments)]
unsafe fn mha_call(
    cfg: *const AttnMhaConfig,
    weights: *const AttnMhaWeights,
    x1: AttnTensor,
    x2: Option<AttnTensor>,
    mask: *const AttnMask,
    y: AttnTensorMut,
    workspace: *mut f32,
    workspace_len: usize,
    threads: usize,
) -> Result<(), Failure> {
    let ws = (workspace, workspace_len);
    // SAFETY: forwarded from the caller.
    let LayerOperands { cfg, w, x1, x2, mask, y, ws, par } =
        unsafe { layer_operands(cfg, weights, (x1, "x1"), x2, mask, y, ws, threads)? };
    use crate::layers::mha::*;
    Ok(match (x2, ws) {
        (None, None) => multi_head_attention(&cfg, &w, x1, &mask, y, par),
        (None, Some(ws)) => multi_head_attention_in(&cfg, &w, x1, &mask, y, ws, par),
        (Some(x2), None) => cross_attention(&cfg, &w, x1, x2, &mask, y, par),
        (Some(x2), Some(ws)) => cross_attention_in(&cfg, &w, x1, x2, &mask, y, ws, par),
    }?)
}

/// The Rust operands of a layer call, checked: config and weights not null, no output (`y`,
/// the workspace) overlapping another operand, every view within reach. `ws` is `None` when the
/// caller passed a null workspace of length 0 (the call allocates its own).
struct LayerOperands<'a, W: CWeights> {
    cfg: W::Config,
    w: W::Weights<'a>,
    x1: TensorRef<'a>,
    x2: Option<TensorRef<'a>>,
    mask: Mask<'a>,
    y: TensorMut<'a>,
    ws: Option<&'a mut [f32]>,
    par: Parallelism,
}

/// The marshalling shared by the layer entry points: null checks on `cfg` and `weights`, the
/// config's check, the overlap check of the outputs (`y`, the workspace) against every input,
/// then the Rust views, in that order (so a call fails with the same error whichever entry
/// point it came through). `x1` comes with the name its span reports in an error; its view is
/// named `x`.
///
/// # Safety
/// As [`attn_mha_forward`].
#[allow(clippy::too_many_arguments)]
unsafe fn layer_operands<'a, W: CWeights>(
    cfg: *const W::CConfig,
    weights: *const W,
    (x1, x1_span): (AttnTensor, &'static str),
    x2: Option<AttnTensor>,
    mask: *const AttnMask,
    y: AttnTensorMut,
    (workspace, workspace_len): (*mut f32, usize),
    threads: usize,
) -> Result<LayerOperands<'a, W>, Failure> {
    // SAFETY: forwarded from the caller.
    let (cfg, weights) = unsafe { (*deref("cfg", cfg)?, deref("weights", weights)?) };
    let cfg = W::config(cfg)?;
    let mut inputs = weights.spans(&cfg)?;
    inputs.push(x1.span(x1_span)?);
    if let Some(x2) = &x2 {
        inputs.push(x2.span("x2")?);
    }
    // SAFETY: forwarded from the caller.
    inputs.extend(unsafe { mask_span(mask)? });
    disjoint(&[y.span("y")?, span("workspace", workspace, workspace_len)], &inputs)?;
    // SAFETY: the caller's contract; outputs checked disjoint from everything else.
    let (w, x1, mask, y, ws) = unsafe {
        (
            weights.view(&cfg)?,
            x1.view("x")?,
            mask_view(mask)?,
            y.view("y")?,
            slice_mut("workspace", workspace, workspace_len)?,
        )
    };
    // SAFETY: as above.
    let x2 = match x2 {
        Some(x2) => Some(unsafe { x2.view("x2")? }),
        None => None,
    };
    let allocate = workspace.is_null() && workspace_len == 0;
    let ws = (!allocate).then_some(ws);
    Ok(LayerOperands { cfg, w, x1, x2, mask, y, ws, par: self::threads(threads) })
}

/// Writes the workspace size (in floats) of [`attn_encoder_forward`] into `*out`.
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
            crate::layers::encoder_workspace_len(&c.to_rust(), batch, n)
        })
    }
}

/// One post-norm encoder block `y = LN₂(H + FF(H))`, `H = LN₁(x + MHA(x))` (`x`, `y`:
/// `[batch, 1, n, d]`, mask over `[batch, heads, n, n]` or null); workspace as
/// [`attn_mha_forward`] with [`attn_encoder_workspace_len`].
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
    guard(|| {
        let ws = (workspace, workspace_len);
        // SAFETY: the caller's contract.
        let LayerOperands { cfg, w, x1: x, mask, y, ws, par, .. } =
            unsafe { layer_operands(cfg, weights, (x, "x"), None, mask, y, ws, threads)? };
        Ok(match ws {
            None => crate::layers::encoder_block(&cfg, &w, x, &mask, y, par),
            Some(ws) => crate::layers::encoder_block_in(&cfg, &w, x, &mask, y, ws, par),
        }?)
    })
}

#[cfg(test)]
mod header;
