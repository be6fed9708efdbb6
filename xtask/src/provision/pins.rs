//! Every pinned artifact of xtask's own provisioning, in one place: the PyPI wheels of the PJRT
//! plugins, NVRTC and the CUDA toolkit (project, version, URL and the SHA-256 of the whole
//! file), and the files inside them whose own SHA-256 is checked again after unpacking. The MPI
//! pins (Open MPI, libclang) are `distribute-launch`'s (`distribute_launch::pins`), which
//! provisions MPI for xtask and for users alike. To move a pin, change it here; a test checks
//! that every pin is complete and named by its project and version.

pub(crate) use distribute_launch::pins::{Member, Pin};

/// The PJRT CPU plugin that `distribute-pjrt`'s tests load (62,711,338 bytes).
pub(crate) const PJRT_CPU: Pin = Pin {
    project: "lammps-jax-pjrt-cpu",
    version: "0.11.2",
    url: "https://files.pythonhosted.org/packages/e5/90/f04e5ea9e56f01965b4cd56bc3cf4801a563cd47b74d4ded5780f19c3a7c/lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
    sha256: "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1",
};

/// The CPU plugin inside [`PJRT_CPU`] (PJRT C API 0.115).
pub(crate) const PJRT_CPU_PLUGIN: Member = Member {
    path: "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
    sha256: "ad1309ac822b1b24d51b7f9947c7c9fa9ef5d67f390584cbc3d1fa2428fed9c2",
};

/// JAX's CUDA 13 PJRT plugin, for `TpuStrategy` on NVIDIA GPUs (134,162,640 bytes).
pub(crate) const PJRT_CUDA: Pin = Pin {
    project: "jax-cuda13-pjrt",
    version: "0.11.2",
    url: "https://files.pythonhosted.org/packages/a8/13/247ba4ea1ac057309f2e1328d743ba355631b76d31fbebd076421a74e26e/jax_cuda13_pjrt-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
    sha256: "e5ff589d43064913bb74027682d89639c7ea48f9f81c2bae6fc75117e913f93e",
};

/// The CUDA plugin inside [`PJRT_CUDA`] (411 MB unpacked).
pub(crate) const PJRT_CUDA_PLUGIN: Member = Member {
    path: "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
    sha256: "43d3efd6fd43d8a5d9aa67176e830d81e4ad5fc19fda4ad09cdcc4aebd9f3920",
};

/// NVRTC (90,215,200 bytes). 13.0 is the newest NVRTC a CUDA 13.0 driver runs the PTX of
/// (NVRTC must not be newer than the driver), and the version cudarc's `cuda-13000` names.
pub(crate) const NVRTC: Pin = Pin {
    project: "nvidia-cuda-nvrtc",
    version: "13.0.88",
    url: "https://files.pythonhosted.org/packages/c3/68/483a78f5e8f31b08fb1bb671559968c0ca3a065ac7acabfc7cee55214fd6/nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575",
};

/// The libraries taken from [`NVRTC`]. The wheel also has `libnvrtc.alt.so.13` and
/// `libnvrtc-builtins.alt.so.13.0` (115 MB more), which cudarc never loads.
pub(crate) const NVRTC_LIBRARIES: [Member; 2] = [
    Member {
        path: "nvidia/cu13/lib/libnvrtc.so.13",
        sha256: "a49e67e8e74590f1e98de55c39c6287efd3f59e3c3797464d7bbe0fe01349b11",
    },
    Member {
        path: "nvidia/cu13/lib/libnvrtc-builtins.so.13.0",
        sha256: "91dcd944d01da9c0f08fff5d779db136a47f6d62bdb63bae900d2f481e92c3a2",
    },
];

/// nvcc, with ptxas: the first wheel of the CUDA toolkit that builds candle's CUDA backend.
pub(crate) const CUDA_NVCC: Pin = Pin {
    project: "nvidia-cuda-nvcc",
    version: "13.0.88",
    url: "https://files.pythonhosted.org/packages/71/8b/a546c12881fffeba927d810598987df25d74b8b241788c7db8dfc93b0173/nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
};

/// nvcc's front end's headers (crt).
pub(crate) const CUDA_CRT: Pin = Pin {
    project: "nvidia-cuda-crt",
    version: "13.0.88",
    url: "https://files.pythonhosted.org/packages/05/69/a1ec4d9f0747d85964206feb47bf359f48a2d6af74c0add8abba6efe3dda/nvidia_cuda_crt-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4",
};

/// NVVM (cicc).
pub(crate) const NVVM: Pin = Pin {
    project: "nvidia-nvvm",
    version: "13.0.88",
    url: "https://files.pythonhosted.org/packages/15/b0/ee41e6d1108d959b5097163e7190c2d0f7857dea75606ce358f0275891b4/nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0",
};

/// The CUDA runtime's headers and `libcudart.so.13`.
pub(crate) const CUDA_RUNTIME: Pin = Pin {
    project: "nvidia-cuda-runtime",
    version: "13.0.96",
    url: "https://files.pythonhosted.org/packages/2e/24/d1558f3b68b1d26e706813b1d10aa1d785e4698c425af8db8edc3dced472/nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
};

/// CCCL's headers.
pub(crate) const CUDA_CCCL: Pin = Pin {
    project: "nvidia-cuda-cccl",
    version: "13.0.85",
    url: "https://files.pythonhosted.org/packages/ab/fb/0384bb2129bed6b1b39f8e44471c615ab5ab29b7e55817538a1d390d8f84/nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649",
};

/// The wheels of the CUDA toolkit, all of CUDA 13.0 (the driver of the GPU machine), in the
/// order they are unpacked into one folder.
pub(crate) const CUDA_TOOLKIT: [Pin; 5] = [CUDA_NVCC, CUDA_CRT, NVVM, CUDA_RUNTIME, CUDA_CCCL];

/// Every pinned wheel.
#[cfg(test)]
const ALL: [Pin; 8] = [
    PJRT_CPU,
    PJRT_CUDA,
    NVRTC,
    CUDA_NVCC,
    CUDA_CRT,
    NVVM,
    CUDA_RUNTIME,
    CUDA_CCCL,
];

/// Every pinned file inside a wheel.
#[cfg(test)]
const ALL_MEMBERS: [Member; 4] = [
    PJRT_CPU_PLUGIN,
    PJRT_CUDA_PLUGIN,
    NVRTC_LIBRARIES[0],
    NVRTC_LIBRARIES[1],
];

#[cfg(test)]
mod tests {
    use distribute_launch::pins::is_sha256;

    use super::*;

    #[test]
    fn every_pin_is_complete_and_in_the_table_once() {
        for (i, pin) in ALL.iter().enumerate() {
            assert_eq!(pin.defect(), None);
            assert!(
                ALL[..i].iter().all(|other| other.project != pin.project),
                "{pin:?}"
            );
        }
        for member in ALL_MEMBERS {
            assert!(is_sha256(member.sha256), "{member:?}");
        }
        // A pin added to this file but not to the table is caught here.
        let declared = |ty: &str| {
            include_str!("pins.rs")
                .lines()
                .filter(|line| line.starts_with("pub(crate) const ") && line.contains(ty))
                .count()
        };
        assert_eq!(declared(": Pin = "), ALL.len());
        assert_eq!(
            declared(": Member = ") + NVRTC_LIBRARIES.len(),
            ALL_MEMBERS.len()
        );
        for pin in CUDA_TOOLKIT {
            assert!(pin.version.starts_with("13.0."), "{pin:?}");
        }
    }
}
