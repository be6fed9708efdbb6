//! A worker that stops without dying (`SIGSTOP`: stopped by a signal, stuck in I/O, swapping)
//! must not hang a multi-worker job: every other worker gives up at the strategy's deadline,
//! names the worker it waited for and what it waited in, and the job ends non-zero with nothing
//! left running. Real processes under `mpirun`, as in `multi_worker.rs`:
//! - frozen in its step function, before the step's all-reduce (the others wait in the
//!   agreement that starts it);
//! - frozen between an agreement and the data collective it agreed on (through the backend's
//!   fault injection, `MpiWorld::STOP_AFTER_AGREEMENT`), so the others wait in the data.
//!
//! The launcher measures the time from the freeze to `mpirun`'s exit and prints it (run with
//! `--nocapture`); it asserts no time, only that the job ended by itself.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distribute_mpi::MpiWorld;
use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
use distribute_strategy::Strategy;
use distribute_tensor::Tensor;
use distribute_values::ReduceOp;

const SCENARIO: &str = "DISTRIBUTE_FROZEN_SCENARIO";
const FROZEN: &str = "DISTRIBUTE_FROZEN_WORKER";
const OUT: &str = "DISTRIBUTE_FROZEN_OUT";
/// The entry point's name, also how the launcher finds leftover processes.
const ENTRY: &str = "frozen_worker_entry";

/// The deadline of these jobs.
const DEADLINE: Duration = Duration::from_secs(3);
/// Training steps; the freeze comes at [`FREEZE_STEP`].
const STEPS: usize = 60;
const FREEZE_STEP: usize = 20;
/// Elements of the step's gradient: 256 KiB of f32, past the size that rides in an agreement
/// and past the one that is gathered whole, so its data moves in a reduce-scatter after the
/// agreement.
const GRADIENT: usize = 64 * 1024;
/// The agreement after which the frozen worker stops in the second scenario: in the middle of
/// training, the agreement on step [`FREEZE_STEP`]'s large all-reduce (two agreements set the
/// strategy up, then each step makes three: the large all-reduce, the small one, the end of the
/// step; the messages checked below prove the others waited in the data).
const STOP_AFTER: usize = 2 + 3 * FREEZE_STEP + 1;

/// One launch at a time: the machine has few cores and every launch oversubscribes them.
static LAUNCH: Mutex<()> = Mutex::new(());

/// What a launch left.
struct Job {
    code: Option<i32>,
    stderr: String,
    /// Seconds from the frozen worker's freeze to `mpirun`'s exit, when the worker said when
    /// it froze.
    freeze_to_exit: Option<f64>,
    /// Processes of this job still running after `mpirun` exited (killed by the launcher).
    leftovers: Vec<String>,
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn launch(workers: usize, frozen: usize, scenario: &str) -> Job {
    let _one = LAUNCH.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("a temporary directory");
    let exe = std::env::current_exe().expect("the test binary");
    let mut command = Command::new("timeout");
    command
        .args(["-k", "10", "120", "mpirun", "--oversubscribe", "-n"])
        .arg(workers.to_string())
        .args(["--mca", "btl_tcp_if_include", "lo"])
        // Open MPI 4's out-of-band channel on lo too; as an environment variable, because Open
        // MPI 5 (PRRTE) never uses a loopback interface for it and refuses `--mca
        // oob_tcp_if_include lo`, while it ignores this variable.
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .arg(&exe)
        .args([ENTRY, "--exact", "--nocapture", "--test-threads=1"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env(SCENARIO, scenario)
        .env(FROZEN, frozen.to_string())
        .env(OUT, dir.path())
        .env_remove("TF_CONFIG");
    if scenario == "after_agreement" {
        command.env(
            MpiWorld::STOP_AFTER_AGREEMENT,
            format!("{frozen}:{STOP_AFTER}"),
        );
    }
    let output = command
        .output()
        .expect("mpirun and timeout must be installed (Open MPI)");
    let exited = now_secs();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_ne!(
        output.status.code(),
        Some(124),
        "{scenario} on {workers} workers hung until the launcher's limit: {stderr}"
    );
    let freeze_to_exit = std::fs::read_to_string(dir.path().join("frozen_at"))
        .ok()
        .and_then(|t| t.trim().parse::<f64>().ok())
        .map(|at| exited - at);
    Job {
        code: output.status.code(),
        stderr,
        freeze_to_exit,
        leftovers: kill_leftovers(&exe),
    }
}

/// The processes running this test binary as a worker (its entry point on the command line),
/// killed: a job must leave none.
fn kill_leftovers(exe: &Path) -> Vec<String> {
    let exe = exe.to_string_lossy();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if pid != std::process::id() && cmdline.contains(&*exe) && cmdline.contains(ENTRY) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            found.push(format!("{pid}: {cmdline}"));
        }
    }
    found
}

/// Every worker but `frozen` gave up naming it and `waited_in`; the job ended non-zero with
/// nothing left running.
fn ended_naming(job: &Job, workers: usize, frozen: usize, waited_in: &str) {
    assert_ne!(job.code, Some(0), "the job must fail: {}", job.stderr);
    assert!(
        job.leftovers.is_empty(),
        "left running: {:?}",
        job.leftovers
    );
    // One worker's abort may end the others before their grace ends; at least one names the
    // frozen worker, and none names another.
    let named: Vec<&str> = job
        .stderr
        .lines()
        .filter(|line| line.contains(": waited ") && line.contains("aborting the MPI job"))
        .collect();
    assert!(!named.is_empty(), "no worker said why: {}", job.stderr);
    for line in &named {
        assert!(
            line.contains(&format!("for worker {frozen} in {waited_in}")),
            "{line}\n(whole stderr: {})",
            job.stderr
        );
        assert!(
            !line.contains(&format!("worker {frozen} of {workers}")),
            "the frozen worker cannot speak: {line}"
        );
    }
    // With three workers, the two that waited both say so (the grace lets the second print).
    if workers == 3 {
        assert_eq!(named.len(), 2, "{}", job.stderr);
    }
    println!(
        "{workers} workers, worker {frozen} frozen ({waited_in}…): freeze to exit {} \
         (deadline {DEADLINE:?}, grace {:?})",
        job.freeze_to_exit
            .map_or("not measured".to_owned(), |s| format!("{s:.2} s")),
        MpiWorld::ABORT_GRACE
    );
}

#[test]
fn a_worker_frozen_in_its_step_ends_the_job_naming_it() {
    for (workers, frozen) in [(2, 1), (3, 2)] {
        let job = launch(workers, frozen, "in_step");
        ended_naming(&job, workers, frozen, "the agreement on all_reduce");
        assert!(job.freeze_to_exit.is_some(), "{}", job.stderr);
    }
}

#[test]
fn a_worker_frozen_between_the_agreement_and_the_data_ends_the_job_naming_it() {
    for (workers, frozen) in [(2, 0), (3, 1)] {
        let job = launch(workers, frozen, "after_agreement");
        ended_naming(&job, workers, frozen, "the reduce-scatter");
    }
}

// ----- What each MPI process runs. -----

/// The program of every process of a launch; does nothing outside one.
#[test]
fn frozen_worker_entry() {
    let Ok(scenario) = std::env::var(SCENARIO) else {
        return;
    };
    let frozen: usize = std::env::var(FROZEN)
        .expect("the launcher names the frozen worker")
        .parse()
        .expect("a worker index");
    let out = std::env::var(OUT).expect("the launcher sets the output folder");
    let config = MultiWorkerConfig {
        deadline: DEADLINE,
        ..MultiWorkerConfig::default()
    };
    let strategy = MultiWorkerMirroredStrategy::with_config(config).expect("the strategy");
    let me = strategy.worker();
    for step in 0..STEPS {
        let freeze = scenario == "in_step" && me == frozen && step == FREEZE_STEP;
        let out = Path::new(&out);
        strategy
            .run(
                |ctx, ()| {
                    if freeze {
                        std::fs::write(out.join("frozen_at"), now_secs().to_string())
                            .expect("the output folder is writable");
                        // As `kill -STOP` from outside would, but at once: a `kill` child process
                        // was seen to stop this one only after it had made its next call.
                        // SAFETY: `raise` only sends a signal to the calling thread.
                        unsafe {
                            libc::raise(libc::SIGSTOP);
                        }
                    }
                    let gradient: Vec<f32> = (0..GRADIENT).map(|i| (i % 7) as f32).collect();
                    let gradient = Tensor::from_vec(ctx.device(), &[GRADIENT], gradient)?;
                    let _sum = ctx.all_reduce(ReduceOp::Sum, &gradient)?;
                    // A small reduction rides in its agreement (the step's second).
                    ctx.all_reduce(ReduceOp::Sum, &Tensor::scalar(ctx.device(), 1.0f32))
                },
                &(),
            )
            .expect("a healthy step");
    }
    // Reached only when no freeze came: the launcher then finds no worker that gave up.
    eprintln!("worker {me} finished {STEPS} steps");
}
