//! A benchmark rig: N persistent replica threads doing all-reduces on command, timed from
//! replica 0, shared by the JSON table bench and the criterion bench.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use distribute_collectives::{CrossDeviceOps, ReplicaCollectives};
use distribute_tensor::Tensor;
use distribute_values::ReduceOp;

/// Replica r's input: `bytes / 4` float32 elements, touched so the pages exist.
pub(crate) fn input(replica: usize, bytes: usize) -> Tensor {
    let len = bytes / 4;
    let data: Vec<f32> = (0..len)
        .map(|i| (i % 251) as f32 * 0.5 + replica as f32)
        .collect();
    Tensor::from_vec(&format!("/cpu:{replica}"), &[len], data).expect("shape matches")
}

/// Replicas 1..N live on their own threads and run `iters` all-reduces whenever told to.
pub(crate) struct Rig {
    commands: Vec<Sender<usize>>,
    done: Receiver<()>,
    member0: Box<dyn ReplicaCollectives>,
    input0: Tensor,
    threads: Vec<JoinHandle<()>>,
}

impl Rig {
    /// Starts replicas 1..N, each with its handle and input.
    pub(crate) fn new(ops: Arc<dyn CrossDeviceOps>, replicas: usize, bytes: usize) -> Rig {
        let (done_tx, done) = channel();
        let mut commands = Vec::new();
        let mut threads = Vec::new();
        for r in 1..replicas {
            let (tx, rx) = channel::<usize>();
            commands.push(tx);
            let (ops, done_tx) = (ops.clone(), done_tx.clone());
            threads.push(std::thread::spawn(move || {
                let member = ops.replica_collectives(r).expect("replica id in range");
                let input = input(r, bytes);
                for iters in rx {
                    for _ in 0..iters {
                        drop(
                            member
                                .all_reduce(ReduceOp::Sum, &input)
                                .expect("all-reduce"),
                        );
                    }
                    done_tx.send(()).expect("rig alive");
                }
            }));
        }
        Rig {
            commands,
            done,
            member0: ops.replica_collectives(0).expect("replica 0"),
            input0: input(0, bytes),
            threads,
        }
    }

    /// Runs `iters` all-reduces on every replica; returns replica 0's elapsed time.
    pub(crate) fn run(&self, iters: usize) -> Duration {
        for tx in &self.commands {
            tx.send(iters).expect("replica thread alive");
        }
        let start = Instant::now();
        for _ in 0..iters {
            drop(
                self.member0
                    .all_reduce(ReduceOp::Sum, &self.input0)
                    .expect("all-reduce"),
            );
        }
        let elapsed = start.elapsed();
        for _ in &self.commands {
            self.done.recv().expect("replica thread alive");
        }
        elapsed
    }

    /// One all-reduce's result on replica 0, for checking.
    pub(crate) fn result(&self) -> Tensor {
        for tx in &self.commands {
            tx.send(1).expect("replica thread alive");
        }
        let out = self
            .member0
            .all_reduce(ReduceOp::Sum, &self.input0)
            .expect("all-reduce");
        for _ in &self.commands {
            self.done.recv().expect("replica thread alive");
        }
        out
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.commands.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
