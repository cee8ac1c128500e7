"""Numerically careful versions of the operations that low precision breaks, next to naive ones.

Three things go wrong when a network computes in FP16 or BF16, and each has a standard cure:

- **Overflow.** ``exp(x)`` overflows FP16 from ``x ≈ 11.09`` on (``exp(x) ≥ 65520`` rounds past
  65504), and ``x²`` from ``|x| ≈ 256`` on. Cure: compute so that large
  intermediates never arise (subtract the maximum before ``exp``), or in FP32, whose range is
  ``10**38``. See :func:`stable_softmax`, :func:`cross_entropy_fp32`, :func:`attention`.
- **Cancellation.** ``a - b`` for ``a ≈ b`` is computed exactly, but it exposes the rounding
  errors ``a`` and ``b`` already carry: relative error ``≈ u·|a| / |a - b|``, with
  ``u = 2**-(M+1)`` the unit roundoff (FP16: ``2**-11``, BF16: ``2**-8``, FP32: ``2**-24``). The
  variance as ``E[x²] - E[x]²`` is the classic case. Cure: a formula without the subtraction of
  large quantities (the two-pass variance, or Welford's running one), in FP32. See
  :func:`layer_norm_fp32` and, for the naive version, :func:`layer_norm_lowp`. Softmax cancels in
  its backward pass: the gradient ``p - onehot`` holds ``p_t - 1`` for the target class, which
  loses its digits as ``p_t → 1``; compute it from FP32 logits.
- **Accumulation.** Each addition to a running sum ``s`` rounds it, an error of up to ``u·|s|``;
  over ``n`` additions the worst case is ``(n-1)·u·Σ|x_i|``, and once a term falls below half
  the spacing of the values near ``s`` it is lost entirely. Cures: a wide accumulator (FP32),
  pairwise summation (error bound ``⌈log2 n⌉·u·Σ|x_i|``) or compensated (Kahan) summation.
  :func:`accumulate` emulates all three in FP16, BF16 or FP32, so this can be seen on a CPU, where
  torch's own ``sum`` of an FP16 tensor quietly adds in FP32.

Everything works on CPU and CUDA tensors alike.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mpcourse.formats import BF16, FP16, FP32, FloatFormat, get_format

ACCUMULATION_METHODS = ("sequential", "pairwise", "kahan")
# The formats whose arithmetic torch does natively: one rounded operation per torch operation.
ACCUMULATOR_DTYPES = {FP32: torch.float32, FP16: torch.float16, BF16: torch.bfloat16}


def _check_floating(x, what: str):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} takes a torch tensor, not {type(x).__name__}; "
                        "use torch.as_tensor(values, dtype=torch.float32)")
    if not x.is_floating_point():
        raise TypeError(f"{what} takes a floating-point tensor, got dtype {x.dtype}; "
                        "convert it first, e.g. x.float()")
    if x.numel() == 0:
        raise ValueError(f"{what} got an empty tensor (shape {tuple(x.shape)})")


def _wide(dtype: torch.dtype) -> torch.dtype:
    """FP32 for FP16/BF16/FP32 input, FP64 for FP64: the dtype the careful versions compute in."""
    return torch.promote_types(dtype, torch.float32)


# --- softmax ----------------------------------------------------------------------------------
def naive_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``softmax(x)_i = exp(x_i) / Σ_j exp(x_j)``, computed as written, in ``x``'s dtype.

    It breaks at both ends of the range. In FP16, ``exp(x)`` is infinite from ``x = 11.09375`` on
    (``exp(x) ≥ 65520`` rounds past the largest value, 65504), and ``inf / inf`` is NaN; the sum
    overflows earlier still when several terms are large. Where every ``x_j`` in a row is below
    ``ln(2**-25) ≈ -17.3``, every ``exp(x_j)`` rounds to zero and the row is ``0 / 0 = NaN``.
    Kept to show what :func:`stable_softmax` fixes; do not use it.
    """
    _check_floating(x, "naive_softmax")
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def stable_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax with the maximum subtracted first, computed in FP32, returned in ``x``'s dtype.

    ``softmax(x)_i = exp(x_i - m) / Σ_j exp(x_j - m)`` with ``m = max_j x_j``: the same value as
    the naive formula (the factor ``exp(-m)`` cancels), but every exponent is ``≤ 0``, so no
    ``exp`` overflows, and the largest term is ``exp(0) = 1``, so the sum lies in ``[1, n]``:
    neither ``inf / inf`` nor ``0 / 0`` can happen.

    The arithmetic runs in FP32 (FP64 input stays FP64) and the result is rounded once to ``x``'s
    dtype: ``torch.softmax(x.float(), dim).to(x.dtype)``. ``torch.softmax(x, dim)`` on FP16 or
    BF16 input also computes in FP32 internally, on CPU and CUDA, and agrees with this to
    within one unit in the last place of the output format. A row that is entirely ``-inf`` has
    no softmax and gives NaN, as in torch.
    """
    _check_floating(x, "stable_softmax")
    z = x.to(_wide(x.dtype))
    z = z - z.amax(dim=dim, keepdim=True)
    e = torch.exp(z)
    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)


# --- layer normalisation ----------------------------------------------------------------------
def _normalized_dims(x: torch.Tensor, normalized_shape, what: str) -> tuple[int, ...]:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or tuple(x.shape[x.dim() - len(shape):]) != shape or len(shape) > x.dim():
        raise ValueError(f"{what}: normalized_shape {shape} must be the last dimensions of the "
                         f"input, whose shape is {tuple(x.shape)}")
    return tuple(range(-len(shape), 0))


def _affine(y: torch.Tensor, weight, bias) -> torch.Tensor:
    if weight is not None:
        y = y * weight.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y


def layer_norm_fp32(x: torch.Tensor, normalized_shape, weight=None, bias=None,
                    eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm with its statistics in FP32 whatever ``x``'s dtype; the output in ``x``'s dtype.

    Over the last ``len(normalized_shape)`` dimensions::

        mean = E[x],   var = E[(x - mean)²]   (two passes: no cancellation)
        y    = (x - mean) / sqrt(var + eps) * weight + bias

    Every step runs in FP32 (FP64 input stays FP64); only ``y`` is rounded to ``x``'s dtype. This
    is ``F.layer_norm(x.float(), ...).to(x.dtype)`` up to FP32 rounding: PyTorch's kernels compute
    the statistics with Welford's algorithm and FP32 accumulators rather than two passes (in FP32
    either is accurate; what matters is FP32 statistics). CUDA autocast, where ``layer_norm`` is
    on the list of operations that run in FP32, returns FP32 instead of rounding ``y``. Compare
    :func:`layer_norm_lowp`.
    """
    _check_floating(x, "layer_norm_fp32")
    dims = _normalized_dims(x, normalized_shape, "layer_norm_fp32")
    z = x.to(_wide(x.dtype))
    mean = z.mean(dim=dims, keepdim=True)
    var = (z - mean).square().mean(dim=dims, keepdim=True)
    y = (z - mean) * torch.rsqrt(var + eps)
    return _affine(y, weight, bias).to(x.dtype)


def layer_norm_lowp(x: torch.Tensor, normalized_shape, weight=None, bias=None,
                    eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm done badly, to see why :func:`layer_norm_fp32` exists: one pass, in ``x``'s dtype.

    ``var = E[x²] - E[x]²`` (the one-pass formula), with ``x²``, both means and their difference
    stored in ``x``'s dtype. Two things go wrong:

    - *overflow*: in FP16, ``x²`` is infinite once ``|x| ≥ 255.97`` (``x² ≥ 65520``), so the
      variance is ``inf - E[x]²`` or ``inf - inf = NaN``;
    - *cancellation*: ``E[x²]`` and ``E[x]²`` are both near ``mean²``, each stored with an error
      up to ``u·mean²``; their difference ``var`` keeps those errors, a relative error of about
      ``u·mean²/var``. For inputs ``1000 ± 1`` in BF16 (``u = 2**-8``) that is ``~4000``: the
      variance is noise, and often negative (then ``sqrt`` gives NaN).

    torch's ``mean`` of an FP16 or BF16 tensor adds in FP32 internally (on CPU and CUDA) and rounds
    only the result, so the damage here comes from storing the intermediates in the low
    precision format, not from the additions.
    """
    _check_floating(x, "layer_norm_lowp")
    dims = _normalized_dims(x, normalized_shape, "layer_norm_lowp")
    mean = x.mean(dim=dims, keepdim=True)
    var = (x * x).mean(dim=dims, keepdim=True) - mean * mean
    y = (x - mean) / torch.sqrt(var + eps)
    return _affine(y, weight, bias)


# --- attention and the loss -------------------------------------------------------------------
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
              mask: torch.Tensor | None = None, scale: float | None = None,
              softmax_dtype: torch.dtype = torch.float32, mask_value: float | None = None
              ) -> torch.Tensor:
    """Scaled dot-product attention with the logits and the softmax in ``softmax_dtype``.

    ``out = softmax(q kᵀ · scale, masked) v``, with ``scale = 1/√d`` by default, for ``q`` of
    shape ``(..., Lq, d)``, ``k`` ``(..., Lk, d)``, ``v`` ``(..., Lk, dv)``, all of one dtype.

    Precision, step by step:

    - *logits*: ``q`` and ``k`` are each multiplied by ``√scale`` and their product is computed and
      kept in ``softmax_dtype`` (FP32 by default), as fused attention kernels (FlashAttention)
      keep ``q kᵀ`` in FP32 registers. Rounding the logits to FP16 instead is where attention
      overflows: a logit of 65520 or more is ``inf``, and ``inf - inf`` in the softmax is NaN.
      (Scaling before the product, as SDPA's C++ math backend does, keeps an unscaled ``q·k``,
      which is ``√d`` times larger, from ever being stored; the Python reference code in
      ``F.scaled_dot_product_attention``'s documentation scales after the product.)
    - *softmax*: :func:`stable_softmax` on the logits, in ``softmax_dtype``.
    - *weights @ v*: the weights are rounded to ``v``'s dtype and multiplied by ``v`` there.

    Masking: ``causal=True`` lets query ``i`` see keys ``j ≤ i`` (aligned at the top left, like
    ``F.scaled_dot_product_attention(is_causal=True)``); ``mask`` is a boolean tensor broadcastable
    to ``(..., Lq, Lk)``, True where a query may attend (the SDPA convention); both can be given.
    Masked logits are set to ``mask_value``, by default ``torch.finfo(softmax_dtype).min``, a
    large *finite* negative number, not ``-inf``. The two agree wherever a row has at least one
    visible key (``exp(min - max)`` is 0 either way). They differ on a row with *no* visible key
    (a padding query): with ``-inf`` the softmax computes ``-inf - (-inf) = NaN``, and that NaN
    spreads through everything downstream, gradients included; with a finite value the row
    gets equal weights, a finite output that the loss must ignore (PyTorch's SDPA, on CPU,
    returns zeros there). A
    popular ``-1e9`` is no answer in FP16: it overflows to ``-inf`` (torch refuses to store it);
    ``mask_value`` must be ``-inf`` or a number ``softmax_dtype`` can hold.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_floating(t, f"attention: {name}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"attention: q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dim() < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"attention: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                         f"{tuple(v.shape)} do not fit (..., Lq, d), (..., Lk, d), (..., Lk, dv)")
    if not softmax_dtype.is_floating_point:
        raise TypeError(f"attention: softmax_dtype must be a floating dtype, not {softmax_dtype}")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"attention: mask must be a boolean tensor (True = may attend), not {mask.dtype}")
    if mask_value is None:
        mask_value = torch.finfo(softmax_dtype).min
    elif math.isnan(mask_value) or (math.isfinite(mask_value) and
                                    abs(mask_value) > torch.finfo(softmax_dtype).max):
        raise ValueError(f"attention: mask_value {mask_value} cannot be stored in {softmax_dtype} "
                         f"(largest magnitude {torch.finfo(softmax_dtype).max:g}); use None for "
                         f"torch.finfo({softmax_dtype}).min")
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    root = math.sqrt(scale)
    logits = (q.to(softmax_dtype) * root) @ (k.to(softmax_dtype) * root).transpose(-2, -1)

    visible = mask
    if causal:
        lower = torch.ones(logits.shape[-2:], dtype=torch.bool, device=q.device).tril()
        visible = lower if visible is None else visible & lower
    if visible is not None:
        logits = logits.masked_fill(~visible, mask_value)
    weights = stable_softmax(logits, dim=-1)
    return weights.to(v.dtype) @ v


def cross_entropy_fp32(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy computed in FP32: ``mean_i ℓ_i``, ``ℓ = logsumexp(z) - z_t``.

    With ``m = max_j z_j`` reached at class ``k``, each loss is computed as::

        ℓ = (m - z_t) + log1p(Σ_{j≠k} exp(z_j - m))

    all in FP32 (FP64 input stays FP64). ``logits`` has shape ``(..., C)`` and ``targets`` holds
    class indices of shape ``(...)``. The form matters for a confident right answer: there
    ``m = z_t``, the first term is exactly 0 and the whole loss is the ``log1p`` of a small sum,
    kept to FP32's *relative* precision at any margin. The usual ``z_t - (m + log Σ_j
    exp(z_j - m))`` adds the small ``log Σ`` to the large ``m`` first and loses it: with a
    margin of 20.5 over 999 classes the loss is 1.2e-6, but ``Σ``, stored in FP32 just above 1,
    has a ``log`` of 8.3e-7, below half an ulp of 20.5 (9.5e-7), and it returns exactly 0 (an
    exact 1.2e-6 would have survived the addition). ``F.cross_entropy(logits.float(), targets)`` (``(z_t - m) - log Σ``)
    keeps such losses only to an *absolute* error of order 1e-7 to a few 1e-6: its ``Σ`` adds each
    small term to a partial sum that already holds the 1, rounding at FP32's spacing there,
    1.2e-7, and the 999 roundings add up, at random when the terms differ and all one way when
    they are equal (on a CPU, margins 12 to 20 over 999 classes: 8e-8 to 9e-7 with N(0, 1) other
    logits, up to 3.5e-6 with equal ones). The two agree only to that. Under CUDA autocast
    ``F.cross_entropy`` of 16-bit logits returns FP32 but rounds its log-probabilities to the
    logits' dtype first: it passes that dtype to ``log_softmax``, and CUDA's lists (torch 2.11,
    2.13) have ``log_softmax`` and ``nll_loss``, not ``cross_entropy`` (the CPU's has
    ``cross_entropy``: all FP32). Taking ``log`` of
    an FP16 softmax instead gives ``-inf`` for every probability below ``2**-25`` that rounded to
    zero, and an infinite loss.
    """
    _check_floating(logits, "cross_entropy_fp32")
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.dtype == torch.bool:
        raise TypeError("cross_entropy_fp32: targets must be an integer tensor of class indices")
    if logits.dim() < 1 or tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"cross_entropy_fp32: logits {tuple(logits.shape)} need targets of shape "
                         f"{tuple(logits.shape[:-1])}, got {tuple(targets.shape)}")
    classes = logits.shape[-1]
    if int(targets.min()) < 0 or int(targets.max()) >= classes:
        raise ValueError(f"cross_entropy_fp32: targets must lie in [0, {classes})")
    z = logits.to(_wide(logits.dtype))
    m, k = z.max(dim=-1, keepdim=True)
    others = torch.exp(z - m).scatter(-1, k, 0.0).sum(dim=-1)  # every class but the largest one
    z_t = z.gather(-1, targets.unsqueeze(-1).to(torch.int64))
    return ((m - z_t).squeeze(-1) + torch.log1p(others)).mean()


# --- accumulation -----------------------------------------------------------------------------
def _accumulator_dtype(fmt) -> torch.dtype:
    dtype = fmt if isinstance(fmt, torch.dtype) else ACCUMULATOR_DTYPES.get(get_format(fmt))
    if dtype not in ACCUMULATOR_DTYPES.values():
        raise ValueError(f"the running sum can be held in fp32, fp16 or bf16 (torch does their "
                         f"arithmetic), not {fmt}")
    return dtype


def _prepare(values, fmt, what: str) -> torch.Tensor:
    """``values`` checked (floating, not empty, finite) and stored in ``fmt``'s dtype."""
    _check_floating(values, what)
    dtype = _accumulator_dtype(fmt)
    if values.dim() == 0:
        raise ValueError(f"{what} sums along the last dimension; got a 0-d tensor")
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{what}: the values contain inf or NaN, so every sum of them is inf or NaN")
    return values.detach().to(dtype)


def sequential_sum(values: torch.Tensor, fmt: FloatFormat | str = "fp32", *,
                   cumulative: bool = False) -> torch.Tensor:
    """``s ← fl(s + x_i)`` for ``i = 1..n``: the running sum is rounded to ``fmt`` after each addition.

    Sums along the last dimension (the other dimensions are independent sums, computed side by
    side). Error bound (Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2)::

        |ŝ - s| ≤ γ_{n-1} · Σ|x_i|,   γ_k = k·u / (1 - k·u)

    and ``x_i`` is lost entirely once ``|x_i|`` is less than half the spacing of ``fmt``'s values
    near ``s``. One torch operation per addition: fine up to about 10**5 terms.
    """
    x = _prepare(values, fmt, "sequential_sum")
    total = torch.zeros_like(x[..., 0])
    partial_sums = []
    for term in x.unbind(dim=-1):
        total = total + term  # one addition in fmt: computed exactly, rounded once
        partial_sums.append(total)
    return torch.stack(partial_sums, dim=-1) if cumulative else total


def pairwise_sum(values: torch.Tensor, fmt: FloatFormat | str = "fp32") -> torch.Tensor:
    """Add neighbours, level by level, rounding to ``fmt`` at every level, until one value is left.

    ``[x1, x2, x3, x4, ...] → [x1 + x2, x3 + x4, ...] → ...``: each value goes through only
    ``⌈log2 n⌉`` roundings instead of up to ``n - 1``, hence the bound (Higham §4.2)::

        |ŝ - s| ≤ γ_{⌈log2 n⌉} · Σ|x_i|

    An odd level is padded with a zero (adding zero is exact). Each level is one vectorised
    addition, so this is fast; GPU reductions add in a tree of the same kind.
    """
    x = _prepare(values, fmt, "pairwise_sum")
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = F.pad(x, (0, 1))
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


def kahan_sum(values: torch.Tensor, fmt: FloatFormat | str = "fp32", *,
              cumulative: bool = False) -> torch.Tensor:
    """Compensated (Kahan) summation with the sum *and* the compensation held in ``fmt``.

    The compensation ``c`` holds (minus) the low-order part the last addition dropped, and
    feeds it back into the next term::

        y = x_i - c          # the next term, corrected
        t = s + y            # the low bits of y are lost here...
        c = (t - s) - y      # ...and recovered: (t - s) is what was really added
        s = t

    Error bound (Higham §4.3): ``|ŝ - s| ≤ (2u + O(n·u²)) · Σ|x_i|``, nearly independent of ``n``.
    Four operations per term instead of one.
    """
    x = _prepare(values, fmt, "kahan_sum")
    total = torch.zeros_like(x[..., 0])
    compensation = torch.zeros_like(total)
    partial_sums = []
    for term in x.unbind(dim=-1):
        y = term - compensation
        t = total + y
        compensation = (t - total) - y
        total = t
        partial_sums.append(total)
    return torch.stack(partial_sums, dim=-1) if cumulative else total


def accumulate(values: torch.Tensor, fmt: FloatFormat | str = "fp32", *,
               method: str = "sequential", cumulative: bool = False) -> torch.Tensor:
    """Sum ``values`` along the last dimension with the running sum held in ``fmt``.

    ``fmt`` is ``"fp32"``, ``"fp16"`` or ``"bf16"`` (or the FloatFormat, or the torch dtype).
    The values are first stored in ``fmt`` (rounded to nearest), then added with
    :func:`sequential_sum`, :func:`pairwise_sum` or :func:`kahan_sum` (``method``). The result is
    a tensor of ``fmt``'s dtype; with ``cumulative=True`` (sequential and Kahan only) every
    partial sum, the same shape as ``values``.

    Why emulate: torch's ``sum`` of an FP16 or BF16 tensor, on CPU and on CUDA, adds in FP32 and
    rounds only the result, which hides what an FP16 accumulator would do. Here each addition is
    one torch operation on tensors of ``fmt``'s dtype, which torch computes exactly and rounds
    once: the result of an FP16 or BF16 accumulator, bit for bit (computing in FP32 and rounding
    to FP16 or BF16 rounds twice, which for ``+`` and ``-`` gives the correctly rounded result
    because FP32's 24 bits are at least ``2p + 2`` for ``p = 11`` or ``8``).
    """
    if method not in ACCUMULATION_METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(ACCUMULATION_METHODS)}")
    if method == "pairwise":
        if cumulative:
            raise ValueError("pairwise summation has no running sum: cumulative=True needs "
                             "method='sequential' or 'kahan'")
        return pairwise_sum(values, fmt)
    summation = sequential_sum if method == "sequential" else kahan_sum
    return summation(values, fmt, cumulative=cumulative)
