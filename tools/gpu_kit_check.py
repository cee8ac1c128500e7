"""Check the GPU kit against the GPU image, without the image: `pip check` for a --target install.

    python tools/gpu_kit_check.py requirements TARGET PYTHON_VERSION
        every requirement of every package installed in TARGET (the kit, installed with
        `pip install --no-index --no-deps --target TARGET`) is met by the kit itself or by the
        image's list (tools/gpu-image-packages.txt; versions checked where the list gives one),
        for CPython PYTHON_VERSION on Linux x86_64. pip check cannot do this: the image is not here.
    python tools/gpu_kit_check.py image-only
        every package of the running environment is one the image has (the rehearsal's venv).
    python tools/gpu_kit_check.py image-needs TARGET PYTHON_VERSION
        print the requirements of the kit in TARGET that the image meets (one a line): what the
        rehearsal's venv must hold besides torch and the library's own dependencies.

Exits 1 with one line per problem. Also imported by tests/test_gpu_kit.py.
"""
from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "tools" / "gpu-kit.txt"
IMAGE = ROOT / "tools" / "gpu-image-packages.txt"
TOOLING = {"pip", "setuptools", "wheel"}  # every venv has them; the image has them too


def read_list(path=KIT) -> dict[str, str | None]:
    """A package list (``name`` or ``name==version`` a line, ``#`` comments) as
    {canonical name: version or None}."""
    packages = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            packages[canonicalize_name(name)] = version.strip() or None
    return packages


def environment(python_version: str) -> dict[str, str]:
    """Marker values for CPython ``python_version`` ("3.12") on Linux x86_64."""
    return {"python_version": python_version, "python_full_version": f"{python_version}.0",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "os_name": "posix", "extra": ""}


def unmet(requires: dict[str, list[str]], available: dict[str, str | None],
          python_version: str) -> list[str]:
    """The requirements of ``requires`` ({package: its Requires-Dist lines}) that ``available``
    ({name: version or None}) does not meet on ``python_version``; a None version (the image's
    list does not say) counts as met."""
    problems, env = [], environment(python_version)
    for package, lines in sorted(requires.items()):
        for line in lines:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            name = canonicalize_name(requirement.name)
            if name not in available:
                problems.append(f"{package} needs {line!r}: neither the kit nor the image has "
                                f"{requirement.name}")
            elif available[name] is not None and not requirement.specifier.contains(
                    Version(available[name]), prereleases=True):
                problems.append(f"{package} needs {line!r}, but {requirement.name} is "
                                f"{available[name]}")
    return problems


def requirements_in(target) -> dict[str, list[str]]:
    """{package: Requires-Dist lines} of every distribution installed in the folder ``target``."""
    return {canonicalize_name(d.metadata["Name"]): list(d.requires or [])
            for d in metadata.distributions(path=[str(target)])}


def main(argv) -> int:
    image, kit = read_list(IMAGE), read_list(KIT)
    if argv[:1] == ["requirements"] and len(argv) == 3:
        installed = requirements_in(argv[1])
        missing = sorted(set(kit) - set(installed))
        problems = [f"{name} is in tools/gpu-kit.txt but not installed in {argv[1]}"
                    for name in missing]
        problems += unmet(installed, {**image, **kit}, argv[2])
        what = f"{len(installed)} kit packages in {argv[1]} against the kit and the image, Python {argv[2]}"
    elif argv[:1] == ["image-needs"] and len(argv) == 3:
        env = environment(argv[2])
        needs = sorted({f"{r.name}{r.specifier}" for lines in requirements_in(argv[1]).values()
                        for r in map(Requirement, lines)
                        if canonicalize_name(r.name) in image
                        and (r.marker is None or r.marker.evaluate(env))})
        print("\n".join(needs))
        return 0
    elif argv == ["image-only"]:
        names = {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()}
        problems = [f"{name} is installed but the GPU image does not have it"
                    for name in sorted(names - set(image) - TOOLING)]
        what = f"{len(names)} packages of {sys.prefix} against the image's list"
    else:
        print(__doc__)
        return 2
    print(f"{what}: " + ("OK" if not problems else f"{len(problems)} problem(s)"))
    print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
