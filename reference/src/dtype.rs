//! The exact values that half-precision and int8-quantised inputs represent, in f64: what the
//! reference computes on when a kernel reads bf16, f16 or a [`Q8Ref`] K/V cache.

use crate::alloc::filled;
use crate::error::Result;
use crate::shape::TensorRef;
use attn_core::dtype::Element;
use attn_core::quant::{q8_dequantize, Q8Ref, Q8_BLOCK};

/// The elements of `x` (f32, bf16 or f16) as f64, exactly, in `[batch, heads, seq, dim]`
/// row-major order. Errors: `x`'s bounds errors (naming `x`), or an allocation error.
pub fn widen<T: Element>(x: TensorRef<'_, T>) -> Result<Vec<f64>> {
    x.check("x")?;
    let [nb, nh, ns, nd] = x.layout.dims;
    let mut out = filled("x", x.layout.len(), 0.0)?;
    let mut i = 0;
    for b in 0..nb {
        for h in 0..nh {
            for s in 0..ns {
                for d in 0..nd {
                    out[i] = x.at(b, h, s, d).to_f64();
                    i += 1;
                }
            }
        }
    }
    Ok(out)
}

/// The values of an int8-quantised tensor, `q · scale` of each element with its block's
/// scale, exactly (an 8-bit integer times an f32 fits in an f64), in `[batch, heads, seq, d]`
/// row-major order. Any scale is accepted: 0 gives ±0, `±∞` gives `±∞` for `q ≠ 0` and NaN for
/// `q = 0`, NaN gives NaN (the rule of `attn_core::quant`). Errors: `q.check("q", "q_scales")`'s
/// errors, or an allocation error.
pub fn dequantize_q8(q: Q8Ref<'_>) -> Result<Vec<f64>> {
    q.check("q", "q_scales")?;
    let [nb, nh, ns, nd] = q.dims();
    let mut out = filled("q", q.values.layout.len(), 0.0)?;
    let mut i = 0;
    for b in 0..nb {
        for h in 0..nh {
            for s in 0..ns {
                for d in 0..nd {
                    out[i] =
                        q8_dequantize(q.values.at(b, h, s, d), q.scales.at(b, h, s, d / Q8_BLOCK));
                    i += 1;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::Tensor4Layout;
    use attn_core::dtype::bf16;
    use attn_core::quant::q8_blocks;

    #[test]
    fn dequantises_blocks_and_tails() {
        let d = 33;
        let values: Vec<i8> = (0..2 * d).map(|i| (i as i8) - 30).collect();
        let scales = [0.5f32, 2.0, 0.0, f32::INFINITY];
        assert_eq!(q8_blocks(d), 2);
        let out = dequantize_q8(Q8Ref::bhsd(&values, &scales, 1, 1, 2, d)).unwrap();
        for (i, &v) in out.iter().enumerate() {
            let (row, col) = (i / d, i % d);
            let s = f64::from(scales[row * 2 + col / 32]);
            let q = f64::from(values[i]);
            if q == 0.0 && s.is_infinite() {
                assert!(v.is_nan());
            } else {
                assert_eq!(v, q * s);
            }
        }
        assert_eq!(out[32], 2.0 * 2.0);
    }

    #[test]
    fn widening_is_exact_and_checked() {
        let x: Vec<bf16> =
            [1.0f32, -0.5, 3.0e38, 1e-40].iter().map(|&v| bf16::from_f32(v)).collect();
        let t = TensorRef::new(&x[..], Tensor4Layout::bhsd(1, 2, 1, 2));
        let w = widen(t).unwrap();
        assert_eq!(w, x.iter().map(|v| f64::from(v.to_f32())).collect::<Vec<_>>());
        let short = TensorRef::new(&x[..3], Tensor4Layout::bhsd(1, 2, 1, 2));
        assert!(widen(short).is_err());
    }
}
