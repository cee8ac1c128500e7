"""The course library as a student's hidden-test sandbox sees it: without the answers. Never runs
student code: it reads the instructor's test cells and writes a copy of `mpcourse/`.

    declared(source) -> ["mpcourse.numerics.naive_softmax", ...]   what the parts ask students to write
    library_copy(withheld, folder) -> folder, holding `mpcourse/` with those functions withheld

A part declares the library functions it asks the student to write in its test cell's first
line, `grading.start("Part 1", withheld=("mpcourse.numerics.naive_softmax",))`. Grading gives the
student's hidden-test sandbox a copy of `mpcourse` (and no other) in which each of them is a stub
that raises AttributeError naming the rule, its code absent: no thread, stack walk or rewritten
code object can reach what is not there. So is each private helper of its module (`_name`) that
only withheld code uses (`private_helpers`). The stub keeps the name, so the library's own modules
that import it still import; the library functions built on it fail too, with the same message,
if called. The reference run, the feedback run and the student's own notebook keep the whole
library (students may read it; copying it is plagiarism, as anywhere).
"""
import ast
import functools
import re
import shutil
from pathlib import Path

from grader.course import ROOT
from grader.notebooks import grade_id, source_text
from grader.review_flags import PARSING  # one lock: ast.parse is not thread-safe in 3.11

LIBRARY = ROOT / "mpcourse"


def declared_in(test: str) -> list[str]:
    """The `withheld=` of the `grading.start(...)` calls of a test cell (ValueError if not literal)."""
    with PARSING:
        tree = ast.parse(test)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "start":
            for keyword in node.keywords:
                if keyword.arg == "withheld":
                    try:
                        value = ast.literal_eval(keyword.value)
                    except ValueError:
                        raise ValueError(f"line {node.lineno}: write withheld= as a tuple of strings "
                                         "(\"mpcourse.module.name\", ...)") from None
                    if not (isinstance(value, tuple) and all(isinstance(v, str) for v in value)):
                        raise ValueError(f"line {node.lineno}: withheld= takes a tuple of strings")
                    found += [resolve(v)[0] for v in value]
    return found


def declared(source: dict) -> list[str]:
    """What every part of the instructor's notebook `source` withholds, in notebook order."""
    found = []
    for cell in source["cells"]:
        nbgrader = (cell.get("metadata") or {}).get("nbgrader") or {}
        if nbgrader.get("grade") and cell.get("cell_type") == "code":
            try:
                found += [name for name in declared_in(source_text(cell)) if name not in found]
            except ValueError as error:
                raise ValueError(f"{grade_id(cell)}: {error}") from None
    return found


def resolve(path: str) -> tuple[str, Path, str]:
    """(path, the file that defines it, its name there) of a library function or class named
    `path` (as students call it: `mpcourse.fp8.quantize` is defined in mpcourse/fp8/quantization.py).
    Read from the library's source, never imported: the grader's process does not import torch
    (1.8 s of every `grade`), and re-exports (`from mpcourse.x import name [as other]`) are followed."""
    module, _, name = path.rpartition(".")
    if module.split(".")[0] != "mpcourse" or not name:
        raise ValueError(f"withheld: {path!r} is not a name in the course library (mpcourse.module.name)")
    for _ in range(8):  # a re-export of a re-export, and so on: a cycle ends here
        file = module_file(module)
        if file is None:
            raise ValueError(f"withheld: the course library has no {path}")
        tree = parsed_module(file)
        found = None
        for node in tree.body:  # the last top-level statement that binds `name` is what it is
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                found = ("defined", node)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        found = ("imported", node, alias.name)
            elif name in {target.id for target in bound_by(node)}:
                found = ("bound", node)
        if found is None:
            raise ValueError(f"withheld: the course library has no {path}")
        if found[0] == "defined":
            return path, file.resolve(), name
        if found[0] == "bound":
            raise ValueError(f"withheld: {path} is not a function or class defined at the top of a library module")
        node, name = found[1], found[2]
        module = imported_module(module, file, node)
        if module.split(".")[0] != "mpcourse":
            raise ValueError(f"withheld: {path} is defined outside the course library ({module})")
    raise ValueError(f"withheld: {path} is re-exported too many times to follow")


def parsed_module(file: Path) -> ast.Module:
    """A library file's syntax tree, parsed once per version of the file (each `declared` reads the
    same modules again: 0.5 s a grading for ex3's three names in mpcourse/formats.py)."""
    stat = file.stat()
    return _parsed(file, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _parsed(file: Path, mtime_ns: int, size: int) -> ast.Module:
    with PARSING:
        return ast.parse(file.read_text())


def module_file(module: str) -> Path | None:
    """The file of library module `module` (`mpcourse.fp8` is mpcourse/fp8/__init__.py), or None."""
    parts = module.split(".")[1:]
    if not all(part.isidentifier() for part in parts):
        return None
    base = LIBRARY.joinpath(*parts)
    for file in (base.with_suffix(".py") if parts else None, base / "__init__.py"):
        if file is not None and file.is_file() and file.resolve().is_relative_to(LIBRARY.resolve()):
            return file
    return None


def imported_module(module: str, file: Path, node: ast.ImportFrom) -> str:
    """The module a `from ... import` of `module` (its file `file`) reads from, relative ones resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if file.name == "__init__.py" else module.split(".")[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def bound_by(node: ast.stmt) -> list[ast.Name]:
    """The names a top-level statement binds other than by def, class or from-import."""
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, ast.Import):
        return [ast.Name(id=(a.asname or a.name.split(".")[0])) for a in node.names]
    if isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):  # a conditional binding is not a definition at the top
        return [n for inner in ast.walk(node) if isinstance(inner, (ast.FunctionDef, ast.ClassDef, ast.Assign))
                for n in ([ast.Name(id=inner.name)] if hasattr(inner, "name") else
                          [t for target in inner.targets for t in ast.walk(target) if isinstance(t, ast.Name)])]
    return []


def stub(path: str, name: str, is_class: bool, helper_of: str = "") -> ast.stmt:
    why = (f"it computes part of what {helper_of} does, which a part of this exercise asks you to write" if helper_of
           else "a part of this exercise asks you to write it yourself")
    message = (f"{path} is withheld while your work is graded: {why}, so the graded tests run without it "
               "(the course library is there to read)")
    raising = f"raise AttributeError({message!r})"
    code = (f"class {name}:\n    def __new__(cls, *args, **kwargs):\n        {raising}\n" if is_class
            else f"def {name}(*args, **kwargs):\n    {raising}\n")
    with PARSING:  # as every parse of the grader's: unlocked, it raised SystemError in another student's (red team 30, A08)
        return ast.parse(code).body[0]


LAZY = """
def __getattr__(name):  # the grader's copy: a module is imported when first used (grader/withheld.py)
    import importlib
    if name in __all__:
        return importlib.import_module(f"mpcourse.{name}")
    raise AttributeError(f"module 'mpcourse' has no attribute {name!r}")
"""


def lazy_package(text: str) -> str:
    """mpcourse/__init__.py importing its modules when first used, not all at once: a module
    that calls a withheld function as it is imported (a recipe checking itself) then breaks
    only the tests that use it, not every `from mpcourse import grading`."""
    with PARSING:
        tree = ast.parse(text)
    tree.body = [node for node in tree.body if not (isinstance(node, ast.ImportFrom) and node.module == "mpcourse")]
    with PARSING:
        tree.body += ast.parse(LAZY).body
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def private_helpers(tree: ast.Module, withheld: set[str], elsewhere: str) -> list[str]:
    """The module's private functions (`_name`) that only withheld code uses, directly or through
    other such helpers: what computes a withheld function's answer is out of reach too (red team
    45g, A02b: `round_to`'s private core `_round_bit_level`, reached by a name built at run time,
    gave ex3 Part 2 its points). A helper used at the module's top level, by a function or class
    that is not withheld, or named in another module of the library (`elsewhere`) stays."""
    defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    named_elsewhere = set(re.findall(r"\w+", elsewhere))  # every word of the other modules, read once
    users = {name: set() for name in defined if name.startswith("_") and not name.startswith("__")
             and name not in named_elsewhere}
    for node in tree.body:
        owner = getattr(node, "name", None)  # None: a use at the module's top level
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and inner.id in users and inner.id != owner:
                users[inner.id].add(owner)
    hidden = set(withheld)
    while True:
        more = {name for name, used_by in users.items() if name not in hidden and used_by and used_by <= hidden}
        if not more:
            return sorted(hidden - set(withheld))
        hidden |= more


def library_copy(withheld: list[str], folder: Path) -> Path:
    """`folder`, made to hold a copy of `mpcourse/` (no compiled files) in which every function or
    class of `withheld` is a stub: its definition's code replaced, its name kept; the package's
    modules are imported when first used (`lazy_package`)."""
    shutil.copytree(LIBRARY, folder / "mpcourse", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    init = folder / "mpcourse" / "__init__.py"
    init.write_text(lazy_package(init.read_text()))
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for path in withheld:
        _, file, name = resolve(path)
        by_file.setdefault(file, []).append((path, name))
    for file, names in by_file.items():
        copy = folder / "mpcourse" / file.relative_to(LIBRARY)
        with PARSING:
            tree = ast.parse(file.read_text())
        module = ".".join(("mpcourse", *file.relative_to(LIBRARY).with_suffix("").parts))
        elsewhere = "\n".join(other.read_text() for other in sorted(LIBRARY.rglob("*.py")) if other != file)
        helpers = private_helpers(tree, {name for _, name in names}, elsewhere)  # read before the stubs
        for path, name in names:
            places = [i for i, node in enumerate(tree.body) if getattr(node, "name", None) == name
                      and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            if not places:
                raise ValueError(f"withheld: {path} is not defined at the top of {file.name}")
            for i in places:
                tree.body[i] = stub(path, name, isinstance(tree.body[i], ast.ClassDef))
        for helper in helpers:
            i = next(i for i, node in enumerate(tree.body) if getattr(node, "name", None) == helper)
            tree.body[i] = stub(f"{module}.{helper}", helper, False, helper_of=" or ".join(p for p, _ in names))
        copy.write_text(ast.unparse(ast.fix_missing_locations(tree)) + "\n")
    return folder
