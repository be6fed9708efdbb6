//! Multi-process tests: a test binary starts itself under `mpirun`, one process per worker,
//! each running one of its own ignored tests, and reads what the workers printed.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Runs this test binary's ignored test `worker_test` as `workers` processes under
/// `mpirun --oversubscribe` (allowed as root), with the variables `env` set, and returns its exit
/// status and standard output. Kills the job and panics past `limit`, so no test can hang CI.
///
/// Panics when `mpirun` cannot be started: the tests that call this need Open MPI, as the `mpi`
/// feature itself does.
pub fn run_self(
    worker_test: &str,
    workers: usize,
    env: &[(&str, String)],
    limit: Duration,
) -> (ExitStatus, String) {
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
    (status, out)
}
