"""Loss scaling: lift FP16 gradients out of the underflow zone, and skip the steps that overflow.

FP16 has 10 mantissa bits and a smallest exponent of -14, so its smallest positive value is
``2**-14 * 2**-10 = 2**-24`` (about 6e-8). Gradients below half of that, ``2**-25`` (about 3e-8),
round to zero (``2**-25`` itself is a tie, rounded to the even neighbour 0); those between
``2**-25`` and ``2**-14`` survive as subnormals with few significant bits (a value just above
``2**-25`` is stored as ``2**-24``, nearly 100% off). Many gradients of a healthy network lie
there; computed in FP16, the update they carry is lost or distorted. Multiply the loss by a
scale ``S`` before ``backward()`` and, by the chain rule, every gradient comes out multiplied by
``S`` too, high enough to survive. The optimizer must see the true gradient, so the scaler then
divides by ``S`` again, in the gradients' own dtype, which should be FP32 (master weights).

Too large an ``S`` overflows instead: some gradient becomes inf (FP16's largest value is 65504) or
NaN. Such a step is skipped, its parameters untouched. A *dynamic* scaler lowers ``S`` after an
overflow and raises it again after a run of clean steps, so ``S`` hovers just below the largest
value that does not overflow. With default arguments :class:`DynamicLossScaler` behaves exactly like
``torch.amp.GradScaler``: same scales, same skipped steps, bit-identical parameters.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch

READY, UNSCALED, STEPPED = "ready", "unscaled", "stepped"  # where each optimizer is in a step


@dataclass(frozen=True)
class ScaleRecord:
    """One training step, as :meth:`LossScaler.update` saw it: its number (0 for the first), the
    scale its loss was multiplied by, and whether any gradient held inf or NaN (step skipped)."""

    step: int
    scale: float
    found_inf: bool


@dataclass
class _OptimizerState:
    stage: str = READY
    nonfinite: dict = field(default_factory=dict)  # device -> bool tensor: an inf/NaN grad there?

    def found_inf(self) -> bool:
        # bool() of a GPU tensor waits for the GPU: ask once per device, keep the answers.
        self.nonfinite = {device: bool(flag) for device, flag in self.nonfinite.items()}
        return any(self.nonfinite.values())


def _float32(x: float) -> float:
    """Round a Python float to the nearest float32 value (inf beyond float32's range)."""
    return float(torch.tensor(x, dtype=torch.float32))


def _positive_float32(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, not {type(value).__name__}")
    rounded = _float32(float(value))
    if not (math.isfinite(rounded) and rounded > 0):
        raise ValueError(f"{name} must be a positive number that is finite and non-zero in "
                         f"float32 (the scale is held as float32), got {value}")
    return rounded


class LossScaler:
    """What both scalers do each step; they differ only in how :meth:`update` picks the next scale.

    Example (the call sequence, the same as ``torch.amp.GradScaler``'s)::

        scaler = DynamicLossScaler()
        for x, y in batches:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()   # every gradient comes out multiplied by S
            scaler.unscale_(optimizer)      # divide by S, and note any inf/NaN gradient
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # optional: true gradients
            scaler.step(optimizer)          # optimizer.step(), skipped if a gradient was inf/NaN
            scaler.update()                 # choose S for the next step; append to history

    Clip the tensors the optimizer steps: with ``MasterWeightOptimizer`` the gradients live on the
    FP32 masters, so clip ``optimizer.master_params()``; ``model.parameters()`` would clip nothing.
    ``unscale_`` is optional: ``step`` unscales if it was not called. Several optimizers may share
    one scaler: unscale_ and step each of them once, then call ``update`` once. An optimizer is
    anything with ``param_groups`` and ``step()``; unscaling divides the ``.grad`` of its params.

    Unscaling matches torch bit for bit: ``inv_scale`` is ``1/S`` computed in float64 and rounded
    once to float32, and each gradient is multiplied by it in float32 (float64 for float64 grads),
    rounded once to the gradient's dtype. The check for inf/NaN looks at the gradients *before*
    they are multiplied. FP16 gradients are refused, as torch does: keep FP32 master weights
    (``mpcourse.optim.MasterWeightOptimizer``) so that the optimizer sees FP32 gradients.

    Attributes:
        history: one :class:`ScaleRecord` per :meth:`update`, for plotting the scale over time.
    """

    def __init__(self, init_scale: float):
        self._scale = _positive_float32("the scale", init_scale)
        self._step = 0
        self._scaled = False  # was scale() called since the last update()?
        self._optimizers: dict[int, _OptimizerState] = {}
        self.history: list[ScaleRecord] = []

    def get_scale(self) -> float:
        """The current scale S as a Python float (a float32 value)."""
        return self._scale

    def scale(self, outputs):
        """Return ``outputs * S``: a loss tensor, or a list/tuple of them (for several losses)."""
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(output) for output in outputs)
        if not isinstance(outputs, torch.Tensor):
            raise TypeError(f"scale() takes a loss tensor (or a list of them), "
                            f"not {type(outputs).__name__}")
        if not outputs.is_floating_point():
            raise TypeError(f"scale() takes a floating-point loss, got dtype {outputs.dtype}")
        self._scaled = True
        # S as a float32 tensor on the loss's device: the very product GradScaler computes.
        return outputs * torch.full((), self._scale, dtype=torch.float32, device=outputs.device)

    def unscale_(self, optimizer) -> None:
        """Divide the optimizer's gradients by S in place, and note whether any is inf or NaN."""
        state = self._state_of(optimizer, "unscale_")
        if state.stage == UNSCALED:
            raise RuntimeError("unscale_() was already called for this optimizer in this step; "
                               "call it at most once between two update() calls")
        if state.stage == STEPPED:
            raise RuntimeError("unscale_() after step(): step() has already unscaled the "
                               "gradients; call unscale_() before step(), or not at all")
        grads = list(_gradients(optimizer))
        if not grads:
            raise RuntimeError("no parameter of this optimizer has a gradient: call backward() "
                               "on scaler.scale(loss) before unscale_() or step()")
        # 1/S computed in float64 and rounded once to float32, as GradScaler does (inf if S is 0).
        inv_scale = float(torch.tensor(self._scale, dtype=torch.float64).reciprocal().float())
        with torch.no_grad():
            for grad in grads:
                values = grad._values() if grad.is_sparse else grad
                finite = torch.isfinite(values).all()
                seen = state.nonfinite.get(values.device)
                state.nonfinite[values.device] = ~finite if seen is None else seen | ~finite
                # A Python float scalar: torch multiplies in float32 (float64 for float64 grads)
                # and rounds once to the gradient's dtype, exactly as GradScaler's kernel does.
                values.mul_(inv_scale)
        state.stage = UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """Unscale (unless :meth:`unscale_` did) and call ``optimizer.step(*args, **kwargs)``,
        unless a gradient is inf or NaN. Returns what optimizer.step returns, None if skipped."""
        if "closure" in kwargs or any(callable(arg) for arg in args):
            raise RuntimeError("step() with a closure is not supported: the closure's loss "
                               "would not be scaled; compute the loss and backward() yourself")
        state = self._state_of(optimizer, "step")
        if state.stage == STEPPED:
            raise RuntimeError("step() was already called for this optimizer since the last "
                               "update(); call update() once at the end of every step")
        if state.stage == READY:
            self.unscale_(optimizer)
        state.stage = STEPPED
        if state.found_inf():  # the one CPU-GPU synchronisation of the step
            return None  # skipped: parameters and optimizer state stay exactly as they were
        return optimizer.step(*args, **kwargs)

    def sync_found_inf(self, optimizer, group=None) -> bool:
        """Agree with the other ranks of ``group`` on whether this step found an inf or NaN.

        Under tensor or pipeline parallelism each rank holds only its shard of the gradients, so
        one rank can find an inf the others never see. Each would then decide alone: the rank that
        saw it skips the step and backs off, the others step and keep ``S``, and from then on the
        shards of one model are trained with different scales and different skipped steps.
        Megatron-LM all-reduces the flag over the model-parallel group, and FSDP's
        ``ShardedGradScaler`` over the sharding group; this does the same. Call it after
        :meth:`unscale_` and before :meth:`step`, on every rank of ``group`` (a
        ``torch.distributed`` process group; None: the default group). Returns the agreed flag.
        """
        import torch.distributed as dist

        state = self._state_of(optimizer, "sync_found_inf")
        if state.stage != UNSCALED:
            raise RuntimeError("sync_found_inf() needs unscale_(optimizer) first, and must come "
                               "before step(): the flag is known after unscaling and used by step")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("sync_found_inf() needs an initialised torch.distributed process "
                               "group (init_process_group); in one process there is nothing to sync")
        on_gpu = dist.get_backend(group) == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        flag = torch.tensor([float(state.found_inf())], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        found = bool(flag.item())
        state.nonfinite = {device: found}
        return found

    def update(self) -> None:
        """End the step: record it in :attr:`history` and choose the scale for the next step."""
        if not self._optimizers:
            raise RuntimeError("update() before step(): no gradients were checked in this step; "
                               "call scaler.step(optimizer) (or unscale_) first")
        found_inf = any(state.found_inf() for state in self._optimizers.values())
        self.history.append(ScaleRecord(self._step, self._scale, found_inf))
        self._scale = self._next_scale(found_inf)
        self._step += 1
        self._scaled = False
        self._optimizers = {}

    def _next_scale(self, found_inf: bool) -> float:
        return self._scale  # a static scale never changes

    def state_dict(self) -> dict:
        """The scaler's state as a dict of Python numbers (save it after :meth:`update`)."""
        return {"scale": self._scale, "step": self._step}

    def load_state_dict(self, state_dict: dict) -> None:
        """Continue from a :meth:`state_dict`; the next steps are those the saved scaler took."""
        missing = sorted(set(self.state_dict()) - set(state_dict))
        if missing:
            raise ValueError(f"the state dict lacks {', '.join(missing)}; pass one made by "
                             f"{type(self).__name__}.state_dict()")
        self._scale = _positive_float32("the scale", state_dict["scale"])
        self._step = int(state_dict["step"])

    def _state_of(self, optimizer, caller: str) -> _OptimizerState:
        if not hasattr(optimizer, "param_groups") or not hasattr(optimizer, "step"):
            raise TypeError(f"{caller}() takes an optimizer (an object with param_groups and "
                            f"step()), not {type(optimizer).__name__}")
        if not self._scaled:
            raise RuntimeError(f"{caller}() before scale() in this step: the gradients are not "
                               f"scaled; call scaler.scale(loss).backward() first")
        return self._optimizers.setdefault(id(optimizer), _OptimizerState())


def _gradients(optimizer):
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is None:
                continue
            if param.grad.dtype == torch.float16:
                raise ValueError("cannot unscale FP16 gradients: dividing them by S in FP16 "
                                 "would flush the small ones back to zero. Keep FP32 master "
                                 "weights (mpcourse.optim.MasterWeightOptimizer), so that the "
                                 "optimizer sees FP32 gradients")
            yield param.grad


class StaticLossScaler(LossScaler):
    """A fixed loss scale S: ``StaticLossScaler(1024.0)``.

    The scale never changes, but a step whose gradients hold inf or NaN is still skipped (and
    recorded in :attr:`history` with ``found_inf=True``): that is what lets a static scale survive
    the rare overflow. Use it as :class:`LossScaler` shows.
    """

    def __init__(self, scale: float):
        super().__init__(scale)


class DynamicLossScaler(LossScaler):
    """A loss scale S that backs off after overflows and grows after runs of clean steps.

    Example::

        scaler = DynamicLossScaler()                  # torch.amp.GradScaler's behaviour
        scaler = DynamicLossScaler(hysteresis=2)      # Megatron-LM's, and DeepSpeed's default
        scaler = DynamicLossScaler(hysteresis=2, consecutive_hysteresis=True)  # DeepSpeed opt-in

    then use it as :class:`LossScaler` shows. At each :meth:`update`, with ``g`` the clean steps
    counted towards growth (starts at 0) and ``h`` the overflows still tolerated (starts at
    ``hysteresis``)::

        overflow (some gradient inf or NaN; the step was skipped):
            g <- 0
            h <- max(h - 1, 0)
            if h == 0:  S <- max(S * backoff_factor, min_scale)
        clean step:
            if consecutive_hysteresis:  h <- hysteresis
            g <- g + 1
            if g == growth_interval:
                g <- 0;  h <- hysteresis
                S <- min(S * growth_factor, max_scale), unless that is inf in float32

    S is held as float32 and each product is rounded to float32, as torch does; S never grows to
    inf. With ``hysteresis=1`` every overflow backs off: exactly ``torch.amp.GradScaler``. With
    ``hysteresis=N`` (Megatron-LM's ``DynamicGradScaler``, and DeepSpeed's default, whose fp16
    config has ``"hysteresis": 2`` and ``"consecutive_hysteresis": false``) the N-th overflow
    since the scale last grew backs off, and every overflow after it until the scale grows
    again. ``consecutive_hysteresis=True`` (DeepSpeed's opt-in ``"consecutive_hysteresis":
    true``) refills ``h`` after every clean step, so only N overflows *in a row* back off.
    ``min_scale`` and ``max_scale`` (Apex caps at ``2**24``) bound S; ``None`` means no bound.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, hysteresis: int = 1,
                 consecutive_hysteresis: bool = False, min_scale: float | None = None,
                 max_scale: float | None = None):
        super().__init__(init_scale)
        self._configure(growth_factor, backoff_factor, growth_interval, hysteresis,
                        consecutive_hysteresis, min_scale, max_scale)
        self._growth_tracker = 0  # g
        self._hysteresis_left = hysteresis  # h

    def _configure(self, growth_factor, backoff_factor, growth_interval, hysteresis,
                   consecutive_hysteresis, min_scale, max_scale):
        if not (1 < growth_factor < math.inf):
            raise ValueError(f"growth_factor must be a finite number > 1, got {growth_factor}")
        if not (0 < backoff_factor < 1):
            raise ValueError(f"backoff_factor must lie strictly between 0 and 1, "
                             f"got {backoff_factor}")
        for name, count in (("growth_interval", growth_interval), ("hysteresis", hysteresis)):
            if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {count!r}")
        low = None if min_scale is None else _positive_float32("min_scale", min_scale)
        high = None if max_scale is None else _positive_float32("max_scale", max_scale)
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_scale ({min_scale}) must not exceed max_scale ({max_scale})")
        if (low is not None and self._scale < low) or (high is not None and self._scale > high):
            raise ValueError(f"the scale {self._scale} lies outside [min_scale, max_scale] = "
                             f"[{min_scale}, {max_scale}]")
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.hysteresis = int(growth_interval), int(hysteresis)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.min_scale, self.max_scale = low, high

    def _next_scale(self, found_inf: bool) -> float:
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_left = max(self._hysteresis_left - 1, 0)
            if self._hysteresis_left > 0:
                return self._scale  # an overflow tolerated: the step was skipped, S stays
            lower = _float32(self._scale * self.backoff_factor)
            return lower if self.min_scale is None else max(lower, self.min_scale)
        if self.consecutive_hysteresis:
            self._hysteresis_left = self.hysteresis
        self._growth_tracker += 1
        if self._growth_tracker < self.growth_interval:
            return self._scale
        self._growth_tracker = 0
        self._hysteresis_left = self.hysteresis
        higher = _float32(self._scale * self.growth_factor)
        if self.max_scale is not None:
            higher = min(higher, self.max_scale)
        return higher if math.isfinite(higher) else self._scale

    _CONFIG = ("growth_factor", "backoff_factor", "growth_interval", "hysteresis",
               "consecutive_hysteresis", "min_scale", "max_scale")

    def state_dict(self) -> dict:
        """GradScaler's keys (``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker``), so GradScaler can load it, plus ours."""
        return {**super().state_dict(), **{name: getattr(self, name) for name in self._CONFIG},
                "_growth_tracker": self._growth_tracker,
                "_hysteresis_tracker": self._hysteresis_left}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._configure(*(state_dict[name] for name in self._CONFIG))
        growth, left = int(state_dict["_growth_tracker"]), int(state_dict["_hysteresis_tracker"])
        if not (0 <= growth < self.growth_interval and 0 <= left <= self.hysteresis):
            raise ValueError(f"inconsistent trackers in the state dict: _growth_tracker={growth} "
                             f"must lie in [0, growth_interval), _hysteresis_tracker={left} in "
                             f"[0, hysteresis]")
        self._growth_tracker, self._hysteresis_left = growth, left



def sharded_overflow_run(rank: int, world_size: int, overflow_steps=(3,),
                         steps: int = 8) -> dict[bool, list[tuple[float, bool]]]:
    """One rank of a model-parallel job (run it with ``mpcourse.communication.run_workers``).

    Each rank holds a shard of the weights with its own :class:`DynamicLossScaler`; the last rank's
    gradient is inf at ``overflow_steps``, as when one shard of a layer holds the outlier. The run
    is done twice: without syncing, and with the ranks agreeing on the flag through
    :meth:`LossScaler.sync_found_inf`. Returns, for ``sync`` False and True, this rank's
    ``(scale, step skipped)`` at every step.
    """
    runs = {}
    for sync in (False, True):
        shard = torch.ones(4, requires_grad=True)
        optimizer = torch.optim.SGD([shard], lr=0.0)
        scaler = DynamicLossScaler(init_scale=2.0**16, growth_interval=2)
        for step in range(steps):
            optimizer.zero_grad()
            spike = math.inf if rank == world_size - 1 and step in overflow_steps else 1.0
            scaler.scale((shard * spike).sum()).backward()
            scaler.unscale_(optimizer)
            if sync:
                scaler.sync_found_inf(optimizer)
            scaler.step(optimizer)
            scaler.update()
        runs[sync] = [(record.scale, record.found_inf) for record in scaler.history]
    return runs
