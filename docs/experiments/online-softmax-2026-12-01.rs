//! Prototype behind the one-pass paragraph of `STREAM_MIN_BYTES` (kernels/src/softmax/mod.rs):
//! one pass with an online max per group of 64 (the sum rescaled when the max grows, pass C
//! scaling each group by a factor of its own) against a three-pass pipeline like the library's
//! (pass A writing one vector of the previous row's pass C per four read, pass B three
//! per group), the same table exp and prefetches, and a copy; 8192×4096 on one thread,
//! AVX-512 only. Not built with the workspace: it calls the crate-internal
//! `exp_neg_lut4_avx512`. To run it, make that function `pub` in kernels/src/softmax/exp.rs,
//! copy this file to kernels/examples/online_ab.rs, then
//! `cargo run --release -p attn-kernels --example online_ab -- 15 [L1-prefetch distance in floats]`.
//! Printed: the median time of each variant and its fraction of the copy's median.
use attn_kernels::softmax::exp::exp_neg_lut4_avx512 as exp4;
use std::arch::x86_64::*;
use std::time::Instant;

const AHEAD: usize = 4;
static mut L1AHEAD: usize = 0;

#[inline(always)]
unsafe fn far(ahead: *const f32, q: usize, cols: usize) {
    let lines = cols / 16;
    let chunks = lines.div_ceil(64).next_power_of_two();
    let per = lines / chunks;
    let off = ((q % chunks) * per + q / chunks) * 16;
    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(off).cast());
}

/// The pending pass C of the previous row: y = w * factor(group).
struct Drain {
    w: *const f32,
    y: *mut f32,
    gm: *const f32,
    m: f32,
    rs: f64,
    scale: f32,
    at: usize,
    end: usize,
    cur: f32,
    f: __m512,
}

impl Drain {
    fn none() -> Self {
        unsafe { Drain { w: std::ptr::null(), y: std::ptr::null_mut(), gm: std::ptr::null(), m: 0.0, rs: 0.0, scale: 0.0, at: 0, end: 0, cur: f32::NAN, f: _mm512_setzero_ps() } }
    }
    #[inline(always)]
    unsafe fn step(&mut self, k: usize) {
        for _ in 0..k {
            if self.at < self.end {
                if self.gm.is_null() {
                    // three-pass: one factor
                } else {
                    let g = *self.gm.add(self.at / 64);
                    if g != self.cur {
                        self.cur = g;
                        let f = (f64::from((g - self.m) * self.scale)).exp() * self.rs;
                        self.f = _mm512_set1_ps(f as f32);
                    }
                }
                _mm512_stream_ps(self.y.add(self.at), _mm512_mul_ps(_mm512_loadu_ps(self.w.add(self.at)), self.f));
                self.at += 16;
            }
        }
    }
    #[inline(always)]
    unsafe fn finish(&mut self) {
        while self.at < self.end {
            self.step(1);
        }
    }
}

#[inline(always)]
unsafe fn pass_a(xr: *const f32, cols: usize, d: &mut Drain) -> f32 {
    let mut h = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
    let mut j = 0;
    while j < cols {
        for u in 0..4 {
            h[u] = _mm512_max_ps(h[u], _mm512_loadu_ps(xr.add(j + 16 * u)));
        }
        d.step(1);
        j += 64;
    }
    _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(h[0], h[1]), _mm512_max_ps(h[2], h[3])))
}

#[inline(always)]
unsafe fn pass_b(xr: *const f32, cols: usize, m: f32, scale: f32, w: *mut f32, ahead: *const f32, dr: &mut Drain, per: usize) -> f32 {
    let mv = _mm512_set1_ps(m);
    let sc = _mm512_set1_ps(scale);
    let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut j = 0;
    while j < cols {
        for k in 0..4 {
            far(ahead, j / 16 + k, cols);
        }
        let mut d = [_mm512_setzero_ps(); 4];
        for u in 0..4 {
            d[u] = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(xr.add(j + 16 * u)), mv), sc);
        }
        let e = exp4(d);
        for u in 0..4 {
            _mm512_storeu_ps(w.add(j + 16 * u), e[u]);
        }
        s0 = _mm512_add_ps(s0, _mm512_add_ps(e[0], e[2]));
        s1 = _mm512_add_ps(s1, _mm512_add_ps(e[1], e[3]));
        dr.step(per);
        j += 64;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(s0, s1))
}

/// One pass: running max per group of 64, rescaling the sum when it grows.
#[inline(always)]
unsafe fn pass_online(xr: *const f32, cols: usize, scale: f32, w: *mut f32, gm: *mut f32, ahead: *const f32, dr: &mut Drain, per: usize) -> (f32, f32) {
    let sc = _mm512_set1_ps(scale);
    let mut m = f32::NEG_INFINITY;
    let mut mv = _mm512_set1_ps(m);
    let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut j = 0;
    while j < cols {
        for k in 0..4 {
            far(ahead, j / 16 + k, cols);
            if L1AHEAD > 0 {
                _mm_prefetch::<_MM_HINT_T0>(xr.wrapping_add(j + L1AHEAD + 16 * k).cast());
            }
        }
        let mut v = [_mm512_setzero_ps(); 4];
        for u in 0..4 {
            v[u] = _mm512_loadu_ps(xr.add(j + 16 * u));
        }
        let gmx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(v[0], v[1]), _mm512_max_ps(v[2], v[3])));
        if gmx > m {
            let f = if m == f32::NEG_INFINITY { 0.0 } else { (f64::from((m - gmx) * scale)).exp() as f32 };
            let fv = _mm512_set1_ps(f);
            s0 = _mm512_mul_ps(s0, fv);
            s1 = _mm512_mul_ps(s1, fv);
            m = gmx;
            mv = _mm512_set1_ps(m);
        }
        *gm.add(j / 64) = m;
        let mut d = [_mm512_setzero_ps(); 4];
        for u in 0..4 {
            d[u] = _mm512_mul_ps(_mm512_sub_ps(v[u], mv), sc);
        }
        let e = exp4(d);
        for u in 0..4 {
            _mm512_storeu_ps(w.add(j + 16 * u), e[u]);
        }
        s0 = _mm512_add_ps(s0, _mm512_add_ps(e[0], e[2]));
        s1 = _mm512_add_ps(s1, _mm512_add_ps(e[1], e[3]));
        dr.step(per);
        j += 64;
    }
    (m, _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,avx2")]
unsafe fn run(v: usize, x: *const f32, y: *mut f32, rows: usize, cols: usize, stage: [*mut f32; 2], gms: [*mut f32; 2], per: usize) {
    let scale = 0.125;
    let mut dr = Drain::none();
    for r in 0..rows {
        let xr = x.add(r * cols);
        let yr = y.add(r * cols);
        let ahead = x.add((r + AHEAD).min(rows - 1) * cols);
        let w = stage[r % 2];
        if v == 0 {
            let m = pass_a(xr, cols, &mut dr);
            let s = pass_b(xr, cols, m, scale, w, ahead, &mut dr, 3);
            dr.finish();
            dr = Drain { w, y: yr, gm: std::ptr::null(), m, rs: 0.0, scale, at: 0, end: cols, cur: 0.0, f: _mm512_set1_ps(1.0 / s) };
        } else {
            let gm = gms[r % 2];
            let (m, s) = pass_online(xr, cols, scale, w, gm, ahead, &mut dr, per);
            dr.finish();
            dr = Drain { w, y: yr, gm, m, rs: 1.0 / f64::from(s), scale, at: 0, end: cols, cur: f32::NAN, f: _mm512_setzero_ps() };
        }
    }
    dr.finish();
    _mm_sfence();
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let reps: usize = a.get(1).map_or(15, |s| s.parse().unwrap());
    unsafe { L1AHEAD = a.get(2).map_or(0, |s| s.parse().unwrap()) };
    let (rows, cols) = (8192, 4096);
    let n = rows * cols;
    let x: Vec<f32> = (0..n).map(|i| ((i * 2654435761usize) % 1000) as f32 * 0.01 - 5.0).collect();
    let mut y = vec![0.0f32; n + 16];
    let yo = (16 - (y.as_ptr() as usize / 4) % 16) % 16;
    let yp = unsafe { y.as_mut_ptr().add(yo) };
    let phase = (yp as usize) % 4096;
    let mut sbuf = vec![0.0f32; 4 * cols + 4096];
    let base = sbuf.as_mut_ptr() as usize;
    let s0 = ((base + 4095) / 4096 * 4096 + phase) as *mut f32;
    let stage = [s0, unsafe { s0.add(cols + 1024) }];
    let mut gbuf = vec![0.0f32; 2 * cols / 64];
    let gms = [gbuf.as_mut_ptr(), unsafe { gbuf.as_mut_ptr().add(cols / 64) }];
    let mut c = vec![0.0f32; n];
    let names = ["copy", "three-pass A1 B3", "one-pass B4", "one-pass B3", "one-pass B2"];
    let pers = [0, 0, 4, 3, 2];
    let mut t = vec![Vec::new(); names.len()];
    let mut outs: Vec<Vec<f32>> = vec![Vec::new(); names.len()];
    for rep in 0..reps * names.len() {
        let v = rep % names.len();
        let s = Instant::now();
        if v == 0 {
            c.copy_from_slice(&x);
        } else {
            unsafe { run(v - 1, x.as_ptr(), yp, rows, cols, stage, gms, pers[v]) };
        }
        t[v].push(s.elapsed().as_secs_f64() * 1e3);
        if v > 0 && rep < names.len() {
            outs[v] = unsafe { std::slice::from_raw_parts(yp, n) }.to_vec();
        }
    }
    let mut worst: f64 = 0.0;
    for v in 2..names.len() {
        for (a, b) in outs[1].iter().zip(&outs[v]) {
            worst = worst.max(((a - b) / a.max(1e-30)).abs() as f64);
        }
    }
    let med = |v: &Vec<f64>| { let mut s = v.clone(); s.sort_by(|a, b| a.partial_cmp(b).unwrap()); s[s.len() / 2] };
    let copy = med(&t[0]);
    for (v, name) in names.iter().enumerate() {
        let m = med(&t[v]);
        println!("{name:20} median {:6.2} ms = {:5.2} G elem/s, {:5.1} % of copy", m, n as f64 / m / 1e6, 100.0 * copy / m);
    }
    println!("worst relative difference one-pass vs three-pass: {worst:.2e}");
    std::hint::black_box(&y); std::hint::black_box(&c);
}
