"""Find where precision fails: tensor statistics, a hook-based debugger, gradient and error tables.

A NaN in the loss says that something went wrong, not where. The tools here answer where:

- :func:`tensor_stats` summarises one tensor, and says what a format (FP16 by default) would make
  of its values: how many it would flush to zero, store as subnormals, or overflow.
- :class:`PrecisionDebugger` hooks every module of a model and records those statistics for each
  module's output in the forward pass and for each gradient in the backward pass; it names the
  module where the first inf or NaN appeared, and can raise at that very moment.
- :func:`gradient_table` lists the gradients parameter by parameter, also where they live on the
  FP32 master weights of :class:`mpcourse.optim.MasterWeightOptimizer`.
- :func:`compare_layer_outputs` runs a model in FP32 and in lower precisions and reports, module by
  module, how far each output is from FP32's, so that the reader sees where error enters.

FP16's limits, which the default ``fmt="fp16"`` checks against: its largest value is 65504 (from
65520 on, values round to infinity), its smallest normal ``2**-14`` (about 6.1e-5; below it values
keep fewer than 11 significant bits), its smallest subnormal ``2**-24`` (about 6.0e-8; values of at
most ``2**-25`` round to zero).
"""
from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from mpcourse.preflight import PreflightReport, preflight  # noqa: F401  (documented here too)
from mpcourse.stats import ROOT, TensorStats, _check_format, _floating_tensors, tensor_stats  # noqa: F401


# --- the debugger ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    """One tensor the debugger saw.

    ``step`` numbers the model's forward passes since the debugger was attached (0 for the
    first); a gradient belongs to the step whose forward pass produced the tensor. ``phase`` is
    ``"forward"`` (a module's output) or ``"backward"`` (the gradient of a module's output, or of
    one of its parameters). ``tensor`` says which: ``"output"``, ``"output[1]"`` for the second
    of several, ``"output gradient"``, ``"weight gradient"``. ``inputs_finite`` and
    ``params_finite`` are filled in only for a forward record that holds an inf or NaN: whether
    the module's inputs, and its own parameters, were all finite.
    """

    step: int
    phase: str
    module: str
    module_type: str
    tensor: str
    stats: TensorStats
    inputs_finite: bool | None = None
    params_finite: bool | None = None

    @property
    def finite(self) -> bool:
        return self.stats.nonfinite == 0

    def describe(self) -> str:
        """The record's tensor in words: "the weight gradient of 'layers.4' (Linear)"."""
        return f"the {self.tensor} of {self.module!r} ({self.module_type})"


@dataclass(frozen=True)
class NonFiniteReport:
    """Where the first inf or NaN of a forward or backward pass appeared; ``str()`` explains it.

    ``record`` is the first record holding an inf or NaN; ``previous`` the record just before it
    in the same pass (None if it was the first), which was finite. ``consumer`` names the first
    module that took the record's module's output as its input in that step's forward pass,
    as ``"'1' (HandNorm)"`` (None if no module did): for an output gradient, the module whose
    backward computed it.
    """

    record: Record
    previous: Record | None
    consumer: str | None = None

    @property
    def phase(self) -> str:
        return self.record.phase

    @property
    def module(self) -> str:
        return self.record.module

    def __str__(self) -> str:
        r, s = self.record, self.record.stats
        count = math.prod(s.shape)
        lines = [f"{r.phase} pass of step {r.step}: the first non-finite value is in "
                 f"{r.describe()}: {s.inf} inf and {s.nan} NaN of {count} values."]
        if r.phase == "forward":
            if r.params_finite is False:
                lines.append("Its own parameters are already non-finite: look at the last "
                             "optimizer step (or at how the weights were loaded).")
            elif r.inputs_finite is False:
                lines.append("Its inputs were already non-finite: they come from the model's "
                             "input, or from code outside any module (a function called in the "
                             "parent module's forward).")
            else:
                lines.append("Its inputs and parameters were finite: the overflow or invalid "
                             "operation happened inside this module.")
        elif self.previous is None:
            lines.append("It is the first gradient of the backward pass: the gradient of the "
                         "loss was already non-finite (look at the loss and the loss scale).")
        elif r.tensor.endswith("output gradient"):
            where = (f"{self.consumer}, the module that uses this module's output"
                     if self.consumer else "what uses this module's output (in a plain stack of "
                     "layers, the next layer)")
            lines.append(f"The gradient recorded just before it, {self.previous.describe()}, "
                         f"was finite: the {_kind(s)} arose in the backward of {where}.")
        elif s.inf:
            lines.append("This module's backward produced it: a parameter's gradient sums over "
                         "the batch, and a weight's multiplies the output gradients by the layer's "
                         "inputs (an activation gradient multiplies them by the weights), so with "
                         "large inputs next to small weights, or a loss summed (not averaged) "
                         "over a large batch, it can overflow while every activation gradient is "
                         "finite.")
        else:  # NaN and no inf: an invalid operation, not an overflow
            lines.append("This module's backward produced it by an invalid operation, not an "
                         "overflow: 0 * inf, inf - inf or 0/0, such as the infinite derivative of "
                         "a square root at 0 (a hand-written norm; torch.linalg.vector_norm's "
                         "gradient at 0 is 0) times a zero. NaN stays NaN at every loss scale.")
        return "\n".join(lines)


def _kind(stats: TensorStats) -> str:
    """What a non-finite gradient holds, in words: an overflow (inf) or an invalid operation (NaN)."""
    if stats.inf and stats.nan:
        return "inf (an overflow) and NaN"
    return "inf (an overflow)" if stats.inf else "NaN (an invalid operation such as 0 * inf, not an overflow)"


class NonFiniteError(FloatingPointError):
    """Raised by a :class:`PrecisionDebugger` with ``raise_on_nonfinite=True``; ``report`` holds
    the :class:`NonFiniteReport`."""

    def __init__(self, report: NonFiniteReport):
        super().__init__(str(report))
        self.report = report


def _all_finite(value) -> bool:
    return all(bool(torch.isfinite(t).all()) for _, t in _floating_tensors(value, ""))


class PrecisionDebugger:
    """Record tensor statistics at every module of a model, and find the first inf or NaN.

    Example::

        debugger = PrecisionDebugger(model, fmt="fp16")
        with debugger:                       # hooks on while inside, removed on exit (always)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
        print(debugger.first_nonfinite())    # which module, forward or backward, and why
        rows, headers = debugger.table("forward")
        markdown_table(rows, headers)        # per-module statistics against FP16's limits

    What is recorded, for every module of ``model.named_modules()`` (the model itself is called
    ``"(model)"``):

    - forward: :func:`tensor_stats` of each floating tensor the module returns;
    - backward: the gradient of each of those outputs (the gradient that arrives at the module
      from the layers after it), and the gradient of each of the module's own parameters,
      in the order backward computes them.

    Records hold a few numbers each, not the tensors. Computing them costs a pass over every
    tensor (and, on a GPU, a wait for each number): attach the debugger around the steps you
    want to look at, not for a whole training run. With ``raise_on_nonfinite=True`` the first
    record that holds an inf or NaN raises :class:`NonFiniteError` on the spot, from inside
    ``model(x)`` or ``loss.backward()``, with the traceback of the operation that was running.
    ``raise_on_nonfinite="forward"`` raises on the forward pass only: with a dynamic loss scaler,
    an inf gradient now and then is expected (the scaler skips that step and lowers the scale),
    while an inf activation is a bug no scale will fix.

    The gradient hooks are tensor hooks (``Tensor.register_hook``) registered on each output in
    the forward pass, not ``register_full_backward_hook``, which fails on models that modify a
    module's output in place (``nn.ReLU(inplace=True)``). A deep copy of the model made while
    the debugger is attached carries its hooks along: detach first.
    """

    def __init__(self, model: nn.Module, fmt="fp16", *,
                 raise_on_nonfinite: bool | str = False):
        if not isinstance(model, nn.Module):
            raise TypeError(f"PrecisionDebugger takes an nn.Module, not {type(model).__name__}")
        if raise_on_nonfinite not in (False, True, "forward", "backward"):
            raise ValueError(f"raise_on_nonfinite must be False, True, 'forward' or 'backward', "
                             f"got {raise_on_nonfinite!r}")
        self.model = model
        self.fmt = _check_format(fmt)
        self.raise_on_nonfinite = raise_on_nonfinite
        self.records: list[Record] = []
        self._handles = []
        self._step = -1
        self._produced = {}  # id of an output of this step -> (tensor, names of the modules returning it)
        self._consumers = {}  # (step, module) -> the first module that took its output as input

    # --- switching on and off ---
    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self) -> "PrecisionDebugger":
        """Register the hooks; returns the debugger. Prefer ``with debugger:``."""
        if self.attached:
            raise RuntimeError("this debugger is attached already; detach() it first")
        self._step = -1
        self._handles.append(self.model.register_forward_pre_hook(self._count_step))
        for name, module in self.model.named_modules():
            hook = self._forward_hook(name or ROOT)
            self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                module, _, short = name.rpartition(".")
                self._handles.append(param.register_hook(
                    self._gradient_hook(module or ROOT, f"{short} gradient")))
        return self

    def detach(self) -> None:
        """Remove every hook, those on activations of a graph not yet backpropagated included."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> "PrecisionDebugger":
        return self.attach()

    def __exit__(self, *exc_info) -> None:
        self.detach()

    def clear(self) -> None:
        """Forget the records (the hooks stay)."""
        self.records.clear()
        self._consumers.clear()

    # --- the hooks ---
    def _count_step(self, module, args):
        self._step += 1
        self._produced.clear()  # only this step's outputs: ids of freed tensors are reused

    def _module_type(self, name: str) -> str:
        return type(self.model if name == ROOT else self.model.get_submodule(name)).__name__

    def _add(self, record: Record) -> None:
        self.records.append(record)
        if self.raise_on_nonfinite in (True, record.phase) and not record.finite:
            raise NonFiniteError(self._report(len(self.records) - 1))

    def _forward_hook(self, name: str):
        def hook(module, args, kwargs, output):
            for _, tensor in _floating_tensors((args, kwargs), "input"):
                produced, producers = self._produced.get(id(tensor), (None, ()))
                for producer in producers if produced is tensor else ():
                    self._consumers.setdefault((self._step, producer), name)
            for label, tensor in _floating_tensors(output, "output"):
                produced, producers = self._produced.get(id(tensor), (None, ()))
                self._produced[id(tensor)] = (tensor, (*producers, name) if produced is tensor else (name,))
                stats = tensor_stats(tensor, self.fmt)
                inputs_finite = params_finite = None
                if stats.nonfinite:
                    inputs_finite = _all_finite(args) and _all_finite(kwargs)
                    params_finite = all(bool(torch.isfinite(p).all())
                                        for p in module.parameters(recurse=False))
                self._add(Record(self._step, "forward", name, type(module).__name__, label, stats,
                                 inputs_finite, params_finite))
                if tensor.requires_grad:
                    self._handles.append(tensor.register_hook(
                        self._gradient_hook(name, f"{label} gradient", self._step)))
        return hook

    def _gradient_hook(self, name: str, label: str, step: int | None = None):
        def hook(grad):
            if grad is not None and grad.is_floating_point() and grad.numel():
                self._add(Record(self._step if step is None else step, "backward", name,
                                 self._module_type(name), label, tensor_stats(grad, self.fmt)))
        return hook

    # --- reading the records ---
    def _report(self, index: int) -> NonFiniteReport:
        record = self.records[index]
        previous = next((r for r in reversed(self.records[:index])
                         if r.phase == record.phase and r.step == record.step), None)
        consumer = self._consumers.get((record.step, record.module))
        if consumer is not None:
            consumer = f"{consumer!r} ({self._module_type(consumer)})"
        return NonFiniteReport(record, previous, consumer)

    def first_nonfinite(self, phase: str | None = None) -> NonFiniteReport | None:
        """The first record holding an inf or NaN, as a :class:`NonFiniteReport`; None if none.

        ``phase="forward"`` or ``"backward"`` looks only there; the default looks at the forward
        records first (a non-finite forward pass makes every gradient non-finite after it).
        """
        if phase not in (None, "forward", "backward"):
            raise ValueError(f"phase must be 'forward', 'backward' or None, got {phase!r}")
        for wanted in ([phase] if phase else ["forward", "backward"]):
            for index, record in enumerate(self.records):
                if record.phase == wanted and not record.finite:
                    return self._report(index)
        return None

    TABLE_COLUMNS = ("dtype", "max_abs", "min_nonzero_abs", "zeros", "flushed", "subnormal",
                     "overflow", "nan", "inf")

    def table(self, phase: str = "forward", columns=TABLE_COLUMNS, step: int | None = None):
        """``(rows, headers)`` for :func:`mpcourse.display.markdown_table`: one row per record of
        ``phase`` (of one ``step``; default: the last one recorded), in the order they were
        recorded, with the module, the tensor and the :class:`TensorStats` fields ``columns``."""
        if phase not in ("forward", "backward"):
            raise ValueError(f"phase must be 'forward' or 'backward', got {phase!r}")
        unknown = [c for c in columns if c not in (*TensorStats._fields, "max_abs", "nonfinite")]
        if unknown:
            raise ValueError(f"unknown columns {unknown}; choose from {TensorStats._fields} "
                             f"or 'max_abs', 'nonfinite'")
        records = [r for r in self.records if r.phase == phase]
        if not records:
            raise ValueError(f"no {phase} records: run the model (and backward) while attached")
        step = records[-1].step if step is None else step
        rows = [(r.module, r.tensor, *(getattr(r.stats, c) for c in columns))
                for r in records if r.step == step]
        return rows, ["module", "tensor", *columns]


# --- gradients, parameter by parameter -------------------------------------------------------
class GradientRow(NamedTuple):
    """One parameter's gradient in :func:`gradient_table`; fields as in :class:`TensorStats`."""

    name: str
    dtype: str
    min_nonzero_abs: float
    max_abs: float
    zeros: float
    flushed: float
    subnormal: float
    overflow: float
    nonfinite: int


def _named_tensors(source, names):
    """(name, tensor) pairs from a module, an optimizer (named through ``names``) or pairs."""
    if isinstance(source, nn.Module):
        if names is not None:
            raise ValueError("names= is for an optimizer; a module names its parameters itself")
        return list(source.named_parameters())
    if hasattr(source, "param_groups"):
        tensors = [p for group in source.param_groups for p in group["params"]]
        if names is None:
            return [(f"param_groups[{g}][{i}]", p) for g, group in enumerate(source.param_groups)
                    for i, p in enumerate(group["params"])]
        if not isinstance(names, nn.Module):
            raise TypeError(f"names must be the model the optimizer was built over, "
                            f"not {type(names).__name__}")
        name_of = {id(p): n for n, p in names.named_parameters()}
        # MasterWeightOptimizer and CompensatedOptimizer step FP32 copies of the model's
        # FP16/BF16 parameters: name each copy after the parameter it stands for.
        for model_param, fp32_copy in zip(getattr(source, "model_params", []),
                                          getattr(source, "fp32_params", [])):
            if id(model_param) in name_of:
                name_of[id(fp32_copy)] = name_of[id(model_param)]
        missing = sum(id(p) not in name_of for p in tensors)
        if missing:
            raise ValueError(f"{missing} of the optimizer's tensors are not parameters of the "
                             f"model given as names=")
        return [(name_of[id(p)], p) for p in tensors]
    if names is not None:
        raise ValueError("names= is for an optimizer")
    try:
        pairs = list(source)
    except TypeError:
        raise TypeError(f"gradient_table takes a module, an optimizer or (name, tensor) pairs, "
                        f"not {type(source).__name__}") from None
    if not all(isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
               and isinstance(pair[1], torch.Tensor) for pair in pairs):
        raise TypeError("gradient_table takes (name, tensor) pairs, such as "
                        "model.named_parameters()")
    return pairs


def gradient_table(params, fmt="fp16", *, names: nn.Module | None = None) -> list[GradientRow]:
    """One :class:`GradientRow` per parameter that has a gradient (``.grad``).

    ``params`` is a model (its ``named_parameters()``), ``(name, tensor)`` pairs, or an optimizer.
    With an optimizer, pass ``names=model`` to name its tensors after the model's parameters;
    this works with :class:`mpcourse.optim.MasterWeightOptimizer`, whose gradients live on the
    FP32 masters, the model's FP16/BF16 parameters having ``.grad = None``::

        markdown_table(gradient_table(optimizer, names=model), GradientRow._fields)

    With a loss scaler, call it before ``unscale_`` to see the scaled gradients that FP16 had to
    hold, after it to see the true ones; ``fmt`` says against which format's limits.
    """
    fmt = _check_format(fmt)
    pairs = _named_tensors(params, names)
    rows = []
    for name, tensor in pairs:
        if tensor.grad is None:
            continue
        s = tensor_stats(tensor.grad, fmt)
        rows.append(GradientRow(name, s.dtype, s.min_nonzero_abs, s.max_abs, s.zeros, s.flushed,
                                s.subnormal, s.overflow, s.nonfinite))
    if not rows:
        low_precision = any(t.dtype in (torch.float16, torch.bfloat16) for _, t in pairs)
        hint = (" If you train with MasterWeightOptimizer, the gradients are on its FP32 masters: "
                "pass the optimizer, gradient_table(optimizer, names=model)."
                if low_precision else "")
        raise ValueError(f"no parameter has a gradient: call backward() first.{hint}")
    return rows


# --- where error enters: each module's output against FP32 -------------------------------------
def _as_tuple(inputs):
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    if not inputs or not all(isinstance(x, torch.Tensor) for x in inputs):
        raise TypeError("inputs must be a tensor or a tuple of tensors (the model's arguments)")
    return inputs


def activation_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                         loss_scale: float = 1.0, autocast_dtype: torch.dtype | None = None):
    """One backward pass of ``loss_scale`` × (mean cross-entropy of ``model(x)`` against ``y``).

    Returns two flat FP32 tensors, divided by ``loss_scale`` again: the gradients with respect to
    every leaf module's output (the *activation* gradients, which are what underflows in FP16),
    and with respect to every parameter (the *weight* gradients). ``autocast_dtype`` runs the
    forward pass under ``torch.autocast`` in that dtype. The logits are cast to FP32 before the
    loss, as mixed-precision training does. The model's ``.grad`` are overwritten.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"activation_gradients takes an nn.Module, not {type(model).__name__}")
    outputs = []

    def keep(module, inputs, output):
        if torch.is_tensor(output) and output.requires_grad:
            output.retain_grad()
            outputs.append(output)

    hooks = [m.register_forward_hook(keep) for m in model.modules() if not list(m.children())]
    try:
        with torch.autocast(x.device.type, dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y) * loss_scale
    finally:
        for hook in hooks:
            hook.remove()
    model.zero_grad(set_to_none=True)
    loss.backward()
    activations = torch.cat([o.grad.float().flatten() for o in outputs]) / loss_scale
    weights = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    return activations, weights / loss_scale


def layer_outputs(model: nn.Module, inputs) -> dict[str, torch.Tensor]:
    """Run ``model(*inputs)`` without gradients and return every module's output, detached.

    Keys are module names (``"(model)"`` for the model itself), with ``"[i]"`` appended where a
    module returns several tensors; a module called more than once keeps its first output.
    The model runs as it is (its dtype, its train/eval mode).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"layer_outputs takes an nn.Module, not {type(model).__name__}")
    inputs = _as_tuple(inputs)
    outputs: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(module, args, output):
            for label, tensor in _floating_tensors(output, name):
                outputs.setdefault(label, tensor.detach())
        return hook

    handles = [m.register_forward_hook(keep(name or ROOT)) for name, m in model.named_modules()]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return outputs


class LayerError(NamedTuple):
    """One module's output in one dtype, against FP32 (see :func:`compare_layer_outputs`)."""

    module: str
    module_type: str
    dtype: str
    relative_error: float
    nonfinite: int


def _relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    """max |y - y32| / max |y32|: the error relative to the tensor's scale, which, unlike an
    element-wise relative error, does not blow up where y32 is (nearly) zero."""
    y, y32 = output.double(), reference.double()
    if not torch.isfinite(y).all():
        return math.inf
    error = (y - y32).abs().max().item()
    scale = y32.abs().max().item()
    return error / scale if scale > 0 else (0.0 if error == 0 else math.inf)


def compare_layer_outputs(model: nn.Module, inputs,
                          dtypes=(torch.float16, torch.bfloat16), *,
                          autocast: bool = False) -> list[LayerError]:
    """Run ``model`` in FP32 and in each of ``dtypes``; compare every module's output with FP32's.

    Each run uses a deep copy of the model, in eval mode (no dropout; batch norm uses its
    running statistics), without gradients; ``model`` itself is left untouched. The reference is
    the copy converted to FP32, given FP32 inputs. Then, for each dtype:

    - ``autocast=False``: the copy converted to the dtype (``.to(dtype)``, every parameter and
      buffer), given the inputs in that dtype: every operation runs in it ("pure" low precision);
    - ``autocast=True``: the FP32 copy run under ``torch.autocast(device, dtype)``: matrix
      multiplies and convolutions in the dtype, the operations autocast keeps in FP32 in FP32
      (mixed precision, as in training).

    Returns one :class:`LayerError` per module and dtype, in the order the modules ran, where
    ``relative_error = max|y - y32| / max|y32|`` (inf if ``y`` holds an inf or NaN) and
    ``nonfinite`` counts the infs and NaNs in ``y``. Integer inputs (token ids) are passed as they
    are; floating ones are converted.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"compare_layer_outputs takes an nn.Module, not {type(model).__name__}")
    inputs = _as_tuple(inputs)
    dtypes = tuple(dtypes)
    if not dtypes or not all(isinstance(d, torch.dtype) and d.is_floating_point for d in dtypes):
        raise TypeError("dtypes must be floating torch dtypes, such as (torch.float16, "
                        "torch.bfloat16)")
    if autocast and any(d not in (torch.float16, torch.bfloat16) for d in dtypes):
        raise ValueError("autocast runs in torch.float16 or torch.bfloat16 only")
    device_type = inputs[0].device.type

    def run(model_dtype, autocast_dtype=None):
        copied = copy.deepcopy(model).to(model_dtype).eval()
        cast = tuple(x.to(model_dtype) if x.is_floating_point() else x for x in inputs)
        context = (nullcontext() if autocast_dtype is None
                   else torch.autocast(device_type, dtype=autocast_dtype))
        with context:
            return layer_outputs(copied, cast)

    reference = run(torch.float32)
    types = {name or ROOT: type(m).__name__ for name, m in model.named_modules()}
    results = {dtype: run(torch.float32, dtype) if autocast else run(dtype) for dtype in dtypes}
    rows = []
    for key, y32 in reference.items():
        module = key.split("[")[0]
        for dtype, outputs in results.items():
            y = outputs[key]
            rows.append(LayerError(key, types[module], str(dtype).removeprefix("torch."),
                                   _relative_error(y, y32), int((~torch.isfinite(y)).sum())))
    return rows

