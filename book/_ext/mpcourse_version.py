"""Sphinx extension: the book knows the version of `mpcourse` it was built from.

It reads the version from pyproject.toml (the one place it is written) and offers it to the
pages as the MyST substitution ``{{ mpcourse_version }}`` (the landing page shows it).
"""
import re
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def version() -> str:
    found = re.search(r'^version\s*=\s*"([^"]+)"', PYPROJECT.read_text(), re.MULTILINE)
    if not found:
        raise RuntimeError(f"no version in {PYPROJECT}")
    return found.group(1)


def _add_substitution(app, config) -> None:
    config.myst_substitutions = {**config.myst_substitutions, "mpcourse_version": version()}


def setup(app):
    app.connect("config-inited", _add_substitution)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
