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


# --- Noise: seed_spread and beyond_noise -------------------------------------------------------

from mpcourse.claims import Spread, beyond_noise, seed_spread  # noqa: E402


def test_seed_spread_runs_every_seed_in_order_and_returns_its_band():
    calls = []

    def run(seed):
        calls.append(seed)
        return torch.tensor(0.5 + 0.01 * seed)  # a one-element tensor is accepted

    spread = seed_spread(run, seeds=(3, 1, 2))
    assert calls == [3, 1, 2]
    assert spread.values == pytest.approx((0.53, 0.51, 0.52))
    assert (spread.low, spread.high) == pytest.approx((0.51, 0.53))
    assert spread.width == pytest.approx(0.02)


def test_seed_spread_leaves_the_global_random_states_as_they_were():
    import random
    torch.manual_seed(123); np.random.seed(123); random.seed(123)
    expected = (torch.rand(1).item(), np.random.rand(), random.random())
    torch.manual_seed(123); np.random.seed(123); random.seed(123)

    def run(seed):
        torch.manual_seed(seed); np.random.seed(seed); random.seed(seed)
        return float(torch.rand(1) + np.random.rand() + random.random())

    seed_spread(run)
    assert (torch.rand(1).item(), np.random.rand(), random.random()) == expected


def test_beyond_noise_compares_the_size_of_a_difference_with_the_band():
    band = Spread(values=(0.50, 0.53, 0.49), low=0.49, high=0.53)
    assert beyond_noise(0.05, band) and beyond_noise(-0.05, band)
    assert not beyond_noise(0.04, band) and not beyond_noise(-0.01, band)
    assert beyond_noise(np.float32(0.1), band) and not beyond_noise(torch.tensor(0.01), band)


@pytest.mark.parametrize("seeds, error", [((0,), ValueError), ((), ValueError), ((0, 0), ValueError),
                                          ((0, 1.5), TypeError), ((True, False), TypeError)])
def test_seed_spread_refuses_seeds_that_cannot_measure_a_spread(seeds, error):
    with pytest.raises(error, match="seed"):
        seed_spread(lambda seed: 1.0, seeds=seeds)


@pytest.mark.parametrize("outcome, error", [(float("nan"), ValueError), (float("inf"), ValueError),
                                            ("0.5", TypeError), (None, TypeError),
                                            (torch.tensor([1.0, 2.0]), TypeError)])
def test_seed_spread_refuses_an_outcome_that_is_not_one_finite_number(outcome, error):
    with pytest.raises(error, match=r"run\(0\)"):
        seed_spread(lambda seed: outcome)


def test_seed_spread_and_beyond_noise_refuse_what_they_cannot_use():
    with pytest.raises(TypeError, match="run"):
        seed_spread(3)
    with pytest.raises(TypeError, match="Spread"):
        beyond_noise(0.1, (0.49, 0.53))
    with pytest.raises(ValueError, match="difference"):
        beyond_noise(float("nan"), Spread(values=(1.0, 1.0), low=1.0, high=1.0))
