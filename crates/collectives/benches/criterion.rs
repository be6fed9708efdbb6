//! Criterion benches of the all-reduce paths the JSON table covers (2 replicas; 4 KiB, 1 MiB,
//! 16 MiB; both in-process backends).

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use distribute_collectives::{
    CrossDeviceOps, GroupConfig, ReductionToOneDevice, SharedMemoryAllReduce,
};

#[path = "rig/mod.rs"]
mod rig;

fn all_reduce(c: &mut Criterion) {
    let mut group = c.benchmark_group("all_reduce_2_replicas");
    for bytes in [4 << 10, 1 << 20, 16 << 20] {
        group.throughput(Throughput::Bytes(bytes as u64));
        for backend in ["SharedMemoryAllReduce", "ReductionToOneDevice"] {
            let ops: Arc<dyn CrossDeviceOps> = match backend {
                "SharedMemoryAllReduce" => {
                    Arc::new(SharedMemoryAllReduce::new(2, GroupConfig::default()).unwrap())
                }
                _ => Arc::new(ReductionToOneDevice::new(2, GroupConfig::default()).unwrap()),
            };
            let rig = rig::Rig::new(ops, 2, bytes);
            let expected = rig::input(0, bytes).to_vec::<f32>().unwrap();
            let sum = rig.result().to_vec::<f32>().unwrap();
            assert!(sum.iter().zip(&expected).all(|(s, x)| *s == 2.0 * x + 1.0));
            group.bench_with_input(BenchmarkId::new(backend, bytes), &bytes, |b, _| {
                b.iter_custom(|iters| rig.run(iters as usize))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, all_reduce);
criterion_main!(benches);
