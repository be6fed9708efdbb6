//! The per-step row operations walk a nested batch without allocating for the walk: counting
//! the rows allocates nothing, and slicing a structure allocates what slicing its tensors one by
//! one does, plus its own containers. Counted per thread, so other tests' threads do not count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use distribute_input::Batch;
use distribute_tensor::Tensor;
use distribute_values::Nest;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; counting touches only a
// thread-local cell with a const initialiser, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The allocations `f` makes on this thread.
fn allocations<T>(f: impl FnOnce() -> T) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    let made = ALLOCATIONS.with(Cell::get) - before;
    drop(out);
    made
}

#[derive(Debug, Clone, Nest)]
struct Example {
    features: Tensor,
    tokens: Vec<Tensor>,
    weight: Option<Tensor>,
}

fn column(rows: usize) -> Tensor {
    Tensor::from_vec("/cpu:0", &[rows], (0..rows as i64).collect()).unwrap()
}

#[test]
fn per_step_operations_allocate_nothing_for_the_walk() {
    let example = Example {
        features: column(8),
        tokens: vec![column(8), column(8)],
        weight: Some(column(8)),
    };
    let tensors = 4;
    let device = "/job:localhost/replica:0/task:0/device:CPU:1";

    assert_eq!(allocations(|| example.rows("a step").unwrap()), 0);

    let lone = column(8);
    let one = allocations(|| lone.slice_rows_onto(2..6, device).unwrap());
    assert!(one > 0, "a placed slice owns at least its device name");
    // The tokens' `Vec` is the only allocation the structure adds.
    assert_eq!(
        allocations(|| example.slice_rows_onto(2..6, device).unwrap()),
        tensors * one + 1
    );
    let padded = allocations(|| lone.pad_rows(10).unwrap());
    assert_eq!(
        allocations(|| example.pad_rows(10).unwrap()),
        tensors * padded + 1
    );
}
