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
