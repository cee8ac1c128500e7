"""A practical recipe: one trainer for every precision, and a flowchart that picks the precision.

Everything the earlier chapters built, in one training step::

    for each of the k micro-batches i (n_i examples, N in all):
        with autocast(FP16 / BF16, or off):           # 16-bit matmuls, FP32 parameters
            loss_i = loss_fn(model, micro-batch i)    # the mean over its n_i examples
        backward(S * loss_i * n_i / N)                # gradients add up in FP32 .grad
    g <- g / S                                        # unscale (FP16 only), in FP32
    ||g|| <- norm of g; if max_grad_norm: clip g      # in true units, after unscaling
    if g has inf/NaN: skip the step                   # parameters untouched (FP8: an inf/NaN at a cast raises)
    else: optimizer.step()
    S <- next scale (FP16 only: halve after an overflow, double after growth_interval clean steps)

The weights ``n_i / N`` make the accumulated gradient that of the mean loss over the whole batch,
``sum_i (n_i / N) * mean_i = (1/N) * sum over all examples``, whatever the micro-batch sizes.

The four precisions (all keep FP32 parameters, which are the master weights, as torch AMP does):

========  ====================================================================================
fp32      nothing changes (``tf32=True`` lets CUDA run the FP32 matmuls in TF32)
fp16      ``torch.autocast(dtype=float16)`` + :class:`~mpcourse.scaling.DynamicLossScaler`
bf16      ``torch.autocast(dtype=bfloat16)``, no scaler: BF16 has FP32's exponent range
fp8       every ``nn.Linear`` becomes an :class:`~mpcourse.fp8.Fp8Linear` (HYBRID: E4M3 forward,
          E5M2 gradients, delayed scaling by default); everything else stays FP32, with no
          autocast, so that the FP8 products are the only change from an FP32 run
========  ====================================================================================

:func:`select_precision` is the flowchart: it reads the hardware (or a :class:`DeviceProfile`
describing some other machine) and returns the precision with one sentence per decision.
"""
from __future__ import annotations

import math
import numbers
import platform
import random
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from mpcourse.formats import FP16
from mpcourse.fp8 import (BlockRecipe, DelayedScaling, Fp8Linear, Fp8Recipe, convert_to_fp8,
                          get_recipe)
from mpcourse.scaling import DynamicLossScaler

PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class TrainerConfig:
    """How :class:`MixedPrecisionTrainer` trains.

    Args:
        precision: ``"fp32"``, ``"fp16"``, ``"bf16"`` or ``"fp8"`` (see the module docstring).
        max_grad_norm: clip the total L2 norm of the gradients to this, after unscaling, so it is
            in the units of the true gradient. None: no clipping (the norm is still reported).
        accumulate_steps: split every batch into this many micro-batches along dimension 0 and
            add up their gradients (in FP32) before one optimizer step.
        tf32: on CUDA, let FP32 matmuls use TF32 tensor cores
            (``torch.set_float32_matmul_precision("high")``, a process-wide setting).
        init_scale, growth_interval: of the FP16 loss scaler (defaults: ``torch.amp.GradScaler``'s).
        fp8_recipe: the recipe for ``"fp8"``: an :class:`~mpcourse.fp8.Fp8Recipe`, a
            :class:`~mpcourse.fp8.BlockRecipe` or a name, ``"hybrid"`` (the default, delayed),
            ``"mxfp8"``, ``"nvfp4"`` or ``"blockwise"``.
    """

    precision: str = "fp32"
    max_grad_norm: float | None = None
    accumulate_steps: int = 1
    tf32: bool = False
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    fp8_recipe: Fp8Recipe | BlockRecipe | str | None = None

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of "
                             f"{', '.join(PRECISIONS)}")
        if self.max_grad_norm is not None and not (
                isinstance(self.max_grad_norm, numbers.Real) and not isinstance(self.max_grad_norm, bool)
                and 0 < self.max_grad_norm < math.inf):
            raise ValueError(f"max_grad_norm must be a positive finite number or None, "
                             f"got {self.max_grad_norm!r}")
        if isinstance(self.accumulate_steps, bool) or not isinstance(self.accumulate_steps, int) \
                or self.accumulate_steps < 1:
            raise ValueError(f"accumulate_steps must be an int >= 1, got {self.accumulate_steps!r}")
        if not isinstance(self.tf32, bool):
            raise TypeError(f"tf32 is True or False, not {self.tf32!r}")
        default = TrainerConfig.__dataclass_fields__
        scaler_options = (self.init_scale, self.growth_interval)
        if self.precision == "fp16":
            DynamicLossScaler(self.init_scale, growth_interval=self.growth_interval)  # checks both
        elif scaler_options != (default["init_scale"].default, default["growth_interval"].default):
            raise ValueError(f"init_scale and growth_interval configure FP16's loss scaler; "
                             f"precision {self.precision!r} has none")
        if self.fp8_recipe is not None:
            if self.precision != "fp8":
                raise ValueError(f"fp8_recipe is for precision 'fp8', not {self.precision!r}")
            get_recipe(self.fp8_recipe)  # an Fp8Recipe, a BlockRecipe or a name of RECIPES


@dataclass(frozen=True)
class StepRecord:
    """One call of :meth:`MixedPrecisionTrainer.train_step`.

    ``loss``: the batch's mean loss (unscaled); ``grad_norm``: the total L2 norm of the true
    (unscaled) gradient before clipping, inf or NaN where it overflowed; ``skipped``: the optimizer
    did not step (a gradient was inf or NaN); ``scale``: the loss scale this step used (FP16 only).
    """

    step: int
    loss: float
    grad_norm: float
    skipped: bool
    scale: float | None


class MixedPrecisionTrainer:
    """Train a model in FP32, FP16, BF16 or FP8 with one call per step, and resume bit for bit.

    Example::

        model = DigitsMLP()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        trainer = MixedPrecisionTrainer(model, optimizer,
                                        TrainerConfig("fp16", max_grad_norm=1.0, accumulate_steps=2))
        loss_fn = lambda model, batch: F.cross_entropy(model(batch[0]), batch[1])
        for x, y in batches(train, 64, generator=generator):
            record = trainer.train_step((x, y), loss_fn)   # a StepRecord
        trainer.save_checkpoint("run.pt")                  # ... later, in a new process:
        trainer.load_checkpoint("run.pt")                  # the same steps follow, bit for bit

    ``loss_fn(model, micro_batch)`` returns the *mean* loss over the micro-batch's examples; it runs
    inside the precision's autocast. The model's parameters must be FP32 (they are the master
    weights; autocast makes the 16-bit copies), and the optimizer must step exactly those. With
    ``precision="fp8"`` the model's ``nn.Linear`` layers are swapped for ``Fp8Linear`` in place
    (they keep their parameters, so the optimizer still holds the right tensors).

    Attributes:
        model, optimizer, config, device: as given.
        scaler: the :class:`~mpcourse.scaling.DynamicLossScaler` (FP16), else None.
        step: the number of :meth:`train_step` calls so far, skipped steps included.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 config: TrainerConfig | None = None, device=None):
        config = TrainerConfig() if config is None else config
        if not isinstance(config, TrainerConfig):
            raise TypeError(f"config must be a TrainerConfig, not {type(config).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}")
        params = list(model.parameters())
        if not params:
            raise ValueError("the model has no parameters to train")
        if any(p.dtype != torch.float32 for p in params):
            raise ValueError("the model's parameters must be FP32: they are the master weights, "
                             "and autocast makes the 16-bit copies per operation. Do not convert "
                             "the model with .half() or .bfloat16()")
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        if not {id(p) for p in self.params} <= {id(p) for p in params}:
            raise ValueError("the optimizer steps tensors that are not this model's parameters; "
                             "build it over model.parameters()")
        self.device = torch.device(device) if device is not None else params[0].device
        model.to(self.device)  # keeps the same Parameter objects, so the optimizer stays valid
        if config.precision == "fp8":
            convert_to_fp8(model, config.fp8_recipe)
        if config.tf32:
            if self.device.type == "cuda":
                torch.set_float32_matmul_precision("high")
            else:
                warnings.warn(f"tf32=True has no effect on {self.device.type}: TF32 is a mode of "
                              f"NVIDIA tensor cores (compute capability 8.0 and newer)", stacklevel=2)
        self.model, self.optimizer, self.config = model, optimizer, config
        self.scaler = (DynamicLossScaler(config.init_scale, growth_interval=config.growth_interval)
                       if config.precision == "fp16" else None)
        self.step = 0

    def autocast(self):
        """The forward pass's context: autocast to FP16/BF16, or a disabled autocast."""
        dtype = AUTOCAST_DTYPES.get(self.config.precision)
        return torch.autocast(self.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)

    def train_step(self, batch, loss_fn) -> StepRecord:
        """One optimizer step on ``batch`` (split into ``accumulate_steps`` micro-batches)."""
        micro_batches = self._split(batch)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        scale = self.scaler.get_scale() if self.scaler else None
        total = 0.0
        for micro_batch, share in micro_batches:
            with self.autocast():
                loss = loss_fn(self.model, micro_batch)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
                raise TypeError("loss_fn(model, batch) must return the mean loss as a floating-point "
                                "tensor with one element")
            loss = loss.float().reshape(()) * share  # n_i / N of the batch's mean loss
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            total = total + loss.detach()
        if not any(p.grad is not None for p in self.params):
            raise RuntimeError("backward() reached none of the optimizer's parameters: does "
                               "loss_fn compute the loss with the model it is given?")
        if self.scaler:
            self.scaler.unscale_(self.optimizer)  # before clipping: the norm in true units
        grad_norm = self._clip_gradients()
        if self.scaler:
            self.scaler.step(self.optimizer)       # skipped if a gradient is inf/NaN
            self.scaler.update()
            skipped = self.scaler.history[-1].found_inf
        else:  # in FP32 and BF16 an inf/NaN gradient is a bug; skip the step and report it
            # (in FP8 one that reaches an FP8 cast has already raised ValueError there)
            skipped = not math.isfinite(grad_norm)
            if not skipped:
                self.optimizer.step()
        record = StepRecord(self.step, float(total), grad_norm, skipped, scale)
        self.step += 1
        return record

    def _split(self, batch) -> list:
        """[(micro_batch, n_i / N)]: the batch cut along dimension 0 into accumulate_steps parts."""
        k = self.config.accumulate_steps
        if k == 1:
            return [(batch, 1.0)]
        tensors = [batch] if isinstance(batch, torch.Tensor) else batch
        if not isinstance(tensors, (tuple, list)) or not tensors or \
                not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in tensors):
            raise TypeError("with accumulate_steps > 1 a batch is a tensor or a tuple/list of "
                            "tensors, split along dimension 0")
        n = len(tensors[0])
        if any(len(t) != n for t in tensors):
            raise ValueError("the tensors of a batch must have the same size along dimension 0")
        if n < k:
            raise ValueError(f"a batch of {n} examples cannot be split into {k} micro-batches")
        parts = list(zip(*(torch.tensor_split(t, k) for t in tensors)))
        unpack = (lambda part: part[0]) if isinstance(batch, torch.Tensor) else type(batch)
        return [(unpack(part), len(part[0]) / n) for part in parts]

    def _clip_gradients(self) -> float:
        """The total L2 norm of the gradients (the norm of the per-tensor norms), clipped to
        ``max_grad_norm`` if set: ``g <- g * min(1, max_grad_norm / (norm + 1e-6))``."""
        grads = [p for p in self.params if p.grad is not None]
        if self.config.max_grad_norm is not None:
            return float(torch.nn.utils.clip_grad_norm_(grads, self.config.max_grad_norm))
        norms = torch.stack([torch.linalg.vector_norm(p.grad) for p in grads])
        return float(torch.linalg.vector_norm(norms))

    @torch.no_grad()
    def evaluate(self, fn):
        """``fn(model)`` in eval mode, without gradients, under the training precision's autocast.

        FP8 layers record an amax at every forward pass; their scaling state is put back
        afterwards, so evaluating never changes the training run that follows.
        """
        was_training, fp8_state = self.model.training, self._fp8_state(copy=True)
        self.model.eval()
        try:
            with self.autocast():
                return fn(self.model)
        finally:
            self.model.train(was_training)
            self._load_fp8_state(fp8_state)

    # --- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything the next step depends on: model, optimizer, loss scaler, FP8 amax histories,
        step count and random number generators (torch CPU and CUDA, Python, NumPy). As with
        torch's own state dicts, the tensors are the live ones: save it, or deep-copy it."""
        return {"precision": self.config.precision, "step": self.step,
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "fp8": self._fp8_state(copy=False), "rng": _rng_state()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`: the steps that follow are those the saved run took."""
        keys = {"precision", "step", "model", "optimizer", "scaler", "fp8", "rng"}
        if not isinstance(state, dict) or set(state) != keys:
            raise ValueError(f"not a MixedPrecisionTrainer state dict: expected the keys {sorted(keys)}")
        if state["precision"] != self.config.precision:
            raise ValueError(f"the checkpoint was written by a {state['precision']!r} trainer; this "
                             f"one trains in {self.config.precision!r}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler:
            self.scaler.load_state_dict(state["scaler"])
        self._load_fp8_state(state["fp8"])
        _set_rng_state(state["rng"])
        self.step = int(state["step"])

    def save_checkpoint(self, path) -> None:
        """Write :meth:`state_dict` to ``path`` with ``torch.save``."""
        torch.save(self.state_dict(), path)

    def load_checkpoint(self, path) -> None:
        """Read a checkpoint written by :meth:`save_checkpoint` and continue from it."""
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))

    def _delayed_scalings(self) -> dict[str, DelayedScaling]:
        return {f"{name}.{kind}": getattr(module, f"{kind}_scaling")
                for name, module in self.model.named_modules() if isinstance(module, Fp8Linear)
                for kind in ("input", "weight", "grad_output")
                if isinstance(getattr(module, f"{kind}_scaling"), DelayedScaling)}

    def _fp8_state(self, copy: bool) -> dict:
        # Fp8Linear keeps its amax histories out of the model's state dict: they are saved here.
        take = (lambda t: t.clone()) if copy else (lambda t: t)
        return {name: {"scale": take(s.scale), "amax_history": take(s.amax_history)}
                for name, s in self._delayed_scalings().items()}

    def _load_fp8_state(self, state: dict) -> None:
        scalings = self._delayed_scalings()
        if set(state) != set(scalings):
            raise ValueError("the checkpoint's FP8 scaling states do not match this model's FP8 layers")
        for name, saved in state.items():
            scalings[name].scale = saved["scale"].to(self.device)
            scalings[name].amax_history = saved["amax_history"].to(self.device)


def _rng_state() -> dict:
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached)}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- choosing the precision ------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceProfile:
    """What :func:`select_precision` needs to know about a machine.

    ``kind``: ``"cuda"``, ``"cpu"`` (anything else gets FP32); ``capability``: the CUDA compute
    capability; ``fp8_matmul``: whether ``torch._scaled_mm`` runs on it (checked by :meth:`detect`,
    assumed from 8.9 on otherwise); ``cpu_bf16``: the CPU's BF16 instructions, None without any:
    ``"AVX512_BF16"`` (x86 *vector* instructions: BF16 dot products into FP32 lanes, and
    conversions), ``"AVX512_BF16 and AMX"`` (also AMX-BF16, the *matrix* instructions that
    multiply whole tiles), ``"ARM BF16"`` (the ARMv8.6 BF16 extension: dot products and a small
    matrix multiply, BFMMLA). :attr:`cpu_bf16_description` says which in words.
    """

    kind: str
    name: str = ""
    capability: tuple[int, int] | None = None
    fp8_matmul: bool | None = None
    cpu_bf16: str | None = None

    @property
    def cpu_bf16_description(self) -> str | None:
        """``cpu_bf16`` in words: which kind of BF16 instructions the CPU has (None: none)."""
        return {"AVX512_BF16": "AVX512_BF16: vector dot products, no AMX matrix tiles",
                "AVX512_BF16 and AMX": "AVX512_BF16 vector dot products and AMX-BF16 matrix tiles",
                "ARM BF16": "the ARM BF16 extension: dot products and BFMMLA matrix multiplies",
                }.get(self.cpu_bf16, self.cpu_bf16)

    def __post_init__(self):
        if self.kind == "cuda":
            c = self.capability
            if not (isinstance(c, tuple) and len(c) == 2 and
                    all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in c)):
                raise ValueError(f"a CUDA profile needs capability=(major, minor), two ints, got {c!r}")

    @classmethod
    def detect(cls, device=None) -> DeviceProfile:
        """The profile of ``device`` (default: the first GPU if there is one, else the CPU)."""
        device = torch.device(device if device is not None else
                              "cuda" if torch.cuda.is_available() else "cpu")
        if device.type == "cuda":
            name = torch.cuda.get_device_name(device)
            if torch.version.hip:  # AMD's capability numbers are gfx versions, not NVIDIA's:
                # 9.4 is an MI300 (gfx942), whose FP8 is float8_e4m3fnuz, not Hopper's e4m3fn
                from mpcourse.bench.specs import fp8_dtypes_of
                major, minor = torch.cuda.get_device_capability(device)
                fp8 = fp8_dtypes_of("amd", (major, minor))
                fp8_text = ("no FP8" if fp8 is None else
                            "FP8 as " + " and ".join(str(d).removeprefix("torch.") for d in fp8))
                return cls("rocm", f"{name} (AMD gfx{major}{minor:x}x, {fp8_text})")
            capability = tuple(torch.cuda.get_device_capability(device))
            return cls("cuda", name, capability, fp8_matmul=_scaled_mm_runs(device))
        if device.type == "cpu":
            return cls("cpu", _cpu_name(), cpu_bf16=_cpu_bf16_instructions())
        return cls(device.type, device.type)


# Profiles of common GPUs, for the flowchart's table (compute capabilities from NVIDIA's list).
KNOWN_GPUS = {
    "P100": DeviceProfile("cuda", "Tesla P100 (Pascal)", (6, 0)),
    "V100": DeviceProfile("cuda", "Tesla V100 (Volta)", (7, 0)),
    "T4": DeviceProfile("cuda", "Tesla T4 (Turing, Colab's free GPU)", (7, 5)),
    "A100": DeviceProfile("cuda", "A100 (Ampere)", (8, 0)),
    "L4": DeviceProfile("cuda", "L4 (Ada Lovelace)", (8, 9)),
    "H100": DeviceProfile("cuda", "H100 (Hopper)", (9, 0)),
}


def _scaled_mm_runs(device) -> bool:
    """Whether torch._scaled_mm multiplies two 16x16 E4M3 matrices on ``device``."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return False
    one = torch.ones((), device=device)
    a = torch.eye(16, device=device).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t().contiguous().t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        return True
    except (RuntimeError, TypeError):
        return False


def _cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else its architecture."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _cpu_bf16_instructions() -> str | None:
    """The CPU's native BF16 instructions, as PyTorch reports them (private helpers, so each is
    asked for carefully): AVX512_BF16 (vector), AMX (matrix tiles), ARM BF16; None where it has
    none."""
    def ask(name, where=torch.cpu):
        try:
            return bool(getattr(where, name)())
        except (AttributeError, RuntimeError):
            return False

    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        if ask("_is_avx512_bf16_supported"):
            return "AVX512_BF16 and AMX" if ask("_is_amx_tile_supported") else "AVX512_BF16"
        return None
    # On ARM, oneDNN reports BF16 support only where the CPU has the BF16 extension.
    return "ARM BF16" if ask("_is_mkldnn_bf16_supported", torch.ops.mkldnn) else None


#: Per-tensor current scaling in the HYBRID formats (Transformer Engine's Float8CurrentScaling).
CURRENT_SCALING = Fp8Recipe(scaling="current")


@dataclass(frozen=True)
class PrecisionChoice:
    """What :func:`select_precision` chose, and why: one sentence per decision in ``reasons``.
    ``fallback``: what to train in if the choice misbehaves (compare with a short run in it).
    ``fp8_recipe``: for ``"fp8"``, the scaling recipe the GPU's tensor cores serve, as
    Transformer Engine picks its default: ``"hybrid"`` (a scale per tensor, delayed) on 8.9 and
    9.x, ``"mxfp8"`` (a scale per block of 32, in hardware) on 10.x and 11.x, and
    :data:`CURRENT_SCALING` (a scale per tensor, from the tensor itself) on 12.x."""

    precision: str
    reasons: tuple[str, ...]
    profile: DeviceProfile
    tf32: bool = False
    fallback: str | None = None
    fp8_recipe: str | Fp8Recipe | None = None

    def config(self, **options) -> TrainerConfig:
        """A :class:`TrainerConfig` with this precision (and TF32, and the FP8 recipe, where chosen)."""
        if self.fp8_recipe is not None:
            options.setdefault("fp8_recipe", self.fp8_recipe)
        return TrainerConfig(precision=self.precision, tf32=self.tf32, **options)


def select_precision(device=None, *, capability: tuple[int, int] | None = None,
                     allow_fp8: bool = False) -> PrecisionChoice:
    """The precision flowchart, as code::

        CUDA, capability >= 8.0                             -> bf16, TF32 for the FP32 matmuls
          ... and allow_fp8=True, >= 8.9, _scaled_mm runs   -> fp8  (fallback bf16): a scale per
              tensor on 8.9, 9.x and 12.x (Ada, Hopper, consumer Blackwell), MXFP8 blocks
              of 32 on 10.x and 11.x (data-centre Blackwell: B200, GB200)
        CUDA, capability >= 7.0                             -> fp16 with dynamic loss scaling
        CUDA, older                                         -> fp32
        CPU with AMX (BF16 matrix tiles)                    -> bf16
        CPU with AVX512_BF16 or ARM BF16 alone, or neither  -> fp32 (BF16 for memory, not speed)
        another kind of device                              -> fp32

    ``device``: a torch device (or its name) to inspect, or a :class:`DeviceProfile` describing
    any machine; default: this machine's GPU, else its CPU. ``capability=(major, minor)``
    describes a CUDA GPU by its compute capability alone. BF16 is the default wherever there are
    BF16 tensor cores. FP8 is a step to take after that, not a default: it pays off for large,
    matmul-heavy models, and only once a BF16 baseline shows what its loss curve should be.
    ``allow_fp8=True`` takes that step on a GPU with FP8 tensor cores (8.9 and newer).
    """
    if capability is not None:
        if device is not None:
            raise ValueError("give a device or a capability, not both")
        if not isinstance(capability, tuple):
            raise TypeError(f"capability is a tuple (major, minor), e.g. (8, 0), not {capability!r}")
        profile = DeviceProfile("cuda", f"a GPU of compute capability {capability[0]}.{capability[1]}"
                                if len(capability) == 2 else "", capability)
    elif isinstance(device, DeviceProfile):
        profile = device
    else:
        profile = DeviceProfile.detect(device)
    if profile.kind == "cuda":
        return _select_cuda(profile, allow_fp8)
    if profile.kind == "cpu":
        return _select_cpu(profile)
    return PrecisionChoice("fp32", (f"{profile.name or profile.kind}: this flowchart covers NVIDIA "
                                    f"GPUs and CPUs; FP32 is always correct, so start there.",),
                           profile)


def _select_cuda(profile: DeviceProfile, allow_fp8: bool) -> PrecisionChoice:
    major, minor = profile.capability
    reasons = [f"{profile.name or 'This GPU'} has compute capability {major}.{minor}."]
    cap = profile.capability
    if cap >= (8, 9) and allow_fp8:
        if profile.fp8_matmul is False:
            reasons.append("It has FP8 tensor cores (8.9 and newer), but torch._scaled_mm does not "
                           "run here (PyTorch or CUDA too old), so FP8 is out.")
        else:
            if (10, 0) <= cap < (12, 0):
                recipe = "mxfp8"
                reasons.append("It has FP8 tensor cores that scale blocks of 32 values in hardware "
                               "(10.x: data-centre Blackwell, B200 and GB200), and FP8 was asked for "
                               "(allow_fp8=True): the linear layers run in MXFP8 (E4M3 in both passes, "
                               "one power-of-two E8M0 scale per 32 values), the recipe these tensor "
                               "cores are built for; NVFP4 (4-bit values) is the further step.")
            elif cap >= (12, 0):
                recipe = CURRENT_SCALING
                reasons.append("It has FP8 tensor cores (12.x: consumer Blackwell; they have "
                               "block-scaled FP8 instructions too), and FP8 was asked "
                               "for (allow_fp8=True): the linear layers run in FP8 with one scale per "
                               "tensor, computed from the tensor itself (current scaling; E4M3 "
                               "forward, E5M2 gradients). That is Transformer Engine's default on "
                               "12.x (Float8CurrentScaling): Transformer Engine reports that its MXFP8 is "
                               "not supported for all matrix layouts on 12.0 and newer yet (its message "
                               "through version 2.15 at least, which gives no reason).")
            else:
                recipe = "hybrid"
                block = (" A scale per block of 128 (DeepSeek-V3's recipe, Transformer Engine's "
                         "Float8BlockScaling) also runs on 9.x, with CUDA 12.9 or newer."
                         if cap >= (9, 0) else
                         " Transformer Engine's per-block recipe (Float8BlockScaling) needs 9.0 or "
                         "newer, so not here.")
                reasons.append("It has FP8 tensor cores (8.9 Ada, 9.x Hopper), and FP8 was asked for "
                               "(allow_fp8=True): the linear layers run in FP8 with one scale per "
                               "tensor (E4M3 forward, E5M2 gradients)." + block)
            reasons.append("FP8 pays off for large, matmul-heavy models; compare its loss curve with "
                           "the BF16 baseline, and fall back to BF16 if it departs.")
            return PrecisionChoice("fp8", tuple(reasons), profile, tf32=True, fallback="bf16",
                                   fp8_recipe=recipe)
    if cap >= (8, 0):
        reasons += ["It has BF16 tensor cores (8.0 and newer): BF16 autocast, no loss scaler, "
                    "since BF16 has FP32's exponent range.",
                    "TF32 on: the matmuls left in FP32 use tensor cores with 10-bit mantissas."]
        if cap >= (8, 9) and not allow_fp8:
            reasons.append("It also has FP8 tensor cores (8.9 and newer): for a large, matmul-heavy "
                           "model, FP8 is the next step once this BF16 run is a baseline "
                           "(allow_fp8=True).")
        return PrecisionChoice("bf16", tuple(reasons), profile, tf32=True, fallback="fp32")
    if cap >= (7, 0):
        reasons += ["No BF16 tensor cores (they start at 8.0, Ampere). FP16 tensor cores on 7.0 "
                    "(Volta) and on 7.5's data-centre and RTX parts (Turing: T4, RTX 20 series); "
                    "the GTX 16 series (also 7.5) has none and gets FP16 only because its "
                    "capability cannot tell it from a T4: there FP16 saves memory, and whether it "
                    "saves time must be measured.",
                    f"FP16 autocast with dynamic loss scaling: in FP16, gradients at or below "
                    f"2^{int(math.log2(FP16.min_subnormal)) - 1} round to zero (2^-25 itself is a "
                    f"tie, rounded to the even neighbour 0) and those below "
                    f"2^{int(math.log2(FP16.min_normal))} keep fewer significant bits; the scaler "
                    f"lifts them."]
        return PrecisionChoice("fp16", tuple(reasons), profile, fallback="fp32")
    reasons.append("No tensor cores (they start at 7.0, Volta), so start in FP32. Without them a "
                   "16-bit format saves activation memory, and time only where the GPU's own FP16 "
                   "arithmetic is fast: twice the FP32 rate on 6.0 (P100), a small fraction of it "
                   "on 6.1 (GTX 10 series).")
    return PrecisionChoice("fp32", tuple(reasons), profile)


def _select_cpu(profile: DeviceProfile) -> PrecisionChoice:
    reasons = [f"CPU: {profile.name or 'unknown model'}."]
    if profile.cpu_bf16 and "AMX" in profile.cpu_bf16:
        reasons.append(f"It has AMX-BF16 matrix tiles (and AVX512_BF16 vector dot products): oneDNN runs large BF16 "
                       f"matrix products on them, faster than FP32 (small ones, such as a tiny MLP's, can be "
                       f"slower: time your own model's steps), and BF16 autocast stores most "
                       f"activations in 16 bits; no loss scaler is needed.")
        return PrecisionChoice("bf16", tuple(reasons), profile, fallback="fp32")
    if profile.cpu_bf16:
        reasons.append(f"It has BF16 instructions ({profile.cpu_bf16_description}) but no AMX: oneDNN runs BF16 "
                       f"matrix products natively, yet not reliably faster than FP32 (on an "
                       f"AVX512_BF16 Xeon without AMX they can be slower), so train in FP32; BF16 "
                       f"autocast saves activation memory, and a timed large matrix product shows "
                       f"whether it also saves time here.")
        return PrecisionChoice("fp32", tuple(reasons), profile)
    reasons.append("No BF16 matrix instructions: BF16 values would be widened to FP32 inside every "
                   "kernel, usually slower than FP32 itself, so train in FP32 (BF16 autocast still "
                   "works, for memory).")
    return PrecisionChoice("fp32", tuple(reasons), profile)
