"""mpcourse.numerics, proven against the real thing: torch.softmax, F.layer_norm,
F.scaled_dot_product_attention and F.cross_entropy in FP32 and FP64; the FP16 overflow threshold
derived from the format; step-by-step NumPy/ml_dtypes loops for the emulated accumulators (bit
for bit), exact rational sums, and the textbook error bounds."""
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mpcourse.formats import BF16, FP16, FP32, round_scalar
from mpcourse.numerics import (accumulate, attention, cross_entropy_fp32, kahan_sum,
                               layer_norm_fp32, layer_norm_lowp, naive_softmax, pairwise_sum,
                               sequential_sum, stable_softmax)

NUMPY_DTYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp32": np.float32}
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
UNIT_ROUNDOFF = {"fp16": FP16.epsilon / 2, "bf16": BF16.epsilon / 2, "fp32": FP32.epsilon / 2}


def gamma(k: int, u: float) -> float:
    """Higham's γ_k = k·u / (1 - k·u), the constant of the summation error bounds."""
    return k * u / (1 - k * u)


def fp16_ulp(values: torch.Tensor) -> torch.Tensor:
    """Spacing of FP16 values at |values| (2**-24 in the subnormal range)."""
    exponent = torch.floor(torch.log2(values.abs().double().clamp(min=FP16.min_normal)))
    return torch.exp2(exponent - FP16.mantissa_bits)


# --- softmax ----------------------------------------------------------------------------------
def test_stable_softmax_matches_torch_softmax_in_fp32_and_fp64():
    x = torch.randn(64, 100, generator=torch.Generator().manual_seed(0)) * 5
    ours, theirs = stable_softmax(x), torch.softmax(x, dim=-1)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=8 * FP32.epsilon, atol=0)
    x64 = x.double()
    torch.testing.assert_close(stable_softmax(x64, dim=0), torch.softmax(x64, dim=0),
                               rtol=1e-14, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_stable_softmax_returns_the_input_dtype_within_one_ulp_of_torch(dtype):
    x = (torch.randn(32, 50, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    ours = stable_softmax(x)
    assert ours.dtype == dtype
    spacing = torch.finfo(dtype).eps  # relative spacing 2**-M
    reference = torch.softmax(x, dim=-1).double()
    assert bool(((ours.double() - reference).abs() <= spacing * reference + 2.0**-24).all())


def test_stable_fp16_softmax_survives_inputs_that_break_the_naive_one():
    rows = torch.tensor([[12.0, 0.0, -1.0], [100.0, 99.0, 0.0], [-20.0, -21.0, -30.0],
                         [10.0, 10.0, 10.0]], dtype=torch.float16)
    naive, stable = naive_softmax(rows), stable_softmax(rows)
    # Row 0: exp(12) overflows; row 1 too; row 2: every exp underflows to 0 (0/0); row 3: each
    # exp(10) ≈ 22026 is finite but their sum is not.
    assert bool(torch.isnan(naive[:3]).any(dim=1).all())
    assert bool((naive[3] == 0).all())
    assert bool(torch.isfinite(stable).all())
    exact = torch.softmax(rows.double(), dim=-1)
    assert bool(((stable.double() - exact).abs() <= fp16_ulp(exact)).all())


def test_the_smallest_fp16_input_whose_exp_overflows_is_the_first_above_ln_65520():
    # Theory: FP16 rounds to inf from halfway between its largest value and the next power of two.
    half_ulp_at_max = 2.0 ** (FP16.emax - FP16.mantissa_bits - 1)
    boundary = FP16.max_value + half_ulp_at_max
    assert boundary == 65520
    assert round_scalar(boundary, FP16) == math.inf
    assert round_scalar(math.nextafter(boundary, 0), FP16) == FP16.max_value
    values = FP16.values().astype(np.float64)
    predicted = values[values > math.log(boundary)].min()
    # Search: every positive finite FP16 value through torch's FP16 exp.
    positive = torch.from_numpy(values[values > 0]).half()
    overflowing = positive[torch.isinf(torch.exp(positive))]
    found = overflowing.min().item()
    assert found == predicted == 11.09375
    below = positive[positive < found].max()
    assert torch.isfinite(naive_softmax(torch.stack([below, torch.zeros_like(below)]))).all()
    assert torch.isnan(naive_softmax(torch.tensor([found, 0.0], dtype=torch.float16))).any()


def test_softmax_rejects_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        stable_softmax(torch.arange(4))
    with pytest.raises(ValueError, match="empty"):
        naive_softmax(torch.zeros(0))
    with pytest.raises(TypeError, match="torch tensor"):
        stable_softmax([1.0, 2.0])


# --- layer normalisation ----------------------------------------------------------------------
def test_layer_norm_fp32_matches_torch_layer_norm():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 8, generator=g) * 3 + 2
    weight, bias = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    torch.testing.assert_close(layer_norm_fp32(x, (6, 8), weight, bias),
                               F.layer_norm(x, (6, 8), weight, bias), rtol=1e-5, atol=1e-5)
    x16 = x.half()
    out = layer_norm_fp32(x16, 8)
    assert out.dtype == torch.float16
    assert torch.equal(out, F.layer_norm(x16.double(), (8,)).half())


def test_one_pass_low_precision_layer_norm_breaks_where_fp32_statistics_do_not():
    g = torch.Generator().manual_seed(3)
    x = 1000 + torch.randn(8, 256, generator=g)
    x16 = x.half()  # x² ≈ 10**6 overflows FP16
    assert bool(torch.isnan(layer_norm_lowp(x16, 256)).all())
    reference = F.layer_norm(x16.double(), (256,))
    assert bool(((layer_norm_fp32(x16, 256).double() - reference).abs() < 0.01).all())
    # BF16 does not overflow, but E[x²] - E[x]² cancels: inputs 100 ± 1 (u·mean²/var ≈ 40).
    xb = (100 + torch.randn(8, 256, generator=g)).bfloat16()
    reference = F.layer_norm(xb.double(), (256,))
    lowp_error = (layer_norm_lowp(xb, 256).double() - reference).abs().nan_to_num(math.inf).max()
    fp32_error = (layer_norm_fp32(xb, 256).double() - reference).abs().max()
    assert fp32_error < 0.05 < lowp_error


def test_layer_norm_rejects_a_shape_that_is_not_the_trailing_one():
    with pytest.raises(ValueError, match="last dimensions"):
        layer_norm_fp32(torch.randn(4, 8), 4)
    with pytest.raises(ValueError, match="last dimensions"):
        layer_norm_lowp(torch.randn(8), (2, 8))


# --- attention and the loss -------------------------------------------------------------------
def qkv(*shape, dtype=torch.float32, seed=4, lk=None):
    g = torch.Generator().manual_seed(seed)
    lq, d = shape[-2], shape[-1]
    lk = lq if lk is None else lk
    q = torch.randn(*shape[:-2], lq, d, generator=g)
    k = torch.randn(*shape[:-2], lk, d, generator=g)
    v = torch.randn(*shape[:-2], lk, d, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("lk", [7, 11])
def test_attention_matches_scaled_dot_product_attention_in_fp32(lk):
    q, k, v = qkv(2, 3, 7, 16, lk=lk)
    torch.testing.assert_close(attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    mask = torch.rand(2, 1, 7, lk, generator=torch.Generator().manual_seed(5)) > 0.4
    mask[..., 0] = True  # every query sees at least one key
    torch.testing.assert_close(attention(q, k, v, causal=False, mask=mask, scale=0.3),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3))


def test_a_fully_masked_row_is_finite_with_the_default_mask_value_and_nan_with_minus_inf():
    q, k, v = qkv(1, 5, 8)
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[2] = False  # query 2 (a padding position) sees nothing
    for dtype in (torch.float32, torch.float16):
        out = attention(q, k, v, causal=False, mask=mask, softmax_dtype=dtype)
        assert bool(torch.isfinite(out).all())
        # Equal weights on every key (1/5, rounded to FP16 in the FP16 case).
        torch.testing.assert_close(out[0, 2], v[0].mean(dim=0), rtol=0, atol=1e-3)
        visible = [0, 1, 3, 4]
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(out[0, visible], reference[0, visible], rtol=2e-3, atol=2e-3)
    with_inf = attention(q, k, v, causal=False, mask=mask, mask_value=-math.inf)
    assert bool(torch.isnan(with_inf[0, 2]).all()) and bool(torch.isfinite(with_inf[0, :2]).all())


def test_fp16_logits_overflow_and_fp32_logits_do_not():
    q, k, v = qkv(1, 6, 64, dtype=torch.float16)
    q[..., 0], k[..., 0] = 1000.0, 1000.0  # a planted outlier feature: q·k/√d ≈ 125000 > 65504
    bad = attention(q, k, v, softmax_dtype=torch.float16)
    good = attention(q, k, v)
    assert bool(torch.isnan(bad).any())
    assert bool(torch.isfinite(good).all())
    # Against torch's attention on the same values in FP32 (not FP64: logits near 10**5 carry
    # FP32 rounding errors of ~0.01 in any FP32 implementation); the rest is FP16 output rounding.
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(good.float(), reference, rtol=0, atol=4e-3)


def test_attention_rejects_bad_input():
    q, k, v = qkv(1, 4, 8)
    with pytest.raises(ValueError, match="cannot be stored"):
        attention(q.half(), k.half(), v.half(), softmax_dtype=torch.float16, mask_value=-1e9)
    with pytest.raises(TypeError, match="one dtype"):
        attention(q, k.half(), v)
    with pytest.raises(ValueError, match="do not fit"):
        attention(q, k[..., :4], v)
    with pytest.raises(TypeError, match="boolean"):
        attention(q, k, v, mask=torch.ones(4, 4))


def test_cross_entropy_fp32_matches_torch_and_survives_fp16_logits():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 16, 10, generator=g) * 30
    targets = torch.randint(0, 10, (3, 16), generator=g)
    expected = F.cross_entropy(logits.reshape(-1, 10), targets.reshape(-1))
    torch.testing.assert_close(cross_entropy_fp32(logits, targets), expected)
    loss16 = cross_entropy_fp32(logits.half(), targets)
    assert loss16.dtype == torch.float32
    torch.testing.assert_close(loss16, F.cross_entropy(logits.half().double().reshape(-1, 10),
                                                       targets.reshape(-1)).float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("margin", [20.5, 22.0])
def test_cross_entropy_fp32_keeps_small_losses_of_confident_right_answers(margin, dtype):
    """The target wins by ``margin`` over 999 classes at 0: the loss is log(1 + 999 e^-margin),
    about 1.2e-6 at 20.5, which z_t - (m + log Σ) rounds to exactly 0 (FP32's log Σ is 8.3e-7,
    below half an ulp of 20.5). Compared with the same logits in float64, and never worse than F.cross_entropy."""
    logits = torch.zeros(2, 1000)
    logits[0, 0] = logits[1, 3] = margin
    logits = logits.to(dtype)
    targets = torch.tensor([0, 3])
    exact = F.cross_entropy(logits.double(), targets).item()
    assert exact == pytest.approx(math.log1p(999 * math.exp(-margin)), rel=1e-9)
    loss = cross_entropy_fp32(logits, targets)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(exact, rel=1e-5)
    torch_error = abs(F.cross_entropy(logits.float(), targets).item() - exact)
    assert abs(loss.item() - exact) <= torch_error + 1e-6 * exact


def test_cross_entropy_fp32_docstring_gives_the_mechanism_that_loses_the_usual_form():
    """Margin 20.5 over 999 classes: the exact loss, 1.2e-6, is above half an ulp of 20.5, so an
    exact log Σ would survive m + log Σ; what loses it is FP32's log of Σ stored just above 1,
    8.3e-7, below half an ulp. The docstring states those numbers."""
    z = torch.zeros(1000)
    z[0] = 20.5
    m = z.max()
    log_sum = torch.exp(z - m).sum().log()
    half_ulp = (torch.nextafter(m, torch.tensor(21.0)) - m).item() / 2
    exact = math.log1p(999 * math.exp(-20.5))
    assert exact > half_ulp and (m + torch.tensor(exact)).item() > 20.5
    assert log_sum.item() < half_ulp and (z[0] - (m + log_sum)).item() == 0
    doc = " ".join(cross_entropy_fp32.__doc__.split())
    for value in (exact, log_sum.item(), half_ulp):
        assert f"{value:.1e}".replace("e-0", "e-") in doc


def test_cross_entropy_fp32_at_every_margin_and_in_float64():
    """Right and wrong answers, margins 0 to 100, against the losses in float64 (written with
    log1p: float64's own F.cross_entropy loses relative accuracy below 1e-10): within FP32
    rounding (1e-6 relative); a target at -inf costs an infinite loss, as in F.cross_entropy,
    not NaN."""
    margins = torch.arange(0.0, 100.0, 0.5)
    right = torch.zeros(len(margins), 50)
    right[:, 7] = margins
    wrong = torch.zeros(len(margins), 50)
    wrong[:, 8] = margins
    targets = torch.full((len(margins),), 7)
    for logits, exact in ((right, lambda m: math.log1p(49 * math.exp(-m))),
                          (wrong, lambda m: m + math.log1p(49 * math.exp(-m)))):
        for row, m in zip(logits, margins.tolist()):
            assert cross_entropy_fp32(row[None], targets[:1]).item() == pytest.approx(exact(m), rel=1e-6)
    assert cross_entropy_fp32(right.double(), targets).dtype == torch.float64
    masked = torch.tensor([[-math.inf, 0.0, 1.0]])
    assert cross_entropy_fp32(masked, torch.tensor([0])).item() == math.inf
    assert cross_entropy_fp32(masked, torch.tensor([2])).item() == pytest.approx(math.log1p(math.exp(-1.0)))


def test_cross_entropy_fp32_rejects_bad_targets():
    logits = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        cross_entropy_fp32(logits, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="shape"):
        cross_entropy_fp32(logits, torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="integer"):
        cross_entropy_fp32(logits, torch.zeros(4))


# --- accumulation: bit for bit against step-by-step NumPy/ml_dtypes loops -----------------------
def numpy_sequential(values: np.ndarray, dtype) -> list:
    """Every partial sum of values (already in dtype), each addition rounded to dtype."""
    total, partial = dtype(0), []
    for x in values:
        total = dtype(total + x)
        partial.append(total)
    return partial


def numpy_kahan(values: np.ndarray, dtype):
    total, compensation = dtype(0), dtype(0)
    for x in values:
        y = dtype(x - compensation)
        t = dtype(total + y)
        compensation = dtype(dtype(t - total) - y)
        total = t
    return total


def numpy_pairwise(values: np.ndarray, dtype):
    x = values
    while len(x) > 1:
        if len(x) % 2:
            x = np.append(x, dtype(0))
        x = (x[0::2] + x[1::2]).astype(dtype)
    return x[0]


def exact_sum(values: np.ndarray) -> Fraction:
    return sum((Fraction(float(v)) for v in values), Fraction(0))


def stored(values: torch.Tensor, fmt: str) -> np.ndarray:
    """The values as fmt stores them, as NumPy/ml_dtypes scalars."""
    return values.float().numpy().astype(NUMPY_DTYPES[fmt])


def test_sequential_fp16_sum_of_0_01_matches_an_ml_dtypes_loop_bit_for_bit():
    values = torch.full((4000,), 0.01)
    expected = numpy_sequential(stored(values, "fp16"), np.float16)
    ours = accumulate(values, "fp16", cumulative=True)
    assert ours.dtype == torch.float16
    assert ours.numpy().tolist() == [float(e) for e in expected]
    assert accumulate(values[:1000], "fp16").item() == float(expected[999])


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp32"])
def test_every_method_matches_its_numpy_loop_bit_for_bit(fmt):
    g = torch.Generator().manual_seed(7)
    values = torch.rand(3000, generator=g) * torch.where(torch.rand(3000, generator=g) < 0.3, -1, 1)
    x, dtype = stored(values, fmt), NUMPY_DTYPES[fmt]
    assert sequential_sum(values, fmt).item() == float(numpy_sequential(x, dtype)[-1])
    assert kahan_sum(values, fmt).item() == float(numpy_kahan(x, dtype))
    assert kahan_sum(values, fmt, cumulative=True)[-1].item() == kahan_sum(values, fmt).item()
    assert pairwise_sum(values, fmt).item() == float(numpy_pairwise(x, dtype))


def test_rows_are_independent_sums_and_torch_dtypes_name_formats():
    values = torch.rand(5, 300, generator=torch.Generator().manual_seed(8))
    for method in ("sequential", "pairwise", "kahan"):
        rows = accumulate(values, torch.bfloat16, method=method)
        assert rows.shape == (5,) and rows.dtype == torch.bfloat16
        assert all(rows[i] == accumulate(values[i], "bf16", method=method) for i in range(5))


def test_fp16_running_sum_of_0_01_stalls_where_theory_says():
    # Adding c stops changing s = 2**k once c is at most half the spacing 2**(k - M) there.
    c = round_scalar(0.01, FP16)
    k = FP16.mantissa_bits + 1 + math.ceil(math.log2(c))
    trajectory = accumulate(torch.full((6000,), 0.01), "fp16", cumulative=True)
    assert trajectory[-1].item() == 2.0**k == 32
    assert trajectory[-1000:].unique().tolist() == [32.0]
    # torch's own FP16 sum does not stall: it adds in FP32 and rounds only the result.
    assert abs(torch.full((6000,), 0.01, dtype=torch.float16).sum().item() - 6000 * c) < 0.1


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_kahan_beats_sequential_and_every_method_meets_its_error_bound(fmt):
    g = torch.Generator().manual_seed(9)
    u = UNIT_ROUNDOFF[fmt]
    n = int(0.9 / u)  # the worst-case bound for sequential sums says nothing once n·u ≥ 1
    for values in (torch.full((n,), 0.01), torch.rand(n, generator=g), torch.randn(n, generator=g)):
        x = stored(values, fmt)
        exact = exact_sum(x)
        magnitude = float(sum(abs(Fraction(float(v))) for v in x))
        errors = {method: abs(Fraction(accumulate(values, fmt, method=method).item()) - exact)
                  for method in ("sequential", "pairwise", "kahan")}
        assert errors["sequential"] <= gamma(n - 1, u) * magnitude
        assert errors["pairwise"] <= gamma(math.ceil(math.log2(n)), u) * magnitude
        assert errors["kahan"] <= (2 * u + n * u * u) * magnitude
        if values.min() >= 0:  # same-sign terms: sequential drifts, Kahan does not
            assert errors["kahan"] < errors["sequential"] / 10


def test_accumulate_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown method"):
        accumulate(torch.ones(3), "fp16", method="fast")
    with pytest.raises(ValueError, match="fp32, fp16 or bf16"):
        accumulate(torch.ones(3), "e4m3")
    with pytest.raises(ValueError, match="unknown format"):
        accumulate(torch.ones(3), "fp12")
    with pytest.raises(ValueError, match="fp32, fp16 or bf16"):
        accumulate(torch.ones(3), torch.float64)
    with pytest.raises(ValueError, match="empty"):
        kahan_sum(torch.zeros(0), "fp16")
    with pytest.raises(TypeError, match="floating-point"):
        sequential_sum(torch.arange(3), "fp16")
    with pytest.raises(ValueError, match="inf or NaN"):
        pairwise_sum(torch.tensor([1.0, math.nan]), "fp16")
    with pytest.raises(ValueError, match="0-d"):
        sequential_sum(torch.tensor(1.0), "fp16")
    with pytest.raises(ValueError, match="no running sum"):
        accumulate(torch.ones(3), "fp16", method="pairwise", cumulative=True)


def test_cross_entropy_fp32_docstring_bounds_f_cross_entropy_error_with_equal_other_logits():
    """With the 999 other logits equal, every small term of F.cross_entropy's FP32 Σ rounds the
    same way, and its absolute error passes 1e-6 (at margin 12 on a CPU: 3.5e-6). The docstring
    must not promise less, and gives the largest error measured."""
    logits = torch.zeros(1, 1000)
    logits[0, 0] = 12.0
    targets = torch.tensor([0])
    error = abs(F.cross_entropy(logits, targets).item() - F.cross_entropy(logits.double(), targets).item())
    doc = " ".join(cross_entropy_fp32.__doc__.split())
    assert error > 1e-6 and "a few 1e-6" in doc
    assert f"{error:.1e}".replace("e-0", "e-") in doc
