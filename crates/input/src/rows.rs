//! Row copies by plain memory copies: gathering rows in a given order, joining tensors along the
//! rows, and padding with rows of zeros.
//!
//! A tensor in standard (row-major, contiguous) layout keeps each row's elements in one run, so
//! these copy whole rows with one `memcpy` each into a buffer sized once, where ndarray's
//! `select` and `concatenate` walk each row as a sub-array of dynamic rank (allocating and
//! zipping per row). The bits are the source's either way; a tensor in any other layout (a
//! strided shard, a transpose) returns `None` here and takes ndarray's general path, and so does
//! a size whose buffer cannot be reserved, so that path reports the error.
//!
//! Part of the input layer's row operations ([`Batch`](crate::Batch)); knows only `Tensor`'s
//! public API.

use distribute_tensor::{Element, Tensor};
use ndarray::{ArcArray, IxDyn};

use distribute_tensor::with_dtype;

/// The elements of one row of `shape` (1 for a vector), `None` on overflow.
fn row_len(shape: &[usize]) -> Option<usize> {
    shape[1..].iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// An empty buffer for `elements` values, `None` if it cannot be reserved.
fn buffer<T>(elements: usize) -> Option<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(elements).ok()?;
    Some(out)
}

/// `data` shaped as `like`'s shape with `rows` rows, on `device`.
fn shaped<T: Element>(device: &str, like: &[usize], rows: usize, data: Vec<T>) -> Tensor {
    let mut dim = IxDyn(like);
    dim[0] = rows;
    let array = ArcArray::from_shape_vec(dim, data)
        .expect("the buffer holds exactly rows × the row length elements");
    Tensor::from_shared(device, array)
}

/// Rows `indices` of `t` (each in range, a rank ≥ 1 tensor), in that order, on `t`'s device;
/// `None` when `t` is not in standard layout.
pub(crate) fn gather(t: &Tensor, indices: &[usize]) -> Option<Tensor> {
    fn typed_gather<T: Element>(t: &Tensor, indices: &[usize]) -> Option<Tensor> {
        let array = t.array::<T>().ok()?;
        let src = array.as_slice()?;
        let row = row_len(array.shape())?;
        let mut out = buffer::<T>(indices.len().checked_mul(row)?)?;
        if row == 1 {
            out.extend(indices.iter().map(|&i| src[i]));
        } else {
            for &i in indices {
                out.extend_from_slice(&src[i * row..(i + 1) * row]);
            }
        }
        Some(shaped(t.device(), array.shape(), indices.len(), out))
    }
    with_dtype!(t.dtype(), T => typed_gather::<T>(t, indices))
}

/// `parts` joined along the rows on `device`; `None` when they differ in dtype, rank or any
/// dimension but the first, or one is not in standard layout (the general path then joins
/// them or says why not).
pub(crate) fn join(device: &str, parts: &[&Tensor]) -> Option<Tensor> {
    fn typed_join<T: Element>(device: &str, parts: &[&Tensor]) -> Option<Tensor> {
        let first = parts.first()?.array::<T>().ok()?;
        let tail = &first.shape()[1..];
        let mut rows = 0usize;
        let mut elements = 0usize;
        for part in parts {
            let array = part.array::<T>().ok()?;
            if array.ndim() == 0 || &array.shape()[1..] != tail || array.as_slice().is_none() {
                return None;
            }
            rows = rows.checked_add(array.shape()[0])?;
            elements = elements.checked_add(array.len())?;
        }
        let mut out = buffer::<T>(elements)?;
        for part in parts {
            out.extend_from_slice(part.array::<T>().ok()?.as_slice()?);
        }
        Some(shaped(device, first.shape(), rows, out))
    }
    let dtype = parts.first()?.dtype();
    with_dtype!(dtype, T => typed_join::<T>(device, parts))
}

/// `t` (a rank ≥ 1 tensor of at most `rows` rows) extended with rows of zeros to `rows` rows;
/// `None` when `t` is not in standard layout.
pub(crate) fn pad(t: &Tensor, rows: usize) -> Option<Tensor> {
    fn typed_pad<T: Element>(t: &Tensor, rows: usize) -> Option<Tensor> {
        let array = t.array::<T>().ok()?;
        let src = array.as_slice()?;
        let elements = rows.checked_mul(row_len(array.shape())?)?;
        let mut out = buffer::<T>(elements)?;
        out.extend_from_slice(src);
        out.resize(elements, T::zero());
        Some(shaped(t.device(), array.shape(), rows, out))
    }
    with_dtype!(t.dtype(), T => typed_pad::<T>(t, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], data: Vec<i32>) -> Tensor {
        Tensor::from_vec("/cpu:0", shape, data).unwrap()
    }

    #[test]
    fn strided_tensors_take_the_general_path() {
        let x = t(&[4, 2], (0..8).collect());
        let strided = Tensor::from_shared(
            "/cpu:0",
            x.array::<i32>()
                .unwrap()
                .clone()
                .slice_axis_move(ndarray::Axis(0), ndarray::Slice::new(0, None, 2)),
        );
        assert!(gather(&strided, &[0]).is_none());
        assert!(join("/cpu:0", &[&x, &strided]).is_none());
        assert!(pad(&strided, 3).is_none());
        assert_eq!(
            gather(&x, &[3, 0]).unwrap().to_vec::<i32>().unwrap(),
            [6, 7, 0, 1]
        );
    }

    #[test]
    fn parts_that_do_not_line_up_take_the_general_path() {
        let a = t(&[1, 2], vec![1, 2]);
        let b = t(&[1, 3], vec![1, 2, 3]);
        assert!(join("/cpu:0", &[&a, &b]).is_none());
        let c = Tensor::from_vec("/cpu:0", &[1, 2], vec![1i64, 2]).unwrap();
        assert!(join("/cpu:0", &[&a, &c]).is_none());
        let joined = join("/cpu:1", &[&a, &a]).unwrap();
        assert_eq!(
            (joined.device(), joined.shape()),
            ("/cpu:1", &[2usize, 2][..])
        );
    }
}
