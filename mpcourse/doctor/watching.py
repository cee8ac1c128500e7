"""Watching real training steps: the hooks and wrappers that record what happened in them.

While a :class:`Session` is entered it holds, and on leaving (even by an exception) removes:

- a forward pre-hook and a forward hook on every module of the model (inf/NaN checked in the
  model's inputs, in each module's weights at its first forward pass and in every module's
  outputs; output dtypes; BatchNorm buffers), and a gradient hook on every non-leaf tensor a
  module receives and on the model's output, so that backward can be followed module by module;
- a step pre-hook and post-hook on the torch optimizer (the inner one of a
  ``MasterWeightOptimizer`` / ``CompensatedOptimizer``): gradients, weights and state around
  each step;
- class-level wrappers of ``torch.Tensor.backward``, ``torch.save``,
  ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``, the loss functions
  ``torch.nn.functional.cross_entropy`` / ``nll_loss`` / ``binary_cross_entropy_with_logits``, and
  ``scale`` / ``unscale_`` / ``step`` / ``update`` of ``torch.amp.GradScaler`` and of
  :class:`mpcourse.scaling.LossScaler` (so a scaler that was not passed is seen too).

Under ``torch.distributed`` with two ranks or more (one session per rank: every rank must watch the
same steps, on an FSDP2- or DDP-wrapped model or on its own shard of one) it also
wraps ``torch.distributed.all_reduce`` / ``reduce_scatter_tensor`` / ``reduce_scatter_single`` to
see the dtype gradients are reduced in during backward (FSDP2's ``reduce_dtype``, a DDP comm
hook), reads each FSDP2 module's ``MixedPrecisionPolicy``, and records per optimizer step whether
this rank stepped or skipped. On leaving the block without an exception, every rank exchanges what
it saw (one ``all_gather_object``) and repeats one half-precision reduction in FP32 to measure its
error: the ranks must leave their blocks together, as they leave any collective. DTensor
parameters and gradients are read through their local shards (no collective inside a hook).

Every recording only reads tensors (sums, comparisons, clones) and draws no random numbers, so a
watched run is bit for bit the unwatched one. Not seen: functions imported by name before the
session (``from torch.nn.utils import clip_grad_norm_`` bypasses the wrappers), gradients taken
with ``torch.autograd.grad``, and the overridden methods of a scaler subclass that was not passed.
"""
from __future__ import annotations

import functools
import numbers
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.amp import GradScaler
from torch.nn.modules.batchnorm import _NormBase

from mpcourse.optim import CompensatedOptimizer, MasterWeightOptimizer
from mpcourse.scaling import DynamicLossScaler, LossScaler

HALF = (torch.float16, torch.bfloat16)
FP16_MIN_NORMAL = 2.0**-14  # below it FP16 values are subnormal: fewer bits, then 0
LOSS_FUNCTIONS = ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits")
STATE_SQUARES = ("exp_avg_sq", "square_avg", "sum")  # Adam(W), RMSprop, Adagrad: the eps's partner
_ACTIVE: list = []  # the session watching now (at most one: the wrappers are process-wide)


def _tensors(value, depth: int = 0):
    """The dense floating-point tensors in a tensor or nested tuples/lists/dicts of them."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and not value.is_sparse:
            yield value
    elif depth < 3 and isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item, depth + 1)
    elif depth < 3 and isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item, depth + 1)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (reading a sharded DTensor's sum would be a collective), else t."""
    return t.to_local() if hasattr(t, "to_local") else t


def _nonfinite(t: torch.Tensor) -> str | None:
    """``"nan"`` if t holds a NaN, else ``"inf"`` if it holds an inf, else None."""
    t = _local(t.detach())
    # x - x is 0 for every finite x and NaN for inf or NaN: one subtraction and one sum, several
    # times faster than isfinite(t).all() on a CPU (the common case, all finite, stays cheap).
    if t.numel() == 0 or not bool(torch.isnan((t - t).sum())):
        return None
    return "nan" if bool(torch.isnan(t).any()) else "inf"


def _enabled(scaler) -> bool:
    return scaler.is_enabled() if isinstance(scaler, GradScaler) else True


def is_dynamic(scaler) -> bool:
    """Does the scaler's scale change from step to step (so a resume needs its state)?"""
    return (isinstance(scaler, GradScaler) and scaler.is_enabled()) or \
        isinstance(scaler, DynamicLossScaler)


@dataclass
class Observations:
    """What happened in the watched steps; :mod:`mpcourse.doctor.diagnosis` reads it."""

    steps: int = 0  # optimizer steps taken (skipped ones not counted)
    scaler_steps: int = 0  # scaler.step calls on the watched optimizer
    skipped: int = 0  # of which skipped the step (inf/NaN gradients)
    backwards: int = 0
    scaled_backwards: int = 0
    scaled_overflows: int = 0  # scaled backwards that produced an inf/NaN gradient
    overflow_where: str = ""
    fp16_grad_values: int = 0  # FP16 gradient values seen in backwards of unscaled losses
    fp16_subnormal: int = 0  # of which subnormal (0 < |g| < 2**-14)
    fp16_subnormal_where: str = ""
    half_losses: list = field(default_factory=list)  # (call, dtype)
    first_nonfinite: dict | None = None  # phase, where, kind, origin, step
    rounded: dict = field(default_factory=dict)  # group -> param -> [rounded away, updates, dtype]
    eps: dict = field(default_factory=dict)  # "param_groups[i]" -> eps, dtype, zero, dominated, total
    half_batchnorm: dict = field(default_factory=dict)  # module -> dtype of running stats
    bf16_devices: set = field(default_factory=set)
    devices: set = field(default_factory=set)  # device types the model computed on
    clips: list = field(default_factory=list)  # clip calls on still-scaled gradients
    misuse: dict = field(default_factory=dict)  # (where, message) -> times
    saves: int = 0  # torch.save calls during the session
    saves_without_scaler: list = field(default_factory=list)  # numbers of the calls missing it
    unwatched_scalers: list = field(default_factory=list)  # types of scalers used but not passed
    raised: bool = False
    # under torch.distributed with 2 ranks or more: see the module docstring
    engine: str = ""  # "FSDP2", "DDP", "torch.distributed" (shards by hand) or "" (one process)
    rank: int = 0
    world_size: int = 1
    fsdp_fp16: list = field(default_factory=list)  # FSDP2 modules whose param_dtype is FP16
    scaler_kinds: list = field(default_factory=list)  # classes of the scalers used or passed
    half_reductions: dict = field(default_factory=dict)  # call -> [dtype, times]
    reduction_sample: object = None  # FP32 copy of one half reduction's input, as sent
    step_events: list = field(default_factory=list)  # per optimizer step: "stepped" / "skipped"
    rank_events: list = field(default_factory=list)  # every rank's step_events (after the block)
    reduction_error: float | None = None  # that reduction in its dtype vs in FP32


def _check_arguments(model, optimizer, scaler):
    if not isinstance(model, nn.Module):
        raise TypeError(f"doctor.watch takes a torch.nn.Module as its model, not "
                        f"{type(model).__name__}")
    wrapped = isinstance(optimizer, (MasterWeightOptimizer, CompensatedOptimizer))
    inner = optimizer.optimizer if wrapped else optimizer
    if not isinstance(inner, torch.optim.Optimizer):
        raise TypeError(f"doctor.watch takes a torch.optim.Optimizer (or a MasterWeightOptimizer / "
                        f"CompensatedOptimizer around one), not {type(optimizer).__name__}")
    if not any(len(group["params"]) for group in inner.param_groups):
        raise ValueError("the optimizer holds no parameters: build it over model.parameters()")
    if scaler is not None and not isinstance(scaler, (GradScaler, LossScaler)):
        raise TypeError(f"unknown scaler kind {type(scaler).__name__}: pass a torch.amp.GradScaler, "
                        f"an mpcourse.scaling LossScaler, or None")
    return inner


class Session:
    """Watches the training steps run inside ``with session:``; see :func:`mpcourse.doctor.watch`."""

    def __init__(self, model: nn.Module, optimizer, scaler=None):
        self._inner = _check_arguments(model, optimizer, scaler)
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self._stage = "new"  # -> "watching" -> "done"
        self.seen = Observations()
        self._undo = []  # callables that remove one hook or wrapper, in the order installed

    # --- entering and leaving ---------------------------------------------------------------------

    def __enter__(self) -> "Session":
        if self._stage != "new":
            raise RuntimeError("a doctor session watches one with-block; call doctor.watch(...) "
                               "again for another")
        if _ACTIVE:
            raise RuntimeError("another doctor session is watching already: sessions cannot nest")
        self._reset_step_state()
        try:
            self._install()
        except BaseException:
            self._uninstall()
            raise
        _ACTIVE.append(self)
        self._stage = "watching"
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        try:
            self._uninstall()
        finally:
            _ACTIVE.remove(self)
            self._stage = "done"
            self.seen.raised = exc_type is not None
            self.seen.scaler_kinds = list(dict.fromkeys(
                type(s) for s in (self.scaler, *self._seen_scalers()) if s is not None))
            if not self.seen.raised and self.seen.engine:
                self._exchange()
            if not self.seen.raised:
                for where, state in self._scalers.items():
                    if state["stepped"]:
                        self._misuse(f"{state['name']}.update()", "update() was skipped after the "
                                     "last step(): the scale for the next step was never chosen")
            self._reset_step_state()  # drop every reference to the run's tensors
        return False  # exceptions propagate

    def report(self):
        """The findings, after the with-block has ended."""
        if self._stage == "new":
            raise RuntimeError("this session was never entered: run the training steps inside "
                               "`with session:`, then call session.report()")
        if self._stage == "watching":
            raise RuntimeError("report() inside the with-block: call it after the block ends, "
                               "when every hook has been removed")
        from mpcourse.doctor.diagnosis import diagnose
        return diagnose(self.seen, self)

    @property
    def _active(self) -> bool:
        return self._stage == "watching"

    def _reset_step_state(self):
        self._scalers = {}  # id(scaler) -> what it did since its last update()
        self._scaled_outputs = []  # tensors scale() returned, not yet backwarded
        self._pending = False  # scaled gradients not yet unscaled
        self._in_scaler = 0  # depth of watched scaler calls
        self._backward = None  # None outside a watched backward, else: is its loss scaled?
        self._overflow = False
        self._labels = {}  # id(tensor) -> (weakref, [label]) for the gradient hooks
        self._handles = []  # the gradient hooks' handles
        self._before = {}  # id(param) -> state before the optimizer step
        self._weights_checked = set()  # ids of the modules whose weights were checked

    def _install(self):
        self._model_keys = set(self.model.state_dict())
        self._names = {id(p): name for name, p in self.model.named_parameters()}
        if self._inner is not self.optimizer:  # a wrapper: name the FP32 copies after the params
            for p, copy in zip(self.optimizer.model_params, self.optimizer.fp32_params):
                self._names[id(copy)] = f"{self._names.get(id(p), 'a parameter')} (FP32 copy)"
        for name, module in self.model.named_modules():
            label = name or "the model"
            self._undo.append(module.register_forward_pre_hook(self._pre_hook(label)).remove)
            self._undo.append(module.register_forward_hook(
                self._post_hook(label, module is self.model)).remove)
        self._install_distributed()
        self._undo.append(self._inner.register_step_pre_hook(self._before_step).remove)
        self._undo.append(self._inner.register_step_post_hook(self._after_step).remove)
        self._patch(torch.Tensor, "backward", self._wrap_backward)
        self._patch(torch, "save", self._wrap_save)
        for owner in (torch.nn.utils, torch.nn.utils.clip_grad):
            for name in ("clip_grad_norm_", "clip_grad_value_"):
                self._patch(owner, name, functools.partial(self._wrap_clip, name=name))
        for name in LOSS_FUNCTIONS:
            self._patch(torch.nn.functional, name, functools.partial(self._wrap_loss, name=name))
        # The two scaler classes, and any subclass of them the passed scaler's class defines these
        # methods in (torch's ShardedGradScaler overrides them).
        classes = [cls for cls in type(self.scaler).__mro__
                   if issubclass(cls, (GradScaler, LossScaler))]
        for cls in dict.fromkeys([GradScaler, LossScaler, *classes]):
            for name in ("scale", "unscale_", "step", "update"):
                if name in vars(cls):
                    self._patch(cls, name, getattr(self, f"_wrap_scaler_{name.rstrip('_')}"))

    def _install_distributed(self):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        fsdp = [(name or "the model", m) for name, m in self.model.named_modules()
                if isinstance(m, FSDPModule)]
        if isinstance(self.model, DistributedDataParallel):
            self.seen.engine = "DDP"
        elif fsdp:
            self.seen.engine = "FSDP2"
        else:  # model or tensor parallelism by hand: every rank holds its own shard
            self.seen.engine = "torch.distributed"
        self.seen.rank, self.seen.world_size = dist.get_rank(), dist.get_world_size()
        for label, module in fsdp:
            policy = getattr(module._get_fsdp_state(), "_mp_policy", None)
            if policy is not None and policy.param_dtype == torch.float16:
                self.seen.fsdp_fp16.append(label)
        for name in ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single"):
            if hasattr(dist, name):
                self._patch(dist, name, functools.partial(self._wrap_reduction, name=name))

    def _wrap_reduction(self, original, name: str):
        def reduction(*args, **kwargs):
            if self._active and self._backward is not None:
                if name == "all_reduce":
                    sent = kwargs.get("tensor", args[0] if args else None)
                else:
                    sent = kwargs.get("input", args[1] if len(args) > 1 else None)
                if isinstance(sent, torch.Tensor) and sent.dtype in HALF:
                    entry = self.seen.half_reductions.setdefault(
                        f"torch.distributed.{name}", [sent.dtype, 0])
                    entry[1] += 1
                    if self.seen.reduction_sample is None:  # before the call: it may work in place
                        self.seen.reduction_sample = _local(sent.detach()).flatten()[:4096].float()
            return original(*args, **kwargs)
        return reduction

    def _exchange(self):
        """After the block, on every rank together: gather each rank's step events, and measure
        one half-precision reduction against the same reduction in FP32."""
        import torch.distributed as dist

        sample = self.seen.reduction_sample
        dtype = next(iter(self.seen.half_reductions.values()))[0] if sample is not None else None
        mine = (self.seen.step_events, None if sample is None else (sample.numel(), dtype))
        everyone = [None] * self.seen.world_size
        dist.all_gather_object(everyone, mine)
        self.seen.rank_events = [events for events, _ in everyone]
        samples = {s for _, s in everyone}
        if len(samples) == 1 and None not in samples:
            half, full = sample.to(dtype), sample.clone()
            dist.all_reduce(half)
            dist.all_reduce(full)
            norm = float(full.norm())
            self.seen.reduction_error = float((half.float() - full).norm()) / norm if norm else 0.0
        self.seen.reduction_sample = None

    def _patch(self, owner, name: str, make):
        original = getattr(owner, name)
        setattr(owner, name, functools.wraps(original)(make(original)))
        self._undo.append(lambda: setattr(owner, name, original))

    def _uninstall(self):
        for handle in self._handles:
            handle.remove()
        while self._undo:
            self._undo.pop()()

    # --- recording --------------------------------------------------------------------------------

    def _name(self, p) -> str:
        return self._names.get(id(p), f"a {tuple(p.shape)} parameter")

    def _nonfinite(self, phase: str, where: str, kind: str, origin: str,
                   tensor: torch.Tensor | None = None):
        # In the backward of a scaled loss an inf is an overflow the scaler handles, and a NaN
        # after it (inf - inf, 0 * inf) its consequence: also a NaN that arrives beside an inf in
        # one gradient, made from it by the operation that produced both, before any hook saw the
        # inf. (CUDA autocast runs cross_entropy's log_softmax in FP16: the scaled gradient of the
        # log-probabilities overflows inside the loss, and log_softmax's backward turns it into
        # NaN at the target class and inf at the others.) A NaN alone first is born there, a
        # real error.
        if phase == "backward" and self._backward and (
                kind == "inf" or self._overflow
                or (tensor is not None and bool(torch.isinf(_local(tensor.detach())).any()))):
            self._overflow = True
            self.seen.overflow_where = self.seen.overflow_where or where
        elif self.seen.first_nonfinite is None:
            self.seen.first_nonfinite = {"phase": phase, "where": where, "kind": kind,
                                         "origin": origin,  # the optimizer's: counted already
                                         "step": self.seen.steps + (phase != "optimizer")}

    def _misuse(self, where: str, message: str):
        key = (where, message)
        self.seen.misuse[key] = self.seen.misuse.get(key, 0) + 1

    def _label_gradient(self, t: torch.Tensor, label: str):
        """Follow t's gradient in backward, labelled with the innermost module t went into."""
        entry = self._labels.get(id(t))
        if entry is not None and entry[0]() is t:
            entry[1][0] = label
            return
        holder = [label]
        self._labels[id(t)] = (weakref.ref(t), holder)
        self._handles.append(t.register_hook(self._gradient_hook(holder)))

    def _gradient_hook(self, holder: list):
        def hook(grad):
            if not self._active or not grad.is_floating_point() or grad.is_sparse:
                return
            kind = _nonfinite(grad)
            if kind:
                self._nonfinite("backward", holder[0], kind, "gradient", grad)
            if grad.dtype == torch.float16 and self._backward is False:
                subnormal = int(((grad != 0) & (grad.abs() < FP16_MIN_NORMAL)).sum())
                self.seen.fp16_grad_values += grad.numel()
                self.seen.fp16_subnormal += subnormal
                if subnormal and not self.seen.fp16_subnormal_where:
                    self.seen.fp16_subnormal_where = holder[0]
        return hook

    def _pre_hook(self, label: str):
        def hook(module, args):
            if not self._active:
                return
            # The model's inputs; a module's own weights at its first forward pass (after that the
            # optimizer's post-step hook checks them). Inner modules' inputs are other modules'
            # outputs, checked there: each tensor is checked once.
            if self.seen.first_nonfinite is None and module is self.model:
                kind = next(filter(None, map(_nonfinite, _tensors(args))), None)
                if kind:
                    self._nonfinite("forward", label, kind, "input")
            if self.seen.first_nonfinite is None and id(module) not in self._weights_checked:
                self._weights_checked.add(id(module))
                for name, p in module.named_parameters(recurse=False):
                    kind = _nonfinite(p)
                    if kind and self.seen.first_nonfinite is None:
                        self._nonfinite("forward", f"{label}.{name}", kind, "weights")
            if isinstance(module, _NormBase) and module.training and module.track_running_stats \
                    and module.running_mean is not None and module.running_mean.dtype in HALF:
                self.seen.half_batchnorm[label] = module.running_mean.dtype
            if torch.is_grad_enabled():
                for t in _tensors(args):
                    if t.grad_fn is not None:
                        self._label_gradient(t, f"the input of {label}")
        return hook

    def _post_hook(self, label: str, root: bool):
        def hook(module, args, output):
            if not self._active:
                return
            for t in _tensors(output):
                self.seen.devices.add(t.device.type)
                if t.dtype == torch.bfloat16:
                    self.seen.bf16_devices.add(t.device)
                if self.seen.first_nonfinite is None:
                    kind = _nonfinite(t)
                    if kind:
                        self._nonfinite("forward", label, kind, "output")
                if root and t.grad_fn is not None and torch.is_grad_enabled():
                    self._label_gradient(t, "the model's output")
        return hook

    def _is_scaled(self, root: torch.Tensor) -> bool:
        """Is root a tensor scale() returned, or computed from one within a few operations
        (``(scaler.scale(loss) / k).backward()``)?"""
        nodes = {id(t.grad_fn): t for t in self._scaled_outputs if t.grad_fn is not None}
        if any(t is root for t in self._scaled_outputs):
            return True
        frontier, visited = [root.grad_fn], 0
        while frontier and visited < 64:
            node = frontier.pop(0)
            visited += 1
            if node is None:
                continue
            if id(node) in nodes and nodes[id(node)].grad_fn is node:
                return True
            frontier.extend(next_node for next_node, _ in node.next_functions)
        return False

    def _wrap_backward(self, original):
        def backward(tensor, *args, **kwargs):
            if not self._active or self._backward is not None:
                return original(tensor, *args, **kwargs)
            scaled = self._is_scaled(tensor)
            self.seen.backwards += 1
            self.seen.scaled_backwards += scaled
            if tensor.dtype in HALF and tensor.numel() == 1:
                self.seen.half_losses.append(("loss.backward()", tensor.dtype))
            self._pending = self._pending or scaled
            self._backward, self._overflow = scaled, False
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self.seen.scaled_overflows += self._overflow
                self._backward = None
                self._labels.clear()
        return backward

    def _wrap_loss(self, original, name: str):
        def loss_function(*args, **kwargs):
            result = original(*args, **kwargs)
            if self._active and isinstance(result, torch.Tensor) and result.dtype in HALF:
                self.seen.half_losses.append((f"torch.nn.functional.{name}", result.dtype))
            return result
        return loss_function

    def _wrap_clip(self, original, name: str):
        def clip(*args, **kwargs):
            if self._active and self._pending:
                self.seen.clips.append(f"torch.nn.utils.{name}")
            return original(*args, **kwargs)
        return clip

    def _wrap_save(self, original):
        def save(obj, *args, **kwargs):
            if self._active:
                self.seen.saves += 1
                self._check_save(obj)
            return original(obj, *args, **kwargs)
        return save

    def _check_save(self, obj):
        scalers = [s for s in (self.scaler, *self._seen_scalers()) if s is not None and is_dynamic(s)]
        if not scalers:
            return
        scaler_keys = [set(s.state_dict()) for s in scalers]
        found = {"training": False, "scaler": False}

        def walk(value, depth):
            if value is self.model or value is self.optimizer or value is self._inner:
                found["training"] = True
            elif any(value is s for s in scalers):
                found["scaler"] = True
            elif isinstance(value, Mapping):
                keys = set(value)
                if (self._model_keys and self._model_keys <= keys) or \
                        {"state", "param_groups"} <= keys or keys == {"optimizer", "master_params"}:
                    found["training"] = True
                if any(k and k <= keys for k in scaler_keys):
                    found["scaler"] = True
                if depth < 4:
                    for item in value.values():
                        walk(item, depth + 1)
            elif isinstance(value, (list, tuple)) and depth < 4:
                for item in value:
                    walk(item, depth + 1)

        walk(obj, 0)
        if found["training"] and not found["scaler"]:
            self.seen.saves_without_scaler.append(self.seen.saves)

    # --- the scaler's methods (any instance of the two classes) ----------------------------------

    def _seen_scalers(self):
        return [state["scaler"] for state in self._scalers.values()]

    def _scaler_state(self, scaler) -> dict:
        state = self._scalers.get(id(scaler))
        if state is None:
            if scaler is not self.scaler and scaler not in self._seen_scalers():
                self.seen.unwatched_scalers.append(type(scaler).__name__)
            name = "scaler" if scaler is self.scaler else f"an unwatched {type(scaler).__name__}"
            state = self._scalers[id(scaler)] = {"scaler": scaler, "name": name, "scaled": False,
                                                 "unscaled": set(), "stepped": set(), "rescaled": False}
        return state

    def _watching(self, scaler) -> bool:
        """Record this call? Not a call made inside another scaler method (GradScaler.step calls
        unscale_, a subclass calls super()), nor one of a disabled GradScaler."""
        return self._active and self._in_scaler == 0 and _enabled(scaler)

    def _inside(self, call):
        self._in_scaler += 1
        try:
            return call()
        finally:
            self._in_scaler -= 1

    def _wrap_scaler_scale(self, original):
        def scale(scaler, outputs):
            if not self._watching(scaler):
                return original(scaler, outputs)
            result = self._inside(lambda: original(scaler, outputs))
            state = self._scaler_state(scaler)
            # scale() after unscale_() with no update() between: a new iteration has begun
            state["scaled"], state["rescaled"] = True, bool(state["unscaled"])
            self._scaled_outputs.extend(_tensors(result))
            return result
        return scale

    def _wrap_scaler_unscale(self, original):
        def unscale_(scaler, optimizer):
            if self._watching(scaler):
                state = self._scaler_state(scaler)
                where = f"{state['name']}.unscale_(optimizer)"
                if not state["scaled"]:
                    self._misuse(where, "unscale_() without scale() since the last update(): the "
                                 "gradients were never multiplied by the scale, yet are divided by it")
                if id(optimizer) in state["stepped"]:
                    self._misuse(where, "unscale_() after step() with no update() between: "
                                 "update() was skipped, so the scale never adapts")
                elif id(optimizer) in state["unscaled"] and state["rescaled"]:
                    self._misuse(where, "unscale_() in a new iteration with no step() and update() "
                                 "since the last unscale_(): update() was skipped (on an overflow "
                                 "step?), so the scale never backs off; call scaler.step(optimizer) "
                                 "and scaler.update() every iteration, and let step() skip")
                elif id(optimizer) in state["unscaled"]:
                    self._misuse(where, "unscale_() called twice for one optimizer in one step: "
                                 "the second call would divide the gradients by the scale again")
                state["unscaled"].add(id(optimizer))
                self._pending = False
                return self._inside(lambda: original(scaler, optimizer))
            return original(scaler, optimizer)
        return unscale_

    def _wrap_scaler_step(self, original):
        def step(scaler, optimizer, *args, **kwargs):
            if not self._watching(scaler):
                return original(scaler, optimizer, *args, **kwargs)
            state = self._scaler_state(scaler)
            where = f"{state['name']}.step(optimizer)"
            if id(optimizer) in state["stepped"]:
                self._misuse(where, "step() twice for one optimizer without update() between: "
                             "update() was skipped, so the scale never adapts")
            if not state["scaled"]:
                self._misuse(where, "step() without scale() since the last update(): the gradients "
                             "were not scaled, yet step() divides them by the scale")
            state["stepped"].add(id(optimizer))
            state["unscaled"].add(id(optimizer))
            self._pending = False
            steps = self.seen.steps
            try:
                return self._inside(lambda: original(scaler, optimizer, *args, **kwargs))
            finally:
                if optimizer is self.optimizer:
                    self.seen.scaler_steps += 1
                    self.seen.skipped += self.seen.steps == steps
                    self.seen.step_events.append("skipped" if self.seen.steps == steps
                                                 else "stepped")
        return step

    def _wrap_scaler_update(self, original):
        def update(scaler, *args, **kwargs):
            if self._watching(scaler):
                state = self._scaler_state(scaler)
                if not state["stepped"] and not state["unscaled"]:
                    self._misuse(f"{state['name']}.update()", "update() without step() since the "
                                 "last update() (once per micro-batch?): call it once per "
                                 "optimizer step, after scaler.step(optimizer)")
                state.update(scaled=False, unscaled=set(), stepped=set(), rescaled=False)
                self._scaled_outputs.clear()
                return self._inside(lambda: original(scaler, *args, **kwargs))
            return original(scaler, *args, **kwargs)
        return update

    # --- the optimizer's step ---------------------------------------------------------------------

    def _before_step(self, optimizer, args, kwargs):
        if not self._active:
            return
        if self._in_scaler == 0:  # not called by scaler.step(optimizer)
            if self._pending:
                self._misuse("optimizer.step()", "the optimizer stepped on gradients still "
                             "multiplied by the loss scale: scaler.step(optimizer) was bypassed")
            elif any(state["scaled"] for state in self._scalers.values()):
                self._misuse("optimizer.step()", "optimizer.step() called directly in a step whose "
                             "loss was scaled: a step with inf/NaN gradients is not skipped")
        self._before = {}
        for i, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if p.grad is None:
                    continue
                if self.seen.first_nonfinite is None and not p.grad.is_sparse:
                    kind = _nonfinite(p.grad)
                    if kind:
                        self._nonfinite("backward", f"the gradient of {self._name(p)}", kind,
                                        "parameter gradient")
                snapshot = (p.detach().clone(), p.grad != 0) if p.dtype in HALF else None
                self._before[id(p)] = (p, i, snapshot)

    def _after_step(self, optimizer, args, kwargs):
        if not self._active:
            return
        self.seen.steps += 1
        if self._in_scaler == 0:  # scaler.step records its own steps, skipped ones included
            self.seen.step_events.append("stepped")
        # The weights were finite before the step: checked at the first forward pass and after
        # every step, and the gradients just now; an inf/NaN now was made by the step.
        for p, i, snapshot in self._before.values():
            if self.seen.first_nonfinite is None:
                kind = _nonfinite(p)
                if kind:
                    self._nonfinite("optimizer", self._name(p), kind, "update")
            if snapshot is not None:
                before, moved = snapshot
                group = self.seen.rounded.setdefault(f"param_groups[{i}]", {})
                counts = group.setdefault(self._name(p), [0, 0, p.dtype])
                counts[0] += int(_local((p.detach() == before) & moved).sum())
                counts[1] += int(_local(moved).sum())
        self._before = {}
        for i, group in enumerate(optimizer.param_groups):
            eps = group.get("eps")
            if isinstance(eps, numbers.Real) and not isinstance(eps, bool) and eps > 0:
                self._check_eps(optimizer, f"optimizer.param_groups[{i}]", group, float(eps))

    def _check_eps(self, optimizer, where: str, group: dict, eps: float):
        """Does eps round to 0, or outweigh sqrt(v), in the format the squares v are kept in?"""
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            squares = next((state[k] for k in STATE_SQUARES if isinstance(state.get(k), torch.Tensor)),
                           None)
            if squares is None or squares.dtype not in HALF:
                continue
            entry = self.seen.eps.setdefault(where, {
                "eps": eps, "dtype": squares.dtype, "dominated": 0, "total": 0,
                "zero": float(torch.tensor(eps, dtype=squares.dtype)) == 0})
            if p.grad is not None:
                moved = _local(p.grad != 0)
                entry["dominated"] += int(((_local(squares).float().sqrt() <= eps) & moved).sum())
                entry["total"] += int(moved.sum())
