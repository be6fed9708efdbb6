//! The program of the downstream crate that picks `distribute-device-spec` alone (copied into
//! its `src/main.rs`): parses, merges and prints device specs and reads a cluster spec, with no
//! MPI, CUDA or PJRT in its build.

use distribute_device_spec::{ClusterSpec, DeviceSpec, TaskType, canonicalize};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec: DeviceSpec = "/job:worker/replica:0/task:1/device:GPU:0".parse()?;
    let cpu: DeviceSpec = "/cpu:0".parse()?;
    println!("{spec}");
    println!("{cpu}");
    println!("{}", canonicalize("/gpu:1", Some("/job:worker/task:2"))?);
    let cluster =
        ClusterSpec::from_json(r#"{"chief": ["a:2222"], "worker": ["b:2222", "c:2222"]}"#)?;
    println!("{}", cluster.worker_count(TaskType::Worker)?);
    Ok(())
}
