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
    /// The results the workers wrote, ordered by rank.
    pub results: Vec<String>,
}

/// In a worker started by [`run_self`], leaves `result` for the launching test, named after this
/// process's MPI rank. Panics outside such a worker.
pub fn write_result(result: &str) {
    let dir = std::env::var_os(RESULT_DIR_VAR)
        .unwrap_or_else(|| panic!("{RESULT_DIR_VAR} is not set: not a worker of run_self"));
    let rank: usize = ["OMPI_COMM_WORLD_RANK", "PMI_RANK"]
        .iter()
        .find_map(|var| std::env::var(var).ok()?.parse().ok())
        .expect("mpirun sets the process's rank");
    let dir = std::path::Path::new(&dir);
    // Written then renamed, so the launcher never reads half a result.
    let partial = dir.join(format!("{rank:06}.partial"));
    std::fs::write(&partial, result).expect("the result directory is writable");
    std::fs::rename(&partial, dir.join(format!("{rank:06}.result")))
        .expect("the result directory is writable");
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
        .spawn()
        .expect("mpirun (Open MPI) must be installed to test the mpi feature");
    let mut stdout = child.stdout.take().expect("stdout is piped");
    // Read while waiting, so a chatty job cannot fill the pipe and stall.
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).map(|_| out)
    });
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
