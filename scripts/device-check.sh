#!/usr/bin/env bash
# The one-command GPU check, run on the GPU machine from the repository root with the bundle that
# scripts/device-bundle.sh made here (device-bundle/bundle.tar.xz: Lua, Open MPI, OpenBLAS,
# oneDNN, readline, pkg-config). It unpacks the bundle, configures build-gpu with the CUDA backend
# (and stops unless the configure output says "CUDA backend ON"), builds, then runs in order:
#   a. ctest -L cuda: the CUDA kernel table against the CPU's, every test run (none skipped);
#   b. plans/tiny.lua for 50 steps with device = "cuda" against the same run on the CPU, fp32 then
#      bf16: every step's loss within the bound the CPU's equivalence tests hold a layout to its
#      serial run (tests/mpi/mpi_dp_equiv.c, tests/lib/build.sh): 1e-5 relative in fp32, 1e-4 in
#      bf16 (mpi_dp_equiv.c's bf16_bounds);
#   c. 2 ranks on the one GPU through the staged comm backend, tp 2 and dp 2 with ZeRO-3, against
#      the same layouts on the CPU (1e-5), and tp 2 with sequence parallelism in bf16 (1e-4);
#   d. 1 rank through NCCL against the CPU run (1e-5);
#   e. tycho check's bill of the cuda plan against the GPU run's memory peaks (the printed figures
#      equal, as tests/e2e/run_bf16.sh holds the CPU's);
#   f. bench_kernels_gpu (the CUDA kernels at real sizes: bytes or FLOPs, GB/s or TFLOP/s) and
#      bench_gpu (a 1.1B Llama's training step against PyTorch's, eager and torch.compile, on this
#      GPU: tokens/s, MFU, the ratios and the goals), where the tree has them.
# A step whose feature this tree lacks (the GPU run path, the comm plan field, NCCL, bench_gpu)
# is reported "not available in this tree", never as a pass. Each step runs under a time limit
# and the whole under 570 s (one H200, 16 cores). One log, $OUT/device-check.log when $OUT is
# set, else build-gpu/device-check.log; a summary table at the end; exit 1 on any failure.
#
# usage: scripts/device-check.sh                 on the GPU machine
#        scripts/device-check.sh --dry-run [--build TARGET ...]
#   --dry-run proves the build steps here: the bundle unpacked into a folder under /tmp, the
#   system's own copies of the bundled packages hidden (a private mount namespace, as root),
#   pkg-config and CMake pointed into the bundle alone, mpirun -np 2 from the bundle, the same
#   configure into a build folder under /tmp, and each of Lua, MPI, BLAS (and readline, oneDNN)
#   found inside the bundle's prefix; --build also builds TARGETs there, and where tycho is one
#   of them runs it for 2 steps on 2 ranks under the bundle's mpirun. The GPU steps are listed
#   as skipped.
# Environment: BUNDLE (default device-bundle/bundle.tar.xz), BUILD_DIR (default build-gpu; the
# dry run's is under /tmp), BUILD_TARGETS (default: everything), COMM_FIELD (the plan field that
# picks the comm backend, default comm).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
args=("$@")
dry=0
build_targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --build) shift; [ $# -gt 0 ] || { echo "device-check: --build needs a target" >&2; exit 2; }
      build_targets+=("$1") ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "device-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#build_targets[@]} -eq 0 ] || [ $dry -eq 1 ] || { echo "device-check: --build goes with --dry-run" >&2; exit 2; }
bundle=${BUNDLE:-$root/device-bundle/bundle.tar.xz}
comm_field=${COMM_FIELD:-comm}
started=$(date +%s)
total_limit=570

# --- the dry run: a private mount namespace where the system's copies are hidden -------------
# Re-executed once inside `unshare -m`: the mounts vanish with it and no other process sees them.
hide_system() {
  local pkgs=() p f real n=0
  for d in /usr/lib/x86_64-linux-gnu/{openmpi,pmix2,openblas-openmp,openblas-pthread,pkgconfig} \
           /usr/share/pkgconfig /usr/share/openmpi /etc/openmpi /usr/include/lua5.4 /usr/include/readline \
           /usr/include/oneapi /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/x86_64-linux-gnu/openblas-pthread; do
    [ -d "$d" ] && mount -t tmpfs -o size=64k,ro tycho-hidden "$d" && n=$((n + 1))
  done
  # every file of the bundled packages (and their other builds) that the system has, but the
  # compiler's own OpenMP runtime (the image's compiler brings its libgomp too)
  while read -r p _; do
    case "$p" in '#'* | '' | libgomp1) continue ;; esac
    pkgs+=("$p")
  done <"$TYCHO_BUNDLE/PACKAGES.txt"
  pkgs+=(libopenblas0-pthread libopenblas-pthread-dev lua5.4 libpmix-dev libhwloc-dev libevent-dev)
  for p in "${pkgs[@]}"; do
    while IFS= read -r f; do
      [ -f "$f" ] && [ ! -c "$f" ] || continue
      real=$(readlink -f "$f")
      case "${real##*/}" in # a link into the base system (libtinfo.so.6, ...) stays
        libc.so* | libm.so* | libstdc++* | libgcc_s* | libz.so* | libtinfo* | ld-linux*) continue ;;
      esac
      mount --bind /dev/null "$f" && n=$((n + 1))
    done < <(dpkg -L "$p" 2>/dev/null)
  done
  echo "$n"
}

if [ $dry -eq 1 ] && [ -z "${TYCHO_DEVICE_CHECK_NS:-}" ]; then
  work=$(mktemp -d /tmp/tycho-device-dry.XXXXXX)
  export TYCHO_DEVICE_CHECK_WORK=$work
  if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null && command -v dpkg >/dev/null &&
     unshare -m --propagation private true 2>/dev/null; then
    TYCHO_DEVICE_CHECK_NS=1 unshare -m --propagation private bash "$0" "${args[@]}"
    rc=$?
  else
    echo "device-check: the dry run cannot hide the system's packages here (needs root and unshare);" \
         "pkg-config and CMake still look into the bundle alone" >&2
    TYCHO_DEVICE_CHECK_NS=0 bash "$0" "${args[@]}"
    rc=$?
  fi
  exit $rc
fi

if [ $dry -eq 1 ]; then
  work=$TYCHO_DEVICE_CHECK_WORK
  build=${BUILD_DIR:-$work/build}
  unpack_to=$work/bundle
else
  build=${BUILD_DIR:-$root/build-gpu}
  unpack_to=$root/device-bundle
fi
mkdir -p "$build" || exit 1
build=$(cd "$build" && pwd)
log=${OUT:+$OUT/device-check.log}
log=${log:-$build/device-check.log}
: >"$log" || exit 1
w=$(mktemp -d /tmp/tycho-device-check.XXXXXX)
trap 'rm -rf "$w"' EXIT
say() { printf '%s\n' "$*" | tee -a "$log"; }

rows=()   # step|result|seconds|detail
failed=0
row() { # STEP RESULT SECONDS DETAIL
  rows+=("$1|$2|$3|$4")
  [ "$2" = FAIL ] && failed=1
  say "== $1: $2 (${3} s) $4"
}
summary() {
  say ""
  say "device check summary ($([ $dry -eq 1 ] && echo "dry run, ")$(uname -n), $(date -u +%Y-%m-%dT%H:%M:%SZ); log $log)"
  local r s res sec det
  { printf '%-24s %-28s %7s  %s\n' step result seconds detail
    printf '%-24s %-28s %7s  %s\n' ---- ------ ------- ------
    for r in "${rows[@]}"; do
      IFS='|' read -r s res sec det <<<"$r"
      printf '%-24s %-28s %7s  %s\n' "$s" "$res" "$sec" "$det"
    done; } | tee -a "$log"
  say "total $(( $(date +%s) - started )) s; $([ $failed -eq 0 ] && echo "no failure" || echo "FAILED")"
}
finish() { summary; exit $failed; }

# run_step NAME LIMIT FUNCTION: FUNCTION runs in a child bash under timeout (its whole process group
# killed at the limit, which the time left of the 570 s shortens); it writes one line of detail
# to $w/detail and returns 0 pass, 1 FAIL, 3 not available in this tree, 4 skipped.
run_step() {
  local name=$1 limit=$2 fn=$3 left t0 rc res det
  left=$(( total_limit - ($(date +%s) - started) ))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    row "$name" FAIL 0 "no time left of the ${total_limit} s"
    return 1
  fi
  : >"$w/detail"
  say "== $name (limit $limit s)"
  t0=$(date +%s)
  timeout -k 10 "$limit" bash -c "set -uo pipefail; $fn" >>"$log" 2>&1
  rc=$?
  det=$(head -n 1 "$w/detail")
  case $rc in
    0) res=pass ;;
    3) res="not available in this tree" ;;
    4) res=skipped ;;
    124 | 137) res=FAIL det="over its ${limit} s limit${det:+; $det}" ;;
    *) res=FAIL ;;
  esac
  row "$name" "$res" "$(( $(date +%s) - t0 ))" "$det"
  [ "$res" != FAIL ]
}

# --- the bundle ---------------------------------------------------------------------------------
t0=$(date +%s)
[ -f "$bundle" ] || { row bundle FAIL 0 "no $bundle: run scripts/device-bundle.sh here, carry device-bundle/bundle.tar.xz"; finish; }
if [ $dry -eq 1 ] || [ ! -f "$unpack_to/env.sh" ] || [ "$bundle" -nt "$unpack_to/env.sh" ]; then
  mkdir -p "$unpack_to"
  rm -rf "${unpack_to:?}"/{usr,etc,env.sh,PACKAGES.txt}
  if command -v xz >/dev/null; then
    tar -xJf "$bundle" -C "$unpack_to"
  else # tar without xz: Python's tarfile reads it
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle" "$unpack_to"
  fi || { row bundle FAIL $(( $(date +%s) - t0 )) "could not unpack $bundle"; finish; }
fi
. "$unpack_to/env.sh" || { row bundle FAIL 0 "could not source $unpack_to/env.sh"; finish; }
export TYCHO_BUNDLE
hidden=""
if [ $dry -eq 1 ]; then
  # pkg-config and CMake look into the bundle alone
  export PKG_CONFIG_LIBDIR=$TYCHO_BUNDLE/usr/lib/x86_64-linux-gnu/pkgconfig:$TYCHO_BUNDLE/usr/share/pkgconfig
  export CMAKE_PREFIX_PATH=$TYCHO_BUNDLE/usr
  if [ "${TYCHO_DEVICE_CHECK_NS:-0}" = 1 ]; then
    n=$(hide_system) || { row bundle FAIL 0 "could not hide the system's packages"; finish; }
    . "$unpack_to/env.sh" # again: a fallback library is used where the system's is now hidden
    hidden="; the system's copies hidden ($n mounts)"
  else
    hidden="; the system's copies NOT hidden (needs root and unshare)"
  fi
fi
# Open MPI as root, ranks sharing the cores, shared memory only (as tests/mpi.cmake runs it)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
  OMPI_MCA_btl=self,vader
tools=""
for tool in pkg-config mpicc mpirun; do
  p=$(command -v $tool) || p=none
  case "$p" in "$TYCHO_BUNDLE"/*) ;; *) row bundle FAIL $(( $(date +%s) - t0 )) "$tool is $p, not the bundle's"; finish ;; esac
done
bsize=$(stat -c %s "$bundle")
row bundle pass $(( $(date +%s) - t0 )) "$(awk -v b="$bsize" 'BEGIN { printf "%.1f MiB", b / 1048576 }') unpacked into $TYCHO_BUNDLE; pkg-config, mpicc, mpirun from it$hidden"

# The bundle's mpirun starts 2 ranks (PMIx and Open MPI relocated by OPAL_PREFIX / PMIX_PREFIX).
t0=$(date +%s)
out=$(timeout 30 mpirun -np 2 sh -c 'echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE on $(uname -n)"' 2>&1)
rc=$?
printf '%s\n' "$out" >>"$log"
if [ $rc -eq 0 ] && [ "$(printf '%s\n' "$out" | grep -c '^rank [01] of 2 on ')" -eq 2 ]; then
  row "mpirun -np 2" pass $(( $(date +%s) - t0 )) "$(printf '%s\n' "$out" | sort | tr '\n' ';' | sed 's/;$//')"
else
  row "mpirun -np 2" FAIL $(( $(date +%s) - t0 )) "exit $rc: $(printf '%s\n' "$out" | head -n 2 | tr '\n' ' ')"
fi

# --- configure and build ------------------------------------------------------------------------
export BUILD=$build ROOT=$root W=$w TYCHO=$build/tycho COMM_FIELD=$comm_field DRY=$dry
cmake_args=(-S "$root" -B "$build" -DTYCHO_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release)
command -v ninja >/dev/null && cmake_args+=(-G Ninja)
# NCCL from PyTorch's wheel (nvidia-nccl-cu13) where the CUDA toolkit has none: it ships
# libnccl.so.2 alone, so a libnccl.so link is made for find_library
nvcc_dir=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
if [ ! -e /usr/include/nccl.h ] && [ ! -e "$nvcc_dir/../include/nccl.h" ]; then
  nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null) || nccl=""
  if [ -n "$nccl" ] && [ -e "$nccl/include/nccl.h" ] && [ -e "$nccl/lib/libnccl.so.2" ]; then
    mkdir -p "$build/nccl-link"
    ln -sfn "$nccl/lib/libnccl.so.2" "$build/nccl-link/libnccl.so"
    cmake_args+=(-DNCCL_INCLUDE_DIR="$nccl/include" -DNCCL_LIBRARY="$build/nccl-link/libnccl.so")
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$nccl/lib
  fi
fi
printf -v CMAKE_ARGS '%q ' "${cmake_args[@]}"
export CMAKE_ARGS

step_configure() {
  local fresh=""
  # a cache from another place of the bundle (or none) keeps its paths: configure afresh
  [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "=$TYCHO_BUNDLE/" "$BUILD/CMakeCache.txt" && fresh=--fresh
  cmake $fresh $CMAKE_ARGS 2>&1 | tee "$W/configure.out"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "cmake failed (log)" >"$W/detail"; return 1; }
  if ! grep -q 'tycho: CUDA backend ON' "$W/configure.out"; then
    echo "!!! the configure output does not say 'tycho: CUDA backend ON': $(grep -m1 'tycho: CUDA ' "$W/configure.out")"
    if [ "$DRY" = 1 ] && ! command -v nvcc >/dev/null; then
      echo "CUDA backend OFF: no nvcc on this machine (a dry run may lack it)" >"$W/detail"
      return 4
    fi
    echo "the configure output does not say 'tycho: CUDA backend ON'" >"$W/detail"
    return 1
  fi
  # Lua, MPI and OpenBLAS found inside the bundle's prefix (the dry run: readline and oneDNN too,
  # the system's being hidden; there they may come from the machine, and are optional)
  local cache=$BUILD/CMakeCache.txt v val bad="" note="" cuda
  for v in pkgcfg_lib_LUA_lua5.4 LUA_INCLUDE_DIRS MPI_C_COMPILER MPI_mpi_LIBRARY MPI_C_HEADER_DIR \
           pkgcfg_lib_OPENBLAS_openblas OPENBLAS_INCLUDE_DIRS READLINE_LIBRARY READLINE_INCLUDE_DIR DNNL_LIBRARY DNNL_INCLUDE_DIR; do
    val=$(sed -n "s/^$v:[A-Z]*=//p" "$cache" | head -n 1)
    echo "$v = $val"
    case "$v:$val" in
      *:"$TYCHO_BUNDLE"/*) ;;
      READLINE*:*-NOTFOUND | DNNL*:*-NOTFOUND | READLINE*: | DNNL*:) [ "$DRY" = 1 ] && bad="$bad $v=${val:-unset}" || note="$note ${v%%_*} not found;" ;;
      READLINE*:* | DNNL*:*) [ "$DRY" = 1 ] && bad="$bad $v=$val" || note="$note ${v%%_*} from $val;" ;;
      *) bad="$bad $v=${val:-unset}" ;;
    esac
  done
  grep -m1 'tycho: CUDA ' "$W/configure.out"
  # the BLAS linked (CMakeLists.txt prefers a system-wide OpenMP build where one is installed)
  val=$(grep -m1 -o 'OpenBLAS[^;]*$' "$W/configure.out")
  case "$val" in *"$TYCHO_BUNDLE"/*) ;; *) bad="$bad linked: $val" ;; esac
  cuda=$(sed -n 's/.*tycho: CUDA \(ON\|OFF\) (cuBLAS and NCCL \(ON\|OFF\).*/CUDA \1, NCCL \2/p' "$W/configure.out" | head -n 1)
  if [ -n "$bad" ]; then
    echo "CUDA backend ON; not in the bundle:$bad" >"$W/detail"
    return 1
  fi
  echo "CUDA backend ON ($cuda); Lua, MPI, OpenBLAS$([ "$DRY" = 1 ] && echo ", readline, oneDNN") found in the bundle;$note" | sed 's/;$//' >"$W/detail"
}
step_build() {
  local rc
  if [ -n "${BUILD_TARGETS:-}" ]; then
    cmake --build "$BUILD" -j "$(nproc)" --target $BUILD_TARGETS; rc=$?
  else
    cmake --build "$BUILD" -j "$(nproc)"; rc=$?
  fi
  [ $rc -eq 0 ] || { echo "the build failed (log)" >"$W/detail"; return 1; }
  echo "built ${BUILD_TARGETS:-everything} with $(nproc) jobs" >"$W/detail"
}
export -f step_configure step_build
if ! run_step configure 120 step_configure; then
  finish
fi
if [ $dry -eq 1 ] && [ ${#build_targets[@]} -eq 0 ]; then
  row build skipped 0 "dry run: configure only (--build TARGET builds targets)"
else
  [ $dry -eq 1 ] && export BUILD_TARGETS="${build_targets[*]}"
  run_step build 330 step_build || finish
fi

# --- the dry run's own run: tycho from the bundle's libraries, 2 ranks under its mpirun ----------
step_dry_tycho() {
  local libs
  libs=$(ldd "$TYCHO" | grep -E 'liblua|libmpi|libopenblas|libdnnl|libreadline|libgfortran')
  echo "$libs"
  if printf '%s\n' "$libs" | grep -v "=> $TYCHO_BUNDLE/" | grep -q .; then
    echo "linked outside the bundle: $(printf '%s\n' "$libs" | grep -v "=> $TYCHO_BUNDLE/" | head -n 1)" >"$W/detail"
    return 1
  fi
  mpirun -np 2 "$TYCHO" run "$ROOT/plans/tiny.lua" --set train.steps=2 --set train.eval_every=0 \
    --set train.eval_batches=0 --set log.every=1 >"$W/dry.out" 2>&1
  local rc=$?
  cat "$W/dry.out"
  [ $rc -eq 0 ] && grep -q '^step 2/2 | loss ' "$W/dry.out" ||
    { echo "mpirun -np 2 tycho run plans/tiny.lua: exit $rc" >"$W/detail"; return 1; }
  echo "$(grep -c '=>' <<<"$libs") libraries from the bundle; 2 ranks: $(grep '^step 2/2' "$W/dry.out" | cut -d'|' -f1-2)" >"$W/detail"
}
export -f step_dry_tycho
if [ $dry -eq 1 ]; then
  case " ${build_targets[*]} " in
    *" tycho "*) run_step "dry: tycho on 2 ranks" 120 step_dry_tycho ;;
  esac
  for s in "a. ctest -L cuda" "b. tiny fp32 gpu/cpu" "b. tiny bf16 gpu/cpu" "c. staged tp2 gpu/cpu" \
           "c. staged dp2 zero3" "c. staged tp2 sp bf16" "d. nccl 1 rank" "e. gpu bill vs peaks" "f. bench_gpu"; do
    row "$s" skipped 0 "dry run"
  done
  finish
fi

# --- the GPU steps ------------------------------------------------------------------------------
# Steps of training compared: 50 (the issue's tiny run), every loss in the metrics.
export STEPS=50
run_args() { # the common --set of every compared run: no evaluation, metrics into FILE
  echo "--set train.steps=$STEPS --set train.eval_every=0 --set train.eval_batches=0 --set log.every=10 --set log.metrics=$1"
}
# compare A.jsonl B.jsonl BOUND WHAT: every step's loss of A (the GPU) within BOUND of B's (the CPU)
compare() {
  local verdict
  verdict=$(paste <(grep -o '"loss": [-0-9.eE+]*' "$1" | awk '{ print $2 }') \
                  <(grep -o '"loss": [-0-9.eE+]*' "$2" | awk '{ print $2 }') | awk -v tol="$3" -v want="$STEPS" '
    { d = ($1 - $2) / $2; d = d < 0 ? -d : d; if (d > worst) { worst = d; at = NR } n++ }
    END { if (n != want) printf "FAIL %d of %d steps compared", n, want
          else if (worst > tol) printf "FAIL worst relative loss difference %.3g at step %d > %g", worst, at, tol
          else printf "ok worst relative loss difference %.3g (step %d) <= %g over %d steps", worst, at, tol, n }')
  echo "$4: $verdict"
  echo "$4: ${verdict#ok }" >"$W/detail"
  case "$verdict" in ok*) return 0 ;; *) return 1 ;; esac
}
# gpu_path: the GPU run path is in this tree when the binary says it has the CUDA backend
gpu_path() {
  "$TYCHO" --version | grep -q 'with the CUDA backend' && return 0
  echo "tycho --version: '$("$TYCHO" --version)': the run path has no CUDA backend" >"$W/detail"
  return 3
}
# comm_value VALUE: the comm plan field takes VALUE (tycho check says so); else not in this tree
comm_value() {
  local err
  err=$("$TYCHO" check "$ROOT/plans/tiny.lua" --world 2 --set device=cuda --set "$COMM_FIELD=$1" 2>&1 >/dev/null) && return 0
  echo "tycho check --set $COMM_FIELD=$1: $(printf '%s' "$err" | head -n 1 | cut -c1-160)" >"$W/detail"
  return 3
}
export -f run_args compare gpu_path comm_value

step_ctest() {
  ctest --test-dir "$BUILD" -L cuda --output-on-failure --timeout 100 2>&1 | tee "$W/ctest.out"
  local rc=${PIPESTATUS[0]} line
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$W/ctest.out" | tail -n 1)
  if grep -q 'No tests were found' "$W/ctest.out" || [ -z "$line" ]; then
    echo "no test with the label cuda ran" >"$W/detail"; return 1
  fi
  if grep -q '\*\*\*Skipped' "$W/ctest.out"; then
    echo "skipped on a GPU machine (no device visible?): $line" >"$W/detail"; return 1
  fi
  echo "$line" >"$W/detail"
  [ "$rc" -eq 0 ]
}
step_tiny() { # PRECISION BOUND
  gpu_path || return $?
  local p=$1 tol=$2 extra=""
  [ "$p" = bf16 ] && extra="--set precision.compute=bf16"
  "$TYCHO" run "$ROOT/plans/tiny.lua" --set device=cpu $extra $(run_args "$W/cpu_$p.jsonl") >"$W/cpu_$p.out" 2>&1
  local rc=$?
  tail -n 3 "$W/cpu_$p.out"
  if [ $rc -ne 0 ]; then
    if [ "$p" = bf16 ] && grep -q 'oneDNN: no bf16 matmul\|no bf16' "$W/cpu_$p.out"; then
      echo "the CPU reference refuses bf16: $(grep -m1 'bf16' "$W/cpu_$p.out" | cut -c1-140)" >"$W/detail"; return 4
    fi
    echo "the CPU run failed: exit $rc: $(tail -n 1 "$W/cpu_$p.out" | cut -c1-140)" >"$W/detail"; return 1
  fi
  "$TYCHO" run "$ROOT/plans/tiny.lua" --set device=cuda $extra $(run_args "$W/gpu_$p.jsonl") >"$W/gpu_$p.out" 2>&1
  rc=$?
  grep -E '^(kernels|device|precision):' "$W/gpu_$p.out"
  tail -n 3 "$W/gpu_$p.out"
  [ $rc -eq 0 ] || { echo "the GPU run failed: exit $rc: $(tail -n 1 "$W/gpu_$p.out" | cut -c1-140)" >"$W/detail"; return 1; }
  grep -q '^kernels: the CUDA backend' "$W/gpu_$p.out" ||
    { echo "the device = cuda run did not say it ran the CUDA backend's kernels" >"$W/detail"; return 1; }
  compare "$W/gpu_$p.jsonl" "$W/cpu_$p.jsonl" "$tol" "$p"
}
step_staged() { # NAME SETS...   (TOL: the loss bound, 1e-5 unless set)
  gpu_path || return $?
  comm_value staged || return $?
  local name=$1; shift
  OMP_NUM_THREADS=4 mpirun -np 2 "$TYCHO" run "$ROOT/plans/tiny.lua" --set device=cpu "$@" \
    $(run_args "$W/cpu_$name.jsonl") >"$W/cpu_$name.out" 2>&1 ||
    { tail -n 5 "$W/cpu_$name.out"; echo "the CPU run on 2 ranks failed: $(tail -n 1 "$W/cpu_$name.out" | cut -c1-140)" >"$W/detail"; return 1; }
  OMP_NUM_THREADS=4 mpirun -np 2 "$TYCHO" run "$ROOT/plans/tiny.lua" --set device=cuda --set "$COMM_FIELD=staged" "$@" \
    $(run_args "$W/gpu_$name.jsonl") >"$W/gpu_$name.out" 2>&1 ||
    { tail -n 5 "$W/gpu_$name.out"; echo "the GPU run on 2 ranks failed: $(tail -n 1 "$W/gpu_$name.out" | cut -c1-140)" >"$W/detail"; return 1; }
  grep -E '^(kernels|device|mesh|data parallel)' "$W/gpu_$name.out"
  compare "$W/gpu_$name.jsonl" "$W/cpu_$name.jsonl" "${TOL:-1e-5}" "$name, 2 ranks on one GPU, staged"
}
step_nccl() {
  gpu_path || return $?
  comm_value nccl || return $?
  grep -q 'cuBLAS and NCCL ON' "$W/configure.out" ||
    { echo "the plan takes $COMM_FIELD = nccl but the build found no NCCL (configure: $(grep -o 'cuBLAS and NCCL [A-Z]*' "$W/configure.out"))" >"$W/detail"; return 1; }
  [ -s "$W/cpu_fp32.jsonl" ] || "$TYCHO" run "$ROOT/plans/tiny.lua" --set device=cpu $(run_args "$W/cpu_fp32.jsonl") >"$W/cpu_fp32.out" 2>&1 ||
    { echo "the CPU run failed" >"$W/detail"; return 1; }
  mpirun -np 1 "$TYCHO" run "$ROOT/plans/tiny.lua" --set device=cuda --set "$COMM_FIELD=nccl" \
    $(run_args "$W/gpu_nccl.jsonl") >"$W/gpu_nccl.out" 2>&1 ||
    { tail -n 5 "$W/gpu_nccl.out"; echo "the NCCL run failed: $(tail -n 1 "$W/gpu_nccl.out" | cut -c1-140)" >"$W/detail"; return 1; }
  compare "$W/gpu_nccl.jsonl" "$W/cpu_fp32.jsonl" 1e-5 "1 rank, NCCL"
}
step_bill() {
  gpu_path || return $?
  grep -q '^done: ' "$W/gpu_fp32.out" 2>/dev/null ||
    { echo "no finished GPU run of step b to compare with" >"$W/detail"; return 1; }
  "$TYCHO" check "$ROOT/plans/tiny.lua" --set device=cuda >"$W/check.out" 2>&1 ||
    { echo "tycho check --set device=cuda failed: $(tail -n 1 "$W/check.out")" >"$W/detail"; return 1; }
  grep -A3 '^memory' "$W/check.out"
  grep '^memory peak' "$W/gpu_fp32.out"
  local billed peaks
  billed=$(grep -A2 '^memory' "$W/check.out" | tail -n 1 | grep -oE '[0-9.]+ (B|KiB|MiB|GiB)' | tr '\n' ' ')
  peaks=$(grep -m1 '^memory peak' "$W/gpu_fp32.out" | grep -oE '[0-9.]+ (B|KiB|MiB|GiB)' | tr '\n' ' ')
  if [ -n "$peaks" ] && [ "$billed" = "$peaks" ]; then
    echo "check's bill = the GPU run's peaks: $peaks" >"$W/detail"; return 0
  fi
  echo "check bills '$billed', the GPU run peaked at '${peaks:-no memory peak line}'" >"$W/detail"
  return 1
}
step_bench() {
  local exe kexe krc=0
  exe=$(find "$BUILD" -maxdepth 2 -type f -perm -u+x -name bench_gpu | head -n 1)
  kexe=$(find "$BUILD" -maxdepth 2 -type f -perm -u+x -name bench_kernels_gpu | head -n 1)
  if [ -z "$exe" ]; then
    echo "no bench_gpu target in this tree" >"$W/detail"; return 3
  fi
  if [ -n "$kexe" ]; then
    timeout 40 "$kexe" 2>&1 | tee "$W/bench_kernels.out"
    krc=${PIPESTATUS[0]}
  fi
  "$exe" 2>&1 | tee "$W/bench.out"
  local rc=${PIPESTATUS[0]}
  # the summary's line: bench_gpu's last (tokens/s, MFU, the ratios to PyTorch)
  echo "$([ "$rc" -eq 0 ] || echo "exit $rc: ")$(tail -n 1 "$W/bench.out" | sed 's/^bench_gpu: //' | cut -c1-170)$([ "$krc" -eq 0 ] || echo "; bench_kernels_gpu exit $krc")" >"$W/detail"
  [ "$rc" -eq 0 ] && [ "$krc" -eq 0 ]
}
export -f step_ctest step_tiny step_staged step_nccl step_bill step_bench

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$log" 2>&1
run_step "a. ctest -L cuda" 120 step_ctest
run_step "b. tiny fp32 gpu/cpu" 60 "step_tiny fp32 1e-5"
run_step "b. tiny bf16 gpu/cpu" 75 "step_tiny bf16 1e-4"
run_step "c. staged tp2 gpu/cpu" 60 "step_staged tp2 --set mesh.tp=2"
run_step "c. staged dp2 zero3" 60 "step_staged dp2_zero3 --set zero=3"
run_step "c. staged tp2 sp bf16" 60 "TOL=1e-4 step_staged tp2_sp_bf16 --set mesh.tp=2 --set sequence_parallel=true --set precision.compute=bf16"
run_step "d. nccl 1 rank" 45 step_nccl
run_step "e. gpu bill vs peaks" 30 step_bill
run_step "f. bench_gpu" 180 step_bench
finish
