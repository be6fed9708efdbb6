//! The reduction kernels compile with NVRTC to PTX and to a CUBIN (what a GPU loads) for Hopper
//! (sm_90) — no GPU needed, so CI runs
//! this with NVRTC from the `nvidia-cuda-nvrtc` wheel (`cargo xtask test` sets it up and sets
//! `DISTRIBUTE_REQUIRE_NVRTC=1`, which turns a missing NVRTC from a skip into a failure).

use distribute_tensor::GpuError;
use distribute_tensor::cuda::{
    compile_reduction_cubin, compile_reduction_kernels, kernel_source, nvrtc_available,
    require_nvrtc,
};

/// False (after saying why) when NVRTC is missing and not required.
fn nvrtc_or_skip() -> bool {
    if nvrtc_available() {
        return true;
    }
    let required = std::env::var("DISTRIBUTE_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "DISTRIBUTE_REQUIRE_NVRTC=1 but: {}",
        require_nvrtc().unwrap_err()
    );
    eprintln!("skipped: {}", require_nvrtc().unwrap_err());
    false
}

const FLOATS: [&str; 4] = ["f16", "bf16", "f32", "f64"];
const INTS: [&str; 2] = ["i32", "i64"];

#[test]
fn every_kernel_compiles_to_ptx_for_sm_90() {
    if !nvrtc_or_skip() {
        return;
    }
    let ptx = compile_reduction_kernels("sm_90").expect("the kernels compile");
    assert!(ptx.contains(".target sm_90"), "PTX for sm_90:\n{ptx:.400}");
    for dtype in FLOATS {
        for op in ["sum", "mean", "min", "max"] {
            let entry = format!(".entry reduce_{op}_{dtype}(");
            assert!(ptx.contains(&entry), "missing {entry}");
        }
    }
    for dtype in INTS {
        for op in ["sum", "min", "max"] {
            let entry = format!(".entry reduce_{op}_{dtype}(");
            assert!(ptx.contains(&entry), "missing {entry}");
        }
        // Integer MEAN is refused before any launch, so it has no kernel.
        assert!(!ptx.contains(&format!(".entry reduce_mean_{dtype}(")));
    }
}

/// The body of one kernel's `.entry` in `ptx`.
fn entry<'a>(ptx: &'a str, name: &str) -> &'a str {
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("no {name}"));
    let rest = &ptx[start + 1..];
    &ptx[start..start + 1 + rest.find(".entry").unwrap_or(rest.len())]
}

/// What made the kernels stream at the copy's speed on an H200 (docs/performance.md#gpus): 16-byte
/// loads and stores for every dtype, the input pointers read where the launch put them (no copy
/// to local memory), and a register budget that keeps 8 blocks of 256 threads resident.
#[test]
fn the_kernels_move_16_bytes_at_a_time_without_local_memory() {
    if !nvrtc_or_skip() {
        return;
    }
    let ptx = compile_reduction_kernels("sm_90").expect("the kernels compile");
    for dtype in FLOATS.iter().chain(&INTS) {
        let body = entry(&ptx, &format!("reduce_sum_{dtype}"));
        let vector_loads = body.matches("ld.global.v4").count()
            + body.matches("ld.v4").count()
            + body.matches("ld.global.v2.u64").count()
            + body.matches("ld.global.v2.f64").count();
        assert!(vector_loads > 0, "{dtype}: no 16-byte loads");
        assert!(
            body.contains("st.global.v4") || body.contains("st.global.v2"),
            "{dtype}: no 16-byte stores"
        );
        assert!(!body.contains(".local"), "{dtype}: local memory");
        assert!(body.contains(".maxntid 256"), "{dtype}: no launch bounds");
        assert!(
            body.contains(".minnctapersm 8"),
            "{dtype}: no launch bounds"
        );
    }
}

#[test]
fn f16_and_bf16_round_once_with_ieee_arithmetic() {
    if !nvrtc_or_skip() {
        return;
    }
    let ptx = compile_reduction_kernels("compute_90").expect("the kernels compile");
    // f16 rounds with the hardware conversion, to nearest even; f32 adds are round-to-nearest
    // and never fused or flushed to zero (the host kernel's arithmetic, bit for bit).
    assert!(ptx.contains("cvt.rn.f16.f32"));
    assert!(ptx.contains("add.rn.f32"));
    assert!(!ptx.contains(".ftz"), "no flush-to-zero");
    assert!(!ptx.contains("fma."), "no fused multiply-add");
    assert!(ptx.contains("div.rn.f32"), "MEAN divides exactly");
}

#[test]
fn older_architectures_compile_too() {
    if !nvrtc_or_skip() {
        return;
    }
    for arch in ["sm_80", "compute_75"] {
        let ptx = compile_reduction_kernels(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(ptx.contains(".entry reduce_sum_bf16("), "{arch}");
    }
}

#[test]
fn a_bad_architecture_is_a_typed_compile_error() {
    if !nvrtc_or_skip() {
        return;
    }
    match compile_reduction_kernels("sm_1") {
        Err(GpuError::Compile(log)) => assert!(!log.is_empty()),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn the_source_needs_no_header() {
    assert!(!kernel_source().contains("#include"));
}

/// What a GPU loads: machine code for its real architecture, an ELF image with every kernel.
#[test]
fn every_kernel_compiles_to_a_cubin_for_sm_90() {
    if !nvrtc_or_skip() {
        return;
    }
    let cubin = compile_reduction_cubin("sm_90").expect("the kernels compile");
    assert!(cubin.starts_with(b"\x7fELF"), "a CUBIN is an ELF image");
    let has = |name: &str| cubin.windows(name.len()).any(|w| w == name.as_bytes());
    for dtype in FLOATS {
        for op in ["sum", "mean", "min", "max"] {
            assert!(has(&format!("reduce_{op}_{dtype}")), "{op} {dtype}");
        }
    }
    for dtype in INTS {
        assert!(has(&format!("reduce_sum_{dtype}")), "sum {dtype}");
    }
}

#[test]
fn a_cubin_needs_a_real_architecture() {
    if !nvrtc_or_skip() {
        return;
    }
    match compile_reduction_cubin("compute_90") {
        Err(GpuError::Compile(why)) => assert!(why.contains("real architecture"), "{why}"),
        other => panic!("expected a typed refusal, got {other:?}"),
    }
}
