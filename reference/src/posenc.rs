//! Positional encodings: the sinusoidal table of "Attention Is All You Need" and a learned
//! table, each added to a batch of sequences.

pub use attn_core::layers::PositionalEncoding;

use crate::error::{expect_dim, Error, Result};
use crate::shape::{MatMut, TensorMut, TensorRef};

/// Sinusoidal encoding value for position `pos`, feature `j` of width `d`:
/// `PE(pos, 2i) = sin(pos / 10000^(2i/d))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/d))`.
///
/// Computed in f64 (the argument `pos / 10000^(2i/d)` included, so large positions keep their
/// phase) and rounded once by the callers. For odd `d` the last feature is a sine.
pub fn sinusoidal(pos: usize, j: usize, d: usize) -> f64 {
    let two_i = (j - j % 2) as f64;
    let angle = pos as f64 / 10000f64.powf(two_i / d as f64);
    if j.is_multiple_of(2) {
        angle.sin()
    } else {
        angle.cos()
    }
}

/// Writes the sinusoidal table for positions `start .. start + rows` into `pe: [rows, d]`:
/// `pe_sj = PE(start + s, j)` (see [`sinusoidal`]).
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
    for s in 0..rows {
        for j in 0..d {
            pe.data[pe.layout.index(s, j)] = sinusoidal(start + s, j, d) as f32;
        }
    }
    Ok(())
}

/// `y = x + e`: adds position vectors to a batch of sequences `x: [batch, 1, n, d]` (see
/// [`Tensor4Layout::batch_seq`](crate::shape::Tensor4Layout::batch_seq)), writing
/// `y: [batch, 1, n, d]`. `y_bsj = x_bsj + e_(start+s) j`, the sum taken in f64 and rounded
/// once. Zero-length sequences give empty outputs.
///
/// Errors: `x` with more than one head, `y` ≠ `x`'s dims, a learned `table` with other than `d`
/// columns or fewer than `start + n` rows, views overrunning their slices, an aliased `y`.
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
    if y.layout.is_empty() {
        return Ok(());
    }
    for b in 0..batch {
        for s in 0..n {
            for j in 0..d {
                let e = match pe {
                    PositionalEncoding::Sinusoidal { .. } => sinusoidal(start + s, j, d),
                    PositionalEncoding::Learned { table, .. } => f64::from(table.at(start + s, j)),
                };
                y.data[y.layout.index(b, 0, s, j)] = (f64::from(x.at(b, 0, s, j)) + e) as f32;
            }
        }
    }
    Ok(())
}
