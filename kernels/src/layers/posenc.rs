//! Positional encodings: the sinusoidal table and a learned table, added to a batch of sequences.

use attn_core::error::expect_dim;
use attn_core::{Error, MatMut, PositionalEncoding, Result, TensorMut, TensorRef};

/// `10000^(2i/d)` for feature `j` of width `d`, in f64: the divisor of the sinusoid's angle,
/// computed once per feature instead of once per element (the same f64 operations as
/// `attn_reference::posenc::sinusoidal`, so values are bitwise the reference's).
fn divisor(j: usize, d: usize) -> f64 {
    10000f64.powf((j - j % 2) as f64 / d as f64)
}

/// `PE(pos, j)` given the feature's [`divisor`]: sine on even features, cosine on odd ones,
/// computed in f64 so that large positions keep their phase.
#[inline(always)]
fn sinusoid(pos: usize, j: usize, div: f64) -> f64 {
    let angle = pos as f64 / div;
    if j.is_multiple_of(2) {
        angle.sin()
    } else {
        angle.cos()
    }
}

/// Writes the sinusoidal table for positions `start .. start + rows` into `pe: [rows, d]`:
/// `pe_sj = sin((start+s) / 10000^(2i/d))` for `j = 2i`, `cos(…)` for `j = 2i + 1`, evaluated
/// in f64 and rounded once (bitwise equal to `attn_reference::sinusoidal_table`).
///
/// Errors: `start + rows` overflowing `usize`, a view overrunning its slice, an aliased `pe`.
pub fn sinusoidal_table(start: usize, pe: MatMut<'_>) -> Result<()> {
    pe.check("pe")?;
    let (rows, d) = (pe.layout.rows, pe.layout.cols);
    if start.checked_add(rows).is_none() {
        return Err(Error::IndexOverflow { arg: "start" });
    }
    if pe.layout.is_empty() {
        return Ok(());
    }
    for j in 0..d {
        let div = divisor(j, d);
        for s in 0..rows {
            pe.data[pe.layout.index(s, j)] = sinusoid(start + s, j, div) as f32;
        }
    }
    Ok(())
}

/// `y = x + e`: adds position vectors to a batch of sequences `x: [batch, 1, n, d]`, writing
/// `y` of the same dims; `y_bsj = x_bsj + e_(start+s) j` (see [`PositionalEncoding`]).
///
/// The sinusoidal value is evaluated in f64 and the sum rounded once, the learned one is an f32
/// add: both bitwise equal to `attn_reference::add_positional_encoding`. Allocates nothing.
///
/// Errors: those of the reference, in the same order.
pub fn add_positional_encoding(
    x: TensorRef<'_>,
    pe: &PositionalEncoding<'_>,
    y: TensorMut<'_>,
) -> Result<()> {
    let [batch, heads, n, d] = x.layout.dims;
    expect_dim("x", "heads", 1, heads)?;
    y.layout.expect_dims("y", x.layout.dims)?;
    x.check("x")?;
    y.check("y")?;
    let start = check_encoding(pe, n, d)?;
    if y.layout.is_empty() {
        return Ok(());
    }
    for_each_encoding(pe, start, [batch, n, d], |b, s, j, e| {
        let v = f64::from(x.at(b, 0, s, j)) + e;
        y.data[y.layout.index(b, 0, s, j)] = v as f32;
    });
    Ok(())
}

/// In-place form of [`add_positional_encoding`]: `x ← x + e`, for engines that keep one
/// activation buffer. Bitwise equal to the out-of-place form.
///
/// Errors: as [`add_positional_encoding`], naming `x` for the tensor.
pub fn add_positional_encoding_in_place(
    x: TensorMut<'_>,
    pe: &PositionalEncoding<'_>,
) -> Result<()> {
    let [batch, heads, n, d] = x.layout.dims;
    expect_dim("x", "heads", 1, heads)?;
    x.layout.check_output("x", x.data.len())?;
    let start = check_encoding(pe, n, d)?;
    if x.layout.is_empty() {
        return Ok(());
    }
    for_each_encoding(pe, start, [batch, n, d], |b, s, j, e| {
        let i = x.layout.index(b, 0, s, j);
        x.data[i] = (f64::from(x.data[i]) + e) as f32;
    });
    Ok(())
}

/// Checks the encoding for `n` positions of width `d` and returns its start position.
fn check_encoding(pe: &PositionalEncoding<'_>, n: usize, d: usize) -> Result<usize> {
    let (PositionalEncoding::Sinusoidal { start } | PositionalEncoding::Learned { start, .. }) =
        *pe;
    let end = start.checked_add(n).ok_or(Error::IndexOverflow { arg: "start" })?;
    if let PositionalEncoding::Learned { table, .. } = pe {
        expect_dim("table", "cols", d, table.layout.cols)?;
        if table.layout.rows < end {
            return Err(Error::ShapeMismatch {
                arg: "table",
                dim: "rows (at least)",
                expected: end,
                actual: table.layout.rows,
            });
        }
        table.check("table")?;
    }
    Ok(start)
}

/// Calls `f(b, s, j, e)` for every element `(b, 0, s, j)` of a `[batch, 1, n, d]` tensor with
/// `e` the encoding value of position `start + s`, feature `j`: feature by feature, so that each
/// feature's [`divisor`] and each position's value are computed once for the whole batch.
#[inline(always)]
fn for_each_encoding(
    pe: &PositionalEncoding<'_>,
    start: usize,
    [batch, n, d]: [usize; 3],
    mut f: impl FnMut(usize, usize, usize, f64),
) {
    for j in 0..d {
        let div = divisor(j, d);
        for s in 0..n {
            let e = encoding(pe, start + s, j, div);
            for b in 0..batch {
                f(b, s, j, e);
            }
        }
    }
}

/// The encoding value of position `pos`, feature `j` (whose sinusoid divisor is `div`).
#[inline(always)]
fn encoding(pe: &PositionalEncoding<'_>, pos: usize, j: usize, div: f64) -> f64 {
    match pe {
        PositionalEncoding::Sinusoidal { .. } => sinusoid(pos, j, div),
        PositionalEncoding::Learned { table, .. } => f64::from(table.at(pos, j)),
    }
}
