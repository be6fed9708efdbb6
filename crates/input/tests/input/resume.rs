//! `DistributedDataset::resume_from`: a resumed iteration gives the global batches an
//! uninterrupted run gives from that position on, on the same and on other replica and
//! worker counts, reshuffled epochs included.

use distribute_input::{
    Dataset, DistributedDataset, InputError, InputOptions, InputPosition, InputWorkers,
};

/// 10 global batches of 4 rows, reshuffled every epoch.
fn dataset() -> Dataset<distribute_tensor::Tensor> {
    Dataset::range(40)
        .shuffle(7, true)
        .unwrap()
        .batch(4, false)
        .unwrap()
}

/// Each step's global batch (the replicas' rows joined, in replica order) of the next
/// iteration of `dist`.
fn global_batches(
    dist: &DistributedDataset<distribute_tensor::Tensor>,
) -> Result<Vec<Vec<i64>>, InputError> {
    dist.iter_per_replica()
        .map(|step| {
            let mut rows = Vec::new();
            for batch in step? {
                rows.extend(batch.to_vec::<i64>()?);
            }
            Ok(rows)
        })
        .collect()
}

fn local(replicas: usize) -> InputWorkers {
    InputWorkers::local((0..replicas).map(|r| format!("/cpu:{r}"))).unwrap()
}

#[test]
fn a_resumed_iteration_continues_where_an_uninterrupted_one_was() {
    let uninterrupted =
        DistributedDataset::new(dataset(), &local(2), InputOptions::default()).unwrap();
    let epochs = [
        global_batches(&uninterrupted).unwrap(),
        global_batches(&uninterrupted).unwrap(),
    ];
    assert_ne!(epochs[0], epochs[1], "the shuffle reshuffles each epoch");
    for replicas in [1, 2, 4] {
        for (epoch, step) in [(0, 0), (0, 3), (1, 0), (1, 7), (1, 10)] {
            let resumed =
                DistributedDataset::new(dataset(), &local(replicas), InputOptions::default())
                    .unwrap()
                    .resume_from(InputPosition { epoch, step });
            let got = global_batches(&resumed).unwrap();
            assert_eq!(
                got,
                epochs[epoch as usize][step as usize..],
                "{replicas} replicas resumed at epoch {epoch} step {step}"
            );
            // The iteration after the resumed one is the next epoch, from its start.
            if epoch == 0 {
                assert_eq!(global_batches(&resumed).unwrap(), epochs[1]);
            }
        }
    }
}

#[test]
fn workers_resume_at_the_same_global_step() {
    // 2 workers × 1 replica, each its own process: together they read what one process with
    // 2 replicas reads.
    let one = DistributedDataset::new(dataset(), &local(2), InputOptions::default()).unwrap();
    let all = global_batches(&one).unwrap();
    let mut rows_of_workers = Vec::new();
    for worker in 0..2 {
        let task = format!("/job:worker/task:{worker}");
        let workers =
            InputWorkers::worker_of_cluster(2, worker, &task, [format!("{task}/cpu:0")]).unwrap();
        let dist = DistributedDataset::new(dataset(), &workers, InputOptions::default())
            .unwrap()
            .resume_from(InputPosition::at_step(6));
        rows_of_workers.push(global_batches(&dist).unwrap());
    }
    let joined: Vec<Vec<i64>> = rows_of_workers[0]
        .iter()
        .zip(&rows_of_workers[1])
        .map(|(a, b)| a.iter().chain(b).copied().collect())
        .collect();
    assert_eq!(joined, all[6..]);
}
