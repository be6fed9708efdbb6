//! Multi-process tests: a test binary starts itself under `mpirun`, one process per worker,
//! each running one of its own ignored tests, and reads what the workers printed.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The variable [`run_self`] sets to a fresh directory in which [`write_result`] leaves each
/// worker's result.
///
/// Results travel through files, not standard output: `mpirun` forwards the processes' output
/// in chunks, so a long line of one worker can come out with another worker's output spliced
/// into it (a JSON line of the chief's broke so in CI).
pub const RESULT_DIR_VAR: &str = "DISTRIBUTE_TEST_RESULT_DIR";

/// What a [`run_self`] job left: its exit status, its standard output, and the workers'
/// results ([`write_result`]) in the order of their MPI ranks.
pub struct Job {
    /// `mpirun`'s exit status.
    pub status: ExitStatus,
    /// Every worker's standard output, as `mpirun` forwarded it (for messages only).
    pub stdout: String,
    /// Every worker's (and `mpirun`'s) standard error, as forwarded: where a worker that gives
    /// up on a frozen one says so before the job is aborted. Also echoed to this process's
    /// standard error, so a failing test shows it.
    pub stderr: String,
    /// The results the workers wrote, ordered by rank.
    pub results: Vec<String>,
}

/// In a worker started by [`run_self`], leaves `result` for the launching test, named after this
/// process's MPI rank. Panics outside such a worker.
pub fn write_result(result: &str) {
    let dir = std::env::var_os(RESULT_DIR_VAR)
        .unwrap_or_else(|| panic!("{RESULT_DIR_VAR} is not set: not a worker of run_self"));
    let rank = rank();
    let dir = std::path::Path::new(&dir);
    // Written then renamed, so the launcher never reads half a result.
    let partial = dir.join(format!("{rank:06}.partial"));
    std::fs::write(&partial, result).expect("the result directory is writable");
    std::fs::rename(&partial, dir.join(format!("{rank:06}.result")))
        .expect("the result directory is writable");
}

/// This process's MPI rank, as `mpirun` set it. Panics outside a process `mpirun` started.
pub fn rank() -> usize {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK"]
        .iter()
        .find_map(|var| std::env::var(var).ok()?.parse().ok())
        .expect("mpirun sets the process's rank")
}

impl Job {
    /// The one result of a job that succeeded, the chief's: panics, showing the job's output,
    /// when `mpirun` failed or the workers did not leave exactly one result.
    pub fn chief_result(&self) -> &str {
        assert!(
            self.status.success(),
            "mpirun exited with {}; stdout:\n{}",
            self.status,
            self.stdout
        );
        let [result] = &self.results[..] else {
            panic!(
                "the chief alone writes a result, got {}; stdout:\n{}",
                self.results.len(),
                self.stdout
            );
        };
        result
    }
}

/// The variable [`kill_and_resume`] sets to the checkpoint directory of its jobs' workers
/// (unset: no checkpoints).
pub const CHECKPOINT_DIR_VAR: &str = "DISTRIBUTE_TEST_CHECKPOINT_DIR";

/// The variable [`kill_and_resume`] sets to the step after which worker 1 of its first job
/// kills itself ([`kill_at_step_from_env`]; unset: no worker does).
pub const DIE_AT_VAR: &str = "DISTRIBUTE_TEST_DIE_AT";

/// In a worker of [`kill_and_resume`]'s jobs: the `after_step` hook that kills this process
/// with SIGKILL after the step [`DIE_AT_VAR`] names if this is worker `victim` (the signal a
/// machine's OOM killer or a lost node's scheduler sends: no cleanup). Does nothing when the
/// variable is unset or this is another worker.
pub fn kill_at_step_from_env(victim: usize) -> impl Fn(usize) + Sync {
    let die_at: Option<usize> = std::env::var(DIE_AT_VAR)
        .ok()
        .map(|s| s.parse().expect("a step number"));
    let this = rank();
    move |step: usize| {
        if this == victim && die_at == Some(step) {
            let _ = Command::new("kill")
                .args(["-KILL", &std::process::id().to_string()])
                .status();
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// Tests that a training job resumes where a killed worker stopped it. `run` starts the job
/// (typically [`run_self`]) with extra variables; its workers checkpoint every `every` steps of
/// `steps` into [`CHECKPOINT_DIR_VAR`] if set, worker 1 dies as [`kill_at_step_from_env`]
/// says, and the chief leaves a result, which `parse` reads and `resumed_from` asks for the
/// step it resumed from.
///
/// Runs the job with checkpoints in a fresh directory and worker 1 killed at a random step
/// after the first checkpoint and before the last step, asserting that it fails with no result;
/// starts it again with the same directory, asserting that it resumed from the chief's last
/// checkpoint at or before that step; then runs it with no checkpoints, asserting that it did
/// not resume. Returns the chief's results of the resumed and the uninterrupted jobs, for the
/// caller to compare.
pub fn kill_and_resume<T>(
    run: impl Fn(&[(&str, String)]) -> Job,
    (every, steps): (u64, usize),
    parse: impl Fn(&str) -> T,
    resumed_from: impl Fn(&T) -> Option<u64>,
) -> (T, T) {
    let die_at = every as usize + 1 + random() % (steps - every as usize - 1);
    eprintln!("worker 1 dies after step {die_at}");
    let dir = fresh_dir();
    let with_dir = (CHECKPOINT_DIR_VAR, dir.to_string_lossy().into_owned());

    let killed = run(&[with_dir.clone(), (DIE_AT_VAR, die_at.to_string())]);
    assert!(
        !killed.status.success() && killed.results.is_empty(),
        "the job with a killed worker must fail without a result: {}; stdout:\n{}",
        killed.status,
        killed.stdout
    );

    let job = run(std::slice::from_ref(&with_dir));
    let resumed = parse(job.chief_result());
    let from = resumed_from(&resumed)
        .unwrap_or_else(|| panic!("the second job did not resume: {}", job.chief_result()));
    // The chief's last checkpoint: at or before the step worker 1 died after (the chief may
    // have been killed before writing that step's own).
    let die_at = die_at as u64;
    assert!(
        from > 0 && from.is_multiple_of(every) && from <= die_at && die_at - from <= every,
        "resumed from step {from}, worker 1 died after step {die_at}"
    );

    let job = run(&[]);
    let uninterrupted = parse(job.chief_result());
    assert!(
        resumed_from(&uninterrupted).is_none(),
        "the job with no checkpoints resumed: {}",
        job.chief_result()
    );
    std::fs::remove_dir_all(&dir).expect("the checkpoint directory is removable");
    (resumed, uninterrupted)
}

/// A number drawn anew on each test run.
fn random() -> usize {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::process::id()) as usize
}

/// Runs this test binary's ignored test `worker_test` as `workers` processes under
/// `mpirun --oversubscribe` (allowed as root), with the variables `env` set, and returns what
/// the job left. Kills the job and panics past `limit`, so no test can hang CI.
///
/// Panics when `mpirun` cannot be started: the tests that call this need Open MPI, as the `mpi`
/// feature itself does.
pub fn run_self(worker_test: &str, workers: usize, env: &[(&str, String)], limit: Duration) -> Job {
    let results_dir = fresh_dir();
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new("mpirun")
        .args(["-n", &workers.to_string(), "--oversubscribe"])
        .arg(&exe)
        .args([
            "--exact",
            worker_test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env(RESULT_DIR_VAR, &results_dir)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun (Open MPI) must be installed to test the mpi feature");
    // Read while waiting, so a chatty job cannot fill a pipe and stall.
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut out = String::new();
            pipe.read_to_string(&mut out).map(|_| out)
        })
    };
    let reader = read(Box::new(child.stdout.take().expect("stdout is piped")));
    let err_reader = read(Box::new(child.stderr.take().expect("stderr is piped")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("mpirun's status") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mpirun -n {workers} ({worker_test}) ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = reader
        .join()
        .expect("the reader thread")
        .expect("mpirun's output is text");
    let err = err_reader
        .join()
        .expect("the reader thread")
        .expect("mpirun's errors are text");
    eprint!("{err}");
    let mut names: Vec<_> = std::fs::read_dir(&results_dir)
        .expect("the result directory exists")
        .map(|entry| entry.expect("a readable result directory").path())
        .filter(|path| path.extension().is_some_and(|e| e == "result"))
        .collect();
    names.sort();
    let results = names
        .iter()
        .map(|path| std::fs::read_to_string(path).expect("a worker's result is text"))
        .collect();
    let _ = std::fs::remove_dir_all(&results_dir);
    Job {
        status,
        stdout: out,
        stderr: err,
        results,
    }
}

/// A new empty directory under the system's temporary directory, unique to this call.
fn fresh_dir() -> std::path::PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "distribute-mpirun-{}-{call}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("a temporary directory for the workers' results");
    dir
}
