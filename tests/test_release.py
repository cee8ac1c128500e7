"""Releases: one version everywhere (pyproject.toml, mpcourse.__version__, the changelog's latest
entry, every notebook's Colab install cell), a release step that moves them together, and the
GitHub Actions workflows, checked offline by real linters (never run here)."""
import datetime
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import mpcourse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import release  # noqa: E402
import sync_colab_cells  # noqa: E402

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
RELEASED = sync_colab_cells.released(ROOT)  # what the notebooks install and Colab opens
DEVELOPMENT = re.compile(r"(\d+\.\d+\.\d+)\.dev\d+")
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def install_cells(root: Path) -> dict[str, str]:
    cells = {}
    for path in sync_colab_cells.notebooks(root) + sync_colab_cells.exercise_sources(root) + sorted(
            (root / "exercises").glob("*/*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if sync_colab_cells.TAG in cell.get("metadata", {}).get("tags", []):
                cells[str(path.relative_to(root))] = "".join(cell["source"])
    return cells


def test_the_version_is_a_release_or_the_development_after_it_and_the_package_reports_it():
    """Issue 48, item 5: after a release main says it is ahead of it (x.y.(z+1).dev0)."""
    assert VERSION == RELEASED or (DEVELOPMENT.fullmatch(VERSION) and release.parse(
        DEVELOPMENT.fullmatch(VERSION).group(1)) > release.parse(RELEASED)), (VERSION, RELEASED)
    assert mpcourse.__version__ == VERSION


def test_the_students_page_names_the_version_the_notebooks_install():
    page = (ROOT / release.STUDENTS_PAGE).read_text()
    assert f"**version {RELEASED}** (the\n  repository's tag `v{RELEASED}`)" in page


def test_every_install_cell_and_colab_button_the_last_release():
    """The notebooks install the newest release of CHANGELOG.md, and the book's Colab buttons open
    the notebooks at its tag (issue 48, item 5: they opened main, ahead of what they install)."""
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    cells = install_cells(ROOT)
    assert len(cells) >= len(sync_colab_cells.notebooks()), "a notebook has no Colab set-up cell"
    for path, source in cells.items():
        pins = re.findall(r"git\+\S+@v(\d+\.\d+\.\d+)", source)
        assert pins == [RELEASED], f"{path} installs {pins or 'an unpinned mpcourse'}, not v{RELEASED}"
    assert yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["branch"] == f"v{RELEASED}"


# Keep a Changelog's sections that change what a user of the library or the exercises calls.
API_SECTIONS = ("### Added", "### Changed", "### Deprecated", "### Removed")


def unreleased_api_changes(changelog: str) -> list[str]:
    """The public-API sections ("### Added", ...) listed under "## [Unreleased]"."""
    unreleased = changelog.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    return [line.strip() for line in unreleased.splitlines() if line.strip().split(" (")[0] in API_SECTIONS]


def test_a_public_api_change_is_released_in_the_same_change():
    # The notebooks on main install the tag of pyproject.toml's version (tested above), and the tag
    # workflow creates that tag when the version changes. So an API change the notebooks use must
    # bump the version in the same change (`make release`): "Unreleased" may only hold fixes.
    sections = unreleased_api_changes((ROOT / "CHANGELOG.md").read_text())
    assert not sections, (f"CHANGELOG.md lists {sections} under Unreleased: a public-API change must "
                          "ship in a release (make release VERSION=x.y.z) in the same change")


def test_the_unreleased_check_sees_api_sections_and_lets_fixes_through():
    head = "# Changelog\n\n## [Unreleased]\n\n"
    tail = "\n## [0.1.0] - 2026-01-01\n\n### Added\n- old\n"
    assert unreleased_api_changes(head + "### Fixed\n- a typo\n" + tail) == []
    assert unreleased_api_changes(head + "### Added\n- `doctor`\n### Fixed\n- x\n" + tail) == ["### Added"]
    # A heading that names its issue is the same section (it let API changes through unreleased)
    assert unreleased_api_changes(head + "### Changed (issue 47)\n- x\n" + tail) == ["### Changed (issue 47)"]


def test_a_release_moves_the_version_the_changelog_and_the_notebooks_together(tmp_path):
    for name in ("pyproject.toml", "CHANGELOG.md", "_config.yml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("book", "solutions"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("_static"))
    changelog = tmp_path / "CHANGELOG.md"
    # Whatever the repository has under "Unreleased", the copy starts with an empty section.
    changelog.write_text(re.sub(r"## \[Unreleased\]\n.*?(?=## \[)", "## [Unreleased]\n\n",
                                changelog.read_text(), count=1, flags=re.S))
    with pytest.raises(SystemExit, match="nothing under"):  # an empty Unreleased section
        release.bump(tmp_path, "99.0.0", datetime.date(2030, 1, 2))
    changelog.write_text(changelog.read_text().replace(
        "## [Unreleased]\n", "## [Unreleased]\n\n### Fixed\n- a test entry\n", 1))
    for bad, message in (("1.2", "semantic version"), (RELEASED, "not newer")):
        with pytest.raises(SystemExit, match=message):
            release.bump(tmp_path, bad, datetime.date(2030, 1, 2))

    release.bump(tmp_path, "99.0.0", datetime.date(2030, 1, 2))
    assert sync_colab_cells.version(tmp_path) == sync_colab_cells.released(tmp_path) == "99.0.0"
    text = changelog.read_text()
    assert release.latest_changelog_version(text) == "99.0.0"
    assert "## [Unreleased]\n\n## [99.0.0] - 2030-01-02\n\n### Fixed\n- a test entry" in text
    assert f"## [{RELEASED}]" in text  # older entries are kept
    assert all("@v99.0.0" in source for source in install_cells(tmp_path).values())
    assert "**version 99.0.0** (the\n  repository's tag `v99.0.0`)" in (tmp_path / release.STUDENTS_PAGE).read_text()
    assert yaml.safe_load((tmp_path / "_config.yml").read_text())["repository"]["branch"] == "v99.0.0"
    # then main moves on; the notebooks and the buttons stay on the release
    release.set_version(tmp_path, release.next_development("99.0.0"))
    assert sync_colab_cells.version(tmp_path) == "99.0.1.dev0" and sync_colab_cells.released(tmp_path) == "99.0.0"
    assert not [p for p in sync_colab_cells.notebooks(tmp_path) if sync_colab_cells.stale(
        p, sync_colab_cells.setup_cell_source(tmp_path))]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_the_workflows_pass_actionlint(workflow):
    result = subprocess.run([str(BIN / "actionlint"), "-no-color", str(workflow)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_workflows_pass_zizmor_offline():
    result = subprocess.run([str(BIN / "zizmor"), "--offline", "--config", str(ROOT / ".github" / "zizmor.yml"),
                             str(ROOT / ".github" / "workflows")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_workflows_run_the_readme_commands():
    text = {p.name: p.read_text() for p in WORKFLOWS}
    assert "run: make test" in text["tests.yml"] and "pull_request" in text["tests.yml"]
    assert "run: make book" in text["book.yml"] and "actions/deploy-pages" in text["book.yml"]
    # A version change on main becomes the tag that the notebooks' install cells pin.
    assert "paths: [pyproject.toml]" in text["tag.yml"] and "refs/tags/v$version" in text["tag.yml"]
