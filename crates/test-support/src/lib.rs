//! Dev-only test support, at the bottom of the crate map: it depends on no crate of the
//! workspace and knows nothing about strategies, tensors or devices, only plain data.
//!
//! Used only as a dev-dependency, by the examples, tests and benches; never published and never
//! a dependency of a library. It holds the one reference workload they share, so that every
//! strategy trains on the same rows and their results can be compared:
//! [`linear_regression`], and [`candle_mlp`]'s classification for `distribute-candle`. [`mpirun`] starts a test binary's workers for the multi-process tests.

pub mod candle_mlp;
pub mod linear_regression;
pub mod mpirun;
