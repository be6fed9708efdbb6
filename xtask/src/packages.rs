//! The workspace's packages as `cargo metadata` describes them: which build with MPI (those with
//! an `mpi` feature, and those that need MPI whatever their features), which have an `nccl`
//! feature, which package an example belongs to, and what the plain builds (no MPI, no CUDA)
//! leave out.
//!
//! The packages are found in `cargo metadata` rather than listed here, so a crate that gains
//! the feature is linted and tested without touching xtask.

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::cargo::metadata;

/// The feature that builds a package with MPI.
pub(crate) const FEATURE: &str = "mpi";

/// The workspace packages that build with MPI: those with an `mpi` feature, and those that need
/// MPI whatever their features (`distribute-mpi`, and what depends on it unconditionally).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MpiPackages {
    /// Packages with an `mpi` feature, sorted: built with it on.
    pub(crate) featured: Vec<String>,
    /// Packages that need MPI to build at all, sorted: left out of the workspace's plain builds
    /// (`--exclude`) and built only with MPI provisioned.
    pub(crate) only: Vec<String>,
}

impl MpiPackages {
    /// The MPI packages of `metadata` (`cargo metadata --no-deps`).
    pub(crate) fn of(metadata: &Value) -> MpiPackages {
        MpiPackages {
            featured: feature_packages(metadata),
            only: mpi_only_packages(metadata),
        }
    }

    /// Every MPI package, sorted.
    pub(crate) fn all(&self) -> Vec<String> {
        let mut all: Vec<String> = self.featured.iter().chain(&self.only).cloned().collect();
        all.sort();
        all.dedup();
        all
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.featured.is_empty() && self.only.is_empty()
    }

    /// `--package P` for every MPI package, and `--features` for those with the feature.
    pub(crate) fn cargo_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for package in self.all() {
            args.extend(["--package".to_owned(), package]);
        }
        if !self.featured.is_empty() {
            args.extend(["--features".to_owned(), feature_list(&self.featured)]);
        }
        args
    }
}

/// The workspace packages that need MPI to build whatever their features, from `cargo
/// metadata`: a normal, non-optional dependency on the `mpi` crate or on such a package.
pub(crate) fn mpi_only_packages(metadata: &Value) -> Vec<String> {
    let packages: Vec<&Value> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let mut only: Vec<String> = Vec::new();
    loop {
        let before = only.len();
        for package in &packages {
            let Some(name) = package["name"].as_str() else {
                continue;
            };
            if only.iter().any(|o| o == name) {
                continue;
            }
            let needs_mpi = package["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|dep| dep["kind"].is_null() && dep["optional"] != true)
                .filter_map(|dep| dep["name"].as_str())
                .any(|dep| dep == "mpi" || only.iter().any(|o| o == dep));
            if needs_mpi {
                only.push(name.to_owned());
            }
        }
        if only.len() == before {
            break;
        }
    }
    only.sort();
    only
}

/// The workspace's packages that need MPI to build, from `cargo metadata`.
pub(crate) fn workspace_mpi_only_packages() -> Result<Vec<String>> {
    Ok(mpi_only_packages(&metadata()?))
}

/// The workspace packages that declare an `mpi` feature, sorted.
pub(crate) fn feature_packages(metadata: &Value) -> Vec<String> {
    let mut packages: Vec<String> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|package| package["features"].get(FEATURE).is_some())
        .filter_map(|package| package["name"].as_str().map(str::to_owned))
        .collect();
    packages.sort();
    packages
}

/// The package that has example `example`, or an error naming the examples there are.
pub(crate) fn package_of_example(metadata: &Value, example: &str) -> Result<String> {
    let mut examples = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        for target in package["targets"].as_array().into_iter().flatten() {
            let is_example = target["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "example"));
            if !is_example {
                continue;
            }
            let name = target["name"].as_str().unwrap_or_default();
            if name == example {
                return package["name"]
                    .as_str()
                    .map(str::to_owned)
                    .context("a package without a name in `cargo metadata`");
            }
            examples.push(name.to_owned());
        }
    }
    examples.sort();
    bail!(
        "no example named '{example}' in the workspace; examples: {}",
        examples.join(", ")
    )
}

/// Fails unless `package` has the `mpi` feature that `name` needs to run multi-worker.
pub(crate) fn require_feature(metadata: &Value, package: &str, name: &str) -> Result<()> {
    if !MpiPackages::of(metadata).all().iter().any(|p| p == package) {
        bail!("package {package} has no `{FEATURE}` feature, so {name} cannot run multi-worker");
    }
    Ok(())
}

/// `PACKAGE/mpi` for each package, comma-separated: one `--features` value for all of them.
pub(crate) fn feature_list(packages: &[String]) -> String {
    packages
        .iter()
        .map(|package| format!("{package}/{FEATURE}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Those of `packages` that have an `nccl` feature.
pub(crate) fn nccl_packages(metadata: &Value, packages: &[String]) -> Vec<String> {
    metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|package| package["features"].get("nccl").is_some())
        .filter_map(|package| package["name"].as_str())
        .filter(|name| packages.iter().any(|p| p == name))
        .map(str::to_owned)
        .collect()
}

/// `--exclude P` for every package the workspace's plain builds (no MPI, no CUDA) leave out: those
/// that need MPI to build (`test-mpi` and `ci`'s MPI lint take them, with MPI provisioned) and
/// those that need CUDA whatever their features (the GPU lints and the GPU bundle take them;
/// built with the others, they would turn on collectives' `cuda` for every crate).
pub(crate) fn plain_build_excludes() -> Result<Vec<String>> {
    let mut packages = workspace_mpi_only_packages()?;
    packages.extend(crate::test_gpu::gpu_only_packages().map(str::to_owned));
    Ok(packages
        .into_iter()
        .flat_map(|package| ["--exclude".to_owned(), package])
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    const METADATA: &str = r#"{"target_directory":"/t","packages":[
        {"name":"distribute-mirrored","features":{"mpi":["dep:mpi"],"nccl":[]},"targets":[{"kind":["lib"],"name":"distribute_mirrored"}],
         "dependencies":[{"name":"mpi","kind":null,"optional":true}]},
        {"name":"distribute","features":{"mpi":["distribute-mirrored/mpi"]},"targets":[{"kind":["lib"],"name":"distribute"},{"kind":["example"],"name":"linear_regression"}],
         "dependencies":[{"name":"distribute-multi-worker","kind":null,"optional":true}]},
        {"name":"distribute-input","features":{},"targets":[{"kind":["example"],"name":"csv_demo"}],
         "dependencies":[{"name":"distribute-mpi","kind":"dev","optional":false}]},
        {"name":"distribute-multi-worker","features":{},"targets":[{"kind":["example"],"name":"multi_worker_bench"}],
         "dependencies":[{"name":"distribute-mpi","kind":null,"optional":false}]},
        {"name":"distribute-mpi","features":{"nccl":[]},"targets":[{"kind":["lib"],"name":"distribute_mpi"}],
         "dependencies":[{"name":"mpi","kind":null,"optional":false}]}
    ]}"#;

    #[test]
    fn packages_that_need_mpi_whatever_their_features_are_found_through_their_dependencies() {
        let metadata: Value = serde_json::from_str(METADATA).unwrap();
        // An optional dependency or a dev-dependency does not make a package need MPI.
        assert_eq!(
            mpi_only_packages(&metadata),
            ["distribute-mpi", "distribute-multi-worker"]
        );
        require_feature(&metadata, "distribute-multi-worker", "multi_worker_bench").unwrap();
    }

    #[test]
    fn the_mpi_packages_and_examples_come_from_metadata() {
        let metadata: Value = serde_json::from_str(METADATA).unwrap();
        assert_eq!(
            feature_packages(&metadata),
            ["distribute", "distribute-mirrored"]
        );
        assert_eq!(
            package_of_example(&metadata, "linear_regression").unwrap(),
            "distribute"
        );
        let err = package_of_example(&metadata, "nope")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no example named 'nope'") && err.contains("csv_demo, linear_regression"),
            "{err}"
        );
        let err = require_feature(&metadata, "distribute-input", "csv_demo")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no `mpi` feature"), "{err}");
    }

    #[test]
    fn the_nccl_packages_come_from_metadata() {
        let metadata: Value = serde_json::from_str(METADATA).unwrap();
        assert_eq!(
            nccl_packages(
                &metadata,
                &strings(&["distribute-mirrored", "distribute-mpi"])
            ),
            ["distribute-mirrored", "distribute-mpi"]
        );
    }
}
