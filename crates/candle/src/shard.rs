//! ZeRO ([`Sharding`]): each replica owns one contiguous shard of each dtype's flattened
//! variables, keeps the optimizer's state of that shard only (and with ZeRO-2 only that shard of
//! the reduced gradients), updates it, and all-gathers the updated values into every replica's
//! whole copy. The split ([`Plan`]), the sharded reduction and update, and the state of the
//! pieces of variables that a shard holds, gathered into the unsharded state's entries for a
//! checkpoint and cut again from them on restore.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device, Tensor, Var};
use distribute_strategy::{ReplicaContext, StrategyExtended};
use distribute_values::ReduceOp;

use crate::clip::{self, BLOCK};
use crate::gradients::Buckets;
use crate::optim::{PieceSlot, ShardOptimizer, StateTensor};
use crate::variables::VarInfo;
use crate::{Error, convert, gradients};

/// What each replica of a [`DataParallel`](crate::DataParallel) model keeps whole, and what it
/// keeps a shard of (ZeRO: Rajbhandari et al., 2020).
///
/// With N replicas in sync (every worker's), each replica owns a contiguous shard of each
/// dtype's variables flattened in name order: the flat length `L` is cut into N shards of
/// `ceil(L / (N·1024))·1024` elements, replica `r` owning `[r·s, (r+1)·s)` (the last shards
/// padded with zeros, so a shard is a whole number of the gradient norm's blocks). A step
/// reduces the gradients, each replica updates its shard with its shard of the optimizer's state,
/// and an all-gather gives every replica the whole updated variables: training ends on the same
/// bits as unsharded training, whatever N. The optimizer must be a
/// [`ShardOptimizer`] (elementwise: [`AdamW`](crate::AdamW), [`Sgd`](crate::Sgd),
/// [`AnyOptimizer`](crate::AnyOptimizer), candle-nn's `SGD`), and the model is built with
/// [`DataParallel::new_sharded`](crate::DataParallel::new_sharded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sharding {
    /// Every replica keeps the whole optimizer state and the whole reduced gradients.
    #[default]
    None,
    /// ZeRO-1: each replica keeps the optimizer's state of its shard only (1/N of it); the
    /// gradients are all-reduced whole, as unsharded.
    Optimizer,
    /// ZeRO-2: as [`Optimizer`](Self::Optimizer), and the gradients are reduce-scattered, so
    /// each replica receives and keeps only its shard of the reduced gradients.
    OptimizerAndGradients,
}

impl fmt::Display for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sharding::None => "none",
            Sharding::Optimizer => "zero1",
            Sharding::OptimizerAndGradients => "zero2",
        })
    }
}

impl FromStr for Sharding {
    type Err = Error;

    /// `none`, `zero1` or `zero2` (a program's `--sharding` flag).
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "none" => Ok(Sharding::None),
            "zero1" => Ok(Sharding::Optimizer),
            "zero2" => Ok(Sharding::OptimizerAndGradients),
            other => Err(Error::InvalidArgument(format!(
                "sharding '{other}': expected none, zero1 (optimizer state) or zero2 (optimizer \
                 state and gradients)"
            ))),
        }
    }
}

/// The bytes a [`DataParallel`](crate::DataParallel) model holds for one replica
/// ([`memory`](crate::DataParallel::memory)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaMemory {
    /// The variables (with mixed precision, the f32 masters and the half-precision copies).
    pub parameters: usize,
    /// The reduced gradients one step hands the optimizer: every variable's, or with ZeRO-2
    /// the replica's shard.
    pub gradients: usize,
    /// The buckets the replica's gradients travel in, kept from one step to the next.
    pub gradient_buckets: usize,
    /// The optimizer's state: every variable's, or with ZeRO the replica's shard's.
    pub optimizer_state: usize,
}

/// The variables of one dtype, flattened in name order.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) dtype: DType,
    /// Elements of all its variables.
    pub(crate) len: usize,
    /// Elements of one replica's shard (a whole number of [`BLOCK`]s).
    pub(crate) shard: usize,
}

/// The part of one variable that lies in one replica's shard.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Piece {
    /// The variable's position in the manifest.
    pub(crate) var: usize,
    pub(crate) group: usize,
    /// Where the piece starts in the flattened variable.
    pub(crate) var_offset: usize,
    pub(crate) len: usize,
    /// Where it starts in the shard.
    pub(crate) shard_offset: usize,
}

/// How a model's variables are split among `replicas` shards.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) groups: Vec<Group>,
    /// Each variable's group.
    pub(crate) group_of: Vec<usize>,
    /// Each variable's first element in its group's flat sequence.
    pub(crate) offset_of: Vec<usize>,
    pub(crate) replicas: usize,
}

impl Plan {
    /// The split of `manifest`'s variables among `replicas` shards: groups by dtype in order of
    /// first appearance (the gradient buckets' order).
    pub(crate) fn new(manifest: &[VarInfo], replicas: usize) -> Plan {
        let mut groups: Vec<Group> = Vec::new();
        let mut group_of = Vec::with_capacity(manifest.len());
        let mut offset_of = Vec::with_capacity(manifest.len());
        for var in manifest {
            let g = match groups.iter().position(|g| g.dtype == var.dtype) {
                Some(g) => g,
                None => {
                    groups.push(Group {
                        dtype: var.dtype,
                        len: 0,
                        shard: 0,
                    });
                    groups.len() - 1
                }
            };
            group_of.push(g);
            offset_of.push(groups[g].len);
            groups[g].len += var.elem_count();
        }
        for group in &mut groups {
            group.shard = group.len.div_ceil(replicas * BLOCK) * BLOCK;
        }
        Plan {
            groups,
            group_of,
            offset_of,
            replicas,
        }
    }

    /// Replica `replica`'s pieces, by group, then in shard order.
    pub(crate) fn pieces(&self, manifest: &[VarInfo], replica: usize) -> Vec<Piece> {
        let mut pieces = Vec::new();
        for (g, group) in self.groups.iter().enumerate() {
            let (start, end) = (replica * group.shard, (replica + 1) * group.shard);
            for (var, info) in manifest.iter().enumerate() {
                if self.group_of[var] != g {
                    continue;
                }
                let (a, b) = (self.offset_of[var], self.offset_of[var] + info.elem_count());
                let (from, to) = (a.max(start), b.min(end));
                if from < to {
                    pieces.push(Piece {
                        var,
                        group: g,
                        var_offset: from - a,
                        len: to - from,
                        shard_offset: from - start,
                    });
                }
            }
        }
        pieces
    }
}

/// One replica's shards: the plan, its pieces, and the optimizer's state of each piece.
pub(crate) struct Shards {
    pub(crate) sharding: Sharding,
    pub(crate) plan: Plan,
    pub(crate) replica: usize,
    pub(crate) pieces: Vec<Piece>,
    /// Per piece, its state's slots ([`ShardOptimizer::piece_state`]).
    pub(crate) state: Vec<Vec<PieceSlot>>,
}

/// A [`ShardOptimizer`]'s methods as plain functions, taken where the optimizer type is known
/// to be one, so the rest of the crate needs only `Optimizer`.
pub(crate) struct ShardOps<O> {
    pub(crate) piece_state: fn(&O, usize, DType, &Device) -> candle_core::Result<Vec<PieceSlot>>,
    pub(crate) begin_update: fn(&mut O) -> candle_core::Result<()>,
    pub(crate) update_piece: fn(&O, &Tensor, &Tensor, &mut [Tensor]) -> candle_core::Result<Tensor>,
}

impl<O> Clone for ShardOps<O> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<O> Copy for ShardOps<O> {}

impl<O: ShardOptimizer> ShardOps<O> {
    /// `O`'s.
    pub(crate) fn of() -> Self {
        ShardOps {
            piece_state: O::piece_state,
            begin_update: O::begin_update,
            update_piece: O::update_piece,
        }
    }
}

impl Shards {
    /// Replica `replica`'s shards of `manifest` among `replicas`, with fresh state.
    pub(crate) fn new<O>(
        sharding: Sharding,
        manifest: &[VarInfo],
        replicas: usize,
        replica: usize,
        ops: &ShardOps<O>,
        optimizer: &O,
        device: &Device,
    ) -> Result<Shards, Error> {
        let plan = Plan::new(manifest, replicas);
        let pieces = plan.pieces(manifest, replica);
        let state = pieces
            .iter()
            .map(|p| (ops.piece_state)(optimizer, p.len, manifest[p.var].dtype, device))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Shards {
            sharding,
            plan,
            replica,
            pieces,
            state,
        })
    }

    /// The bytes of the optimizer's state this replica holds for its pieces.
    pub(crate) fn state_bytes(&self) -> usize {
        self.state
            .iter()
            .flatten()
            .map(|s| s.value.elem_count() * s.value.dtype().size_in_bytes())
            .sum()
    }

    /// The bytes of one step's reduced gradients this replica receives: its shards with ZeRO-2,
    /// else every variable's.
    pub(crate) fn reduced_gradient_bytes(&self) -> usize {
        self.plan
            .groups
            .iter()
            .map(|g| {
                let n = match self.sharding {
                    Sharding::OptimizerAndGradients => g.shard,
                    _ => g.len,
                };
                n * g.dtype.size_in_bytes()
            })
            .sum()
    }
}

/// `local` (this replica's gradients, manifest order) reduced with `op`, this replica's shard
/// of each group as a 1-dimensional candle tensor on `device`, and per variable whether some
/// replica had its gradient. ZeRO-2 on CPU replicas reduce-scatters the buckets; otherwise they
/// are all-reduced whole and the shard cut from the result (the same bits: the tests check the
/// reduce-scatter's shard against the all-reduce's).
pub(crate) fn reduce(
    ctx: &ReplicaContext<'_>,
    op: ReduceOp,
    manifest: &[VarInfo],
    shards: &Shards,
    local: &[Option<Tensor>],
    device: &Device,
    kept: &mut Buckets,
) -> Result<(Vec<Tensor>, Vec<bool>), Error> {
    if !matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
        return Err(Error::InvalidArgument(format!(
            "gradients are reduced with Sum or Mean, not {op}"
        )));
    }
    let plan = &shards.plan;
    let label = ctx.device();
    let buckets = plan
        .groups
        .iter()
        .enumerate()
        .map(|(i, group)| {
            let padded = group.shard * plan.replicas;
            gradients::pack(group.dtype, manifest, local, label, device, kept, i, padded)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let present: Vec<f32> = local
        .iter()
        .map(|g| f32::from(u8::from(g.is_some())))
        .collect();
    let present = distribute_tensor::Tensor::from_vec(label, &[present.len()], present)?;
    let r = shards.replica;
    let (parts, present) = if shards.sharding == Sharding::OptimizerAndGradients && device.is_cpu()
    {
        let present = ctx.all_reduce(op, &present)?;
        let parts = buckets
            .iter()
            .map(|b| Ok(ctx.collectives().reduce_scatter(op, b)?))
            .collect::<Result<Vec<_>, Error>>()?;
        drop(buckets);
        (parts, present)
    } else {
        let (reduced, present) = ctx.all_reduce(op, &(buckets, present))?;
        let parts = reduced
            .iter()
            .zip(&plan.groups)
            .map(|(whole, g)| Ok(whole.slice_rows(r * g.shard..(r + 1) * g.shard)?))
            .collect::<Result<Vec<_>, Error>>()?;
        (parts, present)
    };
    if !device.is_cpu() {
        kept.host_bytes += parts.iter().map(|p| p.size_in_bytes() as u64).sum::<u64>();
    }
    let parts = parts
        .iter()
        .map(|p| convert::to_candle(p, device))
        .collect::<Result<Vec<_>, Error>>()?;
    let present = present
        .to_vec::<f32>()?
        .into_iter()
        .map(|p| p > 0.0)
        .collect();
    Ok((parts, present))
}

/// The global norm of the reduced gradients from every replica's shards: each replica sums its
/// blocks, the sums are all-gathered and added in the unsharded order ([`clip::global_norm`]'s),
/// to the same bits.
pub(crate) fn global_norm(
    ctx: &ReplicaContext<'_>,
    shards: &Shards,
    parts: &[Tensor],
) -> Result<f64, Error> {
    let mut mine = Vec::new();
    for part in parts {
        mine.extend(clip::block_sums(part)?);
    }
    let per_replica = mine.len();
    let mine = distribute_tensor::Tensor::from_vec(ctx.device(), &[per_replica], mine)?;
    let all = ctx.collectives().all_gather(&mine)?.to_vec::<f64>()?;
    let mut squares = 0f64;
    let mut at = 0;
    for group in &shards.plan.groups {
        let blocks = group.shard / BLOCK;
        for r in 0..shards.plan.replicas {
            for partial in &all[r * per_replica + at..r * per_replica + at + blocks] {
                squares += partial;
            }
        }
        at += blocks;
    }
    Ok(squares.sqrt())
}

/// The update of this replica's shards with their reduced gradients `parts` (`present[v]`: some
/// replica had variable `v`'s gradient), then the all-gather that sets every variable of `vars`
/// (manifest order) to the updated values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn update<O>(
    ctx: &ReplicaContext<'_>,
    ops: &ShardOps<O>,
    optimizer: &mut O,
    shards: &mut Shards,
    manifest: &[VarInfo],
    vars: &[Var],
    parts: &[Tensor],
    present: &[bool],
) -> Result<(), Error> {
    (ops.begin_update)(optimizer)?;
    let device = vars
        .first()
        .map_or(Device::Cpu, |v| v.as_tensor().device().clone());
    for (g, group) in shards.plan.groups.iter().enumerate() {
        let mut values = Vec::new();
        let mut filled = 0;
        for (piece, state) in shards.pieces.iter().zip(shards.state.iter_mut()) {
            if piece.group != g {
                continue;
            }
            let value = vars[piece.var].as_tensor().flatten_all()?.narrow(
                0,
                piece.var_offset,
                piece.len,
            )?;
            let next = match present[piece.var] {
                true => {
                    let grad = parts[g].narrow(0, piece.shard_offset, piece.len)?;
                    let mut slots: Vec<Tensor> = state.iter().map(|s| s.value.clone()).collect();
                    let next = (ops.update_piece)(optimizer, &value, &grad, &mut slots)?;
                    for (slot, value) in state.iter_mut().zip(slots) {
                        slot.value = value;
                    }
                    next
                }
                false => value,
            };
            filled += piece.len;
            values.push(next);
        }
        if filled < group.shard {
            values.push(Tensor::zeros(group.shard - filled, group.dtype, &device)?);
        }
        let mine = Tensor::cat(&values, 0)?;
        drop(values);
        let mine = convert::from_candle(&mine, ctx.device())?;
        let whole = ctx.collectives().all_gather(&mine)?;
        drop(mine);
        let whole = convert::to_candle(&whole, &device)?;
        for (v, info) in manifest.iter().enumerate() {
            if shards.plan.group_of[v] != g || !present[v] {
                continue;
            }
            let value = whole
                .narrow(0, shards.plan.offset_of[v], info.elem_count())?
                .reshape(info.shape.as_slice())?;
            vars[v].set(&value)?;
        }
    }
    Ok(())
}

/// The name of one piece's slot in a worker's bytes: `<var>/<offset in the var>/<slot>`.
fn piece_entry(piece: &Piece, slot: &str) -> String {
    format!("{}/{}/{slot}", piece.var, piece.var_offset)
}

/// This worker's replicas' piece states as one safetensors buffer, for
/// [`gather_state`].
pub(crate) fn local_state_bytes<'a>(
    shards: impl IntoIterator<Item = &'a Shards>,
) -> Result<Vec<u8>, Error> {
    let mut named: Vec<(String, Tensor)> = Vec::new();
    for shards in shards {
        for (piece, state) in shards.pieces.iter().zip(&shards.state) {
            for slot in state {
                named.push((
                    piece_entry(piece, slot.slot),
                    slot.value.to_device(&Device::Cpu)?,
                ));
            }
        }
    }
    safetensors::serialize(named, None).map_err(|e| Error::Candle(candle_core::Error::wrap(e)))
}

/// The state of every variable, whole, from every worker's pieces (`every`: each worker's
/// [`local_state_bytes`]), as [`OptimizerState::state`](crate::OptimizerState::state) lists an
/// unsharded optimizer's per-variable slots; `template` (a piece's slots) names the slots.
pub(crate) fn gather_state(
    manifest: &[VarInfo],
    plan: &Plan,
    template: &[PieceSlot],
    every: &[Vec<u8>],
) -> Result<Vec<StateTensor>, Error> {
    let mut entries = std::collections::HashMap::new();
    for bytes in every {
        entries.extend(crate::variables::from_safetensors(bytes)?);
    }
    let mut state = Vec::new();
    for (v, info) in manifest.iter().enumerate() {
        let pieces: Vec<Piece> = (0..plan.replicas)
            .flat_map(|r| plan.pieces(manifest, r))
            .filter(|p| p.var == v)
            .collect();
        for slot in template {
            let found = |p: &Piece| {
                entries.get(&piece_entry(p, slot.slot)).ok_or_else(|| {
                    Error::OutOfSync(format!(
                        "the sharded optimizer state has no '{}' of variable '{}' from element \
                         {} (the workers split the variables differently)",
                        slot.slot, info.name, p.var_offset
                    ))
                })
            };
            let value = if slot.value.rank() == 0 {
                match pieces.first() {
                    Some(p) => found(p)?.clone(),
                    None => slot.value.clone(),
                }
            } else if pieces.is_empty() {
                Tensor::zeros(info.shape.as_slice(), info.dtype, &Device::Cpu)?
            } else {
                let parts = pieces.iter().map(found).collect::<Result<Vec<_>, _>>()?;
                Tensor::cat(&parts, 0)?.reshape(info.shape.as_slice())?
            };
            state.push(StateTensor {
                var: Some(v),
                slot: slot.slot,
                value,
            });
        }
    }
    Ok(state)
}

/// What a sharded model's checkpoint holds per variable, for checking a file against: one
/// entry per variable and slot of `template`, of the variable's shape for a 1-dimensional slot
/// (a broadcast zero: nothing allocated), else the slot's own.
pub(crate) fn expected_state(
    manifest: &[VarInfo],
    template: &[PieceSlot],
) -> Result<Vec<StateTensor>, Error> {
    let mut state = Vec::new();
    for (v, info) in manifest.iter().enumerate() {
        for slot in template {
            let value = match slot.value.rank() {
                0 => slot.value.clone(),
                _ => Tensor::zeros(1, info.dtype, &Device::Cpu)?
                    .reshape(())?
                    .broadcast_as(info.shape.as_slice())?,
            };
            state.push(StateTensor {
                var: Some(v),
                slot: slot.slot,
                value,
            });
        }
    }
    Ok(state)
}

/// Sets this replica's piece states from `whole` (per variable, `template`'s slots in order, as
/// [`expected_state`] lists them, checked): each piece takes its part of its variable's slots.
pub(crate) fn set_state(
    shards: &mut Shards,
    template_len: usize,
    whole: &[Tensor],
    device: &Device,
) -> Result<(), Error> {
    let mut next = Vec::with_capacity(shards.pieces.len());
    for (piece, state) in shards.pieces.iter().zip(&shards.state) {
        let mut slots = Vec::with_capacity(state.len());
        for (k, slot) in state.iter().enumerate() {
            let value = &whole[piece.var * template_len + k];
            let value = match slot.value.rank() {
                0 => value.clone(),
                _ => value
                    .flatten_all()?
                    .narrow(0, piece.var_offset, piece.len)?
                    .to_device(device)?
                    .copy()?,
            };
            slots.push(PieceSlot::new(slot.slot, value));
        }
        next.push(slots);
    }
    shards.state = next;
    Ok(())
}

/// Every worker's bytes, in worker order: exchanged across workers, or this process's alone.
pub(crate) fn all_gather_bytes(
    extended: &dyn StrategyExtended,
    bytes: Vec<u8>,
) -> Result<Vec<Vec<u8>>, Error> {
    match extended.workers() {
        Some(workers) => Ok(workers.all_gather_bytes(&bytes)?),
        None => Ok(vec![bytes]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_whole_blocks_and_every_element_lies_in_exactly_one_piece() {
        let manifest = [
            VarInfo::new("a", DType::F32, &[3, 700]),
            VarInfo::new("b", DType::F64, &[5]),
            VarInfo::new("c", DType::F32, &[1500]),
            VarInfo::new("d", DType::F32, &[0]),
        ];
        for replicas in 1..=4 {
            let plan = Plan::new(&manifest, replicas);
            assert_eq!(plan.groups.len(), 2);
            assert_eq!(plan.groups[0].len, 3600);
            for group in &plan.groups {
                assert_eq!(group.shard % BLOCK, 0);
                assert!(group.shard * replicas >= group.len);
                assert!(group.shard * (replicas - 1) < group.len.max(1) + BLOCK * replicas);
            }
            let mut covered = [vec![0u8; 3600], vec![0u8; 5]];
            for r in 0..replicas {
                for p in plan.pieces(&manifest, r) {
                    assert!(p.len > 0);
                    let start = plan.offset_of[p.var] + p.var_offset;
                    assert_eq!(start, r * plan.groups[p.group].shard + p.shard_offset);
                    for x in &mut covered[p.group][start..start + p.len] {
                        *x += 1;
                    }
                }
            }
            assert!(covered.iter().flatten().all(|&c| c == 1), "{replicas}");
        }
    }

    #[test]
    fn sharding_reads_and_writes_its_flag_names() {
        for s in [
            Sharding::None,
            Sharding::Optimizer,
            Sharding::OptimizerAndGradients,
        ] {
            assert_eq!(s.to_string().parse::<Sharding>().unwrap(), s);
        }
        let err = "zero3".parse::<Sharding>().unwrap_err().to_string();
        assert!(err.contains("'zero3'") && err.contains("zero2"), "{err}");
    }
}
