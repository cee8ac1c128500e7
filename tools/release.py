"""Cut a release: `make release VERSION=x.y.z` (or `python tools/release.py x.y.z`).

A release makes the book, its notebooks and the library agree on one version:

1. the working tree must be clean and CHANGELOG.md must have entries under "Unreleased";
2. pyproject.toml gets the new version (the only place it is written);
3. CHANGELOG.md's "Unreleased" entries move under "[x.y.z] - <today>";
4. every notebook's Colab set-up cell installs `mpcourse` at the tag `vx.y.z`, the book's Colab
   buttons open the notebooks at that tag (_config.yml's `repository.branch`), and the students'
   page (book/how_to_use_students.md) names that version
   (tools/sync_colab_cells.py), and the student release `exercises/` is regenerated from
   `solutions/` (`python -m grader release`), so released notebooks install the same library;
5. the result is committed and tagged `vx.y.z`;
6. pyproject.toml moves on to the next development version, `x.y.(z+1).dev0`, in a commit of its
   own: what main holds after the release is not the release (the notebooks and Colab's buttons
   stay on `vx.y.z`). Push the commits and the tag yourself.

`--no-git` stops after step 4 (no clean-tree check, no commit, no tag, no development version).
"""
from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import sync_colab_cells  # noqa: E402

SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
UNRELEASED = "## [Unreleased]"
STUDENTS_PAGE = "book/how_to_use_students.md"


def parse(version: str) -> tuple[int, int, int]:
    if not SEMVER.fullmatch(version):
        raise SystemExit(f"release: {version!r} is not a semantic version MAJOR.MINOR.PATCH (e.g. 0.3.0)")
    return tuple(int(part) for part in version.split("."))


latest_changelog_version = sync_colab_cells.latest_changelog_version


def next_development(version: str) -> str:
    """The development version after release `version`: x.y.(z+1).dev0."""
    major, minor, patch = parse(version)
    return f"{major}.{minor}.{patch + 1}.dev0"


def set_version(root: Path, version: str) -> None:
    pyproject = root / "pyproject.toml"
    text, count = re.subn(r'^version = "[^"]+"', f'version = "{version}"', pyproject.read_text(),
                          count=1, flags=re.MULTILINE)
    if count != 1:
        raise SystemExit("release: no `version = \"...\"` line in pyproject.toml")
    pyproject.write_text(text)


def bump(root: Path, version: str, today: datetime.date) -> None:
    """Steps 2-4 without the exercise release: version, changelog, Colab cells under ``root``."""
    current = sync_colab_cells.released(root)
    if parse(version) <= parse(current):
        raise SystemExit(f"release: {version} is not newer than the last release {current}")
    changelog_path = root / "CHANGELOG.md"
    changelog = changelog_path.read_text()
    if UNRELEASED not in changelog:
        raise SystemExit(f"release: CHANGELOG.md has no '{UNRELEASED}' section")
    head, rest = changelog.split(UNRELEASED, 1)
    entries, _, older = rest.partition("\n## [")
    if not entries.strip():
        raise SystemExit("release: nothing under '## [Unreleased]' in CHANGELOG.md: say what changed")
    changelog_path.write_text(f"{head}{UNRELEASED}\n\n## [{version}] - {today.isoformat()}\n\n"
                              f"{entries.strip()}\n" + (f"\n## [{older}" if older else ""))
    set_version(root, version)
    config = root / "_config.yml"
    text, count = re.subn(r"^(  branch: ).*$", rf"\g<1>v{version}", config.read_text(), count=1, flags=re.MULTILINE)
    if count != 1:
        raise SystemExit("release: no repository `branch:` line in _config.yml")
    config.write_text(text)  # the book's Colab buttons open the notebooks at the tag
    students = root / STUDENTS_PAGE
    if students.is_file():  # the version the book describes, said where students read it
        students.write_text(re.sub(r"\*\*version \d+\.\d+\.\d+\*\* \(the\n?(\s*)repository's tag `v\d+\.\d+\.\d+`\)",
                                   lambda m: f"**version {version}** (the\n{m.group(1)}repository's tag `v{version}`)",
                                   students.read_text()))
    sync_colab_cells.sync_all(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the new version, MAJOR.MINOR.PATCH")
    parser.add_argument("--no-git", action="store_true", help="no clean-tree check, commit or tag")
    args = parser.parse_args()
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, check=True, capture_output=True, text=True)
    if not args.no_git and git("status", "--porcelain").stdout.strip():
        raise SystemExit("release: the working tree has uncommitted changes; commit or stash them first")
    bump(ROOT, args.version, datetime.date.today())
    subprocess.run([sys.executable, "-m", "grader", "release"], cwd=ROOT, check=True)
    if not args.no_git:
        git("add", "-A")
        git("commit", "-m", f"Release {args.version}")
        git("tag", "-a", f"v{args.version}", "-m", f"mpcourse {args.version}")
        set_version(ROOT, next_development(args.version))
        git("add", "pyproject.toml")
        git("commit", "-m", f"Begin {next_development(args.version)}: main is ahead of v{args.version}")
        print(f"Tagged v{args.version}; main is now {next_development(args.version)}. "
              f"Publish with: git push && git push origin v{args.version}")


if __name__ == "__main__":
    main()
