"""A value as data, and two such records compared: what the exercises' checker (mpcourse/grading.py)
records of a student's answer and of the reference solution when the grader runs the hidden tests,
and what grader/judge.py, which never runs student code, reads and compares.

    data(value) -> JSON data that says what `value` is (numbers exactly, as float64 bits)
    same_data(expected, got), difference(expected, got), shown_data(record), numbers_of(record)
    record_problem(text) -> why the grader does not read a part's record, or None
    closeness_problem, raises_problem, own_work_problem -> why a check failed (the same message in a
        notebook, where mpcourse.grading raises it, and in the judge's verdict), or None

A record is plain JSON: reading one runs no code. This module imports no torch (a tensor is
recorded where torch is already imported): the grader's own process, which reads and compares
records, starts without torch's seconds of import.
"""
import base64
import hashlib
import math
import sys

import numpy as np


OBSERVED_VALUES = 2_000_000    # numbers a part may record in all (the rest: recorded as too large)
_budget = OBSERVED_VALUES      # what is left of it in this process (each part runs in a fresh child)


def _numbers(array: np.ndarray) -> dict:
    """An array's float64 values, exactly (NaN and infinities included), as base64 text."""
    global _budget
    values = np.ascontiguousarray(array, dtype="<f8").ravel()
    _budget -= values.size
    if _budget < 0:
        return {"too_large": int(values.size)}
    return {"shape": list(array.shape), "f8": base64.b64encode(values.tobytes()).decode()}



def data(value, depth: int = 0):
    """`value` as JSON data that says what it is: numbers exactly, tensors and arrays with dtype,
    shape and device, containers item by item, anything else by its type's name."""
    if depth > 8:
        return dict(TOO_DEEP)
    if value is None or type(value) is bool:
        return value
    if type(value) is str:  # a subclass of str falls through to "other"
        if len(value) <= 1000:
            return {"str": value}
        whole = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
        return {"str": value[:1000], "chars": len(value), "sha256": whole}  # compared whole (review 83)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return {"int": str(int(value))}
    if isinstance(value, (float, np.floating)):
        return {"float": float(value).hex()}
    torch = sys.modules.get("torch")  # a value is torch's only where torch is imported (never in the
    if torch is not None:             # grader's own process, which only reads records)
        if isinstance(value, torch.dtype):
            return {"dtype": str(value)}
        if isinstance(value, torch.device):
            return {"device": value.type}
        if isinstance(value, torch.Tensor):
            dtype, device, values = tensor_values(value)
            return {"tensor": dtype, "device": device, **_numbers(values)}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            return {"other": f"array of {value.dtype}"}
        return {"array": str(value.dtype), **_numbers(value)}
    if isinstance(value, (tuple, list)):
        items = [data(v, depth + 1) for v in list(value)[:10_000]]
        return {"tuple" if isinstance(value, tuple) else "list": items, **_more(value)}
    if isinstance(value, dict):
        return {"dict": sorted(([data(k, depth + 1), data(v, depth + 1)] for k, v in list(value.items())[:10_000]),
                               key=repr), **_more(value)}
    return {"other": type(value).__name__}


TOO_DEEP = {"other": "nested too deeply"}  # a value's record below 8 levels of containers


def _more(container) -> dict:
    """The items of a container past the 10,000 recorded: its record is then incomplete."""
    return {"more": len(container) - 10_000} if len(container) > 10_000 else {}


def incomplete(record) -> bool:
    """Whether a record holds less than its value: too many numbers (`too_large`), too many items
    (`more`) or too deeply nested. Such a record matches nothing (review 83: two lists alike in
    their first 10,000 items were equal)."""
    return isinstance(record, dict) and ("too_large" in record or "more" in record or record == TOO_DEEP)
_TORCH_READERS = None  # torch's, as first imported: held before any student code runs (mpcourse.grading)


def torch_readers(torch) -> tuple:
    """What a tensor is read with: torch's C tensor type, whose methods no code can replace (red
    team 16f: a Tensor.detach replaced in a notebook recorded what it chose instead of the answer),
    and the switches that turn off, while it is read, any torch-function or dispatch mode a notebook
    left on. Taken once, when mpcourse.grading imports this module, before any student code."""
    global _TORCH_READERS
    if _TORCH_READERS is None:
        _TORCH_READERS = (torch._C.TensorBase, torch._C.DisableTorchFunction, torch._C._DisableTorchDispatch,
                          torch.float64, torch.complex128)
    return _TORCH_READERS


def tensor_values(tensor) -> tuple[str, str, np.ndarray]:
    """(dtype, device type, float64 values on the CPU) of `tensor`; a complex tensor's are its real and
    imaginary parts, in a last dimension of 2 (its magnitudes alone made z, conj(z) and 1j*z one value)."""
    base, no_functions, no_dispatch, float64, complex128 = torch_readers(sys.modules["torch"])
    with no_functions(), no_dispatch():
        tensor = base.detach(tensor)
        dtype, device = base.dtype.__get__(tensor), base.device.__get__(tensor)
        cpu = base.cpu(tensor)
        if base.is_complex(cpu):
            values = base.numpy(base.resolve_neg(base.resolve_conj(base.to(cpu, complex128))))
            return str(dtype), device.type, np.stack([values.real, values.imag], axis=-1)
        return str(dtype), device.type, base.numpy(base.to(cpu, float64))


def numbers_of(record: dict) -> np.ndarray | str:
    """The float64 array a `data` record of a tensor or array holds (a message if it holds none)."""
    if not isinstance(record, dict) or "f8" not in record or not isinstance(record.get("shape"), list):
        return "not an array of numbers"
    raw = base64.b64decode(record["f8"], validate=True)
    shape = [int(n) for n in record["shape"]]
    if len(raw) != 8 * math.prod(shape):
        return "an array whose shape and values disagree"
    return np.frombuffer(raw, dtype="<f8").reshape(shape)


def same_data(expected, got) -> bool:
    """Whether two `data` records hold the same value: exactly, except that an int and a float of
    one value are the same (a task's `0.0` answered `0` cost a part: red team 45g, A03 and A04),
    also inside lists, tuples and dicts. A bool is not a number here, nor NaN equal to any int. An
    incomplete record (too large, too long or nested too deeply to record whole) equals nothing."""
    if incomplete(expected) or incomplete(got):
        return False
    if isinstance(expected, dict) and isinstance(got, dict):
        if {*expected, *got} == {"int", "float"} and len(expected) == len(got) == 1:
            try:
                values = [int(r["int"]) if "int" in r else float.fromhex(r["float"]) for r in (expected, got)]
            except (ValueError, TypeError, OverflowError):
                return False
            return values[0] == values[1]
        for kind in ("list", "tuple", "dict"):
            if kind in expected and kind in got and len(expected) == len(got) == 1:
                a, b = expected[kind], got[kind]
                if kind == "dict" and isinstance(a, list) and isinstance(b, list):  # [key, value] pairs
                    a = [{"list": pair} if isinstance(pair, list) else pair for pair in a]
                    b = [{"list": pair} if isinstance(pair, list) else pair for pair in b]
                return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                        and all(same_data(x, y) for x, y in zip(a, b)))
    return expected == got


def difference(expected, got) -> str:
    """`expected X, got Y` for two `data` records, said where they first differ: within lists,
    tuples or dicts of one length, the first item that differs (`item 2: ...`); within two tensors
    or arrays of one kind, dtype and shape, the first value that differs and how many do. A message
    cut at a few hundred characters then still shows the difference (issue 48: a list of tensors
    read "expected [<tensor of shape (12, 8)...>, ...], got [<tensor of shape (12, 8)...>, ...]")."""
    where = []
    while isinstance(expected, dict) and isinstance(got, dict) and len(where) < 8:
        kind = next((k for k in ("list", "tuple", "dict") if k in expected and k in got), None)
        items, other = (expected.get(kind), got.get(kind)) if kind else (None, None)
        if not (isinstance(items, list) and isinstance(other, list) and len(items) == len(other)):
            break
        first = next((i for i, (a, b) in enumerate(zip(items, other)) if a != b), None)
        if first is None:
            break
        if kind == "dict":
            pair, theirs = items[first], other[first]
            if not (isinstance(pair, list) and isinstance(theirs, list) and len(pair) == len(theirs) == 2
                    and pair[0] == theirs[0]):
                break
            where.append(f"at key {shown_data(pair[0], 40)}")
            expected, got = pair[1], theirs[1]
        else:
            where.append(f"item {first}")
            expected, got = items[first], other[first]
    prefix = "".join(f"{w}: " for w in where)
    kind = next((k for k in ("tensor", "array") if isinstance(expected, dict) and isinstance(got, dict)
                 and k in expected and k in got), None)
    if kind and expected[kind] == got[kind] and expected.get("shape") == got.get("shape"):
        want, have = numbers_of(expected), numbers_of(got)
        if isinstance(want, np.ndarray) and isinstance(have, np.ndarray) and want.size > 8:
            differ = ~((want == have) | (np.isnan(want) & np.isnan(have)))
            if differ.any():
                at = tuple(int(i) for i in np.argwhere(differ)[0])
                return (f"{prefix}at index {list(at)}: expected {float(want[at])!r}, got {float(have[at])!r} "
                        f"({int(differ.sum())} of {want.size} values differ)")
    if expected == got or incomplete(expected) or incomplete(got):  # a record that holds less than its value
        return (f"{prefix}a value too large to compare (over 2,000,000 numbers, over 10,000 items in a list, "
                "tuple or dict, or nested more than 8 levels deep)")
    return f"{prefix}expected {shown_data(expected)}, got {shown_data(got)}"


def shown_data(record, width: int = 80) -> str:
    """A short rendering of a `data` record for a message."""
    if not isinstance(record, dict):
        text = repr(record)
    elif "str" in record:
        text = repr(record["str"])
    elif "int" in record:
        text = record["int"]
    elif "float" in record:
        text = repr(float.fromhex(record["float"]))
    elif "dtype" in record:
        text = record["dtype"]
    elif "device" in record and len(record) == 1:
        text = repr(record["device"])
    elif "tensor" in record or "array" in record:
        kind = "tensor" if "tensor" in record else "array"
        values = numbers_of(record)
        body = (values.tolist() if isinstance(values, np.ndarray) and values.size <= 8
                else f"of shape {tuple(record.get('shape', ()))}")
        text = f"<{kind} {body}, {record[kind]}>"
    elif "tuple" in record or "list" in record:
        items = record.get("tuple", record.get("list")) or []
        inner = ", ".join(shown_data(v, width) for v in items[:8]) + (", ..." if len(items) > 8 else "")
        text = (f"({inner},)" if len(items) == 1 else f"({inner})") if "tuple" in record else f"[{inner}]"
    elif "dict" in record:
        pairs = record["dict"] if isinstance(record["dict"], list) else []
        inner = ", ".join(f"{shown_data(pair[0], width)}: {shown_data(pair[1], width)}" for pair in pairs[:6]
                          if isinstance(pair, list) and len(pair) == 2) + (", ..." if len(pairs) > 6 else "")
        text = "{" + inner + "}"
    elif "other" in record:
        text = f"<{record['other']}>"
    else:
        text = str(record)
    return text if len(text) <= width else text[:width - 5] + " ...>"


# The most of one part's record (JSON) that the grader reads (grader/hidden_tests.py in the sandbox,
# grader/runs.py in the grader's own process), checked before it is parsed: a parse costs memory in
# proportion to the values, up to ~30 bytes a byte of JSON (20 MB of nested empty lists took the
# grader's process to 2 GB: red team 45c, A06b). The solutions' records measured: at most 4.1 MB
# (ex8 Part 2's reference; a student's 2.0 MB) and 13,042 values (ex7 Part 2's reference).
RECORD_BYTES = 16 * 2**20
RECORD_VALUES = 250_000


def record_problem(text: bytes) -> str | None:
    """Why the grader does not read a part's record, `text` (its JSON), or None: more bytes than
    RECORD_BYTES, or more values than RECORD_VALUES (counted, without parsing, as the text's `[`, `{`,
    `,` and `:`, at least one per value or key beyond the first)."""
    if len(text) > RECORD_BYTES:
        return f"wrote a record larger than the grader reads ({RECORD_BYTES // 2**20} MiB)"
    if sum(text.count(mark) for mark in (b"[", b"{", b",", b":")) > RECORD_VALUES:
        return f"wrote a record of more values than the grader reads ({RECORD_VALUES:,})"
    return None


# --- why a check failed: the notebook's message (mpcourse/grading.py) and the judge's (grader/judge.py) ---

def own_work_problem(name: str, calls: list[str]) -> str | None:
    """Why `name`'s calls break the part's rules (or None): a torch function the part forbids, or
    the course library's reference."""
    if not calls:
        return None
    names = ", ".join(calls[:5])
    changed = [call.strip("()") for call in calls if call.startswith("(")]
    if changed:  # the check itself was switched off or changed while the answer ran (grading.own_work)
        return (f"while {name} ran, {'; '.join(changed)}: the tests cannot tell what it called, "
                "so this part does not pass.")
    if any(call.startswith("torch") or " (in " in call for call in calls):  # torch's, or another package's (scipy)
        return f"{name} calls {names}, which this part asks you not to use."
    return (f"{name} calls the course library ({names}). "
            "This part asks you to implement it yourself from NumPy/torch operations.")


def raises_problem(call: str, wanted: list[str], raised: list[str] | None, did: str) -> str | None:
    """Why a call that should raise one of `wanted` failed the check (or None): `raised` is the
    class names of what it raised (its MRO), None if it returned; `did` says what it did."""
    if raised is not None and set(wanted) & set(raised):
        return None
    expected = " or ".join(wanted)
    if raised is None:
        return f"{call} {did}; expected it to raise {expected} for this bad input"
    return f"{call} {did}; expected {expected} for this bad input"


def _differ(expected: float, actual: float) -> tuple[str, str]:
    """Both numbers with enough digits to tell them apart (6, or all 17 when 6 look the same)."""
    for digits in (6, 17):
        shown = f"{expected:.{digits}g}", f"{actual:.{digits}g}"
        if shown[0] != shown[1]:
            break
    return shown


def closeness_problem(actual, expected, rtol: float, atol: float, what: str) -> str | None:
    """Why float64 arrays `actual` and `expected` are not equal within `atol + rtol*|expected|`
    (same NaN and infinity pattern), or None: the type, shape, NaN/inf pattern or largest difference."""
    if isinstance(actual, str):
        return actual
    if actual.shape != expected.shape:
        return f"{what} has shape {actual.shape}, expected {expected.shape}"
    if not np.array_equal(np.isnan(actual), np.isnan(expected)):
        return f"{what} has NaN where the expected value does not (or vice versa)"
    finite = np.isfinite(expected)
    if not np.array_equal(actual[~finite & ~np.isnan(expected)], expected[~finite & ~np.isnan(expected)]):
        return f"{what} has a different pattern of infinities than expected"
    difference = np.abs(actual[finite] - expected[finite])
    allowed = atol + rtol * np.abs(expected[finite])
    if difference.size and not np.all(difference <= allowed):
        worst = int(np.argmax(difference - allowed))
        shown_expected, shown_actual = _differ(expected[finite][worst], actual[finite][worst])
        return (f"{what} differs from the expected value by up to {difference[worst]:.3g} "
                f"(expected {shown_expected}, got {shown_actual}; allowed {allowed[worst]:.3g})")
    return None
