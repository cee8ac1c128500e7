"""The shared workloads: deterministic data, models that learn, and the shipped pre-trained model."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mpcourse import workloads
from mpcourse.workloads import (VOCAB, DigitsCNN, DigitsMLP, TinyTransformer, accuracy,
                                addition_corpus, batches, decode_tokens, encode_text, lm_batch,
                                load_digits, load_pretrained, seed_everything, train_classifier)

ROOT = Path(__file__).resolve().parent.parent


def test_digits_split_is_deterministic_stratified_and_disjoint():
    train, test = load_digits()
    again_train, again_test = load_digits()
    assert torch.equal(train.x, again_train.x) and torch.equal(test.y, again_test.y)
    assert train.x.shape[1:] == (64,) and len(train) + len(test) == 1797
    assert 0 <= train.x.min() and train.x.max() <= 1
    test_share = torch.bincount(test.y) / (torch.bincount(test.y) + torch.bincount(train.y))
    assert torch.all((test_share - 0.2).abs() < 0.01)
    train_rows = {tuple(row.tolist()) for row in train.x}
    overlap = sum(tuple(row.tolist()) in train_rows for row in test.x)
    assert overlap < 5  # the raw dataset has a handful of identical images; nothing more is shared
    other_train, _ = load_digits(seed=1)
    assert not torch.equal(train.y, other_train.y)


def test_digits_are_scikit_learns_and_loading_them_does_not_import_it():
    from sklearn.datasets import load_digits as sklearn_digits

    train, test = load_digits()
    reference = sklearn_digits()
    pixels = torch.tensor(reference.data, dtype=torch.float32) / 16.0
    assert sorted(map(tuple, torch.cat([train.x, test.x]).tolist())) == sorted(map(tuple, pixels.tolist()))
    assert torch.equal(torch.bincount(torch.cat([train.y, test.y])), torch.bincount(torch.tensor(reference.target)))
    code = ("import sys; from mpcourse.workloads import load_digits; load_digits(); "
            "print('sklearn' in sys.modules)")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False"


def test_digits_images_are_the_same_pixels_as_vectors():
    train_vectors, _ = load_digits()
    train_images, _ = load_digits(images=True)
    assert train_images.x.shape[1:] == (1, 8, 8)
    assert torch.equal(train_images.x.flatten(1), train_vectors.x)


def test_load_digits_rejects_a_bad_fraction():
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits(test_fraction=1.5)


def test_batches_cover_the_split_once():
    train, _ = load_digits()
    seen = torch.cat([y for _, y in batches(train, 100, generator=torch.Generator().manual_seed(0))])
    assert torch.equal(seen.sort().values, train.y.sort().values)


@pytest.mark.parametrize("model_class, images", [(DigitsMLP, False), (DigitsCNN, True)])
def test_classifiers_learn_the_digits_and_training_is_deterministic(model_class, images):
    train, test = load_digits(images=images)
    results = []
    for _ in range(2):
        seed_everything(0)
        model = model_class()
        losses = train_classifier(model, train, epochs=3)
        results.append((losses, model))
    assert results[0][0] == results[1][0]
    assert results[0][0][-1] < 0.5 * results[0][0][0]
    assert accuracy(results[0][1], test) > 0.85


def test_addition_corpus_is_correct_arithmetic():
    text = addition_corpus(200, seed=3)
    assert text == addition_corpus(200, seed=3) != addition_corpus(200, seed=4)
    for line in text.rstrip(";").split(";"):
        question, answer = line.split("=")
        a, b = map(int, question.split("+"))
        assert a + b == int(answer)


def test_text_encoding_round_trips_and_rejects_unknown_characters():
    assert decode_tokens(encode_text("12+3=15;")) == "12+3=15;"
    with pytest.raises(ValueError, match="vocabulary"):
        encode_text("1+x")


def test_tiny_transformer_is_causal_and_learns():
    generator = seed_everything(0)
    model = TinyTransformer(dim=32, heads=2, layers=1, context=16)
    tokens = encode_text(addition_corpus(2000))
    x, _ = lm_batch(tokens, 4, 16, generator=generator)
    changed = x.clone()
    changed[:, 10] = (changed[:, 10] + 1) % len(VOCAB)
    with torch.no_grad():
        assert torch.equal(model(x)[:, :10], model(changed)[:, :10])  # the past ignores the future
        assert not torch.equal(model(x)[:, 10:], model(changed)[:, 10:])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        x, y = lm_batch(tokens, 16, 16, generator=generator)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.75 * losses[0]
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_attention_variants_compute_the_same_function_and_store_what_they_say():
    tokens = encode_text(addition_corpus(200))
    x, y = lm_batch(tokens, 4, 16, generator=torch.Generator().manual_seed(0))
    models = {}
    for name, kwargs in {"written": {}, "sdpa": {"sdpa": True}, "fp32 softmax": {"softmax_dtype": torch.float32}}.items():
        seed_everything(0)
        models[name] = TinyTransformer(dim=32, heads=4, layers=1, context=16, **kwargs)  # head width 8
    reference = models["written"](x)
    for name in ("sdpa", "fp32 softmax"):  # the same weights, the same function
        assert all(torch.equal(a, b) for a, b in zip(models[name].parameters(), models["written"].parameters()))
        torch.testing.assert_close(models[name](x), reference, rtol=1e-5, atol=1e-5)

    def saved_square_dtypes(model):
        # dtypes of the (length x length) tensors saved for backward under CPU BF16 autocast
        found = []

        def pack(t):
            if t.dim() >= 3 and t.shape[-1] == t.shape[-2] == 16:
                found.append(t.dtype)
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
            F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        return set(found)

    assert saved_square_dtypes(models["written"]) == {torch.bfloat16}            # CPU autocast: BF16 softmax
    assert saved_square_dtypes(models["fp32 softmax"]) == {torch.float32, torch.bfloat16}  # FP32 + a copy
    assert saved_square_dtypes(models["sdpa"]) == set()                          # fused: none stored
    with pytest.raises(ValueError, match="softmax_dtype"):
        TinyTransformer(sdpa=True, softmax_dtype=torch.float32)


def test_attention_rejects_heads_that_do_not_divide_the_width():
    with pytest.raises(ValueError, match="divisible"):
        TinyTransformer(dim=30, heads=4)


def test_pretrained_model_loads_in_eval_mode_and_is_accurate():
    model = load_pretrained()
    _, test = load_digits(images=True)
    assert not model.training
    assert accuracy(model, test) > 0.95
    with pytest.raises(ValueError, match="available"):
        load_pretrained("resnet50")


def test_pretrained_weights_are_reproduced_by_the_training_script():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "train_pretrained.py"), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pretrained_weights_ship_inside_the_package():
    assert (Path(workloads.__file__).parent / "weights" / "digits_cnn.pt").is_file()
