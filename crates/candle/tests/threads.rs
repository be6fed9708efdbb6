//! `CpuThreads::Auto` in a process of its own (this file's only test), so no other test changes
//! the environment meanwhile: 2 replicas share the cores, and candle's variables say so.

use candle_nn::{Optimizer, SGD, VarBuilder};
use distribute_candle::{Config, DataParallel};
use distribute_mirrored::MirroredStrategy;

#[test]
fn auto_threads_share_the_cores_through_candles_variables() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    let model = DataParallel::new(
        &strategy,
        Config::default(),
        |vb: VarBuilder| candle_nn::linear(2, 2, vb),
        |vars| SGD::new(vars, 0.1),
    )
    .unwrap();
    let cores = std::thread::available_parallelism().unwrap().get();
    let want = (cores / 2).max(1);
    assert_eq!(model.threads_per_replica(), Some(want));
    for name in ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"] {
        assert_eq!(std::env::var(name).unwrap(), want.to_string(), "{name}");
    }
    assert_eq!(candle_core::utils::get_num_threads(), want);
}
