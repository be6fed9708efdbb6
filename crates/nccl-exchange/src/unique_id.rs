//! What the exchange moves: NCCL's unique id, [`UNIQUE_ID_BYTES`] bytes that are the same on
//! every rank. The entry points, the wire format, both sides of the conversation and the sealing
//! of the id all size it from here.

/// The 128 bytes every rank of an NCCL communicator must share (`NCCL_UNIQUE_ID_BYTES`; with
/// feature `nccl`, checked at compile time to equal collectives' `NcclAllReduce::UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;
