"""Small, real workloads: models and data that train in seconds on a CPU.

Every chapter trains something, and the phenomena it shows (gradients underflowing, updates
vanishing, logits overflowing) must come from a real model, not from made-up numbers. These are
the models, shared by all chapters, the exercises and the tests:

- the **digits** dataset: scikit-learn's 1,797 handwritten 8×8 digits, bundled with
  scikit-learn, so nothing is downloaded;
- `DigitsMLP` and `DigitsCNN`, which reach about 97% test accuracy in a few seconds;
- `TinyTransformer`, a character-level language model with the same pieces as a GPT block
  (embeddings, LayerNorm, causal self-attention, MLP), trained on `addition_corpus`, generated
  sums such as ``"37+85=122"``; it is learnable, so its loss curve means something;
- `load_pretrained`, the digits CNN trained by ``tools/train_pretrained.py`` and shipped as a small
  weights file, for the chapters and exercises that need "a pre-trained model".

Everything is deterministic for a given seed.
"""
import math
import random
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch, and return a torch generator seeded the same way."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# Digits: 8×8 images of handwritten digits, ten classes.

@dataclass(frozen=True)
class Split:
    """Inputs and integer class labels of one part of a dataset."""
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device) -> "Split":
        return Split(self.x.to(device), self.y.to(device))


def _digits_table() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: (pixels 0..16, labels), read from the CSV file scikit-learn ships,
    which is what ``sklearn.datasets.load_digits`` reads. Reading it directly spares importing
    scikit-learn, about a second of CPU in every notebook; where the file is not found (another
    layout of the package), scikit-learn loads it."""
    import gzip
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as file:
                table = np.loadtxt(file, delimiter=",")
            return table[:, :-1], table[:, -1].astype(int)
    from sklearn.datasets import load_digits as sklearn_digits

    data = sklearn_digits()
    return data.data, data.target


def load_digits(*, images: bool = False, test_fraction: float = 0.2, seed: int = 0,
                device="cpu") -> tuple[Split, Split]:
    """The digits dataset as float32 tensors, split into (train, test) the same way every time.

    Pixels are scaled from 0..16 to [0, 1]. ``images=False`` gives vectors of 64 features (for an
    MLP), ``images=True`` gives (N, 1, 8, 8) tensors (for a CNN). The split is stratified: each
    digit has the same share of the test set.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    pixels, labels = _digits_table()
    x = torch.tensor(pixels, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.long)
    if images:
        x = x.reshape(-1, 1, 8, 8)
    generator = torch.Generator().manual_seed(seed)
    test = torch.zeros(len(y), dtype=torch.bool)
    for digit in range(10):
        members = torch.nonzero(y == digit).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        test[members[: round(len(members) * test_fraction)]] = True
    train_split, test_split = Split(x[~test], y[~test]), Split(x[test], y[test])
    return train_split.to(device), test_split.to(device)


def batches(split: Split, batch_size: int, *, generator: torch.Generator):
    """Shuffled mini-batches ``(x, y)`` covering ``split`` once (the last one may be smaller)."""
    order = torch.randperm(len(split), generator=generator).to(split.y.device)
    for start in range(0, len(split), batch_size):
        index = order[start:start + batch_size]
        yield split.x[index], split.y[index]


class DigitsMLP(nn.Module):
    """64 pixels → ``depth`` hidden layers of ``width`` ReLU units → 10 class logits."""

    def __init__(self, width: int = 128, depth: int = 2):
        super().__init__()
        sizes = [64] + [width] * depth
        layers = []
        for fan_in, fan_out in zip(sizes, sizes[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        self.layers = nn.Sequential(*layers, nn.Linear(sizes[-1], 10))

    def forward(self, x):
        return self.layers(x.flatten(1))


class DigitsCNN(nn.Module):
    """(N, 1, 8, 8) images → two 3×3 convolutions, 2×2 max-pool → a linear classifier."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2))
        self.classifier = nn.Linear(2 * channels * 4 * 4, 10)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


@torch.no_grad()
def accuracy(model: nn.Module, split: Split, batch_size: int = 512) -> float:
    """Fraction of ``split`` that ``model`` classifies correctly (evaluated in eval mode)."""
    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(split), batch_size):
        logits = model(split.x[start:start + batch_size])
        correct += (logits.argmax(dim=1) == split.y[start:start + batch_size]).sum().item()
    model.train(was_training)
    return correct / len(split)


def train_classifier(model: nn.Module, train: Split, *, epochs: int = 20, lr: float = 3e-3,
                     batch_size: int = 64, seed: int = 0) -> list[float]:
    """Train ``model`` in FP32 with AdamW and return the loss of every step.

    The plain FP32 baseline. Chapters that change the precision write their own loop, so the
    reader can see each line that changes.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(epochs):
        for x, y in batches(train, batch_size, generator=generator):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


# ---------------------------------------------------------------------------------------------
# A tiny language model on generated sums.

VOCAB = "0123456789+=;"


def addition_corpus(n_sums: int, *, max_operand: int = 99, seed: int = 0) -> str:
    """``n_sums`` random sums such as ``"37+85=122;"`` concatenated, reproducible from ``seed``."""
    rng = random.Random(seed)
    sums = []
    for _ in range(n_sums):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        sums.append(f"{a}+{b}={a + b};")
    return "".join(sums)


def encode_text(text: str) -> torch.Tensor:
    """Characters of ``VOCAB`` → integer token ids."""
    unknown = set(text) - set(VOCAB)
    if unknown:
        raise ValueError(f"characters {sorted(unknown)} are not in the vocabulary {VOCAB!r}")
    return torch.tensor([VOCAB.index(c) for c in text], dtype=torch.long)


def decode_tokens(tokens) -> str:
    """Integer token ids → text."""
    return "".join(VOCAB[int(t)] for t in tokens)


def lm_batch(tokens: torch.Tensor, batch_size: int, context: int, *, generator: torch.Generator):
    """A random batch of ``(inputs, targets)`` windows; the targets are the inputs shifted by one."""
    starts = torch.randint(0, len(tokens) - context - 1, (batch_size,), generator=generator)
    window = starts[:, None] + torch.arange(context + 1)
    chunk = tokens[window.to(tokens.device)]
    return chunk[:, :-1], chunk[:, 1:]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees only positions ≤ t.

    Written out (rather than calling ``F.scaled_dot_product_attention``) so the chapters can point
    at each operation: the ``q @ kᵀ / √d`` logits, the mask, the softmax. Two variants, for
    measuring what attention stores:

    - ``softmax_dtype=torch.float32`` computes the softmax in FP32 and keeps its result in FP32
      (then casts a copy to ``v``'s dtype for the product with ``v``): what CUDA autocast does,
      whose FP32 list holds ``softmax``, and what many models do by hand.
    - ``sdpa=True`` calls ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` instead: a
      fused kernel that stores no ``length × length`` tensor for backward.
    """

    def __init__(self, dim: int, heads: int, *, sdpa: bool = False, softmax_dtype=None):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        if sdpa and softmax_dtype is not None:
            raise ValueError("softmax_dtype applies to the written-out attention; "
                             "scaled_dot_product_attention (sdpa=True) chooses its own")
        self.heads, self.sdpa, self.softmax_dtype = heads, sdpa, softmax_dtype
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
            weights = logits.masked_fill(future, float("-inf")).softmax(dim=-1, dtype=self.softmax_dtype)
            mixed = weights.to(v.dtype) @ v
        return self.out(mixed.transpose(1, 2).reshape(batch, length, dim))


class Block(nn.Module):
    """One pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, dim: int, heads: int, **attention):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = CausalSelfAttention(dim, heads, **attention)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    """A character-level GPT: token + position embeddings, ``layers`` blocks, a LayerNorm, logits.

    ``sdpa`` and ``softmax_dtype`` choose the attention's kernel (see :class:`CausalSelfAttention`);
    the weights are the same whichever is chosen."""

    def __init__(self, vocab_size: int = len(VOCAB), dim: int = 64, heads: int = 4,
                 layers: int = 2, context: int = 32, *, sdpa: bool = False, softmax_dtype=None):
        super().__init__()
        self.context = context
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.position_embedding = nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, sdpa=sdpa, softmax_dtype=softmax_dtype)
                                      for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens):
        if tokens.shape[1] > self.context:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds the context {self.context}")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        return self.head(self.norm(self.blocks(x)))


# ---------------------------------------------------------------------------------------------
# The pre-trained model that ships with the course.

PRETRAINED = {"digits_cnn": DigitsCNN}


def load_pretrained(name: str = "digits_cnn", device="cpu") -> nn.Module:
    """The course's pre-trained model, in FP32 and eval mode, loaded from the package.

    Trained by ``tools/train_pretrained.py`` on the training split of ``load_digits(images=True)``;
    evaluate it on the matching test split.
    """
    if name not in PRETRAINED:
        raise ValueError(f"unknown pre-trained model {name!r}; available: {sorted(PRETRAINED)}")
    model = PRETRAINED[name]()
    weights = resources.files("mpcourse") / "weights" / f"{name}.pt"
    with resources.as_file(weights) as path:
        model.load_state_dict(torch.load(path, map_location=device, weights_only=True))
    return model.to(device).eval()
