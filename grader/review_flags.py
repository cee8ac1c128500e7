"""Answers an instructor should read: flags for review in the grading report.

    review_flags(notebook) -> {part: [why to read that answer]}

An answer cell is flagged when it touches the runner, the system or the libraries: call frames,
the garbage collector, /proc, processes and sessions, links, databases, code objects, `exec`,
`ctypes`, signals, assignments to attributes of torch, numpy and the like. Never runs student
code: answers are only parsed. A flag is a reason to read the answer, not a verdict: honest
answers are not flagged (the tests check every exercise's solutions), and an answer that hides its
tricks well may not be.
"""
import ast
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
}
SUSPECT_NAMES = {
    "f_back": "reads the call stack", "f_locals": "reads the call stack", "f_globals": "reads the call stack",
    "tb_frame": "reads the call stack", "gi_frame": "reads the call stack",
    "__code__": "rewrites code objects", "co_code": "rewrites code objects", "CodeType": "rewrites code objects",
    "FunctionType": "builds functions from code objects", "__globals__": "reaches into a function's globals",
    "sqlite3": "opens databases", "inspect": "inspects frames or source", "gc": "searches the garbage collector", "ctypes": "calls C directly", "signal": "handles signals",
    "multiprocessing": "starts processes", "subprocess": "starts processes", "pty": "starts processes",
    **dict.fromkeys(("threading", "_thread", "concurrent", "Thread", "ThreadPoolExecutor"),
                    "starts threads (one started before the tests runs unwatched by the checks of "
                    "forbidden calls and of own work)"),
    "__module__": "finds modules through objects", "__file__": "reads where a module's file is",
    "importlib": "imports modules by name",
    "__builtins__": "changes built-ins", "builtins": "changes built-ins", "__class__": "changes an object's class",
    "__subclasses__": "walks the class tree", "__dict__": "reaches into objects' dictionaries",
    "mpcourse": ("uses the course library, whose reference implementations the own-work check watches "
                 "for (an observation the answer's process could forge)"),
}
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


def review_flags(submission: dict, source: dict | None = None) -> dict[str, list[str]]:
    """{part: [why to read it]} for answer cells that touch the runner, the system or the libraries
    (parsed, never run): frames, /proc, processes, links, databases, code objects, assignments to
    attributes of torch, numpy and the like. With the instructor's `source`, the cells the student
    added are read too, as the part whose hidden tests run them (grader/notebooks.py, `student_code`)."""
    flags: dict[str, set] = {}
    if source is not None:  # the notebook's own example cells as released are the instructor's, not read
        released = {without_magics(source_text(c)) for c in source["cells"] if c.get("cell_type") == "code"}
        cells = [(name, code) for name, code in student_code(submission, source)
                 if not (example(name) and code in released)]
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
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if SUSPECT_CALLS.get(called):
                    found.add(SUSPECT_CALLS[called])
                if called in ("setattr", "delattr") and node.args and library_of(node.args[0]):
                    found.add(f"assigns to an attribute of {library_of(node.args[0])}")
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else (
                node.names[0].name if isinstance(node, (ast.Import, ast.ImportFrom)) and node.names else None)
            if isinstance(node, ast.ImportFrom) and node.module:
                name = node.module
            if name and SUSPECT_NAMES.get(name.split(".")[0]):
                found.add(SUSPECT_NAMES[name.split(".")[0]])
            targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                       if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            targets += node.targets if isinstance(node, ast.Delete) else []
            for target in targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)) and library_of(target.value):
                    found.add(f"assigns to an attribute of {library_of(target.value)}")
        if found:
            flags.setdefault(gid.split("_")[0], set()).update(found)
    return {part: sorted(why) for part, why in flags.items()}
