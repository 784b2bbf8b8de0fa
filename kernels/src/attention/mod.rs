//! Flash-style streaming attention (online softmax) and the decode path.
