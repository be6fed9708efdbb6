//! Topology and device assignment (TPU-01..TPU-10 of the reference behaviours). Pure logic: no
//! plugin needed.

use distribute_tpu::{DeviceAssignment, Topology, TpuError};

/// T2: mesh [1,1,1,2], one task with two cores.
fn t2() -> Topology {
    Topology::new(&[1, 1, 1, 2], &[vec![vec![0, 0, 0, 0], vec![0, 0, 0, 1]]]).unwrap()
}

fn invalid<T: std::fmt::Debug>(result: Result<T, TpuError>, keyword: &str) {
    match result {
        Err(TpuError::InvalidArgument(m)) => assert!(m.contains(keyword), "{m} lacks {keyword}"),
        other => panic!("expected InvalidArgument mentioning {keyword}, got {other:?}"),
    }
}

#[test]
fn tpu_01_t2_round_trips_through_its_serialized_form() {
    let t = t2();
    assert_eq!(t.num_tasks(), 1);
    assert_eq!(t.num_tpus_per_task(), 2);
    assert_eq!(t.mesh_rank(), 4);
    let parsed = Topology::parse(&t.serialize()).unwrap();
    assert_eq!(parsed, t);
    assert_eq!(parsed.mesh_shape(), [1, 1, 1, 2]);
    assert_eq!(parsed.device_coordinates(0, 1), Some([0, 0, 0, 1]));
}

#[test]
fn tpu_02_03_mesh_shape_and_coordinates_are_validated() {
    let coords = [vec![vec![0, 0, 0, 0]]];
    invalid(Topology::new(&[1, 1, 2], &coords), "4 entries");
    invalid(Topology::new(&[1, 1, 0, 2], &coords), "positive");
    invalid(
        Topology::new(&[1, 1, 1, 2], &[vec![vec![0, 0, 0]]]),
        "mesh rank",
    );
    invalid(
        Topology::new(&[1, 1, 1, 2], &[vec![vec![0, 0, 0, 0]], vec![]]),
        "rank 3",
    );
}

#[test]
fn tpu_04_parsing_checks_counts_and_signs() {
    // Hand-built TopologyProtos: mesh [1,1,1,2], then the counts and coordinates under test.
    fn proto(tasks: i64, per_task: i64, coords: &[i64]) -> Vec<u8> {
        fn varint(out: &mut Vec<u8>, mut v: u64) {
            while v >= 0x80 {
                out.push((v as u8 & 0x7f) | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        }
        let mut out = vec![0x0a, 4, 1, 1, 1, 2];
        out.push(0x10);
        varint(&mut out, tasks as u64);
        out.push(0x18);
        varint(&mut out, per_task as u64);
        let mut body = Vec::new();
        for &c in coords {
            varint(&mut body, c as u64);
        }
        out.push(0x22);
        varint(&mut out, body.len() as u64);
        out.extend(body);
        out
    }
    assert_eq!(
        Topology::parse(&proto(1, 2, &[0, 0, 0, 0, 0, 0, 0, 1])).unwrap(),
        t2()
    );
    invalid(Topology::parse(&proto(-1, 2, &[])), "non-negative");
    invalid(Topology::parse(&proto(1, -2, &[])), "non-negative");
    invalid(
        Topology::parse(&proto(1, 2, &[0, 0, 0, 0])),
        "tasks × devices × mesh rank",
    );
    invalid(
        Topology::parse(&proto(1, 2, &[0, 0, 0, 0, 0, 0, 0, -1])),
        "non-negative",
    );
}

#[test]
fn tpu_05_lookups_by_coordinates() {
    let t = t2();
    let at = [0, 0, 0, 1];
    assert_eq!(t.task_ordinal_at_coordinates(at).unwrap(), 0);
    assert_eq!(t.tpu_device_ordinal_at_coordinates(at).unwrap(), 1);
    assert_eq!(
        t.cpu_device_name_at_coordinates(at, None).unwrap(),
        "/task:0/device:CPU:0"
    );
    assert_eq!(
        t.cpu_device_name_at_coordinates(at, Some("worker"))
            .unwrap(),
        "/job:worker/task:0/device:CPU:0"
    );
    assert_eq!(
        t.tpu_device_name_at_coordinates(at, None).unwrap(),
        "/task:0/device:TPU:1"
    );
    assert!(t.missing_devices().is_empty());
    let sparse = Topology::new(&[1, 1, 1, 2], &[vec![vec![0, 0, 0, 1]]]).unwrap();
    assert_eq!(sparse.missing_devices(), [[0, 0, 0, 0]]);
}

#[test]
fn tpu_06_assignment_construction() {
    invalid(
        DeviceAssignment::new(t2(), &[vec![vec![0, 0, 0, 0]], vec![]]),
        "rank 3",
    );
    invalid(
        DeviceAssignment::new(t2(), &[vec![vec![0, 0, 0]]]),
        "mesh rank",
    );
    let one = DeviceAssignment::new(t2(), &[vec![vec![0, 0, 0, 0]]]).unwrap();
    assert_eq!((one.num_replicas(), one.num_cores_per_replica()), (1, 1));
}

#[test]
fn tpu_07_assignment_lookups() {
    let a = DeviceAssignment::new(t2(), &[vec![vec![0, 0, 0, 0], vec![0, 0, 0, 1]]]).unwrap();
    assert_eq!(a.coordinates(0, 1).unwrap(), [0, 0, 0, 1]);
    assert_eq!(a.tpu_ordinal(0, 1).unwrap(), 1);
    assert_eq!(a.tpu_device(0, 1, None).unwrap(), "/task:0/device:TPU:1");
    assert_eq!(a.host_device(0, 1, None).unwrap(), "/task:0/device:CPU:0");
    assert_eq!(a.lookup_replicas(0, 0).unwrap(), [0]);
    invalid(a.lookup_replicas(5, 0), "task 5");
}

#[test]
fn tpu_08_09_build() {
    let two = DeviceAssignment::build(t2(), None, None, 2).unwrap();
    assert_eq!(two.coordinates(0, 0).unwrap(), [0, 0, 0, 0]);
    assert_eq!(two.coordinates(1, 0).unwrap(), [0, 0, 0, 1]);
    assert_eq!(two.tpu_device(1, 0, None).unwrap(), "/task:0/device:TPU:1");
    let spread = DeviceAssignment::build(t2(), Some(&[1, 1, 1, 2]), None, 1).unwrap();
    assert_eq!(spread.num_replicas(), 1);
    assert_eq!(spread.coordinates(0, 0).unwrap(), [0, 0, 0, 0]);
    assert_eq!(spread.coordinates(0, 1).unwrap(), [0, 0, 0, 1]);
}

#[test]
fn tpu_10_build_errors() {
    invalid(
        DeviceAssignment::build(t2(), Some(&[1, 1, 1]), None, 1),
        "computation_shape",
    );
    invalid(
        DeviceAssignment::build(t2(), None, Some(&[1, 1, 1]), 1),
        "computation_stride",
    );
    invalid(
        DeviceAssignment::build(t2(), Some(&[1, 1, 1, 0]), None, 1),
        "positive",
    );
    invalid(
        DeviceAssignment::build(t2(), Some(&[1, 1, 1, 4]), None, 1),
        "does not fit the mesh",
    );
    invalid(
        DeviceAssignment::build(t2(), None, None, 3),
        "between 1 and 2 fit",
    );
}

#[test]
fn build_with_a_stride_interleaves_replicas() {
    // Mesh of 4 cores, blocks of 2 cores spaced 2 apart: replica 0 on cores 0 and 2, replica 1
    // on cores 1 and 3.
    let t = Topology::single_host(4).unwrap();
    let a = DeviceAssignment::build(t, Some(&[1, 1, 1, 2]), Some(&[1, 1, 1, 2]), 2).unwrap();
    assert_eq!(a.coordinates(0, 1).unwrap(), [0, 0, 0, 2]);
    assert_eq!(a.coordinates(1, 0).unwrap(), [0, 0, 0, 1]);
    assert_eq!(a.coordinates(1, 1).unwrap(), [0, 0, 0, 3]);
}
