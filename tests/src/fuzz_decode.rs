//! Byte decoders and oracles for fuzzed equivalence, shared by the cargo-fuzz targets in `fuzz/`
//! and by the proptest-driven runs of the same decoders (`tests/tests/suite/fuzz_equiv.rs`, and
//! `scripts/fuzz.sh --proptest` for long runs), so one set of checks runs in both.
//!
//! A decoder turns arbitrary bytes into a *case*: shapes (0 and edge sizes included), strides
//! (contiguous, transposed, padded, general, broadcast, overlapping, overflowing), offsets, slices
//! that are exactly long enough / longer / one element short, masks of every kind (fully masked
//! rows, broadcast key-padding, ±∞/NaN biases, extreme causal offsets), scales (0, huge, denormal,
//! non-finite) and data (small integers, mixed magnitudes, NaN, ±∞, denormals, ±1e38). Bytes past
//! the end of the input read as 0 (the simplest choice); element values past the end come from a
//! generator seeded by the input, so short inputs still give full operands.
//!
//! A check runs the reference and the kernel on the same case and requires:
//! - the same `Result`: both `Ok`, or both `Err` with the same [`attn_reference::Error`] (the kernels promise the
//!   reference's errors), and on `Err` no element of the output slice, its guard bands or `lse`
//!   is changed;
//! - on `Ok`, nothing outside the output view is written: the output slice sits between guard
//!   bands of [`GUARD`] sentinel NaNs and every non-view element (padding, offset prefix, tail,
//!   guards) must keep its exact bit pattern;
//! - every output element equal to the reference within a bound derived from error analysis
//!   (see each check), with non-finite data handled as: where the reference is NaN the kernel
//!   must be NaN; where the reference is ±∞ the kernel must be the same ∞; where an f32
//!   intermediate can overflow although the f64 reference does not (documented below) the value
//!   is unconstrained except for NaN-ness and range.
//!
//! Input padding (slice elements outside an input view) is filled with NaN, so a kernel that
//! reads outside its views turns the result into NaN and fails the bound.

use attn_kernels::attention::Attention;
use attn_kernels::batch::{PagePool, PagedKv};
use attn_kernels::{bf16, f16, AnyRef, DType, KvRef, Parallelism, Q8Ref, Variants};

use crate::attention_support::with_lse;
use attn_reference::softmax::{saturate_logit, softmax_row};
use attn_reference::{Mask, MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};

/// Unit roundoff of f32 (shared with the GEMM bound).
pub use crate::numerics::U;

/// Sentinel elements on each side of every output slice.
pub const GUARD: usize = 16;

/// The bit pattern of the sentinel NaN written around and between output views. A quiet NaN with
/// a payload no arithmetic produces, compared bit for bit.
pub const SENTINEL_BITS: u32 = 0x7fe5_a5a5;

/// Largest number of elements a decoded slice may have (keeps every case fast).
const MAX_SLICE: usize = 1 << 18;

/// Largest `m·n·k` (GEMM) or `rows · work per row` (softmax, attention) a case may ask for, so
/// the f64 reference stays fast.
const MAX_WORK: usize = 1 << 18;

use crate::numerics::{
    flushed_weight, softcap_error, BF16_U, EXP_REL, GAMMA, SUBNORMAL_ULP as TINY,
};

/// Magnitude above which an f32 intermediate may overflow (half of `f32::MAX`, leaving room for
/// the rounding of the value itself and one more addition).
const OVERFLOW: f64 = f32::MAX as f64 / 2.0;

/// Smallest positive normal f32: the error of an exp that flushes its subnormal results to 0.
const MIN_NORMAL: f64 = f32::MIN_POSITIVE as f64;

/// Sizes that hit the edges of every blocking: 0, 1, MR±1, NR±1 (MR ∈ {4, 6, 12}, NR ∈ {16, 32}),
/// vector widths 4/8/16 ±1, 17, 63, 64, 65, 127–129, 257.
pub const EDGE_SIZES: [usize; 32] = [
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 15, 16, 17, 23, 24, 25, 31, 32, 33, 47, 48, 49, 63,
    64, 65, 127, 128, 129, 257,
];

/// Special values the data decoders mix in.
pub const SPECIALS: [f32; 24] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    1.0,
    -1.0,
    f32::MAX,
    -f32::MAX,
    1e38,
    -1e38,
    1e30,
    -1e30,
    1e-30,
    f32::MIN_POSITIVE,
    -f32::MIN_POSITIVE,
    1e-40,  // subnormal
    -1e-45, // smallest subnormal
    1e4,
    -1e4,
    65504.0,
    88.0,   // exp overflows near 88.7
    -104.0, // exp underflows to 0 near −103.9
    0.5,
];

/// Scales the decoders pick (the first is replaced by `1/√d` where a width is known).
const SCALES: [f32; 16] = [
    0.125,
    1.0,
    0.0,
    -0.0,
    -1.0,
    0.5,
    1e-30,
    1e-40,
    1e30,
    f32::MAX,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    3.0,
    -0.25,
    1e4,
];

/// A reader of fuzz bytes: header fields come from the bytes (0 once exhausted), element values
/// from the bytes and then from a generator seeded by them.
#[derive(Clone, Debug)]
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
    rng: u64,
}

impl<'a> Bytes<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        // FNV-1a of the input seeds the value generator.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in data {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Bytes { data, pos: 0, rng: h | 1 }
    }

    /// True when every byte has been read.
    pub fn exhausted(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next byte, or 0 past the end.
    pub fn u8(&mut self) -> u8 {
        match self.data.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }

    /// A byte from the input while there is one, else from the generator.
    fn byte_or_rng(&mut self) -> u8 {
        if self.exhausted() {
            (self.next_rng() >> 56) as u8
        } else {
            self.u8()
        }
    }

    fn next_rng(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1) from the generator.
    fn unit(&mut self) -> f32 {
        ((self.next_rng() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// A size in `0..=max`: mostly an edge size, sometimes any value.
    pub fn size(&mut self, max: usize) -> usize {
        let b = self.u8();
        let s = if b < 192 {
            EDGE_SIZES[usize::from(b) % EDGE_SIZES.len()]
        } else {
            usize::from(self.u8()) % (max + 1)
        };
        s.min(max)
    }

    /// A scale: a special value, `1/√d`, or a random one.
    pub fn scale(&mut self, d: usize) -> f32 {
        let b = self.u8();
        match b {
            0..=95 => attn_reference::attention::default_scale(d),
            96..=223 => SCALES[usize::from(b) % SCALES.len()],
            _ => self.unit() * 4.0,
        }
    }

    /// A parallelism: mostly sequential, sometimes 2 or 3 threads.
    pub fn par(&mut self) -> Parallelism {
        match self.u8() % 4 {
            0 | 1 => Parallelism::Sequential,
            2 => Parallelism::threads(2),
            _ => Parallelism::threads(3),
        }
    }

    /// `n` element values in one of several regimes chosen by a byte.
    pub fn values(&mut self, n: usize) -> Vec<f32> {
        let mode = self.u8() % 8;
        (0..n)
            .map(|_| match mode {
                // small integers: products and short sums are exact
                0 => f32::from(self.byte_or_rng() % 9) - 4.0,
                1 | 2 => self.unit(),
                // mixed magnitudes 2^-30 .. 2^30
                3 => {
                    let e = i32::from(self.byte_or_rng() % 61) - 30;
                    self.unit() * 2f32.powi(e)
                }
                // special values sprinkled among ordinary ones, placed by the input bytes
                4 | 5 => {
                    let b = self.byte_or_rng();
                    if b >= 232 {
                        SPECIALS[usize::from(b - 232) % SPECIALS.len()]
                    } else {
                        self.unit()
                    }
                }
                // huge: overflow of f32 intermediates
                6 => self.unit() * 1e38,
                // tiny: subnormal results
                _ => self.unit() * 1e-38,
            })
            .collect()
    }
}

/// An operand: the exact slice passed to the call (view elements and NaN padding) and its view.
#[derive(Clone, Debug)]
pub struct MatOperand {
    /// The slice.
    pub data: Vec<f32>,
    /// The view.
    pub layout: MatLayout,
}

/// A 4-D operand: the exact slice passed to the call and its view.
#[derive(Clone, Debug)]
pub struct TensorOperand {
    /// The slice.
    pub data: Vec<f32>,
    /// The view.
    pub layout: Tensor4Layout,
}

/// The slice length for a view: exact, with a tail, or one short (an out-of-bounds view); a small
/// length when the view's extent overflows or is too large to allocate.
fn slice_len(bytes: &mut Bytes<'_>, required: Option<usize>) -> usize {
    let b = bytes.u8();
    match required {
        Some(r) if r <= MAX_SLICE => match b % 16 {
            15 if r > 0 => r - 1,
            1..=3 => r + usize::from(b % 5),
            _ => r,
        },
        _ => usize::from(b % 16),
    }
}

/// Strides of a nested layout: dimensions are laid out innermost first in `order`, each padded
/// by `pads[i]` elements. Saturates instead of overflowing (the view check rejects the result).
fn nested_strides<const N: usize>(
    dims: [usize; N],
    order: [usize; N],
    pads: [usize; N],
) -> [usize; N] {
    let mut strides = [0usize; N];
    let mut next = 1usize;
    for &d in &order {
        strides[d] = next;
        next = next.saturating_mul(dims[d].max(1)).saturating_add(pads[d]);
    }
    strides
}

/// Applies one of the unusual stride patterns to `strides` (or none): a zero stride (broadcast;
/// aliasing for an output), a stride smaller than the extent it steps over (overlap), or one
/// large enough to overflow `usize` in the view check.
fn perturb_strides<const N: usize>(bytes: &mut Bytes<'_>, strides: &mut [usize; N]) {
    let b = bytes.u8();
    let d = usize::from(b >> 4) % N;
    match b % 16 {
        0 => strides[d] = 0,
        1 => strides[d] /= 2,
        2 => strides[d] = usize::MAX / 3,
        3 => strides[d] = strides[d].saturating_mul(3),
        _ => {}
    }
}

/// Decodes a `rows × cols` matrix view and its slice. Input padding is NaN; `values` fills the
/// view (for an output, the values C holds before the call).
pub fn decode_mat(bytes: &mut Bytes<'_>, rows: usize, cols: usize) -> MatOperand {
    let kind = bytes.u8();
    let order = if kind & 1 == 0 { [1, 0] } else { [0, 1] };
    let pads = if kind & 2 == 0 {
        [0, 0]
    } else {
        [usize::from(bytes.u8() % 9), usize::from(bytes.u8() % 9)]
    };
    let mut strides = nested_strides([rows, cols], order, pads);
    if kind & 4 != 0 {
        perturb_strides(bytes, &mut strides);
    }
    let offset = if kind & 8 != 0 { usize::from(bytes.u8() % 13) } else { 0 };
    let layout = MatLayout::strided(rows, cols, strides[0], strides[1], offset);
    let len = slice_len(bytes, layout.required_len());
    let mut data = vec![f32::NAN; len];
    let vals = bytes.values(rows.saturating_mul(cols).min(MAX_SLICE));
    if layout.check("x", len).is_ok() {
        let mut it = vals.into_iter();
        for i in 0..rows {
            for j in 0..cols {
                data[layout.index(i, j)] = it.next().unwrap_or(0.0);
            }
        }
    }
    MatOperand { data, layout }
}

/// Decodes a `[batch, heads, seq, dim]` view and its slice (see [`decode_mat`]).
pub fn decode_tensor(bytes: &mut Bytes<'_>, dims: [usize; 4]) -> TensorOperand {
    let kind = bytes.u8();
    // Storage orders, innermost first: bhsd, bshd, and the transposed-matrix variants.
    const ORDERS: [[usize; 4]; 4] = [[3, 2, 1, 0], [3, 1, 2, 0], [2, 3, 1, 0], [2, 1, 3, 0]];
    let order = ORDERS[usize::from(kind) % 4];
    let pads =
        if kind & 4 == 0 { [0; 4] } else { std::array::from_fn(|_| usize::from(bytes.u8() % 5)) };
    let mut strides = nested_strides(dims, order, pads);
    if kind & 8 != 0 {
        perturb_strides(bytes, &mut strides);
    }
    let offset = if kind & 16 != 0 { usize::from(bytes.u8() % 13) } else { 0 };
    let layout = Tensor4Layout::strided(dims, strides, offset);
    let len = slice_len(bytes, layout.required_len());
    let mut data = vec![f32::NAN; len];
    let vals = bytes.values(layout.len().min(MAX_SLICE));
    if layout.check("x", len).is_ok() {
        let mut it = vals.into_iter();
        for_each_index(&layout, |idx| data[idx] = it.next().unwrap_or(0.0));
    }
    TensorOperand { data, layout }
}

/// Calls `f` with the slice index of every element of a checked 4-D view, row-major.
fn for_each_index(l: &Tensor4Layout, mut f: impl FnMut(usize)) {
    let [nb, nh, ns, nd] = l.dims;
    for b in 0..nb {
        for h in 0..nh {
            for s in 0..ns {
                for d in 0..nd {
                    f(l.index(b, h, s, d));
                }
            }
        }
    }
}

/// An owned mask, turned into a [`Mask`] with [`MaskSpec::mask`].
#[derive(Clone, Debug)]
pub enum MaskSpec {
    /// [`Mask::None`].
    None,
    /// [`Mask::Causal`].
    Causal(Option<isize>),
    /// [`Mask::Keep`].
    Keep(Vec<bool>, Tensor4Layout),
    /// [`Mask::Bias`].
    Bias(Vec<f32>, Tensor4Layout),
}

impl MaskSpec {
    /// The borrowed mask.
    pub fn mask(&self) -> Mask<'_> {
        match self {
            MaskSpec::None => Mask::None,
            MaskSpec::Causal(offset) => Mask::Causal { offset: *offset },
            MaskSpec::Keep(keep, layout) => Mask::Keep { keep, layout: *layout },
            MaskSpec::Bias(bias, layout) => Mask::Bias { bias, layout: *layout },
        }
    }
}

/// Decodes a mask over a `[batch, heads, nq, nk]` score tensor: none; causal with the default,
/// a small or an extreme offset; a boolean keep-mask or an additive bias, either full or broadcast
/// over batch/heads/queries by zero strides, sometimes with a wrong dimension or a short slice.
/// Keep-masks range from all-true through random densities to all-false (fully masked rows);
/// biases include −∞ rows (fully masked), +∞, NaN and huge values.
pub fn decode_mask(bytes: &mut Bytes<'_>, dims: [usize; 4]) -> MaskSpec {
    let kind = bytes.u8();
    match kind % 6 {
        0 => MaskSpec::None,
        1 | 2 => {
            let (nq, nk) = (dims[2] as isize, dims[3] as isize);
            let off = match bytes.u8() % 10 {
                0..=3 => None,
                4 => Some(0),
                5 => Some(-1 - nq),
                6 => Some(isize::MIN),
                7 => Some(isize::MAX),
                8 => Some(nk),
                _ => Some(isize::from(bytes.u8() as i8) % 8),
            };
            MaskSpec::Causal(off)
        }
        k => {
            let mut mdims = dims;
            // key padding: one row per batch, broadcast over heads and queries
            let mut strides = match bytes.u8() % 4 {
                0 => [dims[3], 0, 0, 1],
                1 => [0, 0, dims[3], 1],
                _ => nested_strides(dims, [3, 2, 1, 0], [0; 4]),
            };
            let b = bytes.u8();
            if b.is_multiple_of(32) {
                let d = usize::from(b >> 5) % 4;
                mdims[d] += 1; // wrong shape
            } else if b % 32 == 1 {
                perturb_strides(bytes, &mut strides);
            }
            let layout = Tensor4Layout::strided(mdims, strides, 0);
            let len = slice_len(bytes, layout.required_len());
            if k == 3 || k == 4 {
                let density = bytes.u8();
                let keep = (0..len)
                    .map(|_| match density % 5 {
                        0 => true,
                        1 => false,
                        // exactly one key per row would need the layout; a sparse mask gives
                        // rows with none and rows with one
                        2 => bytes.byte_or_rng() < 8,
                        _ => bytes.byte_or_rng() < density,
                    })
                    .collect();
                MaskSpec::Keep(keep, layout)
            } else {
                let mut bias = bytes.values(len);
                if bytes.u8().is_multiple_of(4) {
                    // mask most positions with −∞, as an engine's additive mask does
                    for (i, v) in bias.iter_mut().enumerate() {
                        if i % 3 != 0 {
                            *v = f32::NEG_INFINITY;
                        }
                    }
                }
                MaskSpec::Bias(bias, layout)
            }
        }
    }
}

/// A slice between guard bands of sentinel NaNs, for outputs.
#[derive(Clone, Debug)]
pub struct Guarded {
    buf: Vec<f32>,
    before: Vec<u32>,
}

impl Guarded {
    /// `data` between two guard bands of [`GUARD`] sentinels.
    pub fn new(data: &[f32]) -> Self {
        let s = f32::from_bits(SENTINEL_BITS);
        let mut buf = vec![s; GUARD];
        buf.extend_from_slice(data);
        buf.extend(std::iter::repeat_n(s, GUARD));
        let before = buf.iter().map(|v| v.to_bits()).collect();
        Guarded { buf, before }
    }

    /// The slice the call sees.
    pub fn slice_mut(&mut self) -> &mut [f32] {
        let n = self.buf.len();
        &mut self.buf[GUARD..n - GUARD]
    }

    /// The slice after the call.
    pub fn slice(&self) -> &[f32] {
        &self.buf[GUARD..self.buf.len() - GUARD]
    }

    /// Positions (in the whole buffer, guards included) whose bits changed.
    fn changed(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.buf.len()).filter(|&i| self.buf[i].to_bits() != self.before[i])
    }

    /// `Err` naming the first changed element, if any.
    pub fn untouched(&self, what: &str) -> Result<(), String> {
        match self.changed().next() {
            None => Ok(()),
            Some(i) => Err(format!(
                "{what}: element {} of the buffer changed on error",
                i as isize - GUARD as isize
            )),
        }
    }

    /// `Err` when an element outside `inside` (slice indices of the view) changed.
    pub fn only_view_written(&self, what: &str, inside: &[bool]) -> Result<(), String> {
        for i in self.changed() {
            let in_view = i >= GUARD && inside.get(i - GUARD).copied().unwrap_or(false);
            if !in_view {
                return Err(format!(
                    "{what}: wrote outside its view at slice index {}",
                    i as isize - GUARD as isize
                ));
            }
        }
        Ok(())
    }
}

/// Which slice elements a checked 2-D view covers.
fn mat_inside(l: &MatLayout, len: usize) -> Vec<bool> {
    let mut inside = vec![false; len];
    for i in 0..l.rows {
        for j in 0..l.cols {
            inside[l.index(i, j)] = true;
        }
    }
    inside
}

/// Which slice elements a checked 4-D view covers.
fn tensor_inside(l: &Tensor4Layout, len: usize) -> Vec<bool> {
    let mut inside = vec![false; len];
    for_each_index(l, |i| inside[i] = true);
    inside
}

/// Compares the two `Result`s; `Ok(true)` when both succeeded and elements must be compared.
fn same_outcome(
    what: &str,
    reference: &attn_reference::Result<()>,
    kernel: &attn_reference::Result<()>,
) -> Result<bool, String> {
    match (reference, kernel) {
        (Ok(()), Ok(())) => Ok(true),
        // compared as text: `NonFinite` carries the value, and NaN ≠ NaN
        (Err(r), Err(k)) if format!("{r:?}") == format!("{k:?}") => Ok(false),
        (r, k) => Err(format!("{what}: reference returned {r:?}, kernel returned {k:?}")),
    }
}

/// A reference run and a kernel run of one softmax or attention case, after [`run_pair`]'s
/// checks, with their elements still to compare.
struct Runs {
    /// The reference's output slice.
    out_ref: Vec<f32>,
    /// The reference's logsumexps, when the case asks for them.
    lse_ref: Option<Vec<f32>>,
    /// The kernel's output slice, guard-banded.
    out: Guarded,
    /// The kernel's logsumexps, guard-banded.
    lse: Option<Guarded>,
}

/// The part of the softmax and attention checks before the element comparison: runs `reference`
/// on a copy of the output `out`, then `kernel` on a guard-banded copy, each with `lse` sentinel
/// logsumexps when `lse` is `Some` (the kernel's guard-banded too); requires the same outcome,
/// and then that the kernel changed nothing on an error, or wrote nothing outside its views on
/// success. `Ok(None)` when both failed alike (nothing left to compare). `op` and `out_name` name
/// the operation and its output in messages (`"softmax y"`, `"attention lse"`).
fn run_pair(
    (op, out_name): (&str, &str),
    out: &TensorOperand,
    lse: Option<usize>,
    reference: impl FnOnce(TensorMut<'_>, Option<&mut [f32]>) -> attn_reference::Result<()>,
    kernel: impl FnOnce(TensorMut<'_>, Option<&mut [f32]>) -> attn_reference::Result<()>,
) -> Result<Option<Runs>, String> {
    let sentinels = |n| vec![f32::from_bits(SENTINEL_BITS); n];
    let mut out_ref = out.data.clone();
    let mut lse_ref = lse.map(sentinels);
    let rr = reference(TensorMut::new(&mut out_ref, out.layout), lse_ref.as_deref_mut());
    let mut ok = Guarded::new(&out.data);
    let mut lk = lse.map(|n| Guarded::new(&sentinels(n)));
    let kr = kernel(TensorMut::new(ok.slice_mut(), out.layout), lk.as_mut().map(|g| g.slice_mut()));
    let (out_what, lse_what) = (format!("{op} {out_name}"), format!("{op} lse"));
    if !same_outcome(op, &rr, &kr)? {
        ok.untouched(&out_what)?;
        return lk.map_or(Ok(None), |g| g.untouched(&lse_what).map(|()| None));
    }
    ok.only_view_written(&out_what, &tensor_inside(&out.layout, out.data.len()))?;
    if let Some(g) = &lk {
        g.only_view_written(&lse_what, &vec![true; g.slice().len()])?;
    }
    Ok(Some(Runs { out_ref, lse_ref, out: ok, lse: lk }))
}

/// Element check shared by every oracle. `reference` is the f32 reference value; `safe` says the
/// f32 computation cannot overflow where the f64 one does not, and `bound` is the derived error
/// bound for finite values (the reference's own rounding included by the caller).
fn check_value(
    what: &str,
    at: &dyn Fn() -> String,
    kernel: f32,
    reference: f32,
    safe: bool,
    bound: f64,
) -> Result<(), String> {
    let fail = |why: &str| {
        Err(format!("{what} at {}: kernel {kernel:e}, reference {reference:e}: {why}", at()))
    };
    if reference.is_nan() {
        return if kernel.is_nan() { Ok(()) } else { fail("reference is NaN, kernel is not") };
    }
    if !safe {
        return Ok(());
    }
    if reference.is_infinite() {
        return if kernel == reference { Ok(()) } else { fail("reference is infinite") };
    }
    if !kernel.is_finite() {
        return fail("kernel is not finite");
    }
    let err = (f64::from(kernel) - f64::from(reference)).abs();
    if err <= bound {
        Ok(())
    } else {
        fail(&format!("error {err:e} exceeds bound {bound:e}"))
    }
}

// ------------------------------------------------------------------------------------------
// SGEMM
// ------------------------------------------------------------------------------------------

/// A decoded `C ← α·A·B + β·C` call.
#[derive(Clone, Debug)]
pub struct GemmCase {
    /// α.
    pub alpha: f32,
    /// β.
    pub beta: f32,
    /// A (`m × k`).
    pub a: MatOperand,
    /// B (`k × n`, sometimes with a wrong row count).
    pub b: MatOperand,
    /// C (`m × n` before the call, sometimes with a wrong shape).
    pub c: MatOperand,
    /// Threads.
    pub par: Parallelism,
}

const ALPHAS: [f32; 12] =
    [1.0, 1.0, -1.0, 0.0, 0.5, 3.0, 1e-30, 1e30, f32::NAN, f32::INFINITY, -0.0, 1e-40];
const BETAS: [f32; 12] =
    [0.0, 0.0, 1.0, -1.0, 0.5, 2.0, -0.0, 1e-30, 1e30, f32::NAN, f32::NEG_INFINITY, 1e-40];

impl GemmCase {
    /// Decodes a case from fuzz bytes.
    pub fn decode(data: &[u8]) -> Self {
        let mut bytes = Bytes::new(data);
        let mut m = bytes.size(257);
        let mut n = bytes.size(257);
        let mut k = bytes.size(257);
        while m.saturating_mul(n).saturating_mul(k) > MAX_WORK {
            m /= 2;
            n /= 2;
            k /= 2;
        }
        let alpha = ALPHAS[usize::from(bytes.u8()) % ALPHAS.len()];
        let beta = BETAS[usize::from(bytes.u8()) % BETAS.len()];
        let wrong = bytes.u8();
        let kb = if wrong == 1 { k + 1 } else { k };
        let (mc, nc) = if wrong == 2 {
            (m + 1, n)
        } else if wrong == 3 {
            (m, n.saturating_sub(1))
        } else {
            (m, n)
        };
        let par = bytes.par();
        let a = decode_mat(&mut bytes, m, k);
        let b = decode_mat(&mut bytes, kb, n);
        let c = decode_mat(&mut bytes, mc, nc);
        GemmCase { alpha, beta, a, b, c, par }
    }

    /// Runs the reference and `kernel` and compares them (see the module docs). Per element, with
    /// `S = Σ_p |a_ip||b_pj|`: `|ĉ − c| ≤ γ·(k + 3)·u·(|α|·S + |β·c_ij|) + u·|c| + γ·(k + 3)·(1 + |α|)·2⁻¹⁴⁹`
    /// (the gemm tests' bound, the reference's own rounding, and subnormal underflow). The f32
    /// computation is overflow-safe when `S`, `|α|·S`, `|α|·max|a|`, `|α|·max|b|` and `|β·c|`
    /// are all below `f32::MAX / 2`; otherwise only NaN-ness is compared. `α = 0` or `k = 0`
    /// gives exactly `β·C` (BLAS convention, documented by the kernel: A and B are not read),
    /// where the reference would propagate a NaN from A·B.
    pub fn check(
        &self,
        kernel: impl FnOnce(
            f32,
            MatRef<'_>,
            MatRef<'_>,
            f32,
            MatMut<'_>,
            Parallelism,
        ) -> attn_reference::Result<()>,
    ) -> Result<(), String> {
        let (a, b) =
            (MatRef::new(&self.a.data, self.a.layout), MatRef::new(&self.b.data, self.b.layout));
        let mut cr = self.c.data.clone();
        let rr = attn_reference::matmul::matmul(
            self.alpha,
            a,
            b,
            self.beta,
            MatMut::new(&mut cr, self.c.layout),
        );
        let mut ck = Guarded::new(&self.c.data);
        let kr = kernel(
            self.alpha,
            a,
            b,
            self.beta,
            MatMut::new(ck.slice_mut(), self.c.layout),
            self.par,
        );
        if !same_outcome("sgemm", &rr, &kr)? {
            return ck.untouched("sgemm c");
        }
        let lc = self.c.layout;
        ck.only_view_written("sgemm c", &mat_inside(&lc, self.c.data.len()))?;
        let kk = self.a.layout.cols;
        for i in 0..lc.rows {
            for j in 0..lc.cols {
                let idx = lc.index(i, j);
                let c_old = self.c.data[idx];
                let got = ck.slice()[idx];
                let at = || format!("c({i},{j}) of {}x{}x{kk}", lc.rows, lc.cols);
                let beta_c =
                    if self.beta == 0.0 { 0.0 } else { f64::from(self.beta) * f64::from(c_old) };
                if self.alpha == 0.0 || kk == 0 {
                    let want = beta_c as f32;
                    if !(got == want || got.is_nan() && want.is_nan()) {
                        return Err(format!("sgemm {}: kernel {got:e}, want β·c = {want:e}", at()));
                    }
                    continue;
                }
                let want = cr[idx];
                let (mut s, mut max_a, mut max_b) = (0.0f64, 0.0f64, 0.0f64);
                for p in 0..kk {
                    let (x, y) = (f64::from(a.at(i, p)), f64::from(b.at(p, j)));
                    s += (x * y).abs();
                    max_a = max_a.max(x.abs());
                    max_b = max_b.max(y.abs());
                }
                let al = f64::from(self.alpha).abs();
                // NaN magnitudes (NaN data) make `safe` false, which is right: NaN-ness only.
                let safe = [s, al * s, al * max_a, al * max_b, beta_c.abs()]
                    .iter()
                    .all(|&v| v <= OVERFLOW);
                let bound = GAMMA * (kk as f64 + 3.0) * U * (al * s + beta_c.abs())
                    + U * f64::from(want).abs()
                    + GAMMA * (kk as f64 + 3.0) * (1.0 + al) * TINY;
                check_value("sgemm", &at, got, want, safe, bound)?;
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// Scale-mask-softmax
// ------------------------------------------------------------------------------------------

/// A decoded `y = softmax(scale·x + mask)` call.
#[derive(Clone, Debug)]
pub struct SoftmaxCase {
    /// x, `[batch, heads, rows, cols]`.
    pub x: TensorOperand,
    /// The scale.
    pub scale: f32,
    /// The mask.
    pub mask: MaskSpec,
    /// y before the call (sometimes with a wrong shape).
    pub y: TensorOperand,
    /// Length of the lse output, when one is passed (sometimes wrong).
    pub lse: Option<usize>,
    /// Threads.
    pub par: Parallelism,
}

impl SoftmaxCase {
    /// Decodes a case from fuzz bytes.
    pub fn decode(data: &[u8]) -> Self {
        let mut bytes = Bytes::new(data);
        let batch = usize::from(bytes.u8() % 3);
        let heads = usize::from(bytes.u8() % 3) + usize::from(batch > 0);
        let mut rows = bytes.size(257);
        let mut cols = bytes.size(1100);
        while batch * heads * rows * cols.max(1) > MAX_WORK / 4 {
            rows /= 2;
            cols /= 2;
        }
        let dims = [batch, heads, rows, cols];
        let scale = bytes.scale(cols);
        let par = bytes.par();
        let wrong = bytes.u8();
        let mut ydims = dims;
        if wrong % 32 == 1 {
            ydims[usize::from(wrong >> 5) % 4] += 1;
        }
        let rowsn = batch * heads * rows;
        let lse = match bytes.u8() % 8 {
            0..=3 => None,
            4 if rowsn > 0 => Some(rowsn - 1),
            5 => Some(rowsn + 1),
            _ => Some(rowsn),
        };
        let mask = decode_mask(&mut bytes, dims);
        let x = decode_tensor(&mut bytes, dims);
        let y = decode_tensor(&mut bytes, ydims);
        SoftmaxCase { x, scale, mask, y, lse, par }
    }

    /// Runs the reference and `kernel` and compares them (see the module docs and
    /// [`softmax_row_bound`]). `lse` passed to the kernel is guard-banded too.
    pub fn check(
        &self,
        kernel: impl FnOnce(
            TensorRef<'_>,
            f32,
            &Mask<'_>,
            TensorMut<'_>,
            Option<&mut [f32]>,
            Parallelism,
        ) -> attn_reference::Result<()>,
    ) -> Result<(), String> {
        let mask = self.mask.mask();
        let x = TensorRef::new(&self.x.data, self.x.layout);
        let runs = run_pair(
            ("softmax", "y"),
            &self.y,
            self.lse,
            |y, l| attn_reference::softmax::scale_mask_softmax(x, self.scale, &mask, y, l),
            |y, l| kernel(x, self.scale, &mask, y, l, self.par),
        )?;
        let Some(Runs { out_ref: yr, lse_ref: lr, out: yk, lse: lk }) = runs else {
            return Ok(());
        };
        let ly = self.y.layout;
        let [batch, heads, rows, cols] = self.x.layout.dims;
        for b in 0..batch {
            for h in 0..heads {
                for i in 0..rows {
                    let logits: Vec<Logit> = (0..cols)
                        .map(|j| {
                            mask.term(b, h, i, j, rows, cols).map(|t| {
                                let sx = f64::from(self.scale) * f64::from(x.at(b, h, i, j));
                                let t = f64::from(t);
                                (saturate_logit(sx + t), finite_abs(sx) + finite_abs(t))
                            })
                        })
                        .collect();
                    let rb = softmax_row_bound(&logits);
                    for j in 0..cols {
                        let idx = ly.index(b, h, i, j);
                        let at = || {
                            format!(
                                "y({b},{h},{i},{j}) of {:?}, scale {}",
                                self.x.layout.dims, self.scale
                            )
                        };
                        check_prob("softmax", &at, yk.slice()[idx], yr[idx], &rb, j)?;
                    }
                    if let (Some(lr), Some(lk)) = (&lr, &lk) {
                        let r = (b * heads + h) * rows + i;
                        let at = || format!("lse({b},{h},{i})");
                        if !(POS_INF_ROWS_MAY_BE_NAN && rb.has_pos_inf && lk.slice()[r].is_nan()) {
                            check_value(
                                "softmax lse",
                                &at,
                                lk.slice()[r],
                                lr[r],
                                rb.safe,
                                rb.lse_bound + U * f64::from(lr[r]).abs(),
                            )?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// `|x|` for finite `x`, else 0: infinite ingredients are exact in f32 and f64 alike; only the
/// finite ones carry rounding error or can overflow.
fn finite_abs(x: f64) -> f64 {
    if x.is_finite() {
        x.abs()
    } else {
        0.0
    }
}

/// One logit of a row: `None` when masked, else `(value, magnitude)` where `value` is the f64
/// logit and `magnitude` the sum of the absolute values of its ingredients (`|scale·x| + |bias|`
/// for softmax, `(d + 2)·|scale|·Σ|q||k| + |bias|` for attention), the size its f32 rounding
/// error scales with.
pub type Logit = Option<(f64, f64)>;

/// What the oracle knows about a softmax row: the f64 probabilities, the relative error bound of
/// each unnormalised weight, the relative error of their sum, and the logsumexp bound.
#[derive(Clone, Debug)]
pub struct RowBound {
    /// Probabilities from [`softmax_row`] (masked → 0).
    pub p: Vec<f64>,
    /// Relative error bound of each `exp(t_j − m)` as the kernel computes it.
    pub rel: Vec<f64>,
    /// Relative error bound of `Σ exp(t_j − m)`.
    pub rel_sum: f64,
    /// Absolute bound for the logsumexp (without the reference's rounding).
    pub lse_bound: f64,
    /// True when no f32 intermediate can overflow (every finite ingredient below f32::MAX / 2)
    /// and every logit is known to within 1/2 (else f32 cannot resolve the row).
    pub safe: bool,
    /// True when some logit is +∞ (the +∞ positions share the weight).
    pub has_pos_inf: bool,
}

/// Derives the row bound. For logits `t_j` with ingredient magnitudes `A_j` and `A = max A_j`,
/// the kernel's `t̂_j − m̂` is off by `δ_j = γ·u·(A_j + A + |t_j − m|)` (rounding of `t_j`, of the
/// max, and of the subtraction), so `exp` is off by the relative `e^δ_j − 1 + ε_exp`; the sum of `n`
/// weights adds `n·u`, and `p_j = e_j / S` is off by `rel_j + rel_S + 2u` relative plus
/// `γ·(n + 1)·2⁻¹²⁶` absolute for exp results flushed below the normal range.
/// `lse = m + ln S` is off by `γ·u·A + rel_S + γ·u·|lse|`.
pub fn softmax_row_bound(logits: &[Logit]) -> RowBound {
    let vals: Vec<Option<f64>> = logits.iter().map(|l| l.map(|(v, _)| v)).collect();
    let (p, lse) = softmax_row(&vals);
    let n = logits.len() as f64;
    let finite = || logits.iter().flatten().filter(|(v, _)| v.is_finite());
    let amax = finite().map(|&(_, a)| a).fold(0.0, f64::max);
    let m = finite().map(|&(v, _)| v).fold(f64::NEG_INFINITY, f64::max);
    // Every finite ingredient must stay representable: a finite f64 logit whose f32
    // ingredients overflow becomes ∞ in the kernel, and ∞ − ∞ a NaN.
    let fits = logits.iter().flatten().all(|&(_, a)| a <= OVERFLOW);
    // Logit errors δ_j; exp turns them into the relative error e^δ − 1 (not δ: the kernel may
    // give weight to a key the f64 reference underflows to 0 only if δ is large).
    let delta: Vec<f64> = logits
        .iter()
        .map(|l| match l {
            Some((v, a)) if v.is_finite() => GAMMA * U * (a + amax + (v - m).abs()),
            _ => 0.0,
        })
        .collect();
    // When a logit is uncertain by more than 1/2, f32 cannot resolve the row (e.g. logits of
    // 1e37 that differ by 1e27): like an overflow, only NaN-ness and ranges are checked.
    let conditioned = delta.iter().all(|&d| d <= 0.5);
    let safe = fits && conditioned;
    let rel: Vec<f64> = logits
        .iter()
        .zip(&delta)
        .map(|(l, d)| match l {
            Some((v, _)) if v.is_finite() => d.exp_m1() + EXP_REL,
            _ => 0.0,
        })
        .collect();
    let rel_sum = p.iter().zip(&rel).map(|(p, r)| p * r).sum::<f64>() + n * U;
    let lse_bound = GAMMA * U * amax + GAMMA * rel_sum + GAMMA * U * lse.abs() + GAMMA * EXP_REL;
    let has_pos_inf = vals.contains(&Some(f64::INFINITY));
    RowBound { p, rel, rel_sum, lse_bound, safe, has_pos_inf }
}

/// Whether the oracles accept a NaN row where the reference has `+∞` logits. False: every
/// kernel path follows the reference's convention (the `+∞` logits, including scores that
/// overflow f32, share the weight; logsumexp +∞), so such rows are checked like any other.
/// It was a documented deviation of the attention paths before issue 25.
pub const POS_INF_ROWS_MAY_BE_NAN: bool = false;

/// Checks one probability of a softmax row: within `γ·p_j·(rel_j + rel_S + 2u) + u·p_j +
/// γ·(n + 1)·2⁻¹²⁶`, exactly 0 at masked and −∞ positions (and everywhere in a fully masked
/// row), `1/count` at +∞ positions; in a row that may overflow, NaN or a value in [0, 1].
fn check_prob(
    what: &str,
    at: &dyn Fn() -> String,
    got: f32,
    want: f32,
    rb: &RowBound,
    j: usize,
) -> Result<(), String> {
    let n = rb.p.len() as f64;
    if !rb.safe {
        if want.is_nan() && !got.is_nan() {
            return Err(format!("{what} at {}: kernel {got:e}, reference NaN", at()));
        }
        if !got.is_nan() && !(0.0..=1.0).contains(&got) {
            return Err(format!("{what} at {}: kernel {got:e} is not a probability", at()));
        }
        return Ok(());
    }
    if POS_INF_ROWS_MAY_BE_NAN && rb.has_pos_inf && got.is_nan() {
        return Ok(()); // documented kernel deviation, see [`POS_INF_ROWS_MAY_BE_NAN`]
    }
    let pj = rb.p[j];
    let bound = if rb.has_pos_inf {
        2.0 * U * pj
    } else {
        GAMMA * pj * (rb.rel[j] + rb.rel_sum + 2.0 * U) + U * pj + GAMMA * (n + 1.0) * MIN_NORMAL
    };
    if pj == 0.0 && !want.is_nan() && got != 0.0 && rb.rel[j] == 0.0 {
        return Err(format!(
            "{what} at {}: kernel {got:e} at a masked position (want exactly 0)",
            at()
        ));
    }
    check_value(what, at, got, want, true, bound)
}

// ------------------------------------------------------------------------------------------
// Attention
// ------------------------------------------------------------------------------------------

/// A decoded `O = softmax(scale·Q·Kᵀ + mask)·V` call.
#[derive(Clone, Debug)]
pub struct AttentionCase {
    /// Q `[batch, hq, nq, dk]`.
    pub q: TensorOperand,
    /// K `[batch, hkv, nk, dk]`.
    pub k: TensorOperand,
    /// V `[batch, hkv, nk, dv]`.
    pub v: TensorOperand,
    /// The scale.
    pub scale: f32,
    /// The mask over `[batch, hq, nq, nk]`.
    pub mask: MaskSpec,
    /// O before the call `[batch, hq, nq, dv]`.
    pub o: TensorOperand,
    /// Length of the lse output, when one is passed.
    pub lse: Option<usize>,
    /// Threads.
    pub par: Parallelism,
    /// Attention variants (decoded from the bytes after everything else, so inputs of
    /// earlier corpora decode to plain attention).
    pub variants: VariantSpec,
}

/// Owned attention variants of a decoded case (see `attn_kernels::Variants`).
#[derive(Clone, Debug, Default)]
pub struct VariantSpec {
    /// Sliding window `(left, right)`.
    pub window: Option<(usize, usize)>,
    /// Logit softcap (any value: bad ones must be refused by both sides).
    pub softcap: Option<f32>,
    /// Sink logits (any length and values).
    pub sinks: Option<Vec<f32>>,
    /// ALiBi slopes (any length and values).
    pub alibi: Option<Vec<f32>>,
}

impl VariantSpec {
    /// Decodes variants for `hq` query heads: a flags byte, then each variant it sets, from
    /// edge values (windows of 0, 1 and unbounded sides, softcaps that are invalid, tiny or
    /// huge, slopes and sinks of every magnitude) and, for the per-head values, a wrong length
    /// now and then.
    pub fn decode(bytes: &mut Bytes<'_>, hq: usize) -> Self {
        const SIDES: [usize; 8] = [0, 1, 3, 17, 64, 200, usize::MAX / 2, usize::MAX];
        const CAPS: [f32; 9] = [0.5, 5.0, 50.0, 1e-30, 1e30, 0.0, -1.0, f32::NAN, f32::INFINITY];
        const PER_HEAD: [f32; 9] =
            [0.0, 0.5, -0.25, 0.00390625, 3.0, -80.0, 1e30, f32::NAN, f32::NEG_INFINITY];
        let flags = bytes.u8();
        let pick = |set: &[f32], bytes: &mut Bytes<'_>| set[usize::from(bytes.u8()) % set.len()];
        let window = (flags & 1 != 0)
            .then(|| (SIDES[usize::from(bytes.u8()) % 8], SIDES[usize::from(bytes.u8()) % 8]));
        let softcap = (flags & 2 != 0).then(|| pick(&CAPS, bytes));
        let per_head = |bytes: &mut Bytes<'_>| {
            let n = if bytes.u8() == 255 { hq + 1 } else { hq };
            // Mostly sane values; one hostile value in a head when the byte says so.
            let sane = pick(&PER_HEAD[..5], bytes);
            let mut v = vec![sane; n];
            if let Some(x) = v.first_mut() {
                *x = pick(&PER_HEAD, bytes);
            }
            v
        };
        let sinks = (flags & 4 != 0).then(|| per_head(bytes));
        let alibi = (flags & 8 != 0).then(|| per_head(bytes));
        VariantSpec { window, softcap, sinks, alibi }
    }

    /// The variants as the kernels and the reference take them.
    pub fn variants(&self) -> Variants<'_> {
        let mut v = Variants::NONE;
        if let Some((l, r)) = self.window {
            v = v.window(l, r);
        }
        if let Some(c) = self.softcap {
            v = v.softcap(c);
        }
        if let Some(s) = &self.sinks {
            v = v.sinks(s);
        }
        if let Some(a) = &self.alibi {
            v = v.alibi(a);
        }
        v
    }
}

impl AttentionCase {
    /// Decodes a general case: any `nq`, GQA/MQA head ratios (and non-dividing ones), `dk ≠ dv`.
    pub fn decode(data: &[u8]) -> Self {
        Self::decode_with(data, false)
    }

    /// Decodes a decode-step case: one query per head (`nq = 1`), long key sequences.
    pub fn decode_single_query(data: &[u8]) -> Self {
        Self::decode_with(data, true)
    }

    fn decode_with(data: &[u8], decode_step: bool) -> Self {
        let mut bytes = Bytes::new(data);
        let batch = usize::from(bytes.u8() % 3);
        let hkv = usize::from(bytes.u8() % 3);
        let hq = match bytes.u8() % 6 {
            0 => hkv,
            1 => 2 * hkv,
            2 => 4 * hkv,
            3 => 3,
            4 => 0,
            _ => 1,
        };
        let mut nq = if decode_step { 1 } else { bytes.size(257) };
        let mut nk = bytes.size(if decode_step { 1100 } else { 300 });
        let dk = bytes.size(129);
        let dv = if bytes.u8().is_multiple_of(2) { dk } else { bytes.size(129) };
        while batch * hq * nq * nk * (dk + dv).max(1) > MAX_WORK {
            nq = nq.div_ceil(2).min(nq.saturating_sub(1)).max(usize::from(decode_step));
            nk /= 2;
        }
        let scale = bytes.scale(dk);
        let par = bytes.par();
        let wrong = bytes.u8();
        let mut kd = [batch, hkv, nk, dk];
        let mut vd = [batch, hkv, nk, dv];
        let mut od = [batch, hq, nq, dv];
        match wrong {
            1 => kd[3] += 1,
            2 => vd[2] += 1,
            3 => od[3] += 1,
            4 => vd[0] += 1,
            _ => {}
        }
        let rowsn = batch * hq * nq;
        let lse = match bytes.u8() % 8 {
            0..=3 => None,
            4 if rowsn > 0 => Some(rowsn - 1),
            _ => Some(rowsn),
        };
        let mask = decode_mask(&mut bytes, [batch, hq, nq, nk]);
        let q = decode_tensor(&mut bytes, [batch, hq, nq, dk]);
        let k = decode_tensor(&mut bytes, kd);
        let v = decode_tensor(&mut bytes, vd);
        let o = decode_tensor(&mut bytes, od);
        let variants = VariantSpec::decode(&mut bytes, hq);
        AttentionCase { q, k, v, scale, mask, o, lse, par, variants }
    }

    /// Runs the reference and `kernel` (given the kernels' [`Attention`] problem of the case,
    /// with its scale, mask, logsumexp output and threads, to run on the output, after setting
    /// any path or ISA) and compares them. Per row the logits are
    /// `t_j = scale·q·k_j + bias_j` with ingredient magnitude `(dk + 2)·|scale|·Σ|q||k_j| + |bias_j|`
    /// (the dot product's rounding, [`softmax_row_bound`]); per output element, with
    /// `W = Σ_j p_j·|v_jd|`: `|ô − o| ≤ γ·(Σ_j p_j·|v_jd|·(rel_j + (nk + 1)·(u + ε_exp)) + rel_S·W)
    /// + 2u·|o| + γ·nk·((2⁻¹²⁶ + f)·max|v_d| + 2⁻¹⁴⁹)` — the weights' error, the rescaling and
    /// accumulation of a streaming (flash) kernel over at most `nk` blocks, the reference's
    /// rounding, and weights flushed to 0 (below the normal range, or below the kernels' flush
    /// threshold, `f` = [`flushed_weight`]). The f32 computation is
    /// overflow-safe when every ingredient and `Σ_j |v_jd|` (the unnormalised accumulator of a
    /// streaming kernel, whose weights are ≤ 1) stay below `f32::MAX / 2`.
    pub fn check(
        &self,
        kernel: impl FnOnce(Attention<'_>, TensorMut<'_>) -> attn_reference::Result<()>,
    ) -> Result<(), String> {
        let q = TensorRef::new(&self.q.data, self.q.layout);
        let k = TensorRef::new(&self.k.data, self.k.layout);
        let v = TensorRef::new(&self.v.data, self.v.layout);
        self.check_views(q.into(), k.into(), v.into(), (false, false), kernel)
    }

    /// [`check`](Self::check) with the kernel reading `qv`, `kv`, `vv`: views of the case's
    /// layouts over storage whose elements represent exactly the case's f32 data (which the
    /// reference reads), e.g. bf16 copies of data that bf16 holds exactly. `dot = (scores,
    /// pv)`: the kernel runs the scores, and `P·V`, on `vdpbf16ps`, held to that bound
    /// ([`Rows::dot`], [`Rows::dot_pv`]).
    pub fn check_views(
        &self,
        qv: AnyRef<'_>,
        kv: KvRef<'_>,
        vv: KvRef<'_>,
        (dot, dot_pv): (bool, bool),
        kernel: impl FnOnce(Attention<'_>, TensorMut<'_>) -> attn_reference::Result<()>,
    ) -> Result<(), String> {
        let mask = self.mask.mask();
        let q = TensorRef::new(&self.q.data, self.q.layout);
        let k = TensorRef::new(&self.k.data, self.k.layout);
        let v = TensorRef::new(&self.v.data, self.v.layout);
        let var = self.variants.variants();
        let runs = run_pair(
            ("attention", "o"),
            &self.o,
            self.lse,
            |o, l| {
                attn_reference::attention::attention_with_variants(
                    q, k, v, self.scale, &mask, &var, o, l,
                )
            },
            |o, l| {
                let a = Attention::new(qv, kv, vv)
                    .scale(self.scale)
                    .mask(mask)
                    .variants(var)
                    .parallelism(self.par);
                kernel(with_lse(a, l), o)
            },
        )?;
        let Some(Runs { out_ref, lse_ref, out, lse }) = runs else {
            return Ok(());
        };
        let [_, hq, nq, _] = self.q.layout.dims;
        let rows = Rows {
            q,
            k,
            v,
            scale: self.scale,
            mask: &mask,
            variants: &var,
            o: self.o.layout,
            lse_at: &|b, h, i| (b * hq + h) * nq + i,
            dot,
            dot_pv,
        };
        let describe = || {
            format!(
                "q {:?} k {:?} v {:?}, scale {}",
                self.q.layout.dims, self.k.layout.dims, self.v.layout.dims, self.scale
            )
        };
        let lse = lse_ref.as_deref().zip(lse.as_ref().map(|g| g.slice()));
        rows.check(&out_ref, out.slice(), lse, &describe)
    }
}

/// One dense attention problem of a case, after both runs succeeded: its operands, settings
/// and output layout, and where row `(b, h, i)`'s logsumexp sits in the lse slice. Packed and
/// paged cases check each sequence as one such problem (its rows cut out of the packed views,
/// its K/V gathered from the pages).
pub struct Rows<'a> {
    /// Q `[batch, hq, nq, dk]`.
    pub q: TensorRef<'a>,
    /// K `[batch, hkv, nk, dk]`.
    pub k: TensorRef<'a>,
    /// V `[batch, hkv, nk, dv]`.
    pub v: TensorRef<'a>,
    /// The scale.
    pub scale: f32,
    /// The mask.
    pub mask: &'a Mask<'a>,
    /// The variants.
    pub variants: &'a Variants<'a>,
    /// The output's view (into both output slices).
    pub o: Tensor4Layout,
    /// The index in the lse slices of row `(b, h, i)`.
    pub lse_at: &'a dyn Fn(usize, usize, usize) -> usize,
    /// The kernel ran the scores on `vdpbf16ps` (`HalfPath::Dot`): the bound adds the
    /// instruction's flushing on each score (the derivation is in
    /// `attn_kernels::attention::Attention`'s docs).
    pub dot: bool,
    /// The kernel ran `P·V` on `vdpbf16ps` too, on probabilities rounded to bf16 (the flash
    /// path with `HalfPath::Dot`): the bound adds that rounding and the flushing in `P·V`.
    pub dot_pv: bool,
}

impl Rows<'_> {
    /// Compares the kernel's output `got_o` (and logsumexps, `lse = (reference, kernel)`) with
    /// the reference's `want_o` element by element, within the bound that
    /// [`AttentionCase::check`] states; `describe` names the case in messages.
    pub fn check(
        &self,
        want_o: &[f32],
        got_o: &[f32],
        lse: Option<(&[f32], &[f32])>,
        describe: &dyn Fn() -> String,
    ) -> Result<(), String> {
        let (q, k, v, mask, var) = (self.q, self.k, self.v, self.mask, self.variants);
        let (lo, vdp) = (self.o, self.dot);
        let subnormal = |x: f64| x != 0.0 && x.abs() < MIN_NORMAL;
        let [batch, hq, nq, dk] = q.layout.dims;
        let [_, hkv, nk, _] = k.layout.dims;
        let dv = v.layout.dims[3];
        let group = hq / hkv;
        let sc = f64::from(self.scale);
        let nkf = nk as f64;
        let off = Variants::offset(mask, nq, nk);
        let cap = |s: f64| var.softcap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh());
        // The softcap's error as an ingredient magnitude (δ = γ·u·a, see `softcap_error`).
        let cap_mag = var.softcap.map_or(0.0, |c| softcap_error(f64::from(c)) / (GAMMA * U));
        for b in 0..batch {
            for h in 0..hq {
                let kh = h / group;
                let slope = var.alibi.map_or(0.0, |a| f64::from(a[h]));
                for i in 0..nq {
                    let (mut qmax, mut qsum) = (0.0f64, 0.0f64);
                    for d in 0..dk {
                        qmax = qmax.max(f64::from(q.at(b, h, i, d)).abs());
                        qsum += finite_abs(f64::from(q.at(b, h, i, d)));
                    }
                    // `vdpbf16ps` reads a subnormal input as 0: met with an infinite one, its
                    // product is NaN where the exact one is infinite. Such a row is not
                    // constrained (documented).
                    let mut dot_nan = false;
                    let mut logits: Vec<Logit> = (0..nk)
                        .map(|j| {
                            let in_window = var.window.is_none_or(|w| w.contains(i, j, off));
                            mask.term(b, h, i, j, nq, nk).filter(|_| in_window).map(|t| {
                                let (mut dot, mut mag, mut ksum) = (0.0f64, 0.0f64, 0.0f64);
                                for d in 0..dk {
                                    let (x, y) =
                                        (f64::from(q.at(b, h, i, d)), f64::from(k.at(b, kh, j, d)));
                                    dot += x * y;
                                    mag += finite_abs(x * y);
                                    ksum += finite_abs(y);
                                    dot_nan |= vdp
                                        && ((subnormal(x) && y.is_infinite())
                                            || (subnormal(y) && x.is_infinite()));
                                }
                                let t = f64::from(t);
                                // The kernel may scale Q first, or the dot product after, so
                                // |scale|·max|q| and the unscaled Σ|q||k| must fit as well.
                                let fits = mag <= OVERFLOW && sc.abs() * qmax <= OVERFLOW;
                                // A query pre-scaled in f32 may be off by one subnormal
                                // spacing per element (underflow, or the kept 2⁻¹⁴⁹ of a
                                // product that would flush to 0): Σ|k|·2⁻¹⁴⁹ on the logit,
                                // written as an ingredient magnitude (δ = γ·u·a).
                                // ALiBi: the distance and the product round once each.
                                let dist = j as i128 - i as i128 - off as i128;
                                let alibi = if slope == 0.0 { 0.0 } else { slope * dist as f64 };
                                let a = (dk as f64 + 2.0) * sc.abs() * mag
                                    + finite_abs(t)
                                    + (dk as f64) * TINY
                                    + ksum * TINY / U
                                    + finite_abs(alibi)
                                    + cap_mag;
                                let fits = fits && alibi.abs() <= OVERFLOW;
                                // `vdpbf16ps` flushes subnormal inputs and results below
                                // 2⁻¹²⁶: scale·2⁻¹²⁶·(dk + 1 + Σ(|q| + |k|)) on the score.
                                let a = if vdp {
                                    let flush = sc.abs() * MIN_NORMAL * (dk as f64 + 1.0);
                                    a + (flush + sc.abs() * MIN_NORMAL * (qsum + ksum))
                                        / (GAMMA * U)
                                } else {
                                    a
                                };
                                let value = saturate_logit(cap(sc * dot) + t + alibi);
                                (value, if fits { a } else { f64::INFINITY })
                            })
                        })
                        .collect();
                    // A sink is one more logit, exact, with no value.
                    if let Some(s) = var.sinks {
                        logits.push(Some((f64::from(s[h]), f64::from(s[h]).abs())));
                    }
                    let rb = softmax_row_bound(&logits);
                    let lse_at = (self.lse_at)(b, h, i);
                    for d in 0..dv {
                        let idx = lo.index(b, h, i, d);
                        let (mut w, mut werr, mut vsum, mut vmax) =
                            (0.0f64, 0.0f64, 0.0f64, 0.0f64);
                        let mut tiny_weight_nonfinite = false;
                        for (j, logit) in logits.iter().enumerate().take(nk) {
                            let x = f64::from(v.at(b, kh, j, d)).abs();
                            if logit.is_some() {
                                vsum += x;
                                vmax = vmax.max(x);
                            }
                            // a weight below the kernels' flush threshold (or the f32
                            // normal range) may be flushed to 0, dropping a NaN/∞ value the
                            // reference still sees
                            tiny_weight_nonfinite |=
                                rb.p[j] > 0.0 && rb.p[j] < flushed_weight() && !x.is_finite();
                            if rb.p[j] != 0.0 {
                                w += rb.p[j] * x;
                                werr += rb.p[j] * x * (rb.rel[j] + (nkf + 1.0) * (U + EXP_REL));
                            }
                        }
                        let want = want_o[idx];
                        let mut bound = GAMMA * (werr + rb.rel_sum * w)
                            + 2.0 * U * f64::from(want).abs()
                            + GAMMA * nkf * ((MIN_NORMAL + flushed_weight()) * vmax + TINY);
                        if self.dot_pv {
                            // The weights rounded to bf16 (2⁻⁸ of Σ p|v|, the other terms on
                            // weights up to 1 + 2⁻⁸ times as large) and results below 2⁻¹²⁶
                            // flushed in P·V.
                            bound = bound * (1.0 + BF16_U) + BF16_U * w + MIN_NORMAL * (nkf + 2.0);
                        }
                        let safe = rb.safe && vsum <= OVERFLOW;
                        let at = || format!("o({b},{h},{i},{d}) of {}", describe());
                        let got = got_o[idx];
                        let pos_inf_nan = POS_INF_ROWS_MAY_BE_NAN && rb.has_pos_inf && got.is_nan();
                        // In a row f32 cannot resolve (`!rb.safe`: e.g. a score that overflows
                        // to +∞ in f32 but not in f64), the kernel's weights are unconstrained,
                        // so a NaN the reference gets from the values (±∞/NaN at a key it
                        // weighs) need not appear in the kernel's row; a NaN logit (the
                        // reference's whole row NaN) must still.
                        let value_nan_unresolved =
                            !rb.safe && want.is_nan() && !rb.p.iter().any(|p| p.is_nan());
                        if !(tiny_weight_nonfinite
                            || pos_inf_nan
                            || value_nan_unresolved
                            || dot_nan)
                        {
                            check_value("attention", &at, got, want, safe, bound)?;
                        }
                    }
                    if let Some((lr, lk)) = lse {
                        let at = || format!("lse({b},{h},{i})");
                        let want = lr[lse_at];
                        let pos_inf_nan =
                            POS_INF_ROWS_MAY_BE_NAN && rb.has_pos_inf && lk[lse_at].is_nan();
                        if !(pos_inf_nan || dot_nan) {
                            check_value(
                                "attention lse",
                                &at,
                                lk[lse_at],
                                want,
                                rb.safe,
                                rb.lse_bound + U * f64::from(want).abs(),
                            )?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// Packed variable-length attention
// ------------------------------------------------------------------------------------------

/// A decoded packed-batch call (`attn_kernels::batch::VarlenAttention` against
/// `attn_reference::batch::attention_varlen`): operands `[1, heads, total, d]` in any of the
/// strided layouts [`decode_tensor`] makes (token-major ones split among threads, head-major
/// ones run item by item), and sequence offsets that are sometimes hostile.
#[derive(Clone, Debug)]
pub struct VarlenCase {
    /// Cumulative query offsets (`cu_seqlens_q`).
    pub cu_q: Vec<usize>,
    /// Cumulative key offsets (`cu_seqlens_k`).
    pub cu_k: Vec<usize>,
    /// The attention operands, settings and output, as one packed problem (batch 1, the
    /// mask over the packed tokens; only none and causal are accepted).
    pub attention: AttentionCase,
}

/// The logsumexp length (none, one short, or right: `hq·total_q`) and the mask of a packed or
/// paged case: mostly none or causal (with every offset [`decode_mask`] picks), a keep or
/// bias mask, which a batch refuses, one case in eight.
fn packed_lse_and_mask(
    bytes: &mut Bytes<'_>,
    hq: usize,
    total_q: usize,
    total_k: usize,
) -> (Option<usize>, MaskSpec) {
    let rows = hq * total_q;
    let lse = match bytes.u8() % 8 {
        0..=3 => None,
        4 if rows > 0 => Some(rows - 1),
        _ => Some(rows),
    };
    let mask = match decode_mask(bytes, [1, hq, total_q, total_k]) {
        m @ (MaskSpec::None | MaskSpec::Causal(_)) => m,
        m if bytes.u8().is_multiple_of(4) => m,
        _ => MaskSpec::Causal(None),
    };
    (lse, mask)
}

impl VarlenCase {
    /// Decodes a case: up to 5 sequences of edge lengths (0 and 1 included, queries longer or
    /// shorter than keys), GQA, `dk ≠ dv`, then offsets damaged one way or another (not from
    /// 0, decreasing, totals or counts that disagree with the views, sums past `usize::MAX`,
    /// empty), then masks, scales, layouts, logsumexps, threads and variants as in
    /// [`AttentionCase::decode`].
    pub fn decode(data: &[u8]) -> Self {
        let mut bytes = Bytes::new(data);
        // Damage is rarer than in `AttentionCase` (zero heads, refused masks, bad offsets and
        // shapes each in a few percent of cases): every case also has a batch to get through.
        let hkv = match bytes.u8() % 16 {
            0 => 0,
            b => 1 + usize::from(b % 2),
        };
        let hq = match bytes.u8() % 16 {
            0 => 0,
            1..=5 => hkv,
            6..=9 => 2 * hkv,
            10 => 3,
            _ => 1,
        };
        let dk = bytes.size(65);
        let dv = if bytes.u8().is_multiple_of(2) { dk } else { bytes.size(65) };
        let count = usize::from(bytes.u8() % 6);
        let mut lens: Vec<(usize, usize)> =
            (0..count).map(|_| (bytes.size(300), bytes.size(300))).collect();
        let work = |l: &[(usize, usize)]| {
            l.iter().map(|&(a, b)| hq * a * b * (dk + dv).max(1)).sum::<usize>()
        };
        while work(&lens) > MAX_WORK {
            for l in &mut lens {
                *l = (l.0 / 2, l.1 / 2);
            }
        }
        let cumulative = |l: &mut dyn Iterator<Item = usize>| {
            let mut cu = vec![0];
            for n in l {
                cu.push(cu[cu.len() - 1] + n);
            }
            cu
        };
        let mut cu_q = cumulative(&mut lens.iter().map(|l| l.0));
        let mut cu_k = cumulative(&mut lens.iter().map(|l| l.1));
        let (total_q, total_k) = (cu_q[count], cu_k[count]);
        match bytes.u8() % 32 {
            0 => cu_q[0] = 1,
            1 if count >= 2 => cu_k.swap(1, 2),
            2 => *cu_k.last_mut().unwrap() += 1,
            3 => {
                cu_k.pop();
            }
            4 => cu_q.push(usize::MAX),
            5 => cu_q.clear(),
            6 => cu_k = vec![0, usize::MAX, total_k],
            _ => {}
        }
        let scale = bytes.scale(dk);
        let par = bytes.par();
        let mut kd = [1, hkv, total_k, dk];
        let mut od = [1, hq, total_q, dv];
        match bytes.u8() % 16 {
            1 => kd[3] += 1,
            2 => od[2] += 1,
            3 => kd[0] = 2,
            _ => {}
        }
        let (lse, mask) = packed_lse_and_mask(&mut bytes, hq, total_q, total_k);
        let q = decode_tensor(&mut bytes, [1, hq, total_q, dk]);
        let k = decode_tensor(&mut bytes, kd);
        let v = decode_tensor(&mut bytes, [1, hkv, total_k, dv]);
        let o = decode_tensor(&mut bytes, od);
        let variants = VariantSpec::decode(&mut bytes, hq);
        let attention = AttentionCase { q, k, v, scale, mask, o, lse, par, variants };
        VarlenCase { cu_q, cu_k, attention }
    }

    /// Runs the reference and `kernel` (given the kernels' [`VarlenAttention`] problem with the
    /// case's settings, to run on the output after setting any path or ISA) and compares them
    /// as [`AttentionCase::check`] does: the same outcome, nothing written on error or outside
    /// the output view, and each sequence's rows (cut out of the packed views, with its own
    /// causal offset) within the attention bound, its logsumexps at `[h, total_q]`.
    ///
    /// [`VarlenAttention`]: attn_kernels::batch::VarlenAttention
    pub fn check(
        &self,
        kernel: impl FnOnce(
            attn_kernels::batch::VarlenAttention<'_>,
            TensorMut<'_>,
        ) -> attn_reference::Result<()>,
    ) -> Result<(), String> {
        use attn_reference::batch::{packed_seq, SeqOffsets};
        let a = &self.attention;
        let mask = a.mask.mask();
        let q = TensorRef::new(&a.q.data, a.q.layout);
        let k = TensorRef::new(&a.k.data, a.k.layout);
        let v = TensorRef::new(&a.v.data, a.v.layout);
        let var = a.variants.variants();
        let (cu_q, cu_k) = (&self.cu_q[..], &self.cu_k[..]);
        let runs = run_pair(
            ("varlen", "o"),
            &a.o,
            a.lse,
            |o, l| {
                attn_reference::batch::attention_varlen(
                    q, k, v, cu_q, cu_k, a.scale, &mask, &var, o, l,
                )
            },
            |o, l| {
                let mut p = attn_kernels::batch::VarlenAttention::new(q, k, v, cu_q, cu_k)
                    .scale(a.scale)
                    .mask(mask)
                    .variants(var)
                    .parallelism(a.par);
                if let Some(l) = l {
                    p = p.lse(l);
                }
                kernel(p, o)
            },
        )?;
        let Some(Runs { out_ref, lse_ref, out, lse }) = runs else {
            return Ok(());
        };
        // Both succeeded, so the offsets are good and agree with the views.
        let (sq, sk) = (
            SeqOffsets::new("cu_seqlens_q", cu_q).map_err(|e| e.to_string())?,
            SeqOffsets::new("cu_seqlens_k", cu_k).map_err(|e| e.to_string())?,
        );
        let total_q = sq.total();
        let lse = lse_ref.as_deref().zip(lse.as_ref().map(|g| g.slice()));
        for s in 0..sq.count() {
            let (rq, rk) = (sq.range(s), sk.range(s));
            let start = rq.start;
            let lse_at = move |_: usize, h: usize, i: usize| h * total_q + start + i;
            let rows = Rows {
                q: TensorRef::new(q.data, packed_seq(&q.layout, rq.clone())),
                k: TensorRef::new(k.data, packed_seq(&k.layout, rk.clone())),
                v: TensorRef::new(v.data, packed_seq(&v.layout, rk)),
                scale: a.scale,
                mask: &mask,
                variants: &var,
                o: packed_seq(&a.o.layout, rq),
                lse_at: &lse_at,
                dot: false,
                dot_pv: false,
            };
            let describe = || format!("sequence {s} of cu_q {cu_q:?} cu_k {cu_k:?}");
            rows.check(&out_ref, out.slice(), lse, &describe)?;
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// Element types
// ------------------------------------------------------------------------------------------

/// An [`AttentionCase`] whose operands the kernel reads in other element types: Q in f32,
/// bf16 or f16; K and V each in f32, bf16, f16 or int8 (Q8, one scale per block of 32 along
/// `d`). Each operand's f32 data (padding included) is replaced by the values its stored
/// elements represent, exactly: the widened half value, or `q·s` with `s` a power of two (or
/// a hostile 0, ∞ or NaN, the same for every block so that overlapping views agree), which
/// f32 holds exactly. The reference reads those f32 values, so the f32 bounds of
/// [`AttentionCase::check`] apply unchanged; the output is f32.
#[derive(Clone, Debug)]
pub struct DtypeAttentionCase {
    /// The case, its data replaced by the exact values the typed operands hold.
    pub attention: AttentionCase,
    /// The storage of Q, K and V.
    pub types: [DType; 3],
    /// Q, K and V as stored.
    stored: [Stored; 3],
    /// Made by [`decode_dot`](Self::decode_dot): checked with the bound of the flash path on
    /// `vdpbf16ps`.
    pub dot: bool,
}

/// One operand's storage: a slice as long as the case's f32 one.
#[derive(Clone, Debug)]
enum Stored {
    F32,
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    /// The int8 values and contiguous `[b, h, s, ⌈d/32⌉]` scales (all equal).
    Q8(Vec<i8>, Vec<f32>),
}

/// Q8 scales the decoder picks: powers of two (exact products), and 0, ∞, NaN.
const Q8_SCALES: [f32; 8] =
    [0.0078125, 1.0, 0.25, 1024.0, 2.3283064e-10, 0.0, f32::INFINITY, f32::NAN];

impl Stored {
    /// Stores `op` as `ty`, replacing its data with the values the storage represents.
    fn new(op: &mut TensorOperand, ty: DType, q8_scale: f32) -> Stored {
        match ty {
            DType::BF16 => {
                let x: Vec<bf16> = op.data.iter().map(|&v| bf16::from_f32(v)).collect();
                op.data = x.iter().map(|v| v.to_f32()).collect();
                Stored::BF16(x)
            }
            DType::F16 => {
                let x: Vec<f16> = op.data.iter().map(|&v| f16::from_f32(v)).collect();
                op.data = x.iter().map(|v| v.to_f32()).collect();
                Stored::F16(x)
            }
            DType::Q8 => {
                let q: Vec<i8> = op
                    .data
                    .iter()
                    .map(|&v| {
                        let r = v / q8_scale;
                        if r.is_finite() {
                            r.round_ties_even().clamp(-127.0, 127.0) as i8
                        } else {
                            0
                        }
                    })
                    .collect();
                op.data = q.iter().map(|&x| f32::from(x) * q8_scale).collect();
                let [b, h, s, d] = op.layout.dims;
                let n = b.saturating_mul(h).saturating_mul(s).saturating_mul(d.div_ceil(32));
                Stored::Q8(q, vec![q8_scale; n.min(MAX_SLICE)])
            }
            DType::F32 => Stored::F32,
        }
    }

    /// The view of `op` (whose data this storage holds) for the kernel.
    fn any<'a>(&'a self, op: &'a TensorOperand) -> AnyRef<'a> {
        match self {
            Stored::BF16(x) => TensorRef::new(&x[..], op.layout).into(),
            Stored::F16(x) => TensorRef::new(&x[..], op.layout).into(),
            _ => TensorRef::new(&op.data[..], op.layout).into(),
        }
    }

    /// The K or V view of `op` for the kernel.
    fn kv<'a>(&'a self, op: &'a TensorOperand) -> KvRef<'a> {
        match self {
            Stored::Q8(q, s) => {
                let [b, h, n, d] = op.layout.dims;
                let sl = Tensor4Layout::bhsd(b, h, n, d.div_ceil(32));
                Q8Ref::new(TensorRef::new(&q[..], op.layout), TensorRef::new(&s[..], sl)).into()
            }
            Stored::BF16(x) => TensorRef::new(&x[..], op.layout).into(),
            Stored::F16(x) => TensorRef::new(&x[..], op.layout).into(),
            Stored::F32 => TensorRef::new(&op.data[..], op.layout).into(),
        }
    }
}

impl DtypeAttentionCase {
    /// Decodes the types (one byte: Q's, K's and V's), a Q8 scale (one byte), then an
    /// [`AttentionCase`] from the rest of the bytes.
    pub fn decode(data: &[u8]) -> Self {
        Self::decode_with(data, false)
    }

    /// [`decode`](Self::decode) with Q, K and V all bf16 (the type byte is read and ignored),
    /// for the flash path on `vdpbf16ps` (`HalfPath::Dot`): [`check`](Self::check) then holds
    /// the kernel to that path's bound.
    pub fn decode_dot(data: &[u8]) -> Self {
        Self::decode_with(data, true)
    }

    fn decode_with(data: &[u8], dot: bool) -> Self {
        let mut bytes = Bytes::new(data);
        let t = bytes.u8();
        let q8_scale = Q8_SCALES[usize::from(bytes.u8()) % Q8_SCALES.len()];
        let half = [DType::F32, DType::BF16, DType::F16];
        let kv = [DType::F32, DType::BF16, DType::F16, DType::Q8];
        let types = if dot {
            [DType::BF16; 3]
        } else {
            [half[usize::from(t) % 3], kv[usize::from(t / 3) % 4], kv[usize::from(t / 12) % 4]]
        };
        let mut attention = AttentionCase::decode(data.get(2..).unwrap_or(&[]));
        let stored = [
            Stored::new(&mut attention.q, types[0], q8_scale),
            Stored::new(&mut attention.k, types[1], q8_scale),
            Stored::new(&mut attention.v, types[2], q8_scale),
        ];
        DtypeAttentionCase { attention, types, stored, dot }
    }

    /// [`AttentionCase::check`] with the kernel reading the typed operands.
    pub fn check(
        &self,
        kernel: impl FnOnce(Attention<'_>, TensorMut<'_>) -> attn_reference::Result<()>,
    ) -> Result<(), String> {
        self.check_dot_pv(self.dot, kernel)
    }

    /// [`check`](Self::check) for a case made by [`decode_dot`](Self::decode_dot) and run on
    /// the decode path on `vdpbf16ps`, which runs only the scores on it: held to the bound
    /// with the scores' flushing and `P·V` in f32.
    pub fn check_scores_dot(
        &self,
        kernel: impl FnOnce(Attention<'_>, TensorMut<'_>) -> attn_reference::Result<()>,
    ) -> Result<(), String> {
        self.check_dot_pv(false, kernel)
    }

    /// The check, with `P·V` on `vdpbf16ps` in the bound when `dot_pv` (the scores when the
    /// case was made by [`decode_dot`](Self::decode_dot)).
    fn check_dot_pv(
        &self,
        dot_pv: bool,
        kernel: impl FnOnce(Attention<'_>, TensorMut<'_>) -> attn_reference::Result<()>,
    ) -> Result<(), String> {
        let a = &self.attention;
        let [q, k, v] = &self.stored;
        let r = a.check_views(q.any(&a.q), k.kv(&a.k), v.kv(&a.v), (self.dot, dot_pv), kernel);
        r.map_err(|e| format!("{e} (Q, K, V stored as {:?}, P·V dot {dot_pv})", self.types))
    }
}

// ------------------------------------------------------------------------------------------
// Paged K/V caches
// ------------------------------------------------------------------------------------------

/// A pool of a decoded paged cache as the kernel reads it; its f32 twin (the case's) holds
/// the values the stored elements represent, exactly (as in [`DtypeAttentionCase`]).
#[derive(Clone, Debug)]
enum PoolStore {
    F32,
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    /// int8 values and their scales (all equal: a power of two, or 0, ∞, NaN).
    Q8(Vec<i8>, Vec<f32>),
}

impl PoolStore {
    /// Stores `data` (slots of `d` values) as `ty`, replacing it by the values represented.
    fn new(data: &mut Vec<f32>, ty: DType, q8_scale: f32, d: usize) -> PoolStore {
        let mut op =
            TensorOperand { data: std::mem::take(data), layout: Tensor4Layout::bhsd(1, 1, 1, 0) };
        let stored = Stored::new(&mut op, ty, q8_scale);
        *data = op.data;
        match stored {
            Stored::F32 => PoolStore::F32,
            Stored::BF16(x) => PoolStore::BF16(x),
            Stored::F16(x) => PoolStore::F16(x),
            Stored::Q8(q, _) => {
                let slots = q.len().checked_div(d).unwrap_or(0);
                PoolStore::Q8(q, vec![q8_scale; slots * d.div_ceil(32)])
            }
        }
    }

    /// The pool for the kernel (`data`: the f32 twin).
    fn pool<'a>(&'a self, data: &'a [f32]) -> PagePool<'a> {
        match self {
            PoolStore::F32 => PagePool::F32(data),
            PoolStore::BF16(x) => PagePool::BF16(x),
            PoolStore::F16(x) => PagePool::F16(x),
            PoolStore::Q8(values, scales) => PagePool::Q8 { values, scales },
        }
    }
}

/// A decoded paged-attention call (`attn_kernels::batch::PagedAttention` against
/// `attn_reference::batch::attention_paged`): packed queries (decode steps of one query, or
/// chunks of prefill) against a cache of pages in a shared pool, each pool f32, bf16, f16 or
/// int8; block tables that shuffle and share pages, and now and then point past the pool;
/// page sizes, lengths and offsets at their edges.
#[derive(Clone, Debug)]
pub struct PagedCase {
    /// Cumulative query offsets.
    pub cu_q: Vec<usize>,
    /// Keys held by each sequence.
    pub seq_lens: Vec<usize>,
    /// `[batch, max_pages]` page indices.
    pub block_table: Vec<u32>,
    /// Entries per row of the block table.
    pub max_pages: usize,
    /// Token slots per page.
    pub page_size: usize,
    /// K/V heads per slot.
    pub kv_heads: usize,
    /// Widths of keys and values.
    pub dk: usize,
    /// Value width.
    pub dv: usize,
    /// The key and value pools as f32 (the values the stored elements represent).
    pub pools: [Vec<f32>; 2],
    /// Storage types of the key and value pools.
    pub types: [DType; 2],
    stores: [PoolStore; 2],
    /// Queries, output, scale, mask, logsumexp, threads and variants, as one packed problem
    /// (its `k` and `v` are unused, empty).
    pub attention: AttentionCase,
    /// The queries as stored: bf16 for a case made by [`decode_dot`](Self::decode_dot), f32
    /// otherwise.
    q_store: Stored,
    /// Made by [`decode_dot`](Self::decode_dot): bf16 queries and pools, checked with the
    /// bounds of `HalfPath::Dot` (decode pieces: the scores on `vdpbf16ps`; prefill pieces of
    /// more than [`PAGED_Q_PIECE`](attn_kernels::batch::PAGED_Q_PIECE) queries: both flash
    /// products).
    pub dot: bool,
}

impl PagedCase {
    /// Decodes a case: up to 4 sequences of edge lengths (0 included) over pages of 16 to 256
    /// slots (an invalid page size now and then), 1 query each or a prefill chunk, pages
    /// shuffled, some shared between sequences, an index past the pool or a block table or
    /// pool of the wrong length once in a while; then storage types, and queries, masks,
    /// scales, layouts, logsumexps, threads and variants as [`VarlenCase::decode`] makes them.
    pub fn decode(data: &[u8]) -> Self {
        Self::decode_with(data, false)
    }

    /// [`decode`](Self::decode) with bf16 queries and pools (the storage byte is read and
    /// ignored), for `HalfPath::Dot`: [`check`](Self::check) then holds each sequence to the
    /// bound of the path its piece runs.
    pub fn decode_dot(data: &[u8]) -> Self {
        Self::decode_with(data, true)
    }

    fn decode_with(data: &[u8], dot: bool) -> Self {
        let mut bytes = Bytes::new(data);
        let kv_heads = match bytes.u8() % 16 {
            0 => 0,
            b => 1 + usize::from(b % 2),
        };
        let hq = match bytes.u8() % 8 {
            0 => 3,
            1..=3 => kv_heads,
            _ => 2 * kv_heads,
        };
        let dk = match bytes.size(65) {
            0 if !bytes.u8().is_multiple_of(4) => 1,
            d => d,
        };
        let dv = if bytes.u8().is_multiple_of(2) { dk } else { bytes.size(65) };
        let page_size = match bytes.u8() % 32 {
            0 => 8,
            1 => 24,
            2 => 512,
            b => 16 << (b % 5),
        };
        let count = usize::from(bytes.u8() % 5);
        let prefill = bytes.u8().is_multiple_of(4);
        let mut lens: Vec<(usize, usize)> = (0..count)
            .map(|_| {
                let nk = bytes.size(300);
                let nq = if prefill { bytes.size(40) } else { 1 };
                (nq, nk)
            })
            .collect();
        let work = |l: &[(usize, usize)]| {
            l.iter().map(|&(a, b)| hq.max(1) * a * b * (dk + dv).max(1)).sum::<usize>()
        };
        while work(&lens) > MAX_WORK {
            for l in &mut lens {
                l.1 /= 2;
            }
        }
        let seq_lens: Vec<usize> = lens.iter().map(|l| l.1).collect();
        let mut cu_q = vec![0];
        for l in &lens {
            cu_q.push(cu_q[cu_q.len() - 1] + l.0);
        }
        let total_q = cu_q[count];
        // Pages: each sequence's own, then a few spare; a sequence may start with its
        // predecessor's first page (a shared prefix: read-only sharing is allowed).
        let ps = page_size.max(1);
        let need: Vec<usize> = seq_lens.iter().map(|n| n.div_ceil(ps)).collect();
        let mut max_pages = need.iter().copied().max().unwrap_or(0) + usize::from(bytes.u8() % 3);
        let mut num_pages = need.iter().sum::<usize>() + usize::from(bytes.u8() % 4);
        let mut order: Vec<u32> = (0..num_pages as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, usize::from(bytes.byte_or_rng()) % (i + 1));
        }
        let mut block_table = vec![0u32; count * max_pages];
        let mut next = 0;
        for (b, &n) in need.iter().enumerate() {
            for p in 0..n {
                block_table[b * max_pages + p] = order[next];
                next += 1;
            }
            if b > 0 && n > 0 && need[b - 1] > 0 && bytes.u8().is_multiple_of(4) {
                block_table[b * max_pages] = block_table[(b - 1) * max_pages];
            }
        }
        match bytes.u8() % 32 {
            0 if !block_table.is_empty() => {
                let i = usize::from(bytes.u8()) % block_table.len();
                block_table[i] = num_pages as u32;
            }
            1 if max_pages > 0 => max_pages -= 1,
            2 => num_pages += 1,
            3 => {
                block_table.pop();
            }
            _ => {}
        }
        let t = bytes.u8();
        let q8_scale = Q8_SCALES[usize::from(bytes.u8()) % Q8_SCALES.len()];
        let kv = [DType::F32, DType::BF16, DType::F16, DType::Q8];
        let types = if dot {
            [DType::BF16; 2]
        } else {
            [kv[usize::from(t) % 4], kv[usize::from(t / 4) % 4]]
        };
        let slots = num_pages.saturating_mul(page_size).saturating_mul(kv_heads);
        let mut pools = [
            bytes.values(slots.saturating_mul(dk).min(MAX_SLICE)),
            bytes.values(slots.saturating_mul(dv).min(MAX_SLICE)),
        ];
        let stores = [
            PoolStore::new(&mut pools[0], types[0], q8_scale, dk),
            PoolStore::new(&mut pools[1], types[1], q8_scale, dv),
        ];
        let scale = bytes.scale(dk);
        let par = bytes.par();
        let (lse, mask) = packed_lse_and_mask(&mut bytes, hq, total_q, 0);
        let mut q = decode_tensor(&mut bytes, [1, hq, total_q, dk]);
        let q_store = Stored::new(&mut q, if dot { DType::BF16 } else { DType::F32 }, 1.0);
        let o = decode_tensor(&mut bytes, [1, hq, total_q, dv]);
        let variants = VariantSpec::decode(&mut bytes, hq);
        let none =
            |d| TensorOperand { data: Vec::new(), layout: Tensor4Layout::bhsd(1, kv_heads, 0, d) };
        let attention =
            AttentionCase { q, k: none(dk), v: none(dv), scale, mask, o, lse, par, variants };
        PagedCase {
            cu_q,
            seq_lens,
            block_table,
            max_pages,
            page_size,
            kv_heads,
            dk,
            dv,
            pools,
            types,
            stores,
            attention,
            q_store,
            dot,
        }
    }

    /// The cache over `k` and `v` pools.
    fn cache<'a>(&'a self, k: PagePool<'a>, v: PagePool<'a>) -> PagedKv<'a> {
        PagedKv {
            k,
            v,
            page_size: self.page_size,
            kv_heads: self.kv_heads,
            dk: self.dk,
            dv: self.dv,
            block_table: &self.block_table,
            max_pages: self.max_pages,
            seq_lens: &self.seq_lens,
        }
    }

    /// Runs the reference (on the f32 pools) and `kernel` (given the kernels'
    /// [`PagedAttention`] over the typed pools with the case's settings) and compares them as
    /// [`VarlenCase::check`] does, each sequence against its K/V gathered from the pages.
    ///
    /// [`PagedAttention`]: attn_kernels::batch::PagedAttention
    pub fn check(
        &self,
        kernel: impl FnOnce(
            attn_kernels::batch::PagedAttention<'_>,
            TensorMut<'_>,
        ) -> attn_reference::Result<()>,
    ) -> Result<(), String> {
        use attn_reference::batch::{packed_seq, SeqOffsets};
        let a = &self.attention;
        let mask = a.mask.mask();
        let q = TensorRef::new(&a.q.data, a.q.layout);
        let var = a.variants.variants();
        let cu_q = &self.cu_q[..];
        let exact = self.cache(PagePool::F32(&self.pools[0]), PagePool::F32(&self.pools[1]));
        let typed =
            self.cache(self.stores[0].pool(&self.pools[0]), self.stores[1].pool(&self.pools[1]));
        let runs = run_pair(
            ("paged", "o"),
            &a.o,
            a.lse,
            |o, l| {
                attn_reference::batch::attention_paged(q, cu_q, &exact, a.scale, &mask, &var, o, l)
            },
            |o, l| {
                let qv = self.q_store.any(&a.q);
                let mut p = attn_kernels::batch::PagedAttention::new(qv, cu_q, typed)
                    .scale(a.scale)
                    .mask(mask)
                    .variants(var)
                    .parallelism(a.par);
                if let Some(l) = l {
                    p = p.lse(l);
                }
                kernel(p, o)
            },
        )
        .map_err(|e| format!("{e} (pools {:?}, dot {})", self.types, self.dot))?;
        let Some(Runs { out_ref, lse_ref, out, lse }) = runs else {
            return Ok(());
        };
        let sq = SeqOffsets::new("cu_seqlens_q", cu_q).map_err(|e| e.to_string())?;
        let total_q = sq.total();
        let lse = lse_ref.as_deref().zip(lse.as_ref().map(|g| g.slice()));
        let hkv = self.kv_heads;
        for (s, &len) in self.seq_lens.iter().enumerate() {
            let gather = |pool: &[f32], d: usize| {
                let mut dense = vec![0.0f32; hkv * len * d];
                for h in 0..hkv {
                    for j in 0..len {
                        let at = exact.slot(s, j, h, d);
                        dense[(h * len + j) * d..][..d].copy_from_slice(&pool[at..at + d]);
                    }
                }
                dense
            };
            let (kd, vd) = (gather(&self.pools[0], self.dk), gather(&self.pools[1], self.dv));
            let rq = sq.range(s);
            let start = rq.start;
            let lse_at = move |_: usize, h: usize, i: usize| h * total_q + start + i;
            let rows = Rows {
                q: TensorRef::new(q.data, packed_seq(&q.layout, rq.clone())),
                k: TensorRef::new(&kd, Tensor4Layout::bhsd(1, hkv, len, self.dk)),
                v: TensorRef::new(&vd, Tensor4Layout::bhsd(1, hkv, len, self.dv)),
                scale: a.scale,
                mask: &mask,
                variants: &var,
                dot_pv: self.dot && rq.len() > attn_kernels::batch::PAGED_Q_PIECE,
                o: packed_seq(&a.o.layout, rq),
                lse_at: &lse_at,
                dot: self.dot,
            };
            let describe = || {
                format!(
                    "sequence {s} of lengths {:?}, pages of {} ({:?} pools, dot {})",
                    self.seq_lens, self.page_size, self.types, self.dot
                )
            };
            rows.check(&out_ref, out.slice(), lse, &describe)?;
        }
        Ok(())
    }
}
