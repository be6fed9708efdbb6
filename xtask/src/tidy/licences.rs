//! Licences of the dependency tree: every package the workspace can reach (every feature, every
//! target platform, as `Cargo.lock` pins it) must declare an SPDX `license` expression that
//! [`ALLOWED_LICENCES`] satisfies, and every workspace crate the workspace's own licence.

use std::collections::BTreeMap;

use super::spdx;

/// The licences a dependency may be used under: the one place to read or extend. Each is here
/// because some package in the tree needs it (no other choice of its expression avoids it), and
/// a test fails when one no longer is. Add one only with the reason it is acceptable for a
/// project that is published under Apache-2.0 and whose users ship binaries.
const ALLOWED_LICENCES: &[&str] = &[
    // The workspace's own licence: permissive, with a patent grant; asks only for the notice and
    // for changes to be marked.
    "Apache-2.0",
    // Permissive: use, change and ship freely, keeping the copyright and permission notice.
    "MIT",
    // Permissive: MIT's terms plus not using the authors' names to endorse (bindgen, subtle).
    "BSD-3-Clause",
    // Permissive: MIT's terms in fewer words (libloading).
    "ISC",
    // Permissive: keep the notice in source, mark altered versions (zlib-rs, foldhash).
    "Zlib",
    // Permissive: Unicode's licence for its data and the code generated from it; keep the notice
    // (yoke, zerofrom, unicode-ident's tables).
    "Unicode-3.0",
    // The fonts the demo embeds to label its plots (epaint_default_fonts): both font licences let
    // any software bundle and embed the fonts; their conditions bind only the fonts themselves
    // (not sold alone, renamed when modified), never the program that embeds them.
    "OFL-1.1",
    "Ubuntu-font-1.0",
];

/// The licence of every workspace crate (`license.workspace = true`).
const WORKSPACE_LICENCE: &str = "Apache-2.0";

/// A package of the dependency tree and what it says of its licence.
#[derive(Debug)]
struct Licensed {
    name: String,
    version: String,
    /// The SPDX expression of `Cargo.toml`'s `license`.
    license: Option<String>,
    /// `license-file`, which a package without an SPDX expression may name instead.
    license_file: Option<String>,
    /// A workspace member, which must declare [`WORKSPACE_LICENCE`].
    workspace: bool,
}

/// Every package of the workspace's dependency tree, with every feature, from
/// `cargo metadata --locked`; offline first, online only when a crate is not downloaded yet.
fn dependency_tree() -> Vec<Licensed> {
    let offline = ["--locked", "--all-features", "--offline"];
    let metadata = super::cargo_metadata(&offline)
        .or_else(|offline_err| {
            super::cargo_metadata(&offline[..2]).map_err(|err| format!("{offline_err}\n{err}"))
        })
        .unwrap_or_else(|err| panic!("{err}"));
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap())
        .collect();
    let text = |value: &serde_json::Value| value.as_str().map(str::to_owned);
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Licensed {
            name: text(&p["name"]).unwrap(),
            version: text(&p["version"]).unwrap(),
            license: text(&p["license"]),
            license_file: text(&p["license_file"]),
            workspace: members.contains(&p["id"].as_str().unwrap()),
        })
        .collect()
}

/// Every package of `packages` whose licence is not acceptable, as readable lines.
fn licence_violations(packages: &[Licensed], allowed: &[&str]) -> Vec<String> {
    let mut violations = Vec::new();
    for package in packages {
        let Licensed { name, version, .. } = package;
        match (&package.license, &package.license_file) {
            _ if package.workspace => {
                if package.license.as_deref() != Some(WORKSPACE_LICENCE) {
                    violations.push(format!(
                        "workspace crate `{name}` declares licence {}: it must be \
                         `{WORKSPACE_LICENCE}`, the workspace's (`license.workspace = true`)",
                        package
                            .license
                            .as_deref()
                            .map_or("none".to_owned(), |l| format!("`{l}`"))
                    ));
                }
            }
            (Some(license), _) => match spdx::satisfiable(license, allowed) {
                Ok(true) => {}
                Ok(false) => violations.push(format!(
                    "`{name} {version}`: licence `{license}` is not satisfied by the allowed \
                     licences ({}): drop the dependency, or allow a licence in \
                     xtask/src/tidy/licences.rs with the reason it is acceptable",
                    allowed.join(", ")
                )),
                Err(err) => violations.push(format!(
                    "`{name} {version}`: licence `{license}` is no SPDX expression ({err})"
                )),
            },
            (None, Some(file)) => violations.push(format!(
                "`{name} {version}`: no SPDX `license`, only `license-file` {file}, so its \
                 licence cannot be checked"
            )),
            (None, None) => violations.push(format!("`{name} {version}`: declares no licence")),
        }
    }
    violations
}

/// For each licence of `allowed`, the dependencies (`name version`) that cannot do without it:
/// satisfied with `allowed`, not without that one licence.
fn needed_by<'a>(packages: &[Licensed], allowed: &[&'a str]) -> BTreeMap<&'a str, Vec<String>> {
    let satisfied =
        |license: &str, allowed: &[&str]| spdx::satisfiable(license, allowed) == Ok(true);
    allowed
        .iter()
        .map(|&licence| {
            let others: Vec<&str> = allowed.iter().copied().filter(|a| *a != licence).collect();
            let needing = packages
                .iter()
                .filter(|p| !p.workspace)
                .filter_map(|p| Some((p, p.license.as_deref()?)))
                .filter(|(_, license)| satisfied(license, allowed) && !satisfied(license, &others))
                .map(|(p, _)| format!("{} {}", p.name, p.version))
                .collect();
            (licence, needing)
        })
        .collect()
}

#[test]
fn every_package_of_the_tree_has_an_allowed_licence_and_every_allowed_licence_is_needed() {
    let packages = dependency_tree();
    assert!(
        packages.iter().any(|p| !p.workspace),
        "cargo metadata listed no dependencies"
    );
    let violations = licence_violations(&packages, ALLOWED_LICENCES);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    let unneeded: Vec<&str> = needed_by(&packages, ALLOWED_LICENCES)
        .into_iter()
        .filter(|(_, needing)| needing.is_empty())
        .map(|(licence, _)| licence)
        .collect();
    assert!(
        unneeded.is_empty(),
        "no package needs {unneeded:?} any more: remove it from ALLOWED_LICENCES in \
         xtask/src/tidy/licences.rs"
    );
}

#[test]
fn the_licence_check_catches_each_kind_of_violation() {
    let package = |name: &str, license: Option<&str>, file: Option<&str>, workspace| Licensed {
        name: name.into(),
        version: "1.0.0".into(),
        license: license.map(Into::into),
        license_file: file.map(Into::into),
        workspace,
    };
    let packages = [
        package("fine", Some("MIT OR GPL-3.0"), None, false),
        package("legacy", Some("MIT/Apache-2.0"), None, false),
        package("ours", Some("Apache-2.0"), None, true),
        package("copyleft", Some("GPL-3.0"), None, false),
        package("both", Some("MIT AND GPL-3.0"), None, false),
        package("garbled", Some("MIT,"), None, false),
        package("file-only", None, Some("LICENSE.txt"), false),
        package("silent", None, None, false),
        package("wrong", Some("MIT"), None, true),
        package("unsaid", None, None, true),
    ];
    // Apache-2.0 is not allowed to dependencies here, yet the workspace's own crates declare it.
    let violations = licence_violations(&packages, &["MIT"]);
    let expected = [
        "`copyleft 1.0.0`: licence `GPL-3.0` is not satisfied by the allowed licences (MIT)",
        "`both 1.0.0`: licence `MIT AND GPL-3.0` is not satisfied",
        "`garbled 1.0.0`: licence `MIT,` is no SPDX expression (`MIT,` is not a licence id)",
        "`file-only 1.0.0`: no SPDX `license`, only `license-file` LICENSE.txt",
        "`silent 1.0.0`: declares no licence",
        "workspace crate `wrong` declares licence `MIT`: it must be `Apache-2.0`",
        "workspace crate `unsaid` declares licence none: it must be `Apache-2.0`",
    ];
    super::assert_violations(&violations, &expected);

    let needed = needed_by(&packages, &["MIT", "Apache-2.0", "GPL-3.0"]);
    assert_eq!(needed["MIT"], ["both 1.0.0"]);
    assert_eq!(needed["GPL-3.0"], ["copyleft 1.0.0", "both 1.0.0"]);
    assert!(needed["Apache-2.0"].is_empty(), "{needed:?}");
}
