"""Keep the book's sentences true: a check for every sentence that states a computed result.

A chapter says things about the numbers its cells compute ("BF16's gaps are 8 times FP16's",
"no gradient underflows in BF16"). Typed once, such a sentence drifts when the code, the data or
the machine changes, and nothing notices. Two ways keep it true:

* **Generate it** from the values, as a cell's Markdown output (``IPython.display.Markdown``):
  every sentence that depends on the hardware is written this way, from what the code detected.
* **Check it** with :func:`claim` in the cell that computes the result, quoting the sentence. When
  the sentence stops holding, the cell raises :class:`ClaimFailed`, which fails the book build
  (``jupyter-book build -W``) and the notebook tests (nbval), and the message says which sentence.

A number that came out is not yet an explanation. Three more disciplines keep the *reasons* true
(the contributor notes in the README have a worked example of each):

* **Causes** are checked by an ablation: remove the cause the sentence names, and ``claim`` that the
  effect changes as the sentence predicts.
* **Scope**: a rule ("never", "safe", "always") is checked at the edge where it would fail, or
  narrowed to the setting it was measured in.
* **Noise**: a ranking of training runs is checked against the seed-to-seed spread of the runs it
  ranks, with :func:`seed_spread` and :func:`beyond_noise`.

>>> claim("FP16's largest value is 65504", 65504.0 == 2**15 * (2 - 2**-10))
>>> claim("two plus two is five", 2 + 2 == 5, measured=2 + 2)
Traceback (most recent call last):
    ...
mpcourse.claims.ClaimFailed: the book says "two plus two is five", but this run measured: measured=4
"""
from __future__ import annotations

import math
import numbers
import random
from dataclasses import dataclass

__all__ = ["ClaimFailed", "Spread", "beyond_noise", "claim", "seed_spread"]


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
        ClaimFailed: the sentence does not hold for this run (a subclass of ``AssertionError``).
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise TypeError("claim() needs the sentence it protects, as a non-empty string")
    if not _is_truth_value(holds):
        raise TypeError(f"claim({sentence!r}, ...) needs a single truth value as its check, "
                        f"got {type(holds).__name__}: write the comparison that decides it")
    if not bool(holds):
        values = ", ".join(f"{name}={value!r}" for name, value in measured.items())
        detail = f"this run measured: {values}" if values else "the check failed"
        raise ClaimFailed(f'the book says "{sentence}", but {detail}')


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
    the seeds), and their ``low`` and ``high``; ``width`` is ``high - low``."""

    values: tuple
    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low


def seed_spread(run, seeds=(0, 1, 2)) -> Spread:
    """Run ``run(seed)`` once per seed and return the spread of its outcomes.

    ``run(seed)`` must seed everything that differs between two honest runs (the initialisation
    *and* the data order) from ``seed``, and return one finite real number (a final loss, an
    accuracy). The global random states of ``random``, NumPy and torch are restored afterwards, so
    measuring the noise does not change what the notebook's later cells draw.

    >>> seed_spread(lambda seed: [0.50, 0.53, 0.49][seed])
    Spread(values=(0.5, 0.53, 0.49), low=0.49, high=0.53)
    """
    if not callable(run):
        raise TypeError(f"seed_spread() needs a function run(seed) -> number, got {type(run).__name__}")
    seeds = tuple(seeds)
    if len(seeds) < 2:
        raise ValueError(f"seed_spread() needs at least two seeds to measure a spread, got {seeds!r}")
    if not all(isinstance(seed, numbers.Integral) and not isinstance(seed, bool) for seed in seeds):
        raise TypeError(f"seeds must be integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must differ from each other, got {seeds!r}")
    saved = _random_states()
    try:
        values = []
        for seed in seeds:
            values.append(_finite_real(run(int(seed)), f"run({seed})"))
    finally:
        _restore_random_states(saved)
    return Spread(values=tuple(values), low=min(values), high=max(values))


def beyond_noise(difference, spread: Spread) -> bool:
    """True when ``difference`` (between two runs' outcomes) is larger in size than the spread of
    one run across seeds: only then may a sentence rank the two; otherwise it says "within noise".

    >>> band = Spread(values=(0.50, 0.53, 0.49), low=0.49, high=0.53)
    >>> beyond_noise(0.10, band), beyond_noise(-0.02, band)
    (True, False)
    """
    if not isinstance(spread, Spread):
        raise TypeError(f"beyond_noise() needs a Spread from seed_spread(), got {type(spread).__name__}")
    return abs(_finite_real(difference, "beyond_noise()'s difference")) > spread.width


def _finite_real(value, what: str) -> float:
    """``value`` as a float: a real number, or a one-element NumPy array or tensor; finite."""
    if _size(value) == 1 and hasattr(value, "item"):
        value = value.item()
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{what} must be one real number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{what} is {value}: a spread is measured on finite outcomes")
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
