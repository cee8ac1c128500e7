"""The student's copy of a part's tests: the instructor's test cell as grader/hidden_tests.py runs
it on a student's answers. Never runs student code: it rewrites the instructor's source, as text.

    student_copy(test, names=(), withheld=()) -> the test cell, computing no expected value
    without_expected(test) -> the same, for a cell alone (no answer names, nothing withheld)

The copy calls the student's functions on the secret inputs and records what they return; every
expected value, and every function that computes one, exists only in the reference run, which
grader/judge.py compares with the student's. An answer that walks the call stack into the tests'
namespace finds the inputs it was given and nothing that computes an answer. Three steps:

1. every check's expected value (`assert_close`, `assert_equal`) becomes None, and its tolerances
   0 (the judge uses the reference's; a tolerance may be computed from the expected value);
2. what then computes nothing the copy still uses goes: a function or class the cell defines, an
   import, an assignment whose names nothing reads any more (repeated until nothing changes);
   a statement that calls `grading` or one of the student's functions (`names`) always stays;
3. what would still compute an expected value in the student's process is refused, with its line
   (ValueError): a function or class of the cell (or a lambda assigned to a name) that a check's
   expected value used (directly or through a name assigned from it) and that something else
   still uses; a use of a library
   function the grader withholds from the student's sandbox (`withheld`, grader/withheld.py).

Not refused: a helper that such a helper calls and the cell also uses elsewhere (keep reference
computations in helpers of their own). Removing an assignment that drew random numbers would
shift the inputs that follow it: the exercise's full solution would then fail its own hidden
tests, which the course's tests grade.
"""
import ast
import functools
import importlib
from collections import Counter

from grader.review_flags import PARSING  # one lock: ast.parse is not thread-safe in 3.11

CHECKS_WITH_EXPECTED = {"assert_close", "assert_equal"}
CHECKS_WITH_TOLERANCES = {"assert_close", "matches_reference"}  # the judge takes the reference's


def strip_expected(tree: ast.Module) -> list[ast.expr]:
    """Replace every check's expected value in `tree` by None, and its tolerances by 0 (the judge
    uses the reference's: a tolerance may be computed from the expected value); return the
    expressions removed."""
    removed: list[ast.expr] = []

    class Strip(ast.NodeTransformer):
        def visit_Call(self, node):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            for child in [*node.args, *node.keywords]:
                self.visit(child)
            if isinstance(node.func, ast.Attribute):
                self.visit(node.func.value)
            if name in CHECKS_WITH_EXPECTED:
                if len(node.args) > 2 or any(k.arg is None for k in node.keywords) or any(
                        isinstance(a, ast.Starred) for a in node.args):
                    raise ValueError(f"line {node.lineno}: call {name} as {name}(actual, expected, ...): "
                                     "the grader must find its expected value to remove it")
                if len(node.args) >= 2:
                    removed.append(node.args[1])
                    node.args[1] = ast.Constant(None)
                removed.extend(k.value for k in node.keywords if k.arg == "expected")
                node.keywords = [ast.keyword("expected", ast.Constant(None)) if k.arg == "expected" else k
                                 for k in node.keywords]
            if name in CHECKS_WITH_TOLERANCES:
                removed.extend(k.value for k in node.keywords if k.arg in ("rtol", "atol"))
                node.keywords = [ast.keyword(k.arg, ast.Constant(0.0)) if k.arg in ("rtol", "atol") else k
                                 for k in node.keywords]
            return node

        def visit_Name(self, node):  # `check = grading.assert_close` would hide a call from the grader
            if node.id in CHECKS_WITH_EXPECTED:
                raise ValueError(f"line {node.lineno}: {node.id} is used other than called")
            return node

        def visit_alias(self, node):
            if node.name in CHECKS_WITH_EXPECTED and node.asname not in (None, node.name):
                raise ValueError(f"{node.name} is imported as {node.asname}: call it by its name")
            return node

        def visit_Attribute(self, node):
            if node.attr in CHECKS_WITH_EXPECTED:
                raise ValueError(f"line {node.lineno}: {node.attr} is used other than called")
            self.generic_visit(node)
            return node
    Strip().visit(tree)
    return removed


def loads(node: ast.AST) -> Counter:
    """How often each name is read in `node`."""
    return Counter(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))


def bound_names(statement: ast.stmt) -> list[str] | None:
    """The names a removable statement binds (None: never removed). Class bodies are not walked:
    their names are read as attributes (self.x), which `loads` does not see."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [statement.name]
    if isinstance(statement, (ast.Assign, ast.AnnAssign)):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        names = []
        for target in targets:
            for node in ast.walk(target):
                if isinstance(node, ast.Name):
                    names.append(node.id)
                elif not isinstance(node, (ast.Tuple, ast.List, ast.expr_context)):
                    return None  # it changes an object (x[i] = ..., x.a = ...): a side effect, kept
        return names
    return None


def blocks(tree: ast.AST):
    """Every list of statements in `tree` outside class bodies (the module, functions, loops, ...)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt) and not isinstance(node, ast.ClassDef):
                yield node, field
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.stmt, ast.excepthandler)) or isinstance(child, ast.mod):
                stack.append(child)


def remove_dead(tree: ast.Module, kept_names: set[str]) -> None:
    """Remove what nothing reads any more (step 2), until nothing changes."""
    changed = True
    while changed:
        changed, read = False, loads(tree)
        for node, field in list(blocks(tree)):
            kept = []
            for statement in getattr(node, field):
                own = loads(statement)
                if isinstance(statement, (ast.Import, ast.ImportFrom)):
                    aliases = [a for a in statement.names if a.name == "*"
                               or read[(a.asname or a.name).split(".")[0]] > 0 or getattr(statement, "module", "") == "__future__"]
                    if aliases != statement.names:
                        changed = True
                        statement.names = aliases
                    if aliases:
                        kept.append(statement)
                    continue
                names = bound_names(statement)
                calls_kept = any(name in own for name in kept_names) and not isinstance(
                    statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                if names and not calls_kept and all(read[n] - own[n] == 0 for n in names):
                    changed = True
                    continue
                kept.append(statement)
            setattr(node, field, kept or [ast.Pass()])


def defined_helpers(tree: ast.Module) -> dict[str, ast.stmt]:
    """The functions and classes the cell defines, anywhere but in a class body."""
    return {s.name: s for node, field in blocks(tree) for s in getattr(node, field)
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def expected_names(tree: ast.Module, stripped: ast.Module, removed: list[ast.expr], kept_names: set[str]) -> set[str]:
    """Names that compute an expected value (in the original cell, `tree`): read by a check's
    expected value or tolerance, or by the value assigned to such a name, less the drivers of the
    student's code (`grading`, the student's functions, a helper that calls them). Not followed:
    what the student's code is given (an assignment to a name passed to a driver in `stripped`,
    the cell without its expected values: an input), nor the helpers such a helper calls (one that
    also reads the student's results, a function that takes a run's state, say, stays in the copy,
    computing nothing without its caller)."""
    helpers = defined_helpers(tree)
    drivers = set(kept_names)
    while True:
        more = drivers | {name for name, node in helpers.items() if set(loads(node)) & drivers}
        if more == drivers:
            break
        drivers = more
    given = set()  # what a check records is the student's result, not an input
    for call in ast.walk(stripped):
        if isinstance(call, ast.Call) and set(loads(call.func)) & drivers and not (
                isinstance(call.func, ast.Attribute) and call.func.attr in CHECKS_WITH_TOLERANCES | CHECKS_WITH_EXPECTED):
            given |= set().union(*(set(loads(a)) for a in [*call.args, *call.keywords]))
    names = set().union(*(set(loads(e)) for e in removed)) if removed else set()
    assignments = [s for node, field in blocks(tree) for s in getattr(node, field)
                   if isinstance(s, (ast.Assign, ast.AnnAssign)) and s.value is not None
                   and not set(bound_names(s) or ()) & given]
    while True:
        more = set(names)
        for statement in assignments:
            if set(bound_names(statement) or ()) & names:
                more |= set(loads(statement.value))
        if more == names:
            return names - drivers
        names = more


def withheld_uses(tree: ast.Module, withheld) -> list[tuple[int, str]]:
    """(line, dotted name) of each use of a withheld library function left in `tree`: an import of
    it (by any of its names in the library) or an attribute that names it."""
    withheld = set(withheld)
    if not withheld:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mpcourse":
            for alias in node.names:
                path = f"{node.module}.{alias.name}"
                if path in withheld or resolves_to(path) & withheld:
                    found.append((node.lineno, path))
        elif isinstance(node, ast.Attribute):
            dotted = ast.unparse(node)
            if any(w == dotted or w.endswith("." + dotted) for w in withheld if "." in dotted):
                found.append((node.lineno, dotted))
    return found


def resolves_to(path: str) -> set[str]:
    """The withheld-style names (module.name) of the library object `path` names, in the grader's
    own process (the library is the instructor's code): its own module's path and `path` itself."""
    module, _, name = path.rpartition(".")
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return set()
    return {path, f"{getattr(value, '__module__', module)}.{getattr(value, '__qualname__', name)}"}


def student_copy(test: str, names=(), withheld=()) -> str:
    """The test cell `test` as the student's sandbox runs it (see the module's doc). `names`: the
    student's functions the cell may call; `withheld`: the library functions absent there.
    Computed once per cell, names and withheld functions in this process: every student's job of a
    part gets the same copy (a quarter of a second of walking the tree each, hundreds of students)."""
    return _student_copy(test, frozenset(names), frozenset(withheld))


@functools.lru_cache(maxsize=512)
def _student_copy(test: str, names: frozenset, withheld: frozenset) -> str:
    with PARSING:
        tree = ast.parse(test)
        original = ast.parse(test)
    removed = strip_expected(tree)
    with PARSING:
        stripped = ast.parse(ast.unparse(tree))
    expected = expected_names(original, stripped, removed, set(names) | {"grading"})
    remove_dead(tree, set(names) | {"grading"})
    left = defined_helpers(tree)
    for name in sorted(expected & set(left), key=lambda n: left[n].lineno):
        raise ValueError(f"line {left[name].lineno}: {name}, defined in the test cell, computes an expected value "
                         "and is also used outside the checks' expected values, so it would stay in the student's "
                         "copy of the tests, where an answer can call it: compute expected values only inside "
                         "the checks' expected arguments (assert_close(actual, expected)), with helpers nothing "
                         "else uses")
    for node, field in blocks(tree):
        for statement in getattr(node, field):
            if (isinstance(statement, (ast.Assign, ast.AnnAssign)) and set(bound_names(statement) or ()) & expected
                    and any(isinstance(n, ast.Lambda) for n in ast.walk(statement))):
                raise ValueError(f"line {statement.lineno}: a function assigned there (a lambda) computes an expected "
                                 "value and is also used outside the checks' expected values, so it would stay in the "
                                 "student's copy of the tests: compute expected values only inside the checks' "
                                 "expected arguments")
    for line, path in withheld_uses(tree, withheld):
        raise ValueError(f"line {line}: the student's copy of the tests would use {path}, which grading withholds "
                         "from the student's sandbox (a part asks students to write it): use it only inside the "
                         "checks' expected arguments")
    return ast.unparse(ast.fix_missing_locations(tree))


def without_expected(test: str) -> str:
    """`student_copy` of a cell on its own: no answer names to keep, nothing withheld."""
    return student_copy(test)
