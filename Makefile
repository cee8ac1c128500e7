# Two commands do everything on a fresh Linux machine (see README.md):
#   make book   -> set up .venv/, build the HTML book with every notebook executed on CPU
#   make test   -> set up .venv/, run the library tests and every book notebook under nbval
#   make student -> a light .venv-student/ (mpcourse + JupyterLab) for students, and JupyterLab
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: student book test test-gpu gpu-kit gpu-rehearsal venv exercises grade-demo check-exhaustive bench bench-grading pretrained sync-notebooks release clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# --no-compile, then compileall on every core: pip byte-compiles each module one after another,
	# most of the set-up's time (measured: 71 of 89 s; compileall -j 2 did the same in 16 s). Every
	# module gets its .pyc as before: the grader's sandboxes, and PYTHONDONTWRITEBYTECODE, write none.
	# As with pip's, a file that does not compile is left (torch ships one in Python 3.12's syntax).
	$(BIN)/python -m pip install --quiet --no-compile -r requirements.txt
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m compileall -q -j 0 \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
	# rfc3987-syntax (jsonschema's optional "iri" format check, pulled in by jupyter-events) builds a
	# parser when imported: 1.4 s of CPU in every process that imports nbformat (each notebook run of
	# the grader, each nbgrader command), and no schema here checks that format (issue 52).
	$(BIN)/python -m pip uninstall --quiet --yes rfc3987-syntax
	touch $@

venv: $(STAMP)

# Students (book/how_to_use_students.md): only the course library and JupyterLab, in a venv of
# their own (no book builder, grader or linters), then JupyterLab in the repository's folder, where
# both book/ and exercises/ are visible.
STUDENT_VENV  := .venv-student
STUDENT_STAMP := $(STUDENT_VENV)/.installed
$(STUDENT_STAMP): pyproject.toml
	test -x $(STUDENT_VENV)/bin/python || $(PYTHON) -m venv $(STUDENT_VENV)
	$(STUDENT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(STUDENT_VENV)/bin/python -m pip install --quiet -e . jupyterlab
	touch $@

student: $(STUDENT_STAMP)
	$(STUDENT_VENV)/bin/jupyter lab --notebook-dir=.

# Every notebook executed, offline, on whatever device is present, one per core at a time
# (tools/build_book.py), then `jupyter-book build -W -n --keep-going` (-W: Sphinx warnings are
# errors; -n: nitpicky cross-references) on them.
book: $(STAMP)
	$(BIN)/python tools/build_book.py
	@echo "Book built: open _build/html/index.html"

test: $(STAMP)
	$(BIN)/python -m pytest

# Needs an NVIDIA GPU and a CUDA build of torch: the whole suite and every notebook under nbval
# with CUDA as the device. MPCOURSE_DEVICE=cuda moves the device-aware tests (the `device`
# fixture in tests/conftest.py) to the GPU; tests marked "needs a CUDA GPU" run instead of
# being skipped; notebooks pick CUDA themselves when torch sees it.
test-gpu: $(STAMP)
	$(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu needs a CUDA GPU that torch can see')"
	MPCOURSE_DEVICE=cuda $(BIN)/python -m pytest

# The GPU kit (tools/gpu-kit.txt): wheels for CPython 3.12 (the GPU image's) and 3.11 (the
# rehearsal's), manylinux x86_64, into .gpu-kit/ (git-ignored). It travels with the working tree to
# a GPU machine that has no network; tools/gpu_session.sh installs it there.
KIT_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 \
	manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64,--platform $(p))
gpu-kit: $(STAMP)
	@for v in 3.12 3.11; do \
	  $(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
	    --python-version $$v --abi cp$$(echo $$v | tr -d .) $(KIT_PLATFORMS) \
	    -r tools/gpu-kit.txt -d .gpu-kit || exit 1; \
	done
	$(BIN)/python tools/gpu_kit_size.py

# tools/gpu_session.sh on this CPU machine, in the GPU machine's conditions as far as they can be
# had here (tools/gpu_rehearsal.sh): a fresh Python 3.11 venv holding only the image's packages,
# the kit installed with --no-index, `pip check` clean, a temporary $$OUT. GPU-only steps skip with
# a reason. QUICK=1 runs three notebooks instead of all (the full run takes long on two cores).
gpu-rehearsal: gpu-kit
	QUICK=$(QUICK) TOOL_PY=$(BIN)/python bash tools/gpu_rehearsal.sh

# Regenerates the student release exercises/ from the nbgrader source in solutions/ (commit both).
exercises: $(STAMP)
	$(BIN)/python -m grader release

# A whole grading session in grade-demo/: release, fabricated submissions (full, blank, partial,
# reference-calling, the hostile corpus and honest accidents), graded by grader/ with each student
# in a bubblewrap sandbox (refuses without one), feedback HTML, a grade CSV, score tables.
# A real course: `python -m grader grade ASSIGNMENT --course DIR` (instructor guide).
grade-demo: $(STAMP)
	$(BIN)/python -m grader demo --out grade-demo

# Not part of `make test`: compares round_to with ml_dtypes on all 2**32 float32 inputs.
check-exhaustive: $(STAMP)
	$(BIN)/python tools/check_exhaustive.py

# Speed, reported as ratios measured side by side in one run (never asserted in tests); then the
# two commands themselves, `make test` and `make book`, with the core count, as ratios of their
# budgets and of the last run here (benchmarks/bench_commands.py: about 15 minutes on 2 cores).
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_round_to.py
	$(BIN)/python benchmarks/bench_optim.py
	$(BIN)/python benchmarks/bench_doctor.py
	$(BIN)/python benchmarks/bench_commands.py

# Not part of `make bench` (it needs root and bubblewrap, and grades for minutes): what grading a
# student costs, step by step, and students per minute at --jobs 1..cores (instructor guide).
bench-grading: $(STAMP)
	$(BIN)/python benchmarks/bench_grading.py

# Retrains the pre-trained model shipped in mpcourse/weights/ (deterministic, a few seconds).
pretrained: $(STAMP)
	$(BIN)/python tools/train_pretrained.py

# Rewrites each notebook's Colab set-up cell (book/ and solutions/) from the repository URL in
# _config.yml; run `make exercises` after it.
sync-notebooks: $(STAMP)
	$(BIN)/python tools/sync_colab_cells.py

# Cuts release VERSION (tools/release.py): version in pyproject.toml, CHANGELOG.md dated, every
# Colab cell pinned to the tag vVERSION, exercises/ regenerated, committed and tagged.
release: $(STAMP)
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=x.y.z"; exit 2; }
	$(BIN)/python tools/release.py $(VERSION)

clean:
	rm -rf _build .pytest_cache grade-demo
