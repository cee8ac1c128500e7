"""Before a long run: will this model train with its activations and gradients in FP16, BF16 or FP8?

:func:`preflight` runs one FP32 forward and backward pass on a copy of the model and reports, per
format, whether its activations and gradients fit (and which modules are to blame where they do
not), and which FP16 loss scales work on these gradients. It asks whether a model *can* train in a
format; :mod:`mpcourse.doctor` watches a real training loop and says what is wrong with it.
``from mpcourse.debugging import preflight`` keeps working.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from mpcourse.formats import get_format, round_to
from mpcourse.stats import ROOT, _check_format, _floating_tensors, tensor_stats

FP8_BITS = 8  # formats this narrow are used with a per-tensor scale, as FP8 training does
# A per-tensor FP8 recipe (Transformer Engine's HYBRID, the default of its delayed and current
# scaling) keeps activations and weights in E4M3 and stores gradients in E5M2, whose range is
# 2^14 times wider: the gradients of an "e4m3" report are measured in E5M2.
GRADIENT_FORMAT = {"e4m3": "e5m2"}
FINER_SCALING = ("needs finer scaling: after a per-tensor scale (amax mapped to the format's "
                 "largest value) more than 1% of the non-zero gradient values still round to zero. "
                 "That counts values, not what they carry: where the flushed values hold a "
                 "negligible share of their tensor's magnitude (the table's second underflow "
                 "figure), the sums they enter hardly change; where they hold more than the "
                 "format's own rounding error, give the modules named a scale per block (MXFP8: 32 "
                 "values; 128 in DeepSeek-V3's recipe) or keep them in BF16")


@dataclass
class PreflightReport:
    """What :func:`preflight` found; see there for the meaning of each field."""

    rows: list[dict]
    verdicts: dict[str, str]
    culprits: dict[str, list[str]]
    loss_scale: tuple[float, float] | None
    loss_scale_reason: str
    formats: tuple[str, ...]
    loss_scale_edges: tuple[str, str] | None = None  # why lo, why hi: the two halves of the reason
    carriers: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # see preflight

    def to_markdown(self, rows: bool = True, legend: bool = True) -> str:
        """The verdicts, the FP16 loss-scale range, and (``rows=True``) one table row per activation
        or gradient. ``legend=False`` leaves out the paragraph that explains "needs finer scaling"."""
        lines = ["| format | verdict | modules responsible |", "|---|---|---|"]
        for name, verdict in self.verdicts.items():
            shown = f"{name} (gradients in {GRADIENT_FORMAT[name]})" if name in GRADIENT_FORMAT else name
            named = ", ".join(self.culprits[name]) or "-"
            if self.carriers.get(name):
                named += f" (its overflow carried on by {', '.join(self.carriers[name])})"
            lines.append(f"| {shown} | {verdict} | {named} |")
        if legend and "needs finer scaling" in self.verdicts.values():
            lines += ["", FINER_SCALING[0].upper() + FINER_SCALING[1:] + "."]
        if self.loss_scale is None:
            lines += ["", f"FP16 loss scale: none works ({self.loss_scale_reason})."]
        else:
            (lo, hi), (bottom, top) = self.loss_scale, self.loss_scale_edges
            lines += ["", "| FP16 loss scale, a candidate range from this batch | why |", "|---|---|",
                      f"| from 2^{int(math.log2(lo))} | {bottom} |",
                      f"| to 2^{int(math.log2(hi))} | {top}. No headroom: other batches' larger gradients "
                      f"can overflow there, so start a dynamic scaler there or take a static scale well "
                      f"below it |"]
        if not rows:
            return "\n".join(lines)
        header = " | ".join(f"{n} overflow | {n} underflow (values / magnitude)" for n in self.formats)
        lines += ["", f"| module | tensor | max abs | {header} |",
                  "|---|---|---|" + "---|---|" * len(self.formats)]
        for row in self.rows:
            cells = " | ".join(f"{row[n]['overflow']:.2%} | {row[n]['underflow']:.2%} / "
                               f"{row[n]['underflow_mass']:.1e}" for n in self.formats)
            what = row["tensor"] if row["parameter"] is None else f"weight gradient ({row['parameter']})"
            lines.append(f"| {row['module']} | {what} | {row['max_abs']:.3g} | {cells} |")
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def plot(self, ax=None):
        """Largest and smallest non-zero magnitude of every row, against each format's range."""
        import matplotlib.pyplot as plt

        from mpcourse.plotting import FORMAT_COLORS

        if ax is None:
            _, ax = plt.subplots(figsize=(9, 0.25 * len(self.rows) + 1.5))
        y = range(len(self.rows))
        for i, row in zip(y, self.rows):
            if row["max_abs"] > 0:
                ax.plot([row["min_nonzero_abs"], row["max_abs"]], [i, i], "-o", color="0.3",
                        markersize=3, linewidth=1.5)
        for name in self.formats:
            fmt = get_format(name)
            if fmt.bits > FP8_BITS:  # scaled formats have no fixed range to draw
                color = FORMAT_COLORS.get(fmt.name, "0.5")
                ax.axvspan(fmt.min_subnormal, fmt.max_value, color=color, alpha=0.08)
                for value, style in ((fmt.min_normal, "--"), (fmt.max_value, "-")):
                    ax.axvline(value, color=color, linestyle=style, linewidth=1,
                               label=f"{name.upper()} {'max' if style == '-' else 'min normal'}")
        ax.set_yticks(list(y), [f"{r['module']}: {r['tensor']}" if r["parameter"] is None
                                else f"{r['parameter']}: gradient" for r in self.rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log", base=2)
        ax.set_xlabel("magnitude (smallest non-zero to largest, log scale)")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3, axis="x")
        return ax


def _to_fp32(value):
    """Floating tensors (also inside tuples, lists and dicts) as float32; the rest unchanged."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_fp32(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_fp32(v) for k, v in value.items()}
    return value


def _format_shares(tensor: torch.Tensor, fmt) -> dict[str, float]:
    """Shares of ``tensor`` that overflow (of all its values) and underflow (of the non-zero
    ones) in ``fmt``, as :func:`tensor_stats` counts them, and ``underflow_mass``: the share of the
    finite values' total magnitude (sum of ``|x|``) that the underflowing ones carry. Formats of 8
    bits or fewer after a per-tensor scale that maps the largest magnitude to the format's largest
    value."""
    finite = tensor[torch.isfinite(tensor)]
    amax = finite.abs().max().item() if finite.numel() else 0.0
    if fmt.bits <= FP8_BITS and amax > 0:
        tensor, finite = tensor * (fmt.max_value / amax), finite * (fmt.max_value / amax)
    stats = tensor_stats(tensor, fmt)
    nonzero = 1.0 - stats.zeros - stats.nonfinite / tensor.numel()
    # Round to nearest, ties to even: exactly the magnitudes up to half the smallest subnormal become 0.
    magnitudes = finite.double().abs()
    flushed = magnitudes[(magnitudes > 0) & (magnitudes <= fmt.min_subnormal / 2)]
    total = magnitudes.sum().item()
    return {"overflow": stats.overflow + stats.nonfinite / tensor.numel(),
            "underflow": stats.flushed / nonzero if nonzero > 0 else 0.0,
            "underflow_mass": flushed.sum().item() / total if total > 0 else 0.0}


def _rng_states():
    import random

    import numpy as np

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda, random.getstate(), np.random.get_state()


def _restore_rng(states) -> None:
    import random

    import numpy as np

    cpu, cuda, python, numpy_state = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    random.setstate(python)
    np.random.set_state(numpy_state)


def preflight(model: nn.Module, inputs, loss_fn, targets=None, *,
              formats=("fp16", "bf16", "e4m3")) -> PreflightReport:
    """Before a long run: will ``model`` train with its activations and gradients in each format?

    One FP32 forward and backward pass, ``loss = loss_fn(model(inputs), targets)`` (or
    ``loss_fn(model(inputs))`` when ``targets`` is None), in the model's current mode (train or
    eval), on a float32 copy of the model: the model itself is left exactly as it was (parameters,
    ``.grad``, buffers, mode, hooks), and the global random-number state is restored afterwards.

    Returns a :class:`PreflightReport` with

    - ``rows``: for every submodule (named as in ``named_modules()``, the model itself left out)
      a row with ``tensor="activation"`` (its output) and one with ``tensor="output gradient"``
      (the gradient of the loss with respect to that output); for every parameter a row with
      ``tensor="weight gradient"``, ``module`` its owner's name and ``parameter`` its full name
      (``None`` in the other rows). Every row has ``max_abs``, ``min_nonzero_abs`` and, per
      format name, ``{"overflow": f, "underflow": g, "underflow_mass": m}``: ``f`` the share of
      the elements that overflow when cast to the format (round to inf, or beyond its largest
      value where it has no inf; as :func:`tensor_stats` counts), ``g`` the share of the non-zero
      elements that round to zero, ``m`` the share of the tensor's total magnitude (sum of
      ``|x|``) that those elements carry: many tiny values can be a large ``g`` and a negligible
      ``m``, and a gradient that only enters sums (a module's output gradient) loses ``m``. Formats of 8 bits or fewer (E4M3, E5M2, ...) are measured after a
      per-tensor scale ``fmt.max_value / amax``, as FP8 training does, and for ``"e4m3"`` the
      gradient rows are measured in E5M2 (:data:`GRADIENT_FORMAT`), the gradient format of the
      per-tensor recipes. A module called several times contributes all its outputs; a tensor
      that receives no gradient counts as zeros.
    - ``verdicts``: per format, ``"overflow"`` (some activation or gradient overflows at scale 1,
      or is already inf/NaN in FP32), else ``"needs loss scaling"`` (more than 1% of the non-zero
      gradient elements underflow; for the scaled 8-bit formats ``"needs finer scaling"``: the
      per-tensor scale cannot serve the range of those gradients, see :data:`FINER_SCALING`; both
      count values, and the rows' ``underflow_mass`` says what the lost values carried),
      else ``"ok"``. The verdicts assume activations and gradients stored in the format with the
      weights kept in FP32, and they judge *range*, not precision: a model that is "ok" in BF16
      may still lose accuracy to BF16's 8 significant bits.
    - ``culprits``: per format, the modules responsible for its verdict (empty when "ok"). For an
      overflow in the forward pass, the modules whose output overflows although their inputs fit
      the format (where the overflow starts; a container is named only if none of its submodules
      is; where the model's own input is already beyond the format, the first module whose output
      overflows); ``carriers`` lists the other modules whose output overflows, which only pass it on
      (the layers after the culprit, and the containers around it). Gradient overflows name every
      module whose gradient overflows.
    - ``loss_scale``: for FP16, ``(lo, hi)``, powers of two: the loss scales ``s`` under which
      the gradients (output and weight gradients, each multiplied by ``s``) get the FP16 verdict
      "ok": none of them overflows, and at most 1% of the non-zero ones round to zero. ``lo`` is
      the smallest such power of two (at ``lo / 2`` more than 1% round to zero) and ``hi`` the
      largest (at ``2 * hi`` one overflows), both checked by casting the real gradients. So the
      range and the verdict at scale 1 agree: "needs loss scaling" exactly when ``1 < lo``, "ok"
      when ``lo <= 1 <= hi``, and a gradient overflow when ``hi < 1`` (a scale below 1 is loss
      *down*-scaling). ``None`` where no scale works (an activation already overflows FP16 in
      the forward pass, a gradient is inf/NaN in FP32, every gradient is zero, or the gradients
      span more than FP16's range), with the reason in ``loss_scale_reason``. ``hi`` has no
      headroom: a dynamic scaler that doubles the scale probes above it.

    Raises ``TypeError`` for a model that is not an ``nn.Module`` or a ``loss_fn`` that is not
    callable, and ``ValueError`` for a model without parameters, an unknown or unsigned format,
    no formats, or a loss that is not a single number.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"preflight takes an nn.Module, not {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if not any(True for _ in model.parameters()):
        raise ValueError("preflight needs a model with parameters: there are no gradients to check")
    if isinstance(formats, str) or not formats:
        raise ValueError(f"formats must be a non-empty sequence of format names, got {formats!r}")
    fmts = {fmt.name: fmt for fmt in map(_check_format, formats)}  # ValueError for unknown names

    rng = _rng_states()
    try:
        copy_ = copy.deepcopy(model).float()
        for p in copy_.parameters():
            p.grad = None
        activations, gradients, input_max = {}, {}, {}

        def keep(name):
            def hook(module, args, output):
                for _, tensor in _floating_tensors(args, "input"):   # inf/NaN inputs count as inf
                    largest = tensor.detach().abs().max().nan_to_num(math.inf).item()
                    input_max[name] = max(input_max.get(name, 0.0), largest)
                for _, tensor in _floating_tensors(output, "output"):
                    activations.setdefault(name, []).append(tensor.detach().flatten())
                    if tensor.requires_grad:
                        tensor.register_hook(
                            lambda g, t=tensor: gradients.setdefault(name, []).append(
                                g.detach().flatten()))
            return hook

        names = [name for name, _ in copy_.named_modules() if name]
        handles = [copy_.get_submodule(n).register_forward_hook(keep(n)) for n in names]
        try:
            output = copy_(_to_fp32(inputs))
            loss = loss_fn(output) if targets is None else loss_fn(output, _to_fp32(targets))
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise ValueError(f"loss_fn must return a single number (a one-element tensor), "
                                 f"got {shape}: reduce it, e.g. with .mean()")
            loss.backward()
        finally:
            for handle in handles:
                handle.remove()
    finally:
        _restore_rng(rng)

    def row(module, tensor_name, values, parameter=None):
        values = values if values.numel() else torch.zeros(1)
        finite = values[torch.isfinite(values)].abs()
        nonzero = finite[finite > 0]
        entry = {"module": module, "tensor": tensor_name, "parameter": parameter,
                 "max_abs": finite.max().item() if finite.numel() else math.nan,
                 "min_nonzero_abs": nonzero.min().item() if nonzero.numel() else 0.0}
        for name, fmt in fmts.items():
            if tensor_name != "activation" and fmt.name in GRADIENT_FORMAT:
                fmt = get_format(GRADIENT_FORMAT[fmt.name])
            entry[name] = _format_shares(values, fmt)
        return entry, values

    rows, grad_values = [], []
    for name in names:
        seen = activations.get(name)
        if not seen:
            continue  # a module that did not run in this forward pass
        rows.append(row(name, "activation", torch.cat(seen))[0])
        grads = gradients.get(name) or [torch.zeros_like(t) for t in seen]
        entry, values = row(name, "output gradient", torch.cat(grads))
        rows.append(entry)
        grad_values.append(values)
    for full_name, param in copy_.named_parameters():
        owner = full_name.rpartition(".")[0] or ROOT
        grad = param.grad if param.grad is not None else torch.zeros_like(param)
        entry, values = row(owner, "weight gradient", grad.detach().flatten(), full_name)
        rows.append(entry)
        grad_values.append(values)

    verdicts, culprits, carriers = {}, {}, {}
    for name, fmt in fmts.items():
        overflowing = [r["module"] for r in rows if r[name]["overflow"] > 0]
        if overflowing:
            forward = [r["module"] for r in rows if r["tensor"] == "activation" and r[name]["overflow"] > 0]
            starts = [m for m in forward if _fits(input_max.get(m, 0.0), fmt)]
            starts = [m for m in starts if not any(o.startswith(m + ".") for o in starts)]  # no containers
            starts = starts or forward[:1]  # the model's own input is beyond the format: the first module
            backward = [m for m in overflowing if m not in forward]
            verdicts[name] = "overflow"
            culprits[name] = list(dict.fromkeys(starts + backward))
            carriers[name] = [m for m in forward if m not in culprits[name]]
            continue
        grad_rows = [r for r in rows if r["tensor"] != "activation"]
        lost = kept = 0.0
        for r, values in zip(grad_rows, grad_values):
            nonzero = int((values != 0).sum())
            lost += r[name]["underflow"] * nonzero
            kept += nonzero
        if kept and lost / kept > 0.01:
            verdicts[name] = "needs finer scaling" if fmt.bits <= FP8_BITS else "needs loss scaling"
            culprits[name] = list(dict.fromkeys(r["module"] for r in grad_rows
                                                if r[name]["underflow"] > 0.01))
        else:
            verdicts[name], culprits[name] = "ok", []

    loss_scale, edges = _fp16_loss_scale(rows, grad_values)
    reason = edges if isinstance(edges, str) else "; ".join(edges)
    return PreflightReport(rows, verdicts, culprits, loss_scale, reason, tuple(fmts),
                           None if isinstance(edges, str) else edges, carriers)


def _fits(largest: float, fmt) -> bool:
    """Whether inputs whose largest magnitude is ``largest`` fit ``fmt``: finite after rounding to
    it (16-bit formats), or finite at all (the 8-bit formats, which a per-tensor scale maps into
    range)."""
    if not math.isfinite(largest):
        return False
    return fmt.bits <= FP8_BITS or math.isfinite(round_to(largest, fmt))


def _fp16_loss_scale(rows, grad_values):
    """((lo, hi), (why lo, why hi)) for FP16 loss scaling, powers of two, or (None, reason); see
    :func:`preflight`."""
    fp16 = get_format("fp16")
    # Overflow as round_to counts it (from 65520 on): 65504 <= |x| < 65520 still rounds to 65504.
    forward = [r["module"] for r in rows if r["tensor"] == "activation"
               and not math.isfinite(round_to(r["max_abs"], fp16))]
    if forward:
        return None, (f"the activations of {', '.join(dict.fromkeys(forward))} already overflow "
                      f"FP16 in the forward pass, which no loss scale fixes")
    grads = torch.cat(grad_values).double()  # times a power of two, exact in float64
    if not bool(torch.isfinite(grads).all()):
        return None, "a gradient is already inf or NaN in FP32"
    magnitudes = grads[grads != 0].abs().sort().values
    if not magnitudes.numel():
        return None, "every gradient is zero"

    def verdict(exponent):  # what the verdict would say of the gradients times 2**exponent
        shares = _format_shares(magnitudes * 2.0**exponent, fp16)
        return "overflow" if shares["overflow"] > 0 else "underflow" if shares["underflow"] > 0.01 else "ok"

    # First guesses from the order statistics (FP16 rounds |x| <= 2^-25 to zero and |x| >= 65520
    # to inf), then both edges confirmed by casting the gradients, as the verdict does.
    kept = magnitudes[int(0.01 * magnitudes.numel())].item()  # at most 1% below it may be lost
    lo = math.floor(-25 - math.log2(kept)) + 1
    hi = math.ceil(math.log2(65520 / magnitudes[-1].item())) - 1
    while verdict(lo) == "underflow":
        lo += 1
    while verdict(lo - 1) != "underflow":
        lo -= 1
    while verdict(hi) == "overflow":
        hi -= 1
    while verdict(hi + 1) != "overflow":
        hi += 1
    largest = magnitudes[-1].item()
    if lo > hi:
        return None, (f"the gradients span more than FP16's range: lifting all but 1% of them above "
                      f"2^-25 (a scale of at least 2^{lo}) overflows the largest, {largest:.3g}")
    below = _format_shares(magnitudes * 2.0**(lo - 1), fp16)
    lost = 100 * below["underflow"]
    shown = next(f"{lost:.{d}f}%" for d in range(2, 17) if round(lost, d) > 1)  # never a "1.00%"
    return (2.0**lo, 2.0**hi), (
        f"at 2^{lo} at most 1% of the non-zero gradient elements, the modules' output gradients "
        f"and the weight gradients of the batch given, round to zero in FP16; at 2^{lo - 1}, "
        f"{shown} do, carrying {below['underflow_mass']:.1e} of the gradients' total magnitude",
        f"at 2^{hi} the largest gradient, {largest:.3g}, stays below 65520; at 2^{hi + 1} it overflows")
