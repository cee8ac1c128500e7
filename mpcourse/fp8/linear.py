"""An FP8 linear layer that trains: three FP8 matrix products per step, master weights in FP32.

``y = x @ W.T + b`` costs three matrix products per training step, and each runs in FP8 with
FP32 accumulation, each operand quantized per tensor by its own scaling (:class:`Fp8Recipe`)::

    forward          y      = x_q  @ W_q.T     x, W in E4M3 (precision)
    input gradient   dL/dx  = g_q  @ W_q       g = dL/dy in E5M2 (range)
    weight gradient  dL/dW  = g_q.T @ x_q

The FP8 copies live for one step only: the parameters stay FP32 (what the optimizer updates),
the bias is added in FP32, and its gradient is the FP32 sum of g. The quantized x and W of the
forward pass are kept for the backward pass, as Transformer Engine does; g is quantized once per
backward pass. Each scaling therefore records one amax per step: input and weight in the forward
pass, grad_output in the backward pass.

With a block-scaled recipe (``recipe="mxfp8"``, ``"nvfp4"``, ``"blockwise"``, a
:class:`~mpcourse.fp8.recipes.BlockRecipe`) every product takes operands quantized in blocks
along *its own* summed dimension (see :mod:`mpcourse.fp8.recipes`)::

    forward          y  = Q(x) @ Q(W).T          blocks along in_features
    input gradient   dx = Q(dy) @ Q'(W)          blocks along out_features (W column-wise)
    weight gradient  dW = Q'(dy H).T @ Q'(x H)   blocks along tokens (H: Hadamard, NVFP4 only)

x is kept in FP32 for the backward pass, where its column-wise copy is made (Transformer Engine
makes both copies in the forward pass: the same numbers). Stochastic rounding draws from a
generator seeded by the layer's buffers ``sr_seed`` and ``sr_step`` (one step per backward pass:
first the row-wise dy, then the column-wise one), and H from ``hadamard_seed``: they are in the
state dict, so a checkpoint resumes bit-identically.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from mpcourse.fp8.matmul import scaled_matmul
from mpcourse.fp8.recipes import BlockRecipe, apply_hadamard, get_recipe, hadamard_matrix
from mpcourse.fp8.scaling import Fp8Recipe


class _Fp8LinearFunction(torch.autograd.Function):
    """y = x @ W.T + b with FP8 products forward and backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        x2d = x.reshape(-1, x.shape[-1])
        x_q = layer.input_scaling.quantize(x2d)
        w_q = layer.weight_scaling.quantize(weight)
        y = scaled_matmul(x_q, w_q.t())
        if bias is not None:
            y = y + bias.float()
        ctx.x_q, ctx.w_q, ctx.layer = x_q, w_q, layer  # FP8 copies kept for the backward pass
        ctx.x_shape, ctx.param_dtype = x.shape, weight.dtype
        return y.reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        g2d = grad_y.reshape(-1, grad_y.shape[-1])
        g_q = ctx.layer.grad_output_scaling.quantize(g2d)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = scaled_matmul(g_q, ctx.w_q).reshape(ctx.x_shape).to(grad_y.dtype)
        if ctx.needs_input_grad[1]:
            grad_w = scaled_matmul(g_q.t(), ctx.x_q).to(ctx.param_dtype)
        if ctx.needs_input_grad[2]:
            grad_b = g2d.float().sum(0).to(ctx.param_dtype)
        return grad_x, grad_w, grad_b, None


class _BlockLinearFunction(torch.autograd.Function):
    """y = x @ W.T + b, each product with operands in blocks along its own K (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        r: BlockRecipe = layer.recipe
        x2d = x.reshape(-1, x.shape[-1])
        w_row, w_col = r.quantize_weight(weight)
        x_row = r.quantize_rows(x2d, r.forward_format)
        y = scaled_matmul(x_row, w_row.t(), promote_every=r.promote_every)[:, :weight.shape[0]]
        if bias is not None:
            y = y + bias.float()
        ctx.save_for_backward(x2d)
        ctx.w_col, ctx.layer = w_col, layer
        ctx.x_shape, ctx.param_dtype = x.shape, weight.dtype
        return y.reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        (x2d,) = ctx.saved_tensors
        layer, r = ctx.layer, ctx.layer.recipe
        g2d = grad_y.reshape(-1, grad_y.shape[-1]).float()
        tokens, in_features = x2d.shape
        generator = layer.gradient_generator(g2d.device) if r.stochastic else None
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            g_row = r.quantize_rows(g2d, r.backward_format, rounding=r.gradient_rounding,
                                    generator=generator)
            grad_x = scaled_matmul(g_row, ctx.w_col, promote_every=r.promote_every)
            grad_x = grad_x[:, :in_features].reshape(ctx.x_shape).to(grad_y.dtype)
        if ctx.needs_input_grad[1]:
            g_t, x_t = g2d.t(), x2d.t().float()  # (out, tokens), (in, tokens): K = tokens
            if r.hadamard_size:
                h = layer.hadamard(g2d.device)
                g_t, x_t = apply_hadamard(g_t, h), apply_hadamard(x_t, h)
            g_col = r.quantize_rows(g_t, r.backward_format, rounding=r.gradient_rounding,
                                    generator=generator)
            x_col = r.quantize_rows(x_t, r.forward_format).t()
            grad_w = scaled_matmul(g_col, x_col, promote_every=r.promote_every)
            grad_w = grad_w[:, :in_features].to(ctx.param_dtype)
        if ctx.needs_input_grad[2]:
            grad_b = g2d.sum(0).to(ctx.param_dtype)
        return grad_x, grad_w, grad_b, None


def stochastic_rounding_seed(sr_seed: int, step: int) -> int:
    """The generator seed of backward pass ``step`` of a layer with buffer ``sr_seed``.

    Kept below 2**32: torch's CPU generator keeps only a seed's low 32 bits, so a seed such as
    ``sr_seed * 2**32 + step`` would give every layer the same draws. Multiplying by a large odd
    constant (Knuth's multiplicative hash) spreads the layers' seeds far apart.
    """
    return (sr_seed * 0x9E3779B1 + step) % 2**32


class Fp8Linear(nn.Linear):
    """A drop-in :class:`torch.nn.Linear` whose three matrix products run in FP8.

    Same ``weight`` and ``bias`` parameters (FP32) and state dict as ``nn.Linear`` (plus three
    int64 buffers with NVFP4, see below); what changes is ``forward`` and its gradient (see the
    module docstring). Trainable on a CPU: the FP8
    products run through :func:`~mpcourse.fp8.scaled_matmul` (PyTorch's ``scaled_mm`` on an FP8
    GPU, else the exact emulation). The amax histories are not part of the state dict.

    Args:
        in_features, out_features, bias, device, dtype: as for ``nn.Linear``.
        recipe: an :class:`~mpcourse.fp8.Fp8Recipe` (default: delayed scaling, E4M3 forward,
            E5M2 backward, history 16, amax "max", margin 0), a
            :class:`~mpcourse.fp8.recipes.BlockRecipe`, or a name: ``"hybrid"`` (the default),
            ``"mxfp8"``, ``"nvfp4"``, ``"blockwise"``.
        seed: seeds the stochastic rounding and the Hadamard matrix of recipes that use them
            (:func:`convert_to_fp8` gives each layer its own).

    Attributes:
        input_scaling, weight_scaling, grad_output_scaling: the three scalings, each with its
            own state (:class:`~mpcourse.fp8.DelayedScaling` or
            :class:`~mpcourse.fp8.CurrentScaling`); None with a block recipe (no state: every
            block is scaled by its own amax).
        sr_seed, sr_step, hadamard_seed: int64 buffers (in the state dict), for recipes with
            stochastic rounding or a Hadamard transform only.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: Fp8Recipe | BlockRecipe | str | None = None, seed: int = 0,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = get_recipe(recipe)
        self.input_scaling = self.weight_scaling = self.grad_output_scaling = None
        if isinstance(self.recipe, Fp8Recipe):
            self.input_scaling = self.recipe.make_scaling(self.recipe.forward_format)
            self.weight_scaling = self.recipe.make_scaling(self.recipe.forward_format)
            self.grad_output_scaling = self.recipe.make_scaling(self.recipe.backward_format)
        elif self.recipe.stochastic or self.recipe.hadamard_size:
            if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
                raise ValueError(f"seed must be an int in [0, 2**31), got {seed!r}")
            buffer_device = device if device != "meta" else None
            for name, value in (("sr_seed", seed), ("sr_step", 0), ("hadamard_seed", seed)):
                self.register_buffer(name, torch.tensor(value, dtype=torch.int64,
                                                        device=buffer_device))

    def gradient_generator(self, device) -> torch.Generator:
        """The stochastic-rounding generator of this backward pass; advances ``sr_step``."""
        seed = stochastic_rounding_seed(int(self.sr_seed), int(self.sr_step))
        generator = torch.Generator(device).manual_seed(seed)
        self.sr_step += 1
        return generator

    def hadamard(self, device) -> torch.Tensor:
        """The layer's random Hadamard matrix (from ``hadamard_seed``)."""
        return hadamard_matrix(self.recipe.hadamard_size, int(self.hadamard_seed), device)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe=None, seed: int = 0) -> Fp8Linear:
        """An Fp8Linear that shares ``linear``'s parameters (the same tensors, not copies)."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                    recipe=recipe, seed=seed, device="meta")
        layer.weight = linear.weight
        layer.bias = linear.bias
        layer.to(linear.weight.device)  # the buffers (the parameters are already there)
        layer.train(linear.training)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1:] != (self.in_features,):
            raise ValueError(f"expected input (..., {self.in_features}), got {tuple(x.shape)}")
        if isinstance(self.recipe, BlockRecipe):
            return _BlockLinearFunction.apply(x, self.weight, self.bias, self)
        return _Fp8LinearFunction.apply(x, self.weight, self.bias, self)

    def extra_repr(self) -> str:
        r = self.recipe
        if isinstance(r, BlockRecipe):
            return f"{super().extra_repr()}, recipe={r.name}"
        return (f"{super().extra_repr()}, scaling={r.scaling}, "
                f"forward={r.forward_format}, backward={r.backward_format}")


def convert_to_fp8(model: nn.Module, recipe: Fp8Recipe | BlockRecipe | str | None = None,
                   skip: Iterable[str] | Callable[[str, nn.Module], bool] = ()) -> nn.Module:
    """Swap every ``nn.Linear`` of ``model`` for an :class:`Fp8Linear`, in place; returns model.

    (A model that is itself an ``nn.Linear`` cannot change class in place: the new layer is
    returned instead.)

    The new layers share the old ones' parameters, so weights (and an optimizer built on them)
    are preserved. Each layer gets its own scalings from ``recipe`` (a recipe object or a name,
    as for :class:`Fp8Linear`), and its own seed: its position among the converted layers.

    Args:
        skip: layers to keep in full precision, e.g. the output layer, as Transformer Engine
            advises for the first and last layers: qualified names as in
            ``model.named_modules()`` (``"head"``, ``"blocks.0.mlp.fc1"``), or a function
            ``(name, module) -> bool``.
    """
    recipe = get_recipe(recipe)  # an unknown name fails before anything changes
    if callable(skip):
        should_skip = skip
    else:
        names = {skip} if isinstance(skip, str) else set(skip)
        known = {name for name, _ in model.named_modules()}
        if names - known:
            raise ValueError(f"skip names no module of this model: {sorted(names - known)}")
        should_skip = lambda name, module: name in names  # noqa: E731

    if isinstance(model, nn.Linear) and not isinstance(model, Fp8Linear) and not should_skip("", model):
        return Fp8Linear.from_linear(model, recipe)
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and not isinstance(module, Fp8Linear)
               and not should_skip(name, module)]
    for seed, (name, module) in enumerate(targets):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, Fp8Linear.from_linear(module, recipe, seed=seed))
    return model
