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
import importlib
import inspect
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
    `path` (as students call it: `mpcourse.fp8.quantize` is defined in mpcourse/fp8/quantization.py)."""
    module, _, name = path.rpartition(".")
    if module.split(".")[0] != "mpcourse" or not name:
        raise ValueError(f"withheld: {path!r} is not a name in the course library (mpcourse.module.name)")
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise ValueError(f"withheld: the course library has no {path}") from None
    if not (inspect.isfunction(value) or inspect.isclass(value)) or "." in value.__qualname__:
        raise ValueError(f"withheld: {path} is not a function or class defined at the top of a library module")
    file = Path(inspect.getsourcefile(value)).resolve()
    if not file.is_relative_to(LIBRARY):
        raise ValueError(f"withheld: {path} is defined outside the course library ({file})")
    return path, file, value.__name__


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
    users = {name: set() for name in defined if name.startswith("_") and not name.startswith("__")
             and not re.search(rf"\b{name}\b", elsewhere)}
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
