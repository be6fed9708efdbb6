//! TF's ring orders over a block of chips (`_ring_3d`, `_open_ring_2d`), which keep neighbouring
//! replicas on neighbouring chips.

/// TF's `_open_ring_2d`: a ring over an `x_size` × `y_size` plane at height `z`, leaving out
/// (0, 0, z): along x on even rows from x = 1, back on odd rows, then down the x = 0 column.
///
/// ```
/// let ring = distribute_tpu::topology::open_ring_2d(2, 2, 0);
/// assert_eq!(ring, [[1, 0, 0], [1, 1, 0], [0, 1, 0]]);
/// ```
pub fn open_ring_2d(x_size: i32, y_size: i32, z: i32) -> Vec<[i32; 3]> {
    let mut ring = Vec::new();
    for i in 0..y_size / 2 {
        for x in 1..x_size {
            ring.push([x, 2 * i, z]);
        }
        for x in (1..x_size).rev() {
            ring.push([x, 2 * i + 1, z]);
        }
    }
    for y in (1..y_size).rev() {
        ring.push([0, y, z]);
    }
    ring
}

/// TF's `_ring_3d`: a ring through every chip of an `x` × `y` × `z` block (TPU-11).
///
/// - Two sizes of 1: a line along the third axis.
/// - Any odd size above 1: raster order, z outermost, then y, then x.
/// - Otherwise (0, 0, 0) first, then a 2-D ring over the two axes above 1, or, when all three
///   are, 2-D rings plane by plane (every other one reversed) and back down the z axis.
///
/// ```
/// use distribute_tpu::topology::ring_3d;
///
/// assert_eq!(ring_3d(1, 1, 3), [[0, 0, 0], [0, 0, 1], [0, 0, 2]]);
/// ```
pub fn ring_3d(x_size: i32, y_size: i32, z_size: i32) -> Vec<[i32; 3]> {
    match (x_size, y_size, z_size) {
        (1, 1, _) => return (0..z_size).map(|z| [0, 0, z]).collect(),
        (1, _, 1) => return (0..y_size).map(|y| [0, y, 0]).collect(),
        (_, 1, 1) => return (0..x_size).map(|x| [x, 0, 0]).collect(),
        _ => {}
    }
    if [x_size, y_size, z_size]
        .iter()
        .any(|&d| d > 1 && d % 2 != 0)
    {
        let mut ring = Vec::new();
        for z in 0..z_size {
            for y in 0..y_size {
                for x in 0..x_size {
                    ring.push([x, y, z]);
                }
            }
        }
        return ring;
    }
    let mut ring = vec![[0, 0, 0]];
    if z_size == 1 {
        ring.extend(open_ring_2d(x_size, y_size, 0));
    } else if y_size == 1 {
        ring.extend(
            open_ring_2d(x_size, z_size, 0)
                .into_iter()
                .map(|[x, z, y]| [x, y, z]),
        );
    } else if x_size == 1 {
        ring.extend(
            open_ring_2d(y_size, z_size, 0)
                .into_iter()
                .map(|[y, z, x]| [x, y, z]),
        );
    } else {
        for z in 0..z_size {
            let plane = open_ring_2d(x_size, y_size, z);
            if z % 2 == 0 {
                ring.extend(plane);
            } else {
                ring.extend(plane.into_iter().rev());
            }
        }
        for z in (1..z_size).rev() {
            ring.push([0, 0, z]);
        }
    }
    ring
}
