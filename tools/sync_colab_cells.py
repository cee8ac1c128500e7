"""Write the Colab set-up cell of each book notebook and exercise source from the repository URL
in _config.yml and the newest release in CHANGELOG.md (then `make exercises` carries it into the
released exercises). Between two releases pyproject.toml holds the next development version
(`x.y.z.dev0`), and the cells keep installing the last release.

The set-up cell is the code cell tagged `colab-setup`. On Colab it installs `mpcourse` from the
repository at the release tag `v<released>`, so a notebook opened in week 2 and again in week 9
runs the same library, without touching Colab's own torch (the package asks only for a lower bound
on torch); locally, where `mpcourse` is installed, it does nothing. Run with --check to only
report stale cells. `make release` (tools/release.py) runs this after changing the version.
"""
import json
import re
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TAG = "colab-setup"


def version(root: Path = ROOT) -> str:
    """pyproject.toml's version: a release's, or the development version after it."""
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]


def latest_changelog_version(changelog: str) -> str | None:
    """The version of the newest released entry ("## [x.y.z] - date"), "Unreleased" left out."""
    found = re.search(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.MULTILINE)
    return found.group(1) if found else None


def released(root: Path = ROOT) -> str:
    """The newest release (CHANGELOG.md), which the notebooks install and Colab opens."""
    return latest_changelog_version((root / "CHANGELOG.md").read_text())


def setup_cell_source(root: Path = ROOT) -> str:
    url = yaml.safe_load((root / "_config.yml").read_text())["repository"]["url"]
    return (
        "# Colab: install the course library (Colab's own torch is kept). Locally: nothing to do.\n"
        "try:\n"
        "    import mpcourse\n"
        "except ImportError:\n"
        f'    %pip install --quiet "mpcourse @ git+{url}@v{released(root)}"'
    )


def notebooks(root: Path = ROOT):
    return sorted(p for p in (root / "book").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def exercise_sources(root: Path = ROOT):
    return sorted((root / "solutions").glob("*/*.ipynb"))


def sync_all(root: Path = ROOT) -> list[Path]:
    """Rewrite every stale set-up cell under ``root``; returns the notebooks changed."""
    source = setup_cell_source(root)
    changed = [p for p in notebooks(root) + exercise_sources(root) if stale(p, source)]
    for p in changed:
        sync(p, source)
    return changed


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
    if "--check" in sys.argv:
        source = setup_cell_source()
        out_of_date = [p for p in notebooks() + exercise_sources() if stale(p, source)]
        for p in out_of_date:
            print(f"stale Colab set-up cell: {p.relative_to(ROOT)}")
        sys.exit(1 if out_of_date else 0)
    for p in sync_all():
        print(f"updated {p.relative_to(ROOT)}")
