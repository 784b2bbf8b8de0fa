//! Fused scale-mask-softmax with a vectorised exp.
