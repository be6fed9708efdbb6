//! NCCL across the GPUs of an MPI job's processes, its unique id broadcast over MPI (feature
//! `nccl`): the MPI job already connects the processes, so the TCP unique-id exchange of
//! `distribute-nccl-exchange` is not needed.

use std::time::Duration;

use distribute_collectives::CollectiveError;
use distribute_nccl::NcclAllReduce;

use crate::MpiWorld;

/// This process's replicas of an MPI job where every process drives `gpus.len()` GPUs (the
/// same count everywhere): process `p` owns NCCL ranks `p·k .. p·k + k`. Rank 0 makes the
/// NCCL unique id and broadcasts it over MPI; every process of the job must call this.
///
/// Untested here (no GPU on the build machine); it composes [`MpiWorld`]'s broadcast with
/// [`NcclAllReduce::from_unique_id`], both exercised elsewhere.
pub fn nccl_for_mpi_world(
    gpus: &[usize],
    deadline: Duration,
) -> Result<NcclAllReduce, CollectiveError> {
    let world = MpiWorld::get()?;
    // Every process learns whether rank 0 could make an id: a failure there is an error
    // everywhere, not a wait for an id that never comes.
    let mut message = [0u8; 1 + NcclAllReduce::UNIQUE_ID_BYTES];
    if world.rank() == 0 {
        match NcclAllReduce::new_unique_id() {
            Ok(id) => {
                message[0] = 1;
                message[1..].copy_from_slice(&id);
            }
            Err(e) => log::error!("rank 0 could not make an NCCL unique id: {e}"),
        }
    }
    world.broadcast(0, &mut message, deadline, &|| {
        "the NCCL unique id".to_owned()
    });
    if message[0] != 1 {
        return Err(CollectiveError::InvalidArgument(
            "MPI rank 0 could not make an NCCL unique id (see its log); is NCCL loadable \
             there?"
                .into(),
        ));
    }
    let mut id = [0u8; NcclAllReduce::UNIQUE_ID_BYTES];
    id.copy_from_slice(&message[1..]);
    let k = gpus.len();
    NcclAllReduce::from_unique_id(id, world.size() * k, world.rank() * k, gpus, deadline)
}
