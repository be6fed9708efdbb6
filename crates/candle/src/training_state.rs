//! A model's whole training state as one safetensors buffer: its variables under candle's names
//! (so `VarMap::load` reads the file), its optimizer's state under `optimizer/…` and the number
//! of updates applied under `training/step`; and the checks that name what does not fit.

use std::collections::HashMap;

use candle_core::{Device, Tensor, Var};

use crate::Error;
use crate::optim::StateTensor;
use crate::precision::LossScale;
use crate::variables::VarInfo;

/// The prefix of the optimizer's entries.
const OPTIMIZER: &str = "optimizer/";
/// The entry holding the number of updates applied (`i64`, no dimensions).
const STEP: &str = "training/step";
/// f16 mixed precision's loss scale (`f64`, no dimensions).
const LOSS_SCALE: &str = "training/loss_scale";
/// The steps since its last overflow or growth (`i64`, no dimensions).
const GOOD_STEPS: &str = "training/good_steps";

/// The entry name of one slot of the optimizer's state: `optimizer/<variable>/<slot>`, or
/// `optimizer/<slot>` for a value of the whole optimizer.
fn entry_name(manifest: &[VarInfo], tensor: &StateTensor) -> Result<String, Error> {
    match tensor.var {
        None => Ok(format!("{OPTIMIZER}{}", tensor.slot)),
        Some(i) => manifest
            .get(i)
            .map(|info| format!("{OPTIMIZER}{}/{}", info.name, tensor.slot))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "the optimizer's state names variable {i} ('{}' slot), but the model has {} \
                     variables",
                    tensor.slot,
                    manifest.len()
                ))
            }),
    }
}

/// The variables, the optimizer's state and `step` as one safetensors buffer.
pub(crate) fn to_bytes(
    manifest: &[VarInfo],
    vars: &[Var],
    optimizer: Vec<StateTensor>,
    step: u64,
    loss_scale: Option<LossScale>,
) -> Result<Vec<u8>, Error> {
    let mut named: Vec<(String, Tensor)> = manifest
        .iter()
        .zip(vars)
        .map(|(info, var)| (info.name.clone(), var.as_tensor().clone()))
        .collect();
    for tensor in optimizer {
        named.push((entry_name(manifest, &tensor)?, tensor.value));
    }
    let step = i64::try_from(step)
        .map_err(|_| Error::InvalidArgument(format!("step {step} does not fit an i64")))?;
    named.push((STEP.to_owned(), Tensor::new(step, &Device::Cpu)?));
    if let Some(s) = loss_scale {
        named.push((LOSS_SCALE.to_owned(), Tensor::new(s.scale, &Device::Cpu)?));
        let good = i64::try_from(s.good_steps).unwrap_or(i64::MAX);
        named.push((GOOD_STEPS.to_owned(), Tensor::new(good, &Device::Cpu)?));
    }
    safetensors::serialize(named, None).map_err(|e| Error::Candle(candle_core::Error::wrap(e)))
}

/// Fails unless every variable's name is free of the training state's prefixes, whose entries
/// share the file with the variables.
pub(crate) fn check_names(manifest: &[VarInfo]) -> Result<(), Error> {
    match manifest
        .iter()
        .find(|v| v.name.starts_with(OPTIMIZER) || v.name.starts_with("training/"))
    {
        Some(v) => Err(Error::InvalidArgument(format!(
            "variable '{}': names starting with '{OPTIMIZER}' or 'training/' hold the training \
             state in a model's files; name the variable otherwise",
            v.name
        ))),
        None => Ok(()),
    }
}

/// A saved state taken apart: the variables, the optimizer's entries, the step.
pub(crate) struct Saved {
    /// Every entry that is neither the optimizer's nor the step: the variables.
    pub(crate) variables: HashMap<String, Tensor>,
    /// The optimizer's entries, by their full names.
    pub(crate) optimizer: HashMap<String, Tensor>,
    /// The number of updates applied, when the buffer says.
    pub(crate) step: Option<u64>,
    /// f16 mixed precision's loss scale, when the buffer has it.
    pub(crate) loss_scale: Option<LossScale>,
}

impl Saved {
    /// `tensors` (a safetensors file's) taken apart; a step entry that is not one non-negative
    /// `i64` is an error naming it.
    pub(crate) fn split(tensors: HashMap<String, Tensor>) -> Result<Saved, String> {
        let mut saved = Saved {
            variables: HashMap::new(),
            optimizer: HashMap::new(),
            step: None,
            loss_scale: None,
        };
        let mut scale = None;
        let mut good = None;
        for (name, tensor) in tensors {
            if name == STEP {
                let step = tensor
                    .to_scalar::<i64>()
                    .ok()
                    .and_then(|s| u64::try_from(s).ok())
                    .ok_or_else(|| {
                        format!(
                            "entry '{STEP}' is {} {:?}, not one non-negative i64",
                            tensor.dtype().as_str(),
                            tensor.dims()
                        )
                    })?;
                saved.step = Some(step);
            } else if name == LOSS_SCALE {
                scale = Some(
                    tensor
                        .to_scalar::<f64>()
                        .ok()
                        .filter(|s| s.is_finite() && *s >= 1.0)
                        .ok_or_else(|| format!("entry '{LOSS_SCALE}' is not one f64 from 1 on"))?,
                );
            } else if name == GOOD_STEPS {
                good = Some(
                    tensor
                        .to_scalar::<i64>()
                        .ok()
                        .and_then(|s| u64::try_from(s).ok())
                        .ok_or_else(|| {
                            format!("entry '{GOOD_STEPS}' is not one non-negative i64")
                        })?,
                );
            } else if name.starts_with(OPTIMIZER) {
                saved.optimizer.insert(name, tensor);
            } else {
                saved.variables.insert(name, tensor);
            }
        }
        saved.loss_scale = match (scale, good) {
            (Some(scale), Some(good_steps)) => Some(LossScale { scale, good_steps }),
            (None, None) => None,
            (Some(_), None) => return Err(format!("has '{LOSS_SCALE}' but no '{GOOD_STEPS}'")),
            (None, Some(_)) => return Err(format!("has '{GOOD_STEPS}' but no '{LOSS_SCALE}'")),
        };
        Ok(saved)
    }

    /// The loss scale an f16 model resumes with: the saved one; a state with training entries
    /// but none is refused, naming the entry.
    pub(crate) fn loss_scale_for(&self) -> Result<Option<LossScale>, String> {
        match (self.loss_scale, self.has_training_state()) {
            (Some(s), _) => Ok(Some(s)),
            (None, false) => Ok(None),
            (None, true) => Err(format!(
                "has no entry '{LOSS_SCALE}', which f16 mixed precision keeps (a checkpoint of \
                 another precision?)"
            )),
        }
    }

    /// Whether the buffer holds any training state beyond the variables.
    pub(crate) fn has_training_state(&self) -> bool {
        self.step.is_some() || !self.optimizer.is_empty()
    }
}

/// The values for `optimizer`'s state, in its order, from `entries` (a saved state's optimizer
/// entries, all of which must be used); the error names the first entry that is missing, has
/// another dtype or shape, or that this optimizer does not have.
pub(crate) fn optimizer_values(
    manifest: &[VarInfo],
    expected: &[StateTensor],
    entries: &HashMap<String, Tensor>,
) -> Result<Vec<Tensor>, String> {
    let mut values = Vec::new();
    let mut used = 0;
    for slot in expected {
        let name = entry_name(manifest, slot).map_err(|e| e.to_string())?;
        let value = entries
            .get(&name)
            .ok_or_else(|| format!("has no optimizer entry '{name}', which the optimizer has"))?;
        if value.dtype() != slot.value.dtype() || value.dims() != slot.value.dims() {
            return Err(format!(
                "optimizer entry '{name}' is {} {:?}, the optimizer's is {} {:?}",
                value.dtype().as_str(),
                value.dims(),
                slot.value.dtype().as_str(),
                slot.value.dims()
            ));
        }
        values.push(value.clone());
        used += 1;
    }
    if used != entries.len() {
        let extra = entries
            .keys()
            .filter(|name| {
                !expected
                    .iter()
                    .any(|slot| entry_name(manifest, slot).is_ok_and(|n| &n == *name))
            })
            .min()
            .cloned()
            .unwrap_or_default();
        return Err(format!(
            "has optimizer entry '{extra}', which the optimizer does not (another optimizer?)"
        ));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use candle_core::DType;
    use candle_nn::Optimizer;

    use super::*;
    use crate::optim::{AdamW, OptimizerState};

    fn model() -> (Vec<VarInfo>, Vec<Var>) {
        let vars = vec![
            Var::ones((2, 3), DType::F32, &Device::Cpu).unwrap(),
            Var::zeros(3, DType::F32, &Device::Cpu).unwrap(),
        ];
        let manifest = ["l.bias", "l.weight"]
            .iter()
            .zip(&vars)
            .map(|(name, var)| VarInfo {
                name: (*name).to_owned(),
                dtype: var.dtype(),
                shape: var.dims().to_vec(),
            })
            .collect();
        (manifest, vars)
    }

    #[test]
    fn the_state_goes_through_bytes_and_back_with_its_entries_named() {
        let (manifest, vars) = model();
        let optimizer = AdamW::new(vars.clone(), Default::default()).unwrap();
        let bytes = to_bytes(&manifest, &vars, optimizer.state(), 7, None).unwrap();
        let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).unwrap();
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        insta::assert_debug_snapshot!(names);
        let saved = Saved::split(tensors).unwrap();
        assert_eq!(saved.step, Some(7));
        assert_eq!(saved.variables.len(), 2);
        let values = optimizer_values(&manifest, &optimizer.state(), &saved.optimizer).unwrap();
        assert_eq!(values.len(), optimizer.state().len());
    }

    #[test]
    fn a_missing_a_mis_shaped_or_a_foreign_entry_is_named() {
        let (manifest, vars) = model();
        let optimizer = AdamW::new(vars.clone(), Default::default()).unwrap();
        let bytes = to_bytes(&manifest, &vars, optimizer.state(), 1, None).unwrap();
        let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).unwrap();
        let saved = Saved::split(tensors).unwrap();

        let mut missing = saved.optimizer.clone();
        missing.remove("optimizer/l.weight/exp_avg_sq");
        let err = optimizer_values(&manifest, &optimizer.state(), &missing).unwrap_err();
        assert_eq!(
            err,
            "has no optimizer entry 'optimizer/l.weight/exp_avg_sq', which the optimizer has"
        );

        let mut reshaped = saved.optimizer.clone();
        reshaped.insert(
            "optimizer/l.bias/exp_avg".into(),
            Tensor::zeros((3, 2), DType::F32, &Device::Cpu).unwrap(),
        );
        let err = optimizer_values(&manifest, &optimizer.state(), &reshaped).unwrap_err();
        assert_eq!(
            err,
            "optimizer entry 'optimizer/l.bias/exp_avg' is f32 [3, 2], the optimizer's is f32 \
             [2, 3]"
        );

        let sgd = candle_nn::SGD::new(vars, 0.1).unwrap();
        let err = optimizer_values(&manifest, &sgd.state(), &saved.optimizer).unwrap_err();
        assert!(err.starts_with("has optimizer entry 'optimizer/"), "{err}");
        assert!(
            err.ends_with("which the optimizer does not (another optimizer?)"),
            "{err}"
        );
    }

    #[test]
    fn a_variable_may_not_take_the_training_state_s_names() {
        let (mut manifest, _) = model();
        check_names(&manifest).unwrap();
        manifest[0].name = "optimizer/x".into();
        let err = check_names(&manifest).unwrap_err().to_string();
        assert!(
            err.starts_with("variable 'optimizer/x': names starting with"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_step_entry_is_named() {
        let tensors = HashMap::from([(
            STEP.to_owned(),
            Tensor::new(&[1.5f32], &Device::Cpu).unwrap(),
        )]);
        let err = Saved::split(tensors).err().unwrap();
        assert_eq!(
            err,
            "entry 'training/step' is f32 [1], not one non-negative i64"
        );
    }
}
