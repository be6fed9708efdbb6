//! Behaviour tests of collective keys and device grouping (COL-37, COL-38, COL-41).

use distribute_collectives::{
    CollectiveError, CollectiveKeys, DEFAULT_RANGE_SIZE_LIMIT, extract_ranges, group_device_names,
};

#[test]
fn col37_group_device_names() {
    assert_eq!(
        group_device_names(&["d0", "d1", "d2", "d3"], 2).unwrap(),
        [["d0", "d2"], ["d1", "d3"]]
    );
    assert_eq!(
        group_device_names(&["d0", "d1", "d2"], 2).unwrap(),
        [["d0", "d2"], ["d1", "d0"]],
        "wraps around"
    );
    assert_eq!(
        group_device_names(&["d0", "d1", "d2"], 3).unwrap(),
        [["d0", "d1", "d2"]]
    );
    for size in [4, 0] {
        assert!(matches!(
            group_device_names(&["d0", "d1", "d2"], size),
            Err(CollectiveError::InvalidArgument(_))
        ));
    }
}

/// Indices, range size limit, expected ranges, expected singles.
type RangesCase = (&'static [usize], usize, Vec<[usize; 2]>, Vec<usize>);

#[test]
fn col38_extract_ranges() {
    let table: [RangesCase; 5] = [
        (&[], DEFAULT_RANGE_SIZE_LIMIT, vec![], vec![]),
        (
            &[1, 2, 3, 5, 7, 8],
            DEFAULT_RANGE_SIZE_LIMIT,
            vec![[1, 3], [7, 8]],
            vec![5],
        ),
        (&[4], DEFAULT_RANGE_SIZE_LIMIT, vec![], vec![4]),
        (&[0, 1, 2, 3, 4], 0, vec![[0, 1], [2, 3]], vec![4]),
        (&[0, 1, 2, 3, 4], 1, vec![[0, 2], [3, 4]], vec![]),
    ];
    for (indices, limit, ranges, singles) in table {
        assert_eq!(
            extract_ranges(indices, limit),
            (ranges, singles),
            "{indices:?} limit {limit}"
        );
    }
}

#[test]
fn col41_collective_keys() {
    let keys = CollectiveKeys::new();
    let a = keys.group_key(&["/gpu:0", "/gpu:1"]);
    let b = keys.group_key(&["/gpu:2", "/gpu:3"]);
    assert_eq!((a, b), (1, 2));
    assert_eq!(
        keys.group_key(&["/gpu:0", "/gpu:1"]),
        a,
        "same list, same key"
    );
    assert_eq!(
        keys.group_key(&["/gpu:1", "/gpu:0"]),
        3,
        "order matters, as in TF"
    );
    assert_eq!(
        CollectiveKeys::with_group_key_start(10).group_key(&["x"]),
        10
    );
    // A device name holding a comma is not two devices: the lists get different keys.
    let joined = keys.group_key(&["/gpu:0,/gpu:1"]);
    assert_ne!(
        joined, a,
        "[\"a,b\"] and [\"a\", \"b\"] are different groups"
    );
    assert_eq!(keys.instance_key(joined, "/gpu:0,/gpu:1").unwrap(), 100);

    assert_eq!(keys.instance_key(a, "/gpu:0").unwrap(), 100);
    assert_eq!(keys.instance_key(a, "/gpu:0").unwrap(), 101);
    assert_eq!(keys.instance_key(a, "/gpu:1").unwrap(), 100, "per device");
    assert_eq!(keys.instance_key(b, "/gpu:2").unwrap(), 100, "per group");
    for bad in [
        keys.instance_key(99, "/gpu:0"),
        keys.instance_key(a, "/gpu:2"),
    ] {
        assert!(matches!(bad, Err(CollectiveError::InvalidArgument(_))));
    }
}
