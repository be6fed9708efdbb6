//! [`Shared`]: what the backend and every replica's handle share — whether the backend was
//! aborted and why (raised by `StepLifecycle::abort`, polled by every replica's wait), and the
//! deadline of every wait. The backend (`all_reduce`) makes it; the handles (`member`) read it.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use distribute_values::Lock;

/// The state of one [`NcclAllReduce`](crate::NcclAllReduce) that its replicas' handles read.
pub(super) struct Shared {
    pub(super) aborted: AtomicBool,
    pub(super) reason: Lock<String>,
    pub(super) deadline: Duration,
}
