//! `CpuThreads::Auto` in a process of its own (this file's only test), so no other test changes
//! the environment or rayon's global pool meanwhile: 2 replicas share the cores, candle's
//! variables say so, and each replica's kernels run on a rayon pool of its share.

use candle_nn::{Optimizer, SGD, VarBuilder};
use distribute_candle::{Config, DataParallel, StepError};
use distribute_mirrored::MirroredStrategy;
use rayon::prelude::*;

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
    // A replica on a thread the strategy started has a pool of its own, with that thread as its
    // worker 0 (so with 1 thread a parallel loop runs right there), made once and kept; the one
    // on the caller's thread (replica 0) uses rayon's global pool, of the same size.
    let caller = std::thread::current().id();
    for _ in 0..2 {
        let seen = model
            .run(&(), |_, ()| {
                let here = std::thread::current().id();
                let ran_on: Vec<_> = (0..64)
                    .into_par_iter()
                    .map(|_| std::thread::current().id())
                    .collect();
                let pool = (rayon::current_thread_index(), rayon::current_num_threads());
                Ok::<_, StepError>((here, pool, ran_on))
            })
            .unwrap();
        assert!(seen.iter().any(|(here, ..)| *here != caller));
        for (r, (here, (index, threads), ran_on)) in seen.into_iter().enumerate() {
            assert_eq!(threads, want, "replica {r}");
            if here == caller {
                assert_eq!(index, None, "replica {r}");
            } else {
                assert_eq!(index, Some(0), "replica {r}");
                if want == 1 {
                    assert!(ran_on.iter().all(|t| *t == here), "replica {r}");
                }
            }
        }
    }
}
