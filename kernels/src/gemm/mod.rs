//! Cache-blocked SGEMM: loop nest, packing, per-ISA micro-kernels.
