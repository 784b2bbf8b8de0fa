//! The flash path: one task per `(batch, query head, query tile)`, streaming the keys in blocks
//! of [`BC`] with an online softmax. Written once over the [`Simd`] trait.
//!
//! Per task, with `QR = QV·LANES` queries on the vector lanes (the width `NR` of the ISA's GEMM
//! micro-kernel, see [`super::simd`]):
//! 1. pack the query tile transposed and pre-scaled, as a GEMM B micro-panel:
//!    `qp[d·QR + r] = scale·q(i0 + r, d)` (padding rows are 0);
//! 2. for each key block `j0..j0 + nb` (stopping at the causal diagonal of the tile's last
//!    query, so blocks above it are never computed):
//!    `Sᵀ = K·qp` on the micro-kernels (K read in place), mask, then per query lane
//!    `m' = max(m, max_j S_j)`, `α = e^(m − m')`, `P_j = e^(S_j − m')` (in place, which leaves
//!    `P` as the B micro-panel of the next product), `l ← α·l + Σ_j P_j`, and
//!    `Oᵀ ← α·Oᵀ + Vᵀ·P` on the micro-kernels (V read in place);
//! 3. write `O/l` (zeros where `l = 0`: fully masked rows) and `lse = m + ln l`.
//!
//! The running maximum starts at `f32::MIN` rather than −∞, so `m − m'` and `S_j − m'` are never
//! `−∞ − (−∞)`: a block where everything so far is masked gives `α = 1` on an empty sum and
//! `P = e^(−∞) = 0`.

use rayon::prelude::*;

use super::blocking::{BC, QV};
use super::simd::{load, pv_block, qk_block, store, tile_rows, vectorize, Kernel, Simd};
use super::sink::Sink;
use super::{matrix, Problem};
use crate::arch::Isa;
use crate::gemm::pack::AlignedBuf;
use crate::par::Parallelism;

/// Largest query tile of any ISA (AVX-512: 2 × 16 lanes); scratch is sized for it.
const MAX_QR: usize = 32;

/// Per-thread scratch of the flash loop: a few tiles, independent of the sequence lengths. The
/// packed query tile and the probability block are B micro-panels of the GEMM micro-kernel,
/// hence 64-byte aligned.
pub(super) struct Scratch {
    qp: AlignedBuf,
    s: AlignedBuf,
    o: Vec<f32>,
    save: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    alpha: Vec<f32>,
}

impl Scratch {
    fn new(dk: usize, dv: usize) -> Self {
        let (mut qp, mut s) = (AlignedBuf::default(), AlignedBuf::default());
        qp.get(dk * MAX_QR);
        s.get(BC * MAX_QR);
        Scratch {
            qp,
            s,
            o: vec![0.0; dv * MAX_QR],
            save: vec![0.0; dv * MAX_QR],
            m: vec![0.0; MAX_QR],
            l: vec![0.0; MAX_QR],
            alpha: vec![0.0; MAX_QR],
        }
    }
}

/// Runs the flash loop over all tasks, writing through `sink`.
pub(super) fn run(isa: Isa, p: &Problem<'_>, sink: &Sink<'_>, par: Parallelism) {
    // dk = 0 or dv = 0 still has logsumexps (and dk = 0 still has outputs) to write.
    if p.nq == 0 {
        return;
    }
    let tiles = p.nq.div_ceil(tile_rows(isa));
    let tasks = p.batch * p.hq * tiles;
    let task = |scr: &mut Scratch, t: usize| vectorize(isa, Tile { p, sink, scr, t, tiles });
    if par.count() == 1 || tasks == 1 {
        let mut scr = Scratch::new(p.dk, p.dv);
        (0..tasks).for_each(|t| task(&mut scr, t));
    } else {
        par.install(|| {
            (0..tasks)
                .into_par_iter()
                .with_min_len(1)
                .for_each_init(|| Scratch::new(p.dk, p.dv), task)
        });
    }
}

/// One task: query tile `t mod tiles` of head `t / tiles`.
struct Tile<'r, 'p, 'a> {
    p: &'r Problem<'a>,
    sink: &'r Sink<'p>,
    scr: &'r mut Scratch,
    t: usize,
    tiles: usize,
}

impl Kernel for Tile<'_, '_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let Tile { p, sink, scr, t, tiles } = self;
        let (l, qr) = (S::LANES, QV * S::LANES);
        debug_assert!(qr <= MAX_QR);
        let (bh, i0) = (t / tiles, (t % tiles) * qr);
        if i0 >= p.nq {
            return; // only if the caller's tiling disagrees with this ISA; nothing to do
        }
        let (b, h) = (bh / p.hq, bh % p.hq);
        let kh = h / p.group;
        let rows = (p.nq - i0).min(qr);
        let (dk, dv) = (p.dk, p.dv);

        // 1. Packed, pre-scaled query tile.
        let qp = scr.qp.get(dk * qr);
        let qm = matrix(&p.q.layout, b, h);
        for d in 0..dk {
            for r in 0..qr {
                qp[d * qr + r] =
                    if r < rows { p.q.data[qm.index(i0 + r, d)] * p.scale2 } else { 0.0 };
            }
        }
        let (m, lsum, alpha) = (&mut scr.m[..qr], &mut scr.l[..qr], &mut scr.alpha[..qr]);
        m.fill(f32::MIN);
        lsum.fill(0.0);
        let oacc = &mut scr.o[..dv * qr];
        oacc.fill(0.0);

        // 2. Stream the visible key blocks.
        let (keys, values) = (p.keys(b, kh), p.values(b, kh));
        let kend = p.key_end(i0 + rows - 1);
        let mut j0 = 0;
        while j0 < kend {
            let nb = (kend - j0).min(BC);
            let sb = scr.s.get(nb * qr);
            qk_block(s, qp, dk, keys, j0, nb, sb);
            p.apply_mask(b, h, i0, rows, j0, nb, qr, sb);
            // Smallest probability per lane: a block with a zero weight (masked key, or one
            // that underflowed) takes the guarded P·V tile, where it contributes exactly 0
            // even if its value is ±∞/NaN (an unwritten KV-cache slot); others take the
            // plain FMA tile. One `min` per probability vector, against its ~20-op exp.
            let mut pmin = [s.splat(1.0); QV];
            for (v, pm) in pmin.iter_mut().enumerate() {
                let at = v * l;
                let m_old = load(s, &m[at..]);
                let mut m_new = m_old;
                for j in 0..nb {
                    m_new = s.max(m_new, load(s, &sb[j * qr + at..]));
                }
                let mut sum = s.splat(0.0);
                for j in 0..nb {
                    let x = &mut sb[j * qr + at..];
                    let e = s.exp(s.sub(load(s, x), m_new));
                    store(s, x, e);
                    sum = s.add(sum, e);
                    *pm = s.min(e, *pm);
                }
                let a = s.exp(s.sub(m_old, m_new));
                store(s, &mut alpha[at..], a);
                store(s, &mut m[at..], m_new);
                let l_new = s.fma(a, load(s, &lsum[at..]), sum);
                store(s, &mut lsum[at..], l_new);
            }
            let mut lanes = [1.0f32; MAX_QR];
            for (v, pm) in pmin.iter().enumerate() {
                store(s, &mut lanes[v * l..], *pm);
            }
            let guard = lanes[..qr].contains(&0.0);
            pv_block(s, guard, sb, nb, values, j0, dv, alpha, oacc, &mut scr.save);
            j0 += nb;
        }

        // 3. Normalise once and write.
        for r in 0..rows {
            let lr = lsum[r];
            let (inv, lse) =
                if lr == 0.0 { (0.0, f32::NEG_INFINITY) } else { (1.0 / lr, m[r] + lr.ln()) };
            let acc = &*oacc;
            sink.write_row(b, h, i0 + r, lse, |d| acc[d * qr + r] * inv);
        }
    }
}
