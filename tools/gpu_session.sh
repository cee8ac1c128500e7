#!/usr/bin/env bash
# The GPU half in one command: `bash tools/gpu_session.sh` from the repository root of a bare GPU
# machine (no network), with $OUT naming a folder whose files come back and .gpu-kit/ beside the
# working tree (`make gpu-kit`). The image brings Python, a CUDA torch, Triton, numpy, matplotlib,
# pytest and pytest-xdist (tools/gpu-image-packages.txt); the kit brings the rest
# (tools/gpu-kit.txt), installed here with pip --no-index --no-deps --target.
#
# Steps, each with its own time limit (seconds, below) and log:
#   1 tests      the library tests with MPCOURSE_DEVICE=cuda under xdist, less the files that
#                cannot run there (book build, browser, release linters, nbgrader grading): SKIP_TESTS
#   2 notebooks  every book notebook under nbval on CUDA with MPCOURSE_RECORD_GPU set, under
#                xdist, less the ones that time or measure peak memory...
#   3 alone      ...which run here, one at a time, with the GPU to themselves: TIMING_NOTEBOOKS
#   4 bench      python -m mpcourse bench --budget-s BENCH_BUDGET_S, its do_bench comparison
#                included, alone on the GPU
# After each step its log and the results so far are packed into $OUT at once (whatever is there
# comes back even if the command is killed): summary.txt (counts passed / skipped with reasons /
# failed and wall time per step), 1-tests.log, 2-notebooks.log, 3-alone.log, 4-bench.log and
# results.tar.gz (env.txt, JUnit XML per step, gpu-record/<device-slug>/*.json,
# bench-report/<device-slug>-<date>/): six files.
#
# Without a CUDA GPU (`make gpu-rehearsal`), the GPU-only parts skip with a reason: the tests
# run on the CPU, nothing is recorded, the bench's do_bench comparison says why it did not run.
# QUICK=1 runs a few test files and notebooks only (a rehearsal on a slow machine).
# A second window reruns only what failed in the first: GPU_TESTS (pytest paths or node ids),
# GPU_NOTEBOOKS and GPU_ALONE (notebook stems), each "-" for none, GPU_BENCH=0 (no benchmark); e.g.
#   GPU_TESTS="tests/test_formats.py" GPU_NOTEBOOKS="06_fp8" GPU_ALONE="12_recipe" GPU_BENCH=0 bash tools/gpu_session.sh
# Under xdist a kernel can die before it replies (two kernels' ports collide as they start): the
# notebooks whose every failure is such a start are run once more, one at a time, in step 2.
#
# On this workplace's GPU machine (the device tool; about 15 minutes of GPU time in all, its start
# included): `make gpu-kit` here first, then one call with the kit carried along, e.g.
#   run(command="bash tools/gpu_session.sh", carry=[".gpu-kit"], timeout_s=570)
# and unpack $OUT's results.tar.gz: bench-report/<slug>-<date>/ goes to mpcourse/data/bench/,
# gpu-record/<slug>/ to mpcourse/data/gpu/<slug>/ (book/gpu_reports.md).
set -u -o pipefail

# Limits in seconds (tests/test_gpu_kit.py parses these lines: keep them "NAME=number  # ...").
LIMIT_SETUP=30       # install the kit, read the device (16 s on the H200)
LIMIT_TESTS=100      # step 1 (52 s on the H200, 2026-11-29)
LIMIT_NOTEBOOKS=130  # step 2 (82 s), its retry of kernels that died at start included
LIMIT_ALONE=200      # step 3 (03, 06b and 07 took 87 s; 12_recipe did not finish in 100 s)
LIMIT_BENCH=75       # step 4
BENCH_BUDGET_S=50    # the bench's own budget, inside LIMIT_BENCH
TOTAL_LIMIT=540      # the whole command: 9 minutes
SKIP_TESTS="test_book.py test_browser.py test_release.py test_exercises.py test_grading.py test_instructor.py test_handing_in.py test_student_answers.py test_judge.py test_observed_ex1_precision_comparison.py test_observed_ex2_loss_scaling.py test_observed_ex3_dynamic_range.py test_observed_ex5_mixed_precision_speedup.py test_observed_ex6_fp8_quantization.py test_observed_ex7_fp16_nan_hunt.py test_observed_ex8_bitwise_resume.py test_large_class.py test_collect_again.py postgres.py"
TIMING_NOTEBOOKS="03_mixed_precision_training 06b_fp8_recipes 07_hardware 12_recipe"

# A rehearsal on a slow machine may stretch every limit by a factor (never on the GPU).
SCALE=${LIMIT_SCALE:-1}
QUICK=${QUICK:-0}
QUICK_TESTS="tests/test_gpu_kit.py tests/test_bench.py tests/test_formats.py"
QUICK_NOTEBOOKS="01_floating_point 05_bf16_and_tf32"
QUICK_ALONE="07_hardware"
WORKERS=${WORKERS:-8}
PY=${PYTHON:-python3}
KIT=${GPU_KIT:-.gpu-kit}

START=$(date +%s)
: "${OUT:?set OUT to the folder whose files come back}"
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mpcourse-gpu.XXXXXX")
RESULTS=$WORK/results
mkdir -p "$OUT" "$RESULTS/junit" "$RESULTS/gpu-record" "$RESULTS/bench-report"
: > "$OUT/summary.txt"

say() { echo "$*" | tee -a "$OUT/summary.txt"; }
left() { echo $(( START + TOTAL_LIMIT * SCALE - $(date +%s) )); }
limit() {  # a step's limit: its own, scaled, but never past the whole command's end (15 s kept)
    local own=$(( $1 * SCALE )) rest=$(( $(left) - 15 ))
    (( rest < own )) && own=$rest
    (( own < 1 )) && own=1
    echo "$own"
}
pack() {  # copy a step's log (its last 15 MiB at most) and re-pack every result so far
    [ -n "${1:-}" ] && tail -c 15728640 "$WORK/$1" > "$OUT/$1"
    tar -czf "$OUT/results.tar.gz.part" -C "$RESULTS" . && mv "$OUT/results.tar.gz.part" "$OUT/results.tar.gz"
}
run_step() {  # run_step LOG LIMIT COMMAND...: under timeout (SIGINT first: pytest still reports)
    local log=$1 seconds=$2; shift 2
    local t0=$(date +%s)
    timeout -s INT -k 20 "$seconds" "$@" > "$WORK/$log" 2>&1
    STEP_RC=$?
    STEP_SECONDS=$(( $(date +%s) - t0 ))
    echo "[exit $STEP_RC after $STEP_SECONDS s, limit $seconds s]" >> "$WORK/$log"
}
summary() { "$PY" "$ROOT/tools/gpu_summary.py" "$@" >> "$OUT/summary.txt" 2>&1; }

say "mpcourse GPU session, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), QUICK=$QUICK, limits x$SCALE"

# --- setup: the kit, the device ------------------------------------------------------------------
SITE=$WORK/site
setup() {
    "$PY" -m pip install --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --quiet --target "$SITE" --find-links "$KIT" -r tools/gpu-kit.txt || return 1
    PYTHONPATH=$SITE "$PY" -m pip check --disable-pip-version-check || echo "(pip check above: not fatal)"
    "$PY" - <<'EOF' || return 1
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available:", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device:", p.name, f"{p.total_memory / 2**30:.1f} GiB, capability {p.major}.{p.minor}, {p.multi_processor_count} SMs")
for name in ("triton", "nbval", "ipykernel", "IPython", "nbformat", "jupyter_client", "numpy", "matplotlib", "ml_dtypes", "sklearn", "tqdm", "xdist"):
    try:
        module = __import__(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except ImportError as error:
        print(f"{name} MISSING: {error}")
EOF
    nvidia-smi 2>&1 || echo "no nvidia-smi"
    "$PY" -m pip list --disable-pip-version-check 2>/dev/null
}
unset MPCOURSE_RECORD_GPU  # set per step below, on a GPU only
export PYTHONPATH=$ROOT:$SITE MPLBACKEND=Agg MPLCONFIGDIR=$WORK/mpl IPYTHONDIR=$WORK/ipython \
       JUPYTER_RUNTIME_DIR=$WORK/jupyter-runtime PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PY SITE KIT
export -f setup
run_step env.txt "$(limit $LIMIT_SETUP)" bash -c setup
cp "$WORK/env.txt" "$RESULTS/env.txt"
say "setup: $([ $STEP_RC = 0 ] && echo ok || echo "FAILED (exit $STEP_RC)"), $STEP_SECONDS s; $(grep -E '^(python |cuda available:|device:)' "$WORK/env.txt" | tr '\n' ';')"
pack
if [ "$STEP_RC" != 0 ]; then
    say "The kit did not install or the device could not be read: see env.txt in results.tar.gz."
    tail -30 "$WORK/env.txt" >> "$OUT/summary.txt"
    exit 1
fi
if "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    DEVICE=cuda
    RECORD=$RESULTS/gpu-record  # the notebooks' steps only: a test never writes there
else
    DEVICE=cpu RECORD=
    say "No CUDA GPU: the tests run on the CPU, nothing is recorded (MPCOURSE_RECORD_GPU empty), the bench runs on the CPU; GPU-only tests skip with their reasons."
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
PYTEST=("$PY" -m pytest -p no:cacheprovider -o faulthandler_timeout=120 -q)

# --- 1: library tests ----------------------------------------------------------------------------
IGNORE=()
for f in $SKIP_TESTS; do IGNORE+=(--ignore "tests/$f"); done
TESTS=(tests mpcourse)
[ "$QUICK" = 1 ] && TESTS=($QUICK_TESTS)
[ -n "${GPU_TESTS:-}" ] && TESTS=($GPU_TESTS)
if [ "${GPU_TESTS:-}" != - ]; then
    run_step 1-tests.log "$(limit $LIMIT_TESTS)" env MPCOURSE_DEVICE=$DEVICE "${PYTEST[@]}" \
        -n "$WORKERS" --dist loadfile "${IGNORE[@]}" --junitxml "$RESULTS/junit/1-tests.xml" "${TESTS[@]}"
    summary junit "1 tests (MPCOURSE_DEVICE=$DEVICE, -n $WORKERS)" "$STEP_RC" "$STEP_SECONDS" "$RESULTS/junit/1-tests.xml"
    pack 1-tests.log
fi

# --- 2 and 3: the book's notebooks under nbval ---------------------------------------------------
PARALLEL=() ALONE=()
for nb in book/*.ipynb; do
    stem=$(basename "$nb" .ipynb)
    case " $TIMING_NOTEBOOKS " in *" $stem "*) ALONE+=("$nb") ;; *) PARALLEL+=("$nb") ;; esac
done
if [ "$QUICK" = 1 ]; then
    PARALLEL=() ALONE=()
    for stem in $QUICK_NOTEBOOKS; do PARALLEL+=("book/$stem.ipynb"); done
    for stem in $QUICK_ALONE; do ALONE+=("book/$stem.ipynb"); done
fi
if [ -n "${GPU_NOTEBOOKS:-}${GPU_ALONE:-}" ]; then
    PARALLEL=() ALONE=()
    for stem in ${GPU_NOTEBOOKS:-}; do [ "$stem" != - ] && PARALLEL+=("book/$stem.ipynb"); done
    for stem in ${GPU_ALONE:-}; do [ "$stem" != - ] && ALONE+=("book/$stem.ipynb"); done
fi
NBVAL=(--nbval-cell-timeout=300 --dist loadfile)
if [ ${#PARALLEL[@]} -gt 0 ]; then
    run_step 2-notebooks.log "$(limit $LIMIT_NOTEBOOKS)" env MPCOURSE_RECORD_GPU=$RECORD "${PYTEST[@]}" -n "$WORKERS" "${NBVAL[@]}" \
        --junitxml "$RESULTS/junit/2-notebooks.xml" "${PARALLEL[@]}"
    summary junit "2 notebooks (${#PARALLEL[@]}, -n $WORKERS, recording: ${RECORD:-off})" "$STEP_RC" "$STEP_SECONDS" "$RESULTS/junit/2-notebooks.xml"
    RETRY=($("$PY" "$ROOT/tools/gpu_summary.py" kernel-died "$RESULTS/junit/2-notebooks.xml"))
    if [ ${#RETRY[@]} -gt 0 ]; then
        mv "$WORK/2-notebooks.log" "$WORK/2-notebooks.first.log"
        run_step 2-notebooks.log "$(limit $(( LIMIT_NOTEBOOKS - STEP_SECONDS )))" env MPCOURSE_RECORD_GPU=$RECORD \
            "${PYTEST[@]}" -n 0 "${NBVAL[@]}" --junitxml "$RESULTS/junit/2-retry.xml" "${RETRY[@]}"
        summary junit "2 again, one at a time: kernels that died at start (${RETRY[*]})" "$STEP_RC" "$STEP_SECONDS" "$RESULTS/junit/2-retry.xml"
        cat "$WORK/2-notebooks.first.log" "$WORK/2-notebooks.log" > "$WORK/2-both.log" && mv "$WORK/2-both.log" "$WORK/2-notebooks.log"
    fi
    pack 2-notebooks.log
fi

if [ ${#ALONE[@]} -gt 0 ]; then
    run_step 3-alone.log "$(limit $LIMIT_ALONE)" env MPCOURSE_RECORD_GPU=$RECORD "${PYTEST[@]}" -n 0 "${NBVAL[@]}" \
        --junitxml "$RESULTS/junit/3-alone.xml" "${ALONE[@]}"
    summary junit "3 timing notebooks alone (${ALONE[*]})" "$STEP_RC" "$STEP_SECONDS" "$RESULTS/junit/3-alone.xml"
    pack 3-alone.log
fi

# --- 4: the benchmark -----------------------------------------------------------------------------
BENCH=(--budget-s "$BENCH_BUDGET_S")
[ "$QUICK" = 1 ] && BENCH+=(--quick)
if [ "${GPU_BENCH:-1}" != 0 ]; then
    run_step 4-bench.log "$(limit $LIMIT_BENCH)" bash -c 'cd "$1" && shift && exec "$@"' _ "$RESULTS" \
        "$PY" -m mpcourse bench "${BENCH[@]}"
    summary bench "4 bench (--budget-s $BENCH_BUDGET_S)" "$STEP_RC" "$STEP_SECONDS" "$RESULTS/bench-report"
    pack 4-bench.log
fi

say "total: $(( $(date +%s) - START )) s of $(( TOTAL_LIMIT * SCALE )) s; recorded: $(cd "$RESULTS/gpu-record" && find . -name '*.json' | wc -l) file(s)"
pack
rm -rf "$WORK"
