"""The mechanism that keeps the book's sentences true (mpcourse.claims), and its use: every chapter
backs the sentences that state its computed results with checks that fail the build."""
import ast
import json
import math
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


def test_outside_the_tests_and_the_build_a_failing_claim_is_printed_and_the_notebook_goes_on(monkeypatch, capsys):
    """A reader's machine (another CPU's kernels) is told what differs; "Run all" does not stop there.
    The tests and the book build set MPCOURSE_STRICT_CLAIMS=1 (tests/workers.py, tools/build_book.py)."""
    import os
    assert os.environ.get("MPCOURSE_STRICT_CLAIMS") == "1"  # this run is strict: the book's checks fail it
    monkeypatch.delenv("MPCOURSE_STRICT_CLAIMS")
    assert claim("BF16's gaps are 8 times FP16's", torch.tensor(4.0) == 8, ratio=4.0) is None
    said = capsys.readouterr().err
    assert "does not hold" in said and "\"BF16's gaps are 8 times FP16's\"" in said and "ratio=4.0" in said
    with pytest.raises(TypeError):  # a malformed check is still an error everywhere
        claim("a list is not a truth value", [True])


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


# --- Noise, paired: paired_difference ------------------------------------------------------------

from mpcourse.claims import Paired, paired_difference  # noqa: E402


def test_paired_difference_is_the_paired_t_test_of_the_per_seed_differences():
    from scipy.stats import ttest_rel
    a, b = [0.512, 0.498, 0.530, 0.471, 0.505], [0.500, 0.493, 0.515, 0.466, 0.503]
    result = paired_difference(lambda seed: a[seed], lambda seed: b[seed])
    reference = ttest_rel(a, b)
    assert result.seeds == (0, 1, 2, 3, 4) and result.a == tuple(a) and result.b == tuple(b)
    assert result.differences == pytest.approx([x - y for x, y in zip(a, b)])
    assert result.mean == pytest.approx(np.mean(np.subtract(a, b)))
    assert result.sd == pytest.approx(np.std(np.subtract(a, b), ddof=1))
    assert (result.t, result.p) == pytest.approx((reference.statistic, reference.pvalue))


def test_the_paired_interval_is_students_and_excludes_zero_exactly_when_beyond_noise():
    from scipy import stats
    a, b = [0.52, 0.61, 0.40, 0.47, 0.55], [0.50, 0.57, 0.41, 0.42, 0.50]
    result = paired_difference(a, b)
    d = [x - y for x, y in zip(a, b)]
    expected = stats.t.interval(0.9, len(d) - 1, loc=result.mean, scale=stats.sem(d))
    assert result.interval(0.9) == pytest.approx(expected, rel=1e-12)
    for level in (0.9, 0.95, 0.99):
        low, high = result.interval(level)
        assert (low > 0 or high < 0) == (result.p < 1 - level)
    assert paired_difference([1.5, 2.5, 3.5], [1, 2, 3], seeds=(0, 1, 2)).interval() == (0.5, 0.5)
    with pytest.raises(ValueError, match="level"):
        result.interval(95)


def test_paired_difference_takes_outcomes_already_measured_in_the_order_of_the_seeds():
    measured = paired_difference([1.0, 2.0, 3.5], [0.9, 1.8, 3.45], seeds=(7, 8, 9))
    called = paired_difference(lambda s: {7: 1.0, 8: 2.0, 9: 3.5}[s], lambda s: {7: 0.9, 8: 1.8, 9: 3.45}[s],
                               seeds=(7, 8, 9))
    assert measured == called


def test_the_sentence_names_what_the_pairs_are():
    over_seeds = paired_difference([1.0, 2.0, 3.5], [0.9, 1.8, 3.45], seeds=(7, 8, 9))
    over_batches = paired_difference([1.0, 2.0, 3.5], [0.9, 1.8, 3.45], seeds=(7, 8, 9), unit="batches")
    assert "over 3 paired seeds;" in str(over_seeds)
    assert "over 3 paired batches;" in str(over_batches) and "seeds" not in str(over_batches)
    assert over_batches.p == over_seeds.p
    with pytest.raises(TypeError, match="unit names what the pairs are"):
        paired_difference([1.0, 2.0, 3.5], [0.9, 1.8, 3.45], seeds=(7, 8, 9), unit="")


def test_differences_of_fractions_format_in_percentage_points():
    result = paired_difference([0.137, 0.120, 0.151], [0.110, 0.094, 0.123], seeds=(0, 1, 2), unit="batches")
    assert f"{result}" == str(result) and str(result).startswith(f"{result.mean:+.3g} ± {result.sd:.2g} (")
    assert f"{result:pp}" == (f"{100 * result.mean:+.3g} pp ± {100 * result.sd:.2g} pp (mean ± sd over 3 paired batches; "
                              f"t = {result.t:.2f}, p = {result.p:.2g}): {result.verdict}")
    with pytest.raises(ValueError, match="percentage points"):
        f"{result:.2f}"


def test_a_difference_the_same_on_every_seed_is_certain_and_none_at_all_is_no_difference():
    same = paired_difference([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], seeds=(0, 1, 2))
    assert (same.t, same.p, same.beyond_noise, same.verdict) == (0.0, 1.0, False, "within noise")
    shifted = paired_difference([1.5, 2.5, 3.5], [1.0, 2.0, 3.0], seeds=(0, 1, 2))
    assert (shifted.t, shifted.p, shifted.beyond_noise) == (math.inf, 0.0, True)


def test_beyond_noise_takes_a_paired_result_alone():
    result = paired_difference([1.1, 2.2, 3.05, 4.1], [1.0, 2.0, 3.0, 4.0], seeds=(0, 1, 2, 3))
    assert beyond_noise(result) is result.beyond_noise is (result.p < 0.05)
    assert str(result).endswith(result.verdict)
    with pytest.raises(TypeError, match="alone"):
        beyond_noise(result, Spread(values=(1.0, 2.0), low=1.0, high=2.0))


@pytest.mark.parametrize("seeds, error", [((0, 1), ValueError), ((0, 0, 1), ValueError), ((0, 1, 2.5), TypeError)])
def test_paired_difference_refuses_seeds_that_cannot_measure_noise(seeds, error):
    with pytest.raises(error, match="seed"):
        paired_difference(lambda seed: 1.0, lambda seed: 2.0, seeds=seeds)


@pytest.mark.parametrize("outcome, error", [(float("nan"), ValueError), ("0.5", TypeError), (None, TypeError),
                                            (torch.tensor([1.0, 2.0]), TypeError)])
def test_paired_difference_refuses_an_outcome_that_is_not_one_finite_number(outcome, error):
    with pytest.raises(error, match=r"run_b\(0\)"):
        paired_difference(lambda seed: 1.0, lambda seed: outcome)


def test_paired_difference_refuses_what_is_neither_a_run_nor_one_outcome_per_seed():
    with pytest.raises(TypeError, match="run_a"):
        paired_difference(3.0, [1.0, 2.0, 3.0], seeds=(0, 1, 2))
    with pytest.raises(ValueError, match="2 outcomes for 3 seeds"):
        paired_difference([1.0, 2.0], [1.0, 2.0, 3.0], seeds=(0, 1, 2))


def test_paired_difference_leaves_the_global_random_states_as_they_were():
    torch.manual_seed(5)
    expected = torch.rand(1).item()
    torch.manual_seed(5)
    paired_difference(lambda seed: float(torch.manual_seed(seed) and torch.rand(1)),
                      lambda seed: float(torch.rand(1)), seeds=(0, 1, 2))
    assert torch.rand(1).item() == expected


def test_ablation_a_difference_the_band_calls_noise_is_found_by_pairing():
    """The same comparison judged two ways: pure BF16 weights against FP32 on the digits MLP, one
    epoch, five seeds that fix the initial weights and the batch order of both runs. The band of
    FP32's seed-to-seed outcomes is too wide to see the difference; the paired test finds it."""
    import torch.nn.functional as F
    from mpcourse.workloads import DigitsMLP, batches, load_digits, seed_everything
    train, _ = load_digits()

    def final_loss(seed, dtype=torch.float32):
        seed_everything(seed)
        model = DigitsMLP().to(dtype)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for x, y in batches(train, 64, generator=torch.Generator().manual_seed(seed)):
            loss = F.cross_entropy(model(x.to(dtype)).float(), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return sum(losses) / len(losses)

    seeds = (0, 1, 2, 3, 4)
    fp32 = [final_loss(seed) for seed in seeds]
    bf16 = [final_loss(seed, torch.bfloat16) for seed in seeds]
    band = Spread(values=tuple(fp32), low=min(fp32), high=max(fp32))
    paired = paired_difference(bf16, fp32, seeds=seeds)
    assert not beyond_noise(paired.mean, band), "the unpaired band should miss this difference"
    assert beyond_noise(paired) and paired.mean > 0, f"the paired test should find it: {paired}"


def test_seed_spread_takes_outcomes_already_measured():
    assert seed_spread([0.5, 0.53, 0.49], seeds=(4, 5, 6)) == seed_spread(lambda s: {4: 0.5, 5: 0.53, 6: 0.49}[s],
                                                                         seeds=(4, 5, 6))
    with pytest.raises(ValueError, match="2 outcomes for 3 seeds"):
        seed_spread([0.5, 0.53], seeds=(0, 1, 2))


def test_sign_test_is_the_exact_two_sided_binomial_tail():
    from scipy.stats import binomtest

    from mpcourse.claims import sign_test
    for n in (1, 3, 6, 9):
        for k in range(n + 1):
            assert math.isclose(sign_test(k, n), binomtest(k, n, 0.5).pvalue), (k, n)
    assert sign_test(6, 6) == sign_test(0, 6) == 2 / 2**6
    with pytest.raises(ValueError):
        sign_test(7, 6)
    with pytest.raises(TypeError):
        sign_test(2.0, 6)


# --- a share of a gap: ratio_interval (Fieller) ---------------------------------------------------

from mpcourse.claims import ratio_interval  # noqa: E402


def test_a_ratio_known_exactly_has_no_width_whatever_the_noise():
    """When the part's per-seed differences are exactly 0.3 times the gap's, the share is 0.3 on
    every seed, however noisy each difference is: Fieller's interval collapses to 0.3."""
    gap = [1.0, 2.5, 0.7, 1.9, 1.3]
    whole = paired_difference(gap, [0.0] * 5)
    part = paired_difference([0.3 * g for g in gap], [0.0] * 5)
    low, high = ratio_interval(part, whole)
    assert math.isclose(low, 0.3, abs_tol=1e-9) and math.isclose(high, 0.3, abs_tol=1e-9)


def test_the_ratio_interval_covers_the_true_share_at_its_level_and_a_naive_one_does_not():
    """Simulated paired experiments (5 seeds) with a true share of 40%: Fieller's 95% interval covers
    0.4 about 95% of the time, with the part's noise independent of the gap's or shared with it;
    dividing the part's t-interval by the gap's mean (the gap taken as exact) covers it far less
    often when the gap is the noisier of the two. (An unbounded answer counts as a miss.)"""
    rng = np.random.default_rng(2026)
    seeds, trials = tuple(range(5)), 1000
    for shared in (0.0, 0.5):  # how much of the gap's noise the part carries
        covered, naive = 0, 0
        for _ in range(trials):
            noise = rng.normal(0, 1, size=(2, 5))
            gap = 1.0 + 0.4 * noise[0]
            part = 0.4 + 0.4 * shared * noise[0] + 0.05 * noise[1]
            whole, share = paired_difference(list(gap), [0.0] * 5, seeds), paired_difference(list(part), [0.0] * 5, seeds)
            interval = ratio_interval(share, whole)
            covered += interval is not None and interval[0] <= 0.4 <= interval[1]
            low, high = share.interval()
            naive += low / whole.mean <= 0.4 <= high / whole.mean
        assert 0.92 < covered / trials < 0.98, (shared, covered / trials)
        if shared == 0.0:
            assert naive / trials < 0.8, naive / trials


def test_a_ratio_over_a_gap_that_noise_explains_is_unbounded():
    whole = paired_difference([0.1, -0.1, 0.2, -0.2, 0.05], [0.0] * 5)
    part = paired_difference([0.05, 0.0, 0.1, -0.1, 0.0], [0.0] * 5)
    assert not whole.beyond_noise and ratio_interval(part, whole) is None


def test_ratio_interval_refuses_differences_on_other_seeds_or_what_is_no_paired_result():
    a = paired_difference([1.0, 2.0, 3.5], [0.9, 1.8, 3.45], seeds=(0, 1, 2))
    b = paired_difference([1.0, 2.0, 3.5], [0.9, 1.8, 3.45], seeds=(7, 8, 9))
    with pytest.raises(ValueError, match="same seeds"):
        ratio_interval(a, b)
    with pytest.raises(TypeError, match="paired_difference results"):
        ratio_interval(a, 0.5)
    with pytest.raises(ValueError, match="probability"):
        ratio_interval(a, a, level=95)
