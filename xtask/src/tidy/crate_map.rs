//! The crate map: the table in `docs/architecture.md` of every workspace crate, its kind and the
//! workspace crates it may depend on, checked against every crate's `Cargo.toml`.

use std::collections::BTreeMap;
#[cfg(test)]
use std::path::PathBuf;

use super::{ARCHITECTURE_DOC, Dependency, Package};

/// The map's kind for crates that may only be dev-dependencies.
const DEV_ONLY: &str = "dev-only";

/// One row of the crate map.
#[derive(Debug, PartialEq, Eq)]
struct MapEntry {
    kind: String,
    /// The workspace crates it may depend on.
    allowed: Vec<String>,
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

/// The crate map of the workspace, read from [`ARCHITECTURE_DOC`]; panics (fails the test) when
/// the file is missing or its table does not parse.
fn crate_map() -> BTreeMap<String, MapEntry> {
    parse_map(&super::architecture_doc()).unwrap_or_else(|err| panic!("{ARCHITECTURE_DOC}: {err}"))
}

/// Every difference between `packages` and `map`, as readable lines.
fn map_violations(packages: &[Package], map: &BTreeMap<String, MapEntry>) -> Vec<String> {
    let mut violations = Vec::new();
    for package in packages {
        let Some(entry) = map.get(&package.name) else {
            violations.push(format!(
                "package '{}' is not in the crate map: add its row to {ARCHITECTURE_DOC}",
                package.name
            ));
            continue;
        };
        for dep in &package.deps {
            if !entry.allowed.contains(&dep.name) {
                violations.push(format!(
                    "'{}' depends ({}) on '{}', which its row in {ARCHITECTURE_DOC} does not allow",
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
                "'{name}' has a row in {ARCHITECTURE_DOC} but is no workspace crate"
            ));
        }
        for allowed in &entry.allowed {
            if !map.contains_key(allowed) {
                violations.push(format!(
                    "'{name}' may depend on '{allowed}', which has no row in {ARCHITECTURE_DOC}"
                ));
            }
        }
    }
    violations
}

#[test]
fn every_crate_depends_only_on_what_the_crate_map_allows() {
    let violations = map_violations(&super::workspace_packages(), &crate_map());
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
    super::assert_violations(&violations, &expected);

    assert!(parse_map("no table here").is_err());
    let two_rows = "| package | f | k | d |\n|-|-|-|-|\n| `a` | f | k | — |\n| `a` | f | k | — |\n";
    assert!(parse_map(two_rows).unwrap_err().contains("two rows"));
    let bad_dep = "| package | f | k | d |\n|-|-|-|-|\n| `a` | f | k | b |\n";
    assert!(parse_map(bad_dep).is_err());
}
