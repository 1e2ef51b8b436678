#!/usr/bin/env bash
# The GPU suite: the one command that produces the committed GPU results (examples/results/).
#
#   . gpu/setup.sh && bash examples/gpu_suite.sh RESULTS_DIR [PART ...]
#
# Run from the repository root on the GPU machine. The parts (default: all three, in this order):
#   native    build the library (JIT, this GPU's arch, with its time); pytest -m cuda over compile_tests (CUDA
#             numerics incl. fp8 caches, CUDA graphs, reduce-overhead, opcheck, the DDTree ops and loop, the
#             has-kernel answer and the gate), then the bad-input cases (each in a process of its own, forked from a
#             server that loaded the library once: compile_tests/fresh_process.py); the SGLang backend on GPU;
#             compute-sanitizer memcheck and racecheck on examples/sanitize_case.py (every kernel path, DDTree rounds
#             with tied scores)
#   emulated  the CUDA tests once per emulated architecture class (KDTREE_OPS_EMULATE_ARCH=80: sm_80; =120: the
#             99 KB class): each class's configurations and code path on this sm_90 GPU, under its limits
#   bench     python -m kdtree_ops bench (G1-G5, M1-M5, bf16 and the fp8 column by both fp8 paths: the default
#             widen path and KDTREE_OPS_FP8_PATH=overlap), the same for kdtree under each
#             emulated class (and from the 99 KB class's run an estimate for the RTX PRO 6000), bench --ddtree, and
#             the gather probe (examples/gather_probe.cu, Hopper). Run it first where a call holds one part: it is the
#             only part no test replaces
# Each part writes RESULTS_DIR/<part>/ and appends its stages to RESULTS_DIR/stages.tsv; every run rebuilds
# RESULTS_DIR/summary.md from all the parts present, so the parts may run in separate calls of a lent machine (one
# call of 10 minutes does not hold all three) into one results folder. KDTREE_OPS_UNVERIFIED=1 is set: the suite is
# what verifies the families not yet marked verified (csrc/verified_families.cpp). Each stage may fail without
# stopping the later ones; the run keeps within KDTREE_SUITE_BUDGET_S seconds (default 560). To finish what an earlier
# call of the same sources left undone: KDTREE_SUITE_SKIP="part/stage ..." records those stages as skipped, and
# KDTREE_SUITE_TESTS names the test files of native/tests (default: compile_tests).
set -u -o pipefail

out=${1:?usage: bash examples/gpu_suite.sh RESULTS_DIR [native] [emulated] [bench]}
shift
parts=("$@")
(( ${#parts[@]} )) || parts=(native emulated bench)
for part in "${parts[@]}"; do
  case $part in native|emulated|bench) ;; *) echo "gpu_suite.sh: unknown part '$part'" >&2; exit 2 ;; esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
exec > >(tee -a "$out/suite.log") 2>&1

budget=${KDTREE_SUITE_BUDGET_S:-560}
start=$(date +%s)
export KDTREE_OPS_CACHE_DIR=${KDTREE_OPS_CACHE_DIR:-/tmp/kdtree_ops_cache}
export KDTREE_OPS_UNVERIFIED=1
export PYTHONUNBUFFERED=1
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"  # scripts run from examples/ import the checkout
py=${PYTHON:-python3}
stages="$out/stages.tsv"
[ -f "$stages" ] || printf 'part\tstage\tstatus\texit\tseconds\n' > "$stages"

commit=${KDTREE_OPS_COMMIT:-$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)}
export KDTREE_OPS_COMMIT=$commit
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit_note="$commit (+ uncommitted changes)"
else
  commit_note=$commit
fi

# limit CAP RESERVE: seconds for the next stage — at most CAP, leaving RESERVE for the stages after it.
limit() {
  local left=$(( budget - ($(date +%s) - start) - $2 ))
  (( left > $1 )) && left=$1
  (( left < 10 )) && left=10
  echo "$left"
}

# stage PART NAME CAP RESERVE CMD...: runs CMD under a time limit (SIGINT first, so pytest still writes its
# report), logs to RESULTS_DIR/PART/NAME.log, records status/exit/seconds.
stage() {
  local part=$1 name=$2 cap=$3 reserve=$4; shift 4
  local t0 secs rc status lim
  mkdir -p "$out/$part"
  if [[ " ${KDTREE_SUITE_SKIP:-} " == *" $part/$name "* ]]; then
    printf '%s\t%s\t%s\t%s\t%s\n' "$part" "$name" "skipped (KDTREE_SUITE_SKIP)" "-" 0 >> "$stages"
    echo "=== [$part/$name] skipped (KDTREE_SUITE_SKIP)"
    return 0
  fi
  lim=$(limit "$cap" "$reserve")
  echo "=== [$part/$name] (limit ${lim}s) $*"
  t0=$(date +%s)
  timeout -s INT -k 15 "$lim" "$@" > "$out/$part/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  case $rc in
    0) status=ok ;;
    5) status="ok (no tests selected)" ;;
    124|137) status="timeout(${lim}s)" ;;
    *) status=failed ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\n' "$part" "$name" "$status" "$rc" "$secs" >> "$stages"
  tail -n 25 "$out/$part/$name.log"
  echo "=== [$part/$name] $status (exit $rc) in ${secs}s"
  return 0
}

# --- environment ------------------------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "parts: ${parts[*]}"
  echo "commit: $commit_note"
  # Independent of git metadata (a copied checkout may carry a stale HEAD): compare with the same line run on
  # a checkout of the commit you expect.
  echo "source digest: $(cd "$repo" && find csrc kdtree_ops examples compile_tests -type f \
    \( -name '*.py' -o -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.sh' \) \
    -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)"
  echo "host: $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader \
    2>/dev/null | sed 's/^/gpu: /'
  $py - <<'PY' 2>&1
import platform, torch
print("python:", platform.python_version())
print("torch:", torch.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB)")
for mod in ("triton", "sglang"):
    try:
        print(f"{mod}:", __import__(mod).__version__)
    except Exception as e:
        print(f"{mod}: not importable ({type(e).__name__}: {e})")
PY
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
} > "$out/environment-$(date +%s).txt"
cat "$out"/environment-*.txt | tail -n 14

# The build (cached across parts and calls on a warm machine): the first stage of every part.
build() {
  stage "$1" build 300 "$2" $py -c "
import time
t = time.monotonic()
import kdtree_ops.ops, torch
print(f'build+load: {time.monotonic() - t:.1f} s')
print('CUDA kernels:', torch._C._dispatch_has_kernel_for_dispatch_key('kdtree::tree_verify_attention', 'CUDA'))
"
}

sanitizer=$(command -v compute-sanitizer || true)
if [ -z "$sanitizer" ]; then
  home=${CUDA_HOME:-$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)}
  for c in "$home/bin/compute-sanitizer" "$home/compute-sanitizer/compute-sanitizer" \
           /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    [ -x "$c" ] && sanitizer=$c && break
  done
fi

for part in "${parts[@]}"; do
  case $part in
  native)
    build native 400
    # The bad-input cases, each in a process of its own, as a stage of their own (their time is the children's).
    stage native tests 200 300 $py -m pytest ${KDTREE_SUITE_TESTS:-compile_tests} -m cuda -k "not test_bad_input" -v -p no:cacheprovider \
      --durations=15 --junitxml="$out/native/pytest_cuda.xml"
    stage native errors 200 120 $py -m pytest compile_tests -m cuda -k "test_bad_input" -p no:cacheprovider \
      --durations=5 --junitxml="$out/native/pytest_cuda_errors.xml"
    # The SGLang backend suite needs a GPU as a whole; whatever of it is not marked `cuda` runs here.
    stage native sglang_gpu 300 60 $py -m pytest compile_tests/test_sglang_backend_gpu.py -m "not cuda" -v \
      -p no:cacheprovider --durations=10 --junitxml="$out/native/pytest_sglang_gpu.xml"
    if [ -n "$sanitizer" ]; then
      # Without the caching allocator every tensor is its own allocation, so memcheck sees out-of-bounds reads
      # that would otherwise land inside a neighbouring pooled block.
      stage native memcheck 90 40 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$sanitizer" --tool memcheck \
        --error-exitcode 1 $py examples/sanitize_case.py
      stage native racecheck 120 0 "$sanitizer" --tool racecheck --error-exitcode 1 $py examples/sanitize_case.py
    else
      printf 'native\tmemcheck\tnot-found\t-\t0\nnative\tracecheck\tnot-found\t-\t0\n' >> "$stages"
    fi
    ;;
  emulated)
    build emulated 300
    # The CUDA tests but the bad-input cases (host checks, the same for every class; the has-kernel answer and the
    # gate, which depend on the class, do run) and the SGLang suite.
    for arch in 80 120; do
      stage emulated "tests_sm$arch" 220 $(( arch == 80 ? 150 : 0 )) env KDTREE_OPS_EMULATE_ARCH=$arch \
        $py -m pytest compile_tests -m cuda -k "not test_bad_input" -p no:cacheprovider \
        --ignore=compile_tests/test_sglang_backend_gpu.py --durations=10 --junitxml="$out/emulated/pytest_cuda_sm$arch.xml"
    done
    ;;
  bench)
    build bench 250
    stage bench bench 300 150 $py -m kdtree_ops.bench --out "$out/bench/bench"
    # Each emulated class's configurations timed on this GPU (kdtree alone, bf16 and fp8 by both paths: a number for
    # judging the design, not the class's GPU), and for the 99 KB class an estimate for the RTX PRO 6000
    # (bench/estimate.py).
    for arch in 80 120; do
      stage bench "bench_sm$arch" 90 $(( arch == 80 ? 100 : 30 )) env KDTREE_OPS_EMULATE_ARCH=$arch \
        $py -m kdtree_ops.bench --impls kdtree,kdtree_fp8_overlap --samples 15 --out "$out/bench/sm$arch"
    done
    [ -f "$out/bench/sm120/bench.json" ] && $py -m kdtree_ops.bench.estimate "$out/bench/sm120/bench.json" \
      > "$out/bench/estimate.log" 2>&1
    stage bench ddtree 60 20 $py -m kdtree_ops.bench --ddtree --out "$out/bench/bench"
    if [ "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1)" = "9.0" ]; then
      probe_dir=$(mktemp -d)
      stage bench gather_probe 60 0 bash -c "nvcc -O3 -std=c++17 -arch=sm_90a examples/gather_probe.cu \
        -o '$probe_dir/gather_probe' && '$probe_dir/gather_probe'"
      rm -rf "$probe_dir"
    fi
    ;;
  esac
done

# --- summary of every part present --------------------------------------------------------------------
$py examples/gpu_summary.py "$out"

# Sanitizer logs can be long: keep their heads and tails only.
for f in "$out"/native/memcheck.log "$out"/native/racecheck.log; do
  if [ -f "$f" ] && [ "$(wc -c < "$f")" -gt 200000 ]; then
    { head -c 100000 "$f"; echo; echo "[... truncated ...]"; tail -c 100000 "$f"; } > "$f.tmp" && mv "$f.tmp" "$f"
  fi
done
echo "GPU suite (${parts[*]}) done in $(( $(date +%s) - start )) s; results in $out"
