//! Tidy tests: invariants of the workspace checked by ordinary `#[test]`s instead of by memory.
//!
//! - Layering: a library crate may depend (normal, dev or build) only on crates above it in
//!   [`LAYERS`], the order of ARCHITECTURE.md's crate map. A proc-macro companion named
//!   `<package>-derive` sits in the layer of `<package>`.
//! - Every library crate has a `//!` header on every module, and inherits the workspace lints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The crate map, bottom-up: a crate may depend only on crates listed before it.
const LAYERS: &[&str] = &[
    // Dev-only and depending on no workspace crate: any crate's tests and benches may use it.
    "distribute-test-support",
    "distribute-device-spec",
    "distribute-values",
    "distribute-collectives",
    "distribute-input",
    "distribute-strategy",
    "distribute-mirrored",
    "distribute-pjrt",
    "distribute-tpu",
    "distribute",
    // An application on top of the facade; nothing depends on it.
    "distribute-demo",
];

struct Package {
    name: String,
    manifest: PathBuf,
    /// Workspace packages it depends on, any dependency kind.
    deps: Vec<String>,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The workspace's library packages (everything but xtask), from `cargo metadata`.
fn library_packages() -> Vec<Package> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
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
        .filter(|p| p["name"] != "xtask")
        .map(|p| Package {
            name: p["name"].as_str().unwrap().to_owned(),
            manifest: PathBuf::from(p["manifest_path"].as_str().unwrap()),
            deps: p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["name"].as_str().unwrap())
                .filter(|name| members.contains(name))
                .map(str::to_owned)
                .collect(),
        })
        .collect()
}

/// The layer of a package: its index in [`LAYERS`], derive companions sharing their parent's.
fn layer_of(package: &str) -> Option<usize> {
    let base = package.strip_suffix("-derive").unwrap_or(package);
    LAYERS.iter().position(|layer| *layer == base)
}

/// Every violation of the layering rule, as readable lines.
fn layering_violations(packages: &[Package]) -> Vec<String> {
    let mut violations = Vec::new();
    for package in packages {
        let Some(layer) = layer_of(&package.name) else {
            violations.push(format!(
                "package '{}' is not in the crate map: add it to LAYERS in xtask/src/tidy.rs \
                 and to ARCHITECTURE.md",
                package.name
            ));
            continue;
        };
        for dep in &package.deps {
            match layer_of(dep) {
                Some(dep_layer) if dep_layer < layer => {}
                // A derive crate's parent re-exports it, so the parent may depend on it.
                Some(dep_layer) if dep_layer == layer && dep.ends_with("-derive") => {}
                Some(_) => violations.push(format!(
                    "'{}' depends on '{dep}', which is not below it in the crate map",
                    package.name
                )),
                None => violations.push(format!(
                    "'{}' depends on '{dep}', which is not in the crate map",
                    package.name
                )),
            }
        }
    }
    violations
}

#[test]
fn crates_depend_only_on_lower_layers() {
    let violations = layering_violations(&library_packages());
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn layering_check_catches_an_upward_dependency() {
    let packages = [
        Package {
            name: "distribute-values".into(),
            manifest: PathBuf::new(),
            deps: vec!["distribute-collectives".into()],
        },
        Package {
            name: "distribute-mystery".into(),
            manifest: PathBuf::new(),
            deps: vec![],
        },
        Package {
            name: "distribute-values-derive".into(),
            manifest: PathBuf::new(),
            deps: vec!["distribute-device-spec".into()],
        },
    ];
    let violations = layering_violations(&packages);
    assert_eq!(violations.len(), 2, "{violations:#?}");
    assert!(violations[0].contains("depends on 'distribute-collectives'"));
    assert!(violations[1].contains("'distribute-mystery' is not in the crate map"));
}

/// The crate map in ../shared/ARCHITECTURE.md (when the checkout has it beside it, as CI does)
/// lists the packages in the same order as [`LAYERS`].
#[test]
fn layers_match_the_architecture_document() {
    let doc = workspace_root().join("../shared/ARCHITECTURE.md");
    let Ok(text) = std::fs::read_to_string(&doc) else {
        eprintln!("note: {} not found; order not cross-checked", doc.display());
        return;
    };
    let documented: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("| crates/"))
        .filter_map(|line| line.split('|').nth(2))
        .map(str::trim)
        .collect();
    assert_eq!(documented, LAYERS, "ARCHITECTURE.md and LAYERS disagree");
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
