//! `cargo xtask bench strategy`: MirroredStrategy step benchmarks (not written yet; this target
//! exists so that the suite name resolves).

fn main() {}
