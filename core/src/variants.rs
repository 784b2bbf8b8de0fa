//! Attention variants of current models, set on top of any [`Mask`]: a sliding
//! window (Mistral, Gemma 2/3, gpt-oss), a logit softcap (Gemma 2), per-head attention sinks
//! (gpt-oss) and ALiBi slopes (BLOOM, MPT).
//!
//! For query `i` and key `j` of head `h`, with `s = scale·q_i·k_j` and `off` the causal offset
//! ([`Variants::offset`]), the logit is
//!
//! ```text
//! softcap(s) + mask_ij + slope_h·(j − i − off)      visible when the mask and the window allow
//! softcap(s) = c·tanh(s/c)                          (s itself without a softcap)
//! window:      i + off − left ≤ j ≤ i + off + right
//! ```
//!
//! and the row's softmax denominator gains `e^(sink_h)` when sinks are set: the sink takes
//! weight but carries no value, and the logsumexp includes it. A row with no visible key is
//! zero with logsumexp −∞ as always, or, with a sink, zero with logsumexp `sink_h`.

use crate::error::{expect_dim, expect_finite, Error, Result};
use crate::mask::Mask;

/// A band of visible keys around the causal diagonal: key `j` is visible to query `i` when
/// `i + off − left ≤ j ≤ i + off + right` (exact integer arithmetic: any `left` and `right`
/// are valid, `usize::MAX` meaning unbounded). `right = 0` with a causal mask is Mistral's
/// window of `left + 1` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// Keys visible before the diagonal.
    pub left: usize,
    /// Keys visible after the diagonal.
    pub right: usize,
}

impl Window {
    /// True when key `j` is in the band of query `i` for causal offset `off`.
    pub fn contains(&self, i: usize, j: usize, off: isize) -> bool {
        let d = i as i128 + off as i128;
        d - self.left as i128 <= j as i128 && j as i128 <= d + self.right as i128
    }
}

/// The variants of one attention call; the default is plain attention. Built by name, so that
/// new variants can join without breaking callers:
/// `Variants::default().window(4095, 0).softcap(50.0)`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Variants<'a> {
    /// Sliding window, `None` for every key.
    pub window: Option<Window>,
    /// Logit softcap `c > 0`, `None` for none.
    pub softcap: Option<f32>,
    /// One sink logit per query head (`hq` values), `None` for none.
    pub sinks: Option<&'a [f32]>,
    /// One ALiBi slope per query head (`hq` values), `None` for none.
    pub alibi: Option<&'a [f32]>,
}

impl<'a> Variants<'a> {
    /// Plain attention: no window, softcap, sinks or ALiBi.
    pub const NONE: Variants<'static> =
        Variants { window: None, softcap: None, sinks: None, alibi: None };

    /// With the sliding window `(left, right)` (see [`Window`]).
    pub fn window(mut self, left: usize, right: usize) -> Self {
        self.window = Some(Window { left, right });
        self
    }

    /// With the logit softcap `c` (checked by [`check`](Self::check): finite and `> 0`).
    pub fn softcap(mut self, c: f32) -> Self {
        self.softcap = Some(c);
        self
    }

    /// With one sink logit per query head.
    pub fn sinks(mut self, sinks: &'a [f32]) -> Self {
        self.sinks = Some(sinks);
        self
    }

    /// With one ALiBi slope per query head (see [`alibi_slopes`] for the standard ones).
    pub fn alibi(mut self, slopes: &'a [f32]) -> Self {
        self.alibi = Some(slopes);
        self
    }

    /// True when no variant is set.
    pub fn is_plain(&self) -> bool {
        *self == Variants::NONE
    }

    /// Checks the variants against `hq` query heads: a finite softcap `> 0`, and `hq` finite
    /// sinks and slopes. Windows need no check.
    pub fn check(&self, hq: usize) -> Result<()> {
        if let Some(c) = self.softcap {
            expect_finite("softcap", c)?;
            if c <= 0.0 {
                return Err(Error::InvalidParameter { arg: "softcap", requirement: "must be > 0" });
            }
        }
        for (arg, values) in [("sinks", self.sinks), ("alibi", self.alibi)] {
            if let Some(values) = values {
                expect_dim(arg, "len", hq, values.len())?;
                if let Some(&x) = values.iter().find(|x| !x.is_finite()) {
                    return Err(Error::NonFinite { arg, value: x });
                }
            }
        }
        Ok(())
    }

    /// The causal offset the window and ALiBi measure from: the mask's own for a causal mask,
    /// `nk − nq` (bottom-right, [`Mask::causal_offset`]) otherwise.
    pub fn offset(mask: &Mask<'_>, nq: usize, nk: usize) -> isize {
        match mask {
            Mask::Causal { offset } => Mask::causal_offset(*offset, nq, nk),
            _ => Mask::causal_offset(None, nq, nk),
        }
    }
}

/// The standard ALiBi slopes for `heads` heads (Press et al., as BLOOM computes them): for the
/// largest power of two `n ≤ heads`, `2^(−8k/n)` for `k = 1..=n`, then, when `heads` is not a
/// power of two, `2^(−4(2k−1)/n)` for `k = 1..=heads − n` (the odd steps of the next power of
/// two).
pub fn alibi_slopes(heads: usize) -> Vec<f32> {
    if heads == 0 {
        return Vec::new();
    }
    let n = 1usize << heads.ilog2();
    let step = |num: f64, den: usize| (2f64).powf(-num / den as f64) as f32;
    let mut slopes: Vec<f32> = (1..=n).map(|k| step(8.0 * k as f64, n)).collect();
    slopes.extend((1..=heads - n).map(|k| step(4.0 * (2 * k - 1) as f64, n)));
    slopes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alibi_slopes_match_the_published_ones() {
        // 8 heads: 1/2, 1/4, …, 1/256.
        let want: Vec<f32> = (1..=8).map(|k| 0.5f32.powi(k)).collect();
        assert_eq!(alibi_slopes(8), want);
        // 12 heads: the 8 above, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (BLOOM's formula).
        let s = alibi_slopes(12);
        assert_eq!(&s[..8], &want[..]);
        for (k, x) in s[8..].iter().enumerate() {
            assert_eq!(*x, (2f64).powf(-(k as f64) - 0.5) as f32);
        }
        assert_eq!(alibi_slopes(1), vec![2f32.powi(-8)]);
        assert!(alibi_slopes(0).is_empty());
    }

    #[test]
    fn window_is_exact_at_the_extremes() {
        let w = Window { left: usize::MAX, right: 0 };
        assert!(w.contains(0, 0, 0) && !w.contains(0, 1, 0) && w.contains(usize::MAX, 0, 0));
        let w = Window { left: 2, right: 1 };
        let visible: Vec<usize> = (0..10).filter(|&j| w.contains(5, j, -1)).collect();
        assert_eq!(visible, [2, 3, 4, 5]);
        let w = Window { left: 0, right: usize::MAX };
        assert!(w.contains(3, usize::MAX, isize::MAX) && !w.contains(3, 0, 0));
    }

    #[test]
    fn checks_name_the_field() {
        let sinks = [0.0, 1.0];
        assert_eq!(Variants::default().sinks(&sinks).check(2), Ok(()));
        let e = Variants::default().sinks(&sinks).check(3).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { arg: "sinks", .. }), "{e:?}");
        let bad = [0.0, f32::NAN];
        let e = Variants::default().alibi(&bad).check(2).unwrap_err();
        assert!(matches!(e, Error::NonFinite { arg: "alibi", .. }), "{e:?}");
        for c in [0.0, -1.0, f32::INFINITY, f32::NAN] {
            let e = Variants::default().softcap(c).check(1).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidParameter { arg: "softcap", .. }
                        | Error::NonFinite { arg: "softcap", .. }
                ),
                "{c}: {e:?}"
            );
        }
        assert!(Variants::default().is_plain());
        assert!(!Variants::default().window(0, 0).is_plain());
    }
}
