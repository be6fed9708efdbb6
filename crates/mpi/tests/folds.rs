//! `MpiAllReduce`'s cross-worker folds with real processes: the test launches this binary under
//! `mpirun -n W` (W = 2, 3, 4; bounded by `timeout`), where `worker_entry` all-reduces tensors of
//! every size class (inline in the agreement, all-gathered, reduce-scattered with parts of
//! unequal length) and checks each result's bits against the fold in worker order it computes
//! itself: every worker then holds the same bits, whatever path a size takes.
//!
//! Also checked: a result the caller still holds is never written by a later reduction of the
//! same shape (the backend reuses only buffers no one holds), with more held results than the
//! backend keeps.

use std::process::Command;
use std::time::Duration;

use distribute_collectives::{CrossDeviceOps, GroupConfig};
use distribute_mpi::{INLINE_BYTES, MpiAllReduce, SCATTER_MIN_BYTES};
use distribute_tensor::Tensor;
use distribute_values::ReduceOp;
use half::f16;

const ROLE: &str = "DISTRIBUTE_MPI_FOLDS_WORKER";

#[test]
fn every_worker_gets_the_worker_order_fold_on_every_path() {
    for workers in [2, 3, 4] {
        let exe = std::env::current_exe().expect("the test binary");
        let output = Command::new("timeout")
            .args(["-k", "10", "180", "mpirun", "--oversubscribe", "-n"])
            .arg(workers.to_string())
            .args(["--mca", "btl_tcp_if_include", "lo"])
            // Open MPI 4's out-of-band channel on lo too; as an environment variable, because
            // Open MPI 5 (PRRTE) never uses a loopback interface for it and refuses `--mca
            // oob_tcp_if_include lo`, while it ignores this variable.
            .env("OMPI_MCA_oob_tcp_if_include", "lo")
            .arg(&exe)
            .args(["worker_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env(ROLE, "1")
            .env_remove("TF_CONFIG")
            .output()
            .expect("mpirun and timeout must be installed (Open MPI)");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{workers} workers: {}\n{stdout}\n{stderr}",
            output.status
        );
        for w in 0..workers {
            assert!(
                stdout.contains(&format!("worker {w} of {workers}: all folds checked")),
                "{workers} workers: worker {w} did not finish:\n{stdout}\n{stderr}"
            );
        }
    }
}

/// Element `i` of worker `w`'s tensor: magnitudes from 1e-3 to 1e3, both signs, so another fold
/// order would change the bits.
fn mixed(w: usize, i: usize) -> f64 {
    let mantissa = ((w * 7919 + i * 104_729) % 1000) as f64 + 0.123;
    let sign = if (w + i).is_multiple_of(3) { -1.0 } else { 1.0 };
    sign * mantissa * 10f64.powi(((w + i) % 7) as i32 - 3)
}

/// The program of every process of a launch; does nothing outside one.
#[test]
fn worker_entry() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let backend = MpiAllReduce::new(
        &["/cpu:0"],
        GroupConfig {
            deadline: Duration::from_secs(60),
            ..GroupConfig::default()
        },
    )
    .expect("the backend");
    let (me, w) = (backend.worker(), backend.num_workers());
    let replica = backend.replica_collectives(0).expect("replica 0");
    // Element counts of each path: inline, all-gathered, reduce-scattered (odd, so the parts
    // differ in length for 2, 3 and 4 workers), and reduce-scattered into reused buffers.
    let f32_lens = [
        37,
        INLINE_BYTES / 4 + 3,
        SCATTER_MIN_BYTES / 4 + 1,
        3 * SCATTER_MIN_BYTES / 4 + 7,
        (300 << 10) / 4 + 1,
    ];
    for len in f32_lens {
        let input =
            |salt: usize| -> Vec<f32> { (0..len).map(|i| mixed(me + salt, i) as f32).collect() };
        let fold = |salt: usize, op: ReduceOp| -> Vec<f32> {
            (0..len)
                .map(|i| {
                    let x = |p: usize| mixed(p + salt, i) as f32;
                    let acc = (1..w).fold(x(0), |acc, p| match op {
                        ReduceOp::Max => acc.max(x(p)),
                        ReduceOp::Min => acc.min(x(p)),
                        _ => acc + x(p),
                    });
                    match op {
                        ReduceOp::Mean => acc / w as f32,
                        _ => acc,
                    }
                })
                .collect()
        };
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let t = Tensor::from_vec("/cpu:0", &[len], input(0)).unwrap();
            let got = replica.all_reduce(op, &t).expect("all_reduce");
            assert_bits(
                &got.to_vec::<f32>().unwrap(),
                &fold(0, op),
                &format!("{op} of {len}"),
            );
        }
        // Results held across later reductions of the same shape keep their values, and the
        // buffers they leave behind serve later results correctly.
        let held: Vec<Tensor> = (0..6)
            .map(|salt| {
                let t = Tensor::from_vec("/cpu:0", &[len], input(salt)).unwrap();
                replica.all_reduce(ReduceOp::Sum, &t).expect("all_reduce")
            })
            .collect();
        for (salt, t) in held.iter().enumerate() {
            let what = format!("held sum {salt} of {len}");
            assert_bits(
                &t.to_vec::<f32>().unwrap(),
                &fold(salt, ReduceOp::Sum),
                &what,
            );
        }
        drop(held);
        for salt in [7, 8] {
            let t = Tensor::from_vec("/cpu:0", &[len], input(salt)).unwrap();
            let got = replica.all_reduce(ReduceOp::Sum, &t).expect("all_reduce");
            let what = format!("sum {salt} of {len} after the held ones");
            assert_bits(
                &got.to_vec::<f32>().unwrap(),
                &fold(salt, ReduceOp::Sum),
                &what,
            );
        }
    }
    // f64 across workers only (the strategy's worker-level reduction), Mean dividing by W.
    let len = SCATTER_MIN_BYTES / 8 * 5 + 3;
    let t = Tensor::from_vec("/cpu:0", &[len], (0..len).map(|i| mixed(me, i)).collect()).unwrap();
    let got = backend
        .all_reduce_across_workers(ReduceOp::Mean, &t)
        .expect("all_reduce_across_workers");
    let expected: Vec<f64> = (0..len)
        .map(|i| (1..w).fold(mixed(0, i), |acc, p| acc + mixed(p, i)) / w as f64)
        .collect();
    assert_bits(&got.to_vec::<f64>().unwrap(), &expected, "f64 mean");
    // f16 sums in f32 and rounds once, on every path.
    for len in [INLINE_BYTES / 2 + 1, SCATTER_MIN_BYTES / 2 + 5] {
        let half_of = |p: usize, i: usize| f16::from_f64(mixed(p, i));
        let t =
            Tensor::from_vec("/cpu:0", &[len], (0..len).map(|i| half_of(me, i)).collect()).unwrap();
        let got = replica
            .all_reduce(ReduceOp::Sum, &t)
            .expect("f16 all_reduce");
        let expected: Vec<f16> = (0..len)
            .map(|i| {
                let acc = (1..w).fold(half_of(0, i).to_f32(), |acc, p| {
                    acc + half_of(p, i).to_f32()
                });
                f16::from_f32(acc)
            })
            .collect();
        assert_bits(
            &got.to_vec::<f16>().unwrap(),
            &expected,
            &format!("f16 sum of {len}"),
        );
    }
    println!("worker {me} of {w}: all folds checked");
}

/// Fails unless `got` and `expected` have the same bits (`PartialEq` on the bit patterns).
fn assert_bits<T: Copy + std::fmt::Debug + Bits>(got: &[T], expected: &[T], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].bits() != expected[i].bits()) {
        panic!(
            "{what}: element {i} is {:?}, the fold in worker order gives {:?}",
            got[i], expected[i]
        );
    }
}

trait Bits {
    fn bits(self) -> u64;
}

impl Bits for f32 {
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}

impl Bits for f64 {
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

impl Bits for f16 {
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}
