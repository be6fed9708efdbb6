//! Placeholder replaced by the strategy benchmark.

fn main() {}
