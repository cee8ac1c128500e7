"""Every claim the claims ledger judges is quoted exactly from the text it names.

The ledger (book/claims_ledger.ipynb) judges claims from five source texts; a reader must be able to
judge each claim without the source, so each row quotes it ("...", trimmed with "…" where needed).
This test reads the ledger's rows from the notebook's code (no execution), and checks that every
quoted piece appears verbatim, after whitespace normalisation, in one of the texts the row names.
The texts are in the shared folder next to the repository (../shared/seeds); a fresh clone without
it skips.
"""
import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "book" / "claims_ledger.ipynb"
# CI keeps the shared folder next to the checkout (../shared); a git worktree sits one level deeper
SEEDS = next((p / "shared" / "seeds" for p in ROOT.parents[:2] if (p / "shared" / "seeds").is_dir()),
             ROOT.parent / "shared" / "seeds")
SOURCE_FILES = {"textbook": "000_", "lecture notes": "001_", "blog post": "002_", "theory page": "003_",
                "NVIDIA guide": "004_", "NVIDIA guide digest": "004_"}
PARAPHRASE = "(paraphrase)"  # a row that states a claim in its own words starts with this


def normalise(text: str) -> str:
    return " ".join(text.split())


def _cells() -> list[ast.Module]:
    """The notebook's code cells, parsed; an IPython magic line becomes `pass`."""
    cells = json.loads(LEDGER.read_text(encoding="utf-8"))["cells"]
    return [ast.parse(re.sub(r"(?m)^(\s*)[%!].*$", r"\1pass", "".join(c["source"])))
            for c in cells if c["cell_type"] == "code"]


def ledger_rows() -> list[tuple[str, str]]:
    """(claim, seen in) of every row: from each record(...) call, and from the tuples of a loop whose
    record(...) call takes its claim (and perhaps its source) from the loop's variables."""
    rows = []
    for node in (n for cell in _cells() for n in ast.walk(cell)):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Tuple):
            names = [getattr(e, "id", None) for e in node.target.elts]
            for call in (n for n in ast.walk(node) if _is_record(n) and isinstance(n.args[1], ast.Name)):
                claim_at = names.index(call.args[1].id)
                seen_at = names.index(call.args[2].id) if isinstance(call.args[2], ast.Name) else None
                for values in node.iter.elts:
                    rows.append((_constant(values.elts[claim_at]),
                                 _constant(values.elts[seen_at] if seen_at is not None else call.args[2])))
        elif _is_record(node) and not isinstance(node.args[1], ast.Name):
            rows.append((_constant(node.args[1]), _constant(node.args[2])))
    return rows


def _constant(node) -> str:
    """A claim or source as written: a constant string (a quotation computed at run time is not checkable)."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        value = None
    assert isinstance(value, str), f"line {node.lineno}: a claim and its source must be constant strings"
    return value


def _is_record(node) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "record"


def quotes(statement: str) -> list[str]:
    """The pieces quoted in a claim: each "..." split at its "…" elisions."""
    return [piece.strip() for quote in re.findall(r'"([^"]+)"', statement)
            for piece in quote.split("…") if piece.strip()]


def test_quotes_are_split_at_elisions_and_words_outside_them_are_ignored():
    assert quotes('FP16: "the range … is [6e-8, 65504]"; ours; "N = 2000"') == ["the range", "is [6e-8, 65504]",
                                                                              "N = 2000"]
    assert quotes("no quotation here") == []


def test_rows_are_read_from_the_notebook():
    rows = ledger_rows()
    assert len(rows) >= 40, f"expected the ledger's rows, found {len(rows)}"
    assert all(isinstance(c, str) and isinstance(s, str) for c, s in rows)


def test_every_sourced_claim_is_quoted_or_marked_a_paraphrase():
    unquoted = [c for c, seen_in in ledger_rows() if seen_in != "common" and not quotes(c)
                and not c.startswith(PARAPHRASE)]
    assert not unquoted, f"claims neither quoted nor marked {PARAPHRASE!r}: {unquoted}"


def test_quotes_appear_verbatim_in_a_named_source():
    if not SEEDS.is_dir():
        pytest.skip(f"the source texts are not here ({SEEDS}): they live in the course's shared folder")
    texts = {name: normalise("".join(p.read_text(encoding="utf-8") for p in SEEDS.glob(prefix + "*.txt")))
             for name, prefix in SOURCE_FILES.items()}
    assert all(texts.values()), f"a source text is missing from {SEEDS}"
    missing = []
    for statement, seen_in in ledger_rows():
        named = [name for name in SOURCE_FILES if name in seen_in]
        for piece in quotes(statement):
            if not any(normalise(piece) in texts[name] for name in named):
                missing.append(f"{piece!r} (seen in: {seen_in})")
    assert not missing, "quoted but not found verbatim in the named source:\n" + "\n".join(missing)
