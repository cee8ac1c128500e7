"""Block-scaled training recipes: MXFP8, NVFP4 and DeepSeek-V3's blockwise FP8.

A linear layer ``y = x @ W.T`` runs three matrix products per training step, and each one sums
over a *different* dimension (x: tokens × in, W: out × in, dy = dL/dy: tokens × out)::

    product          result            sums over (K)   operands, blocks along K
    forward          y  = x  @ W.T     in_features     x row-wise,     W row-wise
    input gradient   dx = dy @ W       out_features    dy row-wise,    W column-wise
    weight gradient  dW = dy.T @ x     tokens          dy column-wise, x column-wise

A scale must be constant along a stretch of K (see :mod:`mpcourse.fp8.matmul`), so with 1×32
blocks every operand needs the copy whose blocks run along the K of *its* product: two quantized
copies of each of x, W and dy, one "row-wise" and one "column-wise". They hold different numbers
(each block has its own maximum). Per-tensor scaling (:class:`~mpcourse.fp8.Fp8Recipe`) needs one
copy only; 2-D weight tiles (16×16, 128×128) also need one weight copy, since the transpose of a
tile is a tile with the same maximum.

A :class:`BlockRecipe` says how every operand is stored; :data:`RECIPES` holds the four names
:class:`~mpcourse.fp8.Fp8Linear` accepts, and :func:`get_recipe` turns a name into a recipe.
A dimension that is not a multiple of the block is padded with zeros before quantizing (a zero
changes no block maximum and adds nothing to a sum), and the result is cut back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mpcourse.formats import FloatFormat
from mpcourse.fp8.quantization import QuantizedTensor, quantize
from mpcourse.fp8.scaling import Fp8Recipe

GRADIENT_ROUNDINGS = ("nearest_even", "stochastic")


def _pad(t: torch.Tensor, multiples) -> torch.Tensor:
    """Zero-pad the last two dimensions of t up to multiples of ``multiples``."""
    rows, cols = (-t.shape[-2]) % multiples[0], (-t.shape[-1]) % multiples[1]
    return torch.nn.functional.pad(t, (0, cols, 0, rows)) if rows or cols else t


@dataclass(frozen=True)
class BlockRecipe:
    """How a block-scaled :class:`~mpcourse.fp8.Fp8Linear` stores each operand of each product.

    Every operand is quantized with :func:`~mpcourse.fp8.quantize` in blocks of ``block_size``
    elements along the K of its product, from the FP32 tensor, each time afresh (no history)::

        data = round_to(t * scale, fmt, saturate=True)    scale: one per block (granularity)

    Attributes:
        name: the recipe's name.
        granularity: ``"mx"`` (E8M0 power-of-two scales), ``"nvfp4"`` (E4M3 block scales and an
            FP32 tensor scale) or ``"block"`` (FP32 scales, ``fmt.max_value / amax``).
        forward_format: elements of x and W. backward_format: elements of dy.
        block_size: elements per block along K.
        weight_tile: None: W gets a row-wise and a column-wise copy in 1×block_size blocks.
            An int n: W is quantized once, in n×n tiles, and that copy serves both products.
        scale_rounding: passed to :func:`~mpcourse.fp8.quantize` (``"rceil"`` or ``"floor"`` for
            MX, ``"power_of_two"`` or None for blocks).
        gradient_rounding: how dy is rounded: ``"nearest_even"`` or ``"stochastic"`` (x and W
            are always rounded to nearest).
        hadamard_size: None, or n: before the weight-gradient product, both operands (dy.T and
            x.T, blocks along tokens) are multiplied by a random n×n Hadamard matrix H
            (:func:`hadamard_matrix`), block-diagonal along tokens. H is orthogonal, so
            ``(dy.T H) (x.T H).T = dy.T x``; H spreads an outlier over n values first.
        promote_every: FP32 promotion interval along K for :func:`~mpcourse.fp8.scaled_matmul`.
    """

    name: str
    granularity: str
    forward_format: str | FloatFormat
    backward_format: str | FloatFormat
    block_size: int
    weight_tile: int | None = None
    scale_rounding: str | None = None
    gradient_rounding: str = "nearest_even"
    hadamard_size: int | None = None
    promote_every: int | None = None

    def __post_init__(self):
        if self.gradient_rounding not in GRADIENT_ROUNDINGS:
            raise ValueError(f"unknown gradient_rounding {self.gradient_rounding!r}; choose one "
                             f"of {', '.join(GRADIENT_ROUNDINGS)}")
        if self.weight_tile is not None and self.weight_tile != self.block_size:
            raise ValueError("weight_tile must equal block_size, so that the padded K of both "
                             "operands of a product agree")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")
        if self.hadamard_size is not None:
            n = self.hadamard_size
            if not isinstance(n, int) or n < 1 or n & (n - 1) or self.block_size % n:
                raise ValueError(f"hadamard_size must be a power of two that divides block_size "
                                 f"({self.block_size}), got {n!r}")
        self.quantize_rows(torch.ones(1, self.block_size), self.forward_format)  # checks fields
        self.quantize_rows(torch.ones(1, self.block_size), self.backward_format)

    @property
    def stochastic(self) -> bool:
        return self.gradient_rounding == "stochastic"

    def quantize_rows(self, t: torch.Tensor, fmt, *, rounding: str = "nearest_even",
                      generator=None) -> QuantizedTensor:
        """t (R, K) quantized in 1×block_size blocks along K, K padded with zeros to a multiple."""
        t = _pad(t.float(), (1, self.block_size))
        return quantize(t, fmt, granularity=self.granularity, axis=-1, block_size=self.block_size,
                        scale_rounding=self.scale_rounding, rounding=rounding,
                        generator=generator if rounding == "stochastic" else None)

    def quantize_weight(self, w: torch.Tensor) -> tuple[QuantizedTensor, QuantizedTensor]:
        """W (out, in) as (row-wise copy, blocks along in; column-wise copy, blocks along out).

        Shapes (out', in') with the blocked dimensions padded. With ``weight_tile`` both are
        the same tiled copy of W, padded in both dimensions.
        """
        if self.weight_tile is not None:
            tile = (self.weight_tile, self.weight_tile)
            w_q = quantize(_pad(w.float(), tile), self.forward_format, granularity=self.granularity,
                           block_size=tile, scale_rounding=self.scale_rounding)
            return w_q, w_q
        return (self.quantize_rows(w, self.forward_format),
                self.quantize_rows(w.t(), self.forward_format).t())


#: MXFP8 (OCP Microscaling, NVIDIA's Blackwell recipe): E4M3 everywhere, 1×32 blocks, E8M0
#: scales rounded up (``"rceil"``: no block maximum saturates), the same in all three products.
MXFP8 = BlockRecipe("mxfp8", "mx", "e4m3", "e4m3", 32, scale_rounding="rceil")
#: NVFP4 (NVIDIA's FP4 pre-training recipe): E2M1 in 16-element blocks with E4M3 block scales
#: and an FP32 tensor scale; W in 16×16 tiles; stochastic rounding of dy; a 16×16 random
#: Hadamard transform on the weight-gradient operands.
NVFP4 = BlockRecipe("nvfp4", "nvfp4", "e2m1", "e2m1", 16, weight_tile=16,
                    gradient_rounding="stochastic", hadamard_size=16)
#: DeepSeek-V3: E4M3 everywhere, activations and gradients in 1×128 tiles, W in 128×128 blocks,
#: FP32 promotion every 128 along K. ``BLOCKWISE_POW2`` rounds the scales to powers of two.
BLOCKWISE = BlockRecipe("blockwise", "block", "e4m3", "e4m3", 128, weight_tile=128,
                        promote_every=128)
BLOCKWISE_POW2 = BlockRecipe("blockwise_pow2", "block", "e4m3", "e4m3", 128, weight_tile=128,
                             scale_rounding="power_of_two", promote_every=128)

RECIPES = {"hybrid": Fp8Recipe(), "mxfp8": MXFP8, "nvfp4": NVFP4, "blockwise": BLOCKWISE}


def get_recipe(recipe) -> Fp8Recipe | BlockRecipe:
    """A recipe object from a name of :data:`RECIPES`, a recipe object, or None (HYBRID)."""
    if recipe is None:
        return RECIPES["hybrid"]
    if isinstance(recipe, (Fp8Recipe, BlockRecipe)):
        return recipe
    if isinstance(recipe, str):
        if recipe not in RECIPES:
            raise ValueError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)} "
                             "(or pass an Fp8Recipe or BlockRecipe)")
        return RECIPES[recipe]
    raise TypeError(f"recipe must be a name ({', '.join(RECIPES)}), an Fp8Recipe or a "
                    f"BlockRecipe, not {type(recipe).__name__}")


def hadamard_matrix(size: int, seed: int, device=None) -> torch.Tensor:
    """A random orthogonal Hadamard matrix: ``diag(signs) @ H_size / sqrt(size)``, FP32.

    ``H_size`` is Sylvester's (H_1 = [1], H_2n = [[H, H], [H, -H]]), ``signs`` are ±1 drawn
    from ``seed`` (a CPU generator, so the same on every device). Rows and columns are
    orthonormal: ``H @ H.T = I`` up to FP32 rounding.
    """
    if size < 1 or size & (size - 1):
        raise ValueError(f"Sylvester Hadamard matrices have a power-of-two size, not {size}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.randint(0, 2, (size,), generator=torch.Generator().manual_seed(int(seed)))
    h = (1 - 2 * signs.double())[:, None] * h / size**0.5
    return h.float().to(device)


def apply_hadamard(t: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """t (R, K) times block-diagonal H along K (K padded with zeros to a multiple of H).

    Computed in float64 and rounded once to float32, so that the result does not depend on the
    order a BLAS library sums in (nor on the device).
    """
    n = h.shape[0]
    t = _pad(t.double(), (1, n))
    R, K = t.shape
    with torch.autocast(t.device.type, enabled=False):
        return (t.reshape(R, K // n, n) @ h.double()).reshape(R, K).float()
