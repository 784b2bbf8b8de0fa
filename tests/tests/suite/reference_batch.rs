//! The reference's packed variable-length and paged-cache attention (issue 23) against dense
//! formulations written independently here, on random batches:
//! - varlen against the same sequences padded into one dense batch, with a keep-mask that
//!   hides the padding (and holds each sequence's own causal diagonal);
//! - paged against dense attention per sequence, the cache built by scattering each
//!   sequence's keys into shuffled pages, with a shared prefix page.
//!
//! Both sides perform the same f64 operations on the same values (masked positions add exact
//! zeros), so they agree to the bit.

use attn_reference::attention::{attention_with_variants, Variants};
use attn_reference::batch::{attention_paged, attention_varlen, PagePool, PagedKv};
use attn_reference::*;
use proptest::prelude::*;

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A deterministic value for element `x` of operand `seed` (in [−2, 2)).
fn val(seed: u64, x: usize) -> f32 {
    let mut h = (x as u64 ^ (seed << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 29;
    ((h >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
}

/// `[tokens, heads, d]` storage as a packed `[1, heads, tokens, d]` layout.
fn packed(heads: usize, tokens: usize, d: usize) -> Tensor4Layout {
    Tensor4Layout { dims: [1, heads, tokens, d], strides: [0, d, heads * d, 1], offset: 0 }
}

fn cumulative(lens: &[usize]) -> Vec<usize> {
    let sums = lens.iter().scan(0, |s, &n| {
        *s += n;
        Some(*s)
    });
    std::iter::once(0).chain(sums).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn varlen_is_a_padded_batch(
        lens in prop::collection::vec((0usize..5, 0usize..7), 1..4),
        hkv in 1usize..3, d in 1usize..4, causal in any::<bool>(), seed in any::<u32>(),
    ) {
        let hq = 2 * hkv;
        let (lq, lk): (Vec<usize>, Vec<usize>) = lens.iter().copied().unzip();
        let (cu_q, cu_k) = (cumulative(&lq), cumulative(&lk));
        let (tq, tk) = (cu_q[lq.len()], cu_k[lk.len()]);
        let seed = u64::from(seed);
        let q: Vec<f32> = (0..tq * hq * d).map(|x| val(seed, x)).collect();
        let k: Vec<f32> = (0..tk * hkv * d).map(|x| val(seed + 1, x)).collect();
        let v: Vec<f32> = (0..tk * hkv * d).map(|x| val(seed + 2, x)).collect();
        let mask = if causal { Mask::CAUSAL } else { Mask::None };
        let (mut o, mut lse) = (vec![f32::NAN; tq * hq * d], vec![f32::NAN; hq * tq]);
        attention_varlen(
            TensorRef::new(&q, packed(hq, tq, d)),
            TensorRef::new(&k, packed(hkv, tk, d)),
            TensorRef::new(&v, packed(hkv, tk, d)),
            &cu_q,
            &cu_k,
            0.5,
            &mask,
            &Variants::NONE,
            TensorMut::new(&mut o, packed(hq, tq, d)),
            Some(&mut lse),
        )
        .unwrap();

        // The padded batch: [b, h, max, d], padding rows zero, hidden by the keep-mask.
        let (b, mq, mk) = (lq.len(), *lq.iter().max().unwrap(), *lk.iter().max().unwrap());
        let pad = |src: &[f32], cu: &[usize], heads: usize, m: usize| -> Vec<f32> {
            let mut dst = vec![0.0f32; b * heads * m * d];
            for s in 0..b {
                for t in cu[s]..cu[s + 1] {
                    for h in 0..heads {
                        let (at, from) = ((((s * heads + h) * m) + t - cu[s]) * d, (t * heads + h) * d);
                        dst[at..at + d].copy_from_slice(&src[from..from + d]);
                    }
                }
            }
            dst
        };
        let (pq, pk, pv) = (pad(&q, &cu_q, hq, mq), pad(&k, &cu_k, hkv, mk), pad(&v, &cu_k, hkv, mk));
        let keep: Vec<bool> = (0..b * hq * mq * mk)
            .map(|x| {
                let (s, i, j) = (x / (hq * mq * mk), (x / mk) % mq, x % mk);
                let off = lk[s] as isize - lq[s] as isize;
                j < lk[s] && (!causal || j as isize <= i as isize + off)
            })
            .collect();
        let (mut po, mut plse) = (vec![f32::NAN; b * hq * mq * d], vec![f32::NAN; b * hq * mq]);
        attention::attention(
            TensorRef::new(&pq, Tensor4Layout::bhsd(b, hq, mq, d)),
            TensorRef::new(&pk, Tensor4Layout::bhsd(b, hkv, mk, d)),
            TensorRef::new(&pv, Tensor4Layout::bhsd(b, hkv, mk, d)),
            0.5,
            &Mask::Keep { keep: &keep, layout: Tensor4Layout::bhsd(b, hq, mq, mk) },
            TensorMut::new(&mut po, Tensor4Layout::bhsd(b, hq, mq, d)),
            Some(&mut plse),
        )
        .unwrap();
        for s in 0..b {
            for h in 0..hq {
                for i in 0..lq[s] {
                    let t = cu_q[s] + i;
                    let (got, want) = (&o[(t * hq + h) * d..][..d], &po[((s * hq + h) * mq + i) * d..][..d]);
                    prop_assert!(same_bits(got, want), "seq {s} head {h} query {i}: {got:?} {want:?}");
                    let (gl, wl) = (lse[h * tq + t], plse[(s * hq + h) * mq + i]);
                    prop_assert_eq!(gl.to_bits(), wl.to_bits(), "lse seq {} head {} query {}", s, h, i);
                }
            }
        }
    }

    #[test]
    fn paged_is_dense_per_sequence(
        lens in prop::collection::vec((0usize..40, 0usize..4), 1..4),
        hkv in 1usize..3, dk in 1usize..4, dv in 0usize..3, causal in any::<bool>(),
        seed in any::<u32>(), shared in any::<bool>(),
    ) {
        const PAGE: usize = 16;
        let hq = 2 * hkv;
        let seed = u64::from(seed);
        let b = lens.len();
        let lens_k: Vec<usize> = lens.iter().map(|l| l.0).collect();
        let lens_q: Vec<usize> = lens.iter().map(|l| l.1).collect();
        // Dense K/V per sequence, [hkv, len, d]; sequence 1 repeats sequence 0's first page
        // when `shared`, so that page can be listed in both rows of the block table.
        let dense = |s: usize, d: usize, op: u64| -> Vec<f32> {
            let share = shared && s == 1 && lens_k[0] >= PAGE && lens_k[1] >= PAGE;
            (0..hkv * lens_k[s] * d)
                .map(|x| {
                    let (h, j, c) = (x / (lens_k[s] * d), (x / d) % lens_k[s], x % d);
                    let from = if share && j < PAGE { 0 } else { s };
                    val(seed + op + 10 * from as u64, (h * 64 + j) * 8 + c)
                })
                .collect()
        };
        let ks: Vec<Vec<f32>> = (0..b).map(|s| dense(s, dk, 0)).collect();
        let vs: Vec<Vec<f32>> = (0..b).map(|s| dense(s, dv, 1)).collect();
        let share = shared && b > 1 && lens_k[0] >= PAGE && lens_k[1] >= PAGE;
        // Pages in reverse order of use (the first page used is the last of the pool).
        let need: Vec<usize> = lens_k.iter().map(|l| l.div_ceil(PAGE)).collect();
        let pages = need.iter().sum::<usize>() + 1;
        let order: Vec<u32> = (0..pages as u32).rev().collect();
        let max_pages = 3;
        let mut table = vec![u32::MAX; b * max_pages];
        let mut next = 0;
        for s in 0..b {
            for p in 0..need[s] {
                table[s * max_pages + p] = if share && s == 1 && p == 0 {
                    table[0]
                } else {
                    next += 1;
                    order[next - 1]
                };
            }
        }
        let (mut kp, mut vp) = (vec![0.0f32; pages * PAGE * hkv * dk], vec![0.0f32; pages * PAGE * hkv * dv]);
        for s in 0..b {
            for j in 0..lens_k[s] {
                let page = table[s * max_pages + j / PAGE] as usize;
                for h in 0..hkv {
                    let slot = (page * PAGE + j % PAGE) * hkv + h;
                    kp[slot * dk..][..dk].copy_from_slice(&ks[s][(h * lens_k[s] + j) * dk..][..dk]);
                    vp[slot * dv..][..dv].copy_from_slice(&vs[s][(h * lens_k[s] + j) * dv..][..dv]);
                }
            }
        }
        let cache = PagedKv {
            k: PagePool::F32(&kp), v: PagePool::F32(&vp), page_size: PAGE, kv_heads: hkv, dk, dv,
            block_table: &table, max_pages, seq_lens: &lens_k,
        };
        let cu_q = cumulative(&lens_q);
        let tq = cu_q[b];
        let q: Vec<f32> = (0..tq * hq * dk).map(|x| val(seed + 5, x)).collect();
        let mask = if causal { Mask::CAUSAL } else { Mask::None };
        let (mut o, mut lse) = (vec![f32::NAN; tq * hq * dv], vec![f32::NAN; hq * tq]);
        attention_paged(
            TensorRef::new(&q, packed(hq, tq, dk)), &cu_q, &cache, 0.5, &mask, &Variants::NONE,
            TensorMut::new(&mut o, packed(hq, tq, dv)), Some(&mut lse),
        )
        .unwrap();
        for s in 0..b {
            let nq = lens_q[s];
            let qd: Vec<f32> = (0..hq * nq * dk)
                .map(|x| {
                    let (h, i, c) = (x / (nq * dk), (x / dk) % nq, x % dk);
                    q[((cu_q[s] + i) * hq + h) * dk + c]
                })
                .collect();
            let (mut od, mut ld) = (vec![f32::NAN; hq * nq * dv], vec![f32::NAN; hq * nq]);
            attention_with_variants(
                TensorRef::new(&qd, Tensor4Layout::bhsd(1, hq, nq, dk)),
                TensorRef::new(&ks[s], Tensor4Layout::bhsd(1, hkv, lens_k[s], dk)),
                TensorRef::new(&vs[s], Tensor4Layout::bhsd(1, hkv, lens_k[s], dv)),
                0.5, &mask, &Variants::NONE,
                TensorMut::new(&mut od, Tensor4Layout::bhsd(1, hq, nq, dv)), Some(&mut ld),
            )
            .unwrap();
            for h in 0..hq {
                for i in 0..nq {
                    let t = cu_q[s] + i;
                    let (got, want) = (&o[(t * hq + h) * dv..][..dv], &od[(h * nq + i) * dv..][..dv]);
                    prop_assert!(same_bits(got, want), "seq {s} head {h} query {i}: {got:?} {want:?}");
                    prop_assert_eq!(lse[h * tq + t].to_bits(), ld[h * nq + i].to_bits());
                }
            }
        }
    }
}

/// Bad batches are typed errors naming the argument.
#[test]
fn bad_batches_are_typed_errors() {
    let (q, k) = (vec![1.0f32; 4], vec![1.0f32; 6]);
    let mut o = vec![0.0f32; 4];
    let varlen = |cu_q: &[usize], cu_k: &[usize], mask: &Mask<'_>, o: &mut [f32]| {
        attention_varlen(
            TensorRef::new(&q, packed(1, 4, 1)),
            TensorRef::new(&k, packed(1, 6, 1)),
            TensorRef::new(&k, packed(1, 6, 1)),
            cu_q,
            cu_k,
            1.0,
            mask,
            &Variants::NONE,
            TensorMut::new(o, packed(1, 4, 1)),
            None,
        )
    };
    assert_eq!(varlen(&[0, 1, 4], &[0, 3, 6], &Mask::CAUSAL, &mut o), Ok(()));
    let e = varlen(&[0, 3, 1, 4], &[0, 3, 3, 6], &Mask::None, &mut o).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter { arg: "cu_seqlens_q", .. }), "{e:?}");
    let e = varlen(&[0, 1, 4], &[0, 3, 5], &Mask::None, &mut o).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { arg: "cu_seqlens_k", dim: "total", .. }), "{e:?}");
    let e = varlen(&[0, 1, 4], &[0, 6], &Mask::None, &mut o).unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { arg: "cu_seqlens_k", dim: "sequences", .. }),
        "{e:?}"
    );
    let keep = [true; 24];
    let e = varlen(&[0, 4], &[0, 6], &Mask::keep_mat(&keep, 1, 1, 4, 6), &mut o).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter { arg: "mask", .. }), "{e:?}");
    // A page index past the pool, through the paged entry point.
    let pool = vec![0.0f32; 16];
    let (table, lens) = ([1u32], [3usize]);
    let cache = PagedKv {
        k: PagePool::F32(&pool),
        v: PagePool::F32(&pool),
        page_size: 16,
        kv_heads: 1,
        dk: 1,
        dv: 1,
        block_table: &table,
        max_pages: 1,
        seq_lens: &lens,
    };
    let e = attention_paged(
        TensorRef::new(&q, packed(1, 4, 1)),
        &[0, 4],
        &cache,
        1.0,
        &Mask::None,
        &Variants::NONE,
        TensorMut::new(&mut o, packed(1, 4, 1)),
        None,
    )
    .unwrap_err();
    assert_eq!(e, Error::OutOfBounds { arg: "block_table", required: 2, len: 1 });
}
