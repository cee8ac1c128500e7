"""The rules of the README's "Writing a chapter", checked on the pages' source without running them.

* **Shown code is the experiment**: a code cell the reader sees calls no ``claim(...)``; the checks
  sit in hidden cells (tag ``remove-cell``), which nbval and the book build still run.
* **Sources**: a chapter states what is true and shows it. The texts the course was commissioned
  from are quoted in the claims ledger and only there; a chapter names a widespread wrong claim in
  one sentence with a link to its ledger row, ``claims_ledger.ipynb#claim-<key>``, and every such
  link names a row that exists.
* **GPU results on a CPU build**: a cell that shows committed GPU results with ``beside`` says what
  a GPU run measures (``measures=``) and prints no lead-in of its own: on a CPU build without a
  record the page shows one line, never an empty table.
* **Current APIs**: a name that torch 2.13 replaced appears in prose only as older code.

The pages that follow every rule are listed in ``PAGES``; a page joins when it is revised.
"""
import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
LEDGER = BOOK / "claims_ledger.ipynb"
HIDDEN = "remove-cell"
PAGES = ["01_floating_point", "02_why_reduced_precision", "03_mixed_precision_training", "04_loss_scaling",
         "library_checks", "05_bf16_and_tf32", "06_fp8", "06b_fp8_recipes", "07_hardware",
         "08_numerical_stability", "09_layer_precision", "10_debugging", "field_guide",
         "11_communication", "11b_engines", "12_recipe", "12b_stability"]
# The commissioned texts, by the words a page would use to point at one without naming it.
UNNAMED_SOURCES = re.compile(r"\b(textbook|lecture[- ]notes?|blog[- ]post|theory page|tutorials?)\b", re.I)
LEDGER_LINK = re.compile(r"claims_ledger(?:\.ipynb|\.md)?#(claim-[a-z0-9][\w-]*)")
# Names torch 2.13 (or the libraries the book names) replaced, and what replaced them.
REPLACED = {"allow_tf32": "fp32_precision", "torch.cuda.amp": "torch.amp", "fp8_autocast": "te.autocast"}
OLDER = re.compile(r"\b(older|legacy|deprecated|old)\b", re.I)


def cells(page: str) -> list[dict]:
    return json.loads((BOOK / f"{page}.ipynb").read_text())["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def parse(source: str) -> ast.Module:
    return ast.parse(re.sub(r"(?m)^(\s*)[%!].*$", r"\1pass", source))


def calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) == name]


def shown_checks(page_cells: list[dict]) -> list[str]:
    """Code cells the reader sees that call claim(...)."""
    return [f"cell {k} line {call.lineno}" for k, cell in enumerate(page_cells)
            if cell["cell_type"] == "code" and HIDDEN not in tags(cell)
            for call in calls(parse(text(cell)), "claim")]


def skipped_checks(page_cells: list[dict]) -> list[str]:
    """Cells with checks that nbval or the build would not run (or would let fail)."""
    return [f"cell {k}: {sorted(set(tags(cell)) & {'nbval-skip', 'skip-execution', 'raises-exception'})}"
            for k, cell in enumerate(page_cells) if cell["cell_type"] == "code" and "claim(" in text(cell)
            and set(tags(cell)) & {"nbval-skip", "skip-execution", "raises-exception"}]


def ledger_keys() -> set[str]:
    """The rows' names: every key="..." given to record() in the ledger, and the keys of its loops."""
    keys = set()
    for cell in json.loads(LEDGER.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        tree = parse(text(cell))
        for call in calls(tree, "record"):
            for keyword in call.keywords:
                if keyword.arg == "key" and isinstance(keyword.value, ast.Constant):
                    keys.add(keyword.value.value)
        for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For) and isinstance(n.target, ast.Tuple)):
            names = [getattr(e, "id", None) for e in loop.target.elts]
            if "key" in names and calls(loop, "record"):
                keys |= {ast.literal_eval(row.elts[names.index("key")]) for row in loop.iter.elts}
    return keys


def unnamed_sources(page_cells: list[dict]) -> list[str]:
    """Prose and generated sentences that point at a commissioned text without naming it."""
    found = []
    for k, cell in enumerate(page_cells):
        for match in UNNAMED_SOURCES.finditer(text(cell)):
            found.append(f"cell {k}: ...{text(cell)[max(0, match.start() - 60):match.end() + 30]!r}")
    return found


def ledger_links(page_cells: list[dict]) -> set[str]:
    return {m.group(1) for cell in page_cells for m in LEDGER_LINK.finditer(text(cell))}


def gpu_lead_ins(page_cells: list[dict]) -> list[str]:
    """beside() calls without measures=, and print() calls in the same branch (a lead-in that a
    CPU build would show above an empty result)."""
    found = []
    for k, cell in enumerate(page_cells):
        if cell["cell_type"] != "code" or "beside(" not in text(cell):
            continue
        tree = parse(text(cell))
        for call in calls(tree, "beside"):
            if not any(keyword.arg == "measures" for keyword in call.keywords):
                found.append(f"cell {k} line {call.lineno}: beside() without measures=")
        for branch in (n for n in ast.walk(tree) if isinstance(n, ast.If)):
            for body in (branch.body, branch.orelse):
                block = ast.Module(body=body, type_ignores=[])
                shows = [c for c in calls(block, "beside")]
                if shows and calls(block, "print"):
                    found.append(f"cell {k} line {shows[0].lineno}: a print() beside the GPU results")
    return found


# TeX math in a string of a computed Markdown() output: the book renders a notebook's Markdown output
# as GitHub Markdown, which has no math, so the reader would see the dollars (tests/test_browser.py
# finds it in the built page; this finds it in the source, in a second).
TEX = re.compile(r"\$(?=[^$\s])[^$\n]*?(\\[A-Za-z]+|[\^_=])[^$\n]*\$")


def tex_in_computed_markdown(page_cells: list[dict]) -> list[str]:
    """String constants with TeX math inside the Markdown(...) calls of code cells."""
    found = []
    for k, cell in enumerate(page_cells):
        if cell["cell_type"] != "code" or "Markdown(" not in text(cell):
            continue
        for call in calls(parse(text(cell)), "Markdown"):
            for node in ast.walk(call):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and TEX.search(node.value):
                    found.append(f"cell {k} line {node.lineno}: {TEX.search(node.value).group(0)!r}")
    return found


def replaced_names(page_cells: list[dict]) -> list[str]:
    """Sentences of prose that name a replaced API without saying it is the older one."""
    found = []
    for k, cell in enumerate(page_cells):
        if cell["cell_type"] != "markdown":
            continue
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z(*`])", text(cell)):
            for old, new in REPLACED.items():
                if old in sentence and not OLDER.search(sentence):
                    found.append(f"cell {k}: {old!r} (now {new}) in {sentence.strip()[:120]!r}")
    return found


@pytest.mark.parametrize("page", PAGES)
def test_the_reader_sees_the_experiment_and_the_checks_run_hidden(page):
    page_cells = cells(page)
    assert not shown_checks(page_cells), f"{page}: claim() in cells the reader sees: {shown_checks(page_cells)}"
    assert sum(len(calls(parse(text(c)), "claim")) for c in page_cells if c["cell_type"] == "code") > 0, \
        f"{page}: no checks at all"
    assert not skipped_checks(page_cells), f"{page}: checks that would not run: {skipped_checks(page_cells)}"


@pytest.mark.parametrize("page", PAGES)
def test_a_chapter_quotes_no_source_and_links_each_wrong_claim_to_its_ledger_row(page):
    page_cells = cells(page)
    assert not unnamed_sources(page_cells), (f"{page} points at a commissioned text; state what is true, and "
                                             f"link the claim's ledger row:\n" + "\n".join(unnamed_sources(page_cells)))
    missing = ledger_links(page_cells) - {f"claim-{key}" for key in ledger_keys()}
    assert not missing, f"{page} links to ledger rows that do not exist: {sorted(missing)}"


def test_every_ledger_link_in_the_book_names_a_row():
    rows = {f"claim-{key}" for key in ledger_keys()}
    assert len(rows) >= 70
    for path in sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md")):
        found = set(LEDGER_LINK.findall(path.read_text()))
        assert found <= rows, f"{path.name} links to ledger rows that do not exist: {sorted(found - rows)}"


# The exercises (solutions/, from which exercises/ is generated) follow the rule too, and their own
# words for a commissioned text besides (issue 48, the third new-student walkthrough: "the source
# chapter of this course", "the source exercise's question", "a popular picture"). A ledger link goes
# from exercises/<name>/ to the book: ../../book/claims_ledger.ipynb#claim-<key>.
EXERCISES = sorted((ROOT / "solutions").glob("*/*.ipynb"))
EXERCISE_SOURCES = re.compile(r"\b(the source|source (?:chapter|exercise)|a popular)\b", re.I)
EXERCISE_LEDGER = re.compile(r"\]\(([^)#]*claims_ledger[^)#]*)#")


def exercise_sources(page_cells: list[dict]) -> list[str]:
    found = unnamed_sources(page_cells)
    for k, cell in enumerate(page_cells):
        for match in EXERCISE_SOURCES.finditer(text(cell)):
            found.append(f"cell {k}: ...{text(cell)[max(0, match.start() - 60):match.end() + 30]!r}")
    return found


@pytest.mark.parametrize("path", EXERCISES, ids=lambda path: path.parent.name)
def test_an_exercise_quotes_no_source_and_links_each_wrong_claim_to_its_ledger_row(path):
    page_cells = json.loads(path.read_text())["cells"]
    assert not exercise_sources(page_cells), (f"{path.name} points at a text its reader cannot find; state "
                                              f"what is true, and link the claim's ledger row:\n"
                                              + "\n".join(exercise_sources(page_cells)))
    missing = ledger_links(page_cells) - {f"claim-{key}" for key in ledger_keys()}
    assert not missing, f"{path.name} links to ledger rows that do not exist: {sorted(missing)}"
    paths = {m.group(1) for cell in page_cells for m in EXERCISE_LEDGER.finditer(text(cell))}
    assert paths <= {"../../book/claims_ledger.ipynb"}, f"{path.name}: links the ledger as {sorted(paths)}"


def test_the_rules_find_an_exercises_unnamed_source():
    assert len(EXERCISES) == 8
    assert exercise_sources([markdown("The source chapter of this course sums it up.")])
    assert exercise_sources([markdown("This answers the source exercise's question.")])
    assert exercise_sources([markdown("A popular picture says an FP16 matmul adds up in FP16.")])
    assert not exercise_sources([markdown("Split the error into its sources.")])


@pytest.mark.parametrize("page", PAGES)
def test_a_cpu_build_shows_one_line_where_a_gpu_result_is_missing(page):
    assert not gpu_lead_ins(cells(page)), f"{page}: {gpu_lead_ins(cells(page))}"


@pytest.mark.parametrize("page", PAGES)
def test_prose_names_replaced_apis_only_as_older_code(page):
    assert not replaced_names(cells(page)), f"{page}:\n" + "\n".join(replaced_names(cells(page)))


@pytest.mark.parametrize("page", PAGES)
def test_computed_markdown_writes_its_maths_in_unicode_not_tex(page):
    found = tex_in_computed_markdown(cells(page))
    assert not found, f"{page}: TeX in a computed Markdown output (shown raw; write ∇L, ε = 10⁻⁸):\n" + "\n".join(found)


def test_no_page_says_its_results_do_not_depend_on_the_cpu():
    """One thread fixes the order of a sum, not the instructions: 16-bit CPU kernels differ between
    instruction sets (AVX-512 BF16, AMX and plain AVX2 round differently)."""
    for path in sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md")):
        assert not re.search(r"do(es)? not depend on the CPU", path.read_text()), path.name


# --- the rules' own checks find what they look for ----------------------------------------------

def code(source: str, *cell_tags: str) -> dict:
    return {"cell_type": "code", "source": [source], "metadata": {"tags": list(cell_tags)}}


def markdown(source: str) -> dict:
    return {"cell_type": "markdown", "source": [source], "metadata": {}}


def test_the_rules_find_a_shown_check_a_skipped_one_and_pass_a_hidden_one():
    assert shown_checks([code("x = 1\nclaim('x is one', x == 1)")]) == ["cell 0 line 2"]
    assert shown_checks([code("claim('x is one', x == 1)", HIDDEN)]) == []
    assert skipped_checks([code("claim('s', True)", HIDDEN, "nbval-skip")])
    assert not skipped_checks([code("claim('s', True)", HIDDEN)])


def test_the_rules_find_an_unnamed_source_and_a_link_to_a_missing_row():
    assert unnamed_sources([markdown('A textbook chapter says "FP16 is 0.1%".')])
    assert unnamed_sources([markdown("Many tutorials add 0x8000.")])
    assert not unnamed_sources([markdown("A common claim ([ledger](claims_ledger.ipynb#claim-fp16-range)).")])
    assert ledger_links([markdown("see [row](claims_ledger.ipynb#claim-nowhere)")]) == {"claim-nowhere"}
    assert "fp16-range" in ledger_keys() and "nowhere" not in ledger_keys()


def test_the_rules_find_tex_in_computed_markdown_only():
    assert tex_in_computed_markdown([code('Markdown(f"the error of $\\\\nabla L$ is {e:.1e}")')]) == [
        "cell 0 line 1: '$\\\\nabla L$'"]
    assert tex_in_computed_markdown([code('Markdown(f"with $v = 0$ here")')])
    assert not tex_in_computed_markdown([code('Markdown(f"the error of ∇L costs $5 or $6")')])
    assert not tex_in_computed_markdown([markdown("The error of $\\nabla L$ (prose: typeset).")])
    assert not tex_in_computed_markdown([code('label = "$\\\\nabla L$"  # a plot label: matplotlib renders it')])


def test_the_rules_find_a_gpu_lead_in_and_a_replaced_api():
    old = 'if cuda:\n    pass\nelse:\n    print("Committed GPU runs:")\n    display(beside("x", "y", measures="m"))'
    assert gpu_lead_ins([code(old)]) == ["cell 0 line 5: a print() beside the GPU results"]
    assert gpu_lead_ins([code('display(beside("x", "y"))')]) == ["cell 0 line 1: beside() without measures="]
    assert not gpu_lead_ins([code('if cuda:\n    print(1)\nelse:\n    display(beside("x", "y", measures="m"))')])
    assert replaced_names([markdown("Set `torch.backends.cuda.matmul.allow_tf32 = True`.")])
    assert not replaced_names([markdown("Older code sets `allow_tf32`; torch 2.13 documents `fp32_precision`.")])
