"""What the grader adds to a part's failure message: a note on a name a test cell sets.
Never runs student code: it reads the instructor's test cells and the student's cells as text.

    with_test_cell_names(verdicts, release, job) -> verdicts, a failed part's note added

A failure message is the runner's text (grader/hidden_tests.py: what the tests or the student's code
raised) and, after NOTE, the grader's own note, which every place that cuts a message keeps whole
(grader/report.py, `shortened`).

The note: an answer that reads a name a released test cell sets (ex2's `S`, `FP16`) sees the test
cell's value in the notebook, where every cell shares one namespace; graded, the test cells run apart
from the answer, which gets the name from another cell that sets it (the notebook's example cell
`S = min_loss_scale(g)`: a different value, silently) or from nowhere (NameError). When such a part
fails, the note names the name, the test cells that set it, where its graded value came from, and
what to do (student walkthrough 48f, A and C: the note named another part's name, or nothing).
"""
import ast
import builtins
import re

from grader.notebooks import example, grade_id, part_of, source_text
from grader.report import NOTE
from grader.runs import bound_names, defined_names, parsed, used_names

# The names an answer gets when graded without a cell defining them: grader/hidden_tests.py's
# NOTEBOOK_HABITS (that file imports nothing of the grader's, nor this it:
# tests/test_feedback_messages.py checks that the two lists agree).
RUNNER_GIVES = frozenset({"display", "input", "get_ipython"})
UNDEFINED = re.compile(r"NameError: name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")
EARLIER = "; before it, "      # grader/hidden_tests.py: the cells that raised, after the part's own failure


def read_names(source: str) -> frozenset[str]:
    """The names a cell reads from the notebook's globals: not those it binds itself at its top level
    (a loop's target, an assignment: student walkthrough 48h, D3, a try-out's own `name` and `fresh`
    were said to be a test cell's), nor a function's parameters and locals."""
    tree = parsed(source)
    if tree is None:
        return frozenset()
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return (used_names(source) & loaded) - bound_names(source)


def set_by_tests(release: dict) -> dict[str, list[str]]:
    """{name: [the parts whose released test cell sets it]}, less the names an answer gets anyway
    (the set-up cell's, the runner's, Python's own)."""
    cells = [c for c in release["cells"] if c.get("cell_type") == "code"]
    given = set(RUNNER_GIVES) | set(dir(builtins)) | set().union(
        *[defined_names(source_text(c)) for c in cells if grade_id(c) == "setup"])
    names: dict[str, list[str]] = {}
    for cell in cells:
        if (grade_id(cell) or "").endswith("_tests"):
            for name in sorted(bound_names(source_text(cell)) - given):
                names.setdefault(name, []).append(part_of(grade_id(cell)))
    return names


def number(part: str) -> int:
    """`p3` -> 3 (a part the name does not number comes last)."""
    digits = part.removeprefix("p")
    return int(digits) if digits.isdigit() else 10**6


def whose(cell: str) -> str:
    """A cell of the hidden-test job, as the student knows it (as grader/hidden_tests.py names it)."""
    return f"the notebook's cell {cell}" if example(cell) else f"your cell {cell}"


def parts_text(parts: list[str]) -> str:
    numbers = [p.removeprefix("p") for p in parts]
    if len(numbers) == 1:
        return f"Part {numbers[0]}'s test cell"
    return f"the test cells of Parts {', '.join(numbers[:-1])} and {numbers[-1]}"


def note(part: dict, message: str, setters: dict[str, list[str]]) -> str | None:
    """The note for the failed `part` of the student's hidden-test job, or None: each name that a
    test cell sets and that the part's own cells read, or that its own failure (the message before
    EARLIER) says is undefined."""
    mine = part_of(part["test_id"])
    # Only the test cells up to this part's had run when its test cell ran in the notebook (48h, D3).
    setters = {name: parts for name, parts in ((n, [p for p in ps if number(p) <= number(mine)])
                                               for n, ps in setters.items()) if parts}
    own = [src for name, src in part["cells"] if part_of(name) == mine and not example(name)]
    names = sorted(set().union(*map(read_names, own)) & setters.keys()) if own else []
    undefined = UNDEFINED.search(message.split(EARLIER, 1)[0])
    if undefined and undefined[1] in setters and undefined[1] not in names:
        names.append(undefined[1])
    read, origins = [], []
    for name in names:
        cells = [cell for cell, src in part["cells"] if name in defined_names(src)]
        if undefined and undefined[1] == name:
            origin = "was not defined" + (f" ({whose(cells[-1])} sets it, but did not get to: see what raised "
                                          "before it, above)" if cells else "")
        elif cells:
            origin = f"came from {whose(cells[-1])}, not from a test cell"
        else:
            origin = "was not defined"
        read.append(f"{name}, which {parts_text(setters[name])} set{'s' if len(setters[name]) == 1 else ''}")
        origins.append(f"{name} {origin}")
    if not read:
        return None
    return (f"your code reads {' and '.join(read)}: graded, the test cells run apart from your code, and "
            f"{'; '.join(origins)}. Set {'it' if len(read) == 1 else 'them'} in a cell of your own, or use your "
            "function's arguments instead")


def with_test_cell_names(verdicts: dict, release: dict, job: dict) -> dict:
    """The verdicts, each failed part's message with the grader's note (after NOTE) where its code
    reads a name a released test cell sets (`note`); `job`: the student's hidden-test job
    (grader/runs.py), whose cells the part ran."""
    setters = set_by_tests(release)
    parts = {part["test_id"]: part for part in job["parts"]}
    out = {}
    for test_id, verdict in verdicts.items():
        if NOTE in str(verdict.get("message") or ""):  # the runner's text (the student's) posing as the grader
            verdict = {**verdict, "message": str(verdict["message"]).replace(NOTE, QUOTED)}
        said = None if verdict.get("passed") or test_id not in parts else note(
            parts[test_id], str(verdict.get("message") or ""), setters)
        out[test_id] = {**verdict, "message": f"{verdict.get('message') or ''}{NOTE}{said}"} if said else verdict
    return out


# A student's exception text holding NOTE would read as the grader's note everywhere a message is
# shown (kept whole where the rest is cut, and the feedback page's wording keyed on it): quoted.
QUOTED = "\n(quoted) Grader's note: "
