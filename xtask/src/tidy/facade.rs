//! What a CPU-only build of the facade compiles: `distribute` with no features reaches no
//! cryptography, no MPI and no CUDA (those come with its features `nccl`, `mpi` and `cuda`, and
//! with the crates that need them).

use std::process::Command;

/// Crates a CPU-only facade must not build, and what brings each in.
const FORBIDDEN: &[(&str, &str)] = &[
    ("hmac", "the NCCL unique-id exchange (feature `nccl`)"),
    ("sha2", "cryptographic hashing (the unique-id exchange)"),
    ("getrandom", "the exchange's nonces"),
    ("digest", "cryptographic hashing"),
    ("mpi", "MPI (feature `mpi`)"),
    ("mpi-sys", "MPI (feature `mpi`)"),
    ("cudarc", "CUDA and NCCL (features `cuda`, `nccl`)"),
];

/// The names of the packages a no-feature build of `package` compiles (normal dependencies).
fn normal_dependencies(package: &str) -> Result<Vec<String>, String> {
    let output = Command::new(crate::cargo::cargo_program())
        .args([
            "tree",
            "--package",
            package,
            "--edges",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}"])
        .current_dir(super::workspace_root())
        .output()
        .map_err(|err| format!("cargo tree did not start: {err}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// A line for every forbidden crate among `dependencies`.
fn forbidden_in(dependencies: &[String]) -> Vec<String> {
    FORBIDDEN
        .iter()
        .filter(|(name, _)| dependencies.iter().any(|d| d == name))
        .map(|(name, why)| {
            format!("a CPU-only build of the facade compiles `{name}` ({why}); it must not")
        })
        .collect()
}

#[test]
fn a_cpu_only_facade_compiles_no_crypto_no_mpi_and_no_cuda() {
    let dependencies = normal_dependencies("distribute").unwrap();
    assert!(
        dependencies.iter().any(|d| d == "distribute-collectives"),
        "cargo tree listed no collectives: {dependencies:?}"
    );
    let violations = forbidden_in(&dependencies);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_check_names_every_forbidden_crate_it_finds() {
    let found = ["ndarray", "sha2", "mpi"].map(str::to_owned);
    super::assert_violations(
        &forbidden_in(&found),
        &["compiles `sha2` (cryptographic", "compiles `mpi` (MPI"],
    );
}
