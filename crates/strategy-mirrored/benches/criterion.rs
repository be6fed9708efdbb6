//! Criterion bench of `MirroredStrategy::run` with a trivial step on 2 replicas, for
//! criterion's statistics and history beside the JSON table of `benches/strategy.rs`.

use criterion::{Criterion, criterion_group, criterion_main};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::Strategy;

fn run_trivial(c: &mut Criterion) {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    c.bench_function("run_trivial/2", |b| {
        b.iter(|| strategy.run(|ctx, ()| Ok(ctx.replica_id()), &()).unwrap())
    });
}

criterion_group!(benches, run_trivial);
criterion_main!(benches);
