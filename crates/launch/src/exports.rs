//! `cargo distribute env`: the environment of [`Mpi::env`](crate::mpi::Mpi::env) as shell
//! exports, for people who start `mpirun`, `srun` or their scheduler's launcher themselves.

use std::ffi::OsString;

/// `export NAME='value'` lines for `env`, after a comment line that says which MPI they are for.
pub fn shell_exports(description: &str, env: &[(&'static str, OsString)]) -> String {
    let mut out = format!("# {description}\n");
    for (name, value) in env {
        out.push_str(&format!(
            "export {name}={}\n",
            quote(&value.to_string_lossy())
        ));
    }
    out
}

/// `value` in single quotes, each `'` in it written `'\''`.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mpi::Inherited;

    #[test]
    fn the_wheels_environment_as_exports() {
        let mpi = crate::mpi::tests::wheel_mpi();
        let inherited = Inherited {
            path: Some(OsString::from("/usr/bin:/bin")),
            ..Inherited::default()
        };
        insta::assert_snapshot!(shell_exports(&mpi.describe(), &mpi.env_from(&inherited)));
    }

    #[test]
    fn quotes_survive_the_shell() {
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
