//! The C ABI of packed batches and paged caches: [`attn_varlen_attention`] over one
//! [`AttnVarlenArgs`] (the Rust [`VarlenAttention`] behind it), [`attn_paged_attention`] over
//! one [`AttnPagedArgs`] (the Rust [`PagedAttention`]) and [`attn_append_kv`] over one
//! [`AttnAppendKvArgs`] (the Rust [`append_kv`]). Conventions (views, null pointers, overlap,
//! threads, versioned structs) are those of the parent module's [`AttnStatus`] and
//! `AttnAttentionArgs`.
//!
//! Pools of any element type (version 2 of [`AttnPagedArgs`] and [`AttnAppendKvArgs`]):
//! `k_dtype`/`v_dtype` take an [`AttnDtype`] (zero: f32, as in version 1); a pool pointer then
//! (`void*`) addresses elements of that type and its length counts them; an
//! int8 pool (`ATTN_DTYPE_Q8`) comes with a scale pool of `num_pages·page_size·kv_heads·⌈d/32⌉`
//! floats (`k_scales`, `v_scales`; see the Rust `attn_core::batch::PagePool`).

use super::raw::{self, disjoint, slice, slice_mut, span, Span};
use super::{guard, mask_span, mask_view, opt_mut, threads, AttnMask, AttnPath, AttnStatus};
use super::{AttnDtype, AttnHalfPath, AttnTensor, AttnTensorMut, AttnVariants, CVariants, Failure};
use crate::batch::{
    append_kv, PagePool, PagePoolMut, PagedAttention, PagedKv, PagedKvMut, VarlenAttention,
};
use crate::{bf16, f16};
use std::ffi::c_void;

/// The operands and settings of one [`attn_varlen_attention`] call: attention over a packed
/// batch of sequences of different lengths (FlashAttention's varlen call). Sequence `s` is
/// queries `cu_seqlens_q[s] .. cu_seqlens_q[s + 1]` of `q` against keys and values
/// `cu_seqlens_k[s] .. cu_seqlens_k[s + 1]` of `k` and `v`, written to the same rows of `o`.
///
/// **Versioning** as `AttnAttentionArgs`: the struct starts with `struct_size` and only grows
/// at its end; zero-initialise it, set `struct_size = sizeof(AttnVarlenArgs)`, then the fields
/// you need. Refused with `ATTN_STATUS_INVALID_PARAMETER` naming `args.struct_size`: a size
/// below this first version's (416 bytes on 64-bit targets) or above 4096, and a larger struct
/// with a nonzero byte past the fields this library knows.
///
/// Fields left zero give: no mask, scale `1/√dk`, no logsumexp, every available core, path
/// auto, no variants.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnVarlenArgs {
    /// `sizeof(AttnVarlenArgs)` in the caller's header (see the versioning rule above).
    pub struct_size: usize,
    /// Packed queries `[1, hq, total_q, dk]` (`[total_q, hq, dk]` storage is the strides
    /// `{0, dk, hq·dk, 1}`).
    pub q: AttnTensor,
    /// Packed keys `[1, hkv, total_k, dk]` (hkv divides hq).
    pub k: AttnTensor,
    /// Packed values `[1, hkv, total_k, dv]`.
    pub v: AttnTensor,
    /// The packed output `[1, hq, total_q, dv]`, written (only) within its view.
    pub o: AttnTensorMut,
    /// `cu_seqlens_q_len` cumulative query offsets: `0 = cu[0] ≤ cu[1] ≤ … = total_q`
    /// (`ATTN_STATUS_INVALID_PARAMETER` naming `cu_seqlens_q` when empty, not starting at 0
    /// or decreasing; `ATTN_STATUS_SHAPE_MISMATCH` when the last is not `total_q`).
    pub cu_seqlens_q: *const usize,
    /// The number of entries at `cu_seqlens_q`: the number of sequences plus one.
    pub cu_seqlens_q_len: usize,
    /// Cumulative key offsets, as `cu_seqlens_q`, ending at `total_k`, with as many entries.
    pub cu_seqlens_k: *const usize,
    /// The number of entries at `cu_seqlens_k`.
    pub cu_seqlens_k_len: usize,
    /// NULL, or a mask of kind none or causal (any other kind is
    /// `ATTN_STATUS_INVALID_PARAMETER` naming `mask`), applied to each sequence with its own
    /// sizes: the default causal offset of sequence `s` is `nk_s − nq_s`.
    pub mask: *const AttnMask,
    /// The score scale when `has_scale` is 1 (finite); ignored when `has_scale` is 0.
    pub scale: f32,
    /// 0 = the default scale `1/√dk`; 1 = use `scale`. Any other value is
    /// `ATTN_STATUS_INVALID_PARAMETER` naming `args.has_scale`.
    pub has_scale: u8,
    /// The algorithm of each piece: one of the `ATTN_PATH_*` values (0 = auto), an `int32_t`.
    pub path: i32,
    /// NULL for no logsumexp; otherwise `lse_len` must be `hq·total_q` and
    /// `lse[h·total_q + t]` receives the logsumexp of query token `t`, head `h`.
    pub lse: *mut f32,
    /// The number of floats at `lse`.
    pub lse_len: usize,
    /// Threads: 0 = every available core, 1 = the calling thread, n = at most n; the result is
    /// bitwise the same for every count.
    pub threads: usize,
    /// NULL for no variants, or an `AttnVariants` (its own `struct_size`) measured from each
    /// sequence's causal offset; sinks and slopes have `hq` entries.
    pub variants: *const AttnVariants,
}

/// The smallest `struct_size` [`attn_varlen_attention`] accepts: the whole first version.
const VARLEN_ARGS_MIN_SIZE: usize = std::mem::size_of::<AttnVarlenArgs>();

/// Attention over a packed batch of variable-length sequences, every operand and setting in
/// one [`AttnVarlenArgs`]; the Rust `VarlenAttention` behind it (no work for padding, each
/// sequence its own causal offset, the threads sharing the sequences).
///
/// Statuses: `ATTN_STATUS_NULL_POINTER` naming `args` for a NULL `args`;
/// `ATTN_STATUS_INVALID_PARAMETER` naming `args` (misaligned), `args.struct_size`,
/// `args.path`, `args.has_scale`, `mask.kind`, `mask.causal_default_offset`,
/// `variants.struct_size` or `variants.has_window` for a value it may not take; then the
/// null, bounds and overlap checks (`q`, `k`, `v`, `o`, `cu_seqlens_q`, `cu_seqlens_k`,
/// `sinks`, `alibi`, `lse`); then those of the Rust call: a keep or bias mask
/// (`ATTN_STATUS_INVALID_PARAMETER` naming `mask`), a batch other than 1, the shapes of the
/// packed views, bad or mismatched offsets, `lse_len`, the variants' values. Nothing is written
/// when a check fails.
///
/// # Safety
///
/// `args` is null or addresses `args->struct_size` readable, initialised bytes; each view's
/// `data` addresses the elements the view reaches; `cu_seqlens_*` address their `*_len`
/// entries; `lse` addresses `lse_len` floats; `mask` and `variants` are null or valid (with
/// `hq` floats at non-null sinks and slopes); outputs overlap nothing else (checked).
#[no_mangle]
pub unsafe extern "C" fn attn_varlen_attention(args: *const AttnVarlenArgs) -> AttnStatus {
    guard(|| {
        // SAFETY: the caller's contract; `AttnVarlenArgs` is `repr(C)`, starts with its
        // `size_t struct_size`, and is valid when all-zero (integers, floats, raw pointers).
        let args = unsafe {
            raw::read_sized(("args", "args.struct_size"), args, &[VARLEN_ARGS_MIN_SIZE])?
        };
        // SAFETY: forwarded from the caller.
        unsafe { varlen_call(&args) }
    })
}

/// The body of [`attn_varlen_attention`].
///
/// # Safety
/// As [`attn_varlen_attention`] (after `args` was read).
unsafe fn varlen_call(a: &AttnVarlenArgs) -> Result<(), Failure> {
    let path = AttnPath::from_c(a.path)?;
    let scale = match a.has_scale {
        0 => None,
        1 => Some(a.scale),
        v => {
            return Err(Failure::BadValue {
                arg: "args.has_scale",
                value: i64::from(v),
                allowed: "must be 0 (the default scale 1/sqrt(dk)) or 1 (use args.scale)",
            })
        }
    };
    // SAFETY: forwarded from the caller.
    let variants = unsafe { CVariants::of_layer(a.variants)? };
    variants.window()?;
    let hq = a.q.dims[1];
    let mut inputs = vec![a.q.span("q")?, a.k.span("k")?, a.v.span("v")?];
    inputs.push(span("cu_seqlens_q", a.cu_seqlens_q, a.cu_seqlens_q_len)?);
    inputs.push(span("cu_seqlens_k", a.cu_seqlens_k, a.cu_seqlens_k_len)?);
    inputs.extend(variants.spans(hq)?);
    // SAFETY: forwarded from the caller.
    inputs.extend(unsafe { mask_span(a.mask)? });
    disjoint(&[a.o.span("o")?, span("lse", a.lse, a.lse_len)?], &inputs)?;
    // SAFETY: the caller's contract; outputs checked disjoint from everything else.
    let (q, k, v, mask, o) = unsafe {
        (a.q.view("q")?, a.k.view("k")?, a.v.view("v")?, mask_view(a.mask)?, a.o.view("o")?)
    };
    // SAFETY: as above (inputs, and the one output `lse`).
    let (cu_q, cu_k, lse) = unsafe {
        (
            slice("cu_seqlens_q", a.cu_seqlens_q, a.cu_seqlens_q_len)?,
            slice("cu_seqlens_k", a.cu_seqlens_k, a.cu_seqlens_k_len)?,
            opt_mut("lse", a.lse, a.lse_len)?,
        )
    };
    let mut p = VarlenAttention::new(q, k, v, cu_q, cu_k)
        .mask(mask)
        .parallelism(threads(a.threads))
        .path(path);
    if let Some(scale) = scale {
        p = p.scale(scale);
    }
    if let Some(lse) = lse {
        p = p.lse(lse);
    }
    // SAFETY: the caller's contract (`hq` floats at each non-null pointer); inputs only.
    p = p.variants(unsafe { variants.view(hq)? });
    Ok(p.run(o)?)
}

/// The operands and settings of one [`attn_paged_attention`] call: packed queries against a
/// paged K/V cache (decode: one query per sequence; chunked prefill: several). Sequence `b` is
/// queries `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` of `q` against the `seq_lens[b]` keys and
/// values it holds, written to the same rows of `o`. The pools are `[num_pages, page_size,
/// kv_heads, d]` row-major; key `j` of sequence `b` is slot `j mod page_size` of page
/// `block_table[b·max_pages + j / page_size]` (pages may be shared and in any order).
///
/// **Versioning** as `AttnAttentionArgs` (`struct_size` first, growing at the end; the first
/// version, through `variants`, is 328 bytes on 64-bit targets; version 2 adds the pools'
/// element types, version 3 those of `q` and `o`). Fields left zero give: no mask, scale
/// `1/√dk`, no logsumexp, every available core, no variants, f32 pools, f32 `q` and `o`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnPagedArgs {
    /// `sizeof(AttnPagedArgs)` in the caller's header.
    pub struct_size: usize,
    /// Packed queries `[1, hq, total_q, dk]` (`[total_q, hq, dk]` storage is the strides
    /// `{0, dk, hq·dk, 1}`); `kv_heads` divides `hq`.
    pub q: AttnTensor,
    /// The packed output `[1, hq, total_q, dv]`, written (only) within its view.
    pub o: AttnTensorMut,
    /// `batch + 1` cumulative query offsets: `0 = cu[0] ≤ cu[1] ≤ … = total_q`.
    pub cu_seqlens_q: *const usize,
    /// The key pool, read only: elements of type `k_dtype` (f32 by default).
    pub k_pool: *const c_void,
    /// Elements at `k_pool`: `num_pages·page_size·kv_heads·dk`.
    pub k_pool_len: usize,
    /// The value pool, read only: elements of type `v_dtype`.
    pub v_pool: *const c_void,
    /// Elements at `v_pool`: `num_pages·page_size·kv_heads·dv` (the same page count).
    pub v_pool_len: usize,
    /// Token slots per page: a power of two from 16 to 256.
    pub page_size: usize,
    /// K/V heads per slot.
    pub kv_heads: usize,
    /// Key width (at least 1).
    pub dk: usize,
    /// Value width.
    pub dv: usize,
    /// `[batch, max_pages]` row-major page indices (`batch·max_pages` entries).
    pub block_table: *const u32,
    /// The number of entries at `block_table`.
    pub block_table_len: usize,
    /// Entries per row of `block_table`.
    pub max_pages: usize,
    /// Keys each sequence holds, `batch` entries.
    pub seq_lens: *const usize,
    /// The number of sequences.
    pub batch: usize,
    /// NULL, or a mask of kind none or causal, applied to each sequence with its own sizes:
    /// the default causal offset of sequence `b` is `seq_lens[b] − nq_b`.
    pub mask: *const AttnMask,
    /// The score scale when `has_scale` is 1 (finite); ignored when `has_scale` is 0.
    pub scale: f32,
    /// 0 = the default scale `1/√dk`; 1 = use `scale`.
    pub has_scale: u8,
    /// NULL for no logsumexp; otherwise `lse_len` must be `hq·total_q` and
    /// `lse[h·total_q + t]` receives the logsumexp of query token `t`, head `h`.
    pub lse: *mut f32,
    /// The number of floats at `lse`.
    pub lse_len: usize,
    /// Threads: 0 = every available core, 1 = the calling thread, n = at most n; the result is
    /// bitwise the same for every count.
    pub threads: usize,
    /// NULL for no variants, or an `AttnVariants` measured from each sequence's causal
    /// offset; sinks and slopes have `hq` entries.
    pub variants: *const AttnVariants,
    // Version 2: the pools' element types. Zero: f32 pools, as before.
    /// The element type of `k_pool` (an [`AttnDtype`] value, `ATTN_DTYPE_*`, read as an
    /// `int32_t`): f32, bf16, f16, or int8 blocks (`ATTN_DTYPE_Q8`, scales at `k_scales`).
    pub k_dtype: i32,
    /// The element type of `v_pool`, as `k_dtype` (scales at `v_scales`).
    pub v_dtype: i32,
    /// With `k_dtype = ATTN_DTYPE_Q8`: the f32 scales of the key pool, `[num_pages,
    /// page_size, kv_heads, ⌈dk/32⌉]`, one per block of 32 values along `dk` (value = int8 ·
    /// scale). Ignored (may be NULL) otherwise.
    pub k_scales: *const f32,
    /// Floats at `k_scales`: `num_pages·page_size·kv_heads·⌈dk/32⌉`.
    pub k_scales_len: usize,
    /// With `v_dtype = ATTN_DTYPE_Q8`: the scales of the value pool, as `k_scales` for `dv`.
    pub v_scales: *const f32,
    /// Floats at `v_scales`.
    pub v_scales_len: usize,
    // Version 3: the element types of the queries and the output. Zero: f32, as before.
    /// The element type of `q` (`ATTN_DTYPE_F32`, `_BF16` or `_F16`; read as an `int32_t`).
    pub q_dtype: i32,
    /// The element type of `o`, as `q_dtype`: each value the f32 result rounded once to it.
    pub o_dtype: i32,
    // Version 4: how bf16 operands are multiplied. Zero: widened to f32, as before.
    /// One of the `AttnHalfPath` values (`ATTN_HALF_PATH_*`, 0 = auto), read as an `int32_t`,
    /// as `AttnAttentionArgs::half_path`: `ATTN_HALF_PATH_DOT` runs the decode pieces' scores
    /// and the chunked-prefill pieces' products on `vdpbf16ps` (bf16 queries and pools, a CPU
    /// with AVX512_BF16, else `ATTN_STATUS_INVALID_PARAMETER` naming `path`).
    pub half_path: i32,
}

/// The smallest `struct_size` [`attn_paged_attention`] accepts: the first version of
/// [`AttnPagedArgs`], through `variants` (f32 pools). Fixed for good.
const PAGED_ARGS_MIN_SIZE: usize =
    std::mem::offset_of!(AttnPagedArgs, variants) + std::mem::size_of::<*const AttnVariants>();

/// The sizes of the earlier versions of [`AttnPagedArgs`]: the first, version 2 (through
/// `v_scales_len`: the pools' element types) and version 3 (through `o_dtype`: the queries'
/// and output's).
const PAGED_ARGS_VERSIONS: [usize; 3] = [
    PAGED_ARGS_MIN_SIZE,
    std::mem::offset_of!(AttnPagedArgs, q_dtype),
    std::mem::offset_of!(AttnPagedArgs, half_path),
];

/// A pool of a paged cache as a C struct gives it: `len` elements of type `t` at `ptr`, and
/// for [`AttnDtype::Q8`] `scales_len` f32 scales at `scales`; `names` are the pool's and the
/// scales' fields, for errors. (The pointers of a writable pool are the struct's `void*`
/// fields, cast back by [`view_mut`](Self::view_mut).)
#[derive(Clone, Copy)]
struct CPool {
    t: AttnDtype,
    ptr: *const c_void,
    len: usize,
    scales: *const f32,
    scales_len: usize,
    names: [&'static str; 2],
}

impl CPool {
    /// The byte spans the pool (and its scales) occupy.
    fn spans(&self) -> Result<Vec<Span>, Failure> {
        let (p, [arg, sarg]) = (self.ptr, self.names);
        Ok(match self.t {
            AttnDtype::F32 => vec![span(arg, p.cast::<f32>(), self.len)?],
            AttnDtype::Bf16 | AttnDtype::F16 => vec![span(arg, p.cast::<u16>(), self.len)?],
            AttnDtype::Q8 => vec![
                span(arg, p.cast::<i8>(), self.len)?,
                span(sarg, self.scales, self.scales_len)?,
            ],
        })
    }

    /// The read-only pool.
    ///
    /// # Safety
    /// `ptr` addresses `len` elements of type `t`, and for [`AttnDtype::Q8`] `scales`
    /// addresses `scales_len` floats, unwritten during the call.
    unsafe fn view<'a>(&self) -> Result<PagePool<'a>, Failure> {
        let ([arg, sarg], p, n) = (self.names, self.ptr, self.len);
        // SAFETY: forwarded from the caller.
        unsafe {
            Ok(match self.t {
                AttnDtype::F32 => PagePool::F32(slice(arg, p.cast::<f32>(), n)?),
                AttnDtype::Bf16 => PagePool::BF16(slice(arg, p.cast::<bf16>(), n)?),
                AttnDtype::F16 => PagePool::F16(slice(arg, p.cast::<f16>(), n)?),
                AttnDtype::Q8 => PagePool::Q8 {
                    values: slice(arg, p.cast::<i8>(), n)?,
                    scales: slice(sarg, self.scales, self.scales_len)?,
                },
            })
        }
    }

    /// The writable pool.
    ///
    /// # Safety
    /// As [`CPool::view`], the elements (from a `void*` field) used by nothing else during
    /// the call.
    unsafe fn view_mut<'a>(&self) -> Result<PagePoolMut<'a>, Failure> {
        let ([arg, sarg], p, n) = (self.names, self.ptr.cast_mut(), self.len);
        // SAFETY: forwarded from the caller.
        unsafe {
            Ok(match self.t {
                AttnDtype::F32 => PagePoolMut::F32(slice_mut(arg, p.cast::<f32>(), n)?),
                AttnDtype::Bf16 => PagePoolMut::BF16(slice_mut(arg, p.cast::<bf16>(), n)?),
                AttnDtype::F16 => PagePoolMut::F16(slice_mut(arg, p.cast::<f16>(), n)?),
                AttnDtype::Q8 => PagePoolMut::Q8 {
                    values: slice_mut(arg, p.cast::<i8>(), n)?,
                    scales: slice_mut(sarg, self.scales.cast_mut(), self.scales_len)?,
                },
            })
        }
    }
}

/// Attention of packed queries against a paged K/V cache, every operand and setting in one
/// [`AttnPagedArgs`]; the Rust `PagedAttention` behind it (the pages read in place).
///
/// Statuses: `ATTN_STATUS_NULL_POINTER` naming `args` for a NULL `args`;
/// `ATTN_STATUS_INVALID_PARAMETER` naming `args` (misaligned), `args.struct_size`,
/// `args.has_scale`, `args.k_dtype`, `args.v_dtype`, `args.q_dtype`, `args.o_dtype` (int8 for
/// `q` or `o`: `ATTN_STATUS_UNSUPPORTED_DTYPE`), `mask.kind`, `mask.causal_default_offset`,
/// `variants.struct_size` or `variants.has_window` for a value it may not take; then the null,
/// bounds and overlap checks (`q`, `o`, `cu_seqlens_q`, `k_pool`, `v_pool`, `k_scales` and
/// `v_scales` for int8 pools, `block_table`, `seq_lens`, `sinks`, `alibi`, `lse`); then those
/// of the Rust call: the cache's (`page_size`, heads and widths, pool and scale pool lengths, `block_table_len`, a sequence past its row, a page outside the pool as
/// `ATTN_STATUS_OUT_OF_BOUNDS` naming `block_table`), a keep or bias mask, a batch other than
/// 1, the packed views' shapes, bad or mismatched offsets, `lse_len`, the variants' values.
/// Nothing is written when a check fails.
///
/// # Safety
///
/// `args` is null or addresses `args->struct_size` readable, initialised bytes; each view's
/// `data` addresses the elements the view reaches; each pointer addresses the entries its
/// length says (`cu_seqlens_q` `batch + 1`); `mask` and `variants` are null or valid (with
/// `hq` floats at non-null sinks and slopes); outputs overlap nothing else (checked).
#[no_mangle]
pub unsafe extern "C" fn attn_paged_attention(args: *const AttnPagedArgs) -> AttnStatus {
    guard(|| {
        // SAFETY: the caller's contract; `AttnPagedArgs` is `repr(C)`, starts with its
        // `size_t struct_size`, and is valid when all-zero (integers, floats, raw pointers).
        let args =
            unsafe { raw::read_sized(("args", "args.struct_size"), args, &PAGED_ARGS_VERSIONS)? };
        // SAFETY: forwarded from the caller.
        unsafe { paged_call(&args) }
    })
}

/// The body of [`attn_paged_attention`].
///
/// # Safety
/// As [`attn_paged_attention`] (after `args` was read).
unsafe fn paged_call(a: &AttnPagedArgs) -> Result<(), Failure> {
    let scale = match a.has_scale {
        0 => None,
        1 => Some(a.scale),
        v => {
            return Err(Failure::BadValue {
                arg: "args.has_scale",
                value: i64::from(v),
                allowed: "must be 0 (the default scale 1/sqrt(dk)) or 1 (use args.scale)",
            })
        }
    };
    // SAFETY: forwarded from the caller.
    let variants = unsafe { CVariants::of_layer(a.variants)? };
    variants.window()?;
    let pools = [
        CPool {
            t: AttnDtype::from_c("args.k_dtype", a.k_dtype)?,
            ptr: a.k_pool,
            len: a.k_pool_len,
            scales: a.k_scales,
            scales_len: a.k_scales_len,
            names: ["k_pool", "k_scales"],
        },
        CPool {
            t: AttnDtype::from_c("args.v_dtype", a.v_dtype)?,
            ptr: a.v_pool,
            len: a.v_pool_len,
            scales: a.v_scales,
            scales_len: a.v_scales_len,
            names: ["v_pool", "v_scales"],
        },
    ];
    let (qt, ot) = (
        AttnDtype::floating("args.q_dtype", a.q_dtype)?,
        AttnDtype::floating("args.o_dtype", a.o_dtype)?,
    );
    let half = AttnHalfPath::from_c(a.half_path)?;
    let hq = a.q.dims[1];
    let cu_len = a
        .batch
        .checked_add(1)
        .ok_or(Failure::Api(attn_core::Error::IndexOverflow { arg: "cu_seqlens_q" }))?;
    let mut inputs = vec![a.q.typed_span("q", qt)?, span("cu_seqlens_q", a.cu_seqlens_q, cu_len)?];
    for pool in &pools {
        inputs.extend(pool.spans()?);
    }
    inputs.push(span("block_table", a.block_table, a.block_table_len)?);
    inputs.push(span("seq_lens", a.seq_lens, a.batch)?);
    inputs.extend(variants.spans(hq)?);
    // SAFETY: forwarded from the caller.
    inputs.extend(unsafe { mask_span(a.mask)? });
    disjoint(&[a.o.typed_span("o", ot)?, span("lse", a.lse, a.lse_len)?], &inputs)?;
    // SAFETY: the caller's contract; outputs checked disjoint from everything else.
    let (q, mask, o) =
        unsafe { (a.q.any_view("q", qt)?, mask_view(a.mask)?, a.o.any_view("o", ot)?) };
    // SAFETY: as above (inputs, and the one output `lse`).
    let (cu_q, k, v, block_table, seq_lens, lse) = unsafe {
        (
            slice("cu_seqlens_q", a.cu_seqlens_q, cu_len)?,
            pools[0].view()?,
            pools[1].view()?,
            slice("block_table", a.block_table, a.block_table_len)?,
            slice("seq_lens", a.seq_lens, a.batch)?,
            opt_mut("lse", a.lse, a.lse_len)?,
        )
    };
    let cache = PagedKv {
        k,
        v,
        page_size: a.page_size,
        kv_heads: a.kv_heads,
        dk: a.dk,
        dv: a.dv,
        block_table,
        max_pages: a.max_pages,
        seq_lens,
    };
    let mut p = PagedAttention::new(q, cu_q, cache)
        .mask(mask)
        .parallelism(threads(a.threads))
        .half_path(half);
    if let Some(scale) = scale {
        p = p.scale(scale);
    }
    if let Some(lse) = lse {
        p = p.lse(lse);
    }
    // SAFETY: the caller's contract (`hq` floats at each non-null pointer); inputs only.
    p = p.variants(unsafe { variants.view(hq)? });
    Ok(p.run(o)?)
}

/// The operands of one [`attn_append_kv`] call: new K/V rows of a packed batch appended to a
/// paged cache. The pools are `[num_pages, page_size, kv_heads, d]` row-major; sequence `b`
/// holds `seq_lens[b]` keys, its key `j` in slot `j mod page_size` of page
/// `block_table[b·max_pages + j / page_size]`. Rows `cu_seqlens_new[b] .. cu_seqlens_new[b +
/// 1]` of `k_new`/`v_new` become its keys and values `seq_lens[b] ..`; the caller then grows
/// `seq_lens[b]` by their count.
///
/// **Versioning** as `AttnAttentionArgs` (`struct_size` first, growing at the end; the first
/// version, through `v_new`, is 280 bytes on 64-bit targets; version 2 adds the element types
/// of the pools and of the new rows). Fields left zero give f32 pools and rows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnAppendKvArgs {
    /// `sizeof(AttnAppendKvArgs)` in the caller's header.
    pub struct_size: usize,
    /// The key pool, written in the appended slots only: elements of type `k_dtype`.
    pub k_pool: *mut c_void,
    /// Elements at `k_pool`: `num_pages·page_size·kv_heads·dk`.
    pub k_pool_len: usize,
    /// The value pool, written in the appended slots only: elements of type `v_dtype`.
    pub v_pool: *mut c_void,
    /// Elements at `v_pool`: `num_pages·page_size·kv_heads·dv` (the same page count).
    pub v_pool_len: usize,
    /// Token slots per page: a power of two from 16 to 256.
    pub page_size: usize,
    /// K/V heads per slot.
    pub kv_heads: usize,
    /// Key width (at least 1).
    pub dk: usize,
    /// Value width.
    pub dv: usize,
    /// `[batch, max_pages]` row-major page indices (`batch·max_pages` entries).
    pub block_table: *const u32,
    /// The number of entries at `block_table`.
    pub block_table_len: usize,
    /// Entries per row of `block_table`.
    pub max_pages: usize,
    /// Keys each sequence holds before the append, `batch` entries.
    pub seq_lens: *const usize,
    /// The number of sequences.
    pub batch: usize,
    /// `batch + 1` cumulative offsets of the new rows in `k_new`/`v_new`.
    pub cu_seqlens_new: *const usize,
    /// The new keys, packed `[1, kv_heads, total_new, dk]`.
    pub k_new: AttnTensor,
    /// The new values, packed `[1, kv_heads, total_new, dv]`.
    pub v_new: AttnTensor,
    // Version 2: element types. Zero: f32 pools and rows, as before.
    /// The element type of `k_pool` (an [`AttnDtype`] value, read as an `int32_t`): f32, bf16,
    /// f16 (each new value rounded to nearest even), or int8 blocks (`ATTN_DTYPE_Q8`: each
    /// block of 32 new values quantised, its scale written to `k_scales`).
    pub k_dtype: i32,
    /// The element type of `v_pool`, as `k_dtype` (scales to `v_scales`).
    pub v_dtype: i32,
    /// With `k_dtype = ATTN_DTYPE_Q8`: the key scale pool, `[num_pages, page_size, kv_heads,
    /// ⌈dk/32⌉]` floats, written in the appended slots only. Ignored (may be NULL) otherwise.
    pub k_scales: *mut f32,
    /// Floats at `k_scales`: `num_pages·page_size·kv_heads·⌈dk/32⌉`.
    pub k_scales_len: usize,
    /// With `v_dtype = ATTN_DTYPE_Q8`: the value scale pool, as `k_scales` for `dv`.
    pub v_scales: *mut f32,
    /// Floats at `v_scales`.
    pub v_scales_len: usize,
    /// The element type of `k_new`: f32, bf16 or f16 (`ATTN_DTYPE_Q8` is
    /// `ATTN_STATUS_UNSUPPORTED_DTYPE`: new rows are quantised by the call, not before).
    pub k_new_dtype: i32,
    /// The element type of `v_new`, as `k_new_dtype`.
    pub v_new_dtype: i32,
}

/// The smallest `struct_size` [`attn_append_kv`] accepts: the first version of
/// [`AttnAppendKvArgs`], through `v_new` (f32 pools and rows). Fixed for good.
const APPEND_ARGS_MIN_SIZE: usize =
    std::mem::offset_of!(AttnAppendKvArgs, v_new) + std::mem::size_of::<AttnTensor>();

/// Appends a batch's new K/V rows to their pages, every operand in one [`AttnAppendKvArgs`];
/// the Rust `append_kv` behind it. All checks happen before any write: the element types
/// (`ATTN_STATUS_INVALID_PARAMETER` naming `args.k_dtype`, `args.v_dtype`, `args.k_new_dtype`
/// or `args.v_new_dtype` for a value not listed, `ATTN_STATUS_UNSUPPORTED_DTYPE` for int8 new
/// rows), the null, bounds and overlap checks (`k_pool`, `v_pool`, `k_scales` and `v_scales`
/// for int8 pools, `block_table`, `seq_lens`, `cu_seqlens_new`, `k_new`, `v_new`), then the
/// cache's (`page_size`, head count and widths, pool and scale pool lengths in whole and
/// equal page counts, `block_table_len`), `cu_seqlens_new` (`ATTN_STATUS_INVALID_PARAMETER`
/// when decreasing or not from 0), every grown sequence within its row of the block table
/// (`ATTN_STATUS_INVALID_PARAMETER` naming `seq_lens`), every written page in the pool
/// (`ATTN_STATUS_OUT_OF_BOUNDS` naming `block_table`), no slot written twice and none held
/// by any sequence (`ATTN_STATUS_INVALID_PARAMETER` naming `block_table`), and the new views'
/// dims (`ATTN_STATUS_SHAPE_MISMATCH`), a NaN or infinite new row bound for an int8 pool
/// (`ATTN_STATUS_NON_FINITE` naming `k_new` or `v_new`). Runs on the calling thread.
///
/// # Safety
///
/// `args` is null or addresses `args->struct_size` readable, initialised bytes; each pointer
/// addresses the entries its length (or view) says; the pools overlap nothing else (checked).
#[no_mangle]
pub unsafe extern "C" fn attn_append_kv(args: *const AttnAppendKvArgs) -> AttnStatus {
    guard(|| {
        // SAFETY: the caller's contract; `AttnAppendKvArgs` is `repr(C)`, starts with its
        // `size_t struct_size`, and is valid when all-zero.
        let a = unsafe {
            raw::read_sized(("args", "args.struct_size"), args, &[APPEND_ARGS_MIN_SIZE])?
        };
        let pools = [
            CPool {
                t: AttnDtype::from_c("args.k_dtype", a.k_dtype)?,
                ptr: a.k_pool.cast_const(),
                len: a.k_pool_len,
                scales: a.k_scales.cast_const(),
                scales_len: a.k_scales_len,
                names: ["k_pool", "k_scales"],
            },
            CPool {
                t: AttnDtype::from_c("args.v_dtype", a.v_dtype)?,
                ptr: a.v_pool.cast_const(),
                len: a.v_pool_len,
                scales: a.v_scales.cast_const(),
                scales_len: a.v_scales_len,
                names: ["v_pool", "v_scales"],
            },
        ];
        let (kt, vt) = (
            AttnDtype::floating("args.k_new_dtype", a.k_new_dtype)?,
            AttnDtype::floating("args.v_new_dtype", a.v_new_dtype)?,
        );
        let cu_len = a
            .batch
            .checked_add(1)
            .ok_or(Failure::Api(attn_core::Error::IndexOverflow { arg: "cu_seqlens_new" }))?;
        let inputs = [
            span("block_table", a.block_table, a.block_table_len)?,
            span("seq_lens", a.seq_lens, a.batch)?,
            span("cu_seqlens_new", a.cu_seqlens_new, cu_len)?,
            a.k_new.typed_span("k_new", kt)?,
            a.v_new.typed_span("v_new", vt)?,
        ];
        let mut outputs = pools[0].spans()?;
        outputs.extend(pools[1].spans()?);
        disjoint(&outputs, &inputs)?;
        // SAFETY: the caller's contract; the pools and scale pools checked disjoint from each
        // other and from every input.
        let (k, v, block_table, seq_lens, cu_new, k_new, v_new) = unsafe {
            (
                pools[0].view_mut()?,
                pools[1].view_mut()?,
                slice("block_table", a.block_table, a.block_table_len)?,
                slice("seq_lens", a.seq_lens, a.batch)?,
                slice("cu_seqlens_new", a.cu_seqlens_new, cu_len)?,
                a.k_new.any_view("k_new", kt)?,
                a.v_new.any_view("v_new", vt)?,
            )
        };
        let mut cache = PagedKvMut {
            k,
            v,
            page_size: a.page_size,
            kv_heads: a.kv_heads,
            dk: a.dk,
            dv: a.dv,
            block_table,
            max_pages: a.max_pages,
            seq_lens,
        };
        Ok(append_kv(&mut cache, k_new, v_new, cu_new)?)
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::{c_char, CStr};
    use std::ptr::{null, null_mut};

    use super::super::{attn_last_error_message, AttnMaskKind};
    use super::*;
    use crate::{Mask, Parallelism, Tensor4Layout, TensorMut, TensorRef};

    fn last_error() -> String {
        let mut buf = vec![0 as c_char; 512];
        // SAFETY: `buf` holds 512 writable bytes.
        unsafe { attn_last_error_message(buf.as_mut_ptr(), buf.len()) };
        // SAFETY: the function NUL-terminates within `cap`.
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32 * 37 + seed * 11) % 23) as f32 / 11.5 - 1.0).collect()
    }

    /// `[total, heads, d]` storage as a packed view.
    fn packed(heads: usize, total: usize, d: usize) -> Tensor4Layout {
        Tensor4Layout::strided([1, heads, total, d], [0, d, heads * d, 1], 0)
    }

    fn tensor(data: &[f32], l: Tensor4Layout) -> AttnTensor {
        AttnTensor {
            data: data.as_ptr().cast(),
            dims: l.dims,
            strides: l.strides,
            offset: l.offset,
        }
    }

    // Three sequences (3, 0, 20 queries; 5, 2, 20 keys), hq 2, hkv 1, d 4.
    const CU_Q: [usize; 4] = [0, 3, 3, 23];
    const CU_K: [usize; 4] = [0, 5, 7, 27];
    const HQ: usize = 2;
    const D: usize = 4;

    struct Bufs {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        o: Vec<f32>,
        lse: Vec<f32>,
    }

    impl Bufs {
        fn new() -> Bufs {
            Bufs {
                q: vals(23 * HQ * D, 1),
                k: vals(27 * D, 2),
                v: vals(27 * D, 3),
                o: vec![f32::NAN; 23 * HQ * D],
                lse: vec![f32::NAN; HQ * 23],
            }
        }

        fn args(&mut self, mask: *const AttnMask) -> AttnVarlenArgs {
            let lo = packed(HQ, 23, D);
            AttnVarlenArgs {
                struct_size: std::mem::size_of::<AttnVarlenArgs>(),
                q: tensor(&self.q, lo),
                k: tensor(&self.k, packed(1, 27, D)),
                v: tensor(&self.v, packed(1, 27, D)),
                o: AttnTensorMut {
                    data: self.o.as_mut_ptr().cast(),
                    dims: lo.dims,
                    strides: lo.strides,
                    offset: 0,
                },
                cu_seqlens_q: CU_Q.as_ptr(),
                cu_seqlens_q_len: 4,
                cu_seqlens_k: CU_K.as_ptr(),
                cu_seqlens_k_len: 4,
                mask,
                scale: 0.0,
                has_scale: 0,
                path: 0,
                lse: self.lse.as_mut_ptr(),
                lse_len: self.lse.len(),
                threads: 2,
                variants: null(),
            }
        }

        fn rust(&self, mask: Mask<'_>) -> (Vec<f32>, Vec<f32>) {
            let (mut o, mut lse) = (vec![f32::NAN; self.o.len()], vec![f32::NAN; HQ * 23]);
            VarlenAttention::new(
                TensorRef::new(&self.q, packed(HQ, 23, D)),
                TensorRef::new(&self.k, packed(1, 27, D)),
                TensorRef::new(&self.v, packed(1, 27, D)),
                &CU_Q,
                &CU_K,
            )
            .mask(mask)
            .lse(&mut lse)
            .parallelism(Parallelism::Sequential)
            .run(TensorMut::new(&mut o, packed(HQ, 23, D)))
            .unwrap();
            (o, lse)
        }
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    fn causal() -> AttnMask {
        AttnMask {
            kind: AttnMaskKind::Causal as i32,
            causal_default_offset: 1,
            causal_offset: 0,
            keep: null(),
            bias: null(),
            dims: [0; 4],
            strides: [0; 4],
            offset: 0,
        }
    }

    fn run(a: &AttnVarlenArgs) -> AttnStatus {
        // SAFETY: every test builds `a` over live buffers whose views fit them.
        unsafe { attn_varlen_attention(a) }
    }

    #[test]
    fn first_version_sizes() {
        #[cfg(target_pointer_width = "64")]
        assert_eq!(
            (VARLEN_ARGS_MIN_SIZE, APPEND_ARGS_MIN_SIZE, PAGED_ARGS_MIN_SIZE),
            (416, 280, 328)
        );
        #[cfg(target_pointer_width = "64")]
        assert_eq!(
            (std::mem::size_of::<AttnAppendKvArgs>(), std::mem::size_of::<AttnPagedArgs>()),
            (280 + 48, 328 + 40 + 8 + 8)
        );
        #[cfg(target_pointer_width = "64")]
        assert_eq!(PAGED_ARGS_VERSIONS, [328, 368, 376]);
    }

    #[test]
    fn varlen_is_the_rust_api() {
        let mut b = Bufs::new();
        let m = causal();
        for mask in [null(), &m as *const AttnMask] {
            let a = b.args(mask);
            assert_eq!(run(&a), AttnStatus::Ok, "{}", last_error());
            let want = b.rust(if mask.is_null() { Mask::None } else { Mask::CAUSAL });
            assert_eq!((bits(&b.o), bits(&b.lse)), (bits(&want.0), bits(&want.1)));
        }
    }

    #[test]
    fn bad_varlen_arguments() {
        let mut b = Bufs::new();
        let base = b.args(null());
        let keep = AttnMask { kind: AttnMaskKind::Keep as i32, ..causal() };
        let bad_cu = [0usize, 4, 3, 23];
        let q_ptr = b.q.as_ptr();
        let cases: Vec<(AttnVarlenArgs, AttnStatus, &str)> = vec![
            (
                AttnVarlenArgs { struct_size: 8, ..base },
                AttnStatus::InvalidParameter,
                "args.struct_size",
            ),
            (
                AttnVarlenArgs { cu_seqlens_q: null(), ..base },
                AttnStatus::NullPointer,
                "`cu_seqlens_q`",
            ),
            (
                AttnVarlenArgs { cu_seqlens_q: bad_cu.as_ptr(), ..base },
                AttnStatus::InvalidParameter,
                "cu_seqlens_q",
            ),
            (
                AttnVarlenArgs { cu_seqlens_k_len: 3, ..base },
                AttnStatus::ShapeMismatch,
                "cu_seqlens_k",
            ),
            (
                AttnVarlenArgs { has_scale: 2, ..base },
                AttnStatus::InvalidParameter,
                "args.has_scale",
            ),
            (AttnVarlenArgs { path: 9, ..base }, AttnStatus::InvalidParameter, "args.path"),
            (AttnVarlenArgs { lse_len: 5, ..base }, AttnStatus::ShapeMismatch, "lse"),
            (
                AttnVarlenArgs { lse: q_ptr.cast_mut(), lse_len: 2, ..base },
                AttnStatus::AliasedOutput,
                "`lse` overlaps argument `q`",
            ),
        ];
        for (i, (a, status, arg)) in cases.into_iter().enumerate() {
            assert_eq!(run(&a), status, "case {i}: {}", last_error());
            assert!(last_error().contains(arg), "case {i}: {}", last_error());
            assert!(b.o.iter().all(|x| x.is_nan()), "case {i}: wrote on error");
        }
        // A keep mask with its elements: refused by the Rust call, naming `mask`.
        let bytes = vec![1u8; HQ * 23 * 27];
        let keep = AttnMask {
            keep: bytes.as_ptr(),
            dims: [1, HQ, 23, 27],
            strides: [0, 23 * 27, 27, 1],
            ..keep
        };
        assert_eq!(run(&AttnVarlenArgs { mask: &keep, ..base }), AttnStatus::InvalidParameter);
        assert!(last_error().contains("`mask`"), "{}", last_error());
        assert!(b.o.iter().all(|x| x.is_nan()));
    }

    /// Two sequences, page size 16, one K/V head, dk 2, dv 1; four pages.
    struct Cache {
        k: Vec<f32>,
        v: Vec<f32>,
        table: [u32; 4],
        lens: [usize; 2],
    }

    fn append_args(
        c: &mut Cache,
        cu: &[usize; 3],
        new_k: &[f32],
        new_v: &[f32],
    ) -> AttnAppendKvArgs {
        let total = cu[2];
        AttnAppendKvArgs {
            struct_size: std::mem::size_of::<AttnAppendKvArgs>(),
            k_pool: c.k.as_mut_ptr().cast(),
            k_pool_len: c.k.len(),
            v_pool: c.v.as_mut_ptr().cast(),
            v_pool_len: c.v.len(),
            page_size: 16,
            kv_heads: 1,
            dk: 2,
            dv: 1,
            block_table: c.table.as_ptr(),
            block_table_len: 4,
            max_pages: 2,
            seq_lens: c.lens.as_ptr(),
            batch: 2,
            cu_seqlens_new: cu.as_ptr(),
            k_new: tensor(new_k, packed(1, total, 2)),
            v_new: tensor(new_v, packed(1, total, 1)),
            k_dtype: 0,
            v_dtype: 0,
            k_scales: null_mut(),
            k_scales_len: 0,
            v_scales: null_mut(),
            v_scales_len: 0,
            k_new_dtype: 0,
            v_new_dtype: 0,
        }
    }

    #[test]
    fn append_writes_its_slots_and_checks_first() {
        let mut c = Cache {
            k: vec![-1.0; 4 * 16 * 2],
            v: vec![-1.0; 4 * 16],
            table: [3, 1, 0, 2],
            lens: [15, 0],
        };
        let (new_k, new_v) = ([1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [7.0f32, 8.0, 9.0]);
        let cu = [0usize, 2, 3];
        let a = append_args(&mut c, &cu, &new_k, &new_v);
        // SAFETY: the views and pointers address live buffers of the stated lengths.
        assert_eq!(unsafe { attn_append_kv(&a) }, AttnStatus::Ok, "{}", last_error());
        // Sequence 0: keys 15 (page 3, slot 15) and 16 (page 1, slot 0); sequence 1: key 0
        // (page 0, slot 0).
        assert_eq!((&c.k[(3 * 16 + 15) * 2..][..2], c.v[3 * 16 + 15]), (&[1.0, 2.0][..], 7.0));
        assert_eq!((&c.k[16 * 2..][..2], c.v[16]), (&[3.0, 4.0][..], 8.0));
        assert_eq!((&c.k[..2], c.v[0]), (&[5.0, 6.0][..], 9.0));
        assert_eq!(c.k.iter().filter(|&&x| x != -1.0).count(), 6);
        let before = (c.k.clone(), c.v.clone());
        // Both sequences writing page 1's slot 0: refused, nothing written.
        c.table = [3, 1, 1, 2];
        let a = append_args(&mut c, &cu, &new_k, &new_v);
        // SAFETY: as above.
        assert_eq!(unsafe { attn_append_kv(&a) }, AttnStatus::InvalidParameter);
        assert!(last_error().contains("block_table"), "{}", last_error());
        c.table = [3, 1, 0, 9];
        let far = [0usize, 0, 17];
        let k17 = [0.0f32; 34];
        let a = append_args(&mut c, &far, &k17, &k17[..17]);
        // SAFETY: as above.
        assert_eq!(unsafe { attn_append_kv(&a) }, AttnStatus::OutOfBounds);
        assert!(last_error().contains("block_table"), "{}", last_error());
        assert_eq!((c.k.clone(), c.v.clone()), before);
        // Null and overlapping pointers.
        let a = AttnAppendKvArgs { seq_lens: null(), ..append_args(&mut c, &cu, &new_k, &new_v) };
        // SAFETY: refused before anything is read.
        assert_eq!(unsafe { attn_append_kv(&a) }, AttnStatus::NullPointer);
        assert!(last_error().contains("`seq_lens`"), "{}", last_error());
        let a = append_args(&mut c, &cu, &new_k, &new_v);
        let a = AttnAppendKvArgs { v_pool: a.k_pool, v_pool_len: 64, ..a };
        // SAFETY: refused before anything is read.
        assert_eq!(unsafe { attn_append_kv(&a) }, AttnStatus::AliasedOutput);
        let a = AttnAppendKvArgs { k_pool: null_mut(), ..append_args(&mut c, &cu, &new_k, &new_v) };
        // SAFETY: refused before anything is read.
        assert_eq!(unsafe { attn_append_kv(&a) }, AttnStatus::NullPointer);
        assert_eq!((c.k, c.v), before);
    }

    /// Three sequences (1, 3 and 1 queries; 20, 3 and 0 keys) in pages of 16, hq 2, hkv 1,
    /// d 4: pages 2, 0 for sequence 0, page 1 for sequence 1.
    struct Paged {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        o: Vec<f32>,
        lse: Vec<f32>,
    }

    const PAGED_CU: [usize; 4] = [0, 1, 4, 5];
    const PAGED_TABLE: [u32; 6] = [2, 0, 1, 9, 9, 9];
    const PAGED_LENS: [usize; 3] = [20, 3, 0];

    impl Paged {
        fn new() -> Paged {
            Paged {
                q: vals(5 * HQ * D, 4),
                k: vals(3 * 16 * D, 5),
                v: vals(3 * 16 * D, 6),
                o: vec![f32::NAN; 5 * HQ * D],
                lse: vec![f32::NAN; HQ * 5],
            }
        }

        fn args(&mut self, mask: *const AttnMask) -> AttnPagedArgs {
            let lo = packed(HQ, 5, D);
            AttnPagedArgs {
                struct_size: std::mem::size_of::<AttnPagedArgs>(),
                q: tensor(&self.q, lo),
                o: AttnTensorMut {
                    data: self.o.as_mut_ptr().cast(),
                    dims: lo.dims,
                    strides: lo.strides,
                    offset: 0,
                },
                cu_seqlens_q: PAGED_CU.as_ptr(),
                k_pool: self.k.as_ptr().cast(),
                k_pool_len: self.k.len(),
                v_pool: self.v.as_ptr().cast(),
                v_pool_len: self.v.len(),
                page_size: 16,
                kv_heads: 1,
                dk: D,
                dv: D,
                block_table: PAGED_TABLE.as_ptr(),
                block_table_len: 6,
                max_pages: 2,
                seq_lens: PAGED_LENS.as_ptr(),
                batch: 3,
                mask,
                scale: 0.0,
                has_scale: 0,
                lse: self.lse.as_mut_ptr(),
                lse_len: self.lse.len(),
                threads: 2,
                variants: null(),
                k_dtype: 0,
                v_dtype: 0,
                k_scales: null(),
                k_scales_len: 0,
                v_scales: null(),
                v_scales_len: 0,
                q_dtype: 0,
                o_dtype: 0,
                half_path: 0,
            }
        }

        /// The cache over the f32 pools.
        fn cache(&self) -> PagedKv<'_> {
            paged_cache(PagePool::F32(&self.k), PagePool::F32(&self.v))
        }

        fn rust(&self, mask: Mask<'_>) -> (Vec<f32>, Vec<f32>) {
            let (mut o, mut lse) = (vec![f32::NAN; self.o.len()], vec![f32::NAN; HQ * 5]);
            PagedAttention::new(TensorRef::new(&self.q, packed(HQ, 5, D)), &PAGED_CU, self.cache())
                .mask(mask)
                .lse(&mut lse)
                .run(TensorMut::new(&mut o, packed(HQ, 5, D)))
                .unwrap();
            (o, lse)
        }
    }

    /// The test cache's table and lengths over the pools `k` and `v`.
    fn paged_cache<'a>(k: PagePool<'a>, v: PagePool<'a>) -> PagedKv<'a> {
        PagedKv {
            k,
            v,
            page_size: 16,
            kv_heads: 1,
            dk: D,
            dv: D,
            block_table: &PAGED_TABLE,
            max_pages: 2,
            seq_lens: &PAGED_LENS,
        }
    }

    fn run_paged(a: &AttnPagedArgs) -> AttnStatus {
        // SAFETY: every test builds `a` over live buffers whose views fit them.
        unsafe { attn_paged_attention(a) }
    }

    #[test]
    fn paged_is_the_rust_api() {
        let mut b = Paged::new();
        let m = causal();
        for mask in [null(), &m as *const AttnMask] {
            let a = b.args(mask);
            assert_eq!(run_paged(&a), AttnStatus::Ok, "{}", last_error());
            let want = b.rust(if mask.is_null() { Mask::None } else { Mask::CAUSAL });
            assert_eq!((bits(&b.o), bits(&b.lse)), (bits(&want.0), bits(&want.1)));
        }
    }

    #[test]
    fn bad_paged_arguments() {
        let mut b = Paged::new();
        let base = b.args(null());
        let far = [2u32, 7, 1, 9, 9, 9];
        let bad_cu = [0usize, 2, 1, 5];
        let q_ptr = b.q.as_ptr();
        let cases: Vec<(AttnPagedArgs, AttnStatus, &str)> = vec![
            (
                AttnPagedArgs { struct_size: 8, ..base },
                AttnStatus::InvalidParameter,
                "args.struct_size",
            ),
            (AttnPagedArgs { k_pool: null(), ..base }, AttnStatus::NullPointer, "`k_pool`"),
            (
                AttnPagedArgs { block_table: far.as_ptr(), ..base },
                AttnStatus::OutOfBounds,
                "block_table",
            ),
            (
                AttnPagedArgs { cu_seqlens_q: bad_cu.as_ptr(), ..base },
                AttnStatus::InvalidParameter,
                "cu_seqlens_q",
            ),
            (AttnPagedArgs { page_size: 24, ..base }, AttnStatus::InvalidParameter, "page_size"),
            (AttnPagedArgs { v_pool_len: 100, ..base }, AttnStatus::ShapeMismatch, "v"),
            (
                AttnPagedArgs { has_scale: 2, ..base },
                AttnStatus::InvalidParameter,
                "args.has_scale",
            ),
            (AttnPagedArgs { lse_len: 5, ..base }, AttnStatus::ShapeMismatch, "lse"),
            (
                AttnPagedArgs { lse: q_ptr.cast_mut(), lse_len: 2, ..base },
                AttnStatus::AliasedOutput,
                "`lse` overlaps argument `q`",
            ),
        ];
        for (i, (a, status, arg)) in cases.into_iter().enumerate() {
            assert_eq!(run_paged(&a), status, "case {i}: {}", last_error());
            assert!(last_error().contains(arg), "case {i}: {}", last_error());
            assert!(b.o.iter().all(|x| x.is_nan()), "case {i}: wrote on error");
        }
    }

    /// Version 2 of `AttnPagedArgs`: int8 keys and bf16 values, the same bits as the Rust call
    /// on the same pools; version 1 (`struct_size` 328, f32 pools) still runs; the element
    /// types' and scale pools' errors.
    #[test]
    fn typed_paged_is_the_rust_api() {
        let mut b = Paged::new();
        let slots = 3 * 16;
        let kq: Vec<i8> = (0..slots * D).map(|i| (i as i32 * 37 % 255 - 127) as i8).collect();
        let ks: Vec<f32> = (0..slots).map(|i| 0.01 + i as f32 / 4096.0).collect();
        let vb: Vec<bf16> = b.v.iter().map(|&x| bf16::from_f32(x)).collect();
        let base = AttnPagedArgs {
            k_pool: kq.as_ptr().cast(),
            k_pool_len: kq.len(),
            v_pool: vb.as_ptr().cast(),
            v_pool_len: vb.len(),
            k_dtype: AttnDtype::Q8 as i32,
            v_dtype: AttnDtype::Bf16 as i32,
            k_scales: ks.as_ptr(),
            k_scales_len: ks.len(),
            ..b.args(null())
        };
        assert_eq!(run_paged(&base), AttnStatus::Ok, "{}", last_error());
        let (mut o, mut lse) = (vec![f32::NAN; b.o.len()], vec![f32::NAN; HQ * 5]);
        let cache = paged_cache(PagePool::Q8 { values: &kq, scales: &ks }, PagePool::BF16(&vb));
        PagedAttention::new(TensorRef::new(&b.q, packed(HQ, 5, D)), &PAGED_CU, cache)
            .lse(&mut lse)
            .run(TensorMut::new(&mut o, packed(HQ, 5, D)))
            .unwrap();
        assert_eq!((bits(&b.o), bits(&b.lse)), (bits(&o), bits(&lse)));
        // Version 1: the dtype fields are not read (f32 pools).
        b.o.fill(f32::NAN);
        let v1 = AttnPagedArgs { struct_size: PAGED_ARGS_MIN_SIZE, ..b.args(null()) };
        assert_eq!(run_paged(&v1), AttnStatus::Ok, "{}", last_error());
        assert_eq!(bits(&b.o), bits(&b.rust(Mask::None).0));
        b.o.fill(f32::NAN);
        let cases = [
            (AttnPagedArgs { k_dtype: 4, ..base }, AttnStatus::InvalidParameter, "args.k_dtype"),
            (AttnPagedArgs { v_dtype: -1, ..base }, AttnStatus::InvalidParameter, "args.v_dtype"),
            (AttnPagedArgs { k_scales: null(), ..base }, AttnStatus::NullPointer, "`k_scales`"),
            (
                AttnPagedArgs { k_scales_len: ks.len() - 1, ..base },
                AttnStatus::ShapeMismatch,
                "k_scales",
            ),
            // No scale pool (NULL, length 0) for int8 values: an empty one, of the wrong length.
            (
                AttnPagedArgs { v_dtype: AttnDtype::Q8 as i32, ..base },
                AttnStatus::ShapeMismatch,
                "v_scales",
            ),
            (
                AttnPagedArgs { lse: ks.as_ptr().cast_mut(), lse_len: 10, ..base },
                AttnStatus::AliasedOutput,
                "`lse` overlaps argument `k_scales`",
            ),
        ];
        for (i, (a, status, arg)) in cases.into_iter().enumerate() {
            assert_eq!(run_paged(&a), status, "case {i}: {}", last_error());
            assert!(last_error().contains(arg), "case {i}: {}", last_error());
            assert!(b.o.iter().all(|x| x.is_nan()), "case {i}: wrote on error");
        }
    }

    /// Version 3 of `AttnPagedArgs`: bf16 queries and an f16 output, the same bits as the
    /// Rust call; a version-2 struct reads them as f32; int8 queries are
    /// `ATTN_STATUS_UNSUPPORTED_DTYPE`, an unknown type an invalid parameter.
    #[test]
    fn typed_queries_and_output_paged_is_the_rust_api() {
        let mut b = Paged::new();
        let qb: Vec<bf16> = b.q.iter().map(|&x| bf16::from_f32(x)).collect();
        let mut oh = vec![f16::NAN; b.o.len()];
        let lo = packed(HQ, 5, D);
        let base = AttnPagedArgs {
            q: AttnTensor { data: qb.as_ptr().cast(), ..tensor(&b.q, lo) },
            o: AttnTensorMut {
                data: oh.as_mut_ptr().cast(),
                dims: lo.dims,
                strides: lo.strides,
                offset: 0,
            },
            q_dtype: AttnDtype::Bf16 as i32,
            o_dtype: AttnDtype::F16 as i32,
            ..b.args(null())
        };
        assert_eq!(run_paged(&base), AttnStatus::Ok, "{}", last_error());
        let (mut want, mut lse) = (vec![f16::NAN; oh.len()], vec![f32::NAN; HQ * 5]);
        PagedAttention::new(TensorRef::new(&qb, lo), &PAGED_CU, b.cache())
            .lse(&mut lse)
            .run(TensorMut::new(&mut want, lo))
            .unwrap();
        let hbits = |x: &[f16]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!((hbits(&oh), bits(&b.lse)), (hbits(&want), bits(&lse)));
        // Version 2 (through `v_scales_len`): q and o are f32, whatever follows.
        let v2 = std::mem::offset_of!(AttnPagedArgs, q_dtype);
        b.o.fill(f32::NAN);
        let old = AttnPagedArgs { struct_size: v2, ..b.args(null()) };
        assert_eq!(run_paged(&old), AttnStatus::Ok, "{}", last_error());
        assert_eq!(bits(&b.o), bits(&b.rust(Mask::None).0));
        oh.fill(f16::NAN);
        for (a, status, arg) in [
            (
                AttnPagedArgs { q_dtype: AttnDtype::Q8 as i32, ..base },
                AttnStatus::UnsupportedDtype,
                "args.q_dtype",
            ),
            (AttnPagedArgs { o_dtype: 9, ..base }, AttnStatus::InvalidParameter, "args.o_dtype"),
        ] {
            assert_eq!(run_paged(&a), status, "{}", last_error());
            assert!(last_error().contains(arg), "{}", last_error());
            assert!(oh.iter().all(|x| x.is_nan()), "wrote on error");
        }
    }

    /// Version 4 of `AttnPagedArgs`: `half_path`. With bf16 queries and pools,
    /// `ATTN_HALF_PATH_DOT` gives the same bits as the Rust call with `HalfPath::Dot` where
    /// this CPU has AVX512_BF16 (else the Rust call's error, naming `path`); a version-3
    /// struct reads it as 0 (widen); an unknown value, or Dot over f32 pools, is refused.
    #[test]
    fn half_path_paged_is_the_rust_api() {
        use crate::gemm::{bf16_dot_available, HalfPath};
        let mut b = Paged::new();
        let half = |x: &[f32]| x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<bf16>>();
        let (qb, kb, vb) = (half(&b.q), half(&b.k), half(&b.v));
        let lo = packed(HQ, 5, D);
        let base = AttnPagedArgs {
            q: AttnTensor { data: qb.as_ptr().cast(), ..tensor(&b.q, lo) },
            k_pool: kb.as_ptr().cast(),
            v_pool: vb.as_ptr().cast(),
            q_dtype: AttnDtype::Bf16 as i32,
            k_dtype: AttnDtype::Bf16 as i32,
            v_dtype: AttnDtype::Bf16 as i32,
            half_path: AttnHalfPath::Dot as i32,
            ..b.args(null())
        };
        let cache = paged_cache(PagePool::BF16(&kb), PagePool::BF16(&vb));
        let rust = |path: HalfPath| {
            let (mut o, mut lse) = (vec![f32::NAN; 5 * HQ * D], vec![f32::NAN; HQ * 5]);
            let r = PagedAttention::new(TensorRef::new(&qb, lo), &PAGED_CU, cache)
                .lse(&mut lse)
                .parallelism(crate::Parallelism::threads(2))
                .half_path(path)
                .run(TensorMut::new(&mut o, lo));
            r.map(|()| (bits(&o), bits(&lse)))
        };
        let status = run_paged(&base);
        match rust(HalfPath::Dot) {
            Ok(want) => {
                assert!(bf16_dot_available());
                assert_eq!(status, AttnStatus::Ok, "{}", last_error());
                assert_eq!((bits(&b.o), bits(&b.lse)), want);
            }
            Err(e) => {
                assert!(!bf16_dot_available(), "{e}");
                assert_eq!(status, AttnStatus::InvalidParameter, "{}", last_error());
                assert!(last_error().contains("path"), "{}", last_error());
            }
        }
        // Version 3 (through `o_dtype`): `half_path` is not read, so the call widens.
        b.o.fill(f32::NAN);
        let v3 =
            AttnPagedArgs { struct_size: std::mem::offset_of!(AttnPagedArgs, half_path), ..base };
        assert_eq!(run_paged(&v3), AttnStatus::Ok, "{}", last_error());
        let widen = rust(HalfPath::Widen).unwrap();
        assert_eq!((bits(&b.o), bits(&b.lse)), widen);
        b.o.fill(f32::NAN);
        let f32_pools = AttnPagedArgs {
            k_pool: b.k.as_ptr().cast(),
            v_pool: b.v.as_ptr().cast(),
            k_dtype: 0,
            v_dtype: 0,
            ..base
        };
        for (a, arg) in [
            (AttnPagedArgs { half_path: 3, ..base }, "args.half_path"),
            (AttnPagedArgs { half_path: -1, ..base }, "args.half_path"),
            (f32_pools, "path"),
        ] {
            assert_eq!(run_paged(&a), AttnStatus::InvalidParameter, "{}", last_error());
            assert!(last_error().contains(arg), "{}", last_error());
            assert!(b.o.iter().all(|x| x.is_nan()), "wrote on error");
        }
    }

    /// Version 2 of `AttnAppendKvArgs`: bf16 rows into an int8 key pool and an f16 value pool,
    /// the same bits as the Rust append; the element types' errors, nothing written.
    #[test]
    fn typed_append_is_the_rust_api() {
        let (dk, dv) = (2usize, 1usize);
        let cu = [0usize, 2, 3];
        let new_k: Vec<bf16> = [1.0f32, -2.0, 3.0, 0.5, 5.0, 6.0].map(bf16::from_f32).to_vec();
        let new_v: Vec<bf16> = [7.0f32, 8.0, 9.0].map(bf16::from_f32).to_vec();
        let fresh = || {
            (vec![0i8; 4 * 16 * dk], vec![f32::NAN; 4 * 16], vec![f16::from_f32(-1.0); 4 * 16 * dv])
        };
        let (mut kq, mut ks, mut vh) = fresh();
        let mut c = Cache { k: vec![], v: vec![], table: [3, 1, 0, 2], lens: [15, 0] };
        let nk = [0.0f32; 6];
        let base = AttnAppendKvArgs {
            k_pool: kq.as_mut_ptr().cast(),
            k_pool_len: kq.len(),
            v_pool: vh.as_mut_ptr().cast(),
            v_pool_len: vh.len(),
            k_dtype: AttnDtype::Q8 as i32,
            v_dtype: AttnDtype::F16 as i32,
            k_scales: ks.as_mut_ptr(),
            k_scales_len: ks.len(),
            k_new: AttnTensor { data: new_k.as_ptr().cast(), ..tensor(&nk, packed(1, 3, dk)) },
            v_new: AttnTensor { data: new_v.as_ptr().cast(), ..tensor(&nk, packed(1, 3, dv)) },
            k_new_dtype: AttnDtype::Bf16 as i32,
            v_new_dtype: AttnDtype::Bf16 as i32,
            ..append_args(&mut c, &cu, &nk, &nk[..3])
        };
        let before = (kq.clone(), bits(&ks), vh.clone());
        let cases = [
            (
                AttnAppendKvArgs { k_new_dtype: AttnDtype::Q8 as i32, ..base },
                AttnStatus::UnsupportedDtype,
                "args.k_new_dtype",
            ),
            (AttnAppendKvArgs { v_dtype: 9, ..base }, AttnStatus::InvalidParameter, "args.v_dtype"),
            (
                AttnAppendKvArgs { k_scales: null_mut(), ..base },
                AttnStatus::NullPointer,
                "`k_scales`",
            ),
            (
                AttnAppendKvArgs { k_scales: kq.as_mut_ptr().cast(), k_scales_len: 4, ..base },
                AttnStatus::AliasedOutput,
                "k_pool",
            ),
            (
                AttnAppendKvArgs { k_scales_len: 4 * 16 - 1, ..base },
                AttnStatus::ShapeMismatch,
                "k_scales",
            ),
        ];
        for (i, (a, status, arg)) in cases.into_iter().enumerate() {
            // SAFETY: the views and pointers address live buffers of the stated lengths.
            assert_eq!(unsafe { attn_append_kv(&a) }, status, "case {i}: {}", last_error());
            assert!(last_error().contains(arg), "case {i}: {}", last_error());
        }
        assert_eq!((kq.clone(), bits(&ks), vh.clone()), before, "wrote on error");
        // SAFETY: as above.
        assert_eq!(unsafe { attn_append_kv(&base) }, AttnStatus::Ok, "{}", last_error());
        let (mut kq2, mut ks2, mut vh2) = fresh();
        let mut cache = PagedKvMut {
            k: PagePoolMut::Q8 { values: &mut kq2, scales: &mut ks2 },
            v: PagePoolMut::F16(&mut vh2),
            page_size: 16,
            kv_heads: 1,
            dk,
            dv,
            block_table: &c.table,
            max_pages: 2,
            seq_lens: &c.lens,
        };
        let (lk, lv) = (packed(1, 3, dk), packed(1, 3, dv));
        append_kv(&mut cache, TensorRef::new(&new_k[..], lk), TensorRef::new(&new_v[..], lv), &cu)
            .unwrap();
        assert_eq!((kq, bits(&ks), vh), (kq2, bits(&ks2), vh2));
    }
}
