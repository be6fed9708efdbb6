//! Layer 1 of `distribute`: device names in TensorFlow's syntax.
//!
//! Knows nothing about values, tensors, threads or strategies.
