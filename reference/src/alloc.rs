//! Fallible allocation of the reference's scratch buffers.
//!
//! Zero-sized views may carry any dimension (a `[0, usize::MAX]` matrix fits in an empty slice),
//! so a size derived from dimensions is not bounded by any slice length. Every buffer the
//! reference allocates goes through here, so an absurd size becomes an [`Error`] rather than a
//! capacity-overflow panic or an abort.

use crate::error::{Error, Result};

const TOO_BIG: &str = "the sizes imply a scratch buffer that cannot be allocated";

pub(crate) use attn_core::checked_product as product;

/// A vector of `n` copies of `fill`, or an error naming `arg` when it cannot be allocated.
pub(crate) fn filled<T: Clone>(arg: &'static str, n: usize, fill: T) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::InvalidParameter { arg, requirement: TOO_BIG })?;
    v.resize(n, fill);
    Ok(v)
}

/// A zeroed f32 buffer of `dims` elements (their product).
pub(crate) fn zeros(arg: &'static str, dims: &[usize]) -> Result<Vec<f32>> {
    filled(arg, product(arg, dims)?, 0.0)
}
