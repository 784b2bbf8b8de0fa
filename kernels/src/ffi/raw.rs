//! The only `unsafe` of the C ABI: turning the caller's pointers and the lengths implied by
//! their views into slices, and the overlap check that makes `&`/`&mut` pairs sound.

use attn_core::{Error, MatLayout, Tensor4Layout};

/// Why a C call failed before or inside the Rust API.
pub(crate) enum Failure {
    /// The Rust API's error.
    Api(Error),
    /// A pointer that must address at least one element is null.
    Null(&'static str),
    /// An output's memory overlaps another operand's (`ATTN_STATUS_ALIASED_OUTPUT`).
    Overlap {
        /// The output.
        output: &'static str,
        /// The operand it overlaps.
        other: &'static str,
    },
    /// An integer field that stands for an enum or a bool holds another value
    /// (`ATTN_STATUS_INVALID_PARAMETER`).
    BadValue {
        /// The field, e.g. `mask.kind`.
        arg: &'static str,
        /// The value found.
        value: i64,
        /// The values it may take.
        allowed: &'static str,
    },
    /// An element type the operand cannot take (`ATTN_STATUS_UNSUPPORTED_DTYPE`).
    Unsupported {
        /// The field, e.g. `args.q_dtype`.
        arg: &'static str,
        /// Why, and what it may be.
        what: &'static str,
    },
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Api(e)
    }
}

/// Elements a view needs, or the IndexOverflow error naming it.
pub(crate) fn mat_len(arg: &'static str, l: &MatLayout) -> Result<usize, Failure> {
    l.required_len().ok_or(Failure::Api(Error::IndexOverflow { arg }))
}

/// Elements a 4-D view needs, or the IndexOverflow error naming it.
pub(crate) fn tensor_len(arg: &'static str, l: &Tensor4Layout) -> Result<usize, Failure> {
    l.required_len().ok_or(Failure::Api(Error::IndexOverflow { arg }))
}

/// `len` elements at `ptr` as a shared slice; an empty slice for `len = 0` whatever `ptr` is.
///
/// # Safety
///
/// For `len > 0` and non-null `ptr`: `ptr` is aligned and addresses `len` initialised elements
/// that stay valid and are not written through any other pointer for `'a` (in particular they
/// do not overlap an output of the same call, which [`disjoint`] checks).
pub(crate) unsafe fn slice<'a, T>(
    arg: &'static str,
    ptr: *const T,
    len: usize,
) -> Result<&'a [T], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    check_ptr(arg, ptr, len)?;
    // SAFETY: non-null, aligned (checked), at most isize::MAX bytes (checked), and the caller
    // guarantees `len` valid elements not written by anyone else meanwhile.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// `len` elements at `ptr` as an exclusive slice; an empty slice for `len = 0`.
///
/// # Safety
///
/// For `len > 0` and non-null `ptr`: `ptr` is aligned and addresses `len` initialised elements
/// that no other pointer reads or writes for `'a` (checked against the call's other operands by
/// [`disjoint`] before the slices are made).
pub(crate) unsafe fn slice_mut<'a, T>(
    arg: &'static str,
    ptr: *mut T,
    len: usize,
) -> Result<&'a mut [T], Failure> {
    if len == 0 {
        return Ok(&mut []);
    }
    check_ptr(arg, ptr, len)?;
    // SAFETY: non-null, aligned and at most isize::MAX bytes (checked); the caller guarantees
    // `len` valid elements used by nobody else meanwhile.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// Null, misaligned, or more than `isize::MAX` bytes (which no allocation can be): refused
/// before a slice is made.
fn check_ptr<T>(arg: &'static str, ptr: *const T, len: usize) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::Null(arg));
    }
    if !ptr.is_aligned() {
        return Err(Failure::Api(Error::InvalidParameter {
            arg,
            requirement: "pointer must be aligned to its element type",
        }));
    }
    if len > isize::MAX as usize / std::mem::size_of::<T>().max(1) {
        return Err(Failure::Api(Error::IndexOverflow { arg }));
    }
    Ok(())
}

/// A byte range a call reads or writes: (name, start address, length in bytes).
pub(crate) type Span = (&'static str, usize, usize);

/// The byte range of `len` elements of `T` at `ptr`. A null pointer spans nothing (the call
/// fails with `NULL_POINTER` when it makes the slice, or the pointer means "none"), so it never
/// overlaps anything. A range of more than `isize::MAX` bytes, or one that wraps around the
/// address space, is the IndexOverflow error naming `arg`: no buffer is that large.
pub(crate) fn span<T>(arg: &'static str, ptr: *const T, len: usize) -> Result<Span, Failure> {
    if ptr.is_null() || len == 0 {
        return Ok((arg, ptr as usize, 0));
    }
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize && (ptr as usize).checked_add(b).is_some());
    match bytes {
        Some(b) => Ok((arg, ptr as usize, b)),
        None => Err(Failure::Api(Error::IndexOverflow { arg })),
    }
}

/// True when the two ranges share a byte (empty ranges share none).
pub(crate) fn overlap(a: &Span, b: &Span) -> bool {
    a.2 > 0 && b.2 > 0 && a.1 < b.1 + b.2 && b.1 < a.1 + a.2
}

/// Checks that each output range overlaps no other range (inputs or outputs): a C caller may
/// pass the same buffer twice, which a Rust `&mut` must not alias. Errors with
/// [`Failure::Overlap`] naming the output and the first operand it overlaps.
pub(crate) fn disjoint(outputs: &[Span], inputs: &[Span]) -> Result<(), Failure> {
    for (i, o) in outputs.iter().enumerate() {
        let mut others = outputs.iter().skip(i + 1).chain(inputs);
        if let Some(x) = others.find(|x| overlap(o, x)) {
            return Err(Failure::Overlap { output: o.0, other: x.0 });
        }
    }
    Ok(())
}

/// `bytes` as C `bool`s, after checking that each is 0 or 1 (any other byte is not a valid
/// Rust `bool`): the error names `arg` and the first bad value.
pub(crate) fn bools<'a>(arg: &'static str, bytes: &'a [u8]) -> Result<&'a [bool], Failure> {
    if let Some(&b) = bytes.iter().find(|&&b| b > 1) {
        return Err(Failure::BadValue {
            arg,
            value: i64::from(b),
            allowed: "every byte of a keep-mask (gaps between strided elements included) must \
                      be 0 (masked) or 1 (attend)",
        });
    }
    // SAFETY: every byte is 0 or 1, the two valid `bool`s, which have the size and alignment
    // of `u8`; the lifetime and the absence of writers carry over from `bytes`.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<bool>(), bytes.len()) })
}

/// The largest `struct_size` a versioned struct may declare: far above any version, and a
/// bound on what a garbage size (an uninitialised field) makes the library read.
pub(crate) const MAX_STRUCT_SIZE: usize = 4096;

/// The caller's versioned struct at `ptr` (one that starts with `size_t struct_size` and grows
/// only at its end) as the version `T` this library knows: the first
/// `min(struct_size, size_of::<T>())` bytes copied over an all-zero `T`, so a field the
/// caller's (older) version does not have reads as zero. `versions` lists the sizes of the
/// earlier versions, the first one first. Errors, in this order: a null `ptr`
/// (`Null(arg)`), a `ptr` not aligned for `T`, a `struct_size` below `versions[0]` or above
/// [`MAX_STRUCT_SIZE`], one below `size_of::<T>()` that is no version's size (it would cut a
/// field in two), and a nonzero byte past `size_of::<T>()` (a field of a newer version
/// that this library would ignore), the last three naming `size_arg` (the field, e.g. `args.struct_size`).
///
/// # Safety
///
/// `T` is `repr(C)`, its first field is a `usize`, and every field is an integer, a float, a
/// raw pointer or an array or `repr(C)` struct of those (so all-zero bytes, or any bytes, are a
/// valid `T`); `versions` is not empty and `versions[0] ≥ size_of::<usize>()`. A non-null, aligned `ptr` addresses
/// `struct_size` readable, initialised bytes.
pub(crate) unsafe fn read_sized<T: Copy>(
    (arg, size_arg): (&'static str, &'static str),
    ptr: *const T,
    versions: &[usize],
) -> Result<T, Failure> {
    let min_size = versions[0];
    if ptr.is_null() {
        return Err(Failure::Null(arg));
    }
    if !ptr.is_aligned() {
        return Err(Failure::Api(Error::InvalidParameter {
            arg,
            requirement: "pointer must be aligned to its struct type",
        }));
    }
    debug_assert!(min_size >= std::mem::size_of::<usize>());
    // SAFETY: non-null and aligned for `T`, whose first field is a `usize` (so it is aligned
    // for `usize` too), which the caller guarantees readable.
    let size = unsafe { ptr.cast::<usize>().read() };
    let bad = |allowed| {
        Err(Failure::BadValue {
            arg: size_arg,
            value: i64::try_from(size).unwrap_or(i64::MAX),
            allowed,
        })
    };
    if size < min_size {
        return bad("must be sizeof the struct in the caller's header (set it to sizeof, and \
                    at least the struct's first version)");
    }
    if size > MAX_STRUCT_SIZE {
        return bad("must be sizeof the struct in the caller's header (at most 4096 bytes)");
    }
    let known = std::mem::size_of::<T>();
    if size < known && !versions.contains(&size) {
        return bad("must be sizeof the struct in the caller's header (this size is between two \
                    versions of it)");
    }
    let bytes = ptr.cast::<u8>();
    if size > known {
        // SAFETY: the caller guarantees `size` readable, initialised bytes at `ptr`.
        let newer = unsafe { std::slice::from_raw_parts(bytes.add(known), size - known) };
        if newer.iter().any(|&b| b != 0) {
            return bad("this library knows a smaller version of the struct: the bytes past \
                        it must be zero (they hold a setting this library does not know)");
        }
    }
    let mut out = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: `min(size, known)` bytes are readable at `ptr` and writable in `out`, and the two
    // do not overlap (`out` is a local).
    unsafe { std::ptr::copy_nonoverlapping(bytes, out.as_mut_ptr().cast::<u8>(), size.min(known)) };
    // SAFETY: all-zero bytes overwritten by a prefix of the caller's bytes are a valid `T` (its
    // fields accept any bytes, per the contract).
    Ok(unsafe { out.assume_init() })
}
