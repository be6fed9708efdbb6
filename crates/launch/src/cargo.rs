//! cargo, run in the user's crate: its target folder, and a build whose programs are found in
//! cargo's JSON messages.

use std::ffi::OsString;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::error::{Error, Result};

/// The cargo that runs this launcher (`$CARGO`, which cargo sets for its subcommands), else
/// `cargo` from `PATH`.
pub fn program() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"))
}

/// The target folder of the package in the current folder, as `cargo metadata` names it
/// (`CARGO_TARGET_DIR` and cargo's configuration included).
pub fn target_directory() -> Result<PathBuf> {
    let output = Command::new(program())
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|err| Error::Command(format!("could not run `cargo metadata`: {err}")))?;
    if !output.status.success() {
        return Err(Error::Command(format!(
            "`cargo metadata` exited with {}: run `cargo distribute` in a cargo package",
            output.status
        )));
    }
    let metadata: Value = serde_json::from_slice(&output.stdout)
        .map_err(|err| Error::Command(format!("`cargo metadata` printed invalid JSON: {err}")))?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| Error::Command("`cargo metadata` named no target directory".to_owned()))
}

/// A program cargo built: a binary or an example.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// The target's name.
    pub name: String,
    /// `bin` or `example`.
    pub kind: String,
    /// The executable.
    pub executable: PathBuf,
}

/// The programs among cargo's JSON messages (`--message-format=json`), one per line.
pub fn programs_in(messages: &str) -> Vec<Program> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter_map(|message| {
            let executable = message["executable"].as_str()?;
            let kind = message["target"]["kind"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .find(|kind| matches!(*kind, "bin" | "example"))?;
            Some(Program {
                name: message["target"]["name"].as_str()?.to_owned(),
                kind: kind.to_owned(),
                executable: PathBuf::from(executable),
            })
        })
        .collect()
}

/// The one program of a build, or an error that names them.
pub fn the_program(programs: Vec<Program>) -> Result<Program> {
    match <[Program; 1]>::try_from(programs) {
        Ok([one]) => Ok(one),
        Err(programs) if programs.is_empty() => Err(Error::Usage(
            "the build made no binary or example to run: run `cargo distribute run` in a \
             package with one, or name it (--bin NAME, --example NAME)"
                .to_owned(),
        )),
        Err(programs) => {
            let names: Vec<String> = programs
                .iter()
                .map(|p| format!("--{} {}", p.kind, p.name))
                .collect();
            Err(Error::Usage(format!(
                "the build made {} programs; name the one to run: {}",
                names.len(),
                names.join(", ")
            )))
        }
    }
}

/// `cargo build ARGS` with the variables `env`, its diagnostics shown as cargo shows them;
/// returns the programs it built.
pub fn build(args: &[String], env: &[(&'static str, OsString)]) -> Result<Vec<Program>> {
    let mut child = Command::new(program())
        .arg("build")
        .arg("--message-format=json-render-diagnostics")
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|err| Error::Command(format!("could not start cargo: {err}")))?;
    let mut messages = String::new();
    let stdout = child.stdout.take().expect("stdout is piped");
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.map_err(Error::io("reading cargo's messages"))?;
        messages.push_str(&line);
        messages.push('\n');
    }
    let status = child.wait().map_err(Error::io("waiting for cargo build"))?;
    if !status.success() {
        return Err(Error::Command(format!(
            "`cargo build {}` exited with {status}",
            args.join(" ")
        )));
    }
    Ok(programs_in(&messages))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_are_the_binaries_and_examples_cargo_built() {
        let messages = r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"dep"},"executable":null}
{"reason":"compiler-artifact","target":{"kind":["bin"],"name":"train"},"executable":"/t/debug/train"}
{"reason":"compiler-artifact","target":{"kind":["custom-build"],"name":"build-script-build"},"executable":null}
{"reason":"build-finished","success":true}
not json"#;
        let programs = programs_in(messages);
        assert_eq!(
            programs,
            [Program {
                name: "train".to_owned(),
                kind: "bin".to_owned(),
                executable: PathBuf::from("/t/debug/train"),
            }]
        );
        assert_eq!(the_program(programs.clone()).unwrap().name, "train");
        let two = vec![
            programs[0].clone(),
            Program {
                name: "eval".to_owned(),
                kind: "example".to_owned(),
                executable: PathBuf::from("/t/debug/examples/eval"),
            },
        ];
        let err = the_program(two).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "the build made 2 programs; name the one to run: --bin train, --example eval"
            ),
            "{err}"
        );
        let err = the_program(Vec::new()).unwrap_err().to_string();
        assert!(err.contains("made no binary or example"), "{err}");
    }
}
