"""Block scales that are themselves tiny numbers: OCP Microscaling (MX) and NVIDIA's NVFP4.

A per-block scale only pays off if storing it is cheap. MX and NVFP4 store one 8-bit scale per
small block of elements along the dimension a matrix product sums over:

=========  =========  ==========  ===================  =================================
format     elements   block size  block scale          extra
=========  =========  ==========  ===================  =================================
MXFP8      E4M3/E5M2  32          E8M0 (a power of 2)  --
MXFP6      E3M2/E2M3  32          E8M0                 --
MXFP4      E2M1       32          E8M0                 --
NVFP4      E2M1       16          E4M3                 one FP32 scale per tensor
=========  =========  ==========  ===================  =================================

This module computes those scales in the form the hardware stores them. Here, as there, they
*decode*: ``x ≈ element × 2**E`` (MX), ``x ≈ element × block_scale × tensor_scale`` (NVFP4).
:func:`mpcourse.fp8.quantize` turns them into its multiplying ``scale`` (``2**-E``, and
``1 / (block_scale × tensor_scale)``).

**MX shared exponent** (OCP Microscaling Formats v1.0, section 6.3). With ``emax`` the exponent
of the element format's largest normal number (E4M3: 8, E5M2: 15, E3M2: 4, E2M3 and E2M1: 2)::

    "floor" (the spec):  E = floor(log2(amax)) - emax
    "rceil":             E = ceil(log2(amax / fmt.max_value)), the smallest integer with
                         amax / 2**E <= fmt.max_value

``"floor"`` maps the block maximum into ``[2**emax, 2**(emax+1))``, the top binade of the
element format, but the format's largest value sits below the top of that binade (E4M3: 448, not
511), so block maxima in between saturate: up to 12.5 % error for E4M3, 25 % for E2M1 (6 versus
7.99). ``"rceil"`` goes one binade up exactly when that would happen, so nothing saturates, at
the price of one bit of headroom in those blocks; NVIDIA's MXFP8 training recipe rounds up this
way, and cuBLAS and torchao call it RCEIL. (torchao's ``CEIL`` is another rule,
``E = ceil(log2(amax)) - emax``, which moves every block whose maximum is not a power of two up a
binade: for amax 300 in E4M3 it gives E = 1 where RCEIL gives 0. This library has no "ceil",
so that neither name is taken for the other.) E is clamped to E8M0's range [-127, 127]; its
code is ``E + 127``.

**NVFP4** (NVIDIA's recipe; the FP4 formula in Transformer Engine and torchao)::

    tensor_scale = amax(x) / (448 * 6)                  # FP32: E4M3 max × E2M1 max
    block_scale  = E4M3(amax(block) / 6 / tensor_scale) # at most 448, by construction

so the block holding the tensor's maximum gets block scale 448 and the others spread over
E4M3's range below it; the element is ``E2M1(x / (block_scale × tensor_scale))``. Rounding the
block scale to nearest can round it down, so a block's maximum may saturate at 6, by at most
half an E4M3 step (6.25 % where the block scale is a normal E4M3 number).

All-zero blocks get the decoding scale 1.0 (E = 0, E8M0 code 127; NVFP4 block scale 1.0, and an
all-zero tensor the tensor scale 1.0): any finite scale stores zeros exactly, and no NaN appears.
"""
import torch

from mpcourse.formats import E2M1, E2M3, E3M2, E4M3, E5M2, FloatFormat, exact_pow2, round_to

MX_ELEMENT_FORMATS = (E4M3, E5M2, E3M2, E2M3, E2M1)
MX_SCALE_ROUNDINGS = ("floor", "rceil")
E8M0_BIAS = 127


def mx_shared_exponent(amax: torch.Tensor, fmt: FloatFormat, rounding: str = "floor") -> torch.Tensor:
    """The shared exponent E of each MX block (int32), from the block maxima ``amax`` (float32).

    The block is stored as elements ``x / 2**E``; see the module docstring for the two rules.
    """
    if rounding == "ceil":
        raise ValueError('"ceil" is ambiguous: torchao\'s CEIL is E = ceil(log2(amax)) - emax, while the rule '
                         'that never saturates and moves a block only when it would is "rceil" (RCEIL, as '
                         'NVIDIA, cuBLAS and torchao name it); choose "floor" or "rceil"')
    if rounding not in MX_SCALE_ROUNDINGS:
        raise ValueError(f"unknown MX scale rounding {rounding!r}; choose one of "
                         f"{', '.join(MX_SCALE_ROUNDINGS)}")
    amax = amax.double()  # so that amax / 2**E below is exact, whatever E is
    exponent = torch.frexp(amax).exponent - 1  # amax in [2**exponent, 2**(exponent + 1))
    shared = exponent - fmt.emax
    if rounding == "rceil":  # one binade up where the block maximum would saturate
        shared = shared + (amax * exact_pow2(torch.clamp(-shared, -1022, 1023)) > fmt.max_value).int()
    shared = torch.where(amax > 0, shared, 0)
    return shared.clamp(-E8M0_BIAS, E8M0_BIAS).int()


def nvfp4_scales(block_amax: torch.Tensor, tensor_amax: torch.Tensor):
    """NVFP4's two decoding scales: (E4M3 block scales as float32 values, the FP32 tensor scale).

    ``tensor_scale = tensor_amax / (448 * 6)`` and ``block_scale = E4M3(block_amax / 6 /
    tensor_scale)``, kept within [E4M3's smallest subnormal, 448] so that no non-zero block gets
    a zero scale; all-zero blocks (and an all-zero tensor) get 1.0.
    """
    tensor_scale = tensor_amax / (E4M3.max_value * E2M1.max_value)
    tensor_scale = torch.where(tensor_scale > 0, tensor_scale, 1.0)
    wanted = (block_amax / E2M1.max_value) / tensor_scale
    wanted = torch.where(block_amax > 0, wanted.clamp(E4M3.min_subnormal, E4M3.max_value), 1.0)
    return round_to(wanted, E4M3), tensor_scale
