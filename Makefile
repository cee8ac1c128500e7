# Two commands do everything on a fresh Linux machine (see README.md):
#   make book   -> set up .venv/, build the HTML book with every notebook executed on CPU
#   make test   -> set up .venv/, run the library tests and every book notebook under nbval
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test test-gpu venv exercises grade-demo check-exhaustive bench pretrained sync-notebooks release clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $@

venv: $(STAMP)

# -W: Sphinx warnings are errors; -n: nitpicky cross-references. Notebooks execute during the
# build (book/_config.yml: execute_notebooks: force), offline, on whatever device is present.
book: $(STAMP)
	$(BIN)/jupyter-book build -W -n --keep-going .
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

# Regenerates the student release exercises/ from the nbgrader source in solutions/ (commit both).
exercises: $(STAMP)
	$(BIN)/python tools/autograde.py release

# A whole grading session in grade-demo/: release, fabricated submissions (full, blank, partial,
# reference-calling, the hostile corpus and honest accidents), graded by tools/grader.py with each
# student in a bubblewrap sandbox (refuses without one), feedback HTML, a grade CSV, score tables.
# A real course: `python tools/autograde.py grade ASSIGNMENT --course DIR` (instructor guide).
grade-demo: $(STAMP)
	$(BIN)/python tools/autograde.py demo --out grade-demo

# Not part of `make test`: compares round_to with ml_dtypes on all 2**32 float32 inputs.
check-exhaustive: $(STAMP)
	$(BIN)/python tools/check_exhaustive.py

# Speed, reported as ratios measured side by side in one run (never asserted in tests).
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_round_to.py
	$(BIN)/python benchmarks/bench_optim.py
	$(BIN)/python benchmarks/bench_doctor.py

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
