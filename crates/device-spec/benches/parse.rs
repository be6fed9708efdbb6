//! Parsing, printing and canonicalizing device names; the target is well under 1 µs per string.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use distribute_device_spec::{DeviceSpec, canonicalize};

const INPUTS: [(&str, &str); 3] = [
    ("short", "/gpu:1"),
    ("full", "/job:worker/replica:0/task:1/device:GPU:3"),
    ("legacy_unordered", "/task:1/cpu:0/job:worker"),
];

fn parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse");
    for (name, input) in INPUTS {
        group.bench_function(name, |b| {
            b.iter(|| black_box(input).parse::<DeviceSpec>().unwrap())
        });
    }
    group.finish();
}

fn print(c: &mut Criterion) {
    let spec: DeviceSpec = INPUTS[1].1.parse().unwrap();
    c.bench_function("print/full", |b| b.iter(|| black_box(&spec).to_string()));
}

fn canonicalize_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("canonicalize");
    for (name, input) in INPUTS {
        group.bench_function(name, |b| {
            b.iter(|| canonicalize(black_box(input), None).unwrap())
        });
    }
    group.bench_function("with_default", |b| {
        b.iter(|| canonicalize(black_box("/job:worker/task:1"), Some(black_box("/gpu:0"))).unwrap())
    });
    group.finish();
}

criterion_group!(benches, parse, print, canonicalize_bench);
criterion_main!(benches);
