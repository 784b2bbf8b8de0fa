//! Shape descriptors: a strided 2-D view ([`MatLayout`]) and a strided 4-D view
//! ([`Tensor4Layout`]) of a flat slice. They carry no data; a call pairs one with a slice and
//! checks it with [`MatLayout::check`] / [`Tensor4Layout::check`] before any element is touched.
//!
//! Element `(i, j)` of a matrix view lives at `offset + i·row_stride + j·col_stride`, so a
//! row-major, a column-major and a transposed operand are the same descriptor with other
//! strides, and no copy is ever needed.
//!
//! The operand types ([`MatRef`], [`MatMut`], [`TensorRef`], [`TensorMut`]) pair a view with a
//! slice of `T`, `f32` unless said: `MatRef<'_, bf16>` is a bf16 matrix. Methods that only move
//! elements are generic; [`Element`] types also get `dtype` and `at_f32`.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// A strided 2-D view: `rows × cols`, element `(i, j)` at `offset + i·row_stride + j·col_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatLayout {
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Distance in elements between `(i, j)` and `(i + 1, j)`.
    pub row_stride: usize,
    /// Distance in elements between `(i, j)` and `(i, j + 1)`.
    pub col_stride: usize,
    /// Index of element `(0, 0)` in the slice.
    pub offset: usize,
}

impl MatLayout {
    /// A contiguous row-major `rows × cols` matrix.
    pub const fn row_major(rows: usize, cols: usize) -> Self {
        Self { rows, cols, row_stride: cols, col_stride: 1, offset: 0 }
    }

    /// A contiguous column-major `rows × cols` matrix.
    pub const fn col_major(rows: usize, cols: usize) -> Self {
        Self { rows, cols, row_stride: 1, col_stride: rows, offset: 0 }
    }

    /// An arbitrary strided view.
    pub const fn strided(
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
        offset: usize,
    ) -> Self {
        Self { rows, cols, row_stride, col_stride, offset }
    }

    /// The same elements seen transposed (`cols × rows`); no data moves.
    pub const fn transposed(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            offset: self.offset,
        }
    }

    /// Index of element `(i, j)`. Only meaningful after [`check`](Self::check) succeeded and for
    /// `i < rows`, `j < cols`.
    #[inline(always)]
    pub const fn index(&self, i: usize, j: usize) -> usize {
        self.offset + i * self.row_stride + j * self.col_stride
    }

    /// Number of elements `rows · cols` (saturating).
    pub const fn len(&self) -> usize {
        self.rows.saturating_mul(self.cols)
    }

    /// True when the view has no element.
    pub const fn is_empty(&self) -> bool {
        self.rows == 0 || self.cols == 0
    }

    /// The number of elements a slice must have to hold this view: last index reached + 1, or 0
    /// for an empty view. `None` when that overflows `usize`.
    pub fn required_len(&self) -> Option<usize> {
        required_len(self.offset, &[(self.rows, self.row_stride), (self.cols, self.col_stride)])
    }

    /// Checks that the view fits in a slice of `len` elements; `arg` names it in the error.
    pub fn check(&self, arg: &'static str, len: usize) -> Result<()> {
        check_fits(arg, self.required_len(), len)
    }

    /// [`check`](Self::check), plus: distinct positions map to distinct elements, as an output
    /// view needs. Only zero strides are rejected; other overlapping stride patterns are the
    /// caller's responsibility only in the sense that they are rejected too (see
    /// [`is_injective`](Self::is_injective)).
    pub fn check_output(&self, arg: &'static str, len: usize) -> Result<()> {
        self.check(arg, len)?;
        if self.is_injective() {
            Ok(())
        } else {
            Err(Error::AliasedOutput { arg })
        }
    }

    /// True when no two positions of the view share an element. Exact for the layouts that
    /// occur in practice: one stride must step over the whole extent of the other.
    pub fn is_injective(&self) -> bool {
        injective(&[(self.rows, self.row_stride), (self.cols, self.col_stride)])
    }

    /// True when the rows lie one after another in memory: contiguous columns and a row
    /// stride of exactly `cols` (a head's rows in `[heads, seq, d]` storage, not in
    /// `[seq, heads, d]` storage, where they are `heads·d` apart).
    pub const fn rows_consecutive(&self) -> bool {
        self.col_stride == 1 && self.row_stride == self.cols
    }

    /// Expects `rows × cols`, naming `arg` in the error.
    pub fn expect_shape(&self, arg: &'static str, rows: usize, cols: usize) -> Result<()> {
        crate::error::expect_dim(arg, "rows", rows, self.rows)?;
        crate::error::expect_dim(arg, "cols", cols, self.cols)
    }
}

/// A strided 4-D view with logical dimensions `[batch, heads, seq, dim]`; element
/// `(b, h, s, d)` at `offset + b·strides[0] + h·strides[1] + s·strides[2] + d·strides[3]`.
///
/// Both common memory layouts are this descriptor: [`bhsd`](Self::bhsd) for
/// `[batch, heads, seq, dim]` and [`bshd`](Self::bshd) for `[batch, seq, heads, dim]` storage.
/// A zero stride broadcasts a dimension (e.g. one mask for every head). The contiguous
/// constructors saturate stride products instead of overflowing, so absurd sizes surface as
/// [`Error::IndexOverflow`] from [`check`](Self::check), never as a panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tensor4Layout {
    /// Logical sizes `[batch, heads, seq, dim]`.
    pub dims: [usize; 4],
    /// Element strides of the four logical dimensions.
    pub strides: [usize; 4],
    /// Index of element `(0, 0, 0, 0)`.
    pub offset: usize,
}

impl Tensor4Layout {
    /// Contiguous storage ordered `[batch, heads, seq, dim]`.
    pub const fn bhsd(batch: usize, heads: usize, seq: usize, dim: usize) -> Self {
        Self {
            dims: [batch, heads, seq, dim],
            strides: [
                heads.saturating_mul(seq).saturating_mul(dim),
                seq.saturating_mul(dim),
                dim,
                1,
            ],
            offset: 0,
        }
    }

    /// Contiguous storage ordered `[batch, seq, heads, dim]`, seen as `[batch, heads, seq, dim]`.
    pub const fn bshd(batch: usize, seq: usize, heads: usize, dim: usize) -> Self {
        Self {
            dims: [batch, heads, seq, dim],
            strides: [
                seq.saturating_mul(heads).saturating_mul(dim),
                dim,
                heads.saturating_mul(dim),
                1,
            ],
            offset: 0,
        }
    }

    /// A batch of sequences, contiguous `[batch, seq, dim]` storage, seen as a one-head
    /// `[batch, 1, seq, dim]` tensor: the activations the layers ([`crate::MhaConfig`],
    /// [`crate::EncoderConfig`], [`crate::PositionalEncoding`]) take and return.
    pub const fn batch_seq(batch: usize, seq: usize, dim: usize) -> Self {
        Self {
            dims: [batch, 1, seq, dim],
            strides: [seq.saturating_mul(dim), 0, dim, 1],
            offset: 0,
        }
    }

    /// One `[rows, cols]` matrix broadcast over every batch and head by zero strides, seen as
    /// `[batch, heads, rows, cols]` (e.g. one mask shared by all heads of all batches).
    pub const fn broadcast_mat(batch: usize, heads: usize, rows: usize, cols: usize) -> Self {
        Self { dims: [batch, heads, rows, cols], strides: [0, 0, cols, 1], offset: 0 }
    }

    /// A `[batch, cols]` row-major table broadcast over heads and rows by zero strides, seen as
    /// `[batch, heads, rows, cols]` (a key-padding mask: one row of keys per batch).
    pub const fn broadcast_rows(batch: usize, heads: usize, rows: usize, cols: usize) -> Self {
        Self { dims: [batch, heads, rows, cols], strides: [cols, 0, 0, 1], offset: 0 }
    }

    /// An arbitrary strided view.
    pub const fn strided(dims: [usize; 4], strides: [usize; 4], offset: usize) -> Self {
        Self { dims, strides, offset }
    }

    /// A 2-D matrix `rows × cols` seen as a `[1, 1, rows, cols]` tensor.
    pub const fn from_mat(m: MatLayout) -> Self {
        Self {
            dims: [1, 1, m.rows, m.cols],
            strides: [0, 0, m.row_stride, m.col_stride],
            offset: m.offset,
        }
    }

    /// Batch size.
    pub const fn batch(&self) -> usize {
        self.dims[0]
    }
    /// Number of heads.
    pub const fn heads(&self) -> usize {
        self.dims[1]
    }
    /// Sequence length.
    pub const fn seq(&self) -> usize {
        self.dims[2]
    }
    /// Feature width.
    pub const fn dim(&self) -> usize {
        self.dims[3]
    }

    /// Index of element `(b, h, s, d)`; meaningful only after [`check`](Self::check).
    #[inline(always)]
    pub const fn index(&self, b: usize, h: usize, s: usize, d: usize) -> usize {
        self.offset
            + b * self.strides[0]
            + h * self.strides[1]
            + s * self.strides[2]
            + d * self.strides[3]
    }

    /// The `[seq, dim]` matrix of batch `b`, head `h`.
    pub const fn matrix(&self, b: usize, h: usize) -> MatLayout {
        MatLayout {
            rows: self.dims[2],
            cols: self.dims[3],
            row_stride: self.strides[2],
            col_stride: self.strides[3],
            offset: self.offset + b * self.strides[0] + h * self.strides[1],
        }
    }

    /// Number of elements (saturating).
    pub const fn len(&self) -> usize {
        self.dims[0]
            .saturating_mul(self.dims[1])
            .saturating_mul(self.dims[2])
            .saturating_mul(self.dims[3])
    }

    /// True when the view has no element.
    pub const fn is_empty(&self) -> bool {
        self.dims[0] == 0 || self.dims[1] == 0 || self.dims[2] == 0 || self.dims[3] == 0
    }

    /// Elements a slice must have to hold this view; `None` on overflow.
    pub fn required_len(&self) -> Option<usize> {
        let pairs: [(usize, usize); 4] = std::array::from_fn(|i| (self.dims[i], self.strides[i]));
        required_len(self.offset, &pairs)
    }

    /// Checks that the view fits in a slice of `len` elements.
    pub fn check(&self, arg: &'static str, len: usize) -> Result<()> {
        check_fits(arg, self.required_len(), len)
    }

    /// [`check`](Self::check) plus injectivity, as an output view needs.
    pub fn check_output(&self, arg: &'static str, len: usize) -> Result<()> {
        self.check(arg, len)?;
        let pairs: [(usize, usize); 4] = std::array::from_fn(|i| (self.dims[i], self.strides[i]));
        if injective(&pairs) {
            Ok(())
        } else {
            Err(Error::AliasedOutput { arg })
        }
    }

    /// Expects the given logical dims, naming `arg` and the dimension in the error.
    pub fn expect_dims(&self, arg: &'static str, dims: [usize; 4]) -> Result<()> {
        const NAMES: [&str; 4] = ["batch", "heads", "seq", "dim"];
        for i in 0..4 {
            crate::error::expect_dim(arg, NAMES[i], dims[i], self.dims[i])?;
        }
        Ok(())
    }
}

/// A read-only matrix operand: a slice of `T` (f32 by default; any [`Element`], or `i8` for the
/// values of a quantised cache) and the view of it. Calls check the view against the slice
/// before touching it.
#[derive(Debug)]
pub struct MatRef<'a, T = f32> {
    /// The elements.
    pub data: &'a [T],
    /// Where element `(i, j)` lives in `data`.
    pub layout: MatLayout,
}

/// A writable matrix operand: a slice and the view of it.
#[derive(Debug)]
pub struct MatMut<'a, T = f32> {
    /// The elements.
    pub data: &'a mut [T],
    /// Where element `(i, j)` lives in `data`.
    pub layout: MatLayout,
}

/// A read-only `[batch, heads, seq, dim]` operand of `T` (f32 by default).
#[derive(Debug)]
pub struct TensorRef<'a, T = f32> {
    /// The elements.
    pub data: &'a [T],
    /// Where element `(b, h, s, d)` lives in `data`.
    pub layout: Tensor4Layout,
}

/// A writable `[batch, heads, seq, dim]` operand.
#[derive(Debug)]
pub struct TensorMut<'a, T = f32> {
    /// The elements.
    pub data: &'a mut [T],
    /// Where element `(b, h, s, d)` lives in `data`.
    pub layout: Tensor4Layout,
}

// Manual impls: a derive would ask `T: Clone`, which a shared view does not need.
impl<T> Clone for MatRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for MatRef<'_, T> {}
impl<T> Clone for TensorRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for TensorRef<'_, T> {}

impl<'a, T: Copy> MatRef<'a, T> {
    /// Pairs a slice with a view (checked later, by the call that uses it).
    pub const fn new(data: &'a [T], layout: MatLayout) -> Self {
        Self { data, layout }
    }
    /// A contiguous row-major matrix.
    pub const fn row_major(data: &'a [T], rows: usize, cols: usize) -> Self {
        Self { data, layout: MatLayout::row_major(rows, cols) }
    }
    /// Checks the view against the slice.
    pub fn check(&self, arg: &'static str) -> Result<()> {
        self.layout.check(arg, self.data.len())
    }
    /// Element `(i, j)`; call only after [`check`](Self::check), with `i < rows`, `j < cols`.
    #[inline(always)]
    pub fn at(&self, i: usize, j: usize) -> T {
        self.data[self.layout.index(i, j)]
    }
}

impl<T: Element> MatRef<'_, T> {
    /// The element type's tag.
    pub const fn dtype(&self) -> DType {
        T::DTYPE
    }
    /// Element `(i, j)` widened to f32 (exact); call only after [`check`](Self::check).
    #[inline(always)]
    pub fn at_f32(&self, i: usize, j: usize) -> f32 {
        self.at(i, j).to_f32()
    }
}

impl<'a, T: Copy> MatMut<'a, T> {
    /// Pairs a slice with a view (checked later, by the call that uses it).
    pub fn new(data: &'a mut [T], layout: MatLayout) -> Self {
        Self { data, layout }
    }
    /// A contiguous row-major matrix.
    pub fn row_major(data: &'a mut [T], rows: usize, cols: usize) -> Self {
        Self { data, layout: MatLayout::row_major(rows, cols) }
    }
    /// Checks the view against the slice, and that no two positions share an element.
    pub fn check(&self, arg: &'static str) -> Result<()> {
        self.layout.check_output(arg, self.data.len())
    }
    /// A read-only view of the same elements.
    pub fn as_ref(&self) -> MatRef<'_, T> {
        MatRef { data: self.data, layout: self.layout }
    }
    /// Reborrows, so the operand can be passed on and used again.
    pub fn rb(&mut self) -> MatMut<'_, T> {
        MatMut { data: self.data, layout: self.layout }
    }
}

impl<'a, T: Copy> TensorRef<'a, T> {
    /// Pairs a slice with a view (checked later, by the call that uses it).
    pub const fn new(data: &'a [T], layout: Tensor4Layout) -> Self {
        Self { data, layout }
    }
    /// Checks the view against the slice.
    pub fn check(&self, arg: &'static str) -> Result<()> {
        self.layout.check(arg, self.data.len())
    }
    /// The `[seq, dim]` matrix of batch `b`, head `h`.
    pub fn matrix(&self, b: usize, h: usize) -> MatRef<'a, T> {
        MatRef { data: self.data, layout: self.layout.matrix(b, h) }
    }
    /// Element `(b, h, s, d)`; call only after [`check`](Self::check).
    #[inline(always)]
    pub fn at(&self, b: usize, h: usize, s: usize, d: usize) -> T {
        self.data[self.layout.index(b, h, s, d)]
    }
}

impl<T: Element> TensorRef<'_, T> {
    /// The element type's tag.
    pub const fn dtype(&self) -> DType {
        T::DTYPE
    }
    /// Element `(b, h, s, d)` widened to f32 (exact); call only after [`check`](Self::check).
    #[inline(always)]
    pub fn at_f32(&self, b: usize, h: usize, s: usize, d: usize) -> f32 {
        self.at(b, h, s, d).to_f32()
    }
}

impl<'a, T: Copy> TensorMut<'a, T> {
    /// Pairs a slice with a view (checked later, by the call that uses it).
    pub fn new(data: &'a mut [T], layout: Tensor4Layout) -> Self {
        Self { data, layout }
    }
    /// Checks the view against the slice, and that no two positions share an element.
    pub fn check(&self, arg: &'static str) -> Result<()> {
        self.layout.check_output(arg, self.data.len())
    }
    /// The writable `[seq, dim]` matrix of batch `b`, head `h`.
    pub fn matrix_mut(&mut self, b: usize, h: usize) -> MatMut<'_, T> {
        MatMut { data: self.data, layout: self.layout.matrix(b, h) }
    }
    /// A read-only view of the same elements.
    pub fn as_ref(&self) -> TensorRef<'_, T> {
        TensorRef { data: self.data, layout: self.layout }
    }
    /// Reborrows, so the operand can be passed on and used again.
    pub fn rb(&mut self) -> TensorMut<'_, T> {
        TensorMut { data: self.data, layout: self.layout }
    }
}

fn required_len(offset: usize, dims: &[(usize, usize)]) -> Option<usize> {
    if dims.iter().any(|&(n, _)| n == 0) {
        return Some(0);
    }
    let mut last = offset;
    for &(n, s) in dims {
        last = last.checked_add((n - 1).checked_mul(s)?)?;
    }
    last.checked_add(1)
}

fn check_fits(arg: &'static str, required: Option<usize>, len: usize) -> Result<()> {
    match required {
        None => Err(Error::IndexOverflow { arg }),
        Some(required) if required > len => Err(Error::OutOfBounds { arg, required, len }),
        Some(_) => Ok(()),
    }
}

/// Sufficient condition for injectivity, exact for nested layouts: sort the dimensions longer
/// than 1 by stride; each stride must exceed the extent spanned by all smaller ones.
fn injective(dims: &[(usize, usize)]) -> bool {
    if dims.iter().any(|&(n, _)| n == 0) {
        return true;
    }
    let mut live: Vec<(usize, usize)> = dims.iter().copied().filter(|&(n, _)| n > 1).collect();
    live.sort_by_key(|&(_, s)| s);
    let mut span = 0usize; // largest offset reachable with the smaller-stride dims
    for (n, s) in live {
        if s == 0 || s <= span {
            return false;
        }
        span = match (n - 1).checked_mul(s).and_then(|x| x.checked_add(span)) {
            Some(v) => v,
            None => return false,
        };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_index_the_same_element() {
        let rm = MatLayout::row_major(3, 4);
        let cm = MatLayout::col_major(4, 3).transposed();
        assert_eq!(rm, cm);
        assert_eq!(rm.index(2, 3), 11);
        assert_eq!(rm.required_len(), Some(12));
        assert_eq!(MatLayout::row_major(0, 4).required_len(), Some(0));
        let t = Tensor4Layout::bshd(2, 5, 3, 4);
        assert_eq!(t.index(1, 2, 4, 3), 5 * 3 * 4 + 4 * 12 + 2 * 4 + 3);
        assert_eq!(t.required_len(), Some(2 * 5 * 3 * 4));
    }

    #[test]
    fn injectivity() {
        assert!(MatLayout::row_major(3, 4).is_injective());
        assert!(!MatLayout::strided(3, 4, 0, 1, 0).is_injective());
        assert!(!MatLayout::strided(3, 4, 2, 1, 0).is_injective());
        assert!(MatLayout::strided(1, 4, 0, 1, 0).is_injective());
        assert!(MatLayout::strided(3, 4, 1, 3, 0).is_injective());
    }

    #[test]
    fn overflow_is_an_error() {
        let m = MatLayout::strided(usize::MAX, 2, usize::MAX, 1, 0);
        assert_eq!(m.check("a", 10), Err(Error::IndexOverflow { arg: "a" }));
    }
}
