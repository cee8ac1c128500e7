"""Keep the book's sentences true: a check for every sentence that states a computed result.

A chapter says things about the numbers its cells compute ("BF16's gaps are 8 times FP16's",
"no gradient underflows in BF16"). Typed once, such a sentence drifts when the code, the data or
the machine changes, and nothing notices. Two ways keep it true:

* **Generate it** from the values, as a cell's Markdown output (``IPython.display.Markdown``):
  every sentence that depends on the hardware is written this way, from what the code detected.
* **Check it** with :func:`claim` in the cell that computes the result, quoting the sentence. When
  the sentence stops holding, the cell raises :class:`ClaimFailed`, which fails the book build
  (``jupyter-book build -W``) and the notebook tests (nbval), and the message says which sentence.
  Both set ``MPCOURSE_STRICT_CLAIMS=1``; without it (a reader running a chapter on a laptop, Colab)
  a sentence that does not hold on that machine is printed with what it measured, and the notebook
  goes on: another CPU's kernels round some results differently, and "Run all" should not stop.

A number that came out is not yet an explanation. Three more disciplines keep the *reasons* true
(the contributor notes in the README have a worked example of each):

* **Causes** are checked by an ablation: remove the cause the sentence names, and ``claim`` that the
  effect changes as the sentence predicts.
* **Scope**: a rule ("never", "safe", "always") is checked at the edge where it would fail, or
  narrowed to the setting it was measured in.
* **Noise**: a ranking of training runs is checked against run-to-run noise measured the right way.
  When the runs it compares share their seeds (the same initial weights and the same batches for
  both), the design is *paired*: :func:`paired_difference` tests the per-seed differences (a
  paired t-test). When they do not, the difference is set against the seed-to-seed spread of one
  run, :func:`seed_spread`, with :func:`beyond_noise`.

>>> claim("FP16's largest value is 65504", 65504.0 == 2**15 * (2 - 2**-10))
>>> claim("two plus two is five", 2 + 2 == 5, measured=2 + 2)
Traceback (most recent call last):
    ...
mpcourse.claims.ClaimFailed: the book says "two plus two is five", but this run measured: measured=4
"""
from __future__ import annotations

import math
import numbers
import os
import random
import sys
from dataclasses import dataclass

__all__ = ["ClaimFailed", "Paired", "Spread", "beyond_noise", "claim", "paired_difference",
           "ratio_interval", "seed_spread", "sign_test"]


STRICT = "MPCOURSE_STRICT_CLAIMS"  # "1": a sentence that does not hold raises (the build, the tests)


class ClaimFailed(AssertionError):
    """A sentence of the book no longer holds for the numbers the code computed."""


def claim(sentence: str, holds, **measured) -> None:
    """Fail, quoting ``sentence``, unless ``holds`` is true.

    Args:
        sentence: the sentence of the book that the check protects, as the page states it (or the
            part of it that the check covers).
        holds: the check, a single truth value: a Python or NumPy bool, or a one-element tensor.
            Anything else (a list, a many-element array, ``None``) is a mistake in the check and
            raises ``TypeError``, rather than being read as true or false.
        **measured: the values the check is about; they are quoted in the failure message so that
            a failed build shows what the run measured instead of what the sentence says.

    Raises:
        ClaimFailed: the sentence does not hold for this run (a subclass of ``AssertionError``),
            where ``MPCOURSE_STRICT_CLAIMS=1`` (the tests and the book build); elsewhere the
            difference is printed on standard error instead.
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise TypeError("claim() needs the sentence it protects, as a non-empty string")
    if not _is_truth_value(holds):
        raise TypeError(f"claim({sentence!r}, ...) needs a single truth value as its check, "
                        f"got {type(holds).__name__}: write the comparison that decides it")
    if not bool(holds):
        values = ", ".join(f"{name}={value!r}" for name, value in measured.items())
        detail = f"this run measured: {values}" if values else "the check failed"
        if os.environ.get(STRICT) == "1":
            raise ClaimFailed(f'the book says "{sentence}", but {detail}')
        print(f'On this machine a sentence of the page does not hold: the book says "{sentence}", but {detail}. '
              "The page was built on another machine: if this notebook is unchanged, this machine's "
              "kernels round some results differently.", file=sys.stderr)


def _is_truth_value(value) -> bool:
    """A bool, a NumPy bool, or a one-element boolean NumPy array or torch tensor."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return True
    if "bool" not in str(getattr(value, "dtype", "")):
        return False
    return _size(value) == 1


@dataclass(frozen=True)
class Spread:
    """What one training outcome does from seed to seed: ``values`` (one per seed, in the order of
    the seeds), and their ``low`` and ``high``; ``width`` is ``high - low``, ``mean`` and ``sd``
    (the sample standard deviation, with n - 1) describe the same values."""

    values: tuple
    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / len(self.values)

    @property
    def sd(self) -> float:
        return _sample_sd(self.values)


def seed_spread(run, seeds=(0, 1, 2)) -> Spread:
    """Run ``run(seed)`` once per seed and return the spread of its outcomes.

    ``run(seed)`` must seed everything that differs between two honest runs (the initialisation
    *and* the data order) from ``seed``, and return one finite real number (a final loss, an
    accuracy). The global random states of ``random``, NumPy and torch are restored afterwards, so
    measuring the noise does not change what the notebook's later cells draw. ``run`` may also be
    the outcomes already measured, one per seed (``seed_spread(paired.b, paired.seeds)``).

    >>> band = seed_spread(lambda seed: [0.50, 0.53, 0.49][seed])
    >>> band
    Spread(values=(0.5, 0.53, 0.49), low=0.49, high=0.53)
    >>> round(band.sd, 4)
    0.0208
    """
    seeds = _check_seeds(seeds, at_least=2, caller="seed_spread()")
    values = _outcomes(run, seeds, "run")
    return Spread(values=values, low=min(values), high=max(values))


@dataclass(frozen=True)
class Paired:
    """Two runs compared seed by seed: ``a[k]`` and ``b[k]`` are their outcomes with ``seeds[k]``.

    ``differences[k] = a[k] - b[k]``; ``mean`` and ``sd`` are their mean and sample standard
    deviation (n - 1); ``t = mean / (sd / sqrt(n))`` is the paired t statistic, and ``p`` its
    two-sided p-value from Student's t distribution with n - 1 degrees of freedom: how often a
    mean difference at least this far from 0 would come out if the two runs differed only by
    chance. ``beyond_noise`` is ``p < 0.05``.

    Pairing removes what the two runs share, the initial weights and the batches, so a small but
    consistent difference shows up even where the seed-to-seed spread of one run is wide.
    """

    seeds: tuple
    a: tuple
    b: tuple
    differences: tuple
    mean: float
    sd: float
    t: float
    p: float
    unit: str = "seeds"  # what the pairs are: "seeds", or "batches" for one model on many batches

    LEVEL = 0.05  # two-sided significance level of ``beyond_noise``

    @property
    def beyond_noise(self) -> bool:
        return self.p < self.LEVEL

    @property
    def verdict(self) -> str:
        """"beyond noise" or "within noise", for a sentence generated from the result."""
        return "beyond noise" if self.beyond_noise else "within noise"

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """The ``level`` confidence interval of the mean difference, ``mean ± t · sd / sqrt(n)``
        with ``t`` the two-sided quantile of Student's t distribution with n - 1 degrees of
        freedom. It excludes 0 exactly when ``p < 1 - level``.

        >>> result = paired_difference([0.3, 0.5, 0.4], [0.2, 0.2, 0.3], seeds=(0, 1, 2))
        >>> [round(end, 3) for end in result.interval()], result.beyond_noise
        ([-0.12, 0.454], False)
        """
        if not 0 < level < 1:
            raise ValueError(f"level is a probability between 0 and 1, not {level!r}")
        if self.sd == 0:
            return (self.mean, self.mean)
        from scipy.stats import t as student_t
        half = float(student_t.ppf((1 + level) / 2, len(self.differences) - 1)) * self.sd
        half /= math.sqrt(len(self.differences))
        return (self.mean - half, self.mean + half)

    def __str__(self) -> str:
        """One line for the reader: ``"+0.0120 ± 0.0040 (mean ± sd over 5 paired seeds; t = 6.71,
        p = 0.0026): beyond noise"``."""
        return format(self, "")

    def __format__(self, spec: str) -> str:
        """``f"{result}"`` is ``str(result)``. ``f"{result:pp}"`` is the same line for outcomes that
        are fractions shown elsewhere in percent (errors, accuracies): the mean and sd in percentage
        points, ``"+1.2 pp ± 0.4 pp (mean ± sd over 5 paired seeds; ...)"``; t and p do not change.

        >>> result = paired_difference([0.137, 0.120, 0.151], [0.110, 0.094, 0.123], seeds=(0, 1, 2))
        >>> f"{result:pp}".split(" (")[0]
        '+2.7 pp ± 0.1 pp'
        """
        if spec not in ("", "pp"):
            raise ValueError(f"a Paired result formats as '' (as computed) or 'pp' (percentage points), not {spec!r}")
        scale, suffix = (100, " pp") if spec == "pp" else (1, "")
        return (f"{scale * self.mean:+.3g}{suffix} ± {scale * self.sd:.2g}{suffix} (mean ± sd over {len(self.seeds)} "
                f"paired {self.unit}; t = {self.t:.2f}, p = {self.p:.2g}): {self.verdict}")


def paired_difference(run_a, run_b, seeds=(0, 1, 2, 3, 4), *, unit: str = "seeds") -> Paired:
    """Compare two runs that share their seeds: ``run_a(seed) - run_b(seed)``, tested with a
    paired t-test over ``seeds`` (at least three).

    ``run_a`` and ``run_b`` are functions ``run(seed) -> number`` that draw *the same* initial
    weights and batch order from ``seed`` (only the thing compared, a format or a recipe, differs
    between them), or the outcomes already measured, one per seed in the order of ``seeds``. The
    global random states are restored afterwards, as in :func:`seed_spread`. ``unit`` names what
    the pairs are in the generated sentence: ``"seeds"``, or e.g. ``"batches"`` when ``seeds``
    are batch indices (one model measured on the same batches two ways).

    >>> result = paired_difference(lambda s: [0.50, 0.61, 0.42][s] + 0.01, lambda s: [0.50, 0.61, 0.42][s],
    ...                            seeds=(0, 1, 2))
    >>> result.beyond_noise, round(result.mean, 3)
    (True, 0.01)
    """
    seeds = _check_seeds(seeds, at_least=3, caller="paired_difference()")
    a, b = _outcomes(run_a, seeds, "run_a"), _outcomes(run_b, seeds, "run_b")
    differences = tuple(x - y for x, y in zip(a, b))
    n = len(differences)
    mean, sd = math.fsum(differences) / n, _sample_sd(differences)
    if sd == 0:  # the same difference on every seed: none at all, or one that no noise explains
        t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    else:
        from scipy.stats import t as student_t
        t = mean / (sd / math.sqrt(n))
        p = float(2 * student_t.sf(abs(t), n - 1))
    if not isinstance(unit, str) or not unit:
        raise TypeError(f"unit names what the pairs are (e.g. \"batches\"), got {unit!r}")
    return Paired(seeds=seeds, a=a, b=b, differences=differences, mean=mean, sd=sd, t=t, p=p, unit=unit)


def ratio_interval(top: Paired, bottom: Paired, level: float = 0.95) -> tuple[float, float] | None:
    """The ``level`` confidence interval of ``top.mean / bottom.mean``, two paired differences
    measured on the same seeds (what share of a gap one cause accounts for), by Fieller's method:
    the noise of both means and their covariance carried, with Student's t at n - 1 degrees of
    freedom. ``None`` when the interval is unbounded: ``bottom`` is not resolved from 0 at this
    level, so no ratio can be bounded. (Dividing the two means and keeping ``top``'s interval alone
    takes the denominator as exact and gives too narrow an interval.)

    >>> gap = paired_difference([1.0, 1.2, 0.9, 1.1, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0])
    >>> part = paired_difference([0.5, 0.7, 0.4, 0.5, 0.6], [0.0, 0.0, 0.0, 0.0, 0.0])
    >>> [round(end, 3) for end in ratio_interval(part, gap)]
    [0.423, 0.604]
    >>> ratio_interval(part, paired_difference([0.1, -0.1, 0.2, -0.2, 0.0], [0.0] * 5)) is None
    True
    """
    if not (isinstance(top, Paired) and isinstance(bottom, Paired)):
        raise TypeError("ratio_interval takes two paired_difference results, "
                        f"got {type(top).__name__} and {type(bottom).__name__}")
    if top.seeds != bottom.seeds:
        raise ValueError(f"ratio_interval needs the two differences on the same seeds, got {top.seeds} and {bottom.seeds}")
    if not 0 < level < 1:
        raise ValueError(f"level is a probability between 0 and 1, not {level!r}")
    from scipy.stats import t as student_t
    n = len(top.differences)
    t = float(student_t.ppf((1 + level) / 2, n - 1))
    mt, mb = top.mean, bottom.mean
    # variances and covariance of the two means (sample, n - 1), from the per-seed differences
    s_tt = math.fsum((x - mt) ** 2 for x in top.differences) / (n - 1) / n
    s_bb = math.fsum((y - mb) ** 2 for y in bottom.differences) / (n - 1) / n
    s_tb = math.fsum((x - mt) * (y - mb) for x, y in zip(top.differences, bottom.differences)) / (n - 1) / n
    # the ratios r with (mt - r mb)^2 <= t^2 (s_tt - 2 r s_tb + r^2 s_bb): a r^2 - 2 b r + c <= 0
    a, b, c = mb * mb - t * t * s_bb, mt * mb - t * t * s_tb, mt * mt - t * t * s_tt
    if a <= 0:
        return None
    root = math.sqrt(max(b * b - a * c, 0.0))
    return ((b - root) / a, (b + root) / a)


def sign_test(k: int, n: int) -> float:
    """The exact two-sided sign test: the chance that ``n`` fair coin flips split at least as
    unevenly as ``k`` against ``n - k``. Give it the number of pairs in which one run was the
    larger (ties dropped from ``n``); unlike the paired t-test it does not care how large each
    difference was, so one wild pair cannot hide a consistent direction.

    >>> sign_test(6, 6), round(sign_test(5, 6), 4), sign_test(3, 6)
    (0.03125, 0.2188, 1.0)
    """
    if isinstance(k, bool) or isinstance(n, bool) or not (isinstance(k, numbers.Integral)
                                                          and isinstance(n, numbers.Integral)):
        raise TypeError(f"sign_test counts pairs: k and n are integers, got {k!r} and {n!r}")
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"sign_test needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n  # the uneven side
    return min(1.0, 2 * tail)


def beyond_noise(difference, spread: Spread | None = None) -> bool:
    """May a sentence rank two runs? Otherwise it says "within noise".

    Unpaired runs (different seeds, or one run against a published number): True when
    ``difference`` is larger in size than the seed-to-seed ``spread`` of one run. Paired runs:
    pass the :class:`Paired` result alone, and the paired test decides (``p < 0.05``); a
    difference and a band are the wrong yardstick for runs that share their seeds.

    >>> band = Spread(values=(0.50, 0.53, 0.49), low=0.49, high=0.53)
    >>> beyond_noise(0.10, band), beyond_noise(-0.02, band)
    (True, False)
    """
    if isinstance(difference, Paired):
        if spread is not None:
            raise TypeError("beyond_noise(paired) takes the Paired result alone: the paired test "
                            "already measured the noise")
        return difference.beyond_noise
    if not isinstance(spread, Spread):
        raise TypeError(f"beyond_noise() needs a Spread from seed_spread(), got {type(spread).__name__}")
    return abs(_finite_real(difference, "beyond_noise()'s difference")) > spread.width


def _check_seeds(seeds, at_least: int, caller: str) -> tuple:
    seeds = tuple(seeds)
    if len(seeds) < at_least:
        raise ValueError(f"{caller} needs at least {at_least} seeds to measure noise, got {seeds!r}")
    if not all(isinstance(seed, numbers.Integral) and not isinstance(seed, bool) for seed in seeds):
        raise TypeError(f"seeds must be integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must differ from each other, got {seeds!r}")
    return tuple(int(seed) for seed in seeds)


def _outcomes(run, seeds: tuple, name: str) -> tuple:
    """``run(seed)`` for every seed (random states restored afterwards), or ``run`` itself when it
    is the outcomes already measured, one per seed; each one finite real number."""
    if callable(run):
        saved = _random_states()
        try:
            return tuple(_finite_real(run(seed), f"{name}({seed})") for seed in seeds)
        finally:
            _restore_random_states(saved)
    if isinstance(run, (str, bytes)) or not hasattr(run, "__len__"):
        raise TypeError(f"{name} must be a function {name}(seed) -> number, or one outcome per seed; "
                        f"got {type(run).__name__}")
    if len(run) != len(seeds):
        raise ValueError(f"{name} has {len(run)} outcomes for {len(seeds)} seeds {seeds!r}")
    return tuple(_finite_real(value, f"{name} with seed {seed}") for value, seed in zip(run, seeds))


def _sample_sd(values) -> float:
    """The sample standard deviation (n - 1 in the denominator)."""
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _finite_real(value, what: str) -> float:
    """``value`` as a float: a real number, or a one-element NumPy array or tensor; finite."""
    if _size(value) == 1 and hasattr(value, "item"):
        value = value.item()
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{what} must be one real number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{what} is {value}: noise is measured on finite outcomes (a run that "
                         f"diverged is a result to report, not a number to average)")
    return float(value)


def _size(value):
    numel = getattr(value, "numel", None)  # torch tensors count with numel(), NumPy with size
    return numel() if callable(numel) else getattr(value, "size", None)


def _random_states():
    import numpy as np
    import torch
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _restore_random_states(states) -> None:
    import numpy as np
    import torch
    python, numpy_state, torch_state, cuda = states
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
