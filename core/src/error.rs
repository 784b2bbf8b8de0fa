//! The workspace's error type: every bad-input case the design lists, each naming the argument
//! at fault and, where sizes are involved, the expected and the actual size.

use std::fmt;

/// What went wrong with the arguments of a call. Shared by the reference and the kernels, so
/// both reject the same inputs with the same messages.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// A dimension of `arg` does not match the size the other arguments imply.
    ShapeMismatch {
        /// The argument at fault (e.g. `"b"`, `"mask"`).
        arg: &'static str,
        /// Which dimension (e.g. `"rows"`, `"cols"`, `"dim 2"`).
        dim: &'static str,
        /// The size the other arguments imply.
        expected: usize,
        /// The size that was passed.
        actual: usize,
    },
    /// The view of `arg` reaches past the end of its slice.
    OutOfBounds {
        /// The argument at fault.
        arg: &'static str,
        /// Elements the view needs (last index reached + 1).
        required: usize,
        /// Elements the slice has.
        len: usize,
    },
    /// Offset and strides of `arg` overflow `usize` when multiplied by its dimensions.
    IndexOverflow {
        /// The argument at fault.
        arg: &'static str,
    },
    /// An output view maps two distinct positions to one element (a zero stride on a
    /// dimension longer than 1), so the result would be ill-defined.
    AliasedOutput {
        /// The argument at fault.
        arg: &'static str,
    },
    /// A head count of zero.
    ZeroHeads {
        /// The argument at fault.
        arg: &'static str,
    },
    /// A hidden size that the number of heads does not divide.
    HeadsNotDivisible {
        /// The argument at fault.
        arg: &'static str,
        /// The hidden size.
        hidden: usize,
        /// The number of heads.
        heads: usize,
    },
    /// The number of K/V heads does not divide the number of query heads (GQA/MQA).
    KvHeadsNotDividing {
        /// Query heads.
        q_heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// A scale (or other scalar) that must be finite is NaN or infinite.
    NonFinite {
        /// The argument at fault.
        arg: &'static str,
        /// The value that was passed.
        value: f32,
    },
    /// A scalar parameter outside its documented range (e.g. a negative layer-norm epsilon).
    InvalidParameter {
        /// The argument at fault.
        arg: &'static str,
        /// What the argument must satisfy.
        requirement: &'static str,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::ShapeMismatch { arg, dim, expected, actual } => {
                write!(f, "argument `{arg}`: {dim} must be {expected}, got {actual}")
            }
            Error::OutOfBounds { arg, required, len } => write!(
                f,
                "argument `{arg}`: view needs {required} elements but the slice has {len}"
            ),
            Error::IndexOverflow { arg } => {
                write!(f, "argument `{arg}`: offset and strides overflow usize")
            }
            Error::AliasedOutput { arg } => write!(
                f,
                "argument `{arg}`: output view has a zero stride on a dimension longer than 1"
            ),
            Error::ZeroHeads { arg } => {
                write!(f, "argument `{arg}`: number of heads must be > 0, got 0")
            }
            Error::HeadsNotDivisible { arg, hidden, heads } => write!(
                f,
                "argument `{arg}`: hidden size {hidden} is not divisible by {heads} heads"
            ),
            Error::KvHeadsNotDividing { q_heads, kv_heads } => write!(
                f,
                "argument `kv_heads`: {kv_heads} K/V heads must divide {q_heads} query heads"
            ),
            Error::NonFinite { arg, value } => {
                write!(f, "argument `{arg}`: must be finite, got {value}")
            }
            Error::InvalidParameter { arg, requirement } => {
                write!(f, "argument `{arg}`: {requirement}")
            }
        }
    }
}

impl std::error::Error for Error {}

/// Shorthand for results carrying [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Checks that `actual == expected` for dimension `dim` of `arg`.
pub fn expect_dim(
    arg: &'static str,
    dim: &'static str,
    expected: usize,
    actual: usize,
) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::ShapeMismatch { arg, dim, expected, actual })
    }
}

/// Checks that a scalar is finite.
pub fn expect_finite(arg: &'static str, value: f32) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(Error::NonFinite { arg, value })
    }
}

/// The product of `dims`, or [`Error::InvalidParameter`] naming `arg` when it overflows `usize`
/// (the sizes then imply a buffer that cannot exist).
pub fn checked_product(arg: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or(Error::InvalidParameter {
        arg,
        requirement: "the sizes imply a scratch buffer that cannot be allocated",
    })
}
