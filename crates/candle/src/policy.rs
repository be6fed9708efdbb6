//! How each variable's copies are kept identical: trained by the optimizer from the reduced
//! gradients, or, for buffers that change outside the optimizer (batch normalisation's running
//! statistics), averaged or taken from replica 0 after every step, or left per replica.

use crate::Error;
use crate::variables::VarInfo;

/// How the copies of a variable are kept across replicas and workers ([`Config::var_policies`]).
///
/// [`Config::var_policies`]: crate::Config::var_policies
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarPolicy {
    /// Updated by each replica's optimizer from the reduced gradients, so every copy stays
    /// bit-identical: every variable no rule names.
    Trained,
    /// A buffer: after each step every copy takes the mean of the copies over all replicas and
    /// workers (one all-reduce for all such buffers, in name order), so the copies stay
    /// bit-identical and the statistics see every replica's batches.
    Mean,
    /// A buffer: after each step every copy takes global replica 0's (the chief's first
    /// replica's), as PyTorch DDP's `broadcast_buffers` does.
    FirstReplica,
    /// A buffer each replica keeps for itself: [`check_in_sync`] skips it, and [`save`] and
    /// checkpoints write the copy of the saving process's first replica (the chief's for
    /// `Checkpoints`, global replica 0's).
    ///
    /// [`check_in_sync`]: crate::DataParallel::check_in_sync
    /// [`save`]: crate::DataParallel::save
    PerReplica,
}

/// candle-nn's `batch_norm` running statistics (`<prefix>.running_mean`, `<prefix>.running_var`)
/// averaged over every replica and worker after each step.
pub const BATCH_NORM_MEAN: &[(&str, VarPolicy)] = &[
    ("running_mean", VarPolicy::Mean),
    ("running_var", VarPolicy::Mean),
];

/// Whether rule `pattern` names variable `name`: the whole name, or its last dotted parts
/// (`running_mean` names `bn1.running_mean`; `bn1.running_mean` names only that one).
fn names(pattern: &str, name: &str) -> bool {
    name == pattern
        || name
            .strip_suffix(pattern)
            .is_some_and(|head| head.ends_with('.'))
}

/// Each variable's policy, in manifest order: the first rule that names it, else
/// [`VarPolicy::Trained`]. A rule that names no variable is an error naming it (a misspelt
/// buffer would otherwise go unsynchronized).
pub(crate) fn resolve(
    manifest: &[VarInfo],
    rules: &[(&str, VarPolicy)],
) -> Result<Vec<VarPolicy>, Error> {
    for (pattern, _) in rules {
        if !manifest.iter().any(|v| names(pattern, &v.name)) {
            return Err(Error::InvalidArgument(format!(
                "Config::var_policies names '{pattern}', but no variable of the model is called \
                 that or ends with '.{pattern}'"
            )));
        }
    }
    Ok(manifest
        .iter()
        .map(|v| {
            rules
                .iter()
                .find(|(pattern, _)| names(pattern, &v.name))
                .map_or(VarPolicy::Trained, |(_, policy)| *policy)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use candle_core::DType;

    use super::*;

    fn manifest(names: &[&str]) -> Vec<VarInfo> {
        names
            .iter()
            .map(|n| VarInfo {
                name: (*n).to_owned(),
                dtype: DType::F32,
                shape: vec![2],
            })
            .collect()
    }

    #[test]
    fn rules_name_whole_names_or_dotted_tails_first_rule_wins() {
        let m = manifest(&[
            "bn.running_mean",
            "bn.running_var",
            "bn.weight",
            "xrunning_mean",
        ]);
        let rules = [
            ("bn.running_var", VarPolicy::PerReplica),
            ("running_mean", VarPolicy::Mean),
            ("running_var", VarPolicy::Mean),
        ];
        assert_eq!(
            resolve(&m, &rules).unwrap(),
            [
                VarPolicy::Mean,
                VarPolicy::PerReplica,
                VarPolicy::Trained,
                VarPolicy::Trained
            ]
        );
    }

    #[test]
    fn a_rule_that_names_nothing_is_refused() {
        let m = manifest(&["bn.running_mean"]);
        let err = resolve(&m, &[("runing_mean", VarPolicy::Mean)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Config::var_policies names 'runing_mean', but no variable of the model is called \
             that or ends with '.runing_mean'"
        );
    }
}
