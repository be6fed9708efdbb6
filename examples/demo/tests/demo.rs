//! The demo's MLP trains to the same weights on 1, 2 and 4 replicas (each replica a contiguous
//! chunk of the same global batches, gradients summed by all-reduce), on MirroredStrategy and as
//! a compiled TpuStrategy step, its loss goes down, and its command line refuses what this build
//! cannot run and takes the candle classifier's optimizer, warmup and clipping.

use distribute_demo::data::{FEATURES, load_wine};
use distribute_demo::hand_rolled::train_hand_rolled;
use distribute_demo::model::{Params, evaluate, max_weight_difference};
use distribute_demo::{
    Config, Framework, StrategyKind, TOLERANCE, TPU_MIRRORED_TOLERANCE, mirrored, tpu,
};

/// A short run with a small hidden layer, so the test takes seconds in debug. The global batch
/// of 30 does not divide by 4, so 4 replicas get uneven chunks (8, 8, 8, 6).
fn short_run(replicas: usize) -> Config {
    Config {
        steps: 60,
        global_batch: 30,
        hidden: 8,
        eval_every: 20,
        progress: false,
        ..Config::on_cpus(replicas)
    }
}

#[test]
fn one_two_and_four_replicas_learn_the_same_weights() {
    let data = load_wine(7).unwrap();
    assert_eq!(data.train.rows() + data.validation.rows(), 1599);
    assert_eq!(data.validation.rows(), 320);

    let one = mirrored::train(&short_run(1), &data).unwrap();
    let first = one.losses[0];
    let last: f32 = one.losses[50..].iter().sum::<f32>() / 10.0;
    assert!(
        last < 0.8 * first,
        "the training loss did not go down: {first} at the start, {last} at the end"
    );
    let (_, validation_loss) = *one.validation.last().unwrap();
    let start = evaluate(&Params::init(8, mean(&data.train.y), 7), &data.validation).unwrap();
    assert!(
        validation_loss < start.mse,
        "validation loss {validation_loss} is not below the untrained model's {}",
        start.mse
    );

    for replicas in [2, 4] {
        let many = mirrored::train(&short_run(replicas), &data).unwrap();
        let difference = max_weight_difference(&one.params, &many.params);
        assert!(
            difference <= TOLERANCE,
            "{replicas} replicas differ from 1 by {difference}"
        );
        assert_eq!(many.losses.len(), one.losses.len());
        assert_eq!(
            many.copy_difference, 0.0,
            "{replicas} replicas' mirrored copies drifted apart"
        );
    }
    // The comparison can tell models apart: another seed trains other weights.
    let other = mirrored::train(
        &Config {
            seed: 8,
            ..short_run(2)
        },
        &data,
    )
    .unwrap();
    assert!(max_weight_difference(&one.params, &other.params) > 1e-2);
}

#[test]
fn the_hand_written_loop_trains_the_mirrored_bits() {
    let data = load_wine(7).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for replicas in (1..=cores).take(2) {
        let config = short_run(replicas);
        let by_hand = train_hand_rolled(&config, &data).unwrap();
        let strategy = mirrored::train(&config, &data).unwrap();
        assert!(
            by_hand.params.same_bits(&strategy.params),
            "on {replicas} replicas the hand-written loop and MirroredStrategy trained other \
             weights: they differ by {}",
            max_weight_difference(&by_hand.params, &strategy.params)
        );
        assert!(by_hand.steps_per_s > 0.0);
        // Not a copy of the initial weights: they moved.
        let init = Params::init(8, mean(&data.train.y), 7);
        assert!(max_weight_difference(&by_hand.params, &init) > 1e-3);
    }
    // More replicas than cores would spin each other off them: refused, not run.
    let error = train_hand_rolled(&short_run(cores + 1), &data).unwrap_err();
    assert!(error.to_string().contains("a core per replica"), "{error}");
}

#[test]
fn tpu_replicas_learn_the_one_replica_and_the_mirrored_weights() {
    let data = load_wine(7).unwrap();
    let one = tpu::train_tpu(&short_run(1), &data).unwrap();
    let first = one.losses[0];
    let last: f32 = one.losses[50..].iter().sum::<f32>() / 10.0;
    assert!(
        last < 0.8 * first,
        "the TPU training loss did not go down: {first} at the start, {last} at the end"
    );
    let (_, validation_loss) = *one.validation.last().unwrap();
    assert!(
        validation_loss < one.validation[0].1,
        "validation loss {validation_loss} is not below the untrained model's {}",
        one.validation[0].1
    );

    // 4 replicas cut the batch of 30 unevenly: the last replica's 6 rows are padded to 8 and
    // masked, so this also checks that padding adds nothing to the gradients.
    for replicas in [2, 4] {
        let many = tpu::train_tpu(&short_run(replicas), &data).unwrap();
        let difference = max_weight_difference(&one.params, &many.params);
        assert!(
            difference <= TOLERANCE,
            "{replicas} TPU replicas differ from 1 by {difference}"
        );
        assert_eq!(
            many.copy_difference, 0.0,
            "{replicas} TPU replicas' device copies drifted apart"
        );
        let mirrored = mirrored::train(&short_run(replicas), &data).unwrap();
        let difference = max_weight_difference(&many.params, &mirrored.params);
        assert!(
            difference <= TPU_MIRRORED_TOLERANCE,
            "{replicas} TPU replicas differ from {replicas} mirrored replicas by {difference}"
        );
        // Step by step, the losses are the same model's too (the first is before any update).
        assert_eq!(many.losses.len(), mirrored.losses.len());
        for (step, (tpu, cpu)) in many.losses.iter().zip(&mirrored.losses).enumerate() {
            assert!(
                (tpu - cpu).abs() <= 1e-4 * cpu.abs(),
                "step {step}: TPU loss {tpu}, mirrored loss {cpu}"
            );
        }
    }
}

/// With its sums in f64 (the default) the compiled step gives the same weights to the bit on
/// 1, 2 and 4 replicas (4 cut the batch of 30 unevenly and pad); in f32, the program `jax.jit`
/// emits, a short run stays within [`TOLERANCE`] of one replica and is the same model.
#[test]
fn tpu_replicas_with_f64_sums_learn_the_same_bits_and_f32_stays_close() {
    let data = load_wine(7).unwrap();
    assert_eq!(short_run(1).tpu_arithmetic, tpu::StepArithmetic::F64Sums);
    let in_f32 = |replicas| Config {
        tpu_arithmetic: tpu::StepArithmetic::F32,
        ..short_run(replicas)
    };
    let one = tpu::train_tpu(&short_run(1), &data).unwrap();
    let f32_one = tpu::train_tpu(&in_f32(1), &data).unwrap();
    let difference = max_weight_difference(&one.params, &f32_one.params);
    assert!(
        difference <= TPU_MIRRORED_TOLERANCE,
        "f64 sums and f32 differ by {difference}"
    );
    for replicas in [2, 4] {
        let many = tpu::train_tpu(&short_run(replicas), &data).unwrap();
        assert_eq!(
            max_weight_difference(&one.params, &many.params),
            0.0,
            "{replicas} TPU replicas with f64 sums differ from 1"
        );
        let many = tpu::train_tpu(&in_f32(replicas), &data).unwrap();
        let difference = max_weight_difference(&f32_one.params, &many.params);
        assert!(
            difference <= TOLERANCE,
            "{replicas} TPU replicas in f32 differ from 1 by {difference}"
        );
    }
}

/// The error when no PJRT plugin can be found says how to install one. `PJRT_PLUGIN` is read
/// by every TPU test in this process, so the check runs in a child process of this test binary
/// with `PJRT_PLUGIN` pointing nowhere.
#[test]
fn without_a_plugin_the_tpu_demo_says_how_to_get_one() {
    const CHILD: &str = "DEMO_TEST_NO_PLUGIN_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let data = load_wine(7).unwrap();
        let err = tpu::train_tpu(&short_run(2), &data).unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains("--strategy tpu"), "{message}");
        assert!(message.contains("cargo xtask fetch-pjrt"), "{message}");
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "without_a_plugin_the_tpu_demo_says_how_to_get_one",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("PJRT_PLUGIN", "/nonexistent/pjrt_plugin.so")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child test failed or did not run:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn replica_r_gets_the_r_th_contiguous_chunk_of_each_global_batch() {
    use distribute::prelude::DistributedValues;

    let data = load_wine(7).unwrap();
    let one = mirrored::input_pipeline(&short_run(1), &data.train, "/cpu:0").unwrap();
    let four = mirrored::input_pipeline(&short_run(4), &data.train, "/cpu:0").unwrap();
    let mut steps = 0;
    for (whole, parts) in one.iter_per_replica().zip(four.iter_per_replica()).take(50) {
        let (whole, parts) = (whole.unwrap(), parts.unwrap());
        let (x, y) = &whole.values()[0];
        let sizes: Vec<usize> = parts.values().iter().map(|(x, _)| x.shape()[0]).collect();
        assert_eq!(sizes, [8, 8, 8, 6]);
        let joined_x: Vec<f32> = parts
            .values()
            .iter()
            .flat_map(|(x, _)| x.to_vec::<f32>().unwrap())
            .collect();
        let joined_y: Vec<f32> = parts
            .values()
            .iter()
            .flat_map(|(_, y)| y.to_vec::<f32>().unwrap())
            .collect();
        assert_eq!(joined_x, x.to_vec::<f32>().unwrap(), "step {steps}");
        assert_eq!(joined_y, y.to_vec::<f32>().unwrap(), "step {steps}");
        steps += 1;
    }
    // 50 steps of 30 rows span two epochs of the 1279 training rows, in a new order each.
    assert_eq!(steps, 50);
}

#[test]
fn a_diverged_run_never_matches() {
    let good = Params::init(4, 5.5, 7);
    let mut diverged = good.clone();
    diverged.w2[1] = f32::NAN;
    for (a, b) in [
        (&good, &diverged),
        (&diverged, &good),
        (&diverged, &diverged),
    ] {
        let difference = max_weight_difference(a, b);
        assert!(difference.is_nan(), "NaN weights passed as {difference}");
    }
    assert_eq!(max_weight_difference(&good, &good), 0.0);
}

#[test]
fn the_split_is_seeded_and_standardized_with_training_statistics() {
    let a = load_wine(7).unwrap();
    let b = load_wine(7).unwrap();
    let c = load_wine(8).unwrap();
    assert_eq!((&a.train.x, &a.validation.y), (&b.train.x, &b.validation.y));
    assert_ne!(a.validation.y, c.validation.y);
    // Training features have mean 0 and deviation 1; validation ones only roughly.
    for j in 0..FEATURES {
        let column: Vec<f32> = a
            .train
            .x
            .iter()
            .skip(j)
            .step_by(FEATURES)
            .copied()
            .collect();
        let m = mean(&column);
        let var = column.iter().map(|v| (v - m).powi(2)).sum::<f32>() / column.len() as f32;
        assert!(
            m.abs() < 1e-4 && (var - 1.0).abs() < 1e-3,
            "feature {j}: {m}, {var}"
        );
    }
}

#[test]
fn the_command_line_refuses_what_this_build_cannot_run() {
    let parse = |line: &str| distribute_demo::parse_args(line.split_whitespace());
    let defaults = parse("").unwrap();
    assert_eq!(defaults.config.devices, ["/cpu:0", "/cpu:1"]);
    assert_eq!(defaults.strategy, StrategyKind::Mirrored);
    assert_eq!(defaults.framework, Framework::Candle);
    assert_eq!(
        (
            defaults.config.steps,
            defaults.config.global_batch,
            defaults.config.hidden
        ),
        (600, 256, 256)
    );
    let native = parse("--framework native").unwrap();
    assert_eq!(
        (
            native.config.steps,
            native.config.global_batch,
            native.config.hidden
        ),
        (2000, 128, 32)
    );
    assert_eq!(
        defaults.config.deadline,
        std::time::Duration::from_secs(300)
    );
    let quick = parse("--deadline 2.5").unwrap();
    assert_eq!(
        quick.config.deadline,
        std::time::Duration::from_millis(2500)
    );
    let four = parse("--replicas 4 --steps 10 --batch 64 --lr 0.1 --hidden 4").unwrap();
    assert_eq!(four.config.devices.len(), 4);
    assert_eq!(
        (
            four.config.steps,
            four.config.global_batch,
            four.config.hidden
        ),
        (10, 64, 4)
    );

    for (line, expected) in [
        ("--devices /cpu:0,/gpu:1", "no GPU kernels"),
        ("--devices /cpu:0 --replicas 2", "disagrees"),
        ("--replicas 0", "positive"),
        ("--deadline 0", "seconds from 0.1 on"),
        ("--deadline inf", "seconds from 0.1 on"),
        ("--momentum 1", "below 1"),
        ("--momentum 0.5", "add --framework native"),
        ("--batch 2 --replicas 3", "no rows"),
        // clap's wording for what it does not know.
        ("--frobnicate 1", "unexpected argument '--frobnicate'"),
        ("--strategy xla", "possible values: mirrored, tpu"),
        ("--framework candle --strategy tpu", "drop --strategy tpu"),
    ] {
        let err = parse(line).unwrap_err().to_string();
        assert!(err.contains(expected), "{line}: {err}");
    }
    let tpu = parse("--strategy tpu --replicas 4").unwrap();
    assert_eq!(tpu.framework, Framework::Native);
    assert_eq!(tpu.strategy, StrategyKind::Tpu);
    assert_eq!(tpu.config.devices.len(), 4);
    for (line, expected) in [
        (
            "--strategy tpu --devices /cpu:0,/cpu:1",
            "--replicas N instead",
        ),
        ("--devices /tpu:0,/tpu:1", "--strategy tpu --replicas N"),
    ] {
        let err = parse(line).unwrap_err().to_string();
        assert!(err.contains(expected), "{line}: {err}");
    }
}

#[test]
fn the_candle_classifier_takes_an_optimizer_a_warmup_and_clipping() {
    use distribute_demo::candle::{OptimizerKind, optimizer_description};

    let parse = |line: &str| distribute_demo::parse_args(line.split_whitespace());
    let training = |line: &str| {
        let c = parse(line).unwrap().config;
        (
            c.optimizer,
            c.learning_rate,
            c.weight_decay,
            c.warmup,
            c.clip_norm,
        )
    };
    // The default is today's: plain SGD at 0.02, its model line unchanged.
    assert_eq!(training(""), (OptimizerKind::Sgd, 0.02, 0.0, 0, None));
    assert_eq!(
        optimizer_description(&parse("").unwrap().config),
        "SGD lr 0.02"
    );
    assert_eq!(
        training("--optimizer sgd --weight-decay 1e-4"),
        (OptimizerKind::Sgd, 0.02, 1e-4, 0, None)
    );
    // AdamW's own defaults: PyTorch's rate and weight decay.
    assert_eq!(
        training("--optimizer adamw"),
        (OptimizerKind::AdamW, 1e-3, 0.01, 0, None)
    );
    let line = "--optimizer adamw --lr 0.003 --weight-decay 0 --warmup 20 --clip-norm 1.5";
    assert_eq!(
        training(line),
        (OptimizerKind::AdamW, 0.003, 0.0, 20, Some(1.5))
    );
    assert_eq!(
        optimizer_description(&parse(line).unwrap().config),
        "AdamW lr 0.003 (20 steps of linear warmup, then cosine decay to 0 at step 600), \
         gradients clipped to global norm 1.5"
    );

    for (line, expected) in [
        ("--optimizer adam", "possible values: sgd, adamw"),
        ("--lr -1", "invalid value '-1' for '--lr <X>': a number ≥ 0"),
        (
            "--weight-decay -0.1",
            "for '--weight-decay <X>': a number ≥ 0",
        ),
        (
            "--weight-decay nan",
            "for '--weight-decay <X>': a number ≥ 0",
        ),
        ("--warmup -3", "for '--warmup <W>': a whole number of steps"),
        ("--warmup 600", "--warmup 600 must be below --steps (600)"),
        ("--steps 10 --warmup 10", "must be below --steps (10)"),
        ("--warmup 5 --lr 0", "--warmup needs an --lr above 0"),
        ("--clip-norm 0", "for '--clip-norm <X>': a number above 0"),
        ("--clip-norm inf", "for '--clip-norm <X>': a number above 0"),
        (
            "--framework native --optimizer adamw",
            "--optimizer is the candle classifier's",
        ),
        (
            "--framework native --weight-decay 0.1",
            "--weight-decay is the candle classifier's",
        ),
        (
            "--framework native --warmup 5",
            "--warmup is the candle classifier's",
        ),
        (
            "--framework native --clip-norm 1",
            "--clip-norm is the candle classifier's",
        ),
    ] {
        let err = parse(line).unwrap_err().to_string();
        assert!(err.contains(expected), "{line}: {err}");
    }
}

#[test]
fn the_loss_curve_is_a_png() {
    let dir = std::env::temp_dir().join(format!("distribute-demo-test-{}", std::process::id()));
    let path = dir.join("loss.png");
    let losses: Vec<f32> = (0..120).map(|i| 1.0 / (1.0 + i as f32 / 10.0)).collect();
    distribute_demo::report::plot_losses(
        &path,
        &losses,
        &[(60, 0.3), (120, 0.2)],
        "test",
        "cross-entropy",
    )
    .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(
        bytes.len() > 1000,
        "a near-empty image: {} bytes",
        bytes.len()
    );
}

fn mean(values: &[f32]) -> f32 {
    values.iter().sum::<f32>() / values.len() as f32
}

/// A short candle run on `replicas` replicas.
fn short_candle_run(replicas: usize) -> Config {
    Config {
        steps: 100,
        global_batch: 64,
        hidden: 32,
        learning_rate: 0.1,
        progress: false,
        ..Config::on_cpus(replicas)
    }
}

#[test]
fn candle_replicas_learn_the_one_replica_weights_and_a_one_percent_change_does_not() {
    use distribute_demo::candle::{CANDLE_TOLERANCE, max_weight_difference, train};

    let data = load_wine(7).unwrap();
    let one = train(&short_candle_run(1), &data).unwrap();
    assert!(
        one.losses[99] < one.losses[0],
        "it learns: {:?}",
        one.losses
    );
    // 64 rows on 3 replicas: 22 + 22 + 20.
    for replicas in [2, 3] {
        let many = train(&short_candle_run(replicas), &data).unwrap();
        let difference = max_weight_difference(&many.early_weights, &one.early_weights);
        eprintln!("candle, {replicas} replicas vs 1 after 100 steps: {difference:e}");
        assert!(
            difference <= CANDLE_TOLERANCE,
            "{replicas} replicas: {difference}"
        );
    }
    let nudged = train(
        &Config {
            learning_rate: 0.101,
            ..short_candle_run(1)
        },
        &data,
    )
    .unwrap();
    let difference = max_weight_difference(&nudged.early_weights, &one.early_weights);
    eprintln!("candle, learning rate 1 % higher, after 100 steps: {difference:e}");
    assert!(difference > 10.0 * CANDLE_TOLERANCE, "{difference}");
}

#[test]
fn the_gpt_takes_its_own_options_and_refuses_the_mlps() {
    let parse = |line: &str| distribute_demo::parse_args(line.split_whitespace());
    let gpt = parse("--model gpt --replicas 3 --layers 1 --embd 32 --lr 0.003 --sample 0")
        .unwrap()
        .gpt
        .expect("--model gpt");
    assert_eq!(
        (
            gpt.replicas,
            gpt.layers,
            gpt.embd,
            gpt.heads,
            gpt.lr,
            gpt.sample
        ),
        (3, Some(1), Some(32), None, Some(0.003), 0),
        "the user's 0.003, not the f32 that clap read"
    );
    assert_eq!(parse("").unwrap().gpt, None, "the MLP stays the default");
    for (line, expected) in [
        ("--layers 2", "--layers is the GPT's: add --model gpt"),
        ("--sample 10", "--sample is the GPT's"),
        (
            "--model gpt --framework candle",
            "--framework is the wine-quality MLP's",
        ),
        (
            "--model gpt --strategy tpu",
            "--strategy tpu is the wine-quality MLP's",
        ),
        (
            "--model gpt --hidden 8",
            "--hidden is the wine-quality MLP's",
        ),
        (
            "--model gpt --embd 30 --heads 4",
            "--embd 30 is not a multiple of --heads 4",
        ),
        (
            "--model gpt --batch 1",
            "--batch 1 gives some of the 2 replicas no window",
        ),
        (
            "--model gpt --steps 10 --warmup 10",
            "--warmup 10 must be below --steps (10)",
        ),
        ("--model llama", "possible values: mlp, gpt"),
    ] {
        let err = parse(line).unwrap_err().to_string();
        assert!(err.contains(expected), "{line}: {err}");
    }
}

#[test]
fn the_gpt_demo_trains_samples_and_matches_one_replica() {
    // A tiny GPT for a few steps: the whole path of `--model gpt` (train, evaluate, sample,
    // the check against one replica over all its steps).
    let line = "--model gpt --steps 6 --warmup 2 --layers 1 --embd 16 --heads 2 --block 16 \
                --batch 8 --sample 8";
    distribute_demo::run(&distribute_demo::parse_args(line.split_whitespace()).unwrap()).unwrap();
}
