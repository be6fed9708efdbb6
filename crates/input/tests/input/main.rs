//! Behaviour tests of distribute-input, named after the IN ids of tf_behaviors.md section 6
//! that they check, plus the policies, sources and prefetch guarantees of issue 6.

mod common;
mod context;
mod multi_worker;
mod multi_worker_rows;
mod nested;
mod options;
mod policies;
mod prefetch;
mod properties;
mod rebatch;
mod resume;
mod row_copies;
mod single_worker;
mod snapshots;
mod sources;
