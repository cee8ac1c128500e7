"""The nbgrader workflow of the instructor guide, scripted: release, fabricate submissions, grade.

    python tools/autograde.py release           # regenerate exercises/ from solutions/
    python tools/autograde.py check ex4_softmax_stability [...]
                                                # grade fabricated submissions, print per-part scores
    python tools/autograde.py demo [--out grade-demo]
                                                # `make grade-demo`: a whole grading session
    python tools/autograde.py grade ex4_softmax_stability [--course DIR] [--no-sandbox]
            [--jobs N] [--student ID ...] [--regrade] [--no-feedback] [--shard K/N] [--db-url URL]
                                                # grade a real course (tools/schedule.py), then feedback
    python tools/autograde.py prepare ex4_softmax_stability [--course DIR] [--db-url URL]
                                                # once, before `grade --shard K/N` on several machines
    python tools/autograde.py collect ex4_softmax_stability --lms canvas|moodle --zip FILE [--course DIR]
                                                # an LMS download into submitted/ (nbgrader zip_collect)
    python tools/autograde.py pack-feedback ex4_softmax_stability --course DIR --out DIR
                                                # each student's feedback page, named for LMS upload

Every command runs the real `nbgrader` command line in a course directory: the repository root
for `release`, a scratch copy of it for `check` and `demo`. Submissions are fabricated from the
source notebooks, so they follow the exercises as they change:

- full:      every solution cell as the instructor wrote it (markers removed);
- blank:     the release, untouched;
- partial:   the parts in tests/submissions/<assignment>.py PARTIAL_PARTS solved, the rest blank;
- reference: complete, except that one part just calls mpcourse's own implementation;
- hostile:   complete, except that the last part's solution cell does something nasty
             (see HOSTILE), and the corpus of issue 16 (FOOLS, TARGETED, ACCIDENTS, vandal,
             xss_feedback); `demo` and the tests grade them for one assignment.
"""
import argparse
import csv
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grader  # noqa: E402
import gradebook  # noqa: E402
import schedule  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")

# Each replaces the last part's solution cell (nothing later depends on the last part).
HOSTILE = {
    "infinite_loop": "while True:\n    pass",
    "sys_exit": "import sys\nsys.exit('I am done')",
    "os_exit": "import os\nos._exit(0)",
    "gigantic_output": "print('x' * 50_000_000)\nfor _ in range(100_000):\n    print('spam ' * 20)",
    "hides_errors": "get_ipython().set_custom_exc((BaseException,), lambda *args, **kwargs: None)",
    "monkeypatch": (
        "import builtins, numpy, torch\n"
        "from mpcourse import grading\n"
        "numpy.allclose = lambda *args, **kwargs: True\n"
        "numpy.testing.assert_allclose = lambda *args, **kwargs: None\n"
        "torch.testing.assert_close = lambda *args, **kwargs: None\n"
        "torch.allclose = lambda *args, **kwargs: True\n"
        "grading.assert_close = lambda *args, **kwargs: None\n"
        "grading.own_work = lambda function, *args, **kwargs: function(*args, **kwargs)\n"),
    "snoops_for_hidden_tests": (
        "import glob, os\n"
        "found = []\n"
        "course = os.path.join(os.getcwd(), '..', '..', '..')  # autograded/<student>/<assignment>\n"
        "for path in glob.glob(os.path.join(course, '**', '*.ipynb'), recursive=True):\n"
        "    try:\n"
        "        if 'BEGIN HIDDEN TESTS' in open(path).read():\n"
        "            found.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('notebooks with hidden tests that I could read:', len(found))"),
}
# Submissions that change the last part's read-only test cell: the new source, or None to delete it.
EDITS = {
    "edited_test_cell": "print('all tests pass!')",
    "deleted_test_cell": None,
}



# The hostile corpus of issue 16, graded in one run by the tests and `make grade-demo` (the target
# assignment's names are used where an attack needs them). FOOLS try for marks without working code:
# each starts from WRONG answers (every asked-for name defined, every result wrong) and must score 0.
# ACCIDENTS are honest slips on full solutions: at most the part named in ACCIDENT_COSTS is lost.
FAKE_PASS = ("print('\N{CHECK MARK} Part 1: all tests in this cell pass.')\n"
             "print('RESULT {\"p1_tests\": {\"passed\": true, \"message\": \"\"}}')\n")
STEAL_EXPECTED = (
    "import numpy as _np, torch as _torch\n"
    "from mpcourse import grading as _grading\n"
    "_close, _equal = _grading.assert_close, _grading.assert_equal\n"
    "_grading.assert_close = lambda actual, expected, **kw: _close(expected, expected, **kw)\n"
    "_grading.assert_equal = lambda actual, expected, **kw: _equal(expected, expected, **kw)\n"
    "_grading._check_untampered = lambda: None\n"
    "_torch.Tensor.__le__ = _torch.Tensor.__ge__ = lambda self, other: _torch.ones_like(self, dtype=_torch.bool)\n"
    "_torch.Tensor.allclose = lambda *args, **kwargs: True\n"
    "_np.allclose = lambda *args, **kwargs: True\n")
FOOLS = {
    "skip_execution_tags": {"tag_tests": "skip-execution"},
    "displayhook_credit": {"prefix": "import sys\nsys.displayhook(100.0)\n", "in_functions": "sys.displayhook(100.0)"},
    "ipython_hooks": {"first": (
        "ip = get_ipython()\n"
        "ip.events.register('pre_run_cell', lambda *args: sys.displayhook(100.0))\n"
        "ip.input_transformers_post.append(lambda lines: ['grading.passed(\"Part\")\\n']\n"
        "                                  if any('grading.start' in line for line in lines) else lines)\n")},
    "rebinds_names": {"first": (
        "class Lenient:\n"
        "    def __getattr__(self, name):\n"
        "        return lambda *args, **kwargs: True\n"
        "grading = Lenient()\n"
        "class Liar:\n"
        "    def __getattr__(self, name):\n"
        "        return lambda *args, **kwargs: True\n"
        "torch = math = np = Liar()\n")},
    "colab_cell_poison": {"colab": (
        "import numpy, torch\n"
        "numpy.all = lambda *args, **kwargs: True\n"
        "numpy.allclose = lambda *args, **kwargs: True\n"
        "torch.isnan = lambda *args, **kwargs: True\n")},
    "fake_pass_line": {"prefix": FAKE_PASS},
    # Issue 32: a forged record of the part's checks on every file descriptor, then exit (the old
    # runner took "passed" from the pipe).
    "forges_records": {"prefix": (
        "import os as _os\n"
        "_forged = b'{\"observations\": [], \"stopped\": null, \"passed\": true, \"message\": \"\"}'\n"
        "for _fd in range(1, 1024):\n"
        "    try:\n"
        "        _os.write(_fd, _forged)\n"
        "    except OSError:\n"
        "        pass\n"
        "_os._exit(0)\n")},
    "always_equal_float": {"returns": (
        "class AlwaysEqual(float):\n"
        "    __eq__ = __le__ = __ge__ = __lt__ = __gt__ = lambda self, other: True\n"
        "    __ne__ = lambda self, other: False\n"
        "    __hash__ = float.__hash__\n"), "value": "AlwaysEqual(0.0)"},
}
# Attacks that need the target's own functions (ex4_softmax_stability): {student: {cell: source}},
# each scoring 0 on the parts of the cells it replaces (full solutions elsewhere).
TARGETED = {
    "watcher_switched_off": {"p3_solution": (
        "def stable_softmax(x, dim=-1):\n"
        "    import sys\n"
        "    from mpcourse.numerics import stable_softmax as reference\n"
        "    saved = sys.getprofile()\n"
        "    sys.setprofile(None)\n"
        "    try:\n"
        "        return reference(x, dim=dim)\n"
        "    finally:\n"
        "        sys.setprofile(saved)\n")},
    "forbidden_softmax": {"p3_solution": (
        "def stable_softmax(x, dim=-1):\n"
        "    if not isinstance(x, torch.Tensor) or not x.is_floating_point():\n"
        "        raise TypeError('a floating-point tensor, please')\n"
        "    wide = torch.float64 if x.dtype == torch.float64 else torch.float32\n"
        "    return torch.softmax(x.to(wide), dim=dim).to(x.dtype)\n")},
    # Issue 32: the comparisons made vacuous (tensor comparisons always true, the checker told to
    # record the expected value as the answer's) around an answer of the right shape, dtype and NaN
    # pattern whose values are wrong. It scores if the student's copy of the tests keeps them.
    "steals_expected": {"p3_solution": STEAL_EXPECTED + (
        "\n\ndef stable_softmax(x, dim=-1):\n"
        "    if not isinstance(x, torch.Tensor) or not x.is_floating_point():\n"
        "        raise TypeError('a floating-point tensor, please')\n"
        "    dead = torch.isneginf(x).all(dim=dim, keepdim=True)\n"
        "    return torch.where(dead, torch.nan, torch.where(torch.isneginf(x), 0.0, 0.5)).to(x.dtype)\n")},
    # Issue 32: right for the visible inputs only (hard-coded), wrong on any other.
    "visible_inputs_only": {"p1_solution": (
        "def naive_softmax(x, dim=-1):\n"
        "    if not isinstance(x, torch.Tensor) or not x.is_floating_point():\n"
        "        raise TypeError('a floating-point tensor, please')\n"
        "    if tuple(x.shape) in ((2, 3), (2,)):  # the visible tests' inputs\n"
        "        e = torch.exp(x)\n"
        "        return e / e.sum(dim=dim, keepdim=True)\n"
        "    return torch.full_like(x, 1.0 / x.shape[dim])\n")},
    "uses_the_tests_helper": {"p2_solution": (
        "def first_overflow(dtype, device='cpu'):\n"
        "    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:\n"
        "        raise TypeError('a floating-point dtype, please')\n"
        "    x = torch.tensor(math.log(overflow_threshold(dtype)), dtype=torch.float64).to(dtype)\n"
        "    while not torch.isinf(torch.exp(x)):\n"
        "        x = torch.nextafter(x, torch.tensor(math.inf, dtype=dtype))\n"
        "    return x.item()\n")},
}
# What the grader cannot prove (instructor guide): an answer that calls the library's reference
# after rewriting the code objects of the library's functions (so the own-work watcher does not
# see them) gets the points its correct values earn; the review flags name it for the instructor.
LIMITS = {
    "rewrites_library_code": {"p3_solution": (
        "from mpcourse import numerics as _numerics\n"
        "for _f in (_numerics.stable_softmax, _numerics._wide, _numerics._check_floating):\n"
        "    _f.__code__ = _f.__code__.replace(co_filename='<a notebook cell>')\n"
        "\n\ndef stable_softmax(x, dim=-1):\n"
        "    return _numerics.stable_softmax(x, dim=dim)\n")},
}
ACCIDENTS = {
    "duplicated_test_cell": "p1_tests", "duplicated_solution_cell": "p2_solution",
    "test_cell_above_solution": "p3_tests", "test_cell_marked_solution": "p2_tests",
    "slow_c_call": "p1_solution", "ignores_sigint": "p1_solution", "runtime_warning": "p1_solution",
}
ACCIDENT_COSTS = {"slow_c_call": "p1", "ignores_sigint": "p1"}  # the part a slip may cost
SLOW_C_CALL = "_ = torch.randn(6000, 6000, dtype=torch.float64) @ torch.randn(6000, 6000, dtype=torch.float64)\n"
IGNORES_SIGINT = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n"
# Against other students, the gradebook and the feedback (full solutions otherwise).
VANDAL_MARK = "mpcourse-vandal-4f1c"
VANDAL = (
    "import glob, os, subprocess, sys\n"
    "for path in glob.glob('/tmp/**/gradebook.db', recursive=True) + glob.glob('/tmp/**/submitted/**/*.ipynb', recursive=True):\n"
    "    try:\n"
    "        open(path, 'w').write('vandalised')\n"
    "    except OSError:\n"
    "        pass\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '" + VANDAL_MARK + "'],\n"
    "                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n")
SCRIPT_MARK = "PWNED-by-student"
XSS_MARKDOWN = (f"<script>alert('{SCRIPT_MARK}')</script> <img src=x onerror=\"alert('{SCRIPT_MARK}')\">\n"
                f"<iframe src=\"javascript:alert('{SCRIPT_MARK}')\"></iframe> [link](javascript:alert('{SCRIPT_MARK}'))\n")
XSS_CODE = ("from IPython.display import HTML, Javascript, SVG, display\n"
            f"display(HTML(\"<script>alert('{SCRIPT_MARK}')</script><img src=x onerror=\\\"alert('{SCRIPT_MARK}')\\\">\"))\n"
            f"display(Javascript(\"alert('{SCRIPT_MARK}')\"))\n"
            f"display(SVG('<svg xmlns=\\\"http://www.w3.org/2000/svg\\\"><script>alert(\\\"{SCRIPT_MARK}\\\")</script></svg>'))\n")

# Issue 31: reading what grading does not need, leaking it, hurting the run and the neighbours.
# reads_classmates starts from wrong answers and must score 0; the others are full solutions and
# get full marks, except those in ESCAPE_COSTS (they replace the last part's cells: it scores 0)
# and REFUSED (not graded, with the reason).
INSTRUCTOR_TOKEN = "mpcourse-instructor-token-7d3e"  # put in the grader's environment by the tests
STEAL = """

import json as _json, os as _os
for _where, _folders, _files in _os.walk('/'):
    _folders[:] = [f for f in _folders if f not in ('proc', 'sys', 'dev', 'usr', 'site-packages', 'lib',
                   'lib64', 'etc', 'var', 'boot', 'share', 'include', 'bin', 'node_modules') and not f.startswith('.')]
    for _name in _files:
        if _name.endswith('.ipynb'):
            try:
                _cells = _json.load(open(_os.path.join(_where, _name))).get('cells', [])
            except Exception:
                continue
            for _cell in _cells:
                _source = ''.join(_cell.get('source', ''))
                if (_cell.get('metadata', {}).get('nbgrader', {}).get('solution') and '_json' not in _source
                        and 'NotImplementedError' not in _source):
                    try:
                        exec(_source, globals())
                    except Exception:
                        pass
"""
LEAK = """import os, sys
from mpcourse import grading
found, frame = [], sys._getframe()
while frame is not None:
    for value in list(frame.f_locals.values()):
        if isinstance(value, dict):
            found += [str(value.get(key)) for key in ('test', 'secret', 'setup') if key in value]
    frame = frame.f_back
try:
    shadow = open('/etc/shadow').read()
except OSError as error:
    shadow = repr(error)
raise AssertionError(' | '.join([grading._secret, str(grading.seed(0)), str(grading.seed(1)),
                                 repr(dict(os.environ)), shadow, *found]))
"""
SWAP = '''

import subprocess, sys
subprocess.Popen([sys.executable, '-c', """
import glob, os, time
targets = glob.glob('/etc/shadow') + glob.glob('/**/solutions/**/*.ipynb', recursive=True)
for _ in range(400):
    time.sleep(0.05)
    for path in glob.glob('/**/autograded/**/*.ipynb', recursive=True):
        try:
            os.remove(path)
            os.symlink(targets[-1], path)
        except (OSError, IndexError):
            pass
"""], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
'''
BUSY = """import os
for _ in range(400):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
"""
FILLS = """import os
chunk = b'x' * 2**20
for folder in ('/tmp', os.getcwd(), os.path.expanduser('~')):
    try:
        with open(os.path.join(folder, 'filler'), 'ab') as f:
            for _ in range(4096):
                f.write(chunk)
    except OSError:
        pass
hoard = []
while True:
    hoard.append(bytearray(2**28))
"""
HUGE_OUTPUT = "from IPython.display import display\ndisplay({'text/plain': 'y' * 1_900_000}, raw=True)\n"
ENTITY_LINKS = (f"[a](&#106;avascript:alert('{SCRIPT_MARK}')) [b](&#x6A;&#x61;vascript&colon;alert(1)) "
                "[c](java&#x09;script:alert(1)) [d](jav\tascript:alert(1)) [e](data:text/html;base64,PHNjcmlwdD4=)\n"
                f"$\\href{{javascript:alert('{SCRIPT_MARK}')}}{{click}}$ $$\\href{{javascript:alert(1)}}{{x}}$$\n")
ESCAPE_COSTS = {"leaks_through_message": "last", "busy_processes": "last", "fills_ram_and_disk": "last"}
REFUSED = {"symlinked_submission": "symbolic link", "links_in_submission": "symbolic link"}
ESCAPES = ["reads_classmates", "leaks_through_message", "symlink_swap", "many_looping_cells", "busy_processes",
           "fills_ram_and_disk", "huge_outputs", "entity_links", *REFUSED]
EXECUTED = {"xss_feedback", "vandal", "gigantic_output", "os_exit", "edited_test_cell", "monkeypatch",
            "reads_classmates", "leaks_through_message", "symlink_swap", "many_looping_cells",
            "fills_ram_and_disk", "huge_outputs", "entity_links"}


def assignments() -> list[str]:
    return sorted(p.name for p in (ROOT / "solutions").iterdir() if (p / f"{p.name}.ipynb").exists())


def nbgrader(course: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the nbgrader command line in `course` (nbgrader needs its venv's bin/ on PATH)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run([str(BIN / "nbgrader"), *args], cwd=course, env=env,
                            capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result


def autograde(course: Path, assignment: str, timeout: int, execute=True, sandbox: bool = True, **options):
    """Grade every submission of `assignment` with tools/schedule.py (`options`: its grade()'s); return its Report."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the placeholder secret, SQLAlchemy's notes on nbgrader's API
        return grader.grade(course, assignment, timeout=timeout, execute=execute, sandbox=sandbox, **options)


def grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def part_of(gid: str) -> str:
    return gid.split("_")[0]


def student_code(source: str) -> str:
    """A solution cell as a student would have written it: the markers' lines removed."""
    return "\n".join(line for line in source.split("\n") if line.strip() not in SOLUTION_MARKERS)


def split_cell(cell) -> tuple[list[str], list[str]]:
    """(public lines, secret lines) of a source cell. Secret: what students must never see, the
    lines between the solution or hidden-test markers, or all of a solution cell without markers
    (nbgrader replaces it whole). The marker lines themselves are in neither list."""
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    lines = "".join(cell["source"]).splitlines()
    if not (nbgrader.get("solution") or nbgrader.get("grade")):
        return lines, []
    inside = nbgrader.get("solution") and not any(SOLUTION_MARKERS[0] in line for line in lines)
    public, secret = [], []
    for line in lines:
        if SOLUTION_MARKERS[0] in line or HIDDEN_MARKERS[0] in line:
            inside = True
        elif SOLUTION_MARKERS[1] in line or HIDDEN_MARKERS[1] in line:
            inside = False
        else:
            (secret if inside else public).append(line)
    return public, secret


def notebook(folder: Path, assignment: str):
    return nbformat.read(folder / assignment / f"{assignment}.ipynb", as_version=4)


def solution_cells(assignment: str) -> dict[str, str]:
    source = notebook(ROOT / "solutions", assignment)
    return {grade_id(c): student_code(c.source) for c in source.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def test_points(assignment: str) -> dict[str, float]:
    """grade_id -> points of each autograded test cell, in notebook order."""
    source = notebook(ROOT / "solutions", assignment)
    return {grade_id(c): float(c.metadata["nbgrader"]["points"]) for c in source.cells
            if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"}


def submission_data(assignment: str):
    path = ROOT / "tests" / "submissions" / f"{assignment}.py"
    spec = importlib.util.spec_from_file_location(f"submissions_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def function_names(source: str) -> list[str]:
    import ast
    return [n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def wrong_answers(assignment: str, prefix: str = "", body: str = "", value: str = "0.0") -> dict[str, str]:
    """Every solution cell replaced by definitions of the names it asks for, all returning `value`."""
    return {gid: prefix + "".join(f"def {name}(*args, **kwargs):\n    {body or 'pass'}\n    return {value}\n\n\n"
                                  for name in function_names(src))
            for gid, src in solution_cells(assignment).items()}


def edit(student_cells: dict, change) -> dict:
    """`student_cells` plus a change to the notebook itself (a function of the notebook)."""
    return {**student_cells, "__edits__": [*student_cells.get("__edits__", []), change]}


def cell_index(nb, gid: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if grade_id(c) == gid)


def hostile_corpus(assignment: str) -> dict[str, dict]:
    """The students of FOOLS, TARGETED, ACCIDENTS and the vandal and XSS submissions."""
    import copy
    full, tests = solution_cells(assignment), list(test_points(assignment))
    first, last = list(full)[0], [gid for gid in full if part_of(gid) == part_of(tests[-1])]
    corpus = {}
    for name, attack in FOOLS.items():
        cells = wrong_answers(assignment, attack.get("prefix", "") + attack.get("returns", ""),
                              attack.get("in_functions", ""), attack.get("value", "0.0"))
        if "first" in attack:
            cells[first] = attack["first"] + cells[first]
        if "colab" in attack:
            cells = edit(cells, lambda nb, code=attack["colab"]: setattr(
                next(c for c in nb.cells if "colab-setup" in c.metadata.get("tags", [])), "source", code))
        if "tag_tests" in attack:
            cells = edit(cells, lambda nb: [c.metadata.setdefault("tags", []).append("skip-execution")
                                            for c in nb.cells if grade_id(c) in tests])
        corpus[name] = cells
    for name, cells in {**TARGETED, **LIMITS}.items():
        corpus[name] = {**full, **cells}

    def duplicate(gid):
        return lambda nb: nb.cells.insert(cell_index(nb, gid) + 1, copy.deepcopy(nb.cells[cell_index(nb, gid)]))

    def move_above(gid, above):
        return lambda nb: nb.cells.insert(cell_index(nb, above), nb.cells.pop(cell_index(nb, gid)))

    p1 = [gid for gid in full if part_of(gid) == part_of(tests[0])][0]
    wrapped = function_names(full[p1])[0]
    corpus["duplicated_test_cell"] = edit(full, duplicate(tests[0]))
    corpus["duplicated_solution_cell"] = edit(full, duplicate(list(full)[1]))
    corpus["test_cell_above_solution"] = edit(full, move_above(tests[2], [g for g in full if part_of(g) == part_of(tests[2])][0]))
    corpus["test_cell_marked_solution"] = edit(full, lambda nb: nb.cells[cell_index(nb, tests[1])].metadata["nbgrader"].update(solution=True))
    corpus["slow_c_call"] = {**full, p1: SLOW_C_CALL + full[p1]}
    corpus["ignores_sigint"] = {**full, p1: full[p1] + "\n" + IGNORES_SIGINT}
    corpus["runtime_warning"] = {**full, p1: full[p1] + (
        f"\n\nimport warnings\n_{wrapped} = {wrapped}\n\n\ndef {wrapped}(*args, **kwargs):\n"
        f"    warnings.warn('overflow encountered in exp', RuntimeWarning)\n    return _{wrapped}(*args, **kwargs)\n")}
    corpus["vandal"] = {**full, last[-1]: full[last[-1]] + "\n" + VANDAL}
    corpus["reads_classmates"] = {**{gid: src + STEAL for gid, src in wrong_answers(assignment).items()},
                                  "__course__": {f"downloaded/classmate/{assignment}.ipynb": full}}
    corpus["leaks_through_message"] = {**full, **{gid: LEAK for gid in last}}
    corpus["symlink_swap"] = {**full, last[-1]: full[last[-1]] + SWAP}
    corpus["busy_processes"] = {**full, **{gid: BUSY for gid in last}}
    corpus["fills_ram_and_disk"] = {**full, **{gid: FILLS for gid in last}}
    corpus["many_looping_cells"] = edit(full, lambda nb: nb.cells.extend(
        nbformat.v4.new_code_cell("while True:\n    pass") for _ in range(24)))
    corpus["huge_outputs"] = edit(full, lambda nb: nb.cells.extend(nbformat.v4.new_code_cell(HUGE_OUTPUT) for _ in range(22)))
    corpus["entity_links"] = edit(full, lambda nb: nb.cells.insert(1, nbformat.v4.new_markdown_cell(ENTITY_LINKS)))
    corpus["symlinked_submission"] = {"__link__": f"../../../solutions/{assignment}/{assignment}.ipynb"}
    corpus["links_in_submission"] = {**full, "__extra_link__": "../../../gradebook.db"}
    corpus["xss_feedback"] = edit({**full, last[-1]: full[last[-1]] + "\n" + XSS_CODE},
                                  lambda nb: nb.cells.insert(1, nbformat.v4.new_markdown_cell(XSS_MARKDOWN)))
    return corpus


def submissions(assignment: str, hostile: bool = False) -> dict[str, dict[str, str | None]]:
    """student id -> {grade_id: cell source, or None to delete the cell}; cells not named stay
    as released. `hostile`: also HOSTILE, EDITS and the corpus of hostile_corpus."""
    full = solution_cells(assignment)
    data = submission_data(assignment)
    fabricated = {
        "full": full,
        "blank": {},
        "partial": {gid: src for gid, src in full.items() if part_of(gid) in data.PARTIAL_PARTS},
        "reference": {**full, **data.REFERENCE_CALLER},
    }
    if hostile:
        last_part = part_of(list(test_points(assignment))[-1])
        last_cells = [gid for gid in full if part_of(gid) == last_part]
        for name, code in HOSTILE.items():
            fabricated[name] = {**full, **{gid: code for gid in last_cells}}
        last_test = list(test_points(assignment))[-1]
        for name, change in EDITS.items():
            unsolved = {gid: src for gid, src in full.items() if part_of(gid) != last_part}
            fabricated[name] = {**unsolved, last_test: change}
        fabricated.update(hostile_corpus(assignment))
    return fabricated


def write_submission(course: Path, assignment: str, student: str, cells: dict) -> None:
    """Write a fabricated submission. `__course__`: other notebooks to put in the course
    ({path: cells}); `__link__`: the submission is a symbolic link to that path; `__extra_link__`:
    a link to that path lies next to it."""
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    if "__link__" in cells:
        (folder / f"{assignment}.ipynb").symlink_to(cells["__link__"])
        return
    if "__extra_link__" in cells:
        (folder / "notes.txt").symlink_to(cells["__extra_link__"])
    for path, others in cells.get("__course__", {}).items():
        nb = notebook(course / "exercises", assignment)
        for cell in nb.cells:
            cell.source = others.get(grade_id(cell), cell.source)
        (course / path).parent.mkdir(parents=True, exist_ok=True)
        (course / path).write_text(json.dumps(nb, indent=1))
    nb = notebook(course / "exercises", assignment)
    nb.cells = [cell for cell in nb.cells if cells.get(grade_id(cell), "") is not None]
    for cell in nb.cells:
        if grade_id(cell) in cells:
            cell.source = cells[grade_id(cell)]
    for change in cells.get("__edits__", []):
        change(nb)
    (folder / f"{assignment}.ipynb").write_text(json.dumps(nb, indent=1))  # as a student's editor may: no validation


def make_course(course: Path, names: list[str]) -> None:
    """A scratch course directory with the config and sources, and the assignments released."""
    course.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "nbgrader_config.py", course)
    for name in names:
        shutil.copytree(ROOT / "solutions" / name, course / "solutions" / name, dirs_exist_ok=True)
        nbgrader(course, "generate_assignment", name, "--force")


def scores(course: Path, assignment: str, url: str | None = None) -> dict[str, dict[str, float]]:
    """student -> {test grade_id: score} from the gradebook (the real record of grades)."""
    from nbgrader.api import Gradebook, MissingEntry
    result = {}
    with Gradebook(url or f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for student in gradebook.students:
            try:
                graded = gradebook.find_submission_notebook(assignment, assignment, student.id)
            except MissingEntry:
                continue
            result[student.id] = {g.name: g.score for g in graded.grades}
    return result


def grade(course: Path, assignment: str, students: dict[str, dict], timeout: int, execute=True):
    """Release `assignment` into `course`, submit `students`, grade; return (scores, Report)."""
    shutil.rmtree(course, ignore_errors=True)
    make_course(course, [assignment])
    for student, cells in students.items():
        write_submission(course, assignment, student, cells)
    report = autograde(course, assignment, timeout, execute)
    return scores(course, assignment), report


def grade_many(workdir: Path, jobs: dict[str, tuple], workers: int = 1) -> dict:
    """Grade several scratch courses one after the other (each grades one student per core at a time):
    {name: (assignment, students, timeout[, execute])} -> {name: (scores, Report)}."""
    with ThreadPoolExecutor(workers) as pool:
        futures = {name: pool.submit(grade, workdir / name, *job) for name, job in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def release() -> None:
    """Regenerate exercises/ from solutions/ in the repository (a scratch gradebook)."""
    scratch = ROOT / "_build" / "release-gradebook.db"
    scratch.parent.mkdir(exist_ok=True)
    for name in assignments():
        nbgrader(ROOT, "generate_assignment", name, "--force", f"--CourseDirectory.db_url=sqlite:///{scratch}")
        print(f"released exercises/{name}/{name}.ipynb")


def print_table(assignment: str, graded: dict[str, dict[str, float]]) -> None:
    points = test_points(assignment)
    print(f"\n{assignment}  (max {sum(points.values()):g})")
    print(f"{'student':26}" + "".join(f"{gid:>10}" for gid in points) + f"{'total':>8}")
    for student, by_cell in sorted(graded.items()):
        cells = "".join(f"{by_cell.get(gid, 0):>10g}" for gid in points)
        print(f"{student:26}{cells}{sum(by_cell.values()):>8g}")


def print_report(report, messages: bool = True) -> None:
    """What the instructor must read: who was not graded, notes, per student and part the failure
    message (as the runner gave it: never shown to students as is) and answers to read by hand."""
    for student, why in sorted(report.not_graded.items()):
        fate = "no grade written: the next run grades them" if student in report.unwritten else "recorded as 0"
        print(f"  NOT GRADED {student}: {why} ({fate})")
    for student, note in sorted(report.notes.items()):
        print(f"  note on {student}: {note}")
    for student, failed in sorted(report.messages.items()) if messages else ():
        for test, message in failed.items():
            print(f"  {student} {test} failed: {' '.join(str(message).split())[:300]}")
    for student, parts in sorted(report.flags.items()):
        for part, why in parts.items():
            print(f"  READ {student} {part}: its answer {', '.join(why)}")


def grade_course(course: Path, assignment: str, timeout: int, sandbox: bool, **options) -> None:
    """Grade a real course's submissions (the instructor guide's command), then write feedback for
    the students graded (`options`: schedule.grade()'s: workers, students, regrade, feedback, shard, url)."""
    report = grader.grade(course, assignment, timeout=timeout, sandbox=sandbox, progress=True, **options)
    graded = sorted(set(report.scores) - report.unwritten)
    if report.feedback and graded:
        feedback_for(course, assignment, graded, options.get("url"))
    if report.scores:
        print_table(assignment, report.scores)
    print_report(report)
    if not report.feedback and graded:
        print(f"  feedback NOT rebuilt (--no-feedback): the pages in {course / 'feedback'} are those of an earlier "
              "run, and may show earlier scores; grade without --no-feedback to rebuild them")
    elif graded:
        print(f"  feedback in {course / 'feedback'}/<student>/{assignment}/")


def feedback_for(course: Path, assignment: str, students: list[str], url: str | None = None) -> None:
    """nbgrader's feedback pages for `students` only (a shard writes its own students' pages)."""
    others = sorted({p.parent.name for p in (course / "autograded").glob(f"*/{assignment}")} - set(students))
    args = ["generate_feedback", assignment, "--force"] + (
        [f"--CourseDirectory.student_id_exclude={','.join(others)}"] if others else []) + (
        [f"--CourseDirectory.db_url={url}"] if url else [])
    nbgrader(course, *args)


def prepare(course: Path, assignment: str, url: str | None) -> None:
    """Before shards start: the gradebook's schema, the assignment and its students, once."""
    students = gradebook.prepare(course, assignment, url)
    print(f"{assignment} and {len(students)} students in {gradebook.without_password(gradebook.db_url(course, url))}: "
          f"start the shards (python tools/autograde.py grade {assignment} --shard K/N ...)")


def collect(course: Path, assignment: str, lms: str, download: Path) -> None:
    """Put an LMS download (a zip, or a folder of files) in downloaded/<assignment>/archive/ and
    run `nbgrader zip_collect` with tools/lms_collect.py's collector for that LMS: each student's
    latest notebook lands in submitted/<student>/<assignment>/<assignment>.ipynb."""
    archive = course / "downloaded" / assignment / "archive"
    archive.mkdir(parents=True, exist_ok=True)
    if download.is_dir():
        shutil.copytree(download, archive / download.name, dirs_exist_ok=True)
    else:
        shutil.copy(download, archive)
    collector = {"canvas": "CanvasCollector", "moodle": "MoodleCollector"}[lms]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([str(BIN / "nbgrader"), "zip_collect", assignment, "--force",
                             f"--collector=tools.lms_collect.{collector}"], cwd=course, env=env,
                            capture_output=True, text=True)
    log = result.stdout + result.stderr
    if result.returncode != 0:
        sys.exit(f"nbgrader zip_collect failed:\n{log[-3000:]}")
    for line in log.splitlines():
        if "LATE:" in line or "skipped" in line.lower() or "Skipped" in line:
            print(" ", line.split("] ", 1)[-1])
    students = sorted(p.parent.name for p in (course / "submitted").glob(f"*/{assignment}"))
    print(f"{len(students)} submissions of {assignment} in {course / 'submitted'}: {', '.join(students)}")


def pack_feedback(course: Path, assignment: str, out: Path) -> list[Path]:
    """Each student's feedback page, for upload to an LMS without nbgrader's exchange: copied to
    OUT/<assignment>/<student>_<assignment>.html, and all of them in OUT/<assignment>-feedback.zip.
    Returns the pages; names the students who handed in but have no feedback page."""
    import zipfile
    pages, missing = [], []
    folder = out / assignment
    folder.mkdir(parents=True, exist_ok=True)
    students = sorted({p.parent.name for p in (course / "submitted").glob(f"*/{assignment}")} |
                      {p.parent.name for p in (course / "feedback").glob(f"*/{assignment}")})
    for student in students:
        page = course / "feedback" / student / assignment / f"{assignment}.html"
        if not page.is_file() or any(p.is_symlink() for p in (page, page.parent, page.parent.parent)):
            missing.append(student)
            continue
        target = folder / f"{student}_{assignment}.html"
        shutil.copyfile(page, target)
        pages.append(target)
    with zipfile.ZipFile(out / f"{assignment}-feedback.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for page in pages:
            archive.write(page, page.name)
    print(f"{len(pages)} feedback pages in {folder}/ and {out / f'{assignment}-feedback.zip'}")
    for student in missing:
        print(f"  NO FEEDBACK for {student}: grade the assignment first (python tools/autograde.py grade {assignment})")
    return pages


def check(names: list[str], workdir: Path) -> None:
    jobs = {name: (name, submissions(name), 60) for name in names}
    for name, (graded, report) in grade_many(workdir, jobs).items():
        print_table(name, graded)
        print_report(report)


def demo(out: Path) -> None:
    """A whole grading session: release, fabricated submissions (the hostile corpus and the honest
    accidents included), sandboxed grading, feedback, CSV."""
    shutil.rmtree(out, ignore_errors=True)
    names = assignments()
    make_course(out, names)
    hostile_target = "ex4_softmax_stability" if "ex4_softmax_stability" in names else names[0]
    for name in names:
        for student, cells in submissions(name, hostile=name == hostile_target).items():
            write_submission(out, name, student, cells)
        print(f"grading {name} ...", flush=True)
        started = time.perf_counter()
        report = autograde(out, name, timeout=20, progress=True)  # every core, as `grade --jobs` does
        seconds = time.perf_counter() - started
        count = len(report.scores)
        print(f"  {count} submissions in {seconds:.0f} s ({seconds / count:.1f} s each, {report.workers} at a time)")
        nbgrader(out, "generate_feedback", name, "--force")
        print_table(name, scores(out, name))
        print_report(report)
    nbgrader(out, "export", "--to", "grades.csv")
    with open(out / "grades.csv") as f:
        rows = list(csv.DictReader(f))
    print(f"\n{out / 'grades.csv'}: {len(rows)} rows (one per student and assignment)")
    print(f"feedback HTML: {out / 'feedback'}/<student>/<assignment>/<assignment>.html")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["release", "check", "demo", "grade", "prepare", "collect", "pack-feedback"])
    parser.add_argument("assignments", nargs="*")
    parser.add_argument("--out", type=Path, default=None,
                        help="demo: the folder (grade-demo); pack-feedback: where the pages go (feedback-upload)")
    parser.add_argument("--course", type=Path, default=Path.cwd(), help="grade: the course directory")
    parser.add_argument("--lms", choices=["canvas", "moodle"], help="collect: where the download comes from")
    parser.add_argument("--zip", type=Path, help="collect: the LMS download (a zip, or a folder of files)")
    parser.add_argument("--timeout", type=int, default=60, help="grade: seconds per cell and per part")
    parser.add_argument("--jobs", type=int, default=None,
                        help="grade: students at a time (default: one per core, as many as memory holds at "
                             f"{schedule.JOB_MEMORY // 2**30} GiB each; here {schedule.default_jobs()})")
    parser.add_argument("--student", action="append", default=None, metavar="ID",
                        help="grade: only this student (repeat for several)")
    parser.add_argument("--regrade", action="store_true",
                        help="grade: the students who already have a grade too (otherwise a rerun grades only the others)")
    parser.add_argument("--no-feedback", action="store_true",
                        help="grade: skip the notebook run for the feedback (grades only, quick); the feedback "
                             "pages of an earlier run stay as they are")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="grade: this machine's share of N (the students whose int(sha256(id), 16) %% N == K-1), "
                             "into a shared gradebook that `prepare` made")
    parser.add_argument("--db-url", default=None,
                        help="grade, prepare: the gradebook (e.g. postgresql+psycopg://grader@host/course); default: "
                             "the course's c.CourseDirectory.db_url, else its gradebook.db")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="grade without bubblewrap: DANGEROUS, a submission can then change other "
                             "students' work and the gradebook")
    args = parser.parse_args()
    from sqlalchemy.exc import OperationalError
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs: at least 1")
    if args.command == "release":
        release()
    elif args.command == "check":
        check(args.assignments or assignments(), Path(os.environ.get("TMPDIR", "/tmp")) / "mpcourse-check")
    elif args.command == "grade":
        try:
            shard = schedule.parse_shard(args.shard) if args.shard else None
        except ValueError as error:
            parser.error(str(error))
        for name in args.assignments or parser.error("grade: name the assignments"):
            try:
                grade_course(args.course.resolve(), name, args.timeout, not args.no_sandbox, workers=args.jobs,
                             students=args.student, regrade=args.regrade, feedback=not args.no_feedback,
                             shard=shard, url=args.db_url)
            except (grader.NoSandbox, grader.BrokenEnvironment, grader.SecretError, schedule.NotPrepared,
                    ValueError) as error:
                sys.exit(f"autograde.py grade {name}: {error}")  # a sentence, not a traceback
            except OperationalError as error:
                sys.exit(f"autograde.py grade {name}: the gradebook cannot be reached: {error.orig}")
    elif args.command == "prepare":
        for name in args.assignments or parser.error("prepare: name the assignments"):
            try:
                prepare(args.course.resolve(), name, args.db_url)
            except OperationalError as error:
                sys.exit(f"autograde.py prepare {name}: the gradebook cannot be reached: {error.orig}")
    elif args.command == "collect":
        if not (args.lms and args.zip and len(args.assignments) == 1):
            parser.error("collect: one assignment, --lms canvas|moodle and --zip FILE")
        collect(args.course.resolve(), args.assignments[0], args.lms, args.zip.resolve())
    elif args.command == "pack-feedback":
        for name in args.assignments or parser.error("pack-feedback: name the assignments"):
            pack_feedback(args.course.resolve(), name, (args.out or args.course / "feedback-upload").resolve())
    else:
        demo(args.out or ROOT / "grade-demo")
