//! The downstream crates of `cargo xtask test`: crates outside the workspace, each made in a
//! temporary folder with its own `Cargo.toml` and depending on single workspace crates by path,
//! as a user's crate depends on them from the registry.
//!
//! - [`spec_only`]: a crate that picks `distribute-device-spec` alone builds with no MPI, CUDA
//!   or PJRT in its dependency graph, and its program prints what the crate's API says.
//! - [`training`]: a crate on `distribute-candle` (feature `mpi`) and
//!   `distribute-multi-worker`, not the facade, built with `cargo distribute build` and run with
//!   `cargo distribute run -n 2` (the launcher of `crates/launch`, as a user installs it),
//!   trains to the same bits as its program started alone with 2 replicas, outside `mpirun` and
//!   without any MPI variable (the rpath the launcher links).
//!
//! Cost: both share the workspace's target folder, `Cargo.lock` and profile settings (copied
//! into their manifests, with the workspace crates' own settings as the members get them), and
//! the features the workspace builds their dependencies with ([`pin_features`]: `cargo tree`
//! of both, the differences pinned), so cargo reuses every third-party build of the workspace's
//! tests (checked: the same rlib hashes for candle-core, gemm, half, serde) and compiles only
//! the workspace's own crates as path dependencies (their hashes differ outside the workspace)
//! and the programs: 35 s here after `test-mpi`'s build.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use crate::cargo::{cargo, cargo_program, metadata, target_directory};
use crate::packages::{MpiPackages, plain_build_excludes};

/// Build and run the crates outside the workspace that `cargo xtask test` builds as a user would
///
/// A crate on distribute-device-spec alone (no MPI, CUDA or PJRT in its graph), and a crate on
/// distribute-candle (feature mpi) and distribute-multi-worker built with `cargo distribute
/// build` and trained with `cargo distribute run -n 2`, checked bit for bit against its program
/// alone with 2 replicas. Each is made in a temporary folder and shares the workspace's target
/// folder, so what the tests built is reused.
#[derive(clap::Args)]
pub(crate) struct Args {}

/// `cargo xtask test-downstream`: both crates.
pub(crate) fn test(root: &Path) -> Result<()> {
    spec_only(root)?;
    training(root)
}

/// The program of [`training`]'s crate.
const TRAIN: &str = include_str!("train.rs");
/// The program of [`spec_only`]'s crate.
const SPEC: &str = include_str!("spec.rs");

/// The workspace crates in the graph of [`training`]'s crate.
const TRAINING_CRATES: &[&str] = &[
    "distribute-candle",
    "distribute-multi-worker",
    "distribute-mirrored",
    "distribute-mpi",
    "distribute-strategy",
    "distribute-input",
    "distribute-collectives",
    "distribute-tensor",
    "distribute-values",
    "distribute-device-spec",
];

/// A downstream crate's `Cargo.toml`: package `name`, `dependencies` as TOML lines, and the
/// workspace's profile settings: its `[profile.dev]`, its `"*"` override for third-party
/// crates, and for each of `workspace_crates` the settings it gets as a workspace member, so
/// that every dependency's build is the one the workspace made.
fn manifest(name: &str, dependencies: &[String], workspace_crates: &[&str]) -> String {
    let mut toml = format!(
        "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n\
         [dependencies]\n{}\n\n\
         # Not part of any enclosing workspace.\n[workspace]\n\n\
         # The workspace's profile settings, so cargo reuses its builds.\n\
         [profile.dev]\ndebug = \"line-tables-only\"\n\n\
         [profile.dev.package.\"*\"]\nopt-level = 1\ndebug = false\n",
        dependencies.join("\n")
    );
    for krate in workspace_crates {
        toml.push_str(&format!(
            "\n[profile.dev.package.{krate}]\nopt-level = 0\ndebug = \"line-tables-only\"\n"
        ));
    }
    // A proc-macro member gets the build-override settings.
    if workspace_crates.contains(&"distribute-values") {
        toml.push_str(
            "\n[profile.dev.package.distribute-values-derive]\nopt-level = 0\ndebug = false\n",
        );
    }
    toml
}

/// `name = { path = "<root>/<folder>"[, features = [...]] }`.
fn path_dependency(root: &Path, name: &str, folder: &str, features: &[&str]) -> String {
    let features = if features.is_empty() {
        String::new()
    } else {
        let quoted: Vec<String> = features.iter().map(|f| format!("\"{f}\"")).collect();
        format!(", features = [{}]", quoted.join(", "))
    };
    format!(
        "{name} = {{ path = \"{}\"{features} }}",
        root.join(folder).display()
    )
}

/// One package of a `cargo tree -f "{p} {f}" --prefix none` line: name, version, path (for a
/// path dependency) and its features.
#[derive(Debug, PartialEq, Eq)]
struct TreeNode {
    name: String,
    version: String,
    path: Option<String>,
    features: Vec<String>,
}

/// The packages of `cargo tree -f "{p} {f}" --prefix none` output, each once.
fn tree_nodes(tree: &str) -> Vec<TreeNode> {
    let mut nodes: Vec<TreeNode> = Vec::new();
    for line in tree.lines() {
        let line = line.trim_end().trim_end_matches(" (*)");
        let mut words = line.split(' ');
        let (Some(name), Some(version)) = (words.next(), words.next()) else {
            continue;
        };
        let rest: Vec<&str> = words.collect();
        let (path, features) = match rest.first() {
            Some(first) if first.starts_with('(') => (
                Some(first.trim_matches(|c| c == '(' || c == ')').to_owned()),
                rest.get(1).copied(),
            ),
            _ => (None, rest.first().copied()),
        };
        let node = TreeNode {
            name: name.to_owned(),
            version: version.trim_start_matches('v').to_owned(),
            path,
            features: features
                .unwrap_or_default()
                .split(',')
                .filter(|f| !f.is_empty())
                .map(str::to_owned)
                .collect(),
        };
        if !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    nodes
}

/// Dependency lines that give every package of the downstream graph `ours` the features it
/// has in the workspace's build `theirs` (cargo unifies features, so a package's build is
/// reused only with the same ones): what the workspace's other crates turn on (a dev-dependency's
/// `std`, say) and a user's crate would not.
fn feature_pins(theirs: &[TreeNode], ours: &[TreeNode]) -> Vec<String> {
    // A package built for the target and for the host (build scripts, proc macros) shows once
    // per feature set: compare the unions.
    let union = |nodes: &[TreeNode], name: &str, version: &str| -> Vec<String> {
        let mut features: Vec<String> = nodes
            .iter()
            .filter(|n| n.name == name && n.version == version)
            .flat_map(|n| n.features.iter().cloned())
            .collect();
        features.sort();
        features.dedup();
        features
    };
    let mut pins: Vec<String> = Vec::new();
    for node in ours {
        let built = union(theirs, &node.name, &node.version);
        let have = union(ours, &node.name, &node.version);
        if built.iter().all(|f| have.contains(f)) {
            continue;
        }
        let Some(path) = theirs
            .iter()
            .find(|t| t.name == node.name && t.version == node.version)
            .map(|t| t.path.clone())
        else {
            continue;
        };
        let features: Vec<String> = built.iter().map(|f| format!("\"{f}\"")).collect();
        let source = match path {
            Some(path) => format!("path = \"{path}\""),
            None => format!("version = \"={}\"", node.version),
        };
        let pin = format!(
            "{} = {{ {source}, default-features = false, features = [{}] }}",
            node.name,
            features.join(", ")
        );
        if !pins.contains(&pin) {
            pins.push(pin);
        }
    }
    pins
}

/// `cargo tree` of the packages in `dir` (or, with `args`, of those `args` select), as
/// [`TreeNode`]s: normal and build dependencies, and dev-dependencies with `dev`.
fn tree(dir: &Path, args: &[String], dev: bool) -> Result<Vec<TreeNode>> {
    let edges = if dev {
        "normal,build,dev"
    } else {
        "normal,build"
    };
    let output = Command::new(cargo_program())
        .args(["tree", "--prefix", "none", "-f", "{p} {f}", "-e", edges])
        .args(args)
        .current_dir(dir)
        .output()
        .context("could not run cargo tree")?;
    if !output.status.success() {
        bail!(
            "cargo tree failed in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(tree_nodes(&String::from_utf8_lossy(&output.stdout)))
}

/// Writes `manifest` with the dependencies of `feature_pins` added, so that the crate's graph
/// has the features of the workspace's build that `reference` (`cargo test` arguments that
/// select packages and features) makes. The tree does not say which side a package is built
/// for, so each pin is both a dependency and a build-dependency (with an empty build script):
/// a host package's features (syn's, under the proc macros) decide whether everything above it
/// is reused.
fn pin_features(root: &Path, dir: &Path, manifest: &str, reference: &[String]) -> Result<()> {
    let theirs = tree(root, reference, true)?;
    let ours = tree(dir, &[], false)?;
    let pins = feature_pins(&theirs, &ours);
    if pins.is_empty() {
        return Ok(());
    }
    eprintln!(
        "xtask: downstream: features as the workspace builds them: {}",
        pins.join("; ")
    );
    let pins = pins.join("\n");
    let manifest = manifest.replacen(
        "[dependencies]\n",
        &format!("[build-dependencies]\n{pins}\n\n[dependencies]\n{pins}\n"),
        1,
    );
    std::fs::write(dir.join("Cargo.toml"), manifest)?;
    std::fs::write(
        dir.join("build.rs"),
        "//! Empty: the build-dependencies only pin host features.\nfn main() {}\n",
    )?;
    Ok(())
}

/// Writes a crate in `dir`: its manifest, the workspace's `Cargo.lock` (the versions the
/// workspace built) and `program` as its `src/main.rs`.
fn write_crate(root: &Path, dir: &Path, manifest: &str, program: &str) -> Result<()> {
    std::fs::create_dir_all(dir.join("src"))
        .with_context(|| format!("could not create {}", dir.display()))?;
    std::fs::write(dir.join("Cargo.toml"), manifest)?;
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock"))?;
    std::fs::write(dir.join("src/main.rs"), program)?;
    Ok(())
}

/// A fresh folder for the downstream crates, below the system's temporary folder.
fn scratch(what: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "distribute-downstream-{what}-{}",
        std::process::id()
    ));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Runs `command` (described as `line`), echoing it and its duration; its stdout on success.
fn run(what: &str, line: &str, command: &mut Command) -> Result<String> {
    eprintln!("xtask: {what}: {line}");
    let start = Instant::now();
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("could not start {line}"))?;
    eprintln!("xtask: {what}: {:.1} s", start.elapsed().as_secs_f64());
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        bail!(
            "{what} failed: `{line}` exited with {}; stdout:\n{stdout}",
            output.status
        );
    }
    Ok(stdout)
}

/// A crate that picks `distribute-device-spec` alone: no MPI, CUDA or PJRT in its graph, and
/// its program prints what the crate's API computes.
pub(crate) fn spec_only(root: &Path) -> Result<()> {
    let what = "downstream crate on distribute-device-spec";
    let dir = scratch("spec")?;
    let name = "distribute-downstream-spec";
    let dependency = path_dependency(root, "distribute-device-spec", "crates/device-spec", &[]);
    let toml = manifest(name, &[dependency], &["distribute-device-spec"]);
    write_crate(root, &dir, &toml, SPEC)?;
    let mut reference = vec!["--workspace".to_owned()];
    reference.extend(plain_build_excludes()?);
    pin_features(root, &dir, &toml, &reference)?;
    // The workspace's target folder (`CARGO_TARGET_DIR` when set), whose builds are reused.
    let target = target_directory(&metadata()?)?;
    let cargo_in = |args: &[&str]| {
        let mut command = Command::new(cargo_program());
        command
            .args(args)
            .current_dir(&dir)
            .env("CARGO_TARGET_DIR", &target);
        command
    };
    let tree = run(
        what,
        "cargo tree",
        &mut cargo_in(&["tree", "--prefix", "none", "-e", "normal,build"]),
    )?;
    let unwanted: Vec<&str> = tree
        .lines()
        .filter(|line| {
            let krate = line.split_whitespace().next().unwrap_or_default();
            [
                "mpi",
                "mpi-sys",
                "cudarc",
                "distribute-pjrt",
                "distribute-collectives",
                "libloading",
            ]
            .contains(&krate)
        })
        .collect();
    ensure!(unwanted.is_empty(), "{what} compiles {unwanted:?}:\n{tree}");
    run(what, "cargo build", &mut cargo_in(&["build"]))?;
    let printed = run(
        what,
        name,
        &mut Command::new(target.join("debug").join(name)),
    )?;
    let expected = "/job:worker/replica:0/task:1/device:GPU:0\n/device:CPU:0\n\
                    /job:worker/replica:0/task:2/device:GPU:1\n3\n";
    ensure!(
        printed == expected,
        "{what} printed:\n{printed}\nexpected:\n{expected}"
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// A crate on `distribute-candle` (feature `mpi`) and `distribute-multi-worker`, built and run
/// through `cargo distribute` (the launcher built from `crates/launch`), trains on 2 workers to
/// the bits its program gives alone with 2 replicas, started outside `mpirun` with no MPI
/// variable.
pub(crate) fn training(root: &Path) -> Result<()> {
    let what = "downstream crate on 2 workers";
    // The launcher, as `cargo install --path crates/launch` would build it (debug here: the
    // workspace's tests built it already).
    cargo(
        "build cargo-distribute",
        &[
            "build",
            "--package",
            "distribute-launch",
            "--bin",
            "cargo-distribute",
        ],
    )?;
    // The workspace's target folder (`CARGO_TARGET_DIR` when set), whose builds are reused.
    let target = target_directory(&metadata()?)?;
    let dir = scratch("training")?;
    let name = "distribute-downstream-train";
    let dependencies = [
        path_dependency(root, "distribute-candle", "crates/candle", &["mpi"]),
        path_dependency(
            root,
            "distribute-multi-worker",
            "crates/strategy-multi-worker",
            &[],
        ),
        path_dependency(root, "distribute-strategy", "crates/strategy", &[]),
        path_dependency(root, "distribute-device-spec", "crates/device-spec", &[]),
        path_dependency(root, "distribute-values", "crates/values", &[]),
        "candle-core = \"0.11.1\"".to_owned(),
        "candle-nn = \"0.11.1\"".to_owned(),
    ];
    let toml = manifest(name, &dependencies, TRAINING_CRATES);
    write_crate(root, &dir, &toml, TRAIN)?;
    // The features `cargo xtask test-mpi` builds the workspace's MPI packages with.
    let reference = MpiPackages::of(&metadata()?).cargo_args();
    pin_features(root, &dir, &toml, &reference)?;
    // `cargo distribute` finds `cargo-distribute` on PATH, as after `cargo install`.
    let path = std::env::join_paths(std::iter::once(target.join("debug")).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))?;
    let distribute = |args: &[&str]| {
        let mut command = Command::new(cargo_program());
        command
            .arg("distribute")
            .args(args)
            .current_dir(&dir)
            .env("PATH", &path)
            .env("CARGO_TARGET_DIR", &target);
        command
    };
    run(what, "cargo distribute build", &mut distribute(&["build"]))?;
    let two = dir.join("two-workers.txt");
    let two_arg = two.display().to_string();
    run(
        what,
        "cargo distribute run -n 2 -- --replicas 1",
        &mut distribute(&["run", "-n", "2", "--", "--replicas", "1", "--out", &two_arg]),
    )?;
    // Where the build went: `cargo distribute env` names it when it is not the target folder.
    let exports = run(what, "cargo distribute env", &mut distribute(&["env"]))?;
    let built = exports
        .lines()
        .find_map(|line| line.strip_prefix("export CARGO_TARGET_DIR='"))
        .map(|dir| PathBuf::from(dir.trim_end_matches('\'')))
        .unwrap_or(target);
    let one = dir.join("one-worker.txt");
    let mut alone = Command::new(built.join("debug").join(name));
    alone.args(["--replicas", "2", "--out"]).arg(&one);
    for variable in ["LD_LIBRARY_PATH", "OPAL_PREFIX"] {
        alone.env_remove(variable);
    }
    alone.env("PATH", without_mpi(std::env::var_os("PATH")));
    run(
        what,
        &format!("{name} --replicas 2 (alone, no MPI variables)"),
        &mut alone,
    )?;
    let (two, one) = (
        std::fs::read_to_string(&two)?,
        std::fs::read_to_string(&one)?,
    );
    ensure!(
        two == one && one.lines().count() == 10,
        "{what}: 2 workers × 1 replica trained other bits than 1 worker × 2 replicas:\n{two}\nvs\n{one}"
    );
    eprintln!("xtask: {what}: 2 workers × 1 replica = 1 worker × 2 replicas, bit for bit");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// `PATH` without the folders that hold an `mpirun`: the program alone must need no MPI tool.
fn without_mpi(path: Option<OsString>) -> OsString {
    let kept: Vec<PathBuf> = std::env::split_paths(&path.unwrap_or_default())
        .filter(|dir| !dir.join("mpirun").exists())
        .collect();
    std::env::join_paths(kept).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_downstream_manifest_has_the_workspaces_profiles_and_path_dependencies() {
        let root = Path::new("/w");
        let toml = manifest(
            "d",
            &[path_dependency(
                root,
                "distribute-candle",
                "crates/candle",
                &["mpi"],
            )],
            &["distribute-candle", "distribute-values"],
        );
        for part in [
            "distribute-candle = { path = \"/w/crates/candle\", features = [\"mpi\"] }",
            "[workspace]\n",
            "[profile.dev]\ndebug = \"line-tables-only\"\n",
            "[profile.dev.package.\"*\"]\nopt-level = 1\ndebug = false\n",
            "[profile.dev.package.distribute-candle]\nopt-level = 0\ndebug = \"line-tables-only\"\n",
            "[profile.dev.package.distribute-values-derive]\nopt-level = 0\ndebug = false\n",
        ] {
            assert!(toml.contains(part), "{part} not in:\n{toml}");
        }
        // The workspace's own settings, which the manifest copies.
        let workspace = include_str!("../../../Cargo.toml");
        for part in [
            "[profile.dev]\n# Line tables are enough for backtraces; full debug info doubles link time on 2 cores.\ndebug = \"line-tables-only\"",
            "[profile.dev.package.\"*\"]\n# Dependencies (proptest, serde) run faster in tests at little build cost.\nopt-level = 1\ndebug = false",
        ] {
            assert!(
                workspace.contains(part),
                "the workspace's profiles changed: {part}"
            );
        }
    }

    #[test]
    fn a_feature_the_workspace_turns_on_is_pinned_in_the_downstream_crate() {
        let theirs = tree_nodes(
            "bytemuck v1.25.2 derive,extern_crate_alloc\n\
             distribute-values v0.1.0 (/w/crates/values) \n\
             num-complex v0.4.6 bytemuck,default,std\n\
             serde v1.0.229 default,derive,std (*)\n",
        );
        let ours = tree_nodes(
            "d v0.1.0 (/tmp/d) \n\
             bytemuck v1.25.2 derive\n\
             distribute-values v0.1.0 (/w/crates/values) \n\
             num-complex v0.4.6 bytemuck\n\
             serde v1.0.229 default,derive,std\n",
        );
        assert_eq!(ours.len(), 5);
        assert_eq!(ours[2].path.as_deref(), Some("/w/crates/values"));
        assert_eq!(
            feature_pins(&theirs, &ours),
            [
                "bytemuck = { version = \"=1.25.2\", default-features = false, features = \
                 [\"derive\", \"extern_crate_alloc\"] }",
                "num-complex = { version = \"=0.4.6\", default-features = false, features = \
                 [\"bytemuck\", \"default\", \"std\"] }",
            ]
        );
    }

    #[test]
    fn the_program_alone_finds_no_mpirun_on_its_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mpirun"), "").unwrap();
        let path = std::env::join_paths([dir.path(), Path::new("/usr/bin")]).unwrap();
        assert_eq!(without_mpi(Some(path)), OsString::from("/usr/bin"));
    }
}
