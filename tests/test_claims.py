"""The mechanism that keeps the book's sentences true (mpcourse.claims), and its use: every chapter
backs the sentences that state its computed results with checks that fail the build."""
import ast
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mpcourse.claims import ClaimFailed, claim

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))


def test_a_claim_that_holds_passes_silently():
    assert claim("FP16's largest value is 65504", 65504.0 == 2**15 * (2 - 2**-10)) is None
    claim("a NumPy comparison", np.float32(1) < 2)
    claim("a one-element tensor comparison", torch.tensor([3.0]).sum() == 3)


def test_a_claim_that_fails_quotes_the_sentence_and_what_was_measured():
    sentence = "BF16's gaps are 8 times FP16's"
    with pytest.raises(ClaimFailed) as failure:
        claim(sentence, torch.tensor(4.0) == 8, ratio=4.0)
    assert f'"{sentence}"' in str(failure.value) and "ratio=4.0" in str(failure.value)
    assert isinstance(failure.value, AssertionError)  # pytest and nbval report it as a failure


@pytest.mark.parametrize("check", [None, 1, 0.0, "yes", [True], np.array([True, True]),
                                   torch.tensor([1.0, 2.0]) > 0, torch.tensor(1.0)],
                         ids=["None", "int", "float", "str", "list", "array2", "tensor2", "float-tensor"])
def test_a_check_that_is_not_one_truth_value_is_a_clear_error(check):
    with pytest.raises(TypeError, match="single truth value"):
        claim("some sentence", check)


@pytest.mark.parametrize("sentence", ["", "   ", None, 3])
def test_a_claim_needs_its_sentence(sentence):
    with pytest.raises(TypeError, match="sentence"):
        claim(sentence, True)


def count_claims(notebook: Path) -> int:
    """Calls of ``claim(...)`` in the notebook's code cells (IPython magics left out)."""
    count = 0
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        source = "\n".join(line[:len(line) - len(line.lstrip())] + "pass"  # a magic, kept indented
                           if line.lstrip().startswith(("%", "!")) else line for line in lines)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                count += name == "claim"
    return count


def test_every_chapter_backs_its_sentences_with_checks():
    counts = {notebook.name: count_claims(notebook) for notebook in CHAPTERS}
    print("\nchecked sentences per chapter:\n" + "\n".join(f"  {n:4d}  {name}" for name, n in counts.items()))
    unchecked = [name for name, n in counts.items() if n == 0]
    assert not unchecked, (f"chapters without a single claim() check: {unchecked}; "
                           f"counts per chapter: {counts}")
