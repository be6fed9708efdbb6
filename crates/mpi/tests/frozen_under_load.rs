//! Every worker that waited for a frozen worker says so before the job ends, on a loaded
//! machine too: 3 workers under `mpirun` while this process keeps every core busy, worker 2
//! stopped (`SIGSTOP`) before its first all-reduce and worker 1 reaching that all-reduce 1.5 s
//! after worker 0, so worker 0's wait runs out well before worker 1's. Worker 0 must not end the
//! job before worker 1 has named worker 2 (a fixed grace before `MPI_Abort` lost worker 1's
//! message so).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use distribute_collectives::{CrossDeviceOps, GroupConfig};
use distribute_mpi::MpiAllReduce;
use distribute_tensor::Tensor;
use distribute_values::ReduceOp;

const ROLE: &str = "DISTRIBUTE_MPI_FROZEN_UNDER_LOAD";
const DEADLINE: Duration = Duration::from_secs(3);
/// How much later than worker 0 worker 1 starts waiting.
const LATE: Duration = Duration::from_millis(1500);

/// Threads that spin until dropped: the artificial load.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(threads: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[test]
fn every_waiting_worker_names_the_frozen_one_on_a_loaded_machine() {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let load = Load::start(2 * cores);
    let exe = std::env::current_exe().expect("the test binary");
    let output = Command::new("timeout")
        .args(["-k", "10", "120", "mpirun", "--oversubscribe", "-n", "3"])
        .args(["--mca", "btl_tcp_if_include", "lo"])
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .arg(&exe)
        .args(["worker_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env(ROLE, "1")
        .env_remove("TF_CONFIG")
        .output()
        .expect("mpirun and timeout must be installed (Open MPI)");
    drop(load);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_ne!(output.status.code(), Some(124), "the job hung: {stderr}");
    assert!(!output.status.success(), "the job must fail: {stderr}");
    let mut named: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains(": waited ") && line.contains("aborting the MPI job"))
        .collect();
    named.sort();
    assert_eq!(named.len(), 2, "both waiting workers must speak:\n{stderr}");
    for (line, worker) in named.iter().zip([0, 1]) {
        assert!(
            line.starts_with(&format!(
                "distribute: worker {worker} of 3: waited {DEADLINE:?} for worker 2 in the \
                 agreement on all_reduce"
            )),
            "{line}\n(whole stderr: {stderr})"
        );
    }
}

/// The program of every process of the launch; does nothing outside one.
#[test]
fn worker_entry() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let backend = MpiAllReduce::new(
        &["/cpu:0"],
        GroupConfig {
            deadline: DEADLINE,
            ..GroupConfig::default()
        },
    )
    .expect("the backend");
    let replica = backend.replica_collectives(0).expect("replica 0");
    match backend.worker() {
        // SAFETY: raise() with a valid signal; the process stops until mpirun kills it.
        2 => unsafe {
            libc::raise(libc::SIGSTOP);
        },
        1 => std::thread::sleep(LATE),
        _ => {}
    }
    let t = Tensor::from_vec("/cpu:0", &[4], vec![1.0f32; 4]).unwrap();
    let _ = replica.all_reduce(ReduceOp::Sum, &t);
    panic!(
        "worker {}: the all-reduce with a frozen worker returned",
        backend.worker()
    );
}
