//! A build without feature `nccl`: there is no NCCL backend, and [`nccl_backend`] says so.

use std::sync::Arc;

use crate::CrossDeviceOps;
use crate::group::GroupConfig;

/// Why this build cannot reduce `gpus` with NCCL (see the `nccl` build's namesake).
pub(crate) fn nccl_backend(
    _gpus: &[usize],
    _config: &GroupConfig,
) -> Result<(Arc<dyn CrossDeviceOps>, String), String> {
    Err("this build has no NCCL backend (build distribute-collectives with feature `nccl`)".into())
}
