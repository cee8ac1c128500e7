"""The README's Python examples run as printed."""
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_has_examples():
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.splitlines()[0][:40])
def test_readme_example_runs(example, capsys):
    exec(compile(example, "README.md", "exec"), {})
    capsys.readouterr()
