"""Train the course's pre-trained model and write it to mpcourse/weights/.

    python tools/train_pretrained.py          # writes mpcourse/weights/digits_cnn.pt
    python tools/train_pretrained.py --check  # retrains and compares with the committed model

The model is `mpcourse.workloads.DigitsCNN`, trained in FP32 with AdamW on the training split of
`load_digits(images=True)` for a fixed number of epochs from a fixed seed, on one CPU thread so
that the result does not depend on the machine's thread count. It takes a few seconds. On this
project's machines it reproduces the committed weights bit for bit; a CPU with other vector units
may round a few sums differently, so `--check` compares what matters: the retrained model must
predict the same class as the committed one on almost every test image.
"""
import argparse
from pathlib import Path

import torch

from mpcourse.workloads import (DigitsCNN, accuracy, load_digits, load_pretrained, seed_everything,
                                train_classifier)

WEIGHTS = Path(__file__).resolve().parent.parent / "mpcourse" / "weights" / "digits_cnn.pt"
SEED, EPOCHS = 0, 30
AGREEMENT_NEEDED = 0.98


def train() -> tuple[DigitsCNN, float]:
    torch.set_num_threads(1)
    train_split, test_split = load_digits(images=True)
    seed_everything(SEED)
    model = DigitsCNN()
    train_classifier(model, train_split, epochs=EPOCHS, seed=SEED)
    return model, accuracy(model, test_split)


@torch.no_grad()
def prediction_agreement(model, other) -> float:
    """Fraction of the test images on which the two models predict the same class."""
    _, test_split = load_digits(images=True)
    return (model(test_split.x).argmax(1) == other(test_split.x).argmax(1)).float().mean().item()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed weights")
    args = parser.parse_args()
    model, test_accuracy = train()
    print(f"test accuracy {test_accuracy:.4f}")
    if args.check:
        agreement = prediction_agreement(model, load_pretrained())
        print(f"predicts the same class as the committed model on {agreement:.2%} of test images")
        raise SystemExit(0 if agreement >= AGREEMENT_NEEDED else 1)
    torch.save(model.state_dict(), WEIGHTS)
    print(f"wrote {WEIGHTS} ({WEIGHTS.stat().st_size / 1024:.0f} KiB)")
