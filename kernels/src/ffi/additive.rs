//! The C ABI of additive (Bahdanau) attention: [`attn_additive_attention`] over one
//! [`AttnAdditiveArgs`], the Rust [`AdditiveAttention`] behind it. Conventions (views, null
//! pointers, overlap, threads, the versioned struct) are those of the parent module's
//! [`AttnStatus`] and `AttnAttentionArgs`.

use super::raw::{self, disjoint, slice, span};
use super::{guard, mask_span, mask_view, opt_mut, threads, AttnMask, AttnMat, AttnStatus};
use super::{AttnTensor, AttnTensorMut, Failure};
use crate::attention::{AdditiveAttention, AdditiveWeights};

/// The operands and settings of one [`attn_additive_attention`] call,
/// `O = softmax(wᵀ·tanh(Q·Wq + K·Wk) + mask)·V` (scores `S_ij = Σ_a w_a·tanh(A_ia + B_ja)`,
/// `A = Q·Wq`, `B = K·Wk`; no scale: fold one into `w`).
///
/// **Versioning** as `AttnAttentionArgs`: the struct starts with
/// `struct_size` and only grows at its end, a field appended later reads as zero for an older
/// caller and zero means "as before". Zero-initialise it, set `struct_size =
/// sizeof(AttnAdditiveArgs)`, then the fields you need. Refused with
/// `ATTN_STATUS_INVALID_PARAMETER` naming `args.struct_size`: a size below this first
/// version's (472 bytes on 64-bit targets) or above 4096, and a larger struct with a nonzero
/// byte past the fields this library knows.
///
/// Fields left zero give: no mask, no logsumexp, every available core.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnAdditiveArgs {
    /// `sizeof(AttnAdditiveArgs)` in the caller's header (see the versioning rule above).
    pub struct_size: usize,
    /// Queries `[batch, hq, nq, dq]`.
    pub q: AttnTensor,
    /// Keys `[batch, hkv, nk, dk]` (`dk` may differ from `dq`; hkv divides hq; query head `h`
    /// reads K/V head `h / (hq / hkv)`).
    pub k: AttnTensor,
    /// Values `[batch, hkv, nk, dv]`.
    pub v: AttnTensor,
    /// The output `[batch, hq, nq, dv]`, written (only) within its view.
    pub o: AttnTensorMut,
    /// Query projection `[dq, da]` (`da`, the hidden width, is its column count), shared by
    /// every batch and head; finite (else `ATTN_STATUS_NON_FINITE` naming `wq`).
    pub wq: AttnMat,
    /// Key projection `[dk, da]`; finite.
    pub wk: AttnMat,
    /// The output vector of the hidden layer, `w_len` floats; `w_len` must equal `da`
    /// (`ATTN_STATUS_SHAPE_MISMATCH` naming `w`); finite. May be NULL when `da` is 0.
    pub w: *const f32,
    /// The number of floats at `w`.
    pub w_len: usize,
    /// The mask over `[batch, hq, nq, nk]`, or NULL for none (see [`AttnMask`]).
    pub mask: *const AttnMask,
    /// NULL for no logsumexp (then `lse_len` is ignored); otherwise `lse_len` must equal
    /// `batch·hq·nq` (`ATTN_STATUS_SHAPE_MISMATCH`) and `lse[(b·hq + h)·nq + i]` receives
    /// `ln Σ_j exp(S_ij + mask_ij)` (−∞ for a fully masked row).
    pub lse: *mut f32,
    /// The number of floats at `lse`.
    pub lse_len: usize,
    /// Threads: 0 = every available core, 1 = the calling thread, n = at most n (see
    /// [`AttnStatus`]); the result is bitwise the same for every count.
    pub threads: usize,
}

/// The smallest `struct_size` [`attn_additive_attention`] accepts: the first version of
/// [`AttnAdditiveArgs`], the whole struct today. Fixed for good.
const ADDITIVE_ARGS_MIN_SIZE: usize = std::mem::size_of::<AttnAdditiveArgs>();

/// Additive attention `O = softmax(wᵀ·tanh(Q·Wq + K·Wk) + mask)·V` over `[batch, heads]`,
/// every operand and setting in one [`AttnAdditiveArgs`].
///
/// - Masks, fully masked rows (zeros, logsumexp −∞), zero-weight keys (contribute exactly 0
///   even with a ±∞ or NaN value), `+∞` biases and NaN scores behave as in
///   `attn_attention_run`. A finite `w` bounds every score by
///   `Σ|w_a|`, so only a bias can make one infinite.
/// - Statuses: `ATTN_STATUS_NULL_POINTER` naming `args` for a NULL `args`;
///   `ATTN_STATUS_INVALID_PARAMETER` naming `args` for a pointer not aligned for the struct,
///   naming `args.struct_size` for a size it may not take, and naming `mask.kind` or
///   `mask.causal_default_offset` for a value those fields may not take; then the null, bounds
///   and overlap checks of the views (`q`, `k`, `v`, `o`, `wq`, `wk`, `w`, `mask`, `lse`), then
///   those of the Rust `AdditiveAttention::run`: `ATTN_STATUS_ZERO_HEADS`,
///   `ATTN_STATUS_KV_HEADS_NOT_DIVIDING`, `ATTN_STATUS_SHAPE_MISMATCH` (dims of `k`, `v`, `o`,
///   `wq`, `wk`, `w_len`, the mask, `lse_len`), `ATTN_STATUS_ALIASED_OUTPUT`,
///   `ATTN_STATUS_NON_FINITE` (a weight), `ATTN_STATUS_INVALID_PARAMETER` (the projections
///   cannot be allocated). Nothing is written when a check fails.
///
/// # Safety
///
/// `args` is null or addresses `args->struct_size` readable, initialised bytes (a whole
/// `AttnAdditiveArgs` of the caller's header); each view's `data` addresses the elements the
/// view reaches, `w` addresses `w_len` floats, `lse` addresses `lse_len` floats, `mask` is
/// null or valid; outputs overlap nothing else (checked).
#[no_mangle]
pub unsafe extern "C" fn attn_additive_attention(args: *const AttnAdditiveArgs) -> AttnStatus {
    guard(|| {
        // SAFETY: the caller's contract; `AttnAdditiveArgs` is `repr(C)`, starts with its
        // `size_t struct_size`, and is valid when all-zero (integers, raw pointers).
        let args = unsafe {
            raw::read_sized(("args", "args.struct_size"), args, &[ADDITIVE_ARGS_MIN_SIZE])?
        };
        // SAFETY: forwarded from the caller.
        unsafe { additive_call(&args) }
    })
}

/// The body of [`attn_additive_attention`]: the mask's enum and bool fields validated, the
/// null, bounds and overlap checks, then the Rust problem, which checks shapes as for Rust
/// callers.
///
/// # Safety
/// As [`attn_additive_attention`] (after `args` was read).
unsafe fn additive_call(a: &AttnAdditiveArgs) -> Result<(), Failure> {
    let mut inputs = vec![a.q.span("q")?, a.k.span("k")?, a.v.span("v")?];
    inputs.extend([a.wq.span("wq")?, a.wk.span("wk")?, span("w", a.w, a.w_len)?]);
    // SAFETY: forwarded from the caller.
    inputs.extend(unsafe { mask_span(a.mask)? });
    disjoint(&[a.o.span("o")?, span("lse", a.lse, a.lse_len)?], &inputs)?;
    // SAFETY: the caller's contract; outputs checked disjoint from everything else.
    let (q, k, v, mask, o) = unsafe {
        (a.q.view("q")?, a.k.view("k")?, a.v.view("v")?, mask_view(a.mask)?, a.o.view("o")?)
    };
    // SAFETY: as above (inputs only, and the one output `lse`).
    let (wq, wk, w, lse) = unsafe {
        (
            a.wq.view("wq")?,
            a.wk.view("wk")?,
            slice("w", a.w, a.w_len)?,
            opt_mut("lse", a.lse, a.lse_len)?,
        )
    };
    let mut p = AdditiveAttention::new(q, k, v, AdditiveWeights { wq, wk, w })
        .mask(mask)
        .parallelism(threads(a.threads));
    if let Some(lse) = lse {
        p = p.lse(lse);
    }
    Ok(p.run(o)?)
}

#[cfg(test)]
mod tests {
    use std::ptr::{null, null_mut};

    use super::super::tests::{last_error, mat, tensor, tensor_mut};
    use super::super::AttnMaskKind;
    use super::*;
    use crate::{Mask, MatLayout, MatRef, Parallelism, Tensor4Layout, TensorMut, TensorRef};

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32 * 37 + seed * 11) % 23) as f32 / 11.5 - 1.0).collect()
    }

    /// A contiguous `[b, h, s, d]` view.
    /// `q: [1, 2, 5, 6]`, `k: [1, 1, 9, 4]`, `v: [1, 1, 9, 3]` (GQA, dq ≠ dk ≠ dv), hidden
    /// width 7.
    struct Bufs {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        wq: Vec<f32>,
        wk: Vec<f32>,
        w: Vec<f32>,
        o: Vec<f32>,
        lse: Vec<f32>,
    }

    const Q: [usize; 4] = [1, 2, 5, 6];
    const K: [usize; 4] = [1, 1, 9, 4];
    const V: [usize; 4] = [1, 1, 9, 3];
    const O: [usize; 4] = [1, 2, 5, 3];
    const DA: usize = 7;

    impl Bufs {
        fn new() -> Bufs {
            Bufs {
                q: vals(60, 1),
                // Room for three K/V heads (the KV-heads case below), one used.
                k: vals(3 * 36, 2),
                v: vals(27, 3),
                wq: vals(6 * DA, 4),
                wk: vals(4 * DA, 5),
                w: vals(DA, 6),
                o: vec![f32::NAN; 30],
                lse: vec![f32::NAN; 10],
            }
        }

        /// Every setting zero but `struct_size`, the logsumexp asked for.
        fn args(&mut self) -> AttnAdditiveArgs {
            AttnAdditiveArgs {
                struct_size: std::mem::size_of::<AttnAdditiveArgs>(),
                q: tensor(&self.q, Q),
                k: tensor(&self.k, K),
                v: tensor(&self.v, V),
                o: tensor_mut(&mut self.o, O),
                wq: mat(&self.wq, 6, DA, DA, 1, 0),
                wk: mat(&self.wk, 4, DA, DA, 1, 0),
                w: self.w.as_ptr(),
                w_len: DA,
                mask: null(),
                lse: self.lse.as_mut_ptr(),
                lse_len: self.lse.len(),
                threads: 0,
            }
        }

        /// The Rust API's output and logsumexps with `mask`.
        fn rust(&self, mask: Mask<'_>) -> (Vec<f32>, Vec<f32>) {
            let (mut o, mut lse) = (vec![0.0f32; 30], vec![0.0f32; 10]);
            let weights = AdditiveWeights {
                wq: MatRef::new(&self.wq, MatLayout::row_major(6, DA)),
                wk: MatRef::new(&self.wk, MatLayout::row_major(4, DA)),
                w: &self.w,
            };
            let t = |d: &[usize; 4]| Tensor4Layout::bhsd(d[0], d[1], d[2], d[3]);
            AdditiveAttention::new(
                TensorRef::new(&self.q, t(&Q)),
                TensorRef::new(&self.k, t(&K)),
                TensorRef::new(&self.v, t(&V)),
                weights,
            )
            .mask(mask)
            .lse(&mut lse)
            .parallelism(Parallelism::Sequential)
            .run(TensorMut::new(&mut o, t(&O)))
            .unwrap();
            (o, lse)
        }
    }

    fn run(a: &AttnAdditiveArgs) -> AttnStatus {
        // SAFETY: every test builds `a` over live buffers whose views fit them (or refused
        // before they are read).
        unsafe { attn_additive_attention(a) }
    }

    #[test]
    fn first_version_size() {
        #[cfg(target_pointer_width = "64")]
        assert_eq!(ADDITIVE_ARGS_MIN_SIZE, 472);
    }

    #[test]
    fn same_bits_as_the_rust_api_with_and_without_a_mask() {
        let mut b = Bufs::new();
        let a = b.args();
        assert_eq!(run(&a), AttnStatus::Ok, "{}", last_error());
        assert_eq!((b.o.clone(), b.lse.clone()), b.rust(Mask::None));
        let causal = AttnMask {
            kind: AttnMaskKind::Causal as i32,
            causal_default_offset: 0,
            causal_offset: 1,
            keep: null(),
            bias: null(),
            dims: [0; 4],
            strides: [0; 4],
            offset: 0,
        };
        for t in [1, 2] {
            let a = AttnAdditiveArgs { mask: &causal, threads: t, ..b.args() };
            assert_eq!(run(&a), AttnStatus::Ok, "{}", last_error());
            let want = b.rust(Mask::Causal { offset: Some(1) });
            assert_eq!((b.o.clone(), b.lse.clone()), want, "threads {t}");
        }
        // No logsumexp: a NULL `lse` with any length.
        let a = AttnAdditiveArgs { lse: null_mut(), lse_len: 12345, ..b.args() };
        b.o.fill(f32::NAN);
        assert_eq!(run(&a), AttnStatus::Ok, "{}", last_error());
        assert_eq!(b.o, b.rust(Mask::None).0);
    }

    #[test]
    fn struct_size_is_checked() {
        let mut b = Bufs::new();
        let a = b.args();
        // SAFETY: null is refused.
        assert_eq!(unsafe { attn_additive_attention(null()) }, AttnStatus::NullPointer);
        assert!(last_error().contains("`args`"), "{}", last_error());
        for size in [0, 8, ADDITIVE_ARGS_MIN_SIZE - 1, raw::MAX_STRUCT_SIZE + 1, usize::MAX] {
            let s = run(&AttnAdditiveArgs { struct_size: size, ..a });
            assert_eq!(s, AttnStatus::InvalidParameter, "size {size}");
            assert!(last_error().contains("args.struct_size"), "{}", last_error());
        }
        // A newer caller's larger struct: fine while the bytes past this version are zero.
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Newer {
            args: AttnAdditiveArgs,
            more: [u64; 2],
        }
        let size = std::mem::size_of::<Newer>();
        let newer = Newer { args: AttnAdditiveArgs { struct_size: size, ..a }, more: [0; 2] };
        let whole = |n: &Newer| std::ptr::from_ref(n).cast::<AttnAdditiveArgs>();
        // SAFETY: `newer` holds `size` bytes; views address their buffers.
        assert_eq!(unsafe { attn_additive_attention(whole(&newer)) }, AttnStatus::Ok);
        let set = Newer { more: [0, 1], ..newer };
        // SAFETY: as above.
        let s = unsafe { attn_additive_attention(whole(&set)) };
        assert_eq!(s, AttnStatus::InvalidParameter);
        assert!(last_error().contains("args.struct_size"), "{}", last_error());
        // A misaligned struct pointer.
        let bytes = vec![0u64; size.div_ceil(8) + 1];
        let p = bytes.as_ptr().cast::<u8>().wrapping_add(4).cast::<AttnAdditiveArgs>();
        // SAFETY: refused before anything is read.
        assert_eq!(unsafe { attn_additive_attention(p) }, AttnStatus::InvalidParameter);
        assert!(last_error().contains("`args`"), "{}", last_error());
    }

    #[test]
    fn bad_operands_give_statuses_naming_them() {
        let mut b = Bufs::new();
        let base = b.args();
        let w_ptr = b.w.as_ptr();
        let nan_w = [f32::NAN; DA];
        let bad_kind = AttnMask { kind: 7, ..none_mask() };
        let cases: Vec<(AttnAdditiveArgs, AttnStatus, &str)> = vec![
            (AttnAdditiveArgs { w: null(), ..base }, AttnStatus::NullPointer, "`w`"),
            (AttnAdditiveArgs { w_len: DA - 1, ..base }, AttnStatus::ShapeMismatch, "w"),
            (
                AttnAdditiveArgs { wq: AttnMat { data: null(), ..base.wq }, ..base },
                AttnStatus::NullPointer,
                "`wq`",
            ),
            (
                AttnAdditiveArgs { q: AttnTensor { data: null(), ..base.q }, ..base },
                AttnStatus::NullPointer,
                "`q`",
            ),
            (
                AttnAdditiveArgs { wk: AttnMat { rows: 3, ..base.wk }, ..base },
                AttnStatus::ShapeMismatch,
                "wk",
            ),
            (
                AttnAdditiveArgs { wq: AttnMat { cols: DA - 1, ..base.wq }, ..base },
                AttnStatus::ShapeMismatch,
                "wk",
            ),
            (
                AttnAdditiveArgs { v: AttnTensor { dims: [1, 1, 8, 3], ..base.v }, ..base },
                AttnStatus::ShapeMismatch,
                "v",
            ),
            (AttnAdditiveArgs { lse_len: 9, ..base }, AttnStatus::ShapeMismatch, "lse"),
            (AttnAdditiveArgs { w: nan_w.as_ptr(), ..base }, AttnStatus::NonFinite, "w"),
            (
                AttnAdditiveArgs { k: AttnTensor { dims: [1, 3, 9, 4], ..base.k }, ..base },
                AttnStatus::KvHeadsNotDividing,
                "",
            ),
            (
                AttnAdditiveArgs { mask: &bad_kind, ..base },
                AttnStatus::InvalidParameter,
                "mask.kind",
            ),
            // The output over an input: refused before anything is read or written.
            (
                AttnAdditiveArgs {
                    o: AttnTensorMut {
                        data: w_ptr.cast_mut().cast(),
                        dims: [1, 1, 1, 1],
                        ..base.o
                    },
                    ..base
                },
                AttnStatus::AliasedOutput,
                "`o` overlaps argument `w`",
            ),
        ];
        for (i, (a, status, arg)) in cases.into_iter().enumerate() {
            let before = b.o.clone();
            assert_eq!(run(&a), status, "case {i}: {}", last_error());
            assert!(last_error().contains(arg), "case {i}: {}", last_error());
            // Nothing written (compare bits: the buffer starts as NaN).
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&b.o), bits(&before), "case {i}");
        }
        // `w` may be NULL when the hidden width is 0 (every score 0: a plain average of V).
        let empty: [f32; 0] = [];
        let a = AttnAdditiveArgs {
            wq: mat(&empty, 6, 0, 0, 1, 0),
            wk: mat(&empty, 4, 0, 0, 1, 0),
            w: null(),
            w_len: 0,
            ..base
        };
        assert_eq!(run(&a), AttnStatus::Ok, "{}", last_error());
        for (h, row) in b.o.chunks_exact(3).enumerate() {
            for (d, &x) in row.iter().enumerate() {
                let mean = (0..9).map(|j| b.v[j * 3 + d]).sum::<f32>() / 9.0;
                assert!((x - mean).abs() <= 1e-6, "row {h} col {d}: {x} vs {mean}");
            }
        }
    }

    /// A mask of kind none, every pointer null.
    fn none_mask() -> AttnMask {
        AttnMask {
            kind: 0,
            causal_default_offset: 0,
            causal_offset: 0,
            keep: null(),
            bias: null(),
            dims: [0; 4],
            strides: [0; 4],
            offset: 0,
        }
    }
}
