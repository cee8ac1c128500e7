"""The tricks large-model runs use to stay stable in low precision, small enough to read.

Each one answers a failure that the chapter *Keeping large models stable in low precision*
measures on the tiny transformer:

- `z_loss`: holds log Z, the log of the softmax's normaliser, near zero (PaLM), which keeps the
  output logits from drifting to large values, where BF16's absolute rounding error is large;
  `soft_cap`: bounds the logits' size (Gemma 2);
- `StableAttention`: attention with optional QK-norm (a LayerNorm on queries and keys, per head,
  as in ViT-22B; OLMo 2 and Gemma 3 use RMSNorms, OLMo 2's over all heads together), built into
  the model from step 0; it records the largest attention logit;
- `rope_angles`: rotary-embedding angles ``position × frequency``, computed in a chosen dtype;
- `router_top_k`: the experts a mixture-of-experts router picks, with the gate computed in a
  chosen dtype;
- `chunked_cross_entropy`: the loss of a large-vocabulary output layer in FP32 without ever
  holding the FP32 logits of all tokens at once;
- `SpikeDetector` and `AdamLowPrecisionStates`: flag a loss spike before the step is taken, and
  an Adam whose moments are stored (emulated) in BF16 or 8-bit blocks;
- `train_lm` and `spike_runs`: the chapter's training runs.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mpcourse.formats import get_format, round_to
from mpcourse.workloads import CausalSelfAttention, TinyTransformer

__all__ = ["z_loss", "soft_cap", "StableAttention", "stable_tiny_transformer", "rope_angles",
           "angle_error", "router_top_k", "chunked_cross_entropy", "saved_tensor_bytes",
           "SpikeDetector", "AdamLowPrecisionStates", "train_lm", "spike_runs"]


# ---------------------------------------------------------------------------------------------
# Output logits.

def z_loss(logits: torch.Tensor, weight: float = 1e-4) -> torch.Tensor:
    """``weight · mean(log Z ²)``, where ``log Z = logsumexp(logits)`` over the last dimension.

    Softmax ignores a constant added to every logit, so nothing in the cross-entropy stops the
    logits from drifting together; this term pulls ``log Z`` towards 0 (PaLM uses weight 1e-4).
    Computed in FP32 whatever the dtype of ``logits``.
    """
    if weight < 0:
        raise ValueError(f"the z-loss weight must be >= 0, got {weight}")
    return weight * logits.float().logsumexp(dim=-1).square().mean()


def soft_cap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap · tanh(logits / cap)``: about the identity for small logits, never beyond ±cap.

    Gemma 2 caps its final logits at 30 and its attention logits at 50 (Gemma 3 drops both caps
    and bounds the attention logits with QK-norm instead).
    """
    if not cap > 0:
        raise ValueError(f"the soft cap must be positive, got {cap}")
    return cap * torch.tanh(logits / cap)


# ---------------------------------------------------------------------------------------------
# Attention with QK-norm.

class StableAttention(CausalSelfAttention):
    """`CausalSelfAttention` with optional QK-norm and a record of its largest attention logit.

    With ``qk_norm=True`` the queries and keys of each head go through a LayerNorm before
    ``q @ kᵀ / √d``, so their lengths, and with them the logits, no longer grow with the projection
    weights (only the norms' own gains can scale them).
    ``max_logit`` holds the largest ``|q·k|/√d`` of the last forward pass (a float).
    """

    def __init__(self, dim: int, heads: int, *, qk_norm: bool = False):
        super().__init__(dim, heads)
        head_dim = dim // heads
        self.q_norm = nn.LayerNorm(head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(head_dim) if qk_norm else nn.Identity()
        self.max_logit = 0.0

    def forward(self, x):
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        q, k = self.q_norm(q), self.k_norm(k)
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        self.max_logit = logits.masked_fill(future, 0).abs().max().item()
        weights = logits.masked_fill(future, float("-inf")).softmax(dim=-1)
        mixed = (weights @ v).transpose(1, 2).reshape(batch, length, dim)
        return self.out(mixed)


def stable_tiny_transformer(*, qk_norm: bool = False, **kwargs) -> TinyTransformer:
    """A `TinyTransformer` whose attention layers are `StableAttention` (QK-norm or not)."""
    model = TinyTransformer(**kwargs)
    for block in model.blocks:
        block.attention = StableAttention(model.norm.normalized_shape[0],
                                          block.attention.heads, qk_norm=qk_norm)
    return model


# ---------------------------------------------------------------------------------------------
# Rotary position embeddings (RoPE).

def rope_angles(positions: torch.Tensor, dim: int, *, base: float = 10000.0,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The rotation angles ``θ[p, i] = p · base^(-2i/dim)`` of RoPE, computed in ``dtype``.

    The positions and the frequencies are cast to ``dtype`` and multiplied there, as a model
    that builds its angles in BF16 (or under autocast) does. Returns shape ``(len, dim // 2)``.
    """
    if dim <= 0 or dim % 2:
        raise ValueError(f"RoPE needs a positive even dimension, got {dim}")
    if positions.is_floating_point() or positions.dim() != 1:
        raise ValueError("positions must be a 1-D tensor of integer positions")
    frequencies = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    return positions.to(dtype)[:, None] * frequencies.to(positions.device, dtype)[None, :]


def angle_error(angles: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``|angles − reference|`` as rotations, wrapped into [0, π] (an error of 2π is none)."""
    difference = (angles.double() - reference.double()).remainder(2 * math.pi)
    return torch.minimum(difference, 2 * math.pi - difference)


# ---------------------------------------------------------------------------------------------
# Mixture-of-experts routing.

def router_top_k(hidden: torch.Tensor, gate: torch.Tensor, k: int, *,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``k`` experts each token is sent to, with the gate logits computed in ``dtype``.

    ``hidden``: (tokens, dim); ``gate``: (experts, dim). Returns (tokens, k) expert indices,
    sorted, so two routings compare with ``==``.
    """
    if not 1 <= k <= gate.shape[0]:
        raise ValueError(f"k must be between 1 and the number of experts ({gate.shape[0]}), got {k}")
    logits = hidden.to(dtype) @ gate.to(dtype).T
    return logits.float().topk(k, dim=-1).indices.sort(dim=-1).values


# ---------------------------------------------------------------------------------------------
# Large-vocabulary cross-entropy, one chunk of tokens at a time.

class _ChunkedCrossEntropy(torch.autograd.Function):
    """Loss and gradients together, chunk by chunk: the loss is the last node of the graph, so
    its gradients can be computed in the forward pass and only they (not the logits) are kept."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_size):
        tokens = hidden.shape[0]
        weight32 = weight.float()
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
        grad_weight = torch.zeros_like(weight32)
        grad_bias = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
        for start in range(0, tokens, chunk_size):
            h, t = hidden[start:start + chunk_size].float(), targets[start:start + chunk_size]
            logits = h @ weight32.T  # (chunk, vocab) in FP32: the only logits that ever exist
            if bias is not None:
                logits += bias.float()
            log_p = logits.log_softmax(dim=-1)
            total -= log_p.gather(1, t[:, None]).sum()
            d_logits = log_p.exp_()  # softmax − one-hot is the gradient of −log p[target]
            d_logits[torch.arange(len(t), device=t.device), t] -= 1
            d_logits /= tokens
            grad_hidden[start:start + chunk_size] = d_logits @ weight32
            grad_weight += d_logits.T @ h
            if bias is not None:
                grad_bias += d_logits.sum(dim=0)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total / tokens

    @staticmethod
    def backward(ctx, grad_loss):
        grads = [None if g is None else (g * grad_loss).to(dtype)
                 for g, dtype in zip(ctx.saved_tensors, ctx.dtypes)]
        return (*grads, None, None)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          targets: torch.Tensor, *, chunk_size: int = 1024) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weightᵀ + bias, targets)`` in FP32, ``chunk_size`` tokens at a time.

    ``hidden``: (tokens, dim), any float dtype; ``weight``: (vocab, dim); ``targets``: (tokens,).
    At most ``chunk_size × vocab`` FP32 logits exist at once, and backward keeps the gradients of
    ``hidden``, ``weight`` and ``bias`` instead of any logits. Returns the mean loss (FP32).
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"need hidden (tokens, dim) and targets (tokens,), got "
                         f"{tuple(hidden.shape)} and {tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if len(targets) and not 0 <= int(targets.min()) <= int(targets.max()) < weight.shape[0]:
        raise ValueError(f"targets must lie in [0, {weight.shape[0]}) (the vocabulary)")
    return _ChunkedCrossEntropy.apply(hidden, weight, bias, targets, chunk_size)


def saved_tensor_bytes(fn) -> tuple[object, int]:
    """Run ``fn()`` and count the bytes autograd saves for backward in it (each storage once).

    Returns ``(fn's result, bytes)``. What is saved stays in memory until ``backward()``.
    """
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = fn()
    return result, sum(storages.values())


# ---------------------------------------------------------------------------------------------
# Loss spikes and low-precision optimizer states.

class SpikeDetector:
    """Flags a loss far above the recent ones: ``loss > mean + threshold · std`` of the last
    ``window`` unflagged losses (no finite loss is flagged before ``window`` losses are seen; a
    non-finite loss, inf or NaN, is flagged at once and never enters the window).

    Call ``is_spike(loss)`` with each step's loss *before* ``optimizer.step()``: a flagged step
    can then be skipped, or the run rewound to a checkpoint. Flagged losses do not enter the
    window, so one spike does not raise the bar for the next.
    """

    def __init__(self, window: int = 20, threshold: float = 6.0):
        if not isinstance(window, int) or isinstance(window, bool) or window < 2 or threshold <= 0:
            raise ValueError(f"need window >= 2 and threshold > 0, got {window} and {threshold}")
        self.window, self.threshold, self.recent = window, threshold, []

    def is_spike(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        if len(self.recent) == self.window:
            mean = sum(self.recent) / self.window
            std = math.sqrt(sum((x - mean) ** 2 for x in self.recent) / (self.window - 1))
            if loss > mean + self.threshold * std:
                return True
            self.recent.pop(0)
        self.recent.append(loss)
        return False


def _store(state: torch.Tensor, fmt: str, block: int, code: str = "e4m3") -> torch.Tensor:
    """``state`` as it reads back after being stored in ``fmt`` (the storage is emulated)."""
    if fmt == "fp32":
        return state
    if fmt == "bf16":
        return state.to(torch.bfloat16).float()
    # "8bit": one FP32 scale per block of `block` values maps the block's absmax to the largest
    # value of `code`, an 8-bit float; each value is then rounded to it, keeping relative precision
    # for small values down to the code's smallest subnormal (and flushing them to zero below)
    flat = state.flatten()
    padded = F.pad(flat, (0, -len(flat) % block)).view(-1, block)
    scale = padded.abs().amax(dim=1, keepdim=True) / get_format(code).max_value
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (round_to(padded / scale, code, saturate=True) * scale).flatten()[:len(flat)].view_as(state)


class AdamLowPrecisionStates(torch.optim.Optimizer):
    """Adam (no weight decay) whose two moments are stored in ``state_format`` after every step.

    ``"fp32"`` is plain Adam; ``"bf16"`` rounds ``m`` and ``v`` to BF16; ``"8bit"`` stores each as
    8-bit floats with one FP32 scale per ``block`` values, ``m`` in E4M3 and ``v`` in E5M2 (a
    nonlinear 8-bit code, like the dynamic quantisation of real 8-bit optimizers, but not theirs).
    ``v`` holds squared gradients, whose range is the square of the gradients' range: hence E5M2,
    the 8-bit float with the wider range, by default (``v_code`` chooses another). The arithmetic
    is FP32, in the order of kernels that load the stored states, update them in registers, step
    the weights with those FP32 values and only then store the states back (bitsandbytes' 8-bit
    Adam does): the rounding of a step's states reaches the weights from the next step on::

        m ← β₁·m + (1−β₁)·g,  v ← β₂·v + (1−β₂)·g²        (FP32, from the stored m and v)
        p ← p − lr · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε)
        m ← store(m),  v ← store(v)
    """

    FORMATS = ("fp32", "bf16", "8bit")

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, *,
                 state_format: str = "fp32", block: int = 64, v_code: str = "e5m2"):
        if state_format not in self.FORMATS:
            raise ValueError(f"state_format must be one of {self.FORMATS}, got {state_format!r}")
        if lr <= 0 or not all(0 <= b < 1 for b in betas) or block < 1:
            raise ValueError("need lr > 0, 0 <= betas < 1 and block >= 1")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        get_format(v_code)  # an unknown format name fails here, with the list of known ones
        self.state_format, self.block, self.v_code = state_format, block, v_code

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, m=torch.zeros_like(p, dtype=torch.float32),
                                 v=torch.zeros_like(p, dtype=torch.float32))
                state["step"] += 1
                g = p.grad.float()
                m = beta1 * state["m"] + (1 - beta1) * g
                v = beta2 * state["v"] + (1 - beta2) * g * g
                m_hat = m / (1 - beta1 ** state["step"])
                v_hat = v / (1 - beta2 ** state["step"])
                p -= (group["lr"] * m_hat / (v_hat.sqrt() + group["eps"])).to(p.dtype)
                state["m"] = _store(m, self.state_format, self.block)
                state["v"] = _store(v, self.state_format, self.block, self.v_code)


# ---------------------------------------------------------------------------------------------
# The chapter's training runs.

def train_lm(tokens: torch.Tensor, *, steps: int, lr: float, qk_norm: bool = False,
             z_weight: float = 0.0, cap: float | None = None, seed: int = 0,
             batch_size: int = 16, context: int = 32, warmup: int = 0,
             autocast: torch.dtype | None = None):
    """One plain AdamW run (no weight decay, FP32 weights) of `stable_tiny_transformer` on
    ``tokens``, its initial weights and its batches drawn from ``seed``; QK-norm, a z-loss of
    weight ``z_weight``, a soft cap at ``cap`` and a linear warm-up of the learning rate over the
    first ``warmup`` steps (step t, from 0, at ``lr · min(1, (t + 1) / warmup)``) as asked.
    ``autocast``: None computes in FP32; ``torch.bfloat16`` (or ``torch.float16``) runs the forward
    pass under ``torch.autocast`` with that dtype, the course's mixed-precision recipe (the loss,
    z-loss and soft cap on the logits cast to FP32; no loss scaling).

    Returns ``(model, history)``: per step the loss (without the z-loss), the largest attention
    logit of any block, the mean log Z and the largest ``|logit|`` (after the cap).
    """
    from mpcourse.workloads import lm_batch

    if autocast not in (None, torch.bfloat16, torch.float16):
        raise ValueError(f"autocast is None (FP32), torch.bfloat16 or torch.float16, not {autocast!r}")
    torch.manual_seed(seed)
    model = stable_tiny_transformer(qk_norm=qk_norm).to(tokens.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    history = {"loss": [], "attention": [], "log Z": [], "logit": []}
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup) if warmup else lr
        x, y = lm_batch(tokens, batch_size, context, generator=generator)
        with torch.autocast(tokens.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            logits = model(x)
        logits = logits.float()
        if cap is not None:
            logits = soft_cap(logits, cap)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        total = loss + z_loss(logits, z_weight) if z_weight else loss
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()
        history["loss"].append(loss.item())
        history["attention"].append(max(b.attention.max_logit for b in model.blocks))
        history["log Z"].append(logits.detach().float().logsumexp(-1).mean().item())
        history["logit"].append(logits.detach().abs().max().item())
    return model, history


def _spike_steps(run, tokens, setup, first, last, spike_at, factor):
    """Steps ``first`` to ``last - 1`` of one spike run, recorded into ``run["record"]``."""
    from mpcourse.workloads import lm_batch

    model, optimizer, record = run["model"], run["optimizer"], run["record"]
    for step in range(first, last):
        x, y = lm_batch(tokens, 16, 32, generator=run["generator"])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        if step == spike_at:
            loss = loss * factor  # the planted bad batch
        record["losses"].append(loss.item())
        if run["detector"].is_spike(loss.item()):
            record["flagged"].append(step)
            if setup.get("skip"):
                continue
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        parameters = list(model.parameters())
        if setup.get("clip") is not None:
            record["norms"].append(torch.nn.utils.clip_grad_norm_(parameters, setup["clip"]).item())
        else:  # the norm alone, the gradients untouched
            record["norms"].append(torch.nn.utils.get_total_norm([p.grad for p in parameters]).item())
        before = torch.cat([p.detach().flatten() for p in parameters])
        moments = {key: [s[key].clone() for s in optimizer.state.values()]
                   for key in ("m", "v") if step == spike_at and setup.get(f"spike_out_of_{key}")}
        optimizer.step()
        record["updates"].append(torch.cat([p.detach().flatten() for p in parameters]) - before)
        if setup.get("zero_m") and step == spike_at:  # forget the spike's momentum, keep v
            for state in optimizer.state.values():
                state["m"].zero_()
        beta = dict(zip("mv", optimizer.param_groups[0]["betas"]))
        for key, previous in moments.items():  # the spike step's update stands; from here on,
            for state, old in zip(optimizer.state.values(), previous):  # the moment forgets the
                state[key] = beta[key] * old                             # spike's gradient only
        record["v"].append(sum(s["v"].sum().item() for s in optimizer.state.values()))


def spike_runs(tokens: torch.Tensor, setups: dict, *, steps: int = 80, spike_at: int = 40,
               lr: float = 3e-3, factor: float = 1000.0, seed: int = 0, share: bool = True) -> dict:
    """Runs of `stable_tiny_transformer` with `AdamLowPrecisionStates` at ``lr``, all from the
    same weights and batches (``seed``), in which the loss of the batch at step ``spike_at`` is
    multiplied by ``factor`` (a planted bad batch); a `SpikeDetector` watches every loss.

    ``setups`` maps a name to its options: ``state_format`` (``"fp32"``, ``"bf16"``, ``"8bit"``),
    ``skip`` (skip the steps the detector flags), ``zero_m`` (zero ``m`` right after the spike
    step), ``spike_out_of_m`` / ``spike_out_of_v`` (right after the spike step, take the spike's
    own gradient out of ``m`` / ``v``: ``m = beta1 * m_before``, ``v = beta2 * v_before``, as if
    that gradient had been 0, the rest of the moment kept), ``clip`` (clip the gradient norm to
    it). Returns, per name, the lists ``losses`` (every
    step), ``flagged`` (the flagged steps) and, for every step taken, ``norms`` (the gradient's
    norm before any clipping), ``updates`` (the change of all weights) and ``v`` (the sum of
    Adam's ``v``).

    The runs of one state format are the same step for step until the spike, unless a run skips
    an earlier flagged step or its clipping threshold binds earlier: they are computed once up to
    the spike and continue from copies, which gives the same numbers as separate runs
    (``share=False`` computes every run from its start).
    """
    import copy

    def start(state_format):
        torch.manual_seed(seed)
        model = stable_tiny_transformer().to(tokens.device)
        return {"model": model, "optimizer": AdamLowPrecisionStates(model.parameters(), lr=lr,
                                                                     state_format=state_format),
                "detector": SpikeDetector(), "generator": torch.Generator().manual_seed(seed),
                "record": dict(losses=[], v=[], flagged=[], norms=[], updates=[])}

    def fork(run):
        copied = start(run["optimizer"].state_format)
        copied["model"].load_state_dict(run["model"].state_dict())
        copied["optimizer"].load_state_dict(run["optimizer"].state_dict())
        copied["generator"].set_state(run["generator"].get_state())
        copied["detector"] = copy.deepcopy(run["detector"])
        copied["record"] = copy.deepcopy(run["record"])
        return copied

    prefixes, results = {}, {}
    for name, setup in setups.items():
        fmt = setup.get("state_format", "fp32")
        if share and fmt not in prefixes:
            prefixes[fmt] = start(fmt)
            _spike_steps(prefixes[fmt], tokens, {}, 0, spike_at, spike_at, factor)
        prefix = prefixes[fmt]["record"] if share else None
        shared = share and not (prefix["flagged"] and setup.get("skip")) and (setup.get("clip") is None
                                            or max(prefix["norms"], default=0.0) < setup["clip"])
        run = fork(prefixes[fmt]) if shared else start(fmt)
        _spike_steps(run, tokens, setup, spike_at if shared else 0, steps, spike_at, factor)
        results[name] = run["record"]
    return results
