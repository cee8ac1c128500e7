"""The exercises' checker: friendly per-part messages for students, guard rails for the grader.

Every graded test cell of an exercise notebook has the same shape::

    grading.start("Part 2")          # checks nothing the tests rely on was tampered with
    grading.assert_close(f(x), expected, rtol=1e-6, what="f(x)")   # or assert_equal, raises, ...
    ### BEGIN HIDDEN TESTS            (only in the instructor's source)
    ...
    ### END HIDDEN TESTS
    grading.passed("Part 2")          # prints a green tick; reached only if every check held

In a notebook a check that fails raises, with a message that says what is wrong. Run top to
bottom, on Colab or anywhere else, the same cells tell a student which parts already pass, with
no Jupyter extension. `summary()` prints the parts checked so far, and says that
the hidden tests also try other and bad inputs. `raises(TypeError, f, x)` checks a bad input and
says, when it fails, the real call, what it did and the exception expected.

Two guard rails keep the grade honest:

- `own_work` runs a student's function while watching which Python code executes. An exercise
  part asks for an implementation from NumPy/torch primitives; a submission that just calls the
  matching reference in `mpcourse` fails that part (its other parts still count).
- `start` checks that the functions the tests rely on (``numpy.allclose``,
  ``torch.testing.assert_close``, ``isinstance``, this module's own, ...) are still the real ones,
  so a submission that replaces them with something that always agrees fails instead of passing.

These run inside the student's Python process, so they stop accidents and casual tampering, not
a determined attacker, and no grade depends on them: graded, the library's functions a part asks
for are not in the student's sandbox at all (`start(part, withheld=...)`, grader/withheld.py), and
`own_work`'s record is a review flag. When the grader runs a part's tests
(`grader/hidden_tests.py`, in a sandbox), this module *observes* instead of deciding: `assert_close`,
`assert_equal`, `matches_reference`, `raises` and `own_work` record what the student's code did
(values, shapes, dtypes, exception types, library calls) as data, and never raise for a wrong
answer; the expected values, and what computes them, were removed from the tests before they
ran there. The same tests run
on the instructor's reference solution in a sandbox of its own, on the same secret inputs, and
`grader/judge.py`, which never runs student code, compares the two records (mpcourse/records.py:
a value as data; see book/grading_guarantees.md). There `seed(n)` mixes the instructor's secret into the seeds of the hidden tests' random
inputs; in a student's notebook it returns `n`.
"""
import builtins
import hashlib
import inspect
import math
import contextlib
import _signal
import gc
import signal
import sys
import threading
import types
from pathlib import Path, PurePath

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from mpcourse.records import (OBSERVED_VALUES, RECORD_BYTES, RECORD_VALUES, closeness_problem, data,  # noqa: F401
                              difference, numbers_of, own_work_problem, raises_problem, record_problem,
                              same_data, shown_data)
from mpcourse import records as _records

_records.torch_readers(torch)  # before any student code (red team 16f)

_PACKAGE_DIR = Path(__file__).resolve().parent
_THIS_FILE = Path(__file__).resolve()

# The names the tests (and this module) rely on, per module. Taken when this module is first
# imported, which the exercises do in a read-only cell before any student code runs.
_GUARDED = {
    builtins: ["abs", "all", "any", "isinstance", "len", "float", "int", "max", "min", "print",
               "range", "round", "sum", "type", "callable", "hasattr", "getattr", "iter", "zip"],
    math: ["isclose", "isfinite", "isnan", "isinf", "log", "log2", "log10", "exp"],
    np: ["allclose", "isclose", "array_equal", "asarray", "array", "abs", "max", "min", "all",
         "any", "isnan", "isinf", "isfinite", "log", "log2", "log10", "polyfit", "mean", "median",
         "sum", "exp", "float32", "float64"],
    np.testing: ["assert_allclose", "assert_array_equal", "assert_equal"],
    torch: ["allclose", "isclose", "equal", "tensor", "as_tensor", "from_numpy", "isnan", "isinf",
            "isfinite", "abs", "max", "min", "all", "any", "exp", "softmax", "zeros", "ones",
            "randn", "rand", "manual_seed", "matmul", "float16", "bfloat16", "float32", "float64"],
    torch.testing: ["assert_close"],
    sys: ["setprofile", "settrace", "getprofile", "gettrace"],
    threading: ["setprofile", "settrace"],
    torch.Tensor: ["__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__abs__", "__sub__",
                   "__truediv__", "__mul__", "__add__", "abs", "all", "any", "item", "tolist",
                   "allclose", "equal", "isnan", "isinf", "isfinite", "max", "min", "to", "float",
                   "double", "numpy", "sum", "mean", "exp"],
}
# As imported, before any student code: a name replaced later changes nothing here (red team 16f).
_current_dispatch_mode = _get_current_dispatch_mode
_PROFILING = (sys.setprofile, sys.settrace, sys.getprofile, sys.gettrace, threading.setprofile)
# The garbage collector's switches, as imported: while the watchers are on, the collector is off, so
# that no finalizer (`__del__`, `weakref.finalize`) of the answer's runs inside a watcher's callback,
# where CPython profiles nothing: the callbacks allocate, and an allocation may start a collection
# (red team 23, A01, A05, A06: SciPy's softmax, torch.softmax and the library's matmul_bytes computed
# in a `__del__` there, full marks, unflagged). A collection the answer starts itself runs its
# finalizers where the watchers see them.
_COLLECTOR = (gc.enable, gc.disable, gc.isenabled)
# Signal handlers, as imported: a Python handler runs at the next instruction wherever the signal
# arrives, inside a watcher's callback too, where CPython profiles nothing (review 72: a timer every
# 0.5 ms, and a handler that computed the library's softmax there, unseen). A handler of the answer's
# (its code outside the installed packages and the standard library) is itself a call the part
# forbids, found before and after each watched call, and so is setting one while watched.
_SIGNALS = (signal.getsignal, _signal.signal, tuple(signal.valid_signals()))  # _signal's: the C function
_HANDLER_SET = "(a signal handler of yours was set: it runs where the grader's call watcher sees nothing)"
_ORIGINALS = {(owner, name): getattr(owner, name) for owner, names in _GUARDED.items()
              for name in names}
_MODULES = (np, torch, sys, math)  # as imported, before any student code
_parts_passed: list[str] = []
_forbidden: frozenset[str] = frozenset()  # names of torch functions the current part may not call (start)
_secret = ""                   # set by the hidden-test runner only
_observations: list | None = None  # set by the hidden-test runner: record what happened, decide nothing
raised_in: tuple | None = None  # (exception, call) of the last call own_work made that raised
_calls_in_raises: list[str] = []  # what the part's `raises` calls of the answer called (own_work reports them)


def seed(n: int) -> int:
    """The seed of a hidden test's random inputs: `n`, mixed with the instructor's secret when
    the grader runs the hidden tests (so a student cannot special-case the inputs)."""
    if not _secret:
        return n
    return int.from_bytes(hashlib.sha256(f"{_secret}:{n}".encode()).digest()[:4], "little") % 2**31


class TamperingError(AssertionError):
    """Raised when a function the tests rely on has been replaced."""


# Where genuine code lives: numpy's and torch's packages and the standard library. Code typed
# into a notebook cell lives in a temporary file of the kernel's, outside all three.
_TRUSTED_DIRS = [Path(m.__file__).resolve().parent for m in (np, torch)] + [
    Path(contextlib.__file__).resolve().parent]


def _is_genuine(obj) -> bool:
    """True if `obj` is implemented in C, or in numpy's, torch's or the standard library's files."""
    inner = getattr(obj, "__func__", None) or getattr(obj, "_implementation", None) or obj
    code = getattr(inner, "__code__", None)
    if code is None:  # a C function, a dtype or a class: its type must come from a trusted module
        return type(obj).__module__.split(".")[0] in ("builtins", "numpy", "torch")
    return any(Path(code.co_filename).resolve().is_relative_to(d) for d in _TRUSTED_DIRS)


def _is_original(current, original) -> bool:
    """True if `current` is `original`, or torch's own wrapper around it (importing
    torch.optim makes torch._dynamo wrap torch.manual_seed, for example)."""
    while current is not original and _is_genuine(current) and hasattr(current, "__wrapped__"):
        current = current.__wrapped__
    return current is original and _is_genuine(original)


def _check_untampered() -> None:
    replaced = []
    for (owner, name), original in _ORIGINALS.items():
        label = f"{getattr(owner, '__name__', owner)}.{name}"
        if not _is_original(getattr(owner, name, None), original):
            replaced.append(label)
    module = sys.modules[__name__]
    for name, original in _OWN_FUNCTIONS.items():
        if getattr(module, name, None) is not original:
            replaced.append(f"mpcourse.grading.{name}")
    if _records._differ is not _RECORDS_DIFFER:  # closeness_problem's helper, in mpcourse.records
        replaced.append("mpcourse.records._differ")
    # The modules the checks compute with, as each module names them (red team 14: a proxy of numpy
    # put in mpcourse.records passed an assert_close off by 130; sys.modules["torch"], what
    # mpcourse.records records tensors with, replaced likewise).
    np_, torch_, sys_, math_ = _MODULES
    for owner, name, original in ((module, "np", np_), (module, "torch", torch_), (module, "sys", sys_),
                                  (_records, "np", np_), (_records, "sys", sys_), (_records, "math", math_)):
        if getattr(owner, name, None) is not original:
            replaced.append(f"{owner.__name__}.{name}")
    for name, original in (("torch", torch_), ("numpy", np_)):
        if sys_.modules.get(name) is not original:
            replaced.append(f"sys.modules[{name!r}]")
    if replaced:
        raise TamperingError(
            "The tests cannot trust this notebook: these functions were replaced: "
            + ", ".join(replaced) + ". Restart the kernel and remove the code that replaces them.")


def start(part: str, forbidden: tuple[str, ...] = (), withheld: tuple[str, ...] = ()) -> None:
    """Begin the tests of `part`: refuses to go on if a function the tests use was replaced.
    `forbidden`: names of torch functions (e.g. "softmax") the part's answer may not call.
    `withheld`: the course library's functions the part asks you to write yourself
    ("mpcourse.numerics.naive_softmax"): when your work is graded, the hidden tests run with a copy
    of the library in which they are absent (calling one raises AttributeError). Here, nothing.
    The tests run with torch's defaults, whatever a cell set before them: default dtype float32,
    float32 matrix products in full float32 ("highest"), subnormal numbers kept (no flush to zero).
    When graded, the reference's process has never changed them (red team 45f: A08, A03)."""
    global _forbidden
    _check_untampered()
    if torch.get_default_dtype() != torch.float32:  # the tests' own inputs would change dtype
        print(f"torch's default dtype was {torch.get_default_dtype()} (torch.set_default_dtype): "
              "the tests set it back to torch.float32, the default they are written for.")
        torch.set_default_dtype(torch.float32)
    if torch.get_float32_matmul_precision() != "highest":  # TF32 or BF16 inside float32 products
        print(f"torch's float32 matmul precision was {torch.get_float32_matmul_precision()!r} "
              "(torch.set_float32_matmul_precision): the tests set it back to 'highest', the default.")
        torch.set_float32_matmul_precision("highest")
    if (torch.tensor([2.0**-140]) * 1.0).item() == 0:  # torch.set_flush_denormal(True): no getter
        print("subnormal numbers were flushed to zero (torch.set_flush_denormal(True)): the tests "
              "set it back to False, the default.")
        torch.set_flush_denormal(False)
    _forbidden = frozenset(str(name) for name in forbidden)  # a new one each part: nothing to update in place
    _calls_in_raises.clear()
    if part in _parts_passed:
        _parts_passed.remove(part)


def passed(part: str) -> None:
    """Record and announce that every test of `part` in this cell held."""
    _check_untampered()
    if part not in _parts_passed:
        _parts_passed.append(part)
    print(f"\N{CHECK MARK} {part}: all tests in this cell pass.")


def summary() -> None:
    """Print the parts whose test cells have passed in this session, and what grading adds."""
    if not _parts_passed:
        print("No part has passed its tests yet: run the test cell after each part.")
    for part in _parts_passed:
        print(f"\N{CHECK MARK} {part}")
    print("When your work is graded, each part's test cell also runs hidden tests: other inputs, edge "
          "cases and bad inputs (a part passes only if your code raises the error its task asks for, "
          "for every bad input). A tick here means the visible tests pass, not that the part will.")


# Operations that compute a forbidden function inside one call of another name: attention is a
# softmax (`F.scaled_dot_product_attention(q=0, k=0, v=I, attn_mask=x)` is softmax(x), red team 45d).
COMPUTED_INSIDE = {"softmax": ("scaled_dot_product", "masked_softmax", "multi_head_attention", "softmin",
                               "flash_attention", "efficient_attention", "cudnn_attention", "transformer_encoder_layer")}


def _is_forbidden(name, forbidden: frozenset[str]) -> bool:
    """A name of `forbidden` or one of its other spellings: underscores before or after it
    (torch._softmax, aten's in-place and out-of-place `_amp_..._unscale_`, red team 17a A2) and any
    name that holds it between underscores (special_softmax, aten's _safe_softmax and _sparse_softmax,
    A1; log_softmax where softmax is forbidden; _nested_tensor_softmax_with_shape, whose kernel runs
    the softmax out of the dispatch watcher's sight, review 91); or an operation that computes it
    inside (COMPUTED_INSIDE)."""
    if not isinstance(name, str):
        return False
    bare = name.strip("_")
    return any(f"_{what.strip('_')}_" in f"_{bare}_" for what in forbidden if what.strip("_")) or any(
        inside in bare for what in forbidden for inside in COMPUTED_INSIDE.get(what, ()))


# Code that torch's dispatcher runs while it runs an operation is out of this watcher's sight (a
# mode is off the mode stack while it handles an operation, red team 17b): an operator the answer
# registers (torch.library, B6) or a tensor subclass with its own __torch_dispatch__ (B1). Neither
# is needed by any answer: each is itself a call the part forbids.
_TORCHS_OPERATORS = frozenset({"aten", "prims", "_c10d_functional", "c10d", "quantized", "_quantized", "profiler",
                               "rngprims"})
# Every operator torch had registered when this module was imported, before any student code: a new
# one in a namespace of torch's is the answer's all the same (red team 17c, C2: `quantized::lazy`).
_REGISTERED = frozenset(torch._C._dispatch_get_all_op_names())
_OWN_OPERATOR = "(an operator of the answer's own, whose code runs unwatched)"
_OWN_SUBCLASS = "(a tensor subclass of the answer's own that handles torch's operations, unwatched)"


class _ForbiddenOps(TorchDispatchMode):
    """Adds to `calls` each forbidden operation torch's dispatcher runs while it is on, whoever
    called it: Python, C code (`next(map(torch.softmax, [x], [-1]))`, which no Python profiler sees:
    red team 16f), TorchScript, or another operation that computes it inside (cross-entropy's
    log-softmax). Every tensor operation passes through here as `aten::<name>`."""

    def __init__(self, forbidden: frozenset[str], calls: list[str]):
        super().__init__()
        self.forbidden, self.calls, self.seen = forbidden, calls, {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # else torch wraps __torch_dispatch__, and its first call imports
        return False                       # torch._dynamo: 1 s in every part's run (torch 2.13)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in self.seen:  # each operation's name checked once: few Python calls per operation
            schema = func._schema
            namespace, name = schema.name.split("::")
            registered = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
            self.seen[func] = (f"torch.ops.{namespace}.{name}" if _is_forbidden(name, self.forbidden) else
                               None if namespace in _TORCHS_OPERATORS and registered in _REGISTERED else _OWN_OPERATOR)
        if self.seen[func]:
            self.calls.append(self.seen[func])
        if types and not all(_is_genuine(getattr(type_, "__torch_dispatch__", None)) for type_ in types):
            self.calls.append(_OWN_SUBCLASS)  # judged by where its code is, not by its name (17c, C1)
        return func(*args, **(kwargs or {}))


def _torch_name(frame) -> str:
    """The name of the torch function `frame` runs; for an operator's `__call__`
    (torch.ops.aten._softmax.default), the operator's, as the C function it calls has none."""
    if frame.f_code.co_name == "__call__" and type(own := frame.f_locals.get("self")) is torch._ops.OpOverload:
        return own._opname
    return frame.f_code.co_name


_OPERATOR = "(an operator: its name is read per call)"
# Code whose file name or name is not plain text: only an answer makes such code (CodeType.replace
# keeps a str subclass), and the watcher, reading it, would run the subclass's methods inside its own
# callback, where CPython profiles and traces nothing (red team 22, A04: SciPy's softmax in ex4
# Part 3, the library's matmul_bytes in ex5 Part 3, full marks, unflagged). Itself a forbidden call.
_ODD_CODE = "(code of the answer's own making whose name or file name is not plain text)"
# Where installed packages and the standard library live: their functions are not the answer's.
_LIBRARY_DIRS = tuple(sorted({str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
                             - {"/"}))  # a Python installed at / would make every file a library's


def _answer_handlers() -> bool:
    """Whether a signal has a Python handler whose code is the answer's (not a package's or the
    standard library's); read without running any of the answer's code."""
    getsignal, _, signals = _SIGNALS
    for number in signals:
        try:
            handler = getsignal(number)
        except (ValueError, OSError):
            continue
        if handler is None or type(handler) in (int, signal.Handlers, types.BuiltinFunctionType):
            continue  # SIG_DFL, SIG_IGN, not set from Python, or C (default_int_handler)
        function = handler.__func__ if type(handler) is types.MethodType else handler
        if type(function) is not types.FunctionType:
            return True  # an object of the answer's with a __call__
        filename = function.__code__.co_filename
        path = str(Path(filename).resolve()) if type(filename) is str and filename.startswith("/") else ""
        if not path.startswith(_LIBRARY_DIRS):
            return True
    return False


@contextlib.contextmanager
def _watch_calls_into(directory: Path, excluded: Path, forbidden: frozenset[str]):
    """Yield a list that fills with the mpcourse functions (and forbidden torch functions) called
    inside the block. Two watchers (the profiler and the tracer) and sys.setprofile/settrace
    replaced for the call: switching both off needs code written against this module."""
    calls: list[str] = []
    # What a call adds to `calls` (None: nothing), worked out once per code object and per C
    # function's name: the profiler runs on every call, the dispatch watcher's own included.
    codes: dict = {}
    c_names: dict = {}

    def called(code) -> str | None:
        if not (type(code.co_filename) is str and type(code.co_name) is str):  # the two read below
            return _ODD_CODE  # read no further: a method of the answer's would run here, unwatched
        # by its real path: the directories above are resolved, and a course or a venv reached through
        # a symbolic link imports its files under the link's path (a symlinked venv hid scipy's softmax)
        filename = str(Path(code.co_filename).resolve()) if code.co_filename.startswith("/") else code.co_filename
        if filename.startswith(str(directory)) and Path(filename) != excluded:
            return f"{Path(filename).stem}.{code.co_name}"
        if filename.startswith(str(_TRUSTED_DIRS[1])):
            return _OPERATOR if code.co_name == "__call__" else (
                f"torch {code.co_name}" if _is_forbidden(code.co_name, forbidden) else None)
        if filename.startswith(_LIBRARY_DIRS) and _is_forbidden(code.co_name, forbidden):  # scipy.special.softmax (17b, B3)
            return f"{code.co_name} (in {Path(filename).parent.name})"
        return None

    def profiler(frame, event, arg):
        if event == "call":
            code = frame.f_code
            # by identity, the code object kept with its verdict (so that its id is not reused):
            # hashing a code object hashes its names and constants, objects an answer can make
            known = codes.get(id(code))
            if known is None or known[0] is not code:
                known = codes[id(code)] = (code, called(code))
            what = known[1]
            if what is _OPERATOR:  # an operator's __call__: the operator's name, not the function's
                if _is_forbidden(name := _torch_name(frame), forbidden):
                    calls.append(f"torch {name}")
            elif what:
                calls.append(what)
        elif event == "c_call":
            if arg is set_handler:
                calls.append(_HANDLER_SET)
            name = getattr(arg, "__name__", None)
            if name not in c_names:
                c_names[name] = f"torch.{name}" if _is_forbidden(name, forbidden) else None
            if c_names[name]:
                calls.append(c_names[name])

    def tracer(frame, event, arg):
        profiler(frame, event, arg)
        return None  # no line events

    def refuse(*args):
        calls.append("(the grader's call watcher was switched off)")

    def refuse_collector(*args):
        calls.append("(the garbage collector was switched on while the grader watched)")

    setprofile, settrace, getprofile, gettrace, threads_setprofile = _PROFILING  # as imported (red team 16f)
    gc_enable, gc_disable, gc_isenabled = _COLLECTOR
    set_handler = _SIGNALS[1]
    if _answer_handlers():
        calls.append(_HANDLER_SET)
    saved = (getprofile(), gettrace(), sys.setprofile, sys.settrace, gc_isenabled(), gc.enable)
    gc_disable()
    gc.enable = refuse_collector
    setprofile(profiler)
    settrace(tracer)
    threads_setprofile(profiler)
    sys.setprofile, sys.settrace = refuse, refuse
    try:
        yield calls
    finally:
        sys.setprofile, sys.settrace = saved[2], saved[3]
        still_ours = getprofile() is profiler and gettrace() is tracer
        setprofile(saved[0])
        settrace(saved[1])
        threads_setprofile(None)
        gc.enable = saved[5]
        if gc_isenabled():  # switched on by the original, found some other way
            calls.append("(the garbage collector was switched on while the grader watched)")
        if saved[4]:
            gc_enable()
        if not still_ours:
            calls.append("(the grader's call watcher was switched off)")
        if _HANDLER_SET not in calls and _answer_handlers():
            calls.append(_HANDLER_SET)


@contextlib.contextmanager
def _forbidden_ops(forbidden: frozenset[str] | None, calls: list[str]):
    """_ForbiddenOps on for the block, if the part forbids anything; a watcher taken off inside the
    block, or a forbidden set that is not the one start() made (None), is itself a call the part
    forbids."""
    if forbidden is None:
        calls.append("(the part's forbidden functions were replaced)")
        yield
        return
    if not forbidden:
        yield
        return
    mode = _ForbiddenOps(forbidden, calls)
    with mode:
        yield
        if _current_dispatch_mode() is not mode:
            calls.append("(the grader's call watcher was switched off)")


# Types a result may have only exactly, or as NumPy's and torch's own subclasses (np.float64,
# torch.Size, nn.Parameter): a subclass written in a notebook can redefine ==, <, float(), ...
_EXACT = (bool, int, float, complex, str, bytes, tuple, list, dict, set, np.ndarray, np.generic,
          torch.Tensor, torch.dtype, torch.device)


# What a class's namespace may hold besides functions: C descriptors, constants.
_PLAIN_ATTRIBUTES = (types.WrapperDescriptorType, types.MethodDescriptorType, types.ClassMethodDescriptorType,
                     types.GetSetDescriptorType, types.MemberDescriptorType, types.BuiltinFunctionType,
                     str, bytes, int, float, bool, tuple, frozenset, type(None), dict, np.generic,
                     type(vars(type(np.linalg.svd(np.eye(1))))["U"]))  # a namedtuple's field (SVDResult.U)
_TYPE_ATTRIBUTE = {name: type.__dict__[name] for name in ("__mro__", "__module__", "__dict__")}  # run no metaclass's code


def _numpy_or_torch_class(cls) -> bool:
    """A subclass numpy or torch define (np.float64, torch.Size, nn.Parameter): its module is
    theirs, and every function its classes up to the plain type define is in their files (or in C).
    Judged by where the code is, not by what the class says its module is: a class defined while
    the answer's `__name__` read "torch.lazy" filled itself in when the tests read it (red team 20)."""
    if str(_TYPE_ATTRIBUTE["__module__"].__get__(cls)).split(".")[0] not in ("numpy", "torch"):
        return False
    for klass in _TYPE_ATTRIBUTE["__mro__"].__get__(cls):
        if klass in _EXACT or klass is object:
            break
        namespace = _TYPE_ATTRIBUTE["__dict__"].__get__(klass)
        for key, value in namespace.items():
            inner = (value.__func__ if isinstance(value, (classmethod, staticmethod)) else
                     value.fget if isinstance(value, property) else value)
            code = getattr(inner, "__code__", None) if isinstance(inner, types.FunctionType) else None
            if key == "__new__" and "_fields" in namespace and code is not None and code.co_filename == "<string>":
                continue  # collections.namedtuple's __new__, made from text (np.linalg.svd's result)
            if code is not None:
                if not any(Path(code.co_filename).resolve().is_relative_to(d) for d in _TRUSTED_DIRS):
                    return False
            elif not isinstance(inner, _PLAIN_ATTRIBUTES) and not (isinstance(inner, type) and str(
                    _TYPE_ATTRIBUTE["__module__"].__get__(inner)).split(".")[0] in ("numpy", "torch", "builtins")):
                return False
    return True


def _check_exact_types(value, what: str, depth: int = 0) -> None:
    """Refuse a result holding an instance of a subclass of a built-in, NumPy or torch type."""
    if depth > 3:
        return
    for base in _EXACT:
        if isinstance(value, base) and type(value) not in _EXACT and not _numpy_or_torch_class(type(value)):
            raise AssertionError(f"{what} returned a {type(value).__name__}, a subclass of "
                                 f"{base.__name__}: return a plain {base.__name__}")
    items = (value.values() if type(value) is dict else value if type(value) in (tuple, list, set)
             else vars(value).values() if hasattr(value, "__dict__") and not isinstance(
                 value, (torch.nn.Module, torch.Tensor, type)) and not callable(value) else ())
    for item in items:
        _check_exact_types(item, what, depth + 1)


def _name_of(function, default: str = "your code") -> str:
    """`function.__name__`, read without running any code of the answer's: a `__name__` property
    on a callable object ran after own_work's watchers were off and filled its result with
    torch.softmax there (red team 19)."""
    if type(function) in (types.FunctionType, types.BuiltinFunctionType):  # C attributes of torch's and Python's types
        return function.__name__
    name = inspect.getattr_static(function, "__name__", None)  # a descriptor (a property) is returned, not run
    return name if type(name) is str else default


def own_work(function, *args, **kwargs):
    """Call a student's `function(*args, **kwargs)` and return its result, failing if it used
    `mpcourse`'s reference implementation (the exercise asks for one built from NumPy/torch), a
    torch function the part forbids (`start(part, forbidden=...)`), or returned a subclass of a
    plain type (a float whose == is always true, say)."""
    global raised_in
    if not callable(function):
        raise AssertionError("expected a function")
    name = _name_of(function)  # before the watchers: after them nothing of the answer's may run (red team 19)
    forbidden = _forbidden if type(_forbidden) is frozenset else None  # None: replaced (red team 16f)
    try:
        with _watch_calls_into(_PACKAGE_DIR, _THIS_FILE, forbidden or frozenset()) as calls, \
                _forbidden_ops(forbidden, calls):
            result = function(*args, **kwargs)
            _check_exact_types(result, name)  # watched: it may run the answer's code (red team 17b, B7)
    except Exception as error:
        raised_in = (error, call_text(function, *args, **kwargs))  # the runner names the call (walkthrough 5)
        raise
    calls = calls + _calls_in_raises  # a call that raised is the same function: a table made there (red team 19)
    if _observations is not None:  # graded: the judge decides (grader/judge.py)
        _observations.append({"check": "own_work", "what": name, "calls": sorted(set(calls))[:5],
                              "forbidden": None if forbidden is None else sorted(forbidden)})
    elif calls:
        raise AssertionError(own_work_problem(name, sorted(set(calls))))
    return result


def _shown(value, width: int = 60) -> str:
    """A short, faithful rendering of an argument or a result in a message: torch.float32 as
    `torch.float32`, a string with its quotes, a large tensor by its shape and dtype."""
    if isinstance(value, torch.Tensor) and value.numel() > 8:
        text = f"<tensor of shape {tuple(value.shape)}, {value.dtype}>"
    elif isinstance(value, type):  # np.float32: a type, not a torch.dtype
        text = f"{value.__module__}.{value.__qualname__}".replace("builtins.", "")
    elif isinstance(value, (torch.Tensor, torch.dtype, bool, int, float, complex, str, bytes, type(None),
                            tuple, list, dict, np.generic, np.ndarray)):
        text = repr(value)
    elif isinstance(value, PurePath):  # its name says which file (student walkthrough 48h, D2); not its folder
        text = f"<the file {value.name}>"
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[:width - 5] + " ...>"


def call_text(function, *args, **kwargs) -> str:
    """`name(arg, ..., key=value)` as the call was made, for a message."""
    name = _name_of(function, "your function")
    shown = [_shown(a) for a in args] + [f"{k}={_shown(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(shown)})"


def raises(expected, function, *args, **kwargs) -> None:
    """Assert that `function(*args, **kwargs)` raises `expected` (an exception class or a tuple of
    them), with a message that shows the real call, what it did instead and what was expected."""
    call = call_text(function, *args, **kwargs)
    wanted = [e.__name__ for e in (expected if isinstance(expected, tuple) else (expected,))]
    raised, did = None, None
    forbidden = _forbidden if type(_forbidden) is frozenset else None
    # Watched as own_work watches (its next check reports the calls): unwatched, a call here ran
    # torch.softmax or the library on the hidden inputs, drawn with grading.seed, for the answer to
    # look up when own_work called it (red team 19's window, on the raises side).
    with _watch_calls_into(_PACKAGE_DIR, _THIS_FILE, forbidden or frozenset()) as calls, \
            _forbidden_ops(forbidden, calls):
        try:
            result = function(*args, **kwargs)
            did = f"returned {_shown(result)}"
        except Exception as error:  # noqa: BLE001  which exception: the observation
            raised = [type.__getattribute__(k, "__name__") for k in type(error).__mro__]
            try:
                text = BaseException.__str__(error)[:200]
            except Exception:  # noqa: BLE001
                text = ""
            did = f"raised {raised[0]}{': ' + text if text else ''}"
    _calls_in_raises.extend(calls)
    if _observations is not None:
        _observations.append({"check": "raises", "what": call, "expected": wanted, "raised": raised, "did": did})
        return
    problem = raises_problem(call, wanted, raised, did)
    if problem:
        raise AssertionError(problem)


def _as_array(value, what: str):
    """A number, array or tensor as a float64 NumPy array; a message (str) for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = np.float64(value)
    if isinstance(value, torch.Tensor):
        value = _records.tensor_values(value)[2]
    if not isinstance(value, (np.ndarray, np.floating, np.integer)):
        return f"{what} should be a number, array or tensor, got {type(value).__name__}"
    return np.asarray(value, dtype=np.float64)


def assert_close(actual, expected, *, rtol: float = 1e-6, atol: float = 0.0, what: str = "result"):
    """Assert `actual` equals `expected` within `atol + rtol*|expected|`, with a message that
    names what differs (type, shape, NaN/inf pattern or the largest difference). Graded, it records
    `actual` (the grader has removed `expected` from the student's copy of the tests)."""
    got = _as_array(actual, what)
    if _observations is not None:
        _observations.append({"check": "close", "what": what, "actual": data(got),
                              "expected": None if expected is None else data(_as_array(expected, "expected")),
                              "rtol": float(rtol), "atol": float(atol)})
        return
    problem = closeness_problem(got, _as_array(expected, "the expected value"), rtol, atol, what)
    if problem:
        raise AssertionError(problem)


def assert_equal(actual, expected, *, what: str = "result"):
    """Assert `actual` is exactly `expected`: the same type (a tuple is not a list; an int and a
    float of one value count as the same), value (a float NaN equals a float NaN; a tensor's or
    array's values compare by their bits, so NaNs of two signs differ), dtype, shape and device; for
    results such as a dtype, a shape, a count or a flag.
    Graded, it records `actual` as data (the grader has removed `expected` there)."""
    got = data(actual)
    if _observations is not None:
        _observations.append({"check": "equal", "what": what, "actual": got,
                              "expected": None if expected is None else data(expected)})
        return
    if not same_data(data(expected), got):
        raise AssertionError(f"{what}: {difference(data(expected), got)}")


def matches_reference(actual, *, what: str = "result", rtol: float = 0.0, atol: float = 0.0):
    """Graded: record `actual`, to be compared with the instructor's reference solution's value on
    the same inputs (numbers within `atol + rtol*|reference|`, anything else exactly). In a notebook
    it checks nothing (there is no reference to compare with): use it only in hidden tests."""
    if _observations is not None:
        _observations.append({"check": "reference", "what": what, "actual": data(actual),
                              "rtol": float(rtol), "atol": float(atol)})


# This module's own functions, as defined: a test cell also fails if one of them was replaced.
_OWN_FUNCTIONS = {name: globals()[name] for name in
                  ["start", "passed", "summary", "own_work", "assert_close", "assert_equal", "matches_reference", "raises", "call_text", "_shown",
                   "closeness_problem", "raises_problem", "own_work_problem", "data", "same_data", "difference",
                   "_check_untampered", "_is_genuine", "_is_original", "_check_exact_types", "_watch_calls_into", "seed"]}
_RECORDS_DIFFER = _records._differ
