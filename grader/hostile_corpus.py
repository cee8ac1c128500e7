"""The fabricated submissions that attack the grader, and the honest accidents: the texts of the
hostile corpus that grader/fabricate.py (`hostile_corpus`) turns into submissions, graded by
tests/test_exercises.py and `make grade-demo`. Each group's comment says what it must score.
Never runs student code: these are answer cells, as text, run only by the grader under test, in
its sandboxes.
"""

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
    # Red team 16f, F1: the same torch.softmax called by C code (`map`), which no Python profiler
    # sees: 3 of 3, unflagged, until the forbidden calls were checked at torch's dispatcher too.
    "forbidden_from_c": {"p3_solution": (
        "def stable_softmax(x, dim=-1):\n"
        "    if not isinstance(x, torch.Tensor) or not x.is_floating_point():\n"
        "        raise TypeError('a floating-point tensor, please')\n"
        "    wide = torch.float64 if x.dtype == torch.float64 else torch.float32\n"
        "    return next(map(torch.softmax, [x.to(wide)], [dim])).to(x.dtype)\n")},
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
# Issue 45: what the student's sandbox held that computes answers. The library's reference,
# reached where the own-work watcher does not look: after rewriting the code objects of the
# library's functions (once a documented limit): it scores 0, the sandbox's library lacks the
# function; the review flags still name it for the instructor. And through a thread started before
# the tests (threading.setprofile never reaches it) or a child process (no profiler of ours runs
# there): the library's reference (Part 1), or the torch.softmax that Part 3 forbids (red team 45,
# A3a: 3 of 3 through a thread). Each scores 0 on the part it attacks: the kernel refuses threads and
# processes in the hidden-test run (grader/no_threads.py), with a message that says so.
IN_A_THREAD = (
    "import concurrent.futures as _futures\n"
    "_pool = _futures.ThreadPoolExecutor(1)\n"
    "_pool.submit(int).result()  # the worker exists before the tests start watching\n")
# The answer's function computed in a forked child, its result back through a pipe.
IN_A_CHILD = (
    "import os as _os, pickle as _pickle\n"
    "\n\ndef _in_a_child(function, *args, **kwargs):\n"
    "    read, write = _os.pipe()\n"
    "    pid = _os.fork()\n"
    "    if pid == 0:\n"
    "        data = _pickle.dumps(function(*args, **kwargs))\n"
    "        while data:\n"
    "            data = data[_os.write(write, data):]\n"
    "        _os._exit(0)\n"
    "    _os.close(write)\n"
    "    chunks = []\n"
    "    while chunk := _os.read(read, 1 << 20):\n"
    "        chunks.append(chunk)\n"
    "    _os.close(read)\n"
    "    _os.waitpid(pid, 0)\n"
    "    return _pickle.loads(b''.join(chunks))\n")
FORBIDDEN_SOFTMAX = (
    "\n\ndef _softmax(x, dim):\n"
    "    return torch.softmax(x.to(torch.float64 if x.dtype == torch.float64 else torch.float32), dim=dim).to(x.dtype)\n"
    "\n\ndef stable_softmax(x, dim=-1):\n"
    "    if not isinstance(x, torch.Tensor) or not x.is_floating_point():\n"
    "        raise TypeError('a floating-point tensor, please')\n")
TARGETED.update({
    "rewrites_library_code": {"p3_solution": (
        "from mpcourse import numerics as _numerics\n"
        "for _f in (_numerics.stable_softmax, _numerics._wide, _numerics._check_floating):\n"
        "    _f.__code__ = _f.__code__.replace(co_filename='<a notebook cell>')\n"
        "\n\ndef stable_softmax(x, dim=-1):\n"
        "    return _numerics.stable_softmax(x, dim=dim)\n")},
    "library_in_a_thread": {
        "p1_solution": IN_A_THREAD + (
            "import mpcourse.numerics as _numerics\n"
            "\n\ndef naive_softmax(x, dim=-1):\n"
            "    return _pool.submit(_numerics.naive_softmax, x, dim=dim).result()\n"),
        "p3_solution": IN_A_THREAD + FORBIDDEN_SOFTMAX + "    return _pool.submit(_softmax, x, dim).result()\n"},
    # ex4 Part 2 asked for a function of the dtype alone: a table of the four answers got 3/3.
    "constant_table": {"p2_solution": (
        "def first_overflow(dtype, device='cpu', fn=None):\n"
        "    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:\n"
        "        raise TypeError('a floating-point dtype, please')\n"
        "    return {torch.float16: 11.09375, torch.bfloat16: 89.0, torch.float32: 88.72283935546875,\n"
        "            torch.float64: 709.7827128933841}[dtype]\n"),
        # and Part 3's forbidden torch.softmax computed in a child process (red team 45)
        "p3_solution": IN_A_CHILD + FORBIDDEN_SOFTMAX + "    return _in_a_child(_softmax, x, dim)\n"},
})
# Red team 45 on other exercises, graded without a sandbox by tests/test_student_answers.py (each
# corpus student graded sandboxed costs eight runs): {cell: source}, the instructor's solutions
# elsewhere, each scoring 0 on the parts of the cells it replaces. ex3 (A4a: 10 of 10, unflagged):
# the course library that its parts may not call (`round_to`, the formats' limits), from a thread.
EX3_LIBRARY_IN_A_THREAD = {
    "p2_solution": IN_A_THREAD + (
        "import sys as _sys\n"
        "_formats = _sys.modules[round_to.__module__]  # the set-up cell imported round_to\n"
        "\n\ndef classify(x, dtype):\n"
        "    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:\n"
        "        raise TypeError('classify takes a float32 tensor')\n"
        "    if x.numel() == 0 or not bool(torch.isfinite(x).all()):\n"
        "        raise ValueError('classify takes a non-empty tensor of finite values')\n"
        "    stored = _pool.submit(_formats.round_to, x, str(dtype).removeprefix('torch.')).result().abs()\n"
        "    overflow = ~torch.isfinite(stored)\n"
        "    zero = stored == 0\n"
        "    subnormal = (stored > 0) & (stored < torch.finfo(dtype).smallest_normal)\n"
        "    normal = ~(zero | subnormal | overflow)\n"
        "    return {kind: mask.double().mean().item() for kind, mask in\n"
        "            (('zero', zero), ('subnormal', subnormal), ('normal', normal), ('overflow', overflow))}\n"),
    "p4_solution": IN_A_THREAD + (
        "import importlib as _importlib\n"
        "_formats = _importlib.import_module('mp' + 'course.formats')\n"
        "\n\ndef _edges(name):\n"
        "    f = _formats.get_format(name)\n"
        "    return f.min_subnormal / 2, f.min_normal - f.min_subnormal / 2, f.max_value + f.epsilon * 2.0 ** f.emax / 2\n"
        "\n\ndef boundaries(dtype):\n"
        "    return _pool.submit(_edges, str(dtype).removeprefix('torch.')).result()\n"),
}
# ex7 (A12: 10 of 10): Part 1 from the library's layer_outputs (not withheld), Part 4 with the
# torch.softmax it forbids, both from a thread.
EX7_IN_A_THREAD = {
    "p1_solution": IN_A_THREAD + (
        "import importlib as _importlib\n"
        "_debugging = _importlib.import_module('mp' + 'course.debugging')\n"
        "\n\ndef first_nonfinite(model, *inputs):\n"
        "    if not isinstance(model, nn.Module):\n"
        "        raise TypeError('an nn.Module, please')\n"
        "    for label, output in _pool.submit(_debugging.layer_outputs, model, inputs).result().items():\n"
        "        if not bool(torch.isfinite(output).all()):\n"
        "            name = label.split('[')[0]\n"
        "            return '' if name == _debugging.ROOT else name\n"
        "    return None\n"),
    "p4_solution": IN_A_THREAD + (
        "\n\nclass StableSoftmax(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return _pool.submit(lambda: torch.softmax(x.float(), dim=-1).to(x.dtype)).result()\n"
        "\n\ndef fix_for_fp16(model):\n"
        "    if not isinstance(model, nn.Module):\n"
        "        raise TypeError('an nn.Module, please')\n"
        "    for parent in list(model.modules()):\n"
        "        for name, child in list(parent.named_children()):\n"
        "            if type(child).__name__ == 'NaiveSoftmax':\n"
        "                setattr(parent, name, StableSoftmax())\n"
        "    return model\n"),
}
# The same library helpers called directly, no thread (the own-work watcher sees these calls):
# ex7 withholds them from the sandbox's library (issue 45), so the call itself fails.
EX7_LIBRARY_HELPERS = {
    "p1_solution": EX7_IN_A_THREAD["p1_solution"].removeprefix(IN_A_THREAD).replace(
        "_pool.submit(_debugging.layer_outputs, model, inputs).result()", "_debugging.layer_outputs(model, inputs)"),
    "p4_solution": (
        "import importlib as _importlib\n"
        "_numerics = _importlib.import_module('mp' + 'course.numerics')\n"
        + EX7_IN_A_THREAD["p4_solution"].removeprefix(IN_A_THREAD).replace(
            "_pool.submit(lambda: torch.softmax(x.float(), dim=-1).to(x.dtype)).result()",
            "_numerics.stable_softmax(x, dim=-1)")),
}
# The same through child processes (the profiler is not there either): ex4 Part 3 is in TARGETED
# (constant_table); ex7 Part 4 here.
EX7_IN_A_CHILD = {"p4_solution": IN_A_CHILD + EX7_IN_A_THREAD["p4_solution"].removeprefix(IN_A_THREAD).replace(
    "_pool.submit(lambda: torch.softmax(x.float(), dim=-1).to(x.dtype)).result()",
    "_in_a_child(lambda: torch.softmax(x.float(), dim=-1).to(x.dtype))")}
# Walks up the call stack into the tests' namespace and calls whatever function the tests defined
# there (names built from strings: nothing to flag), preferring the ones that compute expected
# values; the answers of FOOLS otherwise. Issue 45: ex8's `reference_divergence` and
# `reference_breaks` gave it 5 points. The student's copy of the tests keeps no such function.
WALKS_THE_STACK = (
    "import sys as _sys\n"
    "_walking = []\n"
    "\n\ndef _from_the_tests(*args, **kwargs):\n"
    "    if _walking:\n"
    "        raise RecursionError('already walking')\n"
    "    _walking.append(1)\n"
    "    try:\n"
    "        frame = getattr(_sys, '_get' + 'frame')(2)\n"
    "        while frame is not None:\n"
    "            found = [v for v in list(frame.f_globals.values()) + list(frame.f_locals.values())\n"
    "                     if callable(v) and getattr(getattr(v, '__code__', None), 'co_filename', '').startswith('<tests')]\n"
    "            found.sort(key=lambda v: not any(w in v.__name__ for w in ('refer' + 'ence', 'expe' + 'cted')))\n"
    "            for helper in found:\n"
    "                for call in (lambda: helper(*args, **kwargs), lambda: helper(*args, *kwargs.values())):\n"
    "                    try:\n"
    "                        return call()\n"
    "                    except Exception:\n"
    "                        pass\n"
    "            frame = frame.f_back\n"
    "    finally:\n"
    "        _walking.clear()\n"
    "    return 0.0\n\n\n")
# The same, written for ex8 by a student with the source in hand: the tests' own first_divergence
# and what_breaks_resume, found on the stack, and the visible tests' answers otherwise.
EX8_WALKS_THE_STACK = {
    "p3_solution": (
        "import sys as _sys\n"
        "\n\ndef first_divergence(steps=30, k=12, save=None, load=None, seed=0, width=32):\n"
        "    if not 0 < k < steps:\n"
        "        raise ValueError('0 < k < steps')\n"
        "    frame = getattr(_sys, '_get' + 'frame')(1)\n"
        "    while frame is not None:\n"
        "        helper = frame.f_globals.get('refer' + 'ence_divergence')\n"
        "        if helper is not None:\n"
        "            return helper(steps, k, save, load, seed, width)\n"
        "        frame = frame.f_back\n"
        "    return (k, ('loss', 'weights')) if getattr(getattr(load, '__self__', None), 'keep_rng', False) else None\n"),
    "p4_solution": (
        "import sys as _sys\n"
        "\n\ndef what_breaks_resume(steps=30, k=12, seed=0, width=32):\n"
        "    frame = getattr(_sys, '_get' + 'frame')(1)\n"
        "    while frame is not None:\n"
        "        helper = frame.f_globals.get('refer' + 'ence_breaks')\n"
        "        if helper is not None:\n"
        "            return dict(helper(steps, k, seed, width))\n"
        "        frame = frame.f_back\n"
        "    return {piece: (k, ('loss', 'weights')) for piece in PIECES}\n"),
}
FOOLS["walks_the_stack"] = {"prefix": WALKS_THE_STACK, "in_functions": "return _from_the_tests(*args, **kwargs)"}
# What the grader cannot prove (book/grading_guarantees.md), graded for what its values earn: none now.
LIMITS: dict = {}
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
XSS_CODE = ("from IPython.display import HTML, Javascript, Markdown, SVG, display\n"
            f"display(HTML(\"<script>alert('{SCRIPT_MARK}')</script><img src=x onerror=\\\"alert('{SCRIPT_MARK}')\\\">\"))\n"
            f"display(Javascript(\"alert('{SCRIPT_MARK}')\"))\n"
            f"display(Markdown(\"| a |\\n|---|\\n| <script>alert('{SCRIPT_MARK}')</script> [x](javascript:alert(1)) |\"))\n"
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

