//! Topology and device assignment (TPU-01..TPU-10 of the reference behaviours). Pure logic: no
//! plugin needed.

use distribute_tpu::topology::{open_ring_2d, ring_3d};
use distribute_tpu::{DeviceAssignment, DeviceOrderMode, Topology, TpuError};

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

/// A full topology of one task over `mesh`, devices in raster order (core fastest).
fn full(mesh: [i32; 4]) -> Topology {
    let mut coords = Vec::new();
    for z in 0..mesh[2] {
        for y in 0..mesh[1] {
            for x in 0..mesh[0] {
                for c in 0..mesh[3] {
                    coords.push(vec![x, y, z, c]);
                }
            }
        }
    }
    Topology::new(&mesh, &[coords]).unwrap()
}

#[test]
fn tpu_11_open_ring_2d_leaves_out_the_origin() {
    let ring = open_ring_2d(4, 4, 7);
    let expected = [
        (1, 0),
        (2, 0),
        (3, 0),
        (3, 1),
        (2, 1),
        (1, 1),
        (1, 2),
        (2, 2),
        (3, 2),
        (3, 3),
        (2, 3),
        (1, 3),
        (0, 3),
        (0, 2),
        (0, 1),
    ];
    let got: Vec<(i32, i32)> = ring.iter().map(|c| (c[0], c[1])).collect();
    assert_eq!(got, expected);
    assert!(ring.iter().all(|c| c[2] == 7));
}

#[test]
fn tpu_11_ring_3d_cases() {
    assert_eq!(ring_3d(1, 1, 3), [[0, 0, 0], [0, 0, 1], [0, 0, 2]]);
    assert_eq!(ring_3d(1, 3, 1), [[0, 0, 0], [0, 1, 0], [0, 2, 0]]);
    assert_eq!(ring_3d(3, 1, 1), [[0, 0, 0], [1, 0, 0], [2, 0, 0]]);
    // An odd dimension: raster order, z outermost, then y, then x.
    let raster = ring_3d(3, 2, 2);
    let mut expected = Vec::new();
    for z in 0..2 {
        for y in 0..2 {
            for x in 0..3 {
                expected.push([x, y, z]);
            }
        }
    }
    assert_eq!(raster, expected);
    // (4, 4, 1): the origin, then the 2-D ring.
    let flat = ring_3d(4, 4, 1);
    assert_eq!(flat[0], [0, 0, 0]);
    assert_eq!(flat[1..], open_ring_2d(4, 4, 0)[..]);
    // Every even 3-D block is visited once, neighbours one step apart, and it closes.
    let cube = ring_3d(2, 2, 2);
    assert_eq!(cube.len(), 8);
    let mut seen = cube.clone();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 8);
    for (a, b) in cube.iter().zip(cube.iter().cycle().skip(1)) {
        let distance: i32 = (0..3).map(|i| (a[i] - b[i]).abs()).sum();
        assert_eq!(distance, 1, "{a:?} -> {b:?}");
    }
}

#[test]
fn tpu_11_full_replication_follows_the_ring() {
    // A 4x4 mesh of chips with 2 cores each, one replica per chip: replicas go round the
    // ring, each on both cores of its chip.
    let a = DeviceAssignment::build(full([4, 4, 1, 2]), Some(&[1, 1, 1, 2]), None, 16).unwrap();
    let ring = ring_3d(4, 4, 1);
    for (r, chip) in ring.iter().enumerate() {
        for core in 0..2 {
            assert_eq!(
                a.coordinates(r, core).unwrap(),
                [chip[0], chip[1], chip[2], core as i32]
            );
        }
    }
    // Raster order on request.
    let mesh = DeviceAssignment::build_with_order(
        full([4, 4, 1, 2]),
        Some(&[1, 1, 1, 2]),
        None,
        16,
        DeviceOrderMode::Mesh,
    )
    .unwrap();
    assert_eq!(mesh.coordinates(4, 0).unwrap(), [0, 1, 0, 0]);
    // A ring where none applies is refused.
    invalid(
        DeviceAssignment::build_with_order(t2(), None, None, 1, DeviceOrderMode::Ring),
        "DeviceOrderMode::Ring",
    );
}

#[test]
fn replicas_take_a_compact_block_as_tf_chooses_it() {
    // Two chips of 4 cores, 4 replicas: TF's replica shape is (2, 1, 1, 2), cores 0 and 1 of
    // both chips, not the 4 cores of the first chip.
    let a = DeviceAssignment::build(full([2, 1, 1, 4]), None, None, 4).unwrap();
    let got: Vec<[i32; 4]> = (0..4).map(|r| a.coordinates(r, 0).unwrap()).collect();
    assert_eq!(
        got,
        [[0, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 1]]
    );
}

#[test]
fn a_topology_with_missing_devices_assigns_in_task_order() {
    let sparse = Topology::new(&[1, 1, 1, 4], &[vec![vec![0, 0, 0, 3], vec![0, 0, 0, 1]]]).unwrap();
    let a = DeviceAssignment::build(sparse, None, None, 2).unwrap();
    assert_eq!(a.coordinates(0, 0).unwrap(), [0, 0, 0, 3]);
    assert_eq!(a.coordinates(1, 0).unwrap(), [0, 0, 0, 1]);
}
