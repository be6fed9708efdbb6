//! Tidy tests: invariants of the workspace checked by ordinary `#[test]`s instead of by memory.
//! A missing file, table or section fails; nothing here skips.
//!
//! - [`crate_map`]: `docs/architecture.md` holds a table of every workspace crate, its kind and
//!   the workspace crates it may depend on. Every dependency (normal, dev or build) of every
//!   workspace crate on another one must be in its row, a *dev-only* crate may appear only as a
//!   dev-dependency, and the table and the workspace must list the same crates.
//! - [`invariants`]: the same document's "Invariants" section has one bullet per workspace crate
//!   and none for a crate that does not exist.
//! - [`licences`]: every package the workspace can reach, with every feature, has a `license`
//!   expression that the allowed licences satisfy ([`spdx`] evaluates it); workspace crates say
//!   the workspace's `Apache-2.0`.
//! - [`facade`]: a CPU-only build of the facade compiles no cryptography, MPI or CUDA.
//! - [`cycles`]: no two files of a crate name each other, directly or around a circle (today's
//!   cycles are listed and may only go).
//! - [`single_copies`]: one FNV-1a and one dtype dispatch macro in the tree (today's copies are
//!   listed and may only go).
//! - [`poison`]: no library handles lock poisoning itself; its locks are `distribute_values::Lock`
//!   (the exceptions are listed, each with why).
//! - [`source`]: the lexical reading of Rust that the last three share.
//! - Here: every library crate has a `//!` header on every module, and inherits the workspace
//!   lints.

mod crate_map;
mod cycles;
mod facade;
mod invariants;
mod licences;
mod poison;
mod single_copies;
mod source;
mod spdx;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The document that holds the crate map and the invariants, relative to the workspace root.
const ARCHITECTURE_DOC: &str = "docs/architecture.md";

/// A dependency of one workspace crate on another, as `Cargo.toml` declares it.
#[derive(Clone, Debug)]
struct Dependency {
    name: String,
    /// `normal`, `dev` or `build`.
    kind: String,
}

/// A workspace crate.
struct Package {
    name: String,
    manifest: PathBuf,
    /// Workspace packages it depends on, every dependency kind.
    deps: Vec<Dependency>,
}

fn workspace_root() -> PathBuf {
    crate::cargo::workspace_root()
}

/// The text of [`ARCHITECTURE_DOC`]; panics (fails the test) when it is missing.
fn architecture_doc() -> String {
    let path = workspace_root().join(ARCHITECTURE_DOC);
    std::fs::read_to_string(&path).unwrap_or_else(|err| {
        panic!(
            "{} is missing ({err}): it holds the crate map and the invariants tidy checks",
            path.display()
        )
    })
}

/// `cargo metadata --format-version 1 <args>` of the workspace, parsed; the error is cargo's.
fn cargo_metadata(args: &[&str]) -> Result<Value, String> {
    let output = std::process::Command::new(crate::cargo::cargo_program())
        .args(["metadata", "--format-version", "1"])
        .args(args)
        .current_dir(workspace_root())
        .output()
        .map_err(|err| format!("cargo metadata did not start: {err}"))?;
    if !output.status.success() {
        return Err(format!(
            "`cargo metadata {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|err| format!("cargo metadata printed no JSON: {err}"))
}

/// Every workspace package, from `cargo metadata`.
fn workspace_packages() -> Vec<Package> {
    let metadata =
        cargo_metadata(&["--no-deps", "--offline"]).unwrap_or_else(|err| panic!("{err}"));
    let members: Vec<&str> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().unwrap().to_owned(),
            manifest: PathBuf::from(p["manifest_path"].as_str().unwrap()),
            deps: p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| members.contains(&d["name"].as_str().unwrap()))
                .map(|d| Dependency {
                    name: d["name"].as_str().unwrap().to_owned(),
                    kind: d["kind"].as_str().unwrap_or("normal").to_owned(),
                })
                .collect(),
        })
        .collect()
}

/// The workspace's library packages (everything but xtask).
fn library_packages() -> Vec<Package> {
    workspace_packages()
        .into_iter()
        .filter(|p| p.name != "xtask")
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Checks a checker's `violations` against `expected`, in order: each violation contains its
/// expected line (the tests of every check on its synthetic input).
#[cfg(test)]
fn assert_violations(violations: &[String], expected: &[&str]) {
    assert_eq!(violations.len(), expected.len(), "{violations:#?}");
    for (violation, expected) in violations.iter().zip(expected) {
        assert!(violation.contains(expected), "{violation}");
    }
}

#[test]
fn every_library_module_starts_with_a_doc_header() {
    let mut missing = Vec::new();
    for package in library_packages() {
        let mut files = Vec::new();
        rust_files(&package.manifest.parent().unwrap().join("src"), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let first = text.lines().find(|line| !line.trim().is_empty());
            if !first.is_some_and(|line| line.starts_with("//!")) {
                missing.push(file.display().to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules without a `//!` header (say the layer and what the module is for):\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_crate_inherits_the_workspace_lints() {
    let mut offenders = BTreeMap::new();
    for package in library_packages() {
        let manifest = std::fs::read_to_string(&package.manifest).unwrap();
        if !manifest.contains("[lints]\nworkspace = true") {
            offenders.insert(package.name, package.manifest);
        }
    }
    assert!(
        offenders.is_empty(),
        "add `[lints]\\nworkspace = true` to: {offenders:#?}"
    );
}
