//! Batches as inference engines hold them (issue 23): sequences of different lengths packed
//! along the token axis, and a paged K/V cache.
//!
//! - [`VarlenAttention`] (`varlen`): attention over a packed batch (`cu_seqlens_q`,
//!   `cu_seqlens_k`), each sequence with its own causal offset, no work for padding; it runs
//!   [`Attention`](crate::attention::Attention) on the sequences' views, split into fixed
//!   query chunks that the threads share.
//! - [`PagedAttention`] (`paged`): attention of packed queries (decode, chunked prefill)
//!   against a [`PagedKv`] cache, reading the pages in place on the decode path's machinery.
//! - [`append_kv`] (`cache`): writes a batch's new K/V rows into their pages of a
//!   [`PagedKvMut`] pool, after checking every index and that no two sequences write one slot.
//!
//! The vocabulary ([`SeqOffsets`], [`PagedKv`], [`PagedKvMut`], [`packed_seq`]) is
//! `attn_core::batch`'s; the reference's `attn_reference::batch` has the same contracts.

mod cache;
mod paged;
mod varlen;

pub use attn_core::batch::{packed_seq, PagePool, PagePoolMut, PagedKv, PagedKvMut, SeqOffsets};
pub use cache::append_kv;
pub use paged::{PagedAttention, PAGED_Q_PIECE};
pub use varlen::{VarlenAttention, VARLEN_Q_CHUNK};
