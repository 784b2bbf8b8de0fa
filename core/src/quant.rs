//! The int8 K/V cache layout: symmetric int8 in blocks of [`Q8_BLOCK`] values along `d`, one
//! f32 scale per block.

/// Values per quantisation block along `d`.
pub const Q8_BLOCK: usize = 32;

/// Blocks in a row of `d` values: `⌈d/32⌉` (the last one shorter when 32 does not divide `d`).
pub const fn q8_blocks(d: usize) -> usize {
    d.div_ceil(Q8_BLOCK)
}
