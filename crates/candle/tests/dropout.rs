//! Dropout on 2 replicas: `ReplicaStep::dropout` draws each replica's own mask, the same job
//! twice trains the same bits, a resumed job draws the masks the uninterrupted one drew, and
//! candle's own (unseedable) dropout still keeps the copies identical.

use candle_core::{DType, Tensor};
use candle_nn::{Linear, Module, VarBuilder};
use distribute_candle::{Config, DataParallel, Error};
use distribute_mirrored::MirroredStrategy;
use distribute_values::ReduceOp;

type Model = (Linear, Linear);
type Trained<'s> = DataParallel<'s, MirroredStrategy, Model, candle_nn::SGD>;

fn build(vb: VarBuilder) -> candle_core::Result<Model> {
    Ok((
        candle_nn::linear(8, 16, vb.pp("a"))?,
        candle_nn::linear(16, 1, vb.pp("b"))?,
    ))
}

fn model<'s>(strategy: &'s MirroredStrategy, seed: u64) -> Result<Trained<'s>, Error> {
    let model = DataParallel::new(
        strategy,
        Config {
            seed,
            ..Config::default()
        },
        build,
        |vars| <candle_nn::SGD as candle_nn::Optimizer>::new(vars, 0.05),
    )?;
    // The same start for every job of the test.
    let cpu = candle_core::Device::Cpu;
    let ramp = |rows: usize, cols: usize| {
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) / 40.0)
            .collect();
        Tensor::from_vec(v, (rows, cols), &cpu)
    };
    let values = [
        ("a.weight", ramp(16, 8)?),
        ("a.bias", Tensor::zeros(16, DType::F32, &cpu)?),
        ("b.weight", ramp(1, 16)?),
        ("b.bias", Tensor::zeros(1, DType::F32, &cpu)?),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    model.assign(values)?;
    Ok(model)
}

/// `steps` steps with `ReplicaStep::dropout` at 0.5; each replica's output on its batch.
fn train(model: &Trained<'_>, steps: usize) -> Vec<Vec<f32>> {
    let mut outputs = Vec::new();
    for _ in 0..steps {
        outputs = model
            .run(&(), |replica, ()| {
                let x = Tensor::ones((4, 8), DType::F32, replica.device())?;
                let (a, b) = replica.model();
                let hidden = a.forward(&x)?.relu()?;
                let dropped = replica.dropout(&hidden, 0.5)?;
                let loss = (b.forward(&dropped)? - 1.0)?.sqr()?.mean_all()?;
                replica.backward_step(&loss, ReduceOp::Mean)?;
                Ok(dropped.flatten_all()?.to_vec1::<f32>()?)
            })
            .unwrap();
    }
    outputs
}

fn weights(model: &Trained<'_>) -> Vec<f32> {
    ["a.weight", "b.weight"]
        .iter()
        .flat_map(|n| {
            model
                .variable(0, n)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

#[test]
fn each_replica_draws_its_own_mask_and_the_copies_stay_identical() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    let model = model(&strategy, 1).unwrap();
    let outputs = train(&model, 3);
    assert_ne!(outputs[0], outputs[1], "the replicas' masks differ");
    model.check_in_sync().unwrap();
}

#[test]
fn the_same_seed_trains_the_same_bits_and_another_seed_other_bits() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    let a = model(&strategy, 1).unwrap();
    let b = model(&strategy, 1).unwrap();
    let c = model(&strategy, 2).unwrap();
    train(&a, 4);
    train(&b, 4);
    train(&c, 4);
    assert_eq!(weights(&a), weights(&b));
    assert_ne!(weights(&a), weights(&c));
}

#[test]
fn a_resumed_job_draws_the_masks_the_uninterrupted_one_drew() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    let whole = model(&strategy, 3).unwrap();
    train(&whole, 5);
    let first = model(&strategy, 3).unwrap();
    train(&first, 2);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    first.save(&path).unwrap();
    let resumed = model(&strategy, 3).unwrap();
    resumed.load(&path).unwrap();
    train(&resumed, 3);
    assert_eq!(weights(&resumed), weights(&whole));
}

#[test]
fn candle_s_own_dropout_keeps_the_copies_identical_but_cannot_be_seeded() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    let model = model(&strategy, 0).unwrap();
    model
        .run(&(), |replica, ()| {
            let x = Tensor::ones((4, 8), DType::F32, replica.device())?;
            let hidden = replica.model().0.forward(&x)?.relu()?;
            let dropped = candle_nn::ops::dropout(&hidden, 0.5)?;
            let loss = (replica.model().1.forward(&dropped)? - 1.0)?
                .sqr()?
                .mean_all()?;
            replica.backward_step(&loss, ReduceOp::Mean)?;
            Ok(())
        })
        .unwrap();
    model.check_in_sync().unwrap();
    let err = candle_core::Device::Cpu.set_seed(1).unwrap_err();
    assert!(err.to_string().contains("cannot seed the CPU rng"), "{err}");
}
