//! Tidy tests: invariants of the workspace checked by ordinary `#[test]`s instead of by memory.
//!
//! - The crate map: `docs/architecture.md` holds a table of every workspace crate, its kind and
//!   the workspace crates it may depend on. Every dependency (normal, dev or build) of every
//!   workspace crate on another one must be in its row, a *dev-only* crate may appear only as a
//!   dev-dependency, and the table and the workspace must list the same crates. A missing file
//!   or a missing row fails; nothing here skips.
//! - Every library crate has a `//!` header on every module, and inherits the workspace lints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The document that holds the crate map, relative to the workspace root.
const MAP_DOCUMENT: &str = "docs/architecture.md";
/// The map's kind for crates that may only be dev-dependencies.
const DEV_ONLY: &str = "dev-only";

/// One row of the crate map.
#[derive(Debug, PartialEq, Eq)]
struct MapEntry {
    kind: String,
    /// The workspace crates it may depend on.
    allowed: Vec<String>,
}

/// A dependency of one workspace crate on another, as `Cargo.toml` declares it.
#[derive(Clone, Debug)]
struct Dependency {
    name: String,
    /// `normal`, `dev` or `build`.
    kind: String,
}

struct Package {
    name: String,
    manifest: PathBuf,
    /// Workspace packages it depends on, every dependency kind.
    deps: Vec<Dependency>,
}

fn workspace_root() -> PathBuf {
    crate::workspace_root()
}

/// Every workspace package, from `cargo metadata`.
fn workspace_packages() -> Vec<Package> {
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

/// The crate map in the markdown `text`: the rows of the table whose header starts with
/// `| package |`, each `` | `name` | folder | kind | `dep`, `dep` or — | ``.
fn parse_map(text: &str) -> Result<BTreeMap<String, MapEntry>, String> {
    let mut lines = text
        .lines()
        .skip_while(|line| !line.starts_with("| package |"));
    if lines.next().is_none() {
        return Err("no table with a `| package |` header".to_owned());
    }
    let mut map = BTreeMap::new();
    for line in lines.skip(1).take_while(|line| line.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [package, _folder, kind, allowed] = cells[..] else {
            return Err(format!("a row needs 4 cells: {line}"));
        };
        let name = package
            .strip_prefix('`')
            .and_then(|rest| rest.strip_suffix('`'))
            .ok_or_else(|| format!("the package cell must be `name`: {line}"))?;
        let allowed = if allowed == "—" {
            Vec::new()
        } else {
            allowed
                .split(',')
                .map(|dep| {
                    dep.trim()
                        .strip_prefix('`')
                        .and_then(|rest| rest.strip_suffix('`'))
                        .map(str::to_owned)
                        .ok_or_else(|| format!("dependencies must be `name`s or —: {line}"))
                })
                .collect::<Result<_, _>>()?
        };
        let entry = MapEntry {
            kind: kind.to_owned(),
            allowed,
        };
        if map.insert(name.to_owned(), entry).is_some() {
            return Err(format!("'{name}' has two rows"));
        }
    }
    if map.is_empty() {
        return Err("the crate map has no rows".to_owned());
    }
    Ok(map)
}

/// The crate map of the workspace, read from [`MAP_DOCUMENT`]; panics (fails the test) when
/// the file is missing or its table does not parse.
fn crate_map() -> BTreeMap<String, MapEntry> {
    let path = workspace_root().join(MAP_DOCUMENT);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| {
        panic!(
            "{} is missing ({err}): it holds the crate map tidy checks",
            path.display()
        )
    });
    parse_map(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Every difference between `packages` and `map`, as readable lines.
fn map_violations(packages: &[Package], map: &BTreeMap<String, MapEntry>) -> Vec<String> {
    let mut violations = Vec::new();
    for package in packages {
        let Some(entry) = map.get(&package.name) else {
            violations.push(format!(
                "package '{}' is not in the crate map: add its row to {MAP_DOCUMENT}",
                package.name
            ));
            continue;
        };
        for dep in &package.deps {
            if !entry.allowed.contains(&dep.name) {
                violations.push(format!(
                    "'{}' depends ({}) on '{}', which its row in {MAP_DOCUMENT} does not allow",
                    package.name, dep.kind, dep.name
                ));
            }
            if map.get(&dep.name).is_some_and(|d| d.kind == DEV_ONLY) && dep.kind != "dev" {
                violations.push(format!(
                    "'{}' depends ({}) on '{}', which is dev-only: make it a dev-dependency",
                    package.name, dep.kind, dep.name
                ));
            }
        }
    }
    for (name, entry) in map {
        if !packages.iter().any(|p| &p.name == name) {
            violations.push(format!(
                "'{name}' has a row in {MAP_DOCUMENT} but is no workspace crate"
            ));
        }
        for allowed in &entry.allowed {
            if !map.contains_key(allowed) {
                violations.push(format!(
                    "'{name}' may depend on '{allowed}', which has no row in {MAP_DOCUMENT}"
                ));
            }
        }
    }
    violations
}

#[test]
fn every_crate_depends_only_on_what_the_crate_map_allows() {
    let violations = map_violations(&workspace_packages(), &crate_map());
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_crate_map_parses_and_the_check_catches_each_kind_of_violation() {
    let text = "intro\n\n| package | folder | kind | may depend on |\n|---|---|---|---|\n\
                | `a` | crates/a | library | — |\n\
                | `b` | crates/b | library | `a`, `t` |\n\
                | `t` | crates/t | dev-only | — |\n\
                | `gone` | crates/gone | library | `nowhere` |\n\nafter\n";
    let map = parse_map(text).unwrap();
    assert_eq!(map["b"].allowed, ["a", "t"]);
    assert_eq!(map["t"].kind, DEV_ONLY);
    let dep = |name: &str, kind: &str| Dependency {
        name: name.into(),
        kind: kind.into(),
    };
    let package = |name: &str, deps: Vec<Dependency>| Package {
        name: name.into(),
        manifest: PathBuf::new(),
        deps,
    };
    let packages = [
        package("a", vec![dep("b", "dev")]),
        package("b", vec![dep("a", "normal"), dep("t", "build")]),
        package("t", vec![]),
        package("mystery", vec![]),
    ];
    let violations = map_violations(&packages, &map);
    let expected = [
        "'a' depends (dev) on 'b', which its row",
        "'b' depends (build) on 't', which is dev-only",
        "package 'mystery' is not in the crate map",
        "'gone' has a row in docs/architecture.md but is no workspace crate",
        "'gone' may depend on 'nowhere', which has no row",
    ];
    assert_eq!(violations.len(), expected.len(), "{violations:#?}");
    for (violation, expected) in violations.iter().zip(expected) {
        assert!(violation.contains(expected), "{violation}");
    }

    assert!(parse_map("no table here").is_err());
    let two_rows = "| package | f | k | d |\n|-|-|-|-|\n| `a` | f | k | — |\n| `a` | f | k | — |\n";
    assert!(parse_map(two_rows).unwrap_err().contains("two rows"));
    let bad_dep = "| package | f | k | d |\n|-|-|-|-|\n| `a` | f | k | b |\n";
    assert!(parse_map(bad_dep).is_err());
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
