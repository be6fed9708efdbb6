//! Variables that change outside the optimizer: candle-nn's batch normalisation running
//! statistics on 2 replicas that see different batches, under each `VarPolicy`.

use candle_core::Tensor;
use candle_nn::{BatchNorm, Linear, Module, VarBuilder};
use distribute_candle::{BATCH_NORM_MEAN, Config, DataParallel, Error, VarPolicy};
use distribute_mirrored::MirroredStrategy;
use distribute_values::ReduceOp;

type Model = (BatchNorm, Linear);

fn build(vb: VarBuilder) -> candle_core::Result<Model> {
    Ok((
        candle_nn::batch_norm(2, candle_nn::BatchNormConfig::default(), vb.pp("bn"))?,
        candle_nn::linear(2, 1, vb.pp("out"))?,
    ))
}

/// A model on 2 replicas after one training step in which replica 0's batch has the column
/// means [2, 3] and replica 1's [6, 7]: each replica's running mean becomes 0.1 × its batch's
/// (candle-nn's momentum 0.1, from zeros), before the policy acts.
fn trained(
    policies: &'static [(&'static str, VarPolicy)],
) -> Result<DataParallel<'static, MirroredStrategy, Model, candle_nn::SGD>, Error> {
    let strategy = Box::leak(Box::new(
        MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap(),
    ));
    let config = Config {
        var_policies: policies,
        ..Config::default()
    };
    let model = DataParallel::new(strategy, config, build, |vars| {
        <candle_nn::SGD as candle_nn::Optimizer>::new(vars, 0.1)
    })?;
    model.run(&(), |replica, ()| {
        let base = 4.0 * replica.replica_id() as f32;
        let x = (Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], replica.device())? + f64::from(base))?;
        let (bn, out) = replica.model();
        let loss = out.forward(&bn.forward_train(&x)?)?.sqr()?.mean_all()?;
        replica.backward_step(&loss, ReduceOp::Mean)?;
        Ok(())
    })?;
    Ok(model)
}

fn running_mean(
    model: &DataParallel<'_, MirroredStrategy, Model, candle_nn::SGD>,
    r: usize,
) -> Vec<f32> {
    model
        .variable(r, "bn.running_mean")
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

fn close(got: &[f32], want: &[f32]) {
    assert!(
        got.iter().zip(want).all(|(a, b)| (a - b).abs() <= 1e-6),
        "{got:?} vs {want:?}"
    );
}

#[test]
fn by_default_the_statistics_drift_and_the_check_says_which_and_what_to_do() {
    let model = trained(&[]).unwrap();
    let err = model.check_in_sync().unwrap_err().to_string();
    assert!(
        err.contains("variable 'bn.running_mean' of replica 1 differs"),
        "{err}"
    );
}

#[test]
fn mean_averages_the_statistics_over_the_replicas() {
    let model = trained(BATCH_NORM_MEAN).unwrap();
    model.check_in_sync().unwrap();
    close(&running_mean(&model, 0), &[0.4, 0.5]);
    assert_eq!(running_mean(&model, 0), running_mean(&model, 1));
}

#[test]
fn first_replica_gives_every_copy_replica_0_s() {
    let model = trained(&[
        ("running_mean", VarPolicy::FirstReplica),
        ("running_var", VarPolicy::FirstReplica),
    ])
    .unwrap();
    model.check_in_sync().unwrap();
    close(&running_mean(&model, 1), &[0.2, 0.3]);
    assert_eq!(running_mean(&model, 0), running_mean(&model, 1));
}

#[test]
fn per_replica_statistics_are_left_out_of_the_check_and_save_writes_replica_0_s() {
    let model = trained(&[
        ("bn.running_mean", VarPolicy::PerReplica),
        ("bn.running_var", VarPolicy::PerReplica),
    ])
    .unwrap();
    model.check_in_sync().unwrap();
    close(&running_mean(&model, 0), &[0.2, 0.3]);
    close(&running_mean(&model, 1), &[0.6, 0.7]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    model.save(&path).unwrap();
    let saved = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
    assert_eq!(
        saved["bn.running_mean"].to_vec1::<f32>().unwrap(),
        running_mean(&model, 0)
    );
    // The trained variables stay identical under every policy.
    let weight = |r| {
        model
            .variable(r, "out.weight")
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    assert_eq!(weight(0), weight(1));
}

#[test]
fn a_rule_that_names_no_variable_is_refused() {
    let err = trained(&[("runing_mean", VarPolicy::Mean)]).err().unwrap();
    assert_eq!(
        err.to_string(),
        "Config::var_policies names 'runing_mean', but no variable of the model is called that \
         or ends with '.runing_mean'"
    );
}
