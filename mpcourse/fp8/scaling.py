"""Where a per-tensor scale comes from: this step's amax (current) or past steps' (delayed).

*Current* (just-in-time) scaling reads the tensor's amax, then quantizes with
``fmt.max_value / amax``: two passes over the tensor, the first one a reduction that must finish
before the cast can start. *Delayed* scaling (Transformer Engine's original recipe, and in its
current source still the default recipe on GPUs older than Blackwell) quantizes with
a scale computed from the amaxes of *earlier* steps, and records this step's amax while casting,
in the same pass. It bets that a tensor's range changes slowly between steps; when it grows faster
than the history foresaw, the excess saturates at ``fmt.max_value`` (never NaN). ``margin``
buys headroom against that, one binade per unit.

Both classes have the same interface, ``quantize(x) -> QuantizedTensor``, so that
:class:`~mpcourse.fp8.Fp8Linear` can use either; :class:`Fp8Recipe` chooses one per tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mpcourse.formats import FloatFormat, get_format
from mpcourse.fp8.quantization import QuantizedTensor, amax_to_scale, quantize

AMAX_COMPUTE_ALGOS = ("max", "most_recent")
SCALINGS = ("delayed", "current")


class DelayedScaling:
    """Per-tensor scaling from a history of past amaxes (Transformer Engine's delayed recipe)::

        scale = (fmt.max_value / amax) / 2**margin

    where ``amax`` is the largest of the last ``amax_history_len`` recorded amaxes
    (``amax_compute_algo="max"``) or the last one (``"most_recent"``). The scale used at step t
    comes from the history *before* step t: quantize with :attr:`scale`, then :meth:`update` with
    the amax just seen. :meth:`quantize` does both::

        scaling = DelayedScaling("e4m3", amax_history_len=16)
        for x in batches:
            x_q = scaling.quantize(x)   # = quantize(x, "e4m3", scale=scaling.scale), then
                                        #   scaling.update(x_q.amax)

    Before anything is recorded the scale is 1.0. When the chosen amax is 0 (all-zero tensors)
    the previous scale stays, as in Transformer Engine. The history and the scale are tensors on
    the device of the last amax recorded.

    Attributes:
        scale: float32 tensor, shape ``()``: the scale for the next quantization.
        amax_history: float32 tensor of the recorded amaxes, oldest first, at most
            ``amax_history_len`` of them.
    """

    def __init__(self, fmt="e4m3", amax_history_len: int = 16, amax_compute_algo: str = "max",
                 margin: int = 0):
        if not isinstance(amax_history_len, int) or isinstance(amax_history_len, bool) \
                or amax_history_len < 1:
            raise ValueError(f"amax_history_len must be a positive int, got {amax_history_len!r}")
        if amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            raise ValueError(f"unknown amax_compute_algo {amax_compute_algo!r}; choose one of "
                             f"{', '.join(AMAX_COMPUTE_ALGOS)}")
        self.fmt: FloatFormat = get_format(fmt)
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo
        self.margin = margin
        amax_to_scale(0.0, self.fmt, margin)  # checks margin
        self.scale = torch.tensor(1.0)
        self.amax_history = torch.zeros(0)

    def update(self, amax) -> None:
        """Record the amax seen at this step and compute the scale for the next one."""
        amax = torch.as_tensor(amax, dtype=torch.float32).detach()
        if amax.numel() != 1:
            raise ValueError(f"update takes one amax (the tensor's), got shape {tuple(amax.shape)}")
        if not bool(torch.isfinite(amax).all() & (amax >= 0).all()):
            raise ValueError(f"amax must be finite and non-negative, got {float(amax)}")
        history = torch.cat([self.amax_history.to(amax.device), amax.reshape(1)])
        self.amax_history = history[-self.amax_history_len:]
        chosen = self.amax_history.max() if self.amax_compute_algo == "max" else self.amax_history[-1]
        self.scale = torch.where(chosen > 0, amax_to_scale(chosen, self.fmt, self.margin),
                                 self.scale.to(chosen.device))

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        """Quantize x with the current (delayed) scale, then record its amax."""
        x_q = quantize(x, self.fmt, scale=self.scale)
        self.update(x_q.amax)
        return x_q

    def __repr__(self) -> str:
        return (f"DelayedScaling({self.fmt.name}, amax_history_len={self.amax_history_len}, "
                f"amax_compute_algo={self.amax_compute_algo!r}, margin={self.margin}, "
                f"recorded={len(self.amax_history)}, scale={float(self.scale):.6g})")


class CurrentScaling:
    """Per-tensor scaling from the tensor itself: ``scale = fmt.max_value / amax(x)``.

    The same interface as :class:`DelayedScaling` (``quantize(x)``), without state: every call
    reads x's own amax first, so nothing saturates, at the price of a second pass over x.
    """

    def __init__(self, fmt="e4m3"):
        self.fmt: FloatFormat = get_format(fmt)

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        return quantize(x, self.fmt)

    def __repr__(self) -> str:
        return f"CurrentScaling({self.fmt.name})"


@dataclass(frozen=True)
class Fp8Recipe:
    """How :class:`~mpcourse.fp8.Fp8Linear` quantizes its three tensors, each with its own scaling.

    The default is the HYBRID format (the default format of Transformer Engine's per-tensor
    recipes, ``DelayedScaling`` and ``Float8CurrentScaling``): E4M3 (more precision) for the
    forward pass's input and weight, E5M2 (more range: gradients span more binades) for the
    gradient of the output in the backward pass. ``scaling="delayed"`` gives every tensor its own
    :class:`DelayedScaling` (``amax_history_len``, ``amax_compute_algo``, ``margin``);
    ``"current"`` a :class:`CurrentScaling` (no history, no margin). DeepSeek-V3 instead keeps
    E4M3 for the gradients too (``backward_format="e4m3"``), made possible by fine-grained
    scaling.
    """

    scaling: str = "delayed"
    forward_format: str | FloatFormat = "e4m3"
    backward_format: str | FloatFormat = "e5m2"
    amax_history_len: int = 16
    amax_compute_algo: str = "max"
    margin: int = 0

    def __post_init__(self):
        if self.scaling not in SCALINGS:
            raise ValueError(f"unknown scaling {self.scaling!r}; choose one of {', '.join(SCALINGS)}")
        if self.scaling == "current" and self.margin != 0:
            raise ValueError("margin is headroom for delayed scaling; current scaling needs none")
        self.make_scaling(self.forward_format)  # checks every field
        self.make_scaling(self.backward_format)

    def make_scaling(self, fmt) -> DelayedScaling | CurrentScaling:
        """A fresh scaling (its own history) for one tensor stored in ``fmt``."""
        if self.scaling == "current":
            return CurrentScaling(fmt)
        return DelayedScaling(fmt, self.amax_history_len, self.amax_compute_algo, self.margin)
