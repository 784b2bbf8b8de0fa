//! The argument checks every attention entry point shares, so that the reference and each
//! kernel reject the same inputs with the same errors, the default score scale, and the
//! element-typed operand views of an attention call ([`AnyRef`], [`KvRef`], [`AnyMut`]).
//!
//! # Element types of an attention call
//!
//! Q and the output are f32, bf16 or f16; K and V are f32, bf16, f16 or int8-quantised
//! ([`Q8Ref`], see [`crate::quant`]), each chosen independently. The semantics are the f32
//! call's on the exact values the operands represent: half-precision inputs are widened
//! exactly, a quantised element means `q · scale` (its block's scale); scores, the softmax and
//! the weighted sums are accumulated in f32; the output is the f32 result rounded once to the
//! output type (to nearest, ties to even), so an f16 output overflows to `±∞` from 65520 on
//! (a value the f32 result holds but f16 cannot), and a bf16 output near `f32::MAX` may round
//! to `±∞` likewise. The logsumexp output stays f32.

use crate::dtype::{bf16, f16, DType};
use crate::error::{expect_dim, expect_finite, Error, Result};
use crate::mask::Mask;
use crate::quant::Q8Ref;
use crate::shape::{Tensor4Layout, TensorMut, TensorRef};

/// The default score scale `1/√d_k` (1 for `d_k = 0`).
pub fn default_scale(dk: usize) -> f32 {
    if dk == 0 {
        1.0
    } else {
        (1.0 / (dk as f64).sqrt()) as f32
    }
}

/// A read-only `[batch, heads, seq, dim]` operand of any floating element type: the Q operand
/// of an attention call. Made from a [`TensorRef`] of `f32`, [`bf16`] or [`f16`](struct@f16) by
/// `From`/`Into`.
#[derive(Clone, Copy, Debug)]
pub enum AnyRef<'a> {
    /// f32 elements.
    F32(TensorRef<'a, f32>),
    /// bf16 elements.
    BF16(TensorRef<'a, bf16>),
    /// f16 elements.
    F16(TensorRef<'a, f16>),
}

/// A read-only K or V operand: any floating element type, or int8-quantised ([`Q8Ref`]). Made
/// from a [`TensorRef`] of `f32`, [`bf16`], [`f16`](struct@f16) or from a [`Q8Ref`] by
/// `From`/`Into`.
#[derive(Clone, Copy, Debug)]
pub enum KvRef<'a> {
    /// f32 elements.
    F32(TensorRef<'a, f32>),
    /// bf16 elements.
    BF16(TensorRef<'a, bf16>),
    /// f16 elements.
    F16(TensorRef<'a, f16>),
    /// int8 values with one f32 scale per block of 32 along `d`.
    Q8(Q8Ref<'a>),
}

/// A writable `[batch, heads, seq, dim]` output of any floating element type. Made from a
/// [`TensorMut`] of `f32`, [`bf16`] or [`f16`](struct@f16) by `From`/`Into`.
#[derive(Debug)]
pub enum AnyMut<'a> {
    /// f32 elements.
    F32(TensorMut<'a, f32>),
    /// bf16 elements (each value rounded to nearest even).
    BF16(TensorMut<'a, bf16>),
    /// f16 elements (rounded to nearest even; `±∞` from 65520 on).
    F16(TensorMut<'a, f16>),
}

macro_rules! view_from {
    ($enum:ident, $view:ident, $($t:ty => $v:ident),*) => {$(
        impl<'a> From<$view<'a, $t>> for $enum<'a> {
            fn from(x: $view<'a, $t>) -> Self {
                $enum::$v(x)
            }
        }
    )*};
}
view_from!(AnyRef, TensorRef, f32 => F32, bf16 => BF16, f16 => F16);
view_from!(KvRef, TensorRef, f32 => F32, bf16 => BF16, f16 => F16);
view_from!(AnyMut, TensorMut, f32 => F32, bf16 => BF16, f16 => F16);

impl<'a> From<Q8Ref<'a>> for KvRef<'a> {
    fn from(x: Q8Ref<'a>) -> Self {
        KvRef::Q8(x)
    }
}

impl<'a> From<AnyRef<'a>> for KvRef<'a> {
    fn from(x: AnyRef<'a>) -> Self {
        match x {
            AnyRef::F32(t) => KvRef::F32(t),
            AnyRef::BF16(t) => KvRef::BF16(t),
            AnyRef::F16(t) => KvRef::F16(t),
        }
    }
}

impl<'a> AnyRef<'a> {
    /// The same elements under another layout (a sub-view: checked later, by its user).
    pub fn with_layout(self, layout: Tensor4Layout) -> AnyRef<'a> {
        match self {
            AnyRef::F32(t) => AnyRef::F32(TensorRef::new(t.data, layout)),
            AnyRef::BF16(t) => AnyRef::BF16(TensorRef::new(t.data, layout)),
            AnyRef::F16(t) => AnyRef::F16(TensorRef::new(t.data, layout)),
        }
    }
    /// The view's layout.
    pub const fn layout(&self) -> &Tensor4Layout {
        match self {
            AnyRef::F32(t) => &t.layout,
            AnyRef::BF16(t) => &t.layout,
            AnyRef::F16(t) => &t.layout,
        }
    }
    /// The element type.
    pub const fn dtype(&self) -> DType {
        match self {
            AnyRef::F32(_) => DType::F32,
            AnyRef::BF16(_) => DType::BF16,
            AnyRef::F16(_) => DType::F16,
        }
    }
    /// Checks the view against its slice, naming `arg`.
    pub fn check(&self, arg: &'static str) -> Result<()> {
        match self {
            AnyRef::F32(t) => t.check(arg),
            AnyRef::BF16(t) => t.check(arg),
            AnyRef::F16(t) => t.check(arg),
        }
    }
    /// Element `(b, h, s, d)` as the exact f64 value; call only after [`check`](Self::check).
    pub fn at_f64(&self, b: usize, h: usize, s: usize, d: usize) -> f64 {
        match self {
            AnyRef::F32(t) => f64::from(t.at(b, h, s, d)),
            AnyRef::BF16(t) => f64::from(t.at(b, h, s, d).to_f32()),
            AnyRef::F16(t) => f64::from(t.at(b, h, s, d).to_f32()),
        }
    }
}

impl KvRef<'_> {
    /// The layout of the values (for [`KvRef::Q8`], of the int8 values, not the scales).
    pub const fn layout(&self) -> &Tensor4Layout {
        match self {
            KvRef::F32(t) => &t.layout,
            KvRef::BF16(t) => &t.layout,
            KvRef::F16(t) => &t.layout,
            KvRef::Q8(t) => &t.values.layout,
        }
    }
    /// The element type.
    pub const fn dtype(&self) -> DType {
        match self {
            KvRef::F32(_) => DType::F32,
            KvRef::BF16(_) => DType::BF16,
            KvRef::F16(_) => DType::F16,
            KvRef::Q8(_) => DType::Q8,
        }
    }
    /// Checks the view against its slice naming `arg`; for [`KvRef::Q8`] also the scales
    /// (dims `[b, h, s, ⌈d/32⌉]` and bounds), naming `scales_arg`.
    pub fn check(&self, arg: &'static str, scales_arg: &'static str) -> Result<()> {
        match self {
            KvRef::F32(t) => t.check(arg),
            KvRef::BF16(t) => t.check(arg),
            KvRef::F16(t) => t.check(arg),
            KvRef::Q8(t) => t.check(arg, scales_arg),
        }
    }
    /// Element `(b, h, s, d)` as the exact f64 value it represents (dequantised for
    /// [`KvRef::Q8`]); call only after [`check`](Self::check).
    pub fn at_f64(&self, b: usize, h: usize, s: usize, d: usize) -> f64 {
        match self {
            KvRef::F32(t) => f64::from(t.at(b, h, s, d)),
            KvRef::BF16(t) => f64::from(t.at(b, h, s, d).to_f32()),
            KvRef::F16(t) => f64::from(t.at(b, h, s, d).to_f32()),
            KvRef::Q8(t) => t.at_f64(b, h, s, d),
        }
    }
}

impl AnyMut<'_> {
    /// The view's layout.
    pub const fn layout(&self) -> &Tensor4Layout {
        match self {
            AnyMut::F32(t) => &t.layout,
            AnyMut::BF16(t) => &t.layout,
            AnyMut::F16(t) => &t.layout,
        }
    }
    /// The element type.
    pub const fn dtype(&self) -> DType {
        match self {
            AnyMut::F32(_) => DType::F32,
            AnyMut::BF16(_) => DType::BF16,
            AnyMut::F16(_) => DType::F16,
        }
    }
    /// Checks the view against its slice and that no two positions share an element.
    pub fn check(&self, arg: &'static str) -> Result<()> {
        match self {
            AnyMut::F32(t) => t.check(arg),
            AnyMut::BF16(t) => t.check(arg),
            AnyMut::F16(t) => t.check(arg),
        }
    }
    /// The same elements, reborrowed, under another layout (a sub-view: checked later, by its
    /// user).
    pub fn with_layout(&mut self, layout: Tensor4Layout) -> AnyMut<'_> {
        match self {
            AnyMut::F32(t) => AnyMut::F32(TensorMut::new(t.data, layout)),
            AnyMut::BF16(t) => AnyMut::BF16(TensorMut::new(t.data, layout)),
            AnyMut::F16(t) => AnyMut::F16(TensorMut::new(t.data, layout)),
        }
    }
    /// Reborrows, so the output can be passed on and used again.
    pub fn rb(&mut self) -> AnyMut<'_> {
        match self {
            AnyMut::F32(t) => AnyMut::F32(t.rb()),
            AnyMut::BF16(t) => AnyMut::BF16(t.rb()),
            AnyMut::F16(t) => AnyMut::F16(t.rb()),
        }
    }
}

/// Checks the operands of an attention call and returns `(batch, q_heads, kv_heads, nq, nk, dk,
/// dv)`. Shared by every attention entry point so they all reject the same inputs.
///
/// `q: [batch, hq, nq, dk]`, `k: [batch, hkv, nk, dk]`, `v: [batch, hkv, nk, dv]`,
/// `o: [batch, hq, nq, dv]`, mask over `[batch, hq, nq, nk]`, `lse` of `batch·hq·nq` elements.
pub fn check_attention(
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    v: &TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: &TensorMut<'_>,
    lse: Option<&[f32]>,
) -> Result<[usize; 7]> {
    let layouts = [&q.layout, &k.layout, &v.layout, &o.layout];
    check_views(layouts, scale, mask, lse, || {
        q.check("q")?;
        k.check("k")?;
        v.check("v")?;
        o.check("o")
    })
}

/// [`check_attention`] for operands of any element type: the same checks in the same order;
/// a quantised K or V also has its scales checked (dims `[b, h, s, ⌈d/32⌉]`, then bounds),
/// named `k_scales` / `v_scales`, right after its values.
pub fn check_attention_any(
    q: &AnyRef<'_>,
    k: &KvRef<'_>,
    v: &KvRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: &AnyMut<'_>,
    lse: Option<&[f32]>,
) -> Result<[usize; 7]> {
    let layouts = [q.layout(), k.layout(), v.layout(), o.layout()];
    check_views(layouts, scale, mask, lse, || {
        q.check("q")?;
        k.check("k", "k_scales")?;
        v.check("v", "v_scales")?;
        o.check("o")
    })
}

/// The body of both checks: scale, heads, dims, then `views` (each operand against its
/// slice), the mask and the `lse` length.
fn check_views(
    [q, k, v, o]: [&Tensor4Layout; 4],
    scale: f32,
    mask: &Mask<'_>,
    lse: Option<&[f32]>,
    views: impl FnOnce() -> Result<()>,
) -> Result<[usize; 7]> {
    expect_finite("scale", scale)?;
    let [batch, hq, nq, dk] = q.dims;
    let [_, hkv, nk, _] = k.dims;
    let dv = v.dims[3];
    check_heads(hq, hkv)?;
    k.expect_dims("k", [batch, hkv, nk, dk])?;
    v.expect_dims("v", [batch, hkv, nk, dv])?;
    o.expect_dims("o", [batch, hq, nq, dv])?;
    views()?;
    mask.check(batch, hq, nq, nk)?;
    if let Some(l) = lse {
        // Saturating: a product past usize::MAX can match no slice length.
        expect_dim("lse", "len", batch.saturating_mul(hq).saturating_mul(nq), l.len())?;
    }
    Ok([batch, hq, hkv, nq, nk, dk, dv])
}

/// The head counts of an attention call: `ZeroHeads` for no query (`q`) or K/V (`k`) head,
/// `KvHeadsNotDividing` when the K/V heads do not divide the query heads (GQA/MQA groups).
pub fn check_heads(hq: usize, hkv: usize) -> Result<()> {
    if hq == 0 {
        return Err(Error::ZeroHeads { arg: "q" });
    }
    if hkv == 0 {
        return Err(Error::ZeroHeads { arg: "k" });
    }
    if !hq.is_multiple_of(hkv) {
        return Err(Error::KvHeadsNotDividing { q_heads: hq, kv_heads: hkv });
    }
    Ok(())
}
