//! What `DataParallel` promises about its replicas, on small models: copies start identical and
//! stay bit-identical, a shape or name mismatch names the variable and the replica, an unused
//! parameter contributes zeros, a failing or panicking replica ends the step with an error on
//! the caller (never a hang), checkpoints move between replica counts, gradient accumulation
//! equals one big batch.

use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, Linear, Module, Optimizer, SGD, VarBuilder};
use distribute_candle::{Config, DataParallel, Error, StepError};
use distribute_device_spec::LocalDevices;
use distribute_input::InputPosition;
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::{CheckpointOptions, Checkpoints, DefaultStrategy, StrategyError};
use distribute_values::ReduceOp;

fn strategy(replicas: usize) -> MirroredStrategy {
    MirroredStrategy::new(LocalDevices::cpus(replicas)).unwrap()
}

fn linear(vb: VarBuilder) -> candle_core::Result<Linear> {
    candle_nn::linear(4, 2, vb.pp("l1"))
}

fn sgd(vars: Vec<candle_core::Var>) -> candle_core::Result<SGD> {
    SGD::new(vars, 0.1)
}

/// Rows that differ per replica, so the replicas' gradients differ.
fn rows(replica: usize, device: &Device) -> candle_core::Result<Tensor> {
    Tensor::arange(0f32, 12.0, device)?
        .affine(0.1, replica as f64)?
        .reshape((3, 4))
}

#[test]
fn copies_start_from_replica_0_and_stay_bit_identical_over_many_steps() {
    let s = strategy(3);
    let model = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
    // The initialiser is random per replica; every copy holds replica 0's values.
    model.check_in_sync().unwrap();
    let w0 = model.variable(0, "l1.weight").unwrap();
    for r in 1..3 {
        let w = model.variable(r, "l1.weight").unwrap();
        assert_eq!(w.to_vec2::<f32>().unwrap(), w0.to_vec2::<f32>().unwrap());
    }
    for _ in 0..200 {
        model
            .run(&(), |replica, ()| {
                let x = rows(replica.replica_id(), replica.device())?;
                let loss = replica.model().forward(&x)?.sqr()?.mean_all()?;
                replica.backward_step(&loss, ReduceOp::Mean)?;
                Ok(())
            })
            .unwrap();
    }
    model.check_in_sync().unwrap();
    assert_ne!(
        model
            .variable(0, "l1.weight")
            .unwrap()
            .to_vec2::<f32>()
            .unwrap(),
        w0.to_vec2::<f32>().unwrap(),
        "the model trained"
    );
}

#[test]
fn a_copy_that_drifts_is_named_by_the_check() {
    let s = strategy(2);
    let model = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
    model
        .run(&(), |replica, ()| {
            if replica.local_replica() == 1 {
                let bias = &replica.vars()[0];
                bias.set(&(bias.as_tensor() + 1e-3)?.detach())?;
            }
            Ok(())
        })
        .unwrap();
    let err = model.check_in_sync().unwrap_err();
    assert!(matches!(err, Error::OutOfSync(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "the model copies are out of sync: variable 'l1.bias' of replica 1 differs from replica \
         0's (a variable that changes outside the optimizer, such as batch-norm statistics, needs \
         a rule in Config::var_policies)"
    );
}

#[test]
fn a_shape_or_name_mismatch_names_the_variable_and_the_replica() {
    let s = strategy(3);
    let calls = AtomicUsize::new(0);
    let err = DataParallel::new(
        &s,
        Config::default(),
        |vb: VarBuilder| {
            let out = if calls.fetch_add(1, Ordering::SeqCst) == 2 {
                3
            } else {
                2
            };
            candle_nn::linear(4, out, vb.pp("l1"))
        },
        sgd,
    )
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        "the model replicas differ: variable 'l1.bias' is f32 [2] on replica 0 but f32 [3] on \
         replica 2"
    );

    let calls = AtomicUsize::new(0);
    let err = DataParallel::new(
        &s,
        Config::default(),
        |vb: VarBuilder| {
            let name = if calls.fetch_add(1, Ordering::SeqCst) == 1 {
                "other"
            } else {
                "l1"
            };
            candle_nn::linear(4, 2, vb.pp(name))
        },
        sgd,
    )
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        "the model replicas differ: variable 'l1.bias' of replica 0 is missing on replica 1"
    );
}

/// A model with a parameter that only some steps use.
struct WithExtra {
    l1: Linear,
    extra: Tensor,
}

/// [`linear`] and a parameter `extra` of three ones.
fn with_extra(vb: VarBuilder) -> candle_core::Result<WithExtra> {
    Ok(WithExtra {
        l1: linear(vb.clone())?,
        extra: vb.get_with_hints(3, "extra", Init::Const(1.0))?,
    })
}

#[test]
fn a_parameter_unused_on_some_replicas_gets_zeros_from_them() {
    let s = strategy(2);
    let model = DataParallel::new(&s, Config::default(), with_extra, sgd).unwrap();
    model
        .run(&(), |replica, ()| {
            let x = rows(0, replica.device())?;
            let mut loss = replica.model().l1.forward(&x)?.sum_all()?;
            if replica.replica_id() == 0 {
                loss = (loss + replica.model().extra.sum_all()?)?;
            }
            replica.backward_step(&loss, ReduceOp::Sum)?;
            Ok(())
        })
        .unwrap();
    model.check_in_sync().unwrap();
    // d(sum extra)/d extra = 1 on replica 0, 0 on replica 1: 1 - 0.1·(1 + 0).
    let extra = model
        .variable(1, "extra")
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(extra, [0.9f32; 3]);
}

#[test]
fn a_failing_replica_is_named_and_the_others_are_released() {
    let s = strategy(2);
    let model = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
    let err = model
        .run(&(), |replica, ()| {
            // Replica 1 feeds a wrong shape: candle's error, with `?`.
            let features = if replica.replica_id() == 1 { 5 } else { 4 };
            let x = Tensor::ones((3, features), DType::F32, replica.device())?;
            let loss = replica.model().forward(&x)?.sum_all()?;
            replica.backward_step(&loss, ReduceOp::Mean)?;
            Ok(())
        })
        .unwrap_err();
    let Error::Replica { replica, source } = &err else {
        panic!("a replica error: {err:?}");
    };
    assert_eq!(*replica, 1);
    assert!(
        source.downcast_ref::<candle_core::Error>().is_some(),
        "{source:?}"
    );
    assert!(err.to_string().starts_with("replica 1: "), "{err}");
    // Nobody updated: the copies still agree and the next step runs.
    model.check_in_sync().unwrap();
    model.run(&(), |_, ()| Ok(())).unwrap();

    // The user's own errors go through `?` too.
    let err = model
        .run(&(), |replica, ()| {
            if replica.replica_id() == 0 {
                std::fs::read("/nonexistent/distribute-candle")?;
            }
            Ok::<_, StepError>(())
        })
        .unwrap_err();
    assert!(
        matches!(&err, Error::Replica { replica: 0, source } if source.is::<std::io::Error>()),
        "{err:?}"
    );
    let err = model
        .run(&(), |replica, ()| {
            if replica.replica_id() == 1 {
                Err(anyhow::anyhow!("the user's own check failed"))?;
            }
            Ok::<_, StepError>(())
        })
        .unwrap_err();
    assert_eq!(err.to_string(), "replica 1: the user's own check failed");
}

#[test]
fn a_panicking_replica_fails_the_step_and_poisons_only_its_own_copy() {
    let s = strategy(2);
    let model = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
    let err = model
        .run(&(), |replica, ()| {
            let x = rows(0, replica.device())?;
            let loss = replica.model().forward(&x)?.sum_all()?;
            if replica.replica_id() == 1 {
                panic!("replica 1 gives up");
            }
            // Replica 0 waits in the all-reduce and is released.
            replica.backward_step(&loss, ReduceOp::Mean)?;
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Strategy(StrategyError::ReplicaPanicked { replica: 1, message })
                if message.contains("replica 1 gives up")
        ),
        "{err:?}"
    );
    let err = model.run(&(), |_, ()| Ok(())).unwrap_err();
    assert!(
        err.to_string().contains("left half updated by a panic"),
        "{err}"
    );
}

#[test]
fn checkpoints_move_between_replica_counts_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let two = strategy(2);
    let trained = DataParallel::new(&two, Config::default(), linear, sgd).unwrap();
    trained
        .run(&(), |replica, ()| {
            let loss = replica
                .model()
                .forward(&rows(replica.replica_id(), replica.device())?)?
                .sum_all()?;
            replica.backward_step(&loss, ReduceOp::Mean)?;
            Ok(())
        })
        .unwrap();
    trained.save(&path).unwrap();
    let want = trained
        .variable(0, "l1.weight")
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();

    let three = strategy(3);
    let restored = DataParallel::new(&three, Config::default(), linear, sgd).unwrap();
    restored.load(&path).unwrap();
    for r in 0..3 {
        let got = restored
            .variable(r, "l1.weight")
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(got, want);
    }
    // candle's own VarMap reads the file too.
    let mut varmap = candle_nn::VarMap::new();
    linear(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    varmap.load(&path).unwrap();

    let wider = DataParallel::new(
        &three,
        Config::default(),
        |vb: VarBuilder| candle_nn::linear(4, 3, vb.pp("l1")),
        sgd,
    )
    .unwrap();
    let err = wider.load(&path).unwrap_err().to_string();
    assert!(
        err.ends_with("variable 'l1.bias' is f32 [2], the model's is f32 [3]"),
        "{err}"
    );
    let renamed = DataParallel::new(
        &three,
        Config::default(),
        |vb: VarBuilder| candle_nn::linear(4, 2, vb.pp("l0")),
        sgd,
    )
    .unwrap();
    let err = renamed.load(&path).unwrap_err().to_string();
    assert!(err.ends_with("has no variable 'l0.bias'"), "{err}");
    let err = renamed.load(dir.path().join("missing")).unwrap_err();
    assert!(matches!(err, Error::Checkpoint { .. }), "{err:?}");
}

#[test]
fn the_checkpoints_of_the_job_hold_the_model_and_refuse_another_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let options = CheckpointOptions { every: 1, keep: 1 };
    let checkpoints = Checkpoints::new(dir.path(), options).unwrap();
    let two = strategy(2);
    let trained = DataParallel::new(&two, Config::default(), linear, sgd).unwrap();
    trained
        .run(&(), |replica, ()| {
            let x = rows(replica.replica_id(), replica.device())?;
            let loss = replica.model().forward(&x)?.sum_all()?;
            replica.backward_step(&loss, ReduceOp::Mean)?;
            Ok(())
        })
        .unwrap();
    checkpoints
        .save(&two, 1, &[&trained], InputPosition::at_step(1))
        .unwrap();

    let three = strategy(3);
    let restored = DataParallel::new(&three, Config::default(), linear, sgd).unwrap();
    let resume = checkpoints.restore(&three, &[&restored]).unwrap().unwrap();
    assert_eq!((resume.step, resume.input), (1, InputPosition::at_step(1)));
    restored.check_in_sync().unwrap();
    for name in ["l1.weight", "l1.bias"] {
        let bits = |m: &DataParallel<'_, _, _, _>| {
            m.variable(0, name)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        assert_eq!(bits(&restored), bits(&trained), "{name}");
    }

    // Another model under the same name: refused, naming the variable and the file.
    let wider = DataParallel::new(
        &three,
        Config::default(),
        |vb: VarBuilder| candle_nn::linear(4, 3, vb.pp("l1")),
        sgd,
    )
    .unwrap();
    let err = checkpoints
        .restore(&three, &[&wider])
        .unwrap_err()
        .to_string();
    assert!(err.contains("ckpt-0000000001.dst"), "{err}");
    assert!(
        err.contains("variable 'l1.bias' is f32 [2], the model's is f32 [3]"),
        "{err}"
    );
    // Another name: the checkpoint has no such entry.
    let named = Config {
        name: "encoder",
        ..Config::default()
    };
    let encoder = DataParallel::new(&three, named, linear, sgd).unwrap();
    let err = checkpoints
        .restore(&three, &[&encoder])
        .unwrap_err()
        .to_string();
    assert!(err.contains("no variable encoder"), "{err}");
}

#[test]
fn model_methods_called_inside_a_step_are_refused_instead_of_waiting_forever() {
    let s = strategy(2);
    let model = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let err = model
        .run(&(), |replica, ()| {
            let refused = [
                model.check_in_sync().err(),
                model.variable(0, "l1.weight").err(),
                model.with_model(1, |_| Ok::<_, StepError>(())).err(),
                model.save(&path).err(),
                model.load(&path).err(),
                model.assign(Default::default()).err(),
            ];
            for error in refused {
                assert!(matches!(error, Some(Error::InStep { .. })), "{error:?}");
            }
            // So is a model's run inside a step.
            if replica.replica_id() == 1 {
                model.run(&(), |_, ()| Ok(()))?;
            }
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(&err, Error::Replica { replica: 1, source }
            if source.to_string().contains("DataParallel::run was called from inside a step")),
        "{err:?}"
    );
    // On the default strategy too, which runs the step on the caller's thread.
    let default = DefaultStrategy::new().unwrap();
    let alone = DataParallel::new(&default, Config::default(), linear, sgd).unwrap();
    let err = alone
        .run(&(), |_, ()| Ok(alone.run(&(), |_, ()| Ok(()))?))
        .unwrap_err();
    assert!(
        err.to_string().contains("DataParallel::run was called"),
        "{err}"
    );
    // Between steps they work.
    model.check_in_sync().unwrap();
    model.save(&path).unwrap();
    model.load(&path).unwrap();
}

#[test]
fn accumulated_micro_batches_update_as_one_batch() {
    let s = strategy(2);
    let accumulated = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("init.safetensors");
    accumulated.save(&init).unwrap();
    let whole = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
    whole.load(&init).unwrap();

    // Each replica's 6 rows: as one batch, or as two micro-batches of 3.
    let batch = |replica: usize, device: &Device| -> candle_core::Result<Tensor> {
        Tensor::arange(0f32, 24.0, device)?
            .affine(0.05, replica as f64)?
            .reshape((6, 4))
    };
    whole
        .run(&(), |replica, ()| {
            let x = batch(replica.replica_id(), replica.device())?;
            let loss = replica.model().forward(&x)?.sqr()?.sum_all()?;
            replica.backward_step(&loss, ReduceOp::Sum)?;
            Ok(())
        })
        .unwrap();
    accumulated
        .run(&(), |replica, ()| {
            let x = batch(replica.replica_id(), replica.device())?;
            for half in [x.narrow(0, 0, 3)?, x.narrow(0, 3, 3)?] {
                let loss = replica.model().forward(&half)?.sqr()?.sum_all()?;
                replica.accumulate(&loss)?;
            }
            replica.step_accumulated(ReduceOp::Sum)?;
            Ok(())
        })
        .unwrap();
    accumulated.check_in_sync().unwrap();
    for name in ["l1.weight", "l1.bias"] {
        let a = accumulated
            .variable(0, name)
            .unwrap()
            .flatten_all()
            .unwrap();
        let b = whole.variable(0, name).unwrap().flatten_all().unwrap();
        let diff = (a - b).unwrap().abs().unwrap().max(0).unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-5, "{name}");
    }
}

#[test]
fn assigned_values_reach_every_copy_and_misfits_are_named() {
    let s = strategy(3);
    let model = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
    let weight = Tensor::arange(0f32, 8.0, &Device::Cpu)
        .unwrap()
        .reshape((2, 4))
        .unwrap();
    let bias = Tensor::new(&[0.5f32, -0.5], &Device::Cpu).unwrap();
    let values = [
        ("l1.weight".to_owned(), weight.clone()),
        ("l1.bias".to_owned(), bias),
    ];
    model.assign(values.iter().cloned().collect()).unwrap();
    for r in 0..3 {
        let got = model.variable(r, "l1.weight").unwrap();
        assert_eq!(
            got.to_vec2::<f32>().unwrap(),
            weight.to_vec2::<f32>().unwrap()
        );
    }
    let err = model
        .assign(values[..1].iter().cloned().collect())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the values to assign: has no variable 'l1.bias'"
    );
}

#[test]
fn padded_batches_reach_the_step_as_candle_tensors_with_their_masks() {
    use distribute_input::{Dataset, InputOptions, PartialBatch};
    use distribute_strategy::Strategy;
    use distribute_tensor::Tensor as HostTensor;

    let s = strategy(2);
    let model = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
    // 5 rows of 4 features in global batches of 4: rows 0-1 and 2-3, then row 4 and padding.
    let x: Vec<f32> = (0..20).map(|v| v as f32).collect();
    let dataset = Dataset::from_tensors(HostTensor::from_vec("/cpu:0", &[5, 4], x).unwrap())
        .unwrap()
        .batch(4, false)
        .unwrap();
    let options = InputOptions {
        partial_batch: PartialBatch::PadWithMask,
        ..InputOptions::default()
    };
    let dataset = s.distribute_dataset(dataset, options).unwrap();
    let mut seen = Vec::new();
    for step in dataset.iter_masked() {
        let rows = model
            .run(&step.unwrap(), |replica, masked| {
                assert_eq!(masked.batch.dims(), [2, 4]);
                assert_eq!(
                    masked.batch.device().location(),
                    replica.device().location()
                );
                // The first feature of each real row.
                let first = masked.batch.narrow(1, 0, 1)?.squeeze(1)?.to_vec1::<f32>()?;
                let mask = masked.mask.to_vec1::<f32>()?;
                Ok(first
                    .into_iter()
                    .zip(mask)
                    .filter(|(_, m)| *m == 1.0)
                    .map(|(f, _)| f)
                    .collect::<Vec<f32>>())
            })
            .unwrap();
        seen.push(rows);
    }
    assert_eq!(
        seen,
        [
            vec![vec![0.0, 4.0], vec![8.0, 12.0]],
            vec![vec![16.0], vec![]]
        ]
    );
}

#[test]
fn a_parameter_no_replica_used_is_left_alone_by_the_optimizer() {
    use candle_nn::{AdamW, ParamsAdamW};

    let s = strategy(2);
    let model = DataParallel::new(&s, Config::default(), with_extra, |vars| {
        AdamW::new(vars, ParamsAdamW::default())
    })
    .unwrap();
    let before = model
        .variable(0, "l1.weight")
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    model
        .run(&(), |replica, ()| {
            let loss = replica
                .model()
                .l1
                .forward(&rows(0, replica.device())?)?
                .sum_all()?;
            replica.backward_step(&loss, ReduceOp::Mean)?;
            Ok(())
        })
        .unwrap();
    // AdamW's weight decay would shrink a parameter handed a zero gradient; one that had no
    // gradient anywhere is skipped, as candle's own step skips it.
    let extra = model
        .variable(0, "extra")
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(extra, [1.0f32; 3]);
    let after = model
        .variable(0, "l1.weight")
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_ne!(after, before, "the used layer trained");
    model.check_in_sync().unwrap();
}

#[test]
fn gradients_reduce_with_sum_or_mean_only() {
    // One replica too, whose gradients never leave it.
    for replicas in [1, 2] {
        let s = strategy(replicas);
        let model = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
        let err = model
            .run(&(), |replica, ()| {
                let loss = replica
                    .model()
                    .forward(&rows(0, replica.device())?)?
                    .sum_all()?;
                replica.backward_step(&loss, ReduceOp::Max)?;
                Ok(())
            })
            .unwrap_err();
        assert!(
            err.to_string().contains("Sum or Mean, not MAX"),
            "{replicas}: {err}"
        );
    }
}

/// One replica applies its own gradients (they never leave the device): its model follows a
/// plain candle loop from the same values bit for bit, and its gradients are checked as with
/// several replicas (and its operation: `gradients_reduce_with_sum_or_mean_only`).
#[test]
fn one_replica_trains_bit_for_bit_as_plain_candle_and_checks_as_several_do() {
    let s = strategy(1);
    let model = DataParallel::new(&s, Config::default(), linear, sgd).unwrap();
    let varmap = candle_nn::VarMap::new();
    let plain = linear(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    for name in ["l1.weight", "l1.bias"] {
        let value = model.variable(0, name).unwrap();
        varmap.data().lock().unwrap()[name].set(&value).unwrap();
    }
    let mut plain_sgd = sgd(varmap.all_vars()).unwrap();
    for step in 0..50 {
        model
            .run(&(), |replica, ()| {
                let x = rows(step % 3, replica.device())?;
                let loss = replica.model().forward(&x)?.sqr()?.mean_all()?;
                replica.backward_step(&loss, ReduceOp::Mean)?;
                Ok(())
            })
            .unwrap();
        let loss = plain
            .forward(&rows(step % 3, &Device::Cpu).unwrap())
            .unwrap()
            .sqr()
            .unwrap()
            .mean_all()
            .unwrap();
        plain_sgd.backward_step(&loss).unwrap();
    }
    for name in ["l1.weight", "l1.bias"] {
        let ours = model.variable(0, name).unwrap().flatten_all().unwrap();
        let theirs = varmap.data().lock().unwrap()[name]
            .as_tensor()
            .flatten_all()
            .unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_vec1::<f32>()
                .unwrap()
                .into_iter()
                .map(f32::to_bits)
                .collect()
        };
        let ours_values = ours.to_vec1::<f32>().unwrap();
        assert!(
            ours_values.iter().all(|v| v.is_finite()),
            "{name}: {ours_values:?}"
        );
        assert_eq!(bits(&ours), bits(&theirs), "{name}");
    }

    let err = model
        .run(&(), |replica, ()| {
            let loss = replica
                .model()
                .forward(&rows(0, replica.device())?)?
                .sum_all()?;
            let mut grads = loss.backward()?;
            let weight = replica
                .vars()
                .iter()
                .find(|v| v.dims() == [2, 4])
                .expect("the weight")
                .clone();
            grads.insert(
                weight.as_tensor(),
                Tensor::zeros(3, DType::F32, replica.device())?,
            );
            replica.all_reduce_gradients(&grads, ReduceOp::Sum)?;
            Ok(())
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("the gradient of variable") && err.to_string().contains("[3]"),
        "{err}"
    );
}
