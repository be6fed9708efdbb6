//! `MultiWorkerMirroredStrategy` with real processes: each test launches this test binary under
//! `mpirun -n W` (bounded by `timeout`, loopback only), where `worker_entry` runs one scenario
//! per process and writes what it saw to a file; the test then compares every worker's file.
//!
//! Needs Open MPI's `mpirun` (the `mpi` feature needs Open MPI to build at all).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use distribute_device_spec::LocalDevices;
use distribute_input::InputPosition;
use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
use distribute_strategy::{
    CheckpointOptions, CheckpointVariable, Checkpoints, Strategy, StrategyError, VariableOptions,
};
use distribute_tensor::{DType, Fnv, Tensor};
use distribute_values::{DistributedValues, Leaf, PerReplica, ReduceOp};

const SCENARIO: &str = "DISTRIBUTE_MW_SCENARIO";
const OUT: &str = "DISTRIBUTE_MW_OUT";
const REPLICAS: &str = "DISTRIBUTE_MW_REPLICAS";
const CHECKPOINT: &str = "DISTRIBUTE_MW_CHECKPOINT";

/// One launch at a time: the machine has few cores and every launch oversubscribes them.
static LAUNCH: Mutex<()> = Mutex::new(());

/// What `mpirun` left behind.
struct Job {
    code: Option<i32>,
    stderr: String,
    /// Worker index → the lines it wrote.
    lines: BTreeMap<usize, Vec<String>>,
}

fn launch(workers: usize, replicas: usize, scenario: &str) -> Job {
    launch_with(workers, replicas, scenario, Path::new("/nonexistent"))
}

fn launch_with(workers: usize, replicas: usize, scenario: &str, checkpoint: &Path) -> Job {
    let _one = LAUNCH.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("a temporary directory");
    let exe = std::env::current_exe().expect("the test binary");
    let output = Command::new("timeout")
        .args(["-k", "10", "180", "mpirun", "--oversubscribe", "-n"])
        .arg(workers.to_string())
        // Loopback only: shared memory within the machine, TCP (if any) on lo.
        .args(["--mca", "btl_tcp_if_include", "lo"])
        // Open MPI 4's out-of-band channel on lo too; as an environment variable, because Open
        // MPI 5 (PRRTE) never uses a loopback interface for it and refuses `--mca
        // oob_tcp_if_include lo`, while it ignores this variable.
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .arg(&exe)
        .args(["worker_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env(SCENARIO, scenario)
        .env(OUT, dir.path())
        .env(REPLICAS, replicas.to_string())
        .env(CHECKPOINT, checkpoint)
        .env_remove("TF_CONFIG")
        .output()
        .expect("mpirun and timeout must be installed (Open MPI)");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_ne!(
        output.status.code(),
        Some(124),
        "{scenario} on {workers} workers timed out: {stderr}"
    );
    let mut lines = BTreeMap::new();
    for w in 0..workers {
        if let Ok(text) = std::fs::read_to_string(dir.path().join(format!("worker{w}.txt"))) {
            lines.insert(w, text.lines().map(str::to_owned).collect());
        }
    }
    Job {
        code: output.status.code(),
        stderr,
        lines,
    }
}

/// Every worker ran to the end and wrote its file.
fn completed(job: &Job, workers: usize, what: &str) {
    assert_eq!(
        job.code,
        Some(0),
        "{what}: mpirun failed: {}\nfiles: {:?}",
        job.stderr,
        job.lines
    );
    assert_eq!(
        job.lines.len(),
        workers,
        "{what}: {:?} {}",
        job.lines,
        job.stderr
    );
    for (w, lines) in &job.lines {
        assert_eq!(
            lines.last().map(String::as_str),
            Some("done"),
            "{what}: worker {w} did not finish: {lines:?}"
        );
    }
}

/// The values of `key` (lines `key=value`) across every worker's file.
fn values<'a>(job: &'a Job, key: &str) -> Vec<&'a str> {
    job.lines
        .values()
        .flatten()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

#[test]
fn every_replica_of_every_worker_gets_the_same_bits() {
    for workers in [2, 3, 4] {
        for replicas in [1, 2] {
            let what = format!("collectives on {workers} workers × {replicas}");
            let job = launch(workers, replicas, "collectives");
            completed(&job, workers, &what);
            let keys: Vec<String> = job.lines[&0]
                .iter()
                .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_owned()))
                .filter(|k| k != "replica")
                .collect();
            let mut ids: Vec<usize> = values(&job, "replica")
                .iter()
                .map(|v| v.parse().unwrap())
                .collect();
            ids.sort_unstable();
            assert_eq!(
                ids,
                (0..workers * replicas).collect::<Vec<_>>(),
                "{what}: global replica ids"
            );
            assert!(keys.len() >= 10, "{what}: {keys:?}");
            for key in keys {
                let seen = values(&job, &key);
                assert_eq!(seen.len(), workers * replicas, "{what}: {key}: {seen:?}");
                assert!(
                    seen.iter().all(|v| *v == seen[0]),
                    "{what}: {key} differs between replicas: {seen:?}"
                );
            }
        }
    }
}

#[test]
fn cross_replica_counts_span_every_worker() {
    for (workers, replicas) in [(2, 1), (2, 2), (3, 1)] {
        let what = format!("counts on {workers} workers × {replicas}");
        let job = launch(workers, replicas, "counts");
        completed(&job, workers, &what);
        let n = workers * replicas;
        // Global replica g holds g + 1 rows of the value g.
        let rows: usize = (0..n).map(|g| g + 1).sum();
        let weighted: usize = (0..n).map(|g| g * (g + 1)).sum();
        let expected = [
            ("in_sync", n.to_string()),
            ("plain_sum_along", (4 * n).to_string()),
            ("plain_mean_along", "2".to_owned()),
            (
                "rows_mean_along",
                format!("{:.6}", weighted as f64 / rows as f64),
            ),
            ("plain_sum_refused", "true".to_owned()),
        ];
        for (key, want) in expected {
            let seen = values(&job, key);
            assert_eq!(seen.len(), workers, "{what}: {key}: {seen:?}");
            assert!(
                seen.iter().all(|v| *v == want),
                "{what}: {key}: {seen:?} (want {want})"
            );
        }
    }
}

#[test]
fn cross_replica_broadcast_sends_the_chiefs_value() {
    for (workers, replicas) in [(2, 1), (3, 2)] {
        let what = format!("broadcast on {workers} workers × {replicas}");
        let job = launch(workers, replicas, "broadcast");
        completed(&job, workers, &what);
        let seen = values(&job, "broadcast_to");
        assert_eq!(seen.len(), workers * replicas, "{what}: {seen:?}");
        assert!(seen.iter().all(|v| *v == "chief"), "{what}: {seen:?}");
        // A worker passing another shape is an error on every worker, not a hang.
        let refused = values(&job, "broadcast_mismatch");
        assert_eq!(refused.len(), workers, "{what}: {refused:?}");
        assert!(refused.iter().all(|v| *v != "ok"), "{what}: {refused:?}");
    }
}

#[test]
fn gather_joins_every_worker_in_global_replica_order() {
    for (workers, replicas) in [(2, 1), (2, 2), (3, 2)] {
        let what = format!("gather on {workers} workers × {replicas}");
        let job = launch(workers, replicas, "gather");
        completed(&job, workers, &what);
        for key in ["gather_rows", "gather_columns", "gather_plain"] {
            let seen = values(&job, key);
            assert_eq!(seen.len(), workers, "{what}: {key}: {seen:?}");
            assert!(
                seen.iter().all(|v| *v == "expected"),
                "{what}: {key}: {seen:?}"
            );
        }
        let refused = values(&job, "gather_mismatch");
        assert_eq!(refused.len(), workers, "{what}: {refused:?}");
        assert!(refused.iter().all(|v| *v != "ok"), "{what}: {refused:?}");
    }
}

#[test]
fn variables_start_with_the_chiefs_values() {
    for workers in [2, 3] {
        let job = launch(workers, 2, "variables");
        completed(&job, workers, "variables");
        for key in ["tensor_variable", "scalar_variable", "step_variable"] {
            let seen = values(&job, key);
            assert_eq!(seen.len(), workers * 2, "{key}: {seen:?}");
            assert!(seen.iter().all(|v| *v == "chief"), "{key}: {seen:?}");
        }
    }
}

#[test]
fn replica_context_updates_aggregate_every_worker() {
    for (workers, replicas) in [(2, 1), (2, 2), (3, 1)] {
        let what = format!("replica updates on {workers} workers × {replicas}");
        let job = launch(workers, replicas, "replica_updates");
        completed(&job, workers, &what);
        let n = workers * replicas;
        // Replica g adds g + 1 (Sum) and assigns g + 1 to a Mean variable.
        let sum: usize = (1..=n).sum();
        let expected = [
            ("sum_update", format!("{:?}", sum as f32)),
            ("mean_update", format!("{:?}", sum as f32 / n as f32)),
            ("constant_mean", "0.5".to_owned()),
            ("constant_sum_refused", "true".to_owned()),
        ];
        for (key, want) in expected {
            let seen = values(&job, key);
            assert_eq!(seen.len(), workers * replicas, "{what}: {key}: {seen:?}");
            assert!(
                seen.iter().all(|v| *v == want),
                "{what}: {key}: {seen:?}, want {want}"
            );
        }
    }
}

#[test]
fn the_chief_writes_checkpoints_that_any_worker_count_restores() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoint = dir.path().join("checkpoint.json");
    let job = launch_with(2, 2, "checkpoint_write", &checkpoint);
    completed(&job, 2, "checkpoint_write");
    assert_eq!(
        values(&job, "wrote"),
        ["true", "false"],
        "only the chief writes"
    );
    // Sum of the replicas' (global id + 1) over 2 × 2 replicas; the chief's mirrored value.
    let written = std::fs::read_to_string(&checkpoint).expect("the chief's checkpoint");
    assert_eq!(written, r#"{"total":10.0,"weight":0.25}"#);
    for (workers, replicas) in [(3, 1), (1, 2)] {
        let job = launch_with(workers, replicas, "checkpoint_restore", &checkpoint);
        completed(&job, workers, "checkpoint_restore");
        assert_eq!(
            values(&job, "restored"),
            vec![r#"{"total":10.0,"weight":0.25}"#; workers]
        );
    }
}

#[test]
fn checkpoints_managed_by_the_chief_restore_on_any_worker_count() {
    let written = tempfile::tempdir().expect("a temporary directory");
    let job = launch_with(2, 2, "managed_write", written.path());
    completed(&job, 2, "managed_write");
    assert_eq!(
        values(&job, "wrote"),
        ["true", "false"],
        "only the chief writes"
    );
    for (workers, replicas) in [(3, 1), (1, 2)] {
        // A copy per job (a restore writes nothing, but keep the original pristine).
        let dir = tempfile::tempdir().expect("a temporary directory");
        for entry in std::fs::read_dir(written.path()).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
        let job = launch_with(workers, replicas, "managed_restore", dir.path());
        completed(&job, workers, "managed_restore");
        assert_eq!(values(&job, "step"), vec!["1"; workers]);
        // The sum over 2 × 2 replicas of (global id + 1), and the chief's mirrored value.
        assert_eq!(
            values(&job, "restored"),
            vec![r#"{"total":10.0,"weight":0.25}"#; workers]
        );
    }
}

#[test]
fn a_mismatched_call_is_an_error_on_every_worker() {
    let job = launch(3, 2, "mismatch");
    completed(&job, 3, "mismatch");
    for what in ["shape", "dtype", "op"] {
        let seen = values(&job, what);
        assert_eq!(seen.len(), 3, "{what}: {seen:?}");
        for error in seen {
            assert!(
                error.contains("different cross-worker calls"),
                "{what}: {error}"
            );
        }
    }
    assert_eq!(values(&job, "after"), ["ok"; 3]);
}

#[test]
fn a_failed_or_panicking_worker_is_named_on_every_worker() {
    for replicas in [1, 2] {
        let job = launch(3, replicas, "failures");
        completed(&job, 3, "failures");
        let errors = values(&job, "error");
        assert_eq!(errors.len(), 3, "{errors:?}");
        for e in errors {
            assert!(
                e.contains("worker 1 failed: ") && e.contains("boom on worker 1"),
                "{e}"
            );
        }
        let panics = values(&job, "panic");
        assert_eq!(panics.len(), 3, "{panics:?}");
        for e in panics {
            assert!(
                e.contains("worker 2 failed: ") && e.contains("panicked"),
                "{e}"
            );
        }
        let ended = values(&job, "early");
        assert_eq!(ended.len(), 3, "{ended:?}");
        for e in ended {
            assert!(
                e.contains("worker 0 failed: ") && e.contains("early exit"),
                "{e}"
            );
        }
        assert_eq!(values(&job, "after"), ["ok"; 3]);
    }
}

#[test]
fn a_killed_worker_ends_the_job_with_an_error() {
    let job = launch(3, 1, "killed");
    assert_ne!(job.code, Some(0), "the job must fail: {}", job.stderr);
    // mpirun's own account of the death, not a timeout's.
    assert!(
        job.stderr.contains("signal 9"),
        "mpirun must say why: {}",
        job.stderr
    );
    assert!(values(&job, "past_the_kill").is_empty(), "{:?}", job.lines);
}

#[test]
fn a_worker_past_the_deadline_aborts_the_job_naming_the_wait() {
    let job = launch(2, 1, "deadline");
    assert_ne!(job.code, Some(0), "the job must fail: {}", job.stderr);
    assert!(
        job.stderr.contains("aborting the MPI job"),
        "{}",
        job.stderr
    );
    assert!(job.stderr.contains("waited"), "{}", job.stderr);
}

#[test]
fn tf_config_must_agree_with_mpi() {
    let job = launch(2, 1, "tf_config");
    completed(&job, 2, "tf_config");
    let seen = values(&job, "tf_config");
    assert_eq!(seen.len(), 2, "{seen:?}");
    for e in seen {
        // Both workers disagree; every worker names the first.
        assert!(
            e.contains("worker 0 failed: TF_CONFIG and MPI disagree"),
            "{e}"
        );
    }
}

// ----- What each MPI process runs. -----

/// The program of every process of a launch; does nothing outside one.
#[test]
fn worker_entry() {
    let Ok(scenario) = std::env::var(SCENARIO) else {
        return;
    };
    let out = std::env::var(OUT).expect("the launcher sets the output folder");
    let replicas: usize = std::env::var(REPLICAS)
        .expect("the launcher sets the replica count")
        .parse()
        .expect("a number");
    let deadline = if scenario == "deadline" { 3 } else { 60 };
    let config = MultiWorkerConfig {
        local_devices: LocalDevices::cpus(replicas),
        deadline: Duration::from_secs(deadline),
        ..MultiWorkerConfig::default()
    };
    let strategy = MultiWorkerMirroredStrategy::with_config(config).expect("the strategy");
    let mut lines = Vec::new();
    match scenario.as_str() {
        "collectives" => collectives(&strategy, &mut lines),
        "variables" => variables(&strategy, &mut lines),
        "mismatch" => mismatch(&strategy, &mut lines),
        "failures" => failures(&strategy, &mut lines),
        "killed" => killed(&strategy, &mut lines),
        "deadline" => deadline_scenario(&strategy),
        "tf_config" => tf_config(&strategy, &mut lines),
        "checkpoint_write" => checkpoint_write(&strategy, &mut lines),
        "checkpoint_restore" => checkpoint_restore(&strategy, &mut lines),
        "managed_write" => managed_write(&strategy, &mut lines),
        "managed_restore" => managed_restore(&strategy, &mut lines),
        "counts" => counts(&strategy, &mut lines),
        "replica_updates" => replica_updates(&strategy, &mut lines),
        "broadcast" => broadcast(&strategy, &mut lines),
        "gather" => gather(&strategy, &mut lines),
        other => panic!("no scenario {other}"),
    }
    lines.push("done".to_owned());
    let path = Path::new(&out).join(format!("worker{}.txt", strategy.worker()));
    std::fs::write(path, lines.join("\n")).expect("the worker's file");
}

/// Element `i` of global replica `g`'s tensor: magnitudes from 1e-3 to 1e3, both signs, so a
/// different fold order would change the bits.
fn mixed(g: usize, i: usize) -> f32 {
    let mantissa = ((g * 7919 + i * 104_729) % 1000) as f32 + 0.123;
    let scale = 10f32.powi(((g + i) % 7) as i32 - 3);
    let sign = if (g + i).is_multiple_of(3) { -1.0 } else { 1.0 };
    sign * mantissa * scale
}

/// The bits of a tensor, hashed (FNV-1a over the element bits), with its dtype and shape.
fn fingerprint(t: &Tensor) -> String {
    let mut hash = Fnv::new();
    let mut eat = |bits: u64| {
        hash.bytes(&bits.to_le_bytes());
    };
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .for_each(|x| eat(u64::from(x.to_bits()))),
        DType::F64 => t
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .for_each(|x| eat(x.to_bits())),
        DType::I64 => t
            .to_vec::<i64>()
            .unwrap()
            .iter()
            .for_each(|&x| eat(x as u64)),
        DType::I32 => t
            .to_vec::<i32>()
            .unwrap()
            .iter()
            .for_each(|&x| eat(u64::from(x as u32))),
        other => panic!("no fingerprint for {other}"),
    }
    format!("{} {:?} {:016x}", t.dtype(), t.shape(), hash.0)
}

/// Fails unless `got` is within rounding of the f64 `reference`.
fn close(what: &str, got: &Tensor, reference: &[f64]) {
    let got: Vec<f64> = match got.dtype() {
        DType::F32 => got
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::F64 => got.to_vec::<f64>().unwrap(),
        other => panic!("{other}"),
    };
    assert_eq!(got.len(), reference.len(), "{what}");
    for (i, (g, r)) in got.iter().zip(reference).enumerate() {
        assert!(
            (g - r).abs() <= 1e-4 * r.abs().max(1.0),
            "{what}[{i}]: {g} vs the single-process reference {r}"
        );
    }
}

fn collectives(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let n = strategy.num_replicas_in_sync();
    assert_eq!(n, strategy.num_workers() * strategy.local_replicas());
    const LEN: usize = 37;
    // Large enough for the reduce-scatter path with 3 and 4 workers.
    const BIG: usize = 40_000;
    let reference = |len: usize| -> Vec<f64> {
        (0..len)
            .map(|i| (0..n).map(|g| f64::from(mixed(g, i))).sum())
            .collect()
    };
    let (small_ref, big_ref) = (reference(LEN), reference(BIG));
    let results = strategy
        .run(
            |ctx, ()| {
                let g = ctx.replica_id();
                assert_eq!(ctx.num_replicas_in_sync(), n);
                let mine = |len: usize| {
                    Tensor::from_vec(
                        ctx.device(),
                        &[len],
                        (0..len).map(|i| mixed(g, i)).collect(),
                    )
                };
                let small = mine(LEN)?;
                let big = mine(BIG)?;
                let mut out: Vec<(String, Tensor)> = Vec::new();
                let sum = ctx.collectives().all_reduce(ReduceOp::Sum, &small)?;
                close("sum", &sum, &small_ref);
                out.push(("all_reduce_sum".into(), sum));
                let mean = ctx.collectives().all_reduce(ReduceOp::Mean, &small)?;
                let mean_ref: Vec<f64> = small_ref.iter().map(|s| s / n as f64).collect();
                close("mean", &mean, &mean_ref);
                out.push(("all_reduce_mean".into(), mean));
                let max = ctx.collectives().all_reduce(ReduceOp::Max, &small)?;
                out.push(("all_reduce_max".into(), max));
                let big_sum = ctx.collectives().all_reduce(ReduceOp::Sum, &big)?;
                close("big sum", &big_sum, &big_ref);
                out.push(("all_reduce_big".into(), big_sum));
                let f64s = Tensor::from_vec(
                    ctx.device(),
                    &[3, 2],
                    (0..6).map(|i| f64::from(mixed(g + 5, i)) * 1e7).collect(),
                )?;
                let ints =
                    Tensor::from_vec(ctx.device(), &[4], vec![g as i64, 1, -(g as i64), 1 << 40])?;
                let batch = ctx
                    .collectives()
                    .batch_all_reduce(ReduceOp::Sum, &[small.clone(), f64s, ints, big.clone()])?;
                close("batch small", &batch[0], &small_ref);
                close("batch big", &batch[3], &big_ref);
                assert!(
                    batch[0].bitwise_eq(&out[0].1),
                    "a batch equals the single all-reduce"
                );
                let sum_g = (0..n as i64).sum::<i64>();
                assert_eq!(
                    batch[2].to_vec::<i64>()?,
                    [sum_g, n as i64, -sum_g, (n as i64) << 40]
                );
                for (i, t) in batch.into_iter().enumerate() {
                    out.push((format!("batch_all_reduce_{i}"), t));
                }
                // Rows differ per replica: g % 3 + 1 rows of 2.
                let rows = g % 3 + 1;
                let gather_in = Tensor::from_vec(
                    ctx.device(),
                    &[rows, 2],
                    (0..rows * 2).map(|i| (g * 100 + i) as i32).collect(),
                )?;
                let gathered = ctx.collectives().all_gather(&gather_in)?;
                let expected: Vec<i32> = (0..n)
                    .flat_map(|h| (0..(h % 3 + 1) * 2).map(move |i| (h * 100 + i) as i32))
                    .collect();
                assert_eq!(
                    gathered.to_vec::<i32>()?,
                    expected,
                    "all_gather in global replica order"
                );
                out.push(("all_gather".into(), gathered));
                let root = n - 1;
                let from_root = (g == root).then(|| small.clone());
                let broadcast = ctx.collectives().broadcast(root, from_root.as_ref())?;
                let root_values: Vec<f32> = (0..LEN).map(|i| mixed(root, i)).collect();
                assert_eq!(broadcast.to_vec::<f32>()?, root_values);
                out.push(("broadcast".into(), broadcast));
                let scattered = ctx.collectives().reduce_scatter(
                    ReduceOp::Sum,
                    &Tensor::from_vec(ctx.device(), &[n * 2], vec![g as i64; n * 2])?,
                )?;
                assert_eq!(scattered.to_vec::<i64>()?, [sum_g, sum_g]);
                // The id first keeps every replica's output its own (equal outputs regroup
                // into one value).
                let fingerprints: Vec<String> = std::iter::once(format!("replica={g}"))
                    .chain(
                        out.iter()
                            .map(|(key, t)| format!("{key}={}", fingerprint(t))),
                    )
                    .collect();
                Ok(fingerprints.join("\n"))
            },
            &(),
        )
        .expect("the collectives step");
    for replica_lines in results.local_results() {
        lines.extend(replica_lines.lines().map(str::to_owned));
    }
    // Cross-replica context: reduce_to of the per-replica inputs, on every worker.
    let inputs: Vec<Tensor> = (0..strategy.local_replicas())
        .map(|r| {
            let g = strategy.global_replica_id(r);
            let device = format!("/cpu:{r}");
            Tensor::from_vec(&device, &[LEN], (0..LEN).map(|i| mixed(g, i)).collect()).unwrap()
        })
        .collect();
    let per_replica = Leaf::PerReplica(
        PerReplica::new(
            std::sync::Arc::clone(strategy.extended().device_map()),
            inputs,
        )
        .unwrap(),
    );
    for op in [ReduceOp::Sum, ReduceOp::Mean] {
        let reduced = strategy.reduce(op, &per_replica, None).expect("reduce_to");
        let reference: Vec<f64> = match op {
            ReduceOp::Mean => small_ref.iter().map(|s| s / n as f64).collect(),
            _ => small_ref.clone(),
        };
        close("reduce_to", &reduced, &reference);
        // One line per local replica, so every replica of every worker is counted alike.
        for _ in 0..strategy.local_replicas() {
            lines.push(format!("reduce_to_{op}={}", fingerprint(&reduced)));
        }
    }
}

fn variables(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let w = strategy.worker();
    // Every worker's initialiser gives something else; the chief's must win.
    let initial = Tensor::from_vec("/cpu:0", &[3], vec![w as f32 + 0.5, -(w as f32), 7.0]).unwrap();
    let v = strategy
        .create_variable("w", initial, VariableOptions::default())
        .expect("a tensor variable");
    let s = strategy
        .create_variable("s", 100 + w as i64, VariableOptions::default())
        .expect("a scalar variable");
    let r = strategy.local_replicas();
    for value in (0..r).map(|i| v.component(i).unwrap().read()) {
        let chief = value.to_vec::<f32>().unwrap() == [0.5, 0.0, 7.0];
        lines.push(format!(
            "tensor_variable={}",
            if chief { "chief" } else { "other" }
        ));
    }
    for value in (0..r).map(|i| s.component(i).unwrap().read()) {
        lines.push(format!(
            "scalar_variable={}",
            if value == 100 { "chief" } else { "other" }
        ));
    }
    // Created inside a step: replica 0 of each worker creates it with its worker's value, and
    // the chief's must win on every replica of every worker.
    let flags = strategy
        .run(
            |ctx, ()| {
                let mine = Tensor::from_vec(ctx.device(), &[2], vec![w as f32 + 0.25, 9.0])?;
                let inner = ctx.create_variable(Some("inner"), mine, VariableOptions::default())?;
                let chief = ctx.read_variable(&inner)?.to_vec::<f32>()? == [0.25, 9.0];
                let flag = if chief { "chief" } else { "other" };
                Ok(format!("{}:{flag}", ctx.replica_id()))
            },
            &(),
        )
        .expect("a step creating a variable");
    for flag in flags.local_results() {
        let (_, flag) = flag.split_once(':').expect("id:flag");
        lines.push(format!("step_variable={flag}"));
    }
    // Replica ids are global and a step can read them.
    let ids = strategy
        .run(|ctx, ()| Ok(ctx.replica_id() as i64), &())
        .expect("a step");
    let got: Vec<i64> = ids.local_results().into_iter().copied().collect();
    assert_eq!(got, (0..r).map(|l| (w * r + l) as i64).collect::<Vec<_>>());
}

/// Replica-context updates of mirrored variables with Sum and Mean aggregation: every worker
/// must apply the aggregate of every worker's contributions, so every copy ends the same.
fn replica_updates(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let options = |aggregation| VariableOptions {
        aggregation,
        ..VariableOptions::default()
    };
    use distribute_values::{UpdateOp, VariableAggregation};
    let sum = strategy
        .create_variable("sum", 0.0f32, options(VariableAggregation::Sum))
        .expect("a Sum variable");
    let mean = strategy
        .create_variable("mean", 0.0f32, options(VariableAggregation::Mean))
        .expect("a Mean variable");
    let constant = strategy
        .create_variable("constant", 0.0f32, options(VariableAggregation::Mean))
        .expect("a Mean variable");
    let refused = strategy
        .create_variable("refused", 0.0f32, options(VariableAggregation::Sum))
        .expect("a Sum variable");
    strategy
        .run(
            |ctx, ()| {
                let mine = ctx.replica_id() as f32 + 1.0;
                ctx.update_variable(&sum, UpdateOp::AssignAdd, mine)?;
                ctx.update_variable(&mean, UpdateOp::Assign, mine)?;
                ctx.update_variable_with_constant(&constant, UpdateOp::Assign, 0.5)?;
                Ok(())
            },
            &(),
        )
        .expect("a step of replica-context updates");
    let sum_of_constant = strategy.run(
        |ctx, ()| ctx.update_variable_with_constant(&refused, UpdateOp::AssignAdd, 1.0f32),
        &(),
    );
    let r = strategy.local_replicas();
    for i in 0..r {
        lines.push(format!("sum_update={:?}", sum.component(i).unwrap().read()));
        lines.push(format!(
            "mean_update={:?}",
            mean.component(i).unwrap().read()
        ));
        lines.push(format!(
            "constant_mean={:?}",
            constant.component(i).unwrap().read()
        ));
        lines.push(format!("constant_sum_refused={}", sum_of_constant.is_err()));
    }
}

/// Records `result`'s error (or "ok") under `key`.
fn record<T>(lines: &mut Vec<String>, key: &str, result: Result<T, StrategyError>) {
    let text = match result {
        Ok(_) => "ok".to_owned(),
        Err(e) => e.to_string().replace('\n', " "),
    };
    lines.push(format!("{key}={text}"));
}

fn healthy_step(strategy: &MultiWorkerMirroredStrategy) -> Result<(), StrategyError> {
    let n = strategy.num_replicas_in_sync() as f32;
    let sums = strategy.run(
        |ctx, ()| ctx.all_reduce(ReduceOp::Sum, &Tensor::scalar(ctx.device(), 1.0f32)),
        &(),
    )?;
    for t in sums.local_results() {
        assert_eq!(t.to_vec::<f32>()?, [n]);
    }
    Ok(())
}

fn mismatch(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let last = strategy.worker() + 1 == strategy.num_workers();
    let shape = strategy.run(
        |ctx, ()| {
            let len = if last { 5 } else { 4 };
            ctx.all_reduce(
                ReduceOp::Sum,
                &Tensor::zeros(ctx.device(), DType::F32, &[len])?,
            )
        },
        &(),
    );
    record(lines, "shape", shape);
    let dtype = strategy.run(
        |ctx, ()| {
            let dtype = if last { DType::F64 } else { DType::F32 };
            ctx.all_reduce(ReduceOp::Sum, &Tensor::zeros(ctx.device(), dtype, &[4])?)
        },
        &(),
    );
    record(lines, "dtype", dtype);
    let op = strategy.run(
        |ctx, ()| {
            let op = if last { ReduceOp::Max } else { ReduceOp::Sum };
            ctx.all_reduce(op, &Tensor::zeros(ctx.device(), DType::F32, &[4])?)
        },
        &(),
    );
    record(lines, "op", op);
    record(lines, "after", healthy_step(strategy));
}

fn failures(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let w = strategy.worker();
    // Worker 1's first replica fails before the collective the others wait in.
    let error = strategy.run(
        |ctx, ()| {
            if w == 1 && ctx.replica_id() == strategy.local_replicas() {
                return Err(StrategyError::Runtime("boom on worker 1".into()));
            }
            ctx.all_reduce(ReduceOp::Sum, &Tensor::scalar(ctx.device(), 1.0f32))
        },
        &(),
    );
    record(lines, "error", error);
    // Worker 2 panics after one collective, in the middle of the step.
    let panic = strategy.run(
        |ctx, ()| {
            let one = ctx.all_reduce(ReduceOp::Sum, &Tensor::scalar(ctx.device(), 1.0f32))?;
            if w == 2 {
                panic!("worker 2 gives up");
            }
            ctx.all_reduce(ReduceOp::Sum, &one)
        },
        &(),
    );
    record(lines, "panic", panic);
    // Worker 0 fails at once; the others end their step without any collective.
    let early = strategy.run(
        |_, ()| {
            if w == 0 {
                return Err(StrategyError::Runtime("early exit".into()));
            }
            Ok(())
        },
        &(),
    );
    record(lines, "early", early);
    record(lines, "after", healthy_step(strategy));
}

fn killed(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let w = strategy.worker();
    let result = strategy.run(
        |ctx, ()| {
            if w == 1 {
                // As `kill -9` from outside would.
                let _ = Command::new("kill")
                    .args(["-KILL", &std::process::id().to_string()])
                    .status();
                std::thread::sleep(Duration::from_secs(30));
            }
            ctx.all_reduce(ReduceOp::Sum, &Tensor::scalar(ctx.device(), 1.0f32))
        },
        &(),
    );
    record(lines, "past_the_kill", result);
}

fn deadline_scenario(strategy: &MultiWorkerMirroredStrategy) {
    let w = strategy.worker();
    let _ = strategy.run(
        |ctx, ()| {
            if w == 1 {
                // Past the 3 s deadline, without failing: only the deadline can end this.
                std::thread::sleep(Duration::from_secs(20));
            }
            ctx.all_reduce(ReduceOp::Sum, &Tensor::scalar(ctx.device(), 1.0f32))
        },
        &(),
    );
}

fn tf_config(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    // The ranks in the reverse order of the cluster's tasks.
    let other = strategy.num_workers() - 1 - strategy.worker();
    let json = format!(
        r#"{{"cluster": {{"worker": ["localhost:1", "localhost:2"]}}, "task": {{"type": "worker", "index": {other}}}}}"#
    );
    let config = MultiWorkerConfig {
        tf_config: Some(distribute_device_spec::TfConfig::from_json(&json).unwrap()),
        ..MultiWorkerConfig::default()
    };
    record(
        lines,
        "tf_config",
        MultiWorkerMirroredStrategy::with_config(config),
    );
}

/// A mirrored weight (every worker's initialiser differs) and a sync-on-read `Sum` total whose
/// replica `g` holds `g + 1`.
fn checkpoint_variables(
    strategy: &MultiWorkerMirroredStrategy,
) -> (
    distribute_values::DistributedVariable<f64>,
    distribute_values::DistributedVariable<f64>,
) {
    let w = strategy.worker() as f64;
    let weight = strategy
        .create_variable("weight", 0.25 + w, VariableOptions::default())
        .unwrap();
    let options = VariableOptions {
        synchronization: distribute_values::VariableSynchronization::OnRead,
        aggregation: distribute_values::VariableAggregation::Sum,
        ..VariableOptions::default()
    };
    let total = strategy.create_variable("total", 0.0, options).unwrap();
    (weight, total)
}

/// Sets each local replica's component of `total` to its global replica id plus 1, so every
/// replica holds a different value.
fn assign_replica_totals(
    strategy: &MultiWorkerMirroredStrategy,
    total: &distribute_values::DistributedVariable<f64>,
) {
    for r in 0..strategy.local_replicas() {
        total
            .component(r)
            .unwrap()
            .assign(strategy.global_replica_id(r) as f64 + 1.0);
    }
}

fn saved_json(
    strategy: &MultiWorkerMirroredStrategy,
    weight: &distribute_values::DistributedVariable<f64>,
    total: &distribute_values::DistributedVariable<f64>,
) -> String {
    // The logical values a checkpoint holds, through the one checkpoint seam.
    let saved = |variable: &distribute_values::DistributedVariable<f64>| {
        let bytes = variable.saved_bytes(strategy.extended()).unwrap();
        f64::from_ne_bytes(bytes.try_into().unwrap())
    };
    let (total, weight) = (saved(total), saved(weight));
    format!(
        r#"{{"total":{},"weight":{}}}"#,
        serde_json::to_string(&total).unwrap(),
        serde_json::to_string(&weight).unwrap()
    )
}

fn checkpoint_write(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let (weight, total) = checkpoint_variables(strategy);
    assign_replica_totals(strategy, &total);
    let json = saved_json(strategy, &weight, &total);
    let wrote = strategy.extended().should_checkpoint();
    if wrote {
        std::fs::write(std::env::var(CHECKPOINT).unwrap(), json).unwrap();
    }
    lines.push(format!("wrote={wrote}"));
}

fn checkpoint_restore(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let (weight, total) = checkpoint_variables(strategy);
    let text = std::fs::read_to_string(std::env::var(CHECKPOINT).unwrap()).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let saved = |key: &str| json[key].as_f64().unwrap().to_ne_bytes();
    total
        .restore_bytes(strategy.extended(), &saved("total"))
        .unwrap();
    weight
        .restore_bytes(strategy.extended(), &saved("weight"))
        .unwrap();
    lines.push(format!(
        "restored={}",
        saved_json(strategy, &weight, &total)
    ));
}

/// `Checkpoints` in the directory `CHECKPOINT`, written after step 1.
fn managed_checkpoints() -> Checkpoints {
    let options = CheckpointOptions { every: 1, keep: 1 };
    Checkpoints::new(std::env::var(CHECKPOINT).unwrap(), options).unwrap()
}

fn managed_write(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let (weight, total) = checkpoint_variables(strategy);
    assign_replica_totals(strategy, &total);
    let written = managed_checkpoints()
        .save(strategy, 1, &[&weight, &total], InputPosition::at_step(1))
        .unwrap();
    lines.push(format!("wrote={}", written.is_some()));
}

fn managed_restore(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let (weight, total) = checkpoint_variables(strategy);
    let resume = managed_checkpoints()
        .restore(strategy, &[&weight, &total])
        .unwrap()
        .expect("the chief's checkpoint");
    lines.push(format!("step={}", resume.step));
    lines.push(format!(
        "restored={}",
        saved_json(strategy, &weight, &total)
    ));
}

/// Replica counts in cross-replica context: every worker's replicas, for plain values too.
fn counts(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let cross = strategy.cross_replica();
    lines.push(format!("in_sync={}", cross.num_replicas_in_sync()));
    // A plain value stands for every replica of every worker.
    let plain = Leaf::Same(Tensor::from_vec("/cpu:0", &[2], vec![1.0f32, 3.0]).unwrap());
    let sum = strategy.reduce(ReduceOp::Sum, &plain, Some(0)).unwrap();
    lines.push(format!(
        "plain_sum_along={}",
        sum.to_vec::<f32>().unwrap()[0]
    ));
    let mean = strategy.reduce(ReduceOp::Mean, &plain, Some(0)).unwrap();
    lines.push(format!(
        "plain_mean_along={}",
        mean.to_vec::<f32>().unwrap()[0]
    ));
    // Row counts differ per replica and per worker: the mean weighs every row of every worker.
    let parts: Vec<Tensor> = (0..strategy.local_replicas())
        .map(|r| {
            let g = strategy.global_replica_id(r);
            Tensor::from_vec(&format!("/cpu:{r}"), &[g + 1], vec![g as f32; g + 1]).unwrap()
        })
        .collect();
    let per_replica = Leaf::PerReplica(
        PerReplica::new(
            std::sync::Arc::clone(strategy.extended().device_map()),
            parts,
        )
        .unwrap(),
    );
    let rows_mean = strategy
        .reduce(ReduceOp::Mean, &per_replica, Some(0))
        .unwrap();
    lines.push(format!(
        "rows_mean_along={:.6}",
        f64::from(rows_mean.to_vec::<f32>().unwrap()[0])
    ));
    // The sum of one plain value over several replicas is undefined (TF refuses it).
    let refused = strategy.reduce(ReduceOp::Sum, &plain, None).is_err();
    lines.push(format!("plain_sum_refused={refused}"));
}

/// Cross-replica `broadcast_to`: every worker passes its own value, every replica of every
/// worker gets the chief's.
fn broadcast(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let w = strategy.worker();
    let cross = strategy.cross_replica();
    let mine = Tensor::from_vec("/cpu:0", &[2, 2], vec![w as f64 + 0.5, 1.0, 2.0, -3.0]).unwrap();
    let copies = cross
        .broadcast_to(&mine, &cross.all_devices().unwrap())
        .expect("a broadcast");
    let copies: Vec<Tensor> = match copies {
        Leaf::Mirrored(m) => m.values().to_vec(),
        Leaf::PerReplica(p) => p.values().to_vec(),
        Leaf::Same(t) => vec![t; strategy.local_replicas()],
    };
    assert_eq!(copies.len(), strategy.local_replicas());
    for (r, copy) in copies.iter().enumerate() {
        assert_eq!(
            copy.device(),
            strategy.extended().device_map().primary_device(r).unwrap()
        );
        let chief = copy.to_vec::<f64>().unwrap() == [0.5, 1.0, 2.0, -3.0];
        lines.push(format!(
            "broadcast_to={}",
            if chief { "chief" } else { "other" }
        ));
    }
    let shape: &[usize] = if w == 1 { &[4] } else { &[2, 2] };
    let odd = Tensor::from_vec("/cpu:0", shape, vec![1.0f64; 4]).unwrap();
    let result = cross.broadcast_to(&odd, &cross.all_devices().unwrap());
    record(lines, "broadcast_mismatch", result);
}

/// `Strategy::gather` across workers: rows differ per replica, joined in global replica order.
fn gather(strategy: &MultiWorkerMirroredStrategy, lines: &mut Vec<String>) {
    let n = strategy.num_replicas_in_sync();
    let host = strategy.extended().host_device().to_owned();
    let rows = |g: usize| g % 3 + 1;
    let per_replica = |make: &dyn Fn(usize, &str) -> Tensor| {
        let parts: Vec<Tensor> = (0..strategy.local_replicas())
            .map(|r| make(strategy.global_replica_id(r), &format!("/cpu:{r}")))
            .collect();
        Leaf::PerReplica(
            PerReplica::new(
                std::sync::Arc::clone(strategy.extended().device_map()),
                parts,
            )
            .unwrap(),
        )
    };
    let verdict = |got: &Tensor, shape: &[usize], want: Vec<i32>| {
        let ok =
            got.shape() == shape && got.device() == host && got.to_vec::<i32>().unwrap() == want;
        if ok { "expected" } else { "wrong" }
    };
    // Replica g: g % 3 + 1 rows of 2, values g·100 + i.
    let by_rows = per_replica(&|g, device| {
        Tensor::from_vec(
            device,
            &[rows(g), 2],
            (0..rows(g) * 2).map(|i| (g * 100 + i) as i32).collect(),
        )
        .unwrap()
    });
    let got = strategy.gather(&by_rows, 0).expect("a gather along rows");
    let want: Vec<i32> = (0..n)
        .flat_map(|g| (0..rows(g) * 2).map(move |i| (g * 100 + i) as i32))
        .collect();
    let total: usize = (0..n).map(rows).sum();
    lines.push(format!("gather_rows={}", verdict(&got, &[total, 2], want)));
    // Replica g: 2 rows of g % 3 + 1 columns, joined along the columns.
    let by_columns = per_replica(&|g, device| {
        Tensor::from_vec(
            device,
            &[2, rows(g)],
            (0..2 * rows(g)).map(|i| (g * 100 + i) as i32).collect(),
        )
        .unwrap()
    });
    let got = strategy
        .gather(&by_columns, 1)
        .expect("a gather along columns");
    let want: Vec<i32> = (0..2)
        .flat_map(|row| {
            (0..n)
                .flat_map(move |g| (0..rows(g)).map(move |c| (g * 100 + row * rows(g) + c) as i32))
        })
        .collect();
    lines.push(format!(
        "gather_columns={}",
        verdict(&got, &[2, total], want)
    ));
    // A plain value counts once per replica of every worker.
    let plain = Leaf::Same(Tensor::from_vec("/cpu:0", &[1, 2], vec![7i32, 8]).unwrap());
    let got = strategy
        .gather(&plain, 0)
        .expect("a gather of a plain value");
    let want: Vec<i32> = (0..n).flat_map(|_| [7, 8]).collect();
    lines.push(format!("gather_plain={}", verdict(&got, &[n, 2], want)));
    // A worker with another column count is an error on every worker.
    let columns = if strategy.worker() == 1 { 3 } else { 2 };
    let odd = Leaf::Same(Tensor::from_vec("/cpu:0", &[1, columns], vec![0i32; columns]).unwrap());
    record(lines, "gather_mismatch", strategy.gather(&odd, 0));
}
