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
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from mpcourse.fp8.matmul import scaled_matmul
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


class Fp8Linear(nn.Linear):
    """A drop-in :class:`torch.nn.Linear` whose three matrix products run in FP8.

    Same ``weight`` and ``bias`` parameters (FP32) and state dict as ``nn.Linear``; what changes
    is ``forward`` and its gradient (see the module docstring). Trainable on a CPU: the FP8
    products run through :func:`~mpcourse.fp8.scaled_matmul` (``torch._scaled_mm`` where
    available, else the exact emulation). The amax histories are not part of the state dict.

    Args:
        in_features, out_features, bias, device, dtype: as for ``nn.Linear``.
        recipe: an :class:`~mpcourse.fp8.Fp8Recipe` (default: delayed scaling, E4M3 forward,
            E5M2 backward, history 16, amax "max", margin 0).

    Attributes:
        input_scaling, weight_scaling, grad_output_scaling: the three scalings, each with its
            own state (:class:`~mpcourse.fp8.DelayedScaling` or
            :class:`~mpcourse.fp8.CurrentScaling`).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: Fp8Recipe | None = None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = recipe if recipe is not None else Fp8Recipe()
        if not isinstance(self.recipe, Fp8Recipe):
            raise TypeError(f"recipe must be an Fp8Recipe, not {type(self.recipe).__name__}")
        self.input_scaling = self.recipe.make_scaling(self.recipe.forward_format)
        self.weight_scaling = self.recipe.make_scaling(self.recipe.forward_format)
        self.grad_output_scaling = self.recipe.make_scaling(self.recipe.backward_format)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Fp8Recipe | None = None) -> Fp8Linear:
        """An Fp8Linear that shares ``linear``'s parameters (the same tensors, not copies)."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                    recipe=recipe, device="meta")
        layer.weight = linear.weight
        layer.bias = linear.bias
        layer.train(linear.training)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1:] != (self.in_features,):
            raise ValueError(f"expected input (..., {self.in_features}), got {tuple(x.shape)}")
        return _Fp8LinearFunction.apply(x, self.weight, self.bias, self)

    def extra_repr(self) -> str:
        r = self.recipe
        return (f"{super().extra_repr()}, scaling={r.scaling}, "
                f"forward={r.forward_format}, backward={r.backward_format}")


def convert_to_fp8(model: nn.Module, recipe: Fp8Recipe | None = None,
                   skip: Iterable[str] | Callable[[str, nn.Module], bool] = ()) -> nn.Module:
    """Swap every ``nn.Linear`` of ``model`` for an :class:`Fp8Linear`, in place; returns model.

    (A model that is itself an ``nn.Linear`` cannot change class in place: the new layer is
    returned instead.)

    The new layers share the old ones' parameters, so weights (and an optimizer built on them)
    are preserved. Each layer gets its own scalings from ``recipe``.

    Args:
        skip: layers to keep in full precision, e.g. the output layer, as Transformer Engine
            advises for the first and last layers: qualified names as in
            ``model.named_modules()`` (``"head"``, ``"blocks.0.mlp.fc1"``), or a function
            ``(name, module) -> bool``.
    """
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
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, Fp8Linear.from_linear(module, recipe))
    return model
