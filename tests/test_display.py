"""What the reader sees: every table or figure a chapter computes for the reader is displayed, and every
Markdown cell that promises output (it ends with ":") is followed by that output, not by the next
section's heading. Both are read from the notebooks' source, without running them."""
import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))

# Calls that build something for the reader to see, and show it only when the cell displays it:
# as the cell's last expression, passed to display(), or kept in a name that is used later.
BUILDERS = {"markdown_table", "show_source", "Markdown"}


def cells(notebook: Path) -> list[dict]:
    return json.loads(notebook.read_text())["cells"]


def parse(cell: dict) -> ast.Module:
    """A code cell as Python, its IPython magics and shell lines kept as an indented ``pass``."""
    lines = "".join(cell["source"]).splitlines()
    return ast.parse("\n".join(line[:len(line) - len(line.lstrip())] + "pass"
                               if line.lstrip().startswith(("%", "!")) else line for line in lines))


def builder(node) -> str | None:
    """The builder a call expression names (``markdown_table(...)``, ``display.Markdown(...)``)."""
    if isinstance(node, ast.Call):
        name = getattr(node.func, "id", getattr(node.func, "attr", None))
        return name if name in BUILDERS else None
    return None


def calls(tree: ast.Module, owner: str, name: str) -> list[int]:
    """Lines where ``owner.name(...)`` is called (``plt.close``), or ``name(...)`` if owner is empty."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (not owner and getattr(func, "id", None) == name) or (
                    getattr(func, "attr", None) == name and getattr(func.value, "id", None) == owner):
                found.append(node.lineno)
    return found


def hidden_results(source_cells: list[dict]) -> list[str]:
    """Where a code cell builds a table (or other display object) or a figure that the reader never
    sees. A figure is shown by ``plt.show()``, by ``display(fig)``, or at the end of the cell; one
    closed with ``plt.close(...)`` before any of these is never drawn."""
    code = [(k, parse(c)) for k, c in enumerate(source_cells) if c["cell_type"] == "code"]
    loads = [(k, node.lineno, node.id) for k, tree in code for node in ast.walk(tree)
             if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)]
    found = []
    for k, tree in code:
        last = tree.body[-1] if tree.body else None
        for node in ast.walk(tree):
            if isinstance(node, ast.Expr) and builder(node.value) and node is not last:
                found.append(f"cell {k} line {node.lineno}: {builder(node.value)}(...) is computed and "
                             f"thrown away (not the cell's last line, not passed to display())")
            if isinstance(node, ast.Assign) and builder(node.value):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                used = any(name in names and (j, line) > (k, node.lineno) for j, line, name in loads)
                if not used:
                    found.append(f"cell {k} line {node.lineno}: {builder(node.value)}(...) is kept in "
                                 f"{', '.join(names) or 'a target'} and never used")
        shown = calls(tree, "plt", "show") + calls(tree, "", "display")
        for line in calls(tree, "plt", "close"):
            if not any(s < line for s in shown):
                found.append(f"cell {k} line {line}: a figure is closed with plt.close() before it is shown")
    return found


def promises_unkept(source_cells: list[dict]) -> list[str]:
    """Markdown cells that end with ":" (the output follows) directly followed by a heading."""
    found = []
    for k, (cell, following) in enumerate(zip(source_cells, source_cells[1:])):
        text = "".join(cell["source"]).rstrip()
        if cell["cell_type"] != "markdown" or not text.endswith(":"):
            continue
        after = "".join(following["source"]).lstrip()
        if following["cell_type"] == "markdown" and after.startswith("#"):
            found.append(f"cell {k} promises output (\"...{text[-60:]}\") but cell {k + 1} is the "
                         f"heading \"{after.splitlines()[0]}\"")
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_table_a_chapter_computes_is_displayed(notebook):
    hidden = hidden_results(cells(notebook))
    assert not hidden, f"{notebook.name}: " + "; ".join(hidden)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_a_markdown_cell_that_promises_output_is_followed_by_it(notebook):
    unkept = promises_unkept(cells(notebook))
    assert not unkept, f"{notebook.name}: " + "; ".join(unkept)


# --- the checks themselves catch what they are for, and nothing else ------------------------------

def code(source: str) -> dict:
    return {"cell_type": "code", "source": source}


def markdown(source: str) -> dict:
    return {"cell_type": "markdown", "source": source}


@pytest.mark.parametrize("source", [
    "rows = [1]\nmarkdown_table(rows, ['a'])\nprint(rows)",                 # not the last line
    "for k in range(2):\n    markdown_table([(k,)], ['k'])",                # inside a loop
    "table = markdown_table([(1,)], ['a'])\nx = 1",                          # kept, never used
    "display.Markdown('text')\nx = 1",                                       # attribute call
    "fig, ax = plt.subplots()\nax.plot([1, 2])\nplt.close(fig)",               # a figure never drawn
])
def test_a_table_thrown_away_is_found(source):
    assert len(hidden_results([code(source)])) == 1


@pytest.mark.parametrize("source", [
    "rows = [1]\nmarkdown_table(rows, ['a'])",                               # the last line
    "display(markdown_table([(1,)], ['a']))\nx = 1",                         # passed to display
    "%matplotlib inline\nt = show_source(f)\ndisplay(t)",                    # kept, then shown
    "if True:\n    display(Markdown('text'))\nprint(1)",
    "fig, ax = plt.subplots()\nplt.show()\nplt.close(fig)",                   # shown, then closed
    "fig, ax = plt.subplots()\ndisplay(fig)\nplt.close(fig)",
])
def test_a_table_the_reader_sees_is_not_flagged(source):
    assert hidden_results([code(source)]) == []


def test_a_table_kept_for_a_later_cell_is_not_flagged():
    assert hidden_results([code("t = markdown_table([(1,)], ['a'])"), markdown("text"), code("t")]) == []
    assert len(hidden_results([code("t"), code("t = markdown_table([(1,)], ['a'])")])) == 1


def test_a_promise_followed_by_a_heading_is_found_and_one_followed_by_output_is_not():
    assert len(promises_unkept([markdown("The threshold:\n"), markdown("## Next section")])) == 1
    assert len(promises_unkept([markdown("The threshold:  "), markdown("\n### Sub")])) == 1
    assert promises_unkept([markdown("The threshold:"), code("x")]) == []
    assert promises_unkept([markdown("A ratio 1:2 here."), markdown("## Next")]) == []
    assert promises_unkept([markdown("Three kinds:"), markdown("- one\n- two")]) == []
