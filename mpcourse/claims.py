"""Keep the book's sentences true: a check for every sentence that states a computed result.

A chapter says things about the numbers its cells compute ("BF16's gaps are 8 times FP16's",
"no gradient underflows in BF16"). Typed once, such a sentence drifts when the code, the data or
the machine changes, and nothing notices. Two ways keep it true:

* **Generate it** from the values, as a cell's Markdown output (``IPython.display.Markdown``):
  every sentence that depends on the hardware is written this way, from what the code detected.
* **Check it** with :func:`claim` in the cell that computes the result, quoting the sentence. When
  the sentence stops holding, the cell raises :class:`ClaimFailed`, which fails the book build
  (``jupyter-book build -W``) and the notebook tests (nbval), and the message says which sentence.

>>> claim("FP16's largest value is 65504", 65504.0 == 2**15 * (2 - 2**-10))
>>> claim("two plus two is five", 2 + 2 == 5, measured=2 + 2)
Traceback (most recent call last):
    ...
mpcourse.claims.ClaimFailed: the book says "two plus two is five", but this run measured: measured=4
"""
from __future__ import annotations

import numbers

__all__ = ["ClaimFailed", "claim"]


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
    numel = getattr(value, "numel", None)  # torch tensors count with numel(), NumPy with size
    return (numel() if callable(numel) else getattr(value, "size", 0)) == 1
