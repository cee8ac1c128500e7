#!/usr/bin/env bash
# `make gpu-rehearsal`: tools/gpu_session.sh on this CPU machine, in the GPU machine's conditions
# as far as they can be had here, so that the one command on a real GPU works the first time.
#
#  - a fresh Python 3.11 virtual environment holding only packages the GPU image has
#    (tools/gpu-image-packages.txt): torch, numpy, matplotlib, ml-dtypes, tqdm, scikit-learn,
#    pytest, pytest-xdist, pyyaml and their dependencies, at requirements.txt's versions (the image's own,
#    numpy 2.5.2 say, are not all on the index here). torch is the stand-in: the image's is
#    2.11.0+cu130 for Python 3.12, which cannot run here; requirements.txt's is the local CPU
#    wheel for 3.11. `gpu_kit_check.py image-only` proves nothing else is in the venv;
#  - the cp311 kit from .gpu-kit/ installed with --no-index --no-deps --target, then `pip check`
#    clean and every requirement met (gpu_kit_check.py requirements);
#  - the cp312 kit proven the same way with a local Python 3.12 (no CPU torch for it here): its
#    install, its requirements against the kit and the image's list, its compiled modules import;
#  - the session itself with a temporary $OUT; GPU-only steps skip with their reasons. It passes
#    when every step ran without a failure and the files came out (at most 6).
# QUICK=1: a few test files and notebooks (minutes); the default runs everything (long on 2 cores).
# LIMIT_SCALE (default 8) stretches the session's time limits: this CPU is slower than the GPU
# machine's 16 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
[ -d .gpu-kit ] || { echo "no .gpu-kit/: run make gpu-kit first"; exit 1; }
pyenv_python() { command -v pyenv > /dev/null && [ -x "$(pyenv prefix "$1" 2>/dev/null)/bin/python$1" ] \
    && echo "$(pyenv prefix "$1")/bin/python$1" || command -v "python$1" || true; }
PY311=${PY311:-$(pyenv_python 3.11)}
PY312=${PY312:-$(pyenv_python 3.12)}
TOOL_PY=${TOOL_PY:-$ROOT/.venv/bin/python}  # the course venv (make), which has packaging
[ -n "$PY311" ] || { echo "the rehearsal needs a Python 3.11 (PY311=...)"; exit 1; }
REHEARSAL=$(mktemp -d "${TMPDIR:-/tmp}/mpcourse-rehearsal.XXXXXX")
VENV=$REHEARSAL/venv
echo "rehearsal in $REHEARSAL"

# --- the kit: cp311 for real, cp312 by proxy ------------------------------------------------------
for v in 3.11 3.12; do
    py=$PY311; [ $v = 3.12 ] && py=$PY312
    if [ -z "$py" ]; then echo "no Python $v here: its kit is not checked"; continue; fi
    "$py" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile \
        --target "$REHEARSAL/kit-$v" --find-links .gpu-kit -r tools/gpu-kit.txt 2>&1 | grep -v "is ignored" || true
    PYTHONPATH=$REHEARSAL/kit-$v "$py" -c "import zmq, rpds, tornado.speedups, debugpy, wcwidth" \
        && echo "cp${v/./} kit: compiled modules import"
done

# --- the image's packages, in a fresh 3.11 venv ----------------------------------------------------
"$PY311" -m venv "$VENV"
ROOTS=$(grep -iE "^(torch|numpy|matplotlib|ml_dtypes|tqdm|scikit-learn|pytest|pytest-xdist)==" requirements.txt)
# PyYAML (the image has it) is no root of requirements.txt: jupyter-book brings it; test_students.py imports it.
ROOTS="$ROOTS PyYAML==$("$TOOL_PY" -c 'import yaml; print(yaml.__version__)')"
# What the kit needs from the image (attrs, psutil, coverage, ...), as the kit's metadata asks.
NEEDS=$("$TOOL_PY" tools/gpu_kit_check.py image-needs "$REHEARSAL/kit-3.11" 3.11)
# The image has python-dateutil but not tzdata, which dateutil 3 and 4 require: its dateutil is older.
echo "python-dateutil<3" > "$REHEARSAL/constraints.txt"
echo "image stand-in: $(echo $ROOTS $NEEDS), constraints: $(cat "$REHEARSAL/constraints.txt")"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$REHEARSAL/constraints.txt" \
    $ROOTS $NEEDS 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" tools/gpu_kit_check.py image-only
for v in 3.11 3.12; do
    [ -d "$REHEARSAL/kit-$v" ] && "$VENV/bin/python" tools/gpu_kit_check.py requirements "$REHEARSAL/kit-$v" $v
done
PYTHONPATH=$REHEARSAL/kit-3.11 "$VENV/bin/python" -m pip check --disable-pip-version-check

# --- the session ------------------------------------------------------------------------------------
OUT=$REHEARSAL/out
mkdir -p "$OUT"
set +e
env -u PYTHONPATH -u MPCOURSE_RECORD_GPU PATH="$VENV/bin:$PATH" PYTHON="$VENV/bin/python" \
    OUT="$OUT" LIMIT_SCALE="${LIMIT_SCALE:-8}" WORKERS="${WORKERS:-2}" QUICK="${QUICK:-0}" \
    bash tools/gpu_session.sh
rc=$?
set -e
echo "----- summary.txt -----"; cat "$OUT/summary.txt"; echo "----- files in \$OUT -----"; ls -la "$OUT"
files=$(find "$OUT" -type f | wc -l)
problems=()
[ "$rc" = 0 ] || problems+=("gpu_session.sh exited $rc")
(( files <= 6 )) || problems+=("$files files in \$OUT, more than 6")
for f in summary.txt 1-tests.log 2-notebooks.log 3-alone.log 4-bench.log results.tar.gz; do
    [ -f "$OUT/$f" ] || problems+=("$f missing from \$OUT")
done
grep -qE "FAILED|TIMED OUT|exit [1-9]|no result file|no report.json" "$OUT/summary.txt" \
    && problems+=("summary.txt reports a failure")
tar -tzf "$OUT/results.tar.gz" > "$REHEARSAL/packed.txt"
grep -q "report.json" "$REHEARSAL/packed.txt" || problems+=("no report.json in results.tar.gz")
if (( ${#problems[@]} )); then
    printf 'REHEARSAL FAILED: %s\n' "${problems[@]}"; echo "(kept: $REHEARSAL)"; exit 1
fi
echo "REHEARSAL PASSED ($OUT kept for inspection; remove $REHEARSAL when done)"
