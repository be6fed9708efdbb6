//! The model's variables across replicas and workers: their manifest (names, dtypes, shapes) and
//! its agreement, values copied from replica 0 and the chief, the bit-identity check, and
//! safetensors checkpoints.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use candle_core::{DType, Device, Tensor, Var};
use distribute_strategy::StrategyExtended;
use distribute_tensor::Fnv;

use crate::Error;

/// One variable of the model: its name in the `VarMap` (candle's, e.g. `l1.weight`), dtype and
/// shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarInfo {
    /// The name the model's `VarBuilder` gave it.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl VarInfo {
    /// A variable's description (the tests' shorthand).
    #[cfg(test)]
    pub(crate) fn new(name: &str, dtype: DType, shape: &[usize]) -> VarInfo {
        VarInfo {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// Elements in the variable.
    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }
}

impl fmt::Display for VarInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "'{}' {} {:?}",
            self.name,
            self.dtype.as_str(),
            self.shape
        )
    }
}

/// The variables of `vars` (a `VarMap`'s contents) sorted by name: the order every replica and
/// worker uses for gradients and checks.
pub(crate) fn sorted(vars: &std::collections::HashMap<String, Var>) -> (Vec<VarInfo>, Vec<Var>) {
    let by_name: BTreeMap<&String, &Var> = vars.iter().collect();
    by_name
        .into_iter()
        .map(|(name, var)| {
            (
                VarInfo {
                    name: name.clone(),
                    dtype: var.dtype(),
                    shape: var.dims().to_vec(),
                },
                var.clone(),
            )
        })
        .unzip()
}

/// The first difference between `ours` (of `us`) and `theirs` (of `them`), in words that name
/// the variable and both sides; `None` when they agree.
pub(crate) fn difference(
    ours: &[VarInfo],
    us: &str,
    theirs: &[VarInfo],
    them: &str,
) -> Option<String> {
    let mine: BTreeMap<&str, &VarInfo> = ours.iter().map(|v| (v.name.as_str(), v)).collect();
    let other: BTreeMap<&str, &VarInfo> = theirs.iter().map(|v| (v.name.as_str(), v)).collect();
    for (name, var) in &mine {
        match other.get(name) {
            None => return Some(format!("variable '{name}' of {us} is missing on {them}")),
            Some(o) if o.dtype != var.dtype || o.shape != var.shape => {
                return Some(format!(
                    "variable '{name}' is {} {:?} on {us} but {} {:?} on {them}",
                    var.dtype.as_str(),
                    var.shape,
                    o.dtype.as_str(),
                    o.shape
                ));
            }
            Some(_) => {}
        }
    }
    other
        .keys()
        .find(|name| !mine.contains_key(*name))
        .map(|name| format!("variable '{name}' of {them} is missing on {us}"))
}

/// The manifest as text, one `name\tdtype\tshape` line per variable.
fn manifest_text(vars: &[VarInfo]) -> String {
    vars.iter()
        .map(|v| {
            let dims: Vec<String> = v.shape.iter().map(usize::to_string).collect();
            format!("{}\t{}\t{}\n", v.name, v.dtype.as_str(), dims.join(","))
        })
        .collect()
}

/// The manifest back from [`manifest_text`] (padding zeros at the end ignored).
fn parse_manifest(bytes: &[u8]) -> Result<Vec<VarInfo>, Error> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| Error::ModelMismatch("a worker sent a manifest that is not UTF-8".into()))?;
    let bad =
        |line: &str| Error::ModelMismatch(format!("a worker sent a bad manifest line {line:?}"));
    text.trim_end_matches('\0')
        .lines()
        .map(|line| {
            let mut fields = line.split('\t');
            let (Some(name), Some(dtype), Some(dims), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(bad(line));
            };
            let dtype = dtype.parse::<DType>().map_err(|_| bad(line))?;
            let shape = if dims.is_empty() {
                Vec::new()
            } else {
                dims.split(',')
                    .map(|d| d.parse().map_err(|_| bad(line)))
                    .collect::<Result<_, _>>()?
            };
            Ok(VarInfo {
                name: name.to_owned(),
                dtype,
                shape,
            })
        })
        .collect()
}

/// `result`, once every worker has said whether its own part succeeded (the workers' one
/// end-of-step agreement, [`Workers::finish_step`](distribute_collectives::Workers::finish_step)):
/// this worker's own error when it failed; else the strategy's error naming the first worker
/// that failed, with its message; else the value. `what` is what the workers were doing. Every
/// worker must call it at the same point, so that none is left waiting in the next exchange; in
/// one process it is `result`.
pub(crate) fn agreed<T>(
    extended: &dyn StrategyExtended,
    result: Result<T, Error>,
    what: &str,
) -> Result<T, Error> {
    let Some(workers) = extended.workers() else {
        return result;
    };
    let failure = result.as_ref().err().map(|e| format!("{what}: {e}"));
    let heard = workers.finish_step(failure.as_deref());
    let value = result?;
    heard?;
    Ok(value)
}

/// Checks that every worker's manifest equals this one's (one all-gather of the manifests); the
/// error names the first variable that differs and the worker. In one process this is `Ok`.
pub(crate) fn agree_across_workers(
    extended: &dyn StrategyExtended,
    manifest: &[VarInfo],
) -> Result<(), Error> {
    let Some(workers) = extended.workers() else {
        return Ok(());
    };
    let manifests = workers.all_gather_bytes(manifest_text(manifest).as_bytes())?;
    if manifests.iter().all(|m| *m == manifests[0]) {
        return Ok(());
    }
    let chief = parse_manifest(&manifests[0])?;
    for (w, bytes) in manifests.iter().enumerate().skip(1) {
        let theirs = parse_manifest(bytes)?;
        if let Some(diff) = difference(&chief, "worker 0", &theirs, &format!("worker {w}")) {
            return Err(Error::ModelMismatch(diff));
        }
    }
    Err(Error::ModelMismatch(
        "the workers' manifests differ in variable order".into(),
    ))
}

/// The little-endian bytes of `tensor` (any of candle's dtypes), row-major.
pub(crate) fn tensor_bytes(tensor: &Tensor) -> Result<Vec<u8>, Error> {
    let flat = tensor.flatten_all()?;
    macro_rules! bytes {
        ($ty:ty) => {
            flat.to_vec1::<$ty>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect()
        };
    }
    Ok(match flat.dtype() {
        DType::U8 => flat.to_vec1::<u8>()?,
        DType::U32 => bytes!(u32),
        DType::I16 => bytes!(i16),
        DType::I32 => bytes!(i32),
        DType::I64 => bytes!(i64),
        DType::BF16 => bytes!(half::bf16),
        DType::F16 => bytes!(half::f16),
        DType::F32 => bytes!(f32),
        DType::F64 => bytes!(f64),
        other => {
            return Err(Error::UnsupportedDType {
                what: "a model variable".into(),
                dtype: other,
                integers: true,
            });
        }
    })
}

/// The variables' values (manifest order) as a safetensors buffer under their names: the one
/// format of a model's values, in files ([`DataParallel::save`](crate::DataParallel::save)),
/// checkpoints and the chief's values sent to the other workers.
pub(crate) fn to_safetensors(manifest: &[VarInfo], vars: &[Var]) -> Result<Vec<u8>, Error> {
    let named = manifest
        .iter()
        .zip(vars)
        .map(|(info, var)| (info.name.as_str(), var.as_tensor()));
    safetensors::serialize(named, None).map_err(|e| Error::Candle(candle_core::Error::wrap(e)))
}

/// The tensors of a safetensors buffer, on the host.
pub(crate) fn from_safetensors(bytes: &[u8]) -> Result<HashMap<String, Tensor>, Error> {
    Ok(candle_core::safetensors::load_buffer(bytes, &Device::Cpu)?)
}

/// The fingerprint of each variable's value, manifest order.
pub(crate) fn fingerprints(vars: &[Var]) -> Result<Vec<u64>, Error> {
    vars.iter()
        .map(|v| Ok(Fnv::new().bytes(&tensor_bytes(v.as_tensor())?).0))
        .collect()
}

/// Checks `ours` (this worker's fingerprints, manifest order) against every worker's. In one
/// process this is `Ok`.
pub(crate) fn fingerprints_agree_across_workers(
    extended: &dyn StrategyExtended,
    manifest: &[VarInfo],
    ours: &[u64],
) -> Result<(), Error> {
    let bytes: Vec<u8> = ours.iter().flat_map(|f| f.to_le_bytes()).collect();
    let Some(all) = extended.workers().map(|w| w.exchange(&bytes)).transpose()? else {
        return Ok(());
    };
    for (w, theirs) in all.iter().enumerate().skip(1) {
        if let Some(i) = (0..manifest.len())
            .find(|&i| theirs.get(i * 8..i * 8 + 8) != all[0].get(i * 8..i * 8 + 8))
        {
            return Err(Error::OutOfSync(format!(
                "variable '{}' of worker {w} differs from worker 0's",
                manifest[i].name
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(name: &str, dtype: DType, shape: &[usize]) -> VarInfo {
        VarInfo {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn differences_name_the_variable_and_both_sides() {
        let base = [
            var("l1.bias", DType::F32, &[4]),
            var("l1.weight", DType::F32, &[4, 2]),
        ];
        let cases: [(&[VarInfo], Option<&str>); 4] = [
            (&base, None),
            (
                &[
                    var("l1.bias", DType::F32, &[4]),
                    var("l1.weight", DType::F32, &[4, 3]),
                ],
                Some("variable 'l1.weight' is f32 [4, 2] on replica 0 but f32 [4, 3] on replica 2"),
            ),
            (
                &[var("l1.bias", DType::F32, &[4])],
                Some("variable 'l1.weight' of replica 0 is missing on replica 2"),
            ),
            (
                &[
                    base[0].clone(),
                    base[1].clone(),
                    var("extra", DType::F64, &[]),
                ],
                Some("variable 'extra' of replica 2 is missing on replica 0"),
            ),
        ];
        for (theirs, want) in cases {
            assert_eq!(
                difference(&base, "replica 0", theirs, "replica 2").as_deref(),
                want
            );
        }
    }

    #[test]
    fn manifests_survive_the_wire_with_padding() {
        let vars = [
            var("a", DType::BF16, &[2, 3]),
            var("scalar", DType::F64, &[]),
        ];
        let mut text = manifest_text(&vars).into_bytes();
        text.resize(text.len() + 7, 0);
        assert_eq!(parse_manifest(&text).unwrap(), vars);
        assert!(parse_manifest(b"a\tf32\n").is_err());
    }

    #[test]
    fn values_round_trip_through_safetensors() {
        let device = Device::Cpu;
        let a =
            Var::from_tensor(&Tensor::new(&[[1f32, -2.5], [0.0, 3.0]], &device).unwrap()).unwrap();
        let b = Var::from_tensor(&Tensor::new(&[7f64], &device).unwrap()).unwrap();
        let manifest = [var("a", DType::F32, &[2, 2]), var("b", DType::F64, &[1])];
        let bytes = to_safetensors(&manifest, &[a.clone(), b.clone()]).unwrap();
        let back = from_safetensors(&bytes).unwrap();
        let zeros = [
            Var::zeros((2, 2), DType::F32, &device).unwrap(),
            Var::zeros(1, DType::F64, &device).unwrap(),
        ];
        for (var, info) in zeros.iter().zip(&manifest) {
            var.set(&back[&info.name]).unwrap();
        }
        assert_eq!(
            fingerprints(&zeros).unwrap(),
            fingerprints(&[a, b]).unwrap()
        );
        assert!(from_safetensors(&bytes[1..]).is_err());
    }
}
