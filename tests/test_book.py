"""The book as a project: every notebook is in the table of contents, committed without outputs,
opens on Colab with a set-up cell that matches _config.yml, and the whole book builds with Sphinx
warnings as errors, figures and Colab buttons included (the build is the shared ``built_book``
fixture in conftest.py). nbval runs each notebook separately."""
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import sync_colab_cells  # noqa: E402

NOTEBOOKS = sync_colab_cells.notebooks()
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part["chapters"]]
    return files


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_there_are_chapters():
    assert NOTEBOOKS, "no notebooks under book/"


def test_every_notebook_is_in_the_table_of_contents_and_every_entry_exists():
    listed = toc_files()
    for nb in NOTEBOOKS:
        assert str(nb.relative_to(ROOT).with_suffix("")) in listed, f"{nb.name} is not in _toc.yml"
    for entry in listed:
        assert any((ROOT / entry).with_suffix(s).exists() for s in (".md", ".ipynb")), entry


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_committed_without_outputs(notebook):
    for cell in code_cells(notebook):
        assert cell.get("outputs") == [] and cell.get("execution_count") is None, (
            f"{notebook.name} has outputs: clear them before committing")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_a_unique_id(notebook):
    """nbformat 4.5 requires a cell id: a cell inserted by hand without one makes nbformat warn on
    every read today, and is a validation error in its next versions."""
    data = json.loads(notebook.read_text())
    ids = [cell.get("id") for cell in data["cells"]]
    assert (data["nbformat"], data["nbformat_minor"]) >= (4, 5), notebook.name
    assert None not in ids, f"{notebook.name}: cell {ids.index(None)} has no id"
    assert len(ids) == len(set(ids)), f"{notebook.name}: duplicated cell ids"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_sets_up_colab_from_the_configured_repository(notebook):
    first = code_cells(notebook)[0]
    assert sync_colab_cells.TAG in first["metadata"].get("tags", []), (
        f"{notebook.name}: the first code cell must be the Colab set-up cell (tag {sync_colab_cells.TAG})")
    assert "".join(first["source"]) == sync_colab_cells.setup_cell_source(), (
        f"{notebook.name}: stale Colab set-up cell, run `make sync-notebooks`")
    assert CONFIG["repository"]["url"] in sync_colab_cells.setup_cell_source()


def test_installing_the_package_keeps_colabs_torch():
    """pyproject asks only for a lower bound on torch; requirements.txt pins the exact version."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_spec = next(d for d in dependencies if re.match(r"torch\b", d))
    assert re.fullmatch(r"torch>=[\d.]+", torch_spec.replace(" ", "")), torch_spec
    pins = (ROOT / "requirements.txt").read_text().split()
    assert any(re.fullmatch(r"torch==[\d.]+", p) for p in pins)


def test_the_book_builds_with_figures_and_colab_buttons(built_book):
    for nb in NOTEBOOKS:
        relative = nb.relative_to(ROOT)
        page = (built_book / relative.with_suffix(".html")).read_text()
        assert "<img" in page, f"{relative}: no figures"
        colab = (f"{CONFIG['launch_buttons']['colab_url']}/github/"
                 f"{CONFIG['repository']['url'].removeprefix('https://github.com/')}/blob/"
                 f"{CONFIG['repository']['branch']}/{relative}")
        assert colab in page, f"{relative}: no Colab button pointing at {colab}"
        for src in re.findall(r'<img[^>]+src="([^"]+)"', page):
            if not src.startswith(("http", "data:")):
                assert (built_book / relative.parent / src).resolve().exists(), f"missing image {src}"
