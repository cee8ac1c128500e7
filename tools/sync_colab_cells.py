"""Write the Colab set-up cell of each book notebook and exercise source from the repository URL
in _config.yml (then `make exercises` carries it into the released exercises).

The set-up cell is the code cell tagged `colab-setup`. On Colab it installs `mpcourse` from the
repository without touching Colab's own torch (the package asks only for `torch>=2.1`); locally,
where `mpcourse` is installed, it does nothing. Run with --check to only report stale cells.
"""
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TAG = "colab-setup"


def setup_cell_source() -> str:
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    return (
        "# Colab: install the course library (Colab's own torch is kept). Locally: nothing to do.\n"
        "try:\n"
        "    import mpcourse\n"
        "except ImportError:\n"
        f'    %pip install --quiet "mpcourse @ git+{url}"'
    )


def notebooks():
    return sorted(p for p in (ROOT / "book").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def exercise_sources():
    return sorted((ROOT / "solutions").glob("*/*.ipynb"))


def stale(path: Path, source: str) -> bool:
    cells = json.loads(path.read_text())["cells"]
    tagged = [c for c in cells if TAG in c.get("metadata", {}).get("tags", [])]
    return len(tagged) != 1 or "".join(tagged[0]["source"]) != source


def sync(path: Path, source: str) -> None:
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if TAG in cell.get("metadata", {}).get("tags", []):
            cell["source"] = source.splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    source = setup_cell_source()
    out_of_date = [p for p in notebooks() + exercise_sources() if stale(p, source)]
    if "--check" in sys.argv:
        for p in out_of_date:
            print(f"stale Colab set-up cell: {p.relative_to(ROOT)}")
        sys.exit(1 if out_of_date else 0)
    for p in out_of_date:
        sync(p, source)
        print(f"updated {p.relative_to(ROOT)}")
