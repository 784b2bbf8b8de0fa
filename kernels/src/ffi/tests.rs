//! The boundary's own checks, called from Rust the way C calls them: out-of-range enum and bool
//! values, status names for any integer, statuses and messages that name the real fault, and
//! the fused QKV projection (GEMM calls counted on this thread).

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use super::*;
use crate::layers::kernel_calls::GEMM_CALLS;

pub(super) fn last_error() -> String {
    let mut buf = vec![0 as c_char; 512];
    // SAFETY: `buf` holds 512 writable bytes.
    unsafe { attn_last_error_message(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: the function NUL-terminates within `cap`.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

fn name(status: i32) -> String {
    // SAFETY: the function returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(attn_status_name(status)) }.to_string_lossy().into_owned()
}

pub(super) fn mat(
    data: &[f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
    offset: usize,
) -> AttnMat {
    AttnMat { data: data.as_ptr().cast(), rows, cols, row_stride: rs, col_stride: cs, offset }
}

fn mat_mut(data: &mut [f32], rows: usize, cols: usize) -> AttnMatMut {
    AttnMatMut {
        data: data.as_mut_ptr().cast(),
        rows,
        cols,
        row_stride: cols,
        col_stride: 1,
        offset: 0,
    }
}

/// A contiguous `[b, h, s, d]` view.
pub(super) fn tensor(data: &[f32], dims: [usize; 4]) -> AttnTensor {
    let strides = [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1];
    AttnTensor { data: data.as_ptr().cast(), dims, strides, offset: 0 }
}

pub(super) fn tensor_mut(data: &mut [f32], dims: [usize; 4]) -> AttnTensorMut {
    let strides = [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1];
    AttnTensorMut { data: data.as_mut_ptr().cast(), dims, strides, offset: 0 }
}

fn no_mask() -> AttnMask {
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

#[test]
fn status_names_for_every_integer() {
    let all = [
        (AttnStatus::Ok, "ATTN_STATUS_OK"),
        (AttnStatus::ShapeMismatch, "ATTN_STATUS_SHAPE_MISMATCH"),
        (AttnStatus::OutOfBounds, "ATTN_STATUS_OUT_OF_BOUNDS"),
        (AttnStatus::IndexOverflow, "ATTN_STATUS_INDEX_OVERFLOW"),
        (AttnStatus::AliasedOutput, "ATTN_STATUS_ALIASED_OUTPUT"),
        (AttnStatus::ZeroHeads, "ATTN_STATUS_ZERO_HEADS"),
        (AttnStatus::HeadsNotDivisible, "ATTN_STATUS_HEADS_NOT_DIVISIBLE"),
        (AttnStatus::KvHeadsNotDividing, "ATTN_STATUS_KV_HEADS_NOT_DIVIDING"),
        (AttnStatus::NonFinite, "ATTN_STATUS_NON_FINITE"),
        (AttnStatus::InvalidParameter, "ATTN_STATUS_INVALID_PARAMETER"),
        (AttnStatus::NullPointer, "ATTN_STATUS_NULL_POINTER"),
        (AttnStatus::Panic, "ATTN_STATUS_PANIC"),
        (AttnStatus::UnsupportedDtype, "ATTN_STATUS_UNSUPPORTED_DTYPE"),
    ];
    for (s, want) in all {
        assert_eq!(name(s as i32), want);
    }
    for bad in [13, 14, -1, 1000, i32::MIN, i32::MAX] {
        assert_eq!(name(bad), "unknown status", "{bad}");
    }
}

/// Softmax of one `[1, 1, 2, 3]` tensor under `mask`.
fn softmax_with(mask: &AttnMask) -> AttnStatus {
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let mut y = [0.0f32; 6];
    // SAFETY: views address their buffers; the mask's pointers address its view.
    unsafe {
        attn_softmax(
            tensor(&x, [1, 1, 2, 3]),
            1.0,
            mask,
            tensor_mut(&mut y, [1, 1, 2, 3]),
            null_mut(),
            0,
            1,
        )
    }
}

#[test]
fn out_of_range_mask_fields_are_refused() {
    for kind in [4, 7, 9, -1, i32::MAX] {
        let m = AttnMask { kind, ..no_mask() };
        assert_eq!(softmax_with(&m), AttnStatus::InvalidParameter, "kind {kind}");
        let msg = last_error();
        assert!(msg.contains("mask.kind") && msg.contains(&kind.to_string()), "{msg}");
    }
    let causal =
        |d| AttnMask { kind: AttnMaskKind::Causal as i32, causal_default_offset: d, ..no_mask() };
    assert_eq!(softmax_with(&causal(1)), AttnStatus::Ok);
    assert_eq!(softmax_with(&causal(0)), AttnStatus::Ok);
    assert_eq!(softmax_with(&causal(2)), AttnStatus::InvalidParameter);
    assert!(last_error().contains("mask.causal_default_offset"), "{}", last_error());
    // Keep bytes: 0/1 accepted, anything else refused, also in a gap between strided elements.
    let keep_mask = |keep: &[u8], strides| AttnMask {
        kind: AttnMaskKind::Keep as i32,
        keep: keep.as_ptr(),
        dims: [1, 1, 2, 3],
        strides,
        ..no_mask()
    };
    assert_eq!(softmax_with(&keep_mask(&[1, 0, 1, 1, 1, 0], [6, 6, 3, 1])), AttnStatus::Ok);
    assert_eq!(
        softmax_with(&keep_mask(&[1, 0, 2, 1, 1, 0], [6, 6, 3, 1])),
        AttnStatus::InvalidParameter
    );
    assert!(
        last_error().contains("mask.keep") && last_error().contains("got 2"),
        "{}",
        last_error()
    );
    let gap = [1, 1, 1, 255, 1, 1, 1];
    assert_eq!(softmax_with(&keep_mask(&gap, [7, 7, 4, 1])), AttnStatus::InvalidParameter);
    // The same bytes without the bad one in reach are fine.
    assert_eq!(softmax_with(&keep_mask(&gap[4..], [3, 3, 0, 1])), AttnStatus::Ok);
}

/// A small MHA shape: in_dim 8, two heads of 4.
const CFG: AttnMhaConfig =
    AttnMhaConfig { in_dim: 8, kv_in_dim: 8, k_dim: 4, v_dim: 4, num_heads: 2, kv_heads: 2 };

fn vals(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 97) as f32 / 97.0 - 0.5)
        .collect()
}

#[test]
fn encoder_activation_is_validated() {
    let cfg = |activation| AttnEncoderConfig { attn: CFG, ff_dim: 16, activation, eps: 1e-5 };
    let mut len = 0usize;
    for good in [AttnActivation::Relu as i32, AttnActivation::GeluTanh as i32] {
        // SAFETY: valid pointers.
        let s = unsafe { attn_encoder_workspace_len(&cfg(good), 1, 3, &mut len) };
        assert_eq!(s, AttnStatus::Ok);
    }
    for bad in [2, 5, -1] {
        // SAFETY: valid pointers.
        let s = unsafe { attn_encoder_workspace_len(&cfg(bad), 1, 3, &mut len) };
        assert_eq!(s, AttnStatus::InvalidParameter, "{bad}");
        assert!(last_error().contains("cfg.activation"), "{}", last_error());
        // The forward call refuses it before reading any weight (all null here).
        let w = AttnEncoderWeights {
            attn: AttnMhaWeights {
                wq: mat(&[], 0, 0, 0, 0, 0),
                wk: mat(&[], 0, 0, 0, 0, 0),
                wv: mat(&[], 0, 0, 0, 0, 0),
                wo: mat(&[], 0, 0, 0, 0, 0),
                bq: null(),
                bk: null(),
                bv: null(),
                bo: null(),
            },
            norm1_gamma: null(),
            norm1_beta: null(),
            w1: mat(&[], 0, 0, 0, 0, 0),
            b1: null(),
            w2: mat(&[], 0, 0, 0, 0, 0),
            b2: null(),
            norm2_gamma: null(),
            norm2_beta: null(),
        };
        let x = vals(3 * 8, 1);
        let mut y = vec![0.0; 3 * 8];
        // SAFETY: views address their buffers.
        let s = unsafe {
            attn_encoder_forward(
                &cfg(bad),
                &w,
                tensor(&x, [1, 1, 3, 8]),
                null(),
                tensor_mut(&mut y, [1, 1, 3, 8]),
                null_mut(),
                0,
                1,
            )
        };
        assert_eq!(s, AttnStatus::InvalidParameter, "{bad}");
        assert!(last_error().contains("cfg.activation"), "{}", last_error());
    }
}

#[test]
fn aliasing_names_both_arguments() {
    let a = vals(16, 2);
    let b = vals(16, 3);
    let mut c = vec![0.0f32; 16];
    // C overlapping B (B read from C's own buffer).
    let cm = mat_mut(&mut c, 4, 4);
    // SAFETY: views address their buffers (the overlap is refused before any slice is made).
    let s = unsafe {
        attn_sgemm(
            1.0,
            mat(&a, 4, 4, 4, 1, 0),
            AttnMat { data: cm.data, ..mat(&b, 4, 4, 4, 1, 0) },
            0.0,
            cm,
            1,
        )
    };
    assert_eq!(s, AttnStatus::AliasedOutput);
    let msg = last_error();
    assert!(msg.contains("`c` overlaps argument `b`"), "{msg}");
    assert!(!msg.contains("zero stride"), "{msg}");
    // A zero stride in the output is still the Rust API's message.
    // SAFETY: as above.
    let s = unsafe {
        attn_sgemm(
            1.0,
            mat(&a, 4, 4, 4, 1, 0),
            mat(&b, 4, 4, 4, 1, 0),
            0.0,
            AttnMatMut { row_stride: 0, ..mat_mut(&mut c, 4, 4) },
            1,
        )
    };
    assert_eq!(s, AttnStatus::AliasedOutput);
    assert!(last_error().contains("zero stride"), "{}", last_error());
    // lse inside o.
    let q = vals(2 * 4, 4);
    let k = vals(3 * 4, 5);
    let v = vals(3 * 4, 6);
    let mut o = vec![0.0f32; 2 * 4];
    let lse = o.as_mut_ptr();
    // SAFETY: as above.
    let s = unsafe {
        attn_attention(
            tensor(&q, [1, 1, 2, 4]),
            tensor(&k, [1, 1, 3, 4]),
            tensor(&v, [1, 1, 3, 4]),
            0.5,
            null(),
            tensor_mut(&mut o, [1, 1, 2, 4]),
            lse,
            2,
            1,
        )
    };
    assert_eq!(s, AttnStatus::AliasedOutput);
    assert!(last_error().contains("`o` overlaps argument `lse`"), "{}", last_error());
}

#[test]
fn in_place_softmax_equals_out_of_place() {
    let x = vals(2 * 3 * 5, 7);
    let mut y = vec![0.0f32; x.len()];
    let mut lse_a = [0.0f32; 6];
    let mut lse_b = [0.0f32; 6];
    let dims = [1, 2, 3, 5];
    // SAFETY: views address their buffers.
    let s = unsafe {
        attn_softmax(
            tensor(&x, dims),
            0.7,
            null(),
            tensor_mut(&mut y, dims),
            lse_a.as_mut_ptr(),
            6,
            1,
        )
    };
    assert_eq!(s, AttnStatus::Ok);
    let mut z = x.clone();
    let zm = tensor_mut(&mut z, dims);
    // SAFETY: x and y are the same view: the in-place path.
    let s = unsafe {
        attn_softmax(
            AttnTensor { data: zm.data, ..tensor(&x, dims) },
            0.7,
            null(),
            zm,
            lse_b.as_mut_ptr(),
            6,
            1,
        )
    };
    assert_eq!(s, AttnStatus::Ok, "{}", last_error());
    assert!(y.iter().zip(&z).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert_eq!(lse_a.map(f32::to_bits), lse_b.map(f32::to_bits));
    // A partial overlap is refused, naming both.
    let mut w = x.clone();
    let wm = tensor_mut(&mut w, [1, 1, 1, 5]);
    let shifted =
        AttnTensor { data: wm.data.wrapping_add(1).cast_const(), ..tensor(&x, [1, 1, 1, 5]) };
    // SAFETY: refused before any slice is made.
    let s = unsafe { attn_softmax(shifted, 1.0, null(), wm, null_mut(), 0, 1) };
    assert_eq!(s, AttnStatus::AliasedOutput);
    assert!(last_error().contains("`y` overlaps argument `x`"), "{}", last_error());
}

#[test]
fn null_spans_do_not_overlap_and_huge_views_overflow() {
    let (wq, wk, wv, wo) = (vals(64, 1), vals(64, 2), vals(64, 3), vals(64, 4));
    let w = AttnMhaWeights {
        wq: mat(&wq, 8, 8, 8, 1, 0),
        wk: mat(&wk, 8, 8, 8, 1, 0),
        wv: mat(&wv, 8, 8, 8, 1, 0),
        wo: mat(&wo, 8, 8, 8, 1, 0),
        bq: null(),
        bk: null(),
        bv: null(),
        bo: null(),
    };
    let x = vals(3 * 8, 5);
    let mut y = vec![0.0; 3 * 8];
    // SAFETY: views address their buffers; the workspace is null (refused).
    let s = unsafe {
        attn_mha_forward(
            &CFG,
            &w,
            tensor(&x, [1, 1, 3, 8]),
            null(),
            tensor_mut(&mut y, [1, 1, 3, 8]),
            null_mut(),
            100,
            1,
        )
    };
    assert_eq!(s, AttnStatus::NullPointer, "{}", last_error());
    assert!(last_error().contains("workspace"), "{}", last_error());
    // An SGEMM C view of 2^62 elements: no buffer is that large.
    let a = vals(4, 1);
    let huge = AttnMatMut {
        data: y.as_mut_ptr().cast(),
        rows: 1 << 31,
        cols: 1 << 31,
        row_stride: 1 << 31,
        col_stride: 1,
        offset: 0,
    };
    // SAFETY: refused before any slice is made.
    let s = unsafe {
        attn_sgemm(1.0, mat(&a, 1 << 31, 0, 0, 1, 0), mat(&a, 0, 1 << 31, 1, 1, 0), 0.0, huge, 1)
    };
    assert_eq!(s, AttnStatus::IndexOverflow, "{}", last_error());
    assert!(last_error().contains("`c`"), "{}", last_error());
}

/// Runs `attn_mha_forward` (or, with `x2`, the cross-attention) on the weights and counts the
/// GEMM calls it makes on this thread.
fn count_gemms(w: &AttnMhaWeights, cross: bool) -> (usize, Vec<f32>) {
    let x = vals(5 * 8, 9);
    let x2 = vals(4 * 8, 10);
    let mut y = vec![0.0; 5 * 8];
    GEMM_CALLS.with(|n| n.set(0));
    // SAFETY: views address their buffers.
    let s = unsafe {
        let (tx, ty) = (tensor(&x, [1, 1, 5, 8]), tensor_mut(&mut y, [1, 1, 5, 8]));
        if cross {
            attn_cross_attention_forward(
                &CFG,
                w,
                tx,
                tensor(&x2, [1, 1, 4, 8]),
                null(),
                ty,
                null_mut(),
                0,
                1,
            )
        } else {
            attn_mha_forward(&CFG, w, tx, null(), ty, null_mut(), 0, 1)
        }
    };
    assert_eq!(s, AttnStatus::Ok, "{}", last_error());
    (GEMM_CALLS.with(|n| n.get()), y)
}

#[test]
fn adjacent_qkv_blocks_run_as_one_gemm_through_c() {
    // One [8, 24] row-major buffer holding wq | wk | wv, plus biases [24].
    let wqkv = vals(8 * 24, 11);
    let wo = vals(64, 12);
    let bqkv = vals(24, 13);
    let bo = vals(8, 14);
    let sep: Vec<Vec<f32>> = (0..3)
        .map(|c| (0..8).flat_map(|r| wqkv[r * 24 + c * 8..][..8].to_vec()).collect())
        .collect();
    let weights = |wq, wk, wv| AttnMhaWeights {
        wq,
        wk,
        wv,
        wo: mat(&wo, 8, 8, 8, 1, 0),
        bq: bqkv.as_ptr().cast(),
        bk: bqkv[8..].as_ptr().cast(),
        bv: bqkv[16..].as_ptr().cast(),
        bo: bo.as_ptr().cast(),
    };
    let separate = weights(
        mat(&sep[0], 8, 8, 8, 1, 0),
        mat(&sep[1], 8, 8, 8, 1, 0),
        mat(&sep[2], 8, 8, 8, 1, 0),
    );
    let (n, want) = count_gemms(&separate, false);
    assert_eq!(n, 4, "three projections and the output");
    // Same data pointer, offsets select the blocks.
    let same = weights(
        mat(&wqkv, 8, 8, 24, 1, 0),
        mat(&wqkv, 8, 8, 24, 1, 8),
        mat(&wqkv, 8, 8, 24, 1, 16),
    );
    // Pointers to each block (overlapping byte ranges: one buffer).
    let moved = weights(
        mat(&wqkv, 8, 8, 24, 1, 0),
        mat(&wqkv[8..], 8, 8, 24, 1, 0),
        mat(&wqkv[16..], 8, 8, 24, 1, 0),
    );
    // PyTorch's in_proj_weight [24, 8] row-major, read as W = in_proj_weightᵀ (column-major
    // [8, 24]): the blocks follow each other without overlapping, same data pointer.
    let mut torch = vec![0.0; 24 * 8];
    for r in 0..8 {
        for c in 0..24 {
            torch[c * 8 + r] = wqkv[r * 24 + c];
        }
    }
    let col = weights(
        mat(&torch, 8, 8, 1, 8, 0),
        mat(&torch, 8, 8, 1, 8, 64),
        mat(&torch, 8, 8, 1, 8, 128),
    );
    for (what, w) in [("same data", same), ("moved data", moved), ("column-major", col)] {
        let (n, got) = count_gemms(&w, false);
        assert_eq!(n, 2, "{what}: one QKV GEMM and the output");
        for (g, e) in got.iter().zip(&want) {
            assert!((g - e).abs() <= 1e-5 * (1.0 + e.abs()), "{what}: {g} vs {e}");
        }
    }
    // Column-major blocks at different pointers only touch: not known to be one buffer.
    let touching = weights(
        mat(&torch, 8, 8, 1, 8, 0),
        mat(&torch[64..], 8, 8, 1, 8, 0),
        mat(&torch[128..], 8, 8, 1, 8, 0),
    );
    assert_eq!(count_gemms(&touching, false).0, 4);
    // Cross-attention: wk | wv adjacent make one K/V GEMM (Q, KV, output).
    assert_eq!(count_gemms(&same, true).0, 3);
    assert_eq!(count_gemms(&separate, true).0, 4);
}

/// `AttnAttentionArgs` over `q: [1, 2, nq, 8]`, `k`, `v: [1, 1, 11, 8]` (GQA) with the output
/// and logsumexp buffers given; every setting zero but `struct_size`.
fn args(
    (q, k, v): (&[f32], &[f32], &[f32]),
    nq: usize,
    o: &mut [f32],
    lse: &mut [f32],
) -> AttnAttentionArgs {
    AttnAttentionArgs {
        struct_size: std::mem::size_of::<AttnAttentionArgs>(),
        q: tensor(q, [1, 2, nq, 8]),
        k: tensor(k, [1, 1, 11, 8]),
        v: tensor(v, [1, 1, 11, 8]),
        o: tensor_mut(o, [1, 2, nq, 8]),
        mask: null(),
        scale: 0.0,
        has_scale: 0,
        path: 0,
        lse: lse.as_mut_ptr(),
        lse_len: lse.len(),
        threads: 0,
        has_window: 0,
        window_left: 0,
        window_right: 0,
        softcap: 0.0,
        sinks: null(),
        alibi: null(),
        q_dtype: 0,
        k_dtype: 0,
        v_dtype: 0,
        o_dtype: 0,
        k_scales: AttnTensor::EMPTY,
        v_scales: AttnTensor::EMPTY,
        half_path: 0,
    }
}

#[test]
fn attention_args_first_version_size() {
    // Fixed for good: a caller built against this header passes at least this much.
    assert_eq!(ATTENTION_ARGS_MIN_SIZE, std::mem::offset_of!(AttnAttentionArgs, has_window));
    #[cfg(target_pointer_width = "64")]
    assert_eq!(ATTENTION_ARGS_MIN_SIZE, 376);
}

#[test]
fn attention_args_struct_size_is_checked() {
    let (q, k, v) = (vals(2 * 3 * 8, 1), vals(11 * 8, 2), vals(11 * 8, 3));
    let (mut o, mut lse) = (vec![0.0f32; 2 * 3 * 8], vec![0.0f32; 2 * 3]);
    let a = args((&q, &k, &v), 3, &mut o, &mut lse);
    // SAFETY: `a` is a whole struct; its views address their buffers.
    assert_eq!(unsafe { attn_attention_run(&a) }, AttnStatus::Ok, "{}", last_error());
    // SAFETY: null is refused.
    assert_eq!(unsafe { attn_attention_run(null()) }, AttnStatus::NullPointer);
    assert!(last_error().contains("`args`"), "{}", last_error());
    let between = std::mem::size_of::<AttnAttentionArgs>() - 1;
    for size in [0, 8, ATTENTION_ARGS_MIN_SIZE - 1, between, raw::MAX_STRUCT_SIZE + 1, usize::MAX] {
        let small = AttnAttentionArgs { struct_size: size, ..a };
        // SAFETY: refused before any field past `struct_size` is read (and the struct is whole).
        let s = unsafe { attn_attention_run(&small) };
        assert_eq!(s, AttnStatus::InvalidParameter, "size {size}");
        assert!(last_error().contains("args.struct_size"), "{}", last_error());
    }
    // A newer caller's larger struct: fine while the bytes this library does not know are
    // zero, refused when one of them is set (a setting it would ignore).
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Newer {
        args: AttnAttentionArgs,
        more: [u64; 3],
    }
    let size = std::mem::size_of::<Newer>();
    let newer = Newer { args: AttnAttentionArgs { struct_size: size, ..a }, more: [0; 3] };
    // A pointer to the whole `Newer` (one to its `args` field may not read past that field).
    let whole = |n: &Newer| std::ptr::from_ref(n).cast::<AttnAttentionArgs>();
    // SAFETY: `newer` holds `size` bytes; views address their buffers.
    let s = unsafe { attn_attention_run(whole(&newer)) };
    assert_eq!(s, AttnStatus::Ok, "{}", last_error());
    let set = Newer { more: [0, 1, 0], ..newer };
    // SAFETY: as above.
    assert_eq!(unsafe { attn_attention_run(whole(&set)) }, AttnStatus::InvalidParameter);
    assert!(last_error().contains("args.struct_size"), "{}", last_error());
    // A misaligned struct pointer.
    let mut bytes = vec![0u64; size.div_ceil(8) + 1];
    let p = bytes.as_mut_ptr().cast::<u8>().wrapping_add(4).cast::<AttnAttentionArgs>();
    // SAFETY: refused before anything is read.
    assert_eq!(unsafe { attn_attention_run(p) }, AttnStatus::InvalidParameter);
    assert!(last_error().contains("`args`"), "{}", last_error());
}

#[test]
fn attention_args_enum_and_bool_fields_are_validated() {
    let (q, k, v) = (vals(2 * 3 * 8, 1), vals(11 * 8, 2), vals(11 * 8, 3));
    let (mut o, mut lse) = (vec![0.0f32; 2 * 3 * 8], vec![0.0f32; 2 * 3]);
    let a = args((&q, &k, &v), 3, &mut o, &mut lse);
    for path in [0, 1, 2, 3] {
        let good = AttnAttentionArgs { path, ..a };
        // SAFETY: views address their buffers.
        assert_eq!(unsafe { attn_attention_run(&good) }, AttnStatus::Ok, "path {path}");
    }
    for path in [4, 7, -1, i32::MIN, i32::MAX] {
        let bad = AttnAttentionArgs { path, ..a };
        // SAFETY: as above.
        assert_eq!(unsafe { attn_attention_run(&bad) }, AttnStatus::InvalidParameter);
        let msg = last_error();
        assert!(msg.contains("args.path") && msg.contains(&path.to_string()), "{msg}");
    }
    for has_scale in [2, 255] {
        let bad = AttnAttentionArgs { has_scale, scale: 0.5, ..a };
        // SAFETY: as above.
        assert_eq!(unsafe { attn_attention_run(&bad) }, AttnStatus::InvalidParameter);
        assert!(last_error().contains("args.has_scale"), "{}", last_error());
    }
    // The scale is checked only when it is used.
    let unused = AttnAttentionArgs { scale: f32::NAN, ..a };
    // SAFETY: as above.
    assert_eq!(unsafe { attn_attention_run(&unused) }, AttnStatus::Ok);
    let used = AttnAttentionArgs { has_scale: 1, ..unused };
    // SAFETY: as above.
    assert_eq!(unsafe { attn_attention_run(&used) }, AttnStatus::NonFinite);
    assert!(last_error().contains("scale"), "{}", last_error());
}

/// `attn_attention_run` gives the bits of `attn_attention` / `attn_decode` for the same
/// operands (auto and decode paths, flash and decode sizes, a causal mask, logsumexps), the
/// default scale is `1/√dk`, and every path agrees with the Rust `Attention` on that path.
#[test]
fn attention_run_equals_the_positional_entry_points() {
    type Positional = unsafe extern "C" fn(
        AttnTensor,
        AttnTensor,
        AttnTensor,
        f32,
        *const AttnMask,
        AttnTensorMut,
        *mut f32,
        usize,
        usize,
    ) -> AttnStatus;
    let causal =
        AttnMask { kind: AttnMaskKind::Causal as i32, causal_default_offset: 1, ..no_mask() };
    let (k, v) = (vals(11 * 8, 2), vals(11 * 8, 3));
    for nq in [3, 20] {
        let q = vals(2 * nq * 8, 1);
        let run = |f: &dyn Fn(&mut [f32], &mut [f32]) -> AttnStatus| {
            let (mut o, mut lse) = (vec![f32::NAN; 2 * nq * 8], vec![f32::NAN; 2 * nq]);
            assert_eq!(f(&mut o, &mut lse), AttnStatus::Ok, "{}", last_error());
            o.extend(lse);
            o.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
        };
        let cases: [(i32, Positional); 2] =
            [(AttnPath::Auto as i32, attn_attention), (AttnPath::Decode as i32, attn_decode)];
        for (path, positional) in cases {
            for threads in [1, 2] {
                let scale = 1.0 / 8f32.sqrt();
                let old = run(&|o, lse| {
                    // SAFETY: views address their buffers.
                    unsafe {
                        positional(
                            tensor(&q, [1, 2, nq, 8]),
                            tensor(&k, [1, 1, 11, 8]),
                            tensor(&v, [1, 1, 11, 8]),
                            scale,
                            &causal,
                            tensor_mut(o, [1, 2, nq, 8]),
                            lse.as_mut_ptr(),
                            lse.len(),
                            threads,
                        )
                    }
                });
                let new = run(&|o, lse| {
                    let a = args((&q, &k, &v), nq, o, lse);
                    let a = AttnAttentionArgs { mask: &causal, path, threads, ..a };
                    // SAFETY: as above; the default scale is `1/√8`, computed in f64.
                    unsafe { attn_attention_run(&a) }
                });
                assert!(old == new, "nq {nq}, path {path}, {threads} threads");
                let explicit = run(&|o, lse| {
                    let a = args((&q, &k, &v), nq, o, lse);
                    let a = AttnAttentionArgs {
                        mask: &causal,
                        path,
                        threads,
                        scale,
                        has_scale: 1,
                        ..a
                    };
                    // SAFETY: as above.
                    unsafe { attn_attention_run(&a) }
                });
                assert!(old == explicit, "nq {nq}, path {path}, {threads} threads");
            }
        }
        for (path, rust) in [(1, Path::Flash), (2, Path::Decode), (3, Path::Unfused)] {
            let c = run(&|o, lse| {
                let a = AttnAttentionArgs { mask: &causal, path, ..args((&q, &k, &v), nq, o, lse) };
                // SAFETY: as above.
                unsafe { attn_attention_run(&a) }
            });
            let r = run(&|o, lse| {
                let ql = Tensor4Layout::bhsd(1, 2, nq, 8);
                let kl = Tensor4Layout::bhsd(1, 1, 11, 8);
                let p = Attention::new(
                    TensorRef::new(&q, ql),
                    TensorRef::new(&k, kl),
                    TensorRef::new(&v, kl),
                );
                let p = p.mask(Mask::CAUSAL).lse(lse).parallelism(Parallelism::threads(0));
                match p.path(rust).run(TensorMut::new(o, ql)) {
                    Ok(()) => AttnStatus::Ok,
                    Err(e) => AttnStatus::of(&e),
                }
            });
            assert!(c == r, "nq {nq}, path {path}");
        }
    }
}

/// Version 2 of `AttnAttentionArgs`: the variants give the bits of the Rust `Attention` with the
/// same variants on every path; a caller of the first version (`struct_size` 376) gets plain
/// attention whatever the bytes past it hold; bad values are refused by name.
#[test]
fn attention_args_variants() {
    let (k, v) = (vals(11 * 8, 2), vals(11 * 8, 3));
    let nq = 5;
    let q = vals(2 * nq * 8, 1);
    let (sinks, slopes) = ([0.5f32, -1.0], [0.25f32, 0.125]);
    let run = |f: &dyn Fn(&mut [f32], &mut [f32]) -> AttnStatus| {
        let (mut o, mut lse) = (vec![f32::NAN; 2 * nq * 8], vec![f32::NAN; 2 * nq]);
        assert_eq!(f(&mut o, &mut lse), AttnStatus::Ok, "{}", last_error());
        o.extend(lse);
        o.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
    };
    let with_variants = |a: AttnAttentionArgs| AttnAttentionArgs {
        has_window: 1,
        window_left: 3,
        window_right: 1,
        softcap: 2.0,
        sinks: sinks.as_ptr(),
        alibi: slopes.as_ptr(),
        ..a
    };
    let rust = |o: &mut [f32], lse: &mut [f32], path: Path, variants: bool| {
        let ql = Tensor4Layout::bhsd(1, 2, nq, 8);
        let kl = Tensor4Layout::bhsd(1, 1, 11, 8);
        let mut p =
            Attention::new(TensorRef::new(&q, ql), TensorRef::new(&k, kl), TensorRef::new(&v, kl))
                .lse(lse)
                .path(path)
                .parallelism(Parallelism::threads(0));
        if variants {
            p = p.window(3, 1).softcap(2.0).sinks(&sinks).alibi(&slopes);
        }
        match p.run(TensorMut::new(o, ql)) {
            Ok(()) => AttnStatus::Ok,
            Err(e) => AttnStatus::of(&e),
        }
    };
    for (path, rpath) in [(1, Path::Flash), (2, Path::Decode), (3, Path::Unfused)] {
        let c = run(&|o, lse| {
            let a = with_variants(AttnAttentionArgs { path, ..args((&q, &k, &v), nq, o, lse) });
            // SAFETY: views address their buffers, sinks and slopes 2 floats each.
            unsafe { attn_attention_run(&a) }
        });
        assert!(c == run(&|o, lse| rust(o, lse, rpath, true)), "path {path}");
        // A first-version caller: the variant fields are past its struct and are not read.
        let old = run(&|o, lse| {
            let a = with_variants(AttnAttentionArgs { path, ..args((&q, &k, &v), nq, o, lse) });
            let a = AttnAttentionArgs { struct_size: ATTENTION_ARGS_MIN_SIZE, ..a };
            // SAFETY: as above (the struct is whole; only its first 376 bytes are read).
            unsafe { attn_attention_run(&a) }
        });
        assert!(old == run(&|o, lse| rust(o, lse, rpath, false)), "path {path}");
        assert!(old != c, "the variants change the result");
    }
    let (mut o, mut lse) = (vec![0.0f32; 2 * nq * 8], vec![0.0f32; 2 * nq]);
    let a = args((&q, &k, &v), nq, &mut o, &mut lse);
    let nan = [f32::NAN, 0.0];
    let bad: [(AttnAttentionArgs, AttnStatus, &str); 5] = [
        (AttnAttentionArgs { has_window: 2, ..a }, AttnStatus::InvalidParameter, "args.has_window"),
        (AttnAttentionArgs { softcap: -1.0, ..a }, AttnStatus::InvalidParameter, "softcap"),
        (AttnAttentionArgs { softcap: f32::NAN, ..a }, AttnStatus::NonFinite, "softcap"),
        (AttnAttentionArgs { sinks: nan.as_ptr(), ..a }, AttnStatus::NonFinite, "sinks"),
        (AttnAttentionArgs { alibi: nan.as_ptr(), ..a }, AttnStatus::NonFinite, "alibi"),
    ];
    for (args, status, name) in bad {
        // SAFETY: views address their buffers, the per-head arrays 2 floats.
        assert_eq!(unsafe { attn_attention_run(&args) }, status, "{name}");
        assert!(last_error().contains(name), "{name}: {}", last_error());
    }
}

#[test]
fn variants_struct_first_version_size() {
    // Fixed for good: a caller built against this header passes at least this much.
    assert_eq!(VARIANTS_MIN_SIZE, std::mem::size_of::<AttnVariants>());
    #[cfg(target_pointer_width = "64")]
    assert_eq!(VARIANTS_MIN_SIZE, 56);
}

/// Owned operands of the layer tests: a `CFG` self-attention layer (also an encoder block of
/// feed-forward width 12, and cross-attention from a width-8 `x2` of 4 rows) on 5 rows, of
/// elements `T`.
struct LayerData<T = f32> {
    w: Vec<Vec<T>>,
    x: Vec<T>,
    x2: Vec<T>,
}

impl LayerData {
    fn new() -> Self {
        let sizes = [64, 64, 64, 64, 8, 8, 8, 8, 8 * 12, 12, 12 * 8, 8, 8, 8, 8, 8];
        let w = sizes.iter().enumerate().map(|(i, &n)| vals(n, 20 + i as u32)).collect();
        LayerData { w, x: vals(5 * 8, 40), x2: vals(4 * 8, 41) }
    }

    /// The same data rounded to `T`.
    fn to<T: attn_core::Element>(&self) -> LayerData<T> {
        let v = |x: &[f32]| x.iter().map(|&e| T::from_f32(e)).collect::<Vec<T>>();
        LayerData { w: self.w.iter().map(|w| v(w)).collect(), x: v(&self.x), x2: v(&self.x2) }
    }
}

/// A contiguous `[rows, cols]` view of `data`, its pointer cast as C callers cast it.
fn cmat<T>(data: &[T], rows: usize, cols: usize) -> AttnMat {
    AttnMat { data: data.as_ptr().cast(), rows, cols, row_stride: cols, col_stride: 1, offset: 0 }
}

impl<T> LayerData<T> {
    fn mha(&self) -> AttnMhaWeights {
        let w = &self.w;
        AttnMhaWeights {
            wq: cmat(&w[0], 8, 8),
            wk: cmat(&w[1], 8, 8),
            wv: cmat(&w[2], 8, 8),
            wo: cmat(&w[3], 8, 8),
            bq: w[4].as_ptr().cast(),
            bk: w[5].as_ptr().cast(),
            bv: w[6].as_ptr().cast(),
            bo: w[7].as_ptr().cast(),
        }
    }
    fn encoder(&self) -> AttnEncoderWeights {
        let w = &self.w;
        AttnEncoderWeights {
            attn: self.mha(),
            norm1_gamma: w[12].as_ptr().cast(),
            norm1_beta: w[13].as_ptr().cast(),
            w1: cmat(&w[8], 8, 12),
            b1: w[9].as_ptr().cast(),
            w2: cmat(&w[10], 12, 8),
            b2: w[11].as_ptr().cast(),
            norm2_gamma: w[14].as_ptr().cast(),
            norm2_beta: w[15].as_ptr().cast(),
        }
    }
    /// `x` (`[1, 1, 5, 8]`) and `x2` (`[1, 1, 4, 8]`) as C views.
    fn inputs(&self) -> (AttnTensor, AttnTensor) {
        let t = |x: &[T], dims| AttnTensor { data: x.as_ptr().cast(), ..tensor(&[], dims) };
        (t(&self.x, [1, 1, 5, 8]), t(&self.x2, [1, 1, 4, 8]))
    }
}

const ENC: AttnEncoderConfig =
    AttnEncoderConfig { attn: CFG, ff_dim: 12, activation: 0, eps: 1e-5 };

/// The three layers through C with `variants` (and a causal mask), as bits; the status too.
fn c_layers(d: &LayerData, variants: *const AttnVariants) -> [(AttnStatus, Vec<u32>); 3] {
    c_layers_typed(d, d, variants, null())
}

/// The three layers through the `_with_options` entry points with weights from `dw`, inputs
/// from `dx`, `variants` and `options` (and a causal mask): each status and output (of type
/// `A`, as the bits of its f32 widening, which is exact).
fn c_layers_typed<T, A: attn_core::Element>(
    dw: &LayerData<T>,
    dx: &LayerData<A>,
    variants: *const AttnVariants,
    options: *const AttnLayerOptions,
) -> [(AttnStatus, Vec<u32>); 3] {
    let causal =
        AttnMask { kind: AttnMaskKind::Causal as i32, causal_default_offset: 1, ..no_mask() };
    let run = |f: &dyn Fn(AttnTensorMut) -> AttnStatus| {
        let mut y = vec![A::from_f32(f32::NAN); 5 * 8];
        let ty = AttnTensorMut { data: y.as_mut_ptr().cast(), ..tensor_mut(&mut [], [1, 1, 5, 8]) };
        let s = f(ty);
        (s, y.iter().map(|v| v.to_f32().to_bits()).collect())
    };
    let (mw, ew) = (dw.mha(), dw.encoder());
    let (x, x2) = dx.inputs();
    let (v, o) = (variants, options);
    // SAFETY (all three): views and vectors address their buffers, of the types `options`
    // names; `variants` is null or whole with 2 floats at each non-null per-head pointer.
    [
        run(&|y| unsafe {
            attn_mha_forward_with_options(&CFG, &mw, v, o, x, &causal, y, null_mut(), 0, 1)
        }),
        run(&|y| unsafe {
            attn_cross_attention_forward_with_options(
                &CFG,
                &mw,
                v,
                o,
                x,
                x2,
                &causal,
                y,
                null_mut(),
                0,
                1,
            )
        }),
        run(&|y| unsafe {
            attn_encoder_forward_with_options(&ENC, &ew, v, o, x, &causal, y, null_mut(), 0, 1)
        }),
    ]
}

/// The same three layers through the Rust API with `variants`.
fn rust_layers(d: &LayerData, variants: Variants<'_>) -> [Vec<u32>; 3] {
    rust_layers_typed(d, d, variants)
}

/// The same three layers through the Rust API with weights from `dw`, inputs from `dx` and
/// `variants`, as [`c_layers_typed`] gives them.
fn rust_layers_typed<T, A>(
    dw: &LayerData<T>,
    dx: &LayerData<A>,
    variants: Variants<'_>,
) -> [Vec<u32>; 3]
where
    T: crate::arch::convert::Convertible,
    A: crate::arch::convert::Convertible + attn_core::Element,
{
    let (mw, ew) = (dw.mha(), dw.encoder());
    let (cfg, ecfg) = (CFG.to_rust(), ENC.to_rust().ok().expect("a valid config"));
    // SAFETY: the views address their buffers, of `T`s.
    let (mut w, mut e) = unsafe { (mw.view::<T>(&cfg).ok(), ew.view::<T>(&ecfg).ok()) };
    let (w, e) = (w.as_mut().expect("valid weights"), e.as_mut().expect("valid weights"));
    w.variants = variants;
    e.attn.variants = variants;
    let x = TensorRef::new(&dx.x, Tensor4Layout::batch_seq(1, 5, 8));
    let x2 = TensorRef::new(&dx.x2, Tensor4Layout::batch_seq(1, 4, 8));
    let run = |f: &dyn Fn(TensorMut<'_, A>) -> attn_core::Result<()>| {
        let mut y = vec![A::from_f32(f32::NAN); 5 * 8];
        f(TensorMut::new(&mut y, Tensor4Layout::batch_seq(1, 5, 8))).unwrap();
        y.iter().map(|v| v.to_f32().to_bits()).collect()
    };
    let (m, par) = (Mask::CAUSAL, Parallelism::threads(1));
    [
        run(&|y| crate::layers::multi_head_attention(&cfg, w, x, &m, y, par)),
        run(&|y| crate::layers::cross_attention(&cfg, w, x, x2, &m, y, par)),
        run(&|y| crate::layers::encoder_block(&ecfg, e, x, &m, y, par)),
    ]
}

fn c_variants(sinks: &[f32], alibi: &[f32]) -> AttnVariants {
    AttnVariants {
        struct_size: std::mem::size_of::<AttnVariants>(),
        has_window: 1,
        window_left: 2,
        window_right: 0,
        softcap: 3.0,
        sinks: sinks.as_ptr(),
        alibi: alibi.as_ptr(),
    }
}

/// The layer entry points with `AttnVariants` give the bits of the Rust layers with the same
/// `MhaWeights::variants`; NULL variants and an all-zero struct are the plain layers (and
/// the entry points without variants), which the variants do change.
#[test]
fn layer_variants_equal_the_rust_layers() {
    let d = LayerData::new();
    let (sinks, slopes) = ([0.5f32, -1.0], [0.25f32, 0.125]);
    let v = c_variants(&sinks, &slopes);
    let with = c_layers(&d, &v);
    let rust = Variants::NONE.window(2, 0).softcap(3.0).sinks(&sinks).alibi(&slopes);
    let want = rust_layers(&d, rust);
    let plain = rust_layers(&d, Variants::NONE);
    let zero = AttnVariants {
        struct_size: VARIANTS_MIN_SIZE,
        has_window: 0,
        window_left: 7,
        window_right: 7,
        softcap: 0.0,
        sinks: null(),
        alibi: null(),
    };
    let (none, zeroed) = (c_layers(&d, null()), c_layers(&d, &zero));
    for (i, name) in ["mha", "cross", "encoder"].iter().enumerate() {
        assert_eq!(with[i].0, AttnStatus::Ok, "{name}: {}", last_error());
        assert!(with[i].1 == want[i], "{name}: C and Rust differ");
        assert!(none[i].0 == AttnStatus::Ok && none[i].1 == plain[i], "{name}: NULL variants");
        assert!(zeroed[i].1 == plain[i], "{name}: all-zero variants");
        assert!(with[i].1 != plain[i], "{name}: the variants change the output");
    }
    // The entry points without variants are the plain layers.
    let (mw, ew) = (d.mha(), d.encoder());
    let causal =
        AttnMask { kind: AttnMaskKind::Causal as i32, causal_default_offset: 1, ..no_mask() };
    let mut y = vec![f32::NAN; 5 * 8];
    let (x, ty) = (tensor(&d.x, [1, 1, 5, 8]), tensor_mut(&mut y, [1, 1, 5, 8]));
    // SAFETY: views address their buffers.
    let s = unsafe { attn_mha_forward(&CFG, &mw, x, &causal, ty, null_mut(), 0, 1) };
    assert_eq!(s, AttnStatus::Ok);
    assert!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>() == plain[0]);
    let ty = tensor_mut(&mut y, [1, 1, 5, 8]);
    // SAFETY: as above.
    let s = unsafe { attn_encoder_forward(&ENC, &ew, x, &causal, ty, null_mut(), 0, 1) };
    assert_eq!(s, AttnStatus::Ok);
    assert!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>() == plain[2]);
}

/// `AttnVariants.struct_size` is checked as `AttnAttentionArgs`'s (a size that is no
/// version's, a newer struct with a setting this library does not know, a misaligned
/// pointer), and so are `has_window` and the values; every layer entry point reports the same
/// status naming the field. Sinks or slopes overlapping the output are refused by name.
#[test]
fn layer_variants_are_checked() {
    let d = LayerData::new();
    let (sinks, slopes) = ([0.5f32, -1.0], [0.25f32, 0.125]);
    let v = c_variants(&sinks, &slopes);
    let nan = [0.0, f32::NAN];
    let expect = |variants: *const AttnVariants, status: AttnStatus, name: &str| {
        for (i, (s, _)) in c_layers(&d, variants).iter().enumerate() {
            assert_eq!(*s, status, "{name} (layer {i}): {}", last_error());
            // Each call sets the message of its own failure: checked right after the last.
        }
        assert!(last_error().contains(name), "{name}: {}", last_error());
    };
    for size in [0, 8, VARIANTS_MIN_SIZE - 1, raw::MAX_STRUCT_SIZE + 1, usize::MAX] {
        let small = AttnVariants { struct_size: size, ..v };
        expect(&small, AttnStatus::InvalidParameter, "variants.struct_size");
    }
    let cases: [(AttnVariants, AttnStatus, &str); 6] = [
        (AttnVariants { has_window: 2, ..v }, AttnStatus::InvalidParameter, "variants.has_window"),
        (AttnVariants { softcap: -1.0, ..v }, AttnStatus::InvalidParameter, "softcap"),
        (AttnVariants { softcap: f32::INFINITY, ..v }, AttnStatus::NonFinite, "softcap"),
        (AttnVariants { sinks: nan.as_ptr(), ..v }, AttnStatus::NonFinite, "sinks"),
        (AttnVariants { alibi: nan.as_ptr(), ..v }, AttnStatus::NonFinite, "alibi"),
        (AttnVariants { alibi: null(), sinks: null(), ..v }, AttnStatus::Ok, ""),
    ];
    for (bad, status, name) in cases {
        expect(&bad, status, name);
    }
    // A newer caller's larger struct: fine while the bytes past this version are zero.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Newer {
        v: AttnVariants,
        more: [u64; 2],
    }
    let size = std::mem::size_of::<Newer>();
    let newer = Newer { v: AttnVariants { struct_size: size, ..v }, more: [0; 2] };
    let whole = |n: &Newer| std::ptr::from_ref(n).cast::<AttnVariants>();
    let want = c_layers(&d, &v);
    let got = c_layers(&d, whole(&newer));
    assert!(got == want, "a newer struct with zero extra bytes");
    expect(
        whole(&Newer { more: [0, 1], ..newer }),
        AttnStatus::InvalidParameter,
        "variants.struct_size",
    );
    // A misaligned pointer.
    let mut bytes = vec![0u64; size.div_ceil(8) + 1];
    let p = bytes.as_mut_ptr().cast::<u8>().wrapping_add(4).cast::<AttnVariants>();
    expect(p, AttnStatus::InvalidParameter, "`variants`");
    // Sinks inside the output: an output may share no byte with an input.
    let mw = d.mha();
    let mut y = vec![0.0f32; 5 * 8];
    let inside = AttnVariants { sinks: y[3..].as_ptr(), ..v };
    let ty = tensor_mut(&mut y, [1, 1, 5, 8]);
    let x = tensor(&d.x, [1, 1, 5, 8]);
    // SAFETY: refused before anything is written; views address their buffers.
    let s = unsafe {
        attn_mha_forward_with_variants(&CFG, &mw, &inside, x, null(), ty, null_mut(), 0, 1)
    };
    assert_eq!(s, AttnStatus::AliasedOutput);
    assert!(last_error().contains("`y`") && last_error().contains("`sinks`"), "{}", last_error());
}

#[test]
fn layer_options_first_version_size() {
    // Fixed for good: a caller built against this header passes at least this much.
    assert_eq!(LAYER_OPTIONS_MIN_SIZE, std::mem::size_of::<AttnLayerOptions>());
    #[cfg(target_pointer_width = "64")]
    assert_eq!(LAYER_OPTIONS_MIN_SIZE, 16);
}

/// The `_with_options` entry points: bf16/f16 weights and activations give the bits of the
/// Rust layers on the same typed views (mixed pairs too, with variants); NULL options, f32
/// options and the `_with_variants` entry points agree; the options are checked by name (size,
/// int8, unknown values); an activation's span counts the bytes of its type.
#[test]
fn layer_options_element_types() {
    use attn_core::{bf16, f16};
    use AttnDtype::{Bf16, F16, F32};
    let d = LayerData::new();
    let (sinks, slopes) = ([0.5f32, -1.0], [0.25f32, 0.125]);
    let v = c_variants(&sinks, &slopes);
    let rv = Variants::NONE.window(2, 0).softcap(3.0).sinks(&sinks).alibi(&slopes);
    let opts = |w: AttnDtype, a: AttnDtype| AttnLayerOptions {
        struct_size: LAYER_OPTIONS_MIN_SIZE,
        weights_dtype: w as i32,
        activations_dtype: a as i32,
    };
    let (db, dh) = (d.to::<bf16>(), d.to::<f16>());
    let same = |got: [(AttnStatus, Vec<u32>); 3], want: [Vec<u32>; 3], what: &str| {
        for (i, ((s, g), w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(*s, AttnStatus::Ok, "{what} (layer {i}): {}", last_error());
            assert!(g == w, "{what} (layer {i}): C and Rust differ");
        }
    };
    let o = opts(Bf16, F16);
    same(c_layers_typed(&db, &dh, &v, &o), rust_layers_typed(&db, &dh, rv), "bf16 w, f16 x");
    let o = opts(F16, Bf16);
    same(c_layers_typed(&dh, &db, &v, &o), rust_layers_typed(&dh, &db, rv), "f16 w, bf16 x");
    let o = opts(Bf16, F32);
    same(c_layers_typed(&db, &d, &v, &o), rust_layers_typed(&db, &d, rv), "bf16 w, f32 x");
    let o = opts(F32, F16);
    same(c_layers_typed(&d, &dh, &v, &o), rust_layers_typed(&d, &dh, rv), "f32 w, f16 x");
    let o = opts(Bf16, Bf16);
    same(c_layers_typed(&db, &db, null(), &o), rust_layers_typed(&db, &db, Variants::NONE), "bf16");

    // The defaults: NULL options, f32 options and the entry points without options.
    let plain = c_layers(&d, &v);
    assert!(c_layers_typed(&d, &d, &v, &opts(F32, F32)) == plain, "f32 options");
    let (mw, ew) = (d.mha(), d.encoder());
    let (x, x2) = d.inputs();
    let causal =
        AttnMask { kind: AttnMaskKind::Causal as i32, causal_default_offset: 1, ..no_mask() };
    let mut y = vec![f32::NAN; 5 * 8];
    let bits = |y: &[f32]| y.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
    let ty = tensor_mut(&mut y, [1, 1, 5, 8]);
    // SAFETY: views address their f32 buffers; `v` is whole with 2 floats per pointer.
    let s =
        unsafe { attn_mha_forward_with_variants(&CFG, &mw, &v, x, &causal, ty, null_mut(), 0, 1) };
    assert!(s == AttnStatus::Ok && bits(&y) == plain[0].1, "mha with variants");
    let ty = tensor_mut(&mut y, [1, 1, 5, 8]);
    // SAFETY: as above.
    let s = unsafe {
        attn_cross_attention_forward_with_variants(
            &CFG,
            &mw,
            &v,
            x,
            x2,
            &causal,
            ty,
            null_mut(),
            0,
            1,
        )
    };
    assert!(s == AttnStatus::Ok && bits(&y) == plain[1].1, "cross with variants");
    let ty = tensor_mut(&mut y, [1, 1, 5, 8]);
    // SAFETY: as above.
    let s = unsafe {
        attn_encoder_forward_with_variants(&ENC, &ew, &v, x, &causal, ty, null_mut(), 0, 1)
    };
    assert!(s == AttnStatus::Ok && bits(&y) == plain[2].1, "encoder with variants");

    // Checked options, every entry point with the same status naming the field.
    let expect = |o: &AttnLayerOptions, status: AttnStatus, name: &str| {
        for (i, (s, _)) in c_layers_typed(&db, &db, &v, o).iter().enumerate() {
            assert_eq!(*s, status, "{name} (layer {i}): {}", last_error());
        }
        assert!(last_error().contains(name), "{name}: {}", last_error());
    };
    let b = opts(Bf16, Bf16);
    for size in [0, 8, LAYER_OPTIONS_MIN_SIZE - 1, raw::MAX_STRUCT_SIZE + 1] {
        let o = AttnLayerOptions { struct_size: size, ..b };
        expect(&o, AttnStatus::InvalidParameter, "options.struct_size");
    }
    let q8 = AttnDtype::Q8 as i32;
    let wq8 = AttnLayerOptions { weights_dtype: q8, ..b };
    expect(&wq8, AttnStatus::UnsupportedDtype, "options.weights_dtype");
    let aq8 = AttnLayerOptions { activations_dtype: q8, ..b };
    expect(&aq8, AttnStatus::UnsupportedDtype, "options.activations_dtype");
    let unknown = AttnLayerOptions { activations_dtype: -1, ..b };
    expect(&unknown, AttnStatus::InvalidParameter, "options.activations_dtype");
    let unknown = AttnLayerOptions { weights_dtype: 4, ..b };
    expect(&unknown, AttnStatus::InvalidParameter, "options.weights_dtype");

    // Spans in the activations' type: `x` (40 bf16s) then `y` in one buffer. Right after `x`
    // is fine for bf16; one element earlier overlaps; as f32s the same `x` reaches into `y`.
    let (mbw, mut buf) = (db.mha(), vec![0u16; 81]);
    buf[..40].copy_from_slice(&db.x.iter().map(|e| e.to_bits()).collect::<Vec<_>>());
    let p = buf.as_mut_ptr();
    let xt = AttnTensor { data: p.cast_const().cast(), ..tensor(&[], [1, 1, 5, 8]) };
    let call = |start: usize, o: &AttnLayerOptions| {
        let yt = AttnTensorMut {
            data: p.wrapping_add(start).cast(),
            ..tensor_mut(&mut [], [1, 1, 5, 8])
        };
        // SAFETY: `x` and `y` address `buf` (81 u16s: 40 + 40 after `start` ≤ 41); an overlap
        // is refused before anything is read or written.
        unsafe {
            attn_mha_forward_with_options(&CFG, &mbw, null(), o, xt, null(), yt, null_mut(), 0, 1)
        }
    };
    assert_eq!(call(40, &b), AttnStatus::Ok, "{}", last_error());
    assert_eq!(call(39, &b), AttnStatus::AliasedOutput);
    assert!(last_error().contains("`y`") && last_error().contains("`x1`"), "{}", last_error());
    assert_eq!(call(40, &opts(Bf16, F32)), AttnStatus::AliasedOutput, "f32 spans");
}

/// Version 3 of `AttnAttentionArgs`, the element types: every dtype of each operand gives the
/// bits of the Rust `Attention` on the same views (bf16/f16 Q, K, V and O; int8 K and V with
/// their scales); a version-2 struct (no dtype fields) is still f32; int8 queries or output are
/// `ATTN_STATUS_UNSUPPORTED_DTYPE`, unknown dtype values `ATTN_STATUS_INVALID_PARAMETER`, both
/// naming the field; an int8 operand's span counts bytes (an output overlapping the scales is
/// refused).
#[test]
fn attention_args_element_types() {
    use crate::attention::Attention;
    use attn_core::{bf16, f16, quantize_q8, Q8Mut, Q8Ref};
    let (nq, nk, d) = (3, 11, 8);
    let (qf, kf, vf) = (vals(2 * nq * d, 1), vals(nk * d, 2), vals(nk * d, 3));
    let l = |h, n| Tensor4Layout::bhsd(1, h, n, d);
    let qb: Vec<bf16> = qf.iter().map(|&x| bf16::from_f32(x)).collect();
    let kh: Vec<f16> = kf.iter().map(|&x| f16::from_f32(x)).collect();
    let (mut kq, mut ks, mut vq, mut vs) =
        (vec![0i8; nk * d], vec![0.0f32; nk], vec![0i8; nk * d], vec![0.0f32; nk]);
    let sl = Tensor4Layout::bhsd(1, 1, nk, 1);
    quantize_q8(
        TensorRef::new(&kf, l(1, nk)),
        Q8Mut::new(TensorMut::new(&mut kq, l(1, nk)), TensorMut::new(&mut ks, sl)),
    )
    .unwrap();
    quantize_q8(
        TensorRef::new(&vf, l(1, nk)),
        Q8Mut::new(TensorMut::new(&mut vq, l(1, nk)), TensorMut::new(&mut vs, sl)),
    )
    .unwrap();
    let ks_t = tensor(&ks, [1, 1, nk, 1]);
    let vs_t = tensor(&vs, [1, 1, nk, 1]);
    // As C passes them: the data pointer of a `void*` field.
    let cast = |p: *const u8, dims| AttnTensor { data: p.cast(), ..tensor(&[], dims) };
    let q_bf16 = cast(qb.as_ptr().cast(), [1, 2, nq, d]);
    let k_f16 = cast(kh.as_ptr().cast(), [1, 1, nk, d]);
    let k_q8 = cast(kq.as_ptr().cast(), [1, 1, nk, d]);
    let v_q8 = cast(vq.as_ptr().cast(), [1, 1, nk, d]);

    // bf16 Q, f16 K, int8 V, bf16 O (and f32 O) against the Rust call on the same views.
    for o_dtype in [AttnDtype::Bf16, AttnDtype::F32, AttnDtype::F16] {
        let mut o16 = vec![0u16; 2 * nq * d];
        let mut o32 = vec![0.0f32; 2 * nq * d];
        let (mut lse, mut lse_want) = (vec![0.0f32; 2 * nq], vec![0.0f32; 2 * nq]);
        let mut a = args((&qf, &kf, &vf), nq, &mut o32, &mut lse);
        a.q = q_bf16;
        a.k = k_f16;
        a.v = v_q8;
        a.v_scales = vs_t;
        (a.q_dtype, a.k_dtype, a.v_dtype, a.o_dtype) = (1, 2, 3, o_dtype as i32);
        if o_dtype != AttnDtype::F32 {
            a.o.data = o16.as_mut_ptr().cast();
        }
        // SAFETY: every view addresses its buffer, in the type its dtype names.
        assert_eq!(unsafe { attn_attention_run(&a) }, AttnStatus::Ok, "{}", last_error());
        let v = Q8Ref { values: TensorRef::new(&vq, l(1, nk)), scales: TensorRef::new(&vs, sl) };
        let p = Attention::new(TensorRef::new(&qb, l(2, nq)), TensorRef::new(&kh, l(1, nk)), v)
            .lse(&mut lse_want);
        match o_dtype {
            AttnDtype::Bf16 => {
                let mut want = vec![bf16::ZERO; 2 * nq * d];
                p.run(TensorMut::new(&mut want, l(2, nq))).unwrap();
                assert!(want.iter().zip(&o16).all(|(w, g)| w.to_bits() == *g), "{o_dtype:?}");
            }
            AttnDtype::F16 => {
                let mut want = vec![f16::ZERO; 2 * nq * d];
                p.run(TensorMut::new(&mut want, l(2, nq))).unwrap();
                assert!(want.iter().zip(&o16).all(|(w, g)| w.to_bits() == *g), "{o_dtype:?}");
            }
            _ => {
                let mut want = vec![0.0f32; 2 * nq * d];
                p.run(TensorMut::new(&mut want, l(2, nq))).unwrap();
                assert!(want.iter().zip(&o32).all(|(w, g)| w.to_bits() == g.to_bits()));
            }
        }
        assert!(lse_want.iter().zip(&lse).all(|(w, g)| w.to_bits() == g.to_bits()));
    }

    let (mut o, mut lse) = (vec![0.0f32; 2 * nq * d], vec![0.0f32; 2 * nq]);
    let base = args((&qf, &kf, &vf), nq, &mut o, &mut lse);
    // int8 K with its scales; a version-2 caller (no dtype fields) is f32.
    let q8k = AttnAttentionArgs { k: k_q8, k_dtype: 3, k_scales: ks_t, ..base };
    // SAFETY: as above.
    assert_eq!(unsafe { attn_attention_run(&q8k) }, AttnStatus::Ok, "{}", last_error());
    // A version-2 caller knows no dtype fields: the bytes past its size read as zero (f32),
    // whatever the struct holds there.
    let v2 = AttnAttentionArgs { struct_size: ATTENTION_ARGS_V2_SIZE, k: base.k, ..q8k };
    // SAFETY: views address their buffers (K as f32, which a version-2 caller passes).
    assert_eq!(unsafe { attn_attention_run(&v2) }, AttnStatus::Ok, "{}", last_error());
    #[cfg(target_pointer_width = "64")]
    assert_eq!(ATTENTION_ARGS_V2_SIZE, 424);

    for (field, a) in [
        ("args.q_dtype", AttnAttentionArgs { q_dtype: 3, ..base }),
        ("args.o_dtype", AttnAttentionArgs { o_dtype: 3, ..base }),
    ] {
        // SAFETY: refused before any view is read.
        assert_eq!(unsafe { attn_attention_run(&a) }, AttnStatus::UnsupportedDtype, "{field}");
        assert!(last_error().contains(field), "{}", last_error());
        assert_eq!(name(AttnStatus::UnsupportedDtype as i32), "ATTN_STATUS_UNSUPPORTED_DTYPE");
    }
    for (field, value) in [
        ("args.q_dtype", 4),
        ("args.k_dtype", -1),
        ("args.v_dtype", 99),
        ("args.o_dtype", i32::MAX),
    ] {
        let mut a = base;
        *match field {
            "args.q_dtype" => &mut a.q_dtype,
            "args.k_dtype" => &mut a.k_dtype,
            "args.v_dtype" => &mut a.v_dtype,
            _ => &mut a.o_dtype,
        } = value;
        // SAFETY: refused before any view is read.
        assert_eq!(unsafe { attn_attention_run(&a) }, AttnStatus::InvalidParameter, "{field}");
        assert!(last_error().contains(field), "{}", last_error());
    }
    // An output overlapping the int8 K's scales is refused; int8 K without scales is the
    // Rust shape error on `k_scales`' view.
    let mut shared = vec![0.0f32; 2 * nq * d];
    let ks_shared = tensor(&shared[..nk], [1, 1, nk, 1]);
    let overlap =
        AttnAttentionArgs { k_scales: ks_shared, o: tensor_mut(&mut shared, [1, 2, nq, d]), ..q8k };
    // SAFETY: refused before anything is read or written.
    assert_eq!(unsafe { attn_attention_run(&overlap) }, AttnStatus::AliasedOutput);
    assert!(last_error().contains("k_scales"), "{}", last_error());
    let unscaled = AttnAttentionArgs { k_scales: AttnTensor::EMPTY, ..q8k };
    // SAFETY: the empty scales view reads nothing.
    assert_ne!(unsafe { attn_attention_run(&unscaled) }, AttnStatus::Ok);
}

/// Version 4 of `AttnAttentionArgs`, `half_path`: each value gives the bits of the Rust call
/// with the same `HalfPath` (bf16 Q, K, V on the flash path; `ATTN_HALF_PATH_DOT` only where
/// the CPU has AVX512_BF16, else the Rust error's status); a version-3 struct reads it as 0;
/// unknown values are `ATTN_STATUS_INVALID_PARAMETER` naming the field.
#[test]
fn attention_args_half_path() {
    use crate::attention::Attention;
    use attn_core::bf16;
    let (nq, nk, d) = (40, 11, 8);
    let l = |h, n| Tensor4Layout::bhsd(1, h, n, d);
    let to_bf16 = |x: Vec<f32>| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (qb, kb, vb) =
        (to_bf16(vals(2 * nq * d, 1)), to_bf16(vals(nk * d, 2)), to_bf16(vals(nk * d, 3)));
    let cast = |p: *const bf16, dims| AttnTensor { data: p.cast(), ..tensor(&[], dims) };
    let (mut o, mut lse) = (vec![0.0f32; 2 * nq * d], vec![0.0f32; 2 * nq]);
    let mut a = args((&[], &[], &[]), nq, &mut o, &mut lse);
    (a.q, a.k, a.v) = (
        cast(qb.as_ptr(), [1, 2, nq, d]),
        cast(kb.as_ptr(), [1, 1, nk, d]),
        cast(vb.as_ptr(), [1, 1, nk, d]),
    );
    (a.q_dtype, a.k_dtype, a.v_dtype, a.path) = (1, 1, 1, AttnPath::Flash as i32);
    for (value, half) in [(0, HalfPath::Auto), (1, HalfPath::Widen), (2, HalfPath::Dot)] {
        let mut want = vec![0.0f32; 2 * nq * d];
        let r = Attention::new(
            TensorRef::new(&qb, l(2, nq)),
            TensorRef::new(&kb, l(1, nk)),
            TensorRef::new(&vb, l(1, nk)),
        )
        .path(Path::Flash)
        .half_path(half)
        .run(TensorMut::new(&mut want, l(2, nq)));
        let c = AttnAttentionArgs { half_path: value, ..a };
        // SAFETY: every view addresses its buffer, in the type its dtype names.
        let status = unsafe { attn_attention_run(&c) };
        match r {
            Ok(()) => {
                assert_eq!(status, AttnStatus::Ok, "{value}: {}", last_error());
                assert!(want.iter().zip(&o).all(|(w, g)| w.to_bits() == g.to_bits()), "{value}");
            }
            Err(e) => {
                assert_eq!(status, AttnStatus::InvalidParameter, "{value}: {e}");
                assert!(value == 2 && !crate::gemm::bf16_dot_available(), "{e}");
            }
        }
    }
    // A version-3 caller knows no `half_path`: read as 0, whatever the struct holds there.
    let v3 = AttnAttentionArgs { struct_size: ATTENTION_ARGS_V3_SIZE, half_path: 7, ..a };
    // SAFETY: as above.
    assert_eq!(unsafe { attn_attention_run(&v3) }, AttnStatus::Ok, "{}", last_error());
    for value in [3, -1, i32::MAX] {
        let bad = AttnAttentionArgs { half_path: value, ..a };
        // SAFETY: refused before any view is read.
        assert_eq!(unsafe { attn_attention_run(&bad) }, AttnStatus::InvalidParameter);
        assert!(last_error().contains("args.half_path"), "{}", last_error());
    }
}

#[test]
fn typed_softmax() {
    use attn_core::{bf16, f16, TensorMut, TensorRef};
    use AttnDtype::{Bf16, F16, F32};
    let dims = [1, 2, 3, 5];
    let x32 = vals(30, 11).iter().map(|v| v * 9.0).collect::<Vec<_>>();
    let xb: Vec<bf16> = x32.iter().map(|&v| bf16::from_f32(v)).collect();
    let causal =
        AttnMask { kind: AttnMaskKind::Causal as i32, causal_default_offset: 1, ..no_mask() };
    let l = crate::Tensor4Layout::bhsd(1, 2, 3, 5);
    let rmask = crate::Mask::Causal { offset: None };
    let par = Parallelism::Sequential;
    // The typed views reinterpret the buffers' bytes, as a C caller's `uint16_t*` would.
    let xt = AttnTensor { data: xb.as_ptr().cast(), ..tensor(&x32, dims) };
    // bf16 → f16 and bf16 → f32: the Rust call on the same typed views, bit for bit.
    let mut yh = vec![f16::ZERO; 30];
    let mut lse = [0.0f32; 6];
    let ym = AttnTensorMut { data: yh.as_mut_ptr().cast(), ..tensor_mut(&mut [0.0; 30], dims) };
    // SAFETY: the views address their buffers' elements of the declared types.
    let s = unsafe {
        attn_softmax_typed(xt, Bf16 as i32, 0.5, &causal, ym, F16 as i32, lse.as_mut_ptr(), 6, 1)
    };
    assert_eq!(s, AttnStatus::Ok, "{}", last_error());
    let mut want = vec![f16::ZERO; 30];
    let mut want_lse = [0.0f32; 6];
    let (xr, yr) = (TensorRef::new(&xb, l), TensorMut::new(&mut want, l));
    crate::softmax::scale_mask_softmax(xr, 0.5, &rmask, yr, Some(&mut want_lse), par).unwrap();
    assert!(yh.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{yh:?} {want:?}");
    assert_eq!(lse.map(f32::to_bits), want_lse.map(f32::to_bits));
    let mut y32 = vec![0.0f32; 30];
    // SAFETY: as above.
    let s = unsafe {
        let ym = tensor_mut(&mut y32, dims);
        attn_softmax_typed(xt, Bf16 as i32, 0.5, &causal, ym, F32 as i32, null_mut(), 0, 1)
    };
    assert_eq!(s, AttnStatus::Ok, "{}", last_error());
    let mut want32 = vec![0.0f32; 30];
    let (xr, yr) = (TensorRef::new(&xb, l), TensorMut::new(&mut want32, l));
    crate::softmax::scale_mask_softmax(xr, 0.5, &rmask, yr, None, par).unwrap();
    assert_eq!(y32.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), {
        want32.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    });
    // f32 → f32 is `attn_softmax`.
    let mut a = vec![0.0f32; 30];
    let mut b = vec![0.0f32; 30];
    // SAFETY: as above.
    unsafe {
        let (x, ya, yb) = (tensor(&x32, dims), tensor_mut(&mut a, dims), tensor_mut(&mut b, dims));
        assert_eq!(attn_softmax(x, 0.5, &causal, ya, null_mut(), 0, 1), AttnStatus::Ok);
        let s = attn_softmax_typed(x, F32 as i32, 0.5, &causal, yb, F32 as i32, null_mut(), 0, 1);
        assert_eq!(s, AttnStatus::Ok);
    }
    assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
    // In place in bf16 equals out of place; in place across types is an overlap.
    let mut yb = vec![bf16::ZERO; 30];
    let mut z = xb.clone();
    // SAFETY: as above; the in-place call passes the same view twice.
    unsafe {
        let ym = AttnTensorMut { data: yb.as_mut_ptr().cast(), ..tensor_mut(&mut [0.0; 30], dims) };
        let s =
            attn_softmax_typed(xt, Bf16 as i32, 0.5, &causal, ym, Bf16 as i32, null_mut(), 0, 1);
        assert_eq!(s, AttnStatus::Ok);
        let zm = AttnTensorMut { data: z.as_mut_ptr().cast(), ..tensor_mut(&mut [0.0; 30], dims) };
        let zt = AttnTensor { data: zm.data.cast_const(), ..xt };
        let s =
            attn_softmax_typed(zt, Bf16 as i32, 0.5, &causal, zm, Bf16 as i32, null_mut(), 0, 1);
        assert_eq!(s, AttnStatus::Ok, "{}", last_error());
        assert!(z.iter().zip(&yb).all(|(p, q)| p.to_bits() == q.to_bits()));
        let s = attn_softmax_typed(zt, Bf16 as i32, 0.5, &causal, zm, F32 as i32, null_mut(), 0, 1);
        assert_eq!(s, AttnStatus::AliasedOutput);
        assert!(last_error().contains("`y` overlaps argument `x`"), "{}", last_error());
    }
    // Overlaps in each view's own bytes: a bf16 `y` right after a bf16 `x` is disjoint, one
    // element earlier it overlaps.
    let mut buf = vec![bf16::ZERO; 61];
    for shift in [30usize, 29] {
        let base = buf.as_mut_ptr();
        let xv = AttnTensor { data: base.cast_const().cast(), ..tensor(&x32, dims) };
        let yv = AttnTensorMut {
            data: base.wrapping_add(shift).cast(),
            ..tensor_mut(&mut [0.0; 30], dims)
        };
        // SAFETY: the views address `buf` (61 elements).
        let s = unsafe {
            attn_softmax_typed(xv, Bf16 as i32, 1.0, null(), yv, Bf16 as i32, null_mut(), 0, 1)
        };
        let want = if shift == 30 { AttnStatus::Ok } else { AttnStatus::AliasedOutput };
        assert_eq!(s, want, "shift {shift}: {}", last_error());
    }
    // Int8 and unknown types, named.
    // SAFETY: refused before any view is made.
    unsafe {
        let (x, y) = (tensor(&x32, dims), tensor_mut(&mut a, dims));
        let s = attn_softmax_typed(x, 3, 1.0, null(), y, 0, null_mut(), 0, 1);
        assert_eq!(s, AttnStatus::UnsupportedDtype);
        assert!(last_error().contains("x_dtype"), "{}", last_error());
        let s = attn_softmax_typed(x, 0, 1.0, null(), y, 9, null_mut(), 0, 1);
        assert_eq!(s, AttnStatus::InvalidParameter);
        assert!(last_error().contains("y_dtype"), "{}", last_error());
    }
}

#[test]
fn typed_layer_norm() {
    use attn_core::{bf16, f16, MatMut, MatRef};
    use AttnDtype::{Bf16, F16, F32};
    let (n, d) = (3, 7);
    let x32: Vec<f32> = vals(n * d, 5).iter().map(|v| v * 4.0 - 1.0).collect();
    let g32: Vec<f32> = vals(d, 6).iter().map(|v| v + 0.5).collect();
    let b32: Vec<f32> = vals(d, 7).iter().map(|v| v - 0.25).collect();
    let xb: Vec<bf16> = x32.iter().map(|&v| bf16::from_f32(v)).collect();
    let gb: Vec<bf16> = g32.iter().map(|&v| bf16::from_f32(v)).collect();
    let bb: Vec<bf16> = b32.iter().map(|&v| bf16::from_f32(v)).collect();
    let xh: Vec<f16> = x32.iter().map(|&v| f16::from_f32(v)).collect();
    let l = MatLayout::row_major(n, d);
    let eps = 1e-5;
    // bf16 everywhere: the Rust call on the same typed views, bit for bit.
    let mut y = vec![bf16::ZERO; n * d];
    // SAFETY: the views and pointers address their buffers' elements of the declared types.
    let s = unsafe {
        let x = AttnMat { data: xb.as_ptr().cast(), ..mat(&x32, n, d, d, 1, 0) };
        let ym = AttnMatMut { data: y.as_mut_ptr().cast(), ..mat_mut(&mut [0.0; 21], n, d) };
        let (g, b) = (gb.as_ptr().cast(), bb.as_ptr().cast());
        attn_layer_norm_typed(x, Bf16 as i32, g, b, Bf16 as i32, eps, ym, Bf16 as i32)
    };
    assert_eq!(s, AttnStatus::Ok, "{}", last_error());
    let mut want = vec![bf16::ZERO; n * d];
    let w = LayerNormWeights { gamma: &gb[..], beta: &bb[..] };
    crate::layers::layer_norm(MatRef::new(&xb, l), &w, eps, MatMut::new(&mut want, l)).unwrap();
    assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{y:?} {want:?}");
    // f16 input, f32 weights and output.
    let mut y32 = vec![0.0f32; n * d];
    // SAFETY: as above.
    let s = unsafe {
        let x = AttnMat { data: xh.as_ptr().cast(), ..mat(&x32, n, d, d, 1, 0) };
        let ym = mat_mut(&mut y32, n, d);
        let (g, b) = (g32.as_ptr().cast(), b32.as_ptr().cast());
        attn_layer_norm_typed(x, F16 as i32, g, b, F32 as i32, eps, ym, 0)
    };
    assert_eq!(s, AttnStatus::Ok, "{}", last_error());
    let mut want32 = vec![0.0f32; n * d];
    let w = LayerNormWeights { gamma: &g32[..], beta: &b32[..] };
    crate::layers::layer_norm(MatRef::new(&xh, l), &w, eps, MatMut::new(&mut want32, l)).unwrap();
    assert_eq!(y32.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), {
        want32.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    });
    // f32 everywhere is `attn_layer_norm`.
    let (mut a, mut b) = (vec![0.0f32; n * d], vec![0.0f32; n * d]);
    // SAFETY: as above.
    unsafe {
        let (x, g, bt) = (mat(&x32, n, d, d, 1, 0), g32.as_ptr(), b32.as_ptr());
        assert_eq!(attn_layer_norm(x, g, bt, eps, mat_mut(&mut a, n, d)), AttnStatus::Ok);
        let s = attn_layer_norm_typed(x, 0, g.cast(), bt.cast(), 0, eps, mat_mut(&mut b, n, d), 0);
        assert_eq!(s, AttnStatus::Ok);
    }
    assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
    // Overlaps in each view's own bytes: a bf16 `y` right after a bf16 `x` is disjoint, one
    // element earlier it overlaps.
    let mut buf = vec![bf16::ZERO; 2 * n * d];
    for shift in [n * d, n * d - 1] {
        let base = buf.as_mut_ptr();
        let xv = AttnMat { data: base.cast_const().cast(), ..mat(&x32, n, d, d, 1, 0) };
        let yv =
            AttnMatMut { data: base.wrapping_add(shift).cast(), ..mat_mut(&mut [0.0; 21], n, d) };
        let (g, bt) = (gb.as_ptr().cast(), bb.as_ptr().cast());
        // SAFETY: the views address `buf` (42 elements), the weights their buffers.
        let s = unsafe { attn_layer_norm_typed(xv, 1, g, bt, 1, eps, yv, 1) };
        let want = if shift == n * d { AttnStatus::Ok } else { AttnStatus::AliasedOutput };
        assert_eq!(s, want, "shift {shift}: {}", last_error());
    }
    // Int8 and unknown types, named.
    // SAFETY: refused before any view is made.
    unsafe {
        let (x, g, bt) = (mat(&x32, n, d, d, 1, 0), g32.as_ptr(), b32.as_ptr());
        let s = attn_layer_norm_typed(x, 0, g.cast(), bt.cast(), 3, eps, mat_mut(&mut a, n, d), 0);
        assert_eq!(s, AttnStatus::UnsupportedDtype);
        assert!(last_error().contains("w_dtype"), "{}", last_error());
        let s = attn_layer_norm_typed(x, 0, g.cast(), bt.cast(), 0, eps, mat_mut(&mut a, n, d), 9);
        assert_eq!(s, AttnStatus::InvalidParameter);
        assert!(last_error().contains("y_dtype"), "{}", last_error());
    }
}
