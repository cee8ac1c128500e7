"""Tensor statistics against a format's limits, shared by the debugger and the pre-flight check.

:func:`tensor_stats` summarises one floating-point tensor and says what a format (FP16 by default)
would make of its values: how many it would flush to zero, store as subnormals, or overflow.
:mod:`mpcourse.debugging` (which re-exports these names: ``from mpcourse.debugging import
tensor_stats`` keeps working) and :mod:`mpcourse.preflight` both import them from here, so that
neither imports the other's helpers.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from mpcourse.formats import get_format, round_to

ROOT = "(model)"  # how records name the model itself, whose name in named_modules() is ""


class TensorStats(NamedTuple):
    """What :func:`tensor_stats` reports about one tensor.

    ``min``, ``max``, ``mean_abs`` and ``min_nonzero_abs`` are taken over the finite values only
    (NaN where there are none); ``nan`` and ``inf`` count the others. The last four fields are
    shares of *all* the tensor's values, and the last three say what ``fmt`` would make of them,
    as :func:`mpcourse.formats.round_to` rounds (to nearest, ties to even):

    - ``flushed``: non-zero values that ``fmt`` rounds to zero (in FP16: ``|x| <= 2**-25``);
    - ``subnormal``: values that ``fmt`` stores as subnormals, with fewer significant bits;
    - ``overflow``: finite values that ``fmt`` cannot hold: they become inf (NaN in a format with
      no inf, such as E4M3; for a format with neither, such as FP4, those beyond its largest value,
      which saturate). In FP16: ``|x| >= 65520``.

    For a tensor already in ``fmt`` the last three describe it as it is: ``flushed`` and
    ``overflow`` are zero, ``subnormal`` is the share of its values that are subnormal.
    """

    dtype: str
    shape: tuple
    min: float
    max: float
    mean_abs: float
    min_nonzero_abs: float
    zeros: float
    nan: int
    inf: int
    flushed: float
    subnormal: float
    overflow: float

    @property
    def max_abs(self) -> float:
        """The largest finite magnitude (NaN where no value is finite)."""
        return max(abs(self.min), abs(self.max))

    @property
    def nonfinite(self) -> int:
        """How many values are inf or NaN."""
        return self.nan + self.inf


def _check_format(fmt):
    fmt = get_format(fmt)
    if not (fmt.signed and fmt.has_zero):
        raise ValueError(f"{fmt.name} has no sign or no zero (it holds scale factors); "
                         f"describe tensors against a format such as 'fp16', 'bf16' or 'e4m3'")
    return fmt


def tensor_stats(t: torch.Tensor, fmt="fp16") -> TensorStats:
    """Summarise a floating-point tensor, and say what ``fmt`` would make of its values.

    See :class:`TensorStats` for the fields. Works on any device (the numbers come back to the
    CPU, which waits for the GPU) and any floating dtype; ``fmt`` is a
    :class:`~mpcourse.formats.FloatFormat` or a name (``"fp16"``, ``"bf16"``, ``"e4m3"``, ...).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tensor_stats takes a torch tensor, not {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"tensor_stats takes a floating-point tensor, got dtype {t.dtype}")
    if t.numel() == 0:
        raise ValueError("tensor_stats needs at least one value; the tensor is empty")
    fmt = _check_format(fmt)
    x = t.detach()
    x = x.double() if x.dtype == torch.float64 else x.float()  # FP16/BF16 are exact in float32
    count = x.numel()
    finite = torch.isfinite(x)
    values = x[finite]
    magnitudes = values.abs()
    nonzero = magnitudes[magnitudes > 0]

    def share(mask) -> float:
        return mask.sum().item() / count

    if fmt.has_infinity or fmt.has_nan:
        stored = round_to(values, fmt)
        overflow = share(~torch.isfinite(stored))
    else:  # FP6, FP4: no inf, no NaN, overflow saturates
        stored = round_to(values, fmt, saturate=True)
        overflow = share(magnitudes > fmt.max_value)
    stored_magnitude = stored.abs()
    return TensorStats(
        dtype=str(t.dtype).removeprefix("torch."),
        shape=tuple(t.shape),
        min=values.min().item() if values.numel() else math.nan,
        max=values.max().item() if values.numel() else math.nan,
        mean_abs=magnitudes.mean().item() if values.numel() else math.nan,
        min_nonzero_abs=nonzero.min().item() if nonzero.numel() else math.nan,
        zeros=share(x == 0),
        nan=int(torch.isnan(x).sum().item()),
        inf=int(torch.isinf(x).sum().item()),
        flushed=share((stored_magnitude == 0) & (magnitudes > 0)),
        subnormal=share((stored_magnitude > 0) & (stored_magnitude < fmt.min_normal)),
        overflow=overflow,
    )


def _floating_tensors(value, label: str):
    """(label, tensor) for every non-empty floating tensor in an output: a tensor, or tuples,
    lists and dicts of them."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.numel():
            yield label, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _floating_tensors(item, f"{label}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _floating_tensors(item, f"{label}[{key!r}]")
