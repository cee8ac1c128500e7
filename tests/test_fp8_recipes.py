"""The block-scaled recipes of Fp8Linear (MXFP8, NVFP4, DeepSeek-V3 blockwise), each of the three
products of a training step against its definition: the operands quantized here, independently,
from the formulas (block maxima, E8M0 / E4M3 / FP32 scales, torch's float8 casts, the Hadamard
transform, the same stochastic-rounding draws), multiplied in float64, within the FP32-accumulation
bound. Shapes not multiples of the blocks (padding), bit-identical resume, and torchao's emulated
MXFP8 layer and NVFP4 quantizer where torchao is installed."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mpcourse.formats import E2M1, round_to
from mpcourse.fp8 import RECIPES, BlockRecipe, Fp8Linear, Fp8Recipe, convert_to_fp8, get_recipe
from mpcourse.fp8.recipes import BLOCKWISE_POW2, hadamard_matrix
from mpcourse.fp8.linear import stochastic_rounding_seed
from mpcourse.training import MixedPrecisionTrainer, TrainerConfig
from mpcourse.workloads import load_digits

U32 = 2.0**-24
E4M3_MAX, E2M1_MAX = 448.0, 6.0


# --- independent references: what each operand becomes, in float64 ------------------------------

def pad(t, rows, cols):
    """Zeros appended so that t's shape becomes multiples of (rows, cols)."""
    return F.pad(t, (0, (-t.shape[1]) % cols, 0, (-t.shape[0]) % rows))


def blocks_of(t, rows, cols):
    """t (R, K) as (R // rows, K // cols, rows * cols): one row per block."""
    R, K = t.shape
    return t.reshape(R // rows, rows, K // cols, cols).permute(0, 2, 1, 3).reshape(R // rows, K // cols, -1)


def per_element(s, rows, cols):
    return s.repeat_interleave(rows, 0).repeat_interleave(cols, 1)


def mxfp8_ref(t, rows=1, cols=32):
    """E4M3 elements, the smallest power of two 2**E with amax / 2**E <= 448 per block (E8M0)."""
    t = pad(t.float(), rows, cols)
    amax = blocks_of(t, rows, cols).abs().amax(-1).double()
    e = torch.ceil(torch.log2(amax / E4M3_MAX))
    e = e + (amax / 2**e > E4M3_MAX).double() - ((amax / 2**(e - 1) <= E4M3_MAX) & (amax > 0)).double()
    e = torch.where(amax > 0, e, 0.0)
    decode = per_element(2.0**e, rows, cols)
    return (t.double() / decode).to(torch.float8_e4m3fn).double() * decode


def nvfp4_ref(t, rows=1, cols=16, rounding="nearest_even", generator=None):
    """E2M1 elements; tensor scale amax / (448 * 6); E4M3 block scales amax_b / 6 / tensor scale."""
    t = pad(t.float(), rows, cols)
    tensor_scale = t.abs().max() / (E4M3_MAX * E2M1_MAX)
    tensor_scale = torch.where(tensor_scale > 0, tensor_scale, 1.0)
    amax = blocks_of(t, rows, cols).abs().amax(-1)
    wanted = (amax / E2M1_MAX / tensor_scale).clamp(2.0**-9, E4M3_MAX)
    block_scale = torch.where(amax > 0, wanted.to(torch.float8_e4m3fn).float(), 1.0)
    scale = per_element(1.0 / (block_scale * tensor_scale), rows, cols)  # float32, multiplies
    data = round_to(t * scale, E2M1, rounding=rounding, saturate=True, generator=generator)
    return data.double() / scale.double()


def blockwise_ref(t, rows=1, cols=128, power_of_two=False):
    """E4M3 elements, FP32 scales 448 / amax per block (rounded down to a power of two)."""
    t = pad(t.float(), rows, cols)
    amax = blocks_of(t, rows, cols).abs().amax(-1)
    scale = torch.where(amax > 0, torch.full_like(amax, E4M3_MAX) / amax, 1.0)
    if power_of_two:
        scale = 2.0 ** torch.floor(torch.log2(scale.double())).float()
    scale = per_element(scale, rows, cols)
    return (t * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).double() / scale.double()


def hadamard_ref(t, h):
    """t (R, K) @ blockdiag(H, H, ...) with K padded to H's size: in float64, rounded to FP32."""
    t = pad(t.double(), 1, h.shape[0])
    blocks = torch.block_diag(*[h.double()] * (t.shape[1] // h.shape[0]))
    return (t @ blocks).float()


def reference_products(layer, x, dy):
    """(y, dx, dW) of the layer's definition, in float64, and each product's |A| @ |B|."""
    r, W = layer.recipe, layer.weight.detach()
    out, inn = W.shape
    if r.name == "mxfp8":
        fwd = (mxfp8_ref(x), mxfp8_ref(W))
        bwd = (mxfp8_ref(dy), mxfp8_ref(W.t()))                    # W column-wise
        wgrad = (mxfp8_ref(dy.t()), mxfp8_ref(x.t()))              # blocks along tokens
    elif r.name.startswith("blockwise"):
        pow2 = r.scale_rounding == "power_of_two"
        Wq = blockwise_ref(W, 128, 128, pow2)                      # one 128x128 copy for both
        fwd = (blockwise_ref(x, power_of_two=pow2), Wq)
        bwd = (blockwise_ref(dy, power_of_two=pow2), Wq.t())
        wgrad = (blockwise_ref(dy.t(), power_of_two=pow2), blockwise_ref(x.t(), power_of_two=pow2))
    else:  # nvfp4: replay the layer's stochastic-rounding draws, in the layer's order
        step = int(layer.sr_step) - 1                               # the backward pass just run
        g = torch.Generator().manual_seed(stochastic_rounding_seed(int(layer.sr_seed), step))
        h = hadamard_matrix(16, int(layer.hadamard_seed))
        Wq = nvfp4_ref(W, 16, 16)
        fwd = (nvfp4_ref(x), Wq)
        bwd = (nvfp4_ref(dy, rounding="stochastic", generator=g), Wq.t())
        wgrad = (nvfp4_ref(hadamard_ref(dy.t(), h), rounding="stochastic", generator=g),
                 nvfp4_ref(hadamard_ref(x.t(), h)))
    products = []
    for (a, b), (m, n) in zip((fwd, bwd, wgrad), ((x.shape[0], out), (x.shape[0], inn), (out, inn))):
        k = min(a.shape[1], b.shape[1])
        a, b = a[:m, :k], b[:n, :k]
        products.append((a @ b.t(), a.abs() @ b.abs().t(), k))
    return products


def run_layer(layer, x, dy):
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(dy)
    return y.detach(), x.grad, layer.weight.grad


def assert_within_fp32_accumulation(result, reference, magnitude, k, extra=0.0):
    """|result - reference| <= 2 (K + 4) u (|A| @ |B|): K additions in FP32, per block one
    rounding applying the scales and one adding the block's sum (at most 2 per element)."""
    bound = 2 * (k + 4) * U32 * magnitude + 2 * U32 * torch.as_tensor(extra).abs()
    error = (result.double() - reference).abs()
    assert bool((error <= bound).all()), f"worst excess {(error - bound).max().item():.3g}"


def varied(rows, cols, seed):
    """Values spread over several binades by row and by column, as activations are."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) * torch.exp(2 * torch.randn(rows, 1, generator=g))
            * torch.exp(torch.randn(1, cols, generator=g)))


SHAPES = [(35, 45, 70), (64, 96, 32), (150, 200, 130)]  # tokens, in, out: padded and not
RECIPE_OBJECTS = [RECIPES["mxfp8"], RECIPES["nvfp4"], RECIPES["blockwise"], BLOCKWISE_POW2]


@pytest.mark.parametrize("recipe", RECIPE_OBJECTS, ids=lambda r: r.name)
@pytest.mark.parametrize("tokens, fan_in, fan_out", SHAPES)
def test_each_product_equals_its_definition(recipe, tokens, fan_in, fan_out):
    torch.manual_seed(tokens + fan_in)
    layer = Fp8Linear(fan_in, fan_out, recipe=recipe, seed=5)
    with torch.no_grad():
        layer.weight.mul_(torch.exp(torch.randn(fan_out, 1)))  # rows of different sizes
    x, dy = varied(tokens, fan_in, 1), varied(tokens, fan_out, 2)
    results = run_layer(layer, x, dy)
    references = reference_products(layer, x, dy)
    for name, result, (reference, magnitude, k) in zip(("y", "dx", "dW"), results, references):
        extra = layer.bias.detach().expand_as(result) if name == "y" else 0.0
        assert result.shape == reference.shape and result.dtype == torch.float32, name
        assert_within_fp32_accumulation(result, reference + torch.as_tensor(extra).double(),
                                        magnitude, k, extra)
    assert torch.equal(layer.bias.grad, dy.sum(0))


def test_the_products_use_different_copies_and_the_recipes_differ():
    """The column-wise copies matter: quantizing W only row-wise would give another dx. (With
    power-of-two scales the two copies differ only where a value is subnormal in one block and
    not in the other: W here spans many binades, as real weights with outlier rows do.)"""
    torch.manual_seed(0)
    layer = Fp8Linear(64, 64, recipe="mxfp8")
    with torch.no_grad():
        layer.weight.copy_(varied(64, 64, 9))
    x, dy = varied(64, 64, 3), varied(64, 64, 4)
    _, dx, _ = run_layer(layer, x, dy)
    W = layer.weight.detach()
    row_only = (mxfp8_ref(dy) @ mxfp8_ref(W)).float()  # wrong: W's blocks along in, not out
    assert not torch.allclose(dx, row_only, rtol=0, atol=1e-6 * dx.abs().max().item())
    grads = {name: run_layer(Fp8Linear.from_linear(layer, name), x, dy)[2] for name in RECIPES}
    names = list(grads)
    assert all(not torch.equal(grads[a], grads[b]) for i, a in enumerate(names) for b in names[i + 1:])


def test_hadamard_matrix_is_a_seeded_orthogonal_hadamard_matrix():
    h = hadamard_matrix(16, 3).double()
    assert torch.equal((h * 4).abs(), torch.ones(16, 16, dtype=torch.float64))
    assert torch.allclose(h @ h.t(), torch.eye(16, dtype=torch.float64), atol=1e-6)
    assert torch.equal(hadamard_matrix(16, 3), hadamard_matrix(16, 3))
    assert not torch.equal(hadamard_matrix(16, 3), hadamard_matrix(16, 4))
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard_matrix(12, 0)


def test_nvfp4_rounds_gradients_stochastically_from_the_layers_state():
    layer = Fp8Linear(32, 32, recipe="nvfp4", seed=9)
    assert {"sr_seed", "sr_step", "hadamard_seed"} <= set(layer.state_dict())
    x, dy = varied(32, 32, 5), varied(32, 32, 6)
    first = run_layer(layer, x, dy)
    assert int(layer.sr_step) == 1
    second = run_layer(layer, x, dy)
    assert all(not torch.equal(a, b) for a, b in zip(first[1:], second[1:]))  # new draws
    layer.sr_step.zero_()
    assert all(torch.equal(a, b) for a, b in zip(first, run_layer(layer, x, dy)))  # the state
    model = convert_to_fp8(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)),
                           "nvfp4", skip=["2"])
    assert [int(m.sr_seed) for m in model[:2]] == [0, 1] and type(model[2]) is nn.Linear


def test_recipe_names_are_accepted_everywhere_and_unknown_ones_refused():
    for name, recipe in RECIPES.items():
        assert Fp8Linear(8, 8, recipe=name).recipe is recipe
        assert get_recipe(name) is recipe
        TrainerConfig("fp8", fp8_recipe=name)
        assert isinstance(convert_to_fp8(nn.Sequential(nn.Linear(8, 8)), name)[0], Fp8Linear)
    assert isinstance(get_recipe(None), Fp8Recipe)
    for bad in ("MXFP8", "fp4", ""):
        for make in (lambda: Fp8Linear(8, 8, recipe=bad), lambda: get_recipe(bad),
                     lambda: TrainerConfig("fp8", fp8_recipe=bad),
                     lambda: convert_to_fp8(nn.Sequential(nn.Linear(8, 8)), bad)):
            with pytest.raises(ValueError, match="choose one of hybrid, mxfp8, nvfp4, blockwise"):
                make()
    with pytest.raises(ValueError, match="gradient_rounding"):
        BlockRecipe("x", "mx", "e4m3", "e4m3", 32, gradient_rounding="up")
    with pytest.raises(ValueError, match="MX element formats"):
        BlockRecipe("x", "mx", "fp16", "e4m3", 32)


# --- checkpoints ---------------------------------------------------------------------------------

TRAIN, _ = load_digits()


def trainer_for(recipe, seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Dropout(0.1), nn.Linear(48, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return MixedPrecisionTrainer(model, optimizer, TrainerConfig("fp8", fp8_recipe=recipe))


def loss_fn(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_resume_from_a_checkpoint_is_bit_identical(recipe, tmp_path):
    g = torch.Generator().manual_seed(1)
    batches = [(TRAIN.x[i], TRAIN.y[i]) for i in torch.randint(0, len(TRAIN), (6, 40), generator=g)]
    uninterrupted = trainer_for(recipe, 0)
    expected = [uninterrupted.train_step(b, loss_fn).loss for b in batches]
    first = trainer_for(recipe, 0)
    before = [first.train_step(b, loss_fn).loss for b in batches[:3]]
    first.save_checkpoint(tmp_path / "run.pt")
    resumed = trainer_for(recipe, 7)  # other weights, fresh stochastic-rounding state
    resumed.load_checkpoint(tmp_path / "run.pt")
    after = [resumed.train_step(b, loss_fn).loss for b in batches[3:]]
    assert before + after == expected
    for p, q in zip(resumed.model.state_dict().values(), uninterrupted.model.state_dict().values()):
        assert p.dtype == q.dtype and torch.equal(p, q)


# --- interop: torchao's emulated MXFP8 training layer ---------------------------------------------

def test_mxfp8_agrees_with_torchao_emulated_mxfp8_linear():
    pytest.importorskip("torchao")
    mxfp8_linear = pytest.importorskip("torchao.prototype.moe_training.mxfp8_linear")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
    torch.manual_seed(0)
    tokens, fan_in, fan_out = 96, 160, 64  # torchao needs multiples of 32
    theirs = mxfp8_linear.MXFP8Linear(fan_in, fan_out, kernel_preference=KernelPreference.EMULATED,
                                      scale_calculation_mode=ScaleCalculationMode.RCEIL)
    ours = Fp8Linear(fan_in, fan_out, recipe="mxfp8")
    ours.load_state_dict(theirs.state_dict())
    x, dy = varied(tokens, fan_in, 7), varied(tokens, fan_out, 8)
    references = reference_products(ours, x, dy)
    extras = (ours.bias.detach().expand(tokens, fan_out), 0.0, 0.0)
    for a, b, (_, magnitude, k), extra in zip(run_layer(theirs, x, dy), run_layer(ours, x, dy),
                                              references, extras):
        # both within the bound of the same exact product: within twice the bound of each other
        assert_within_fp32_accumulation(a, b.double(), 2 * magnitude, k, 2 * extra)


def test_nvfp4_quantizer_agrees_with_torchao_nvfp4_tensor():
    nvfp4_tensor = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    t = varied(96, 160, 9)
    theirs = nvfp4_tensor.NVFP4Tensor.to_nvfp4(
        t, per_tensor_scale=nvfp4_tensor.per_tensor_amax_to_scale(t.abs().max())).dequantize(torch.float32)
    ours = get_recipe("nvfp4").quantize_rows(t, "e2m1").dequantize()[:, :t.shape[1]]
    # torchao (0.18) clamps a block scale at E4M3's smallest normal value, 2^-6, where ours rounds it
    # into E4M3's subnormals: the two agree in the blocks whose scale is normal
    wanted = t.abs().reshape(96, 10, 16).amax(-1) / E2M1_MAX / (t.abs().max() / (E4M3_MAX * E2M1_MAX))
    normal = (wanted >= 2.0**-6).repeat_interleave(16, dim=1)
    assert normal.float().mean() > 0.9 and not normal.all()  # both kinds of block are tested
    # the same codes and scales: the values differ only where code x block scale x tensor scale rounds
    # differently in FP32 (two roundings, in another order)
    torch.testing.assert_close(ours[normal], theirs[normal], rtol=4 * U32, atol=0)
    assert not torch.equal(ours[~normal], theirs[~normal])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recipe", list(RECIPES)[1:])
def test_block_recipes_run_on_cuda_as_on_cpu(recipe):
    torch.manual_seed(0)
    cpu = Fp8Linear(45, 70, recipe=recipe)
    gpu = Fp8Linear(45, 70, recipe=recipe, device="cuda")
    gpu.load_state_dict(cpu.state_dict())
    x, dy = varied(35, 45, 1), varied(35, 70, 2)
    on_cpu = run_layer(cpu, x, dy)
    on_gpu = run_layer(gpu, x.cuda(), dy.cuda())
    assert all(r.device.type == "cuda" and bool(torch.isfinite(r).all()) for r in on_gpu)
    if recipe != "nvfp4":  # NVFP4's stochastic rounding draws from a CUDA generator there
        for a, b, (_, magnitude, k) in zip(on_gpu, on_cpu, reference_products(cpu, x, dy)):
            assert_within_fp32_accumulation(a.cpu(), b.double(), 2 * magnitude, k,
                                            2 * cpu.bias.detach().abs().max())


@pytest.mark.parametrize("fields", [dict(block_size=12, hadamard_size=3), dict(block_size=32, hadamard_size=64),
                                    dict(block_size=0), dict(block_size=2.5)])
def test_a_block_recipe_with_impossible_sizes_is_refused_when_made(fields):
    with pytest.raises(ValueError, match="block_size"):
        BlockRecipe("custom", "block", "e4m3", "e4m3", **fields)


def test_layers_with_different_sr_seeds_draw_different_roundings_on_the_cpu():
    # torch's CPU generator keeps only a seed's low 32 bits: sr_seed * 2**32 + step gave every
    # layer the same draws
    torch.manual_seed(0)
    linear = nn.Linear(32, 16)
    x, dy = torch.randn(64, 32), torch.randn(64, 16)
    grads = []
    for seed in (0, 1):
        layer = Fp8Linear.from_linear(linear, "nvfp4", seed=seed)
        layer.hadamard_seed.fill_(0)  # the same Hadamard matrix: only the rounding draws differ
        layer.zero_grad(set_to_none=True)
        layer(x).backward(dy)
        grads.append(linear.weight.grad.clone())
    assert not torch.equal(grads[0], grads[1])
    assert len({stochastic_rounding_seed(s, t) for s in range(8) for t in range(1000)}) == 8000
