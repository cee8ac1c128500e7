"""Answers an instructor should read: flags for review in the grading report.

    review_flags(notebook) -> {part: [why to read that answer]}

An answer cell is flagged when it touches the runner, the system or the libraries: call frames,
the garbage collector, /proc, processes and sessions, links, databases, code objects, closures,
profilers, TorchScript, an attribute look-up of its own (`__getattribute__`), a subclass of a
module's type, imports by a name built at run time, `exec`, `ctypes`, signals, `sys.modules`,
assignments to attributes of torch, numpy and the like; and when it imports a module that is not
installed where grading runs (red team 45g, A07: pandas, which Colab has). A name put together
from pieces of text (`getattr(sys, "get" + "profile")`) is read as if written. Never runs student
code: answers are only parsed. A flag is a reason to read the answer, not a verdict: honest
answers are not flagged (the tests check every exercise's solutions), and an answer that hides its
tricks well may not be.
"""
import ast
import functools
import importlib.util
import re
import sys
import threading

from grader.notebooks import example, grade_id, source_text, student_code, without_magics

PARSING = threading.Lock()      # CPython 3.11's ast.parse is not safe in two threads at once
# An answer cell is parsed in the grader's own process only up to this length: a 4 MB cell of one
# list took 2 GB to parse (red team 45 A02). No honest answer cell is near it.
PARSED_CHARS = 200_000
# Nor a notebook whose answer cells hold more than this in all: 100 answer cells just under
# PARSED_CHARS each took one grading from about 60 s to 1,154 s (red team 45e, A04). The largest
# solution cell holds 8,452 characters.
ANSWER_CHARS = 400_000
# Nor one holding more braces than this: CPython 3.11 parses f-string fields in quadratic time (a cell
# of 66,000 `{a}` fields took 3.8 s a parse, 25 s in all, under the lock every worker needs: red team
# 45c, A04). No honest answer cell holds a thousand.
BRACES = 5_000


def not_parsed(text: str) -> str | None:
    """Why the grader's own process does not parse this answer cell, or None: it is still run and
    graded in its sandbox, but no later part can use the names it defines."""
    if len(text) > PARSED_CHARS:
        return f"is longer than {PARSED_CHARS:,} characters: not read here"
    if text.count("{") > BRACES:
        return f"holds more than {BRACES:,} braces: not read here"
    return None


# Code CPython runs with profilers and tracers off (an audit hook's; a sys.monitoring callback's):
# unseen by the own-work check and the Python side of the check of forbidden calls.
UNWATCHED_BY_PROFILERS = "runs unseen by the own-work check (the grader adds none while a part is graded)"
# A finalizer runs wherever the garbage collector frees its object (red team 23, A01).
FINALIZER = "defines a finalizer (`__del__`, `weakref.finalize`), which runs wherever its object is freed"
# What an answer needs no part of: reaching into the runner, the system or the libraries. Each is
# a reason for the instructor to read the answer (a flag, not a verdict: the grade stands).
SUSPECT_CALLS = {
    "_getframe": "reads the call stack", "currentframe": "reads the call stack",
    "get_referrers": "searches the garbage collector", "get_objects": "searches the garbage collector",
    "fork": "starts processes", "forkpty": "starts processes", "setsid": "starts a new session",
    "Popen": "starts processes", "system": "runs a shell command", "spawnv": "starts processes",
    "symlink": "makes symbolic links", "link": "makes links", "settrace": "switches tracers",
    "setprofile": "switches profilers", "__import__": "imports by name", "exec": "runs code from text",
    "eval": "runs code from text",
    "dup2": "rewires file descriptors", "prctl": "changes process settings", "ptrace": "traces processes",
    # a copy of a library module, imported under another name, escapes the own-work check, which
    # knows the library by its files (red team 45 A05)
    "import_module": "imports modules by name", "spec_from_file_location": "imports a module from a file",
    "module_from_spec": "imports a module from a file", "reload": "reloads modules",
    "resolve_name": "imports modules by name",  # pkgutil's (red team 45g, A02b)
    "locate": "imports modules by name",  # pydoc's (red team 18, A1-A3: `pydoc.locate("mpcourse.formats...")`)
    # runpy's: red team 21, A04 (`runpy.run_module("mpcourse.bench.probes")` inside an audit hook)
    "run_module": "runs a module by name", "run_path": "runs a module from a file",
    # code CPython runs with profilers off (red team 21, A03, A04; refused by grader/hidden_tests.py)
    "addaudithook": f"adds an audit hook, whose code {UNWATCHED_BY_PROFILERS}",
    # red team 23, A01: a finalizer that asked logging where it ran, and computed only inside a watcher
    "findCaller": "reads the call stack", "finalize": FINALIZER,
}
# Calls that import a module named by their first argument: a name built at run time hides which
# (red team 45g, A02b: `pkgutil.resolve_name("mpcourse" + ".formats:...")`).
IMPORTS_BY_NAME = {"import_module", "resolve_name", "__import__", "find_spec", "locate", "run_module"}
# What runs unseen by the own-work watcher (a Python profiler): TorchScript runs in torch's C++
# interpreter (red team 45g, A01b, A01c: `torch.softmax` and a forbidden fused kernel called from a
# `torch.jit.CompilationUnit`, 10 of 10, unflagged; the forbidden calls are now seen at torch's
# dispatcher, mpcourse.grading._ForbiddenOps, a library function compiled so is not).
UNWATCHED = "runs unseen by the check of own work (the course library's functions)"
# What switches off the check of forbidden calls, a torch dispatch mode (mpcourse.grading._ForbiddenOps).
DISPATCH = "switches torch's dispatch modes (the check of forbidden calls is one)"
# What reads or replaces the watcher itself: its profiler, and the list of calls it keeps in its
# closure (red team 45g, A02b: `sys.getprofile().__closure__[i].cell_contents.clear()`).
WATCHER = "the own-work check"
SUSPECT_NAMES = {
    "f_back": "reads the call stack", "f_locals": "reads the call stack", "f_globals": "reads the call stack",
    "tb_frame": "reads the call stack", "gi_frame": "reads the call stack",
    "__code__": "rewrites code objects", "co_code": "rewrites code objects", "CodeType": "rewrites code objects",
    **dict.fromkeys(("__defaults__", "__kwdefaults__"), "rewrites functions' default arguments"),
    "FunctionType": "builds functions from code objects", "__globals__": "reaches into a function's globals",
    "sqlite3": "opens databases", "inspect": "inspects frames or source", "gc": "searches the garbage collector", "ctypes": "calls C directly", "signal": "handles signals",
    "multiprocessing": "starts processes", "subprocess": "starts processes", "pty": "starts processes",
    **dict.fromkeys(("threading", "_thread", "concurrent", "Thread", "ThreadPoolExecutor"),
                    "starts threads (one started before the tests runs unwatched by the checks of "
                    "forbidden calls and of own work)"),
    "__module__": "finds modules through objects", "__file__": "reads where a module's file is",
    "importlib": "imports modules by name", "pkgutil": "imports modules by name", "pydoc": "imports modules by name",
    "runpy": "imports modules by name",
    "monitoring": f"uses sys.monitoring, whose callbacks' code {UNWATCHED_BY_PROFILERS}",
    **dict.fromkeys(("jit", "CompilationUnit"), f"compiles TorchScript, which {UNWATCHED}"),
    "_C": f"calls torch's C internals, which {UNWATCHED} and can switch off the check of forbidden calls",
    **dict.fromkeys(("_python_dispatch", "TorchDispatchMode", "_disable_current_modes", "_pop_mode",
                     "DisableTorchDispatch", "_DisableTorchDispatch", "_ExcludeDispatchKeyGuard"), DISPATCH),
    **dict.fromkeys(("__closure__", "cell_contents"), f"reads functions' closures (where {WATCHER} keeps its record)"),
    **dict.fromkeys(("getprofile", "gettrace", "setprofile", "settrace", "setprofile_all_threads",
                     "settrace_all_threads"), f"reads or switches profilers ({WATCHER} is one)"),
    "__builtins__": "changes built-ins", "builtins": "changes built-ins", "__class__": "changes an object's class",
    "__subclasses__": "walks the class tree", "__dict__": "reaches into objects' dictionaries",
    "mpcourse": ("uses the course library, whose reference implementations the own-work check watches "
                 "for (an observation the answer's process could forge)"),
    # the caller's name read through traceback told the runner's check from the tests (red team 16d, A)
    **dict.fromkeys(("extract_stack", "walk_stack", "format_stack", "print_stack", "StackSummary",
                     "_getframe", "currentframe"), "reads the call stack"),
    **dict.fromkeys(("__getattribute__", "__getattr__"), "changes how attributes are looked up (an object, a module "
                    "given a class of the answer's, can then hand each caller what the answer chooses)"),
    "ModuleType": "uses the type of modules (a module given a subclass answers look-ups as the answer chooses)",
}
# Red team 16d, A: the answer gave the shared `grading` module a subclass of its type whose
# `__getattribute__` handed the tests an unwatched own_work and the runner's check the real one
# (a forbidden torch.softmax, full marks, unflagged).
LOOKUP = SUSPECT_NAMES["__getattribute__"]
MODULE_CLASS = ("subclasses a module's type (`types.ModuleType`, or `type(x)` of an object as a base class: a "
                "module given that class answers look-ups as the answer chooses)")
# getattr(sys, "get" + "profile"): a name put together from pieces of text hid what it reaches from
# every flag above (red team 45h, A01: the watcher's record cleared, a forbidden torch.softmax 10 of
# 10; A05: the checker's secret and the runner's frames read, both unflagged). Such text is put
# together here as Python would, and read as if written. (Text computed in other ways is not.)
ATTRIBUTE_CALLS = {"getattr", "setattr", "delattr", "hasattr"}
# Plain text is read for the names no honest text holds ("getprofile", "cell_contents", "__closure__"),
# not for words ("signal", "link", "mpcourse") that a printed label may: k = "getprofile"; getattr(sys, k)
UNMISTAKABLE = {"getprofile", "gettrace", "setprofile", "settrace", "currentframe", "CompilationUnit", "CodeType",
                "addaudithook",
                "FunctionType", "get_referrers", "get_objects"}
# The longest text put together: any text made of a cell's literals is at most the cell's own length
# (PARSED_CHARS), and is read whole (a shorter cut let 10,000 characters of padding hide a name).
FOLDED_CHARS = PARSED_CHARS
SUSPECT_TEXT = {"/proc": "reads /proc", "/dev/fd": "reads file descriptors", "/sys": "reads /sys",
                "gradebook": "mentions the gradebook", ".db": "mentions a database file", "sqlite": "opens databases",
                "hidden_tests": "mentions the hidden-test runner", "RESULT": "mentions the runner's result line",
                "sys.path": "changes where modules are imported from"}
LIBRARIES = {"torch", "numpy", "np", "math", "builtins", "grading", "mpcourse", "sys", "os", "F", "nn"}


def library_of(node) -> str | None:
    """`torch` for `torch`, `torch.Tensor`, `torch.nn.functional[...]`: the library an expression
    names, if it starts with one."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) and node.id in LIBRARIES else None


@functools.lru_cache(maxsize=4096)
def installed(module: str) -> bool:
    """Whether a top-level module can be imported here, where grading runs (found, never imported)."""
    if module in sys.builtin_module_names or module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return True  # not known to be missing


def imported(node) -> list[str]:
    """The dotted names an import statement names: its modules, and for `from M import a, b`, M.a, M.b."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [f"{node.module}.{alias.name}" for alias in node.names]
    return []


def module_flags(name: str) -> set[str]:
    """Why to read an answer that imports the module `name` (dotted, or `pkg.mod:attr`)."""
    parts = name.replace(":", ".").split(".")
    found = {SUSPECT_NAMES[part] for part in parts if SUSPECT_NAMES.get(part)}
    if parts[0] and not installed(parts[0]):
        shown = parts[0] if len(parts[0]) <= 60 else parts[0][:57] + "..."  # the student's text (red team 45j, A03)
        found.add(f"imports {shown}, which is not installed where grading runs (the part fails with "
                  "ModuleNotFoundError)")
    return found


def name_flags(text: str, unmistakable: bool = False) -> set[str]:
    """Why to read an answer that names `text` (an attribute's or a module's name, or text that
    holds such names): the flags each identifier in it would raise, written out (`unmistakable`:
    only names that hold an underscore, or are in UNMISTAKABLE)."""
    found = set()
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text[:FOLDED_CHARS]):
        if not unmistakable or "_" in word or word in UNMISTAKABLE:
            found |= {why for why in (SUSPECT_NAMES.get(word), SUSPECT_CALLS.get(word)) if why}
    return found


def folded(node) -> str | None:
    """The text an expression puts together from two or more literal pieces ("get" + "pro" + "file",
    "".join(["f_lo", "cals"]), f"{'cell_'}contents"), or None: one that reads a variable, or is one
    literal only (read by `name_flags(..., unmistakable=True)`)."""
    def text(n, depth=0):
        if depth > 50:
            return None
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            return n.value
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            pieces = [text(operand, depth + 1) for operand in added(n)]
            return None if None in pieces else "".join(pieces)
        if isinstance(n, ast.JoinedStr):
            parts = [text(v.value if isinstance(v, ast.FormattedValue) else v, depth + 1) for v in n.values]
            return None if None in parts else "".join(parts)[:FOLDED_CHARS]
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "join" and len(n.args) == 1
                and isinstance(n.args[0], (ast.List, ast.Tuple))):
            glue, parts = text(n.func.value, depth + 1), [text(e, depth + 1) for e in n.args[0].elts]
            return None if glue is None or None in parts else glue.join(parts)[:FOLDED_CHARS]
        return None
    if isinstance(node, ast.Constant) or not isinstance(node, (ast.BinOp, ast.JoinedStr, ast.Call)):
        return None
    return text(node)


def added(node) -> list:
    """The operands of a sum `a + b + c + ...` in order, however deeply it nests: flattened without
    recursion (red team 23, A08: 55 empty strings in front of "get" + "pro" + "file" took the sum past
    the depth the folding read, and the name went unflagged)."""
    operands, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            stack += [n.right, n.left]
        else:
            operands.append(n)
    return operands


def literal_runs(node) -> list[str]:
    """The texts that consecutive literal pieces of the sum `node` put together ("get" + "profile" in
    `x + "get" + "profile"`): what folding the whole sum, which reads a variable, would miss."""
    runs, run = [], []
    for operand in added(node):
        piece = folded(operand) if not isinstance(operand, ast.Constant) else (
            operand.value if isinstance(operand.value, str) else None)
        if piece is None:
            runs, run = runs + ["".join(run)] * (len(run) > 1), []
        else:
            run.append(piece)
    return runs + ["".join(run)] * (len(run) > 1)


def module_base(node) -> bool:
    """Whether a base class names the type of modules (`types.ModuleType`, `ModuleType`) or the type of
    an object (`type(grading)`): a class that a module's `__class__` may be set to."""
    if isinstance(node, ast.Starred):
        node = node.value
    if isinstance(node, (ast.Name, ast.Attribute)):
        return (node.id if isinstance(node, ast.Name) else node.attr) == "ModuleType"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"
            and len(node.args) == 1 and not node.keywords)


def class_flags(node) -> set[str]:
    """Why to read an answer for a class it makes (a `class` statement, `type(name, bases, namespace)`,
    `types.new_class(name, bases)`) on a module's type."""
    if isinstance(node, ast.ClassDef):
        bases = node.bases
    elif isinstance(node, ast.Call) and len(node.args) >= 2 and (
            (isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 3)
            or (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")) == "new_class"):
        bases = node.args[1].elts if isinstance(node.args[1], (ast.Tuple, ast.List)) else []
    else:
        return set()
    return {MODULE_CLASS} if any(module_base(base) for base in bases) else set()


def as_released(code: str) -> str:
    """A cell's code with its line endings and trailing spaces as the release writes them: an
    example cell saved by a Windows editor (`\r\n`) is still the release's, not the student's own
    (red team 45h, A06: every example cell was flagged "uses the course library")."""
    return "\n".join(line.rstrip() for line in code.replace("\r\n", "\n").replace("\r", "\n").split("\n")).strip()


def own_statements(code: str, released: set[str]) -> str:
    """An example cell the student changed (the set-up cell with an import added), read for what
    the student wrote: its top-level statements that no released set-up or example cell holds
    (`released`: their `ast.dump`s). Otherwise the set-up cell's own library imports flagged a part
    whose answer used none (student walkthrough 48g, D3). Never raises: a cell too long or too
    braced to parse here (`not_parsed`), or one that does not parse or unparse (a statement 500
    levels deep: ast.unparse's RecursionError failed the student's whole grading, red team 16d, B3),
    is read whole."""
    if not_parsed(code):  # as the later parse (red team 16d, B4: 60,000 f-string fields took 3.6 s)
        return code
    try:
        with PARSING:
            body = ast.parse(without_magics(code)).body
        return "\n".join(ast.unparse(node) for node in body if ast.dump(node) not in released)
    except Exception:  # SyntaxError, ValueError, RecursionError, MemoryError, ...
        return code


def released_statements(source: dict) -> set[str]:
    """The `ast.dump`s of the top-level statements of the release's set-up and example cells: the
    instructor's code cells with no grade_id, or grade_id "setup". Never those of test cells (visible
    or hidden) or solution cells: a test's statement pasted into a changed set-up cell is read (red
    team 16d, B1: ex7's `module.__class__ = foreign` loop, B2: a hidden test's library import)."""
    found = set()
    for cell in source["cells"]:
        if released_example(cell):
            try:
                with PARSING:  # as every parse of the grader's (red team 23, A11: a parse outside the lock, beside
                    body = ast.parse(without_magics(source_text(cell))).body  # another, raised SystemError)
                found |= {ast.dump(node) for node in body}
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                pass
    return found


def released_example(cell: dict) -> bool:
    """Whether a cell of the instructor's source is a set-up or example cell, as released to students."""
    return cell.get("cell_type") == "code" and grade_id(cell) in (None, "setup")


def review_flags(submission: dict, source: dict | None = None) -> dict[str, list[str]]:
    """{part: [why to read it]} for answer cells that touch the runner, the system or the libraries
    (parsed, never run): frames, /proc, processes, links, databases, code objects, assignments to
    attributes of torch, numpy and the like. With the instructor's `source`, the cells the student
    added are read too, as the part whose hidden tests run them (grader/notebooks.py, `student_code`)."""
    flags: dict[str, set] = {}
    if source is not None:  # the notebook's own example cells as released are the instructor's, not read
        released = {as_released(without_magics(source_text(c))) for c in source["cells"] if released_example(c)}
        statements = released_statements(source)
        cells = [(name, own_statements(code, statements) if example(name) else code)
                 for name, code in student_code(submission, source)
                 if not (example(name) and as_released(code) in released)]
    else:
        cells = [(grade_id(c), source_text(c)) for c in submission["cells"]
                 if c.get("cell_type") == "code" and grade_id(c) and "solution" in grade_id(c)]
    for gid, text in cells:
        found = {why for needle, why in SUSPECT_TEXT.items() if needle in text}
        try:
            if not_parsed(text):
                raise ValueError(not_parsed(text))
            with PARSING:
                tree = ast.parse(without_magics(text))  # as the runner reads it (red team 45e, A05)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            found.add(not_parsed(text) or "cannot be parsed")
            tree = ast.Module(body=[], type_ignores=[])
        inside_sums = {id(part) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add)
                       for part in (n.left, n.right)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if SUSPECT_CALLS.get(called):
                    found.add(SUSPECT_CALLS[called])
                if called in ("setattr", "delattr") and node.args and library_of(node.args[0]):
                    found.add(f"assigns to an attribute of {library_of(node.args[0])}")
                if called == "vars" and node.args and library_of(node.args[0]):  # vars(grading)[...] = (17c, C3, C8)
                    found.add(f"reaches into the namespace of {library_of(node.args[0])}")
                if called in ATTRIBUTE_CALLS and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                    found |= name_flags(str(node.args[1].value))  # getattr(sys, "getprofile"): as if written
                elif (called in ATTRIBUTE_CALLS and len(node.args) >= 2 and library_of(node.args[0])
                      and folded(node.args[1]) is None):  # getattr(torch.utils, "...".[::-1]) (red team 17b, B5)
                    found.add(f"reaches an attribute of {library_of(node.args[0])} by a name built at run time")
                if called in IMPORTS_BY_NAME and node.args:
                    first = node.args[0]
                    named = isinstance(first, ast.Constant) and isinstance(first.value, str)
                    found |= module_flags(first.value) if named else {"imports a module whose name is built at run time"}
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found |= name_flags(node.value, unmistakable=True)  # k = "getprofile"; getattr(sys, k)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # each sum once, whole, not each part of it
                texts = literal_runs(node) if id(node) not in inside_sums else []
            else:
                texts = [t] if (t := folded(node)) is not None else []
            for pieces in texts:  # "get" + "profile": text put together from pieces, read as written
                found |= name_flags(pieces) | {why for needle, why in SUSPECT_TEXT.items() if needle in pieces}
            for module in imported(node):
                found |= module_flags(module)
            found |= class_flags(node)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("__getattribute__", "__getattr__"):
                found.add(LOOKUP)  # a class's attribute look-up of its own (red team 16d, A)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__del__":
                found.add(FINALIZER)
            if isinstance(node, ast.Attribute) and node.attr == "modules" and library_of(node.value) == "sys":
                found.add("looks modules up in sys.modules (the course library's among them)")
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name and SUSPECT_NAMES.get(name):
                found.add(SUSPECT_NAMES[name])
            targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                       if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            targets += node.targets if isinstance(node, ast.Delete) else []
            for target in targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)) and library_of(target.value):
                    found.add(f"assigns to an attribute of {library_of(target.value)}")
        if found:
            flags.setdefault(gid.split("_")[0], set()).update(found)
    return {part: sorted(why) for part, why in flags.items()}
