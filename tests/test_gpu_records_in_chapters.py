"""The chapters' GPU records, checked on the CPU: the recording cells run only on a GPU, so a typo
in a name would show only there. Every ``beside(stem, name)`` a chapter shows must be recorded
by the same chapter under the same name, and every stem must be the notebook's own."""
import json
import re
from pathlib import Path

BOOK = Path(__file__).resolve().parent.parent / "book"
BESIDE = re.compile(r'beside\(\s*"([^"]+)"\s*,\s*"([^"]+)"')
RECORDED = re.compile(r'recorder\(\s*"([^"]+)"\s*\)\s*\.\s*(?:table|number)\(\s*"([^"]+)"')


def chapter_code(path):
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_every_result_a_chapter_shows_beside_is_one_it_records_under_its_own_stem():
    shown_anywhere = 0
    for path in sorted(BOOK.glob("*.ipynb")):
        code = chapter_code(path)
        shown, recorded = set(BESIDE.findall(code)), set(RECORDED.findall(code))
        for stem, _ in shown | recorded:
            assert stem == path.stem, f"{path.name} records or shows results under the stem {stem!r}"
        assert shown == recorded, (f"{path.name}: shown but never recorded {sorted(shown - recorded)}, "
                                   f"recorded but never shown {sorted(recorded - shown)}")
        shown_anywhere += len(shown)
    assert shown_anywhere >= 8  # autocast, AMP step, resume, BF16 support, TF32, _scaled_mm, clocks, kernels


def test_the_intros_fp8_accumulation_numbers_hold_for_the_committed_h200_run():
    """intro.md types three numbers: the H200's largest FP8 accumulation error with cuBLAS's default
    accumulation (2.2e-5 of the products' summed magnitudes, more than a thousand times the FP32-sum
    emulation's), with fast accumulation (4.7e-4), and the largest error of rounding random normal
    inputs to E4M3, measured the same way (about 3e-3 over 4,096 outputs, computed here). All three are checked
    here, so that a new record or a changed sentence fails the build rather than drift apart."""
    import torch
    root = Path(__file__).resolve().parent.parent
    intro = " ".join((root / "book" / "intro.md").read_text().split())
    assert "largest error over the product's elements was 2.2 × 10⁻⁵" in intro and "and 4.7 × 10⁻⁴ with" in intro
    assert "Rounding the inputs to E4M3 costs more than either: its largest error, measured the same way, is already about 3 × 10⁻³ over only 4,096 outputs" in intro
    rows = dict(json.loads((root / "mpcourse" / "data" / "gpu" / "nvidia-h200" / "06_fp8.json").read_text())
                ["results"]["scaled_mm_accumulation"]["rows"])
    default, emulated = float(rows["F.scaled_mm, use_fast_accum=False"]), float(rows["emulation (FP32 sums)"])
    fast = float(rows["F.scaled_mm, use_fast_accum=True"])
    assert 2.1e-5 < default <= 2.2e-5 and default > 1000 * emulated and 4.65e-4 <= fast < 4.75e-4
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(64, 4096, generator=generator, dtype=torch.float64)
    b = torch.randn(4096, 64, generator=generator, dtype=torch.float64)

    def e4m3(x):  # per-tensor scale to E4M3's largest value, torch's cast
        scale = 448 / x.abs().amax()
        return (x * scale).float().to(torch.float8_e4m3fn).double() / scale
    error = ((e4m3(a) @ e4m3(b)) - a @ b).abs() / (a.abs() @ b.abs())
    assert 2.5e-3 < error.max().item() < 3.5e-3 and error.numel() == 4096 and fast < error.max().item() / 4
