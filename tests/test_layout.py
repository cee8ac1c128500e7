"""The code's layout rules that reading alone would not keep: no import cycle in `mpcourse` (the
guide's rule; `debugging` and `preflight` once imported each other), and every module of the
grader says which side it is on, the side that runs student code or the side that never does.
Both are read from the source (ast), nothing is imported."""
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_files(package: Path) -> dict[str, Path]:
    """{dotted name: file} of every module of `package` (a package is its __init__.py)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that `name` (at `path`) imports, at its top or inside a function:
    `from a.b import c` is a.b.c where that is a module, else a.b. The module's own packages (a and
    a.b for a.b.c), which Python has run before the module, are not counted, whether named or not:
    importing them runs nothing new (mpcourse.doctor.diagnosis reads the seam `doctor.capability`
    through its package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                        for alias in node.names}
    found = set()
    for target in targets:
        while target and target not in modules:  # import a.b.c of a function c: the module a.b
            target = target.rpartition(".")[0]
        if target and target != name and not name.startswith(target + "."):
            found.add(target)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    files = module_files(package)
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one module (or a module that
    imports itself), as [a, b, ..., a]."""
    index, low, stack, on_stack, groups, counter = {}, {}, [], set(), [], [0]

    def visit(node):  # Tarjan's algorithm
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                groups.append(set(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for group in groups:
        start = min(group)
        path, seen = [start], {start}
        while True:  # follow edges inside the group until the path closes
            step = min(sorted(graph[path[-1]] & group), key=lambda n: (n != start, n in seen, n))
            path.append(step)
            if step == start or step in seen:
                found.append(path[path.index(step):])
                break
            seen.add(step)
    return found


def test_the_cycle_finder_finds_cycles_and_only_cycles(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {"__init__.py": "from pkg import a, b\n", "a.py": "from pkg.b import thing\n",
             "b.py": "def f():\n    from . import c\n", "c.py": "import pkg.a\n",
             "d.py": "from pkg import a\nfrom pkg.sub.e import x\n", "sub/__init__.py": "",
             "sub/e.py": "from ..a import y\nfrom pkg import sub\nimport pkg\n"}
    for name, text in files.items():
        (package / name).write_text(text)
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.a", "pkg.sub.e"} and graph["pkg.sub.e"] == {"pkg.a"}  # not its own packages
    assert graph["pkg"] == {"pkg.a", "pkg.b"}  # a package's __init__ is no edge from its modules
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    (package / "c.py").write_text("import json\n")
    assert cycles(import_graph(package)) == []


def test_mpcourse_has_no_import_cycle():
    found = cycles(import_graph(ROOT / "mpcourse"))
    assert not found, "import cycles in mpcourse: " + "; ".join(" -> ".join(cycle) for cycle in found)


def test_every_grader_module_says_which_side_it_is_on_and_the_map_lists_it():
    """Its docstring says, in so many words, that it runs student code (only the runs, the sandbox
    and the hidden-test runner do, confined) or that it never does; grader/__init__.py lists it."""
    listed = " ".join(ast.get_docstring(ast.parse((ROOT / "grader" / "__init__.py").read_text())).split())
    unsaid, unlisted = [], []
    for path in sorted((ROOT / "grader").glob("*.py")):
        if path.name == "__init__.py":
            continue
        doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split()).lower()
        sides = ("never runs student code" in doc) + bool(re.search(r"(?<!never )runs student code", doc))
        unsaid += [path.name] if sides != 1 else []
        unlisted += [] if path.name == "__main__.py" or re.search(rf"[\s`]{path.stem}[\s`,]", listed) else [path.stem]
    assert not unsaid, f"these modules do not say which side they are on (or say both): {unsaid}"
    assert not unlisted, f"grader/__init__.py's map does not list {unlisted}"


def test_import_mpcourse_imports_no_module_until_it_is_used():
    """`import mpcourse` is cheap (its modules load when first named: a grading sandbox or a
    kernel pays only for what it uses), and an unknown name is a clear AttributeError."""
    code = ("import sys, mpcourse\n"
            "assert 'mpcourse.bench' not in sys.modules and 'matplotlib' not in sys.modules, 'eager import'\n"
            "assert mpcourse.formats.FloatFormat and 'mpcourse.formats' in sys.modules\n"
            "assert 'fp8' in dir(mpcourse)\n"
            "try:\n    mpcourse.no_such_module\nexcept AttributeError as error:\n    assert 'no_such_module' in str(error)\n"
            "else:\n    raise AssertionError('no AttributeError')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_graders_own_process_never_imports_torch():
    """Only the sandboxes run torch: the grader's own side reads records as data (mpcourse.records)
    and never imports it. Its import cost 2-3 s of CPU in every `python -m grader` command
    (collect, results, export, ...), and the test suite starts dozens of them (issue 52)."""
    trusted = [f"grader.{path.stem}" for path in sorted((ROOT / "grader").glob("*.py"))
               if path.stem not in ("__init__", "hidden_tests")]  # hidden_tests: the sandbox's runner
    code = (f"import importlib, sys\nfor name in {trusted!r}:\n    importlib.import_module(name)\n"
            "    assert 'torch' not in sys.modules, name + ' imports torch'\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def unscoped_monkeypatches(source: str) -> list[int]:
    """Lines of `source` that make a `pytest.MonkeyPatch()` outside a `with` statement: its patches
    are never undone, and outlive the test in its worker."""
    tree = ast.parse(source)
    scoped = {id(item.context_expr) for node in ast.walk(tree) if isinstance(node, ast.With) for item in node.items}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "MonkeyPatch"
            and id(node) not in scoped]


def test_no_test_leaves_a_patch_behind_for_the_tests_after_it():
    """A `pytest.MonkeyPatch()` made in a test and never undone replaced schedule.grade_student with
    a stand-in for every later test of its worker: a grading test then failed in one run of the suite
    and passed in the next, by which tests shared its worker."""
    assert unscoped_monkeypatches("import pytest\nwith pytest.MonkeyPatch() as m:\n    pass\n") == []
    assert unscoped_monkeypatches("import pytest\nm = pytest.MonkeyPatch()\n") == [2]
    found = {path.name: lines for path in sorted((ROOT / "tests").glob("*.py"))
             if (lines := unscoped_monkeypatches(path.read_text()))}
    assert found == {}, f"use the monkeypatch fixture or `with pytest.MonkeyPatch() as m:` ({found})"


def test_the_intros_line_count_of_the_library_holds():
    """intro.md: "`mpcourse` (about 13,000 lines)", typed by hand: checked here, so that it fails the
    build when the library grows or shrinks past "about"."""
    intro = " ".join((ROOT / "book" / "intro.md").read_text().split())
    assert "`mpcourse` (about 13,000 lines)" in intro
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "mpcourse").rglob("*.py"))
    assert 12_500 <= lines < 13_500, lines
