"""Master weights, and the pure low-precision alternatives to them.

Why master weights. An optimizer step adds an update ``u = -lr * g`` to each weight ``w``, and
the sum is rounded to the weight's format. Near ``w = 1`` FP16 values are ``2**-10 ≈ 9.8e-4``
apart (``2**-11`` just below 1), so any ``|u|`` under half the gap in its direction
(``2**-11 ≈ 4.9e-4`` up, ``2**-12 ≈ 2.4e-4`` down) rounds straight back to ``w``: with
``lr = 1e-4`` and ``|g| < 1`` the weight never moves, however many steps it takes. BF16, with
three fewer mantissa bits, stalls at updates 8 times larger. Keeping an FP32 *master* copy of each
weight, stepping that, and rounding it into the FP16/BF16 model after every step makes the tiny
updates add up (Micikevicius et al. 2018, "Mixed Precision Training").

What it costs. Bytes per parameter when training with Adam (weights + gradients + Adam's ``m``
and ``v`` + master weights)::

    FP32 training                              4 + 4 + 4 + 4     = 16
    mixed precision, FP16/BF16 gradients       2 + 2 + 4 + 4 + 4 = 16
    mixed precision, FP32 gradients (here)     2 + 4 + 4 + 4 + 4 = 18

The "mixed precision saves 25% of memory" that the book's claims ledger quotes forgets the master
copy: per parameter it saves nothing. The savings are in the activations kept for backward, and
the speed in FP16/BF16 matrix multiplies. A model converted to FP16/BF16 saves every activation in 2 bytes, half of FP32;
autocast saves only the tensors of the operations it casts in 16 bits and keeps the rest (the
residual stream, the inputs of FP32-listed operations) in FP32, so it saves less than half: the
chapter on mixed-precision training measures how much, on a small transformer.

The pure low-precision alternatives keep no FP32 weights. The update is still computed in FP32
(inside a fused kernel), but only the BF16 weights carry information to the next step, so the
rounding of ``w + u`` must not throw small updates away. *Stochastic rounding* rounds up with a
probability equal to the fraction of the gap, so ``E[w_new] = w + u`` exactly. *Kahan summation*
keeps what each rounding dropped in a compensation buffer ``c`` and adds it back at the next step,
2 more bytes per parameter (Zamirai et al. 2020, "Revisiting BFloat16 Training")::

    pure BF16 + stochastic rounding, FP32 m, v    2 + 2 + 4 + 4     = 12
    pure BF16 + Kahan summation, FP32 m, v        2 + 2 + 4 + 4 + 2 = 14

Both wrappers here work the same way: they give the torch optimizer an FP32 copy of every
FP16/BF16 parameter to step in its place, and a hook moves each gradient onto the copy as backward
produces it. :class:`MasterWeightOptimizer` keeps the copies (they are the master weights);
:class:`CompensatedOptimizer` refreshes them from the low-precision weights at every step.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from mpcourse.formats import BF16, FP16, round_to

LOW_PRECISION = {torch.float16: FP16, torch.bfloat16: BF16}  # parameter dtypes given FP32 copies
METHODS = ("kahan", "stochastic", "nearest")

# Each FP16/BF16 model parameter -> a weak reference to the wrapper whose hook moves its gradient.
_OWNER = WeakIdKeyDictionary()
_WRAPPED = weakref.WeakSet()  # optimizers whose param_groups hold FP32 copies now


def _gradient_mover(fp32_copy: torch.Tensor, status: dict):
    """The hook that runs when backward has accumulated a model parameter's gradient: add it, in
    FP32, into the copy's gradient and free it. Accumulation over micro-batches thus happens in FP32
    (Megatron-LM's "main_grad"), and the model parameter's ``.grad`` is always None."""
    def move(param: torch.Tensor):
        if status["stepped"]:
            raise RuntimeError(
                "backward after step() without zero_grad(): the gradients live on the optimizer's "
                "FP32 copies, so model.zero_grad() cannot clear them; call optimizer.zero_grad()")
        if fp32_copy.grad is None:
            fp32_copy.grad = param.grad.float()
        else:
            fp32_copy.grad.add_(param.grad)
        param.grad = None
    return move


def _remove(handles: list):
    for handle in handles:
        handle.remove()
    handles.clear()


def _copy(targets: list, sources: list):
    """targets[i] = sources[i] for every pair in one vectorised call; a cast rounds to nearest even."""
    if targets:  # _foreach_copy_ refuses empty lists
        with torch.no_grad():
            torch._foreach_copy_(targets, sources)


class _FP32Copies:
    """What both wrappers share: every FP16/BF16 parameter of ``optimizer`` is replaced, in its
    param_groups, by an FP32 copy; a hook moves the parameter's gradients onto the copy. FP32 (and
    FP64) parameters stay as they are, stepped directly. Any loss scaler that walks ``param_groups``
    (ours, or ``torch.amp.GradScaler``) thus unscales FP32 gradients."""

    def __init__(self, optimizer):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{type(self).__name__} wraps a torch.optim.Optimizer built over the "
                            f"model's parameters, not {type(optimizer).__name__}")
        if optimizer in _WRAPPED:
            raise ValueError("this optimizer has been wrapped already (its param_groups hold FP32 "
                             "copies now); build a new one over the model's parameters")
        if optimizer.state:
            raise ValueError("wrap the optimizer before its first step: its state is keyed by the "
                             "parameters it was built with, which the wrapper replaces")
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for p in params:
            owner = _OWNER.get(p)
            if p.dtype in LOW_PRECISION and owner is not None and owner() is not None:
                raise ValueError("a parameter already has its gradients moved by another wrapper; "
                                 "call remove_hooks() on that one first")
        self.optimizer = optimizer
        _WRAPPED.add(optimizer)
        self.model_params = [p for p in params if p.dtype in LOW_PRECISION]
        self.fp32_params = [p.detach().float().requires_grad_(p.requires_grad)
                            for p in self.model_params]
        self._direct = [p for p in params if p.dtype not in LOW_PRECISION]  # stepped as they are
        self._status = {"stepped": False}
        self._hooks = []
        copy_of = dict(zip(map(id, self.model_params), self.fp32_params))
        for group in optimizer.param_groups:  # in place, as LBFGS keeps a reference to the list
            group["params"][:] = [copy_of.get(id(p), p) for p in group["params"]]
        for p, fp32_copy in zip(self.model_params, self.fp32_params):
            _OWNER[p] = weakref.ref(self)
            if p.requires_grad:
                mover = _gradient_mover(fp32_copy, self._status)
                self._hooks.append(p.register_post_accumulate_grad_hook(mover))
        weakref.finalize(self, _remove, self._hooks)  # a collected wrapper moves no more gradients

    @property
    def param_groups(self) -> list[dict]:
        """The inner optimizer's groups, holding the FP32 copies in place of FP16/BF16 parameters."""
        return self.optimizer.param_groups

    @property
    def state(self):
        """The inner optimizer's state, keyed by the tensors in param_groups."""
        return self.optimizer.state

    def _stepped_params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self._status["stepped"] = False

    def remove_hooks(self):
        """Stop moving gradients, so that the model's parameters can be given to a new wrapper."""
        _remove(self._hooks)
        for p in self.model_params:
            _OWNER.pop(p, None)

    def _check_model_params(self):
        """Fail with a sentence where a misuse would otherwise give silently wrong numbers."""
        if any(p.dtype in LOW_PRECISION for p in self._direct):
            raise RuntimeError("a parameter became FP16/BF16 after the optimizer was wrapped; convert "
                               "the model (model.to(torch.bfloat16)) before building the optimizer")
        if any(p.grad is not None for p in self.model_params):
            raise RuntimeError("an FP16/BF16 model parameter has a .grad that the hooks did not move "
                               "(set by hand, or after remove_hooks()); gradients belong on the FP32 "
                               "copies in param_groups")

    def _saved(self, state_dict: dict, keys: tuple) -> list:
        if not isinstance(state_dict, dict) or set(state_dict) != set(keys):
            raise ValueError(f"not a {type(self).__name__} state_dict: expected the keys {keys}")
        return [state_dict[k] for k in keys]

    def _check_like(self, saved: list, ours: list, what: str):
        if len(saved) != len(ours) or any(s.shape != o.shape for s, o in zip(saved, ours)):
            raise ValueError(f"the state_dict's {what} do not match this model's FP16/BF16 parameters")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r})"


class MasterWeightOptimizer(_FP32Copies):
    """Mixed-precision training with FP32 master weights, around any torch optimizer.

    Build the optimizer over the FP16/BF16 model's parameters, wrap it, and use the wrapper as you
    would the optimizer. With a loss scaler::

        model = Net().to(torch.float16)
        optimizer = MasterWeightOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
        scaler = torch.amp.GradScaler("cuda")
        for x, y in batches:
            optimizer.zero_grad()               # not model.zero_grad(): see below
            scaler.scale(loss_fn(model(x), y)).backward()
            scaler.unscale_(optimizer)          # unscales the FP32 master gradients
            torch.nn.utils.clip_grad_norm_(optimizer.master_params(), max_norm=1.0)
            scaler.step(optimizer)              # steps the masters, rounds them into the model
            scaler.update()

    Each step: the inner optimizer updates the FP32 masters ``w32 <- w32 + u``, then every model
    parameter becomes ``w = round_to_nearest_even(w32)`` (one vectorised cast). The masters are in
    ``param_groups`` and ``state_dict()``; FP32 parameters are stepped directly, so over an FP32
    model the wrapper is exactly the bare optimizer.

    Gradients: after ``backward()`` a model parameter's ``.grad`` is None; its gradient, in FP32,
    is on its master. Clip, inspect or set gradients through :meth:`master_params`, and clear them
    with ``optimizer.zero_grad()`` (a backward after ``step()`` without it raises an error).

    A change to the model's weights outside the optimizer (``model.load_state_dict`` after wrapping)
    raises an error at the next step rather than being overwritten by stale masters: call
    :meth:`reload_model_params` to take the model's weights as the masters, or load this
    optimizer's ``state_dict()`` too, which restores the masters. A ``closure`` is evaluated with the
    model refreshed from the masters each time, so optimizers that call it repeatedly (LBFGS) work.
    Learning-rate schedulers attach to the inner optimizer, ``optimizer.optimizer``, whose
    param_groups the wrapper shares.
    """

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._versions = [p._version for p in self.model_params]

    def master_params(self) -> list[torch.Tensor]:
        """Every tensor the inner optimizer steps, holding the gradients: the FP32 masters of the
        FP16/BF16 parameters, and the FP32 parameters themselves."""
        return self._stepped_params()

    def step(self, closure=None):
        """Step the masters with the inner optimizer, then round them into the model."""
        self._check_model_params()
        if [p._version for p in self.model_params] != self._versions:
            raise RuntimeError(
                "the model's FP16/BF16 weights were changed outside the optimizer (e.g. by "
                "model.load_state_dict); call reload_model_params() to make them the master "
                "weights, or load the optimizer's state_dict after the model's")

        def closure_at_masters():
            self._copy_masters_to_model()
            return closure()

        loss = self.optimizer.step(None if closure is None else closure_at_masters)
        self._copy_masters_to_model()
        self._status["stepped"] = True
        return loss

    def _copy_masters_to_model(self):
        _copy(self.model_params, self.fp32_params)  # w = round_to_nearest_even(w32)
        self._versions = [p._version for p in self.model_params]

    def reload_model_params(self):
        """Take the model's current FP16/BF16 weights as the master weights (exactly, as FP32)."""
        _copy(self.fp32_params, self.model_params)
        self._versions = [p._version for p in self.model_params]

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(),
                "master_params": [m.detach() for m in self.fp32_params]}

    def load_state_dict(self, state_dict: dict):
        """Restore the inner optimizer and the masters, and round the masters into the model."""
        inner, masters = self._saved(state_dict, ("optimizer", "master_params"))
        self._check_like(masters, self.fp32_params, "master_params")
        self.optimizer.load_state_dict(inner)
        with torch.no_grad():
            for master, saved in zip(self.fp32_params, masters):
                master.copy_(saved)
        self._copy_masters_to_model()


class CompensatedOptimizer(_FP32Copies):
    """Pure low-precision training: only the FP16/BF16 weights carry over from step to step.

    The inner optimizer computes the update in FP32, as a fused kernel would: at each step the FP32
    copies are refreshed, ``w32 = w`` (exact), the inner optimizer steps them to ``w32 + u``, and
    the result is written back into the low-precision weight by ``method``:

    - ``"stochastic"``: ``w = round_to(w + u, format of w, rounding="stochastic")``, where
      ``w + u`` is the FP32 result of the step. Unbiased, ``E[w_new] = w + u``, so updates far
      below the spacing still add up on average.
    - ``"kahan"``: compensated summation (Kahan 1965; Zamirai et al. 2020, "Revisiting BFloat16
      Training"), with a buffer ``c`` in the weight's own format that keeps what rounding dropped::

          y = u + c              (FP32)
          t = lowp(w + y)        (w + y in FP32, rounded to nearest even)
          c = lowp(y - (t - w))  (t - w is exact in FP32)
          w = t

      Being low precision itself, ``c`` keeps only the leading bits of what was dropped, so a
      little is still lost at every step: the pair ``(w, c)`` holds about twice the weight's
      precision, not FP32's.
    - ``"nearest"``: ``w = round_to(w + u, format of w)``, to nearest even, with nothing kept: the
      control. It has what the other two have (an FP32 update, FP32 moments) but no compensation,
      so an update below half the gap at ``w`` is lost, as in pure low-precision training.

    What is saved and what is scratch: the FP32 copies are scratch in this teaching emulation (a
    real implementation fuses them away); the optimizer's own state (Adam's ``m`` and ``v``) is
    whatever the inner optimizer keeps, FP32 for the torch optimizers. ``state_dict()`` holds the
    inner optimizer's state, the compensation buffers and the generator's state; the weights are
    the model's. Gradients arrive in FP32 on the copies in ``param_groups``, as for
    :class:`MasterWeightOptimizer` (clear them with ``optimizer.zero_grad()``). A ``closure`` is
    evaluated once, before the update (as SGD and Adam do); LBFGS is not supported.

    FP32 parameters mixed in (a norm layer kept in FP32) are stepped directly; with no FP16/BF16
    parameter at all there is nothing to compensate, and the constructor raises ValueError.
    """

    def __init__(self, optimizer, method: str = "kahan", generator: torch.Generator | None = None):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        if generator is not None and method != "stochastic":
            raise ValueError("a generator is only used with method='stochastic'")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator (or None), "
                            f"not {type(generator).__name__}")
        super().__init__(optimizer)
        if not self.model_params:
            raise ValueError("no FP16/BF16 parameters: with FP32 weights there is nothing to "
                             "compensate; use the optimizer directly")
        self.method, self.generator = method, generator
        kahan = method == "kahan"
        self.compensation = [torch.zeros_like(p) for p in self.model_params] if kahan else []

    def working_params(self) -> list[torch.Tensor]:
        """Every tensor the inner optimizer steps, holding the gradients: the FP32 scratch copies
        of the FP16/BF16 parameters, and the FP32 parameters themselves."""
        return self._stepped_params()

    def step(self, closure=None):
        """Step the FP32 copies of the current weights, then write the results back by method."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_model_params()
        _copy(self.fp32_params, self.model_params)  # w32 = w, exactly
        self.optimizer.step()                         # w32 = w + u
        with torch.no_grad():
            if self.method == "kahan":
                self._kahan_sum()
            elif self.method == "stochastic":
                self._round_stochastically()
            else:
                _copy(self.model_params, self.fp32_params)  # w = round_to_nearest_even(w + u)
        self._status["stepped"] = True
        return loss

    def _kahan_sum(self):
        # Same-dtype FP32 arithmetic throughout: on a CPU, mixing FP32 and BF16 in one operation
        # is slower than converting first.
        for w, w32, c in zip(self.model_params, self.fp32_params, self.compensation):
            w_old = w.float()
            y = w32.sub_(w_old).add_(c.float())  # y = u + c, in the scratch copy
            t = (w_old + y).to(w.dtype)          # t = lowp(w + y)
            c.copy_(y - (t.float() - w_old))     # c = lowp(y - (t - w)), what this rounding dropped
            w.copy_(t)

    def _round_stochastically(self):
        for w, w32 in zip(self.model_params, self.fp32_params):
            fmt = LOW_PRECISION[w.dtype]
            w.copy_(round_to(w32, fmt, rounding="stochastic", generator=self.generator))

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "method": self.method,
                "compensation": [c.detach() for c in self.compensation],
                "generator": None if self.generator is None else self.generator.get_state()}

    def load_state_dict(self, state_dict: dict):
        inner, method, compensation, generator_state = self._saved(
            state_dict, ("optimizer", "method", "compensation", "generator"))
        if method != self.method:
            raise ValueError(f"the state_dict is for method={method!r}, "
                             f"this optimizer uses {self.method!r}")
        self._check_like(compensation, self.compensation, "compensation buffers")
        if generator_state is not None and self.generator is None:
            raise ValueError("the state_dict holds a generator's state: pass generator= to restore it")
        self.optimizer.load_state_dict(inner)
        with torch.no_grad():
            for c, saved in zip(self.compensation, compensation):
                c.copy_(saved)
        if generator_state is not None:
            self.generator.set_state(generator_state)


def training_state(model: torch.nn.Module, optimizer) -> dict[str, list[torch.Tensor]]:
    """The tensors training keeps between steps, by role, after ``backward()`` and ``step()``.

    - ``"weights"``: the model's parameters, in whatever dtype the model has;
    - ``"gradients"``: their ``.grad``, or the masters' (``MasterWeightOptimizer`` moves them there);
    - ``"master weights"``: parameters the optimizer updates that are not the model's (FP32 copies);
    - ``"optimizer state"``: every tensor in ``optimizer.state`` (AdamW: two moments and a step).

    A memory bill counted from these tensors cannot forget a copy, as the "25% saving" that the
    book's claims ledger quotes does with the master weights::

        sum(t.numel() * t.element_size() for ts in training_state(model, opt).values() for t in ts)
    """
    params = list(model.parameters())
    in_model = {id(p) for p in params}
    masters = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in in_model]
    return {"weights": params,
            "gradients": [t.grad for t in params + masters if t.grad is not None],
            "master weights": masters,
            "optimizer state": [v for state in optimizer.state.values() for v in state.values()
                                if torch.is_tensor(v)]}
