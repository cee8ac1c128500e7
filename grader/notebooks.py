"""Notebooks read as data: the instructor's source and release, a student's submission, and the
grader's own files written in the course. Never runs student code: a notebook is JSON, parsed and
never executed, and a submission is read without following a symbolic link.

    read_submission(course, student, assignment, release) -> notebook (a dict)  # refused, with the reason, if unsafe
    submission_files(course, student, assignment, release) -> (graded, others, those as handed out)
    uploaded_as(course, student, assignment, graded) -> the name the student gave it in the LMS, or None
    read_notebook(path) -> notebook                                      # the instructor's or the grader's own
    recovered(submission, release) -> (notebook, cells whose nbgrader metadata came back)
    grade_id(cell), source_text(cell), part_of(grade id), without_magics(source)
    student_code(submission, source) -> [(name, code)]                     # what the hidden-test run runs
    json_data(text) -> data                                              # JSON from a sandbox, every string encodable
"""
import copy
import hashlib
import json
import os
import re
import stat
from pathlib import Path

NOTEBOOK_BYTES = 50 * 2**20      # the largest notebook read, submitted or run
# JSON values a notebook may hold, counted before parsing as its `[`, `{`, `,` and `:` (a parsed
# value costs ~300 bytes, copies included: 5.3 million empty lists in a cell's metadata, 16 MB,
# took the grader's own process to 1.7 GB, red team 45d A07). The executed chapters hold under
# 15,000; a million printed lines of output are a million.
NOTEBOOK_VALUES = 2_000_000
# Cells a notebook may hold: nbconvert renders the feedback page in the grader's own process, outside
# every sandbox and limit, ~1.5 ms and ~20 KB a cell (50,000 empty Markdown cells, 3.5 MB, held the
# rendering at 168 s instead of 40 s: red team 45g, A05). The released exercises hold under 150, the
# book's largest notebook 238.
NOTEBOOK_CELLS = 2_000
# In JSON text: an escaped backslash, a surrogate pair, or a lone surrogate (the one to replace).
SURROGATE_ESCAPE = re.compile(r"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|"
                              r"(?P<lone>\\u[dD][89a-fA-F][0-9a-fA-F]{2})")


def json_data(text: str):
    """JSON text (a notebook, a record from a sandbox) parsed, each lone surrogate (`"\\ud800"`, legal
    in a Python str, not in UTF-8) read as U+FFFD: every string in it can be printed, stored and
    rendered (nbconvert, the terminal and the database encode UTF-8, and stopped on one)."""
    return json.loads(SURROGATE_ESCAPE.sub(lambda m: "\\ufffd" if m["lone"] else m[0], text))


def grade_id(cell: dict) -> str | None:
    nbgrader = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell, dict) else {}
    gid = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
    return gid if isinstance(gid, str) else None  # a student may write anything there


def source_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


# An IPython help line: `torch.nextafter?`, `?torch.nextafter`, `torch.nextafter??`.
HELP_LINE = re.compile(r"^\s*(\?{1,2}[\w.]+|[\w.]+\?{1,2})\s*(#.*)?$")
# IPython's assignment from a magic or the shell: `t = %timeit -o f(x)`, `files = !ls` (red team 45b,
# A09, A12: the whole cell was a SyntaxError, and its functions were never defined).
MAGIC_ASSIGNMENT = re.compile(r"^\s*[\w.]+(\s*,\s*[\w.]+)*\s*=\s*[%!]")


def ipython_line(line: str) -> bool:
    return line.lstrip().startswith(("%", "!")) or bool(HELP_LINE.match(line) or MAGIC_ASSIGNMENT.match(line))


def logical_starts(lines: list[str]) -> list[bool]:
    """Whether each line begins a logical line of Python: not inside brackets, a string that spans
    lines, or after a backslash. IPython reads `%`, `!` and `?` as its own only there (red team 45e,
    A02: a `% value` continuation line, black's `!= p` line inside brackets were commented out)."""
    starts, depth, quote, continued = [], 0, None, False
    for line in lines:
        starts.append(depth == 0 and quote is None and not continued)
        continued = False
        if starts[-1] and ipython_line(line):
            continue  # IPython's own: its text is not Python
        i = 0
        while i < len(line):
            char = line[i]
            if quote:
                if char == "\\":
                    i += 2
                    continue
                if line.startswith(quote, i):
                    i, quote = i + len(quote), None
                    continue
                i += 1
                continue
            if char == "#":
                break
            if char in "\"'":
                quote = line[i:i + 3] if line[i:i + 3] in ('"""', "'''") else char
                i += len(quote)
                continue
            depth += (char in "([{") - (char in ")]}" and depth > 0)
            continued = char == "\\" and i == len(line) - 1
            i += 1
        if quote in ('"', "'") and not line.endswith("\\"):
            quote = None  # an unterminated one-line string: a SyntaxError the runner reports
    return starts


# Cell magics whose body IPython runs as Python in the kernel: for every other one (`%%script false`,
# `%%bash`, `%%writefile`, `%%html`, ...) the body is not Python run there, and the cell runs as a
# comment (red team 22, A05: an old answer kept in a `%%script false` cell, which Jupyter skips, was
# run by the grader and replaced the right one: that part 0, unexplained).
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}


def without_magics(source: str) -> str:
    """A cell as plain Python: IPython's %magics, !shell and help (`name?`) lines, and assignments
    from them, at the start of a logical line, become `pass` with the line as a comment (the block
    they stand in stays a block; a name assigned is then undefined: a try-out's result). A cell
    whose cell magic does not run its body as Python is a comment throughout."""
    first = source.lstrip("\n").split("\n", 1)[0]
    if first.startswith("%%") and first[2:].split(maxsplit=1)[:1] != [] and \
            first[2:].split(maxsplit=1)[0] not in PYTHON_CELL_MAGICS:
        return "\n".join(f"# (not run by the grader) {line}" for line in source.split("\n"))
    lines, out, previous = source.split("\n"), [], ""
    for line, start in zip(lines, logical_starts(lines)):
        if start and ipython_line(line):
            indent = line[:len(line) - len(line.lstrip())]
            in_block = indent and (previous.rstrip().endswith(":") or
                                   len(previous) - len(previous.lstrip()) >= len(indent))
            # In a block: `pass`, so that the block is not left empty; elsewhere a comment (an
            # indented line outside any block would be an IndentationError as `pass`).
            line = f"{indent}pass  # (not run by the grader) {line.lstrip()}" if in_block else f"# (not run by the grader) {line}"
        out.append(line)
        if line.strip() and not line.lstrip().startswith("#"):
            previous = line
    return "\n".join(out)


def part_of(test_or_solution_id: str) -> str:
    return test_or_solution_id.split("_")[0]


def above_the_tests(cells: list, tests: list) -> list:
    """`cells` without the copies of an answer cell that sit below their part's test cell when
    another copy sits above it: the copy the visible test checked is graded, not a scratch copy
    pasted under it (red team 45d, A05(iii): an old wrong attempt below Part 3's test cell
    overrode the right answer above it, 0 of 2). An answer whose every copy sits below the test
    cell (the test cell moved up) is kept."""
    where = {}
    for index, cell in enumerate(cells):
        where.setdefault(grade_id(cell), index)
    test_at = {part_of(t): where[t] for t in tests if t in where}
    above = {grade_id(c) for i, c in enumerate(cells) if i < test_at.get(part_of(grade_id(c) or ""), -1)}
    return [c for i, c in enumerate(cells)
            if not (grade_id(c) in above and i > test_at.get(part_of(grade_id(c)), len(cells)))]


def added(cell: dict, source: dict) -> bool:
    """A code cell the student added: no grade_id, and not one of the release's own cells (its id,
    or, for a cell without an id, its text, is not the release's)."""
    if cell.get("cell_type") != "code" or grade_id(cell):
        return False
    if isinstance(cell.get("id"), str):
        return cell["id"] not in {c.get("id") for c in source["cells"]}
    return source_text(cell) not in {source_text(c) for c in source["cells"] if c.get("cell_type") == "code"}


def student_code(submission: dict, source: dict) -> list[tuple[str, str]]:
    """The student's code the hidden-test run may run, in the notebook's order, as (name, code without
    IPython's lines): each answer cell (its grade_id); each code cell the student added above a
    part's test cell (issue 48: a helper, an import, an answer split over cells), named after the
    part whose test cell comes next below it, `p2_added (code cell 7)`; and the notebook's own
    example cells, and the set-up cell if the student changed it, as `p2_example (code cell 5)`
    (grader/runs.py runs these only for a name they define). Cells below the last test cell run
    after every test in a notebook too: none of them."""
    solutions = {grade_id(c) for c in source["cells"] if (c.get("metadata", {}).get("nbgrader") or {}).get("solution")}
    tests = [grade_id(c) for c in source["cells"] if (c.get("metadata", {}).get("nbgrader") or {}).get("grade")
             and c.get("cell_type") == "code"]
    cells = above_the_tests(submission["cells"], tests)
    test_at = [(i, part_of(grade_id(c))) for i, c in enumerate(cells) if grade_id(c) in tests]
    setup = next((source_text(c) for c in source["cells"] if grade_id(c) == "setup"), None)
    code, number = [], 0
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        part = next((p for j, p in test_at if j > i), None)
        if grade_id(cell) in solutions:
            code.append((grade_id(cell), without_magics(source_text(cell))))
        elif part is None:
            continue
        elif added(cell, source):
            code.append((f"{part}_added (code cell {number})", without_magics(source_text(cell))))
        elif grade_id(cell) is None or (grade_id(cell) == "setup" and source_text(cell) != setup):
            code.append((f"{part}_{EXAMPLE} (code cell {number})", without_magics(source_text(cell))))
    return code


EXAMPLE = "example"  # the notebook's own cells (and a set-up cell the student changed), in student_code


def example(name: str) -> bool:
    """Whether a cell `student_code` named is one of the notebook's own: run only for a name it defines."""
    return name.split("_", 1)[-1].startswith(EXAMPLE + " (")


def parse_notebook(data: bytes) -> dict:
    if len(data) > NOTEBOOK_BYTES:
        raise ValueError(f"the notebook is larger than {NOTEBOOK_BYTES // 2**20} MiB")
    if sum(data.count(mark) for mark in (b"[", b"{", b",", b":")) > NOTEBOOK_VALUES:
        raise ValueError(f"the notebook's file holds more than {NOTEBOOK_VALUES:,} of the characters [ {{ , : "
                         "(printed outputs included), more than a notebook needs: clear its outputs (Jupyter: Edit, "
                         "Clear Outputs of All Cells) and hand it in again")
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):  # red team 45h, A03: an editor's "Unicode" (UTF-16) save
        raise ValueError("the file is UTF-16 text, which Jupyter does not open: open the notebook in Jupyter "
                         "or Colab, save it there (UTF-8) and hand it in again")
    try:
        nb = json_data(data.decode(errors="replace").removeprefix("\ufeff"))  # a byte-order mark: Notepad's
    except RecursionError:
        raise ValueError("the file nests too deeply to be a notebook") from None
    except ValueError as error:
        if "integer string conversion" in str(error):  # red team 31: valid JSON, beyond Python's (and Jupyter's) reach
            raise ValueError("the file holds a number of more than 4,300 digits, which Jupyter cannot read either: "
                             "open the notebook in Jupyter or Colab, save it there and hand it in again") from None
        raise ValueError("the file is not a Jupyter notebook (not JSON)") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("the file is not a Jupyter notebook (no list of cells)")
    nb["cells"] = [c for c in nb["cells"] if isinstance(c, dict)]
    if len(nb["cells"]) > NOTEBOOK_CELLS:
        raise ValueError(f"the notebook holds {len(nb['cells']):,} cells, more than the {NOTEBOOK_CELLS:,} a notebook "
                         "of this course needs: delete the empty and unused cells and hand it in again")
    for number, cell in enumerate(nb["cells"], 1):
        problem = malformed(cell)
        if problem:
            raise ValueError(f"the file is not a valid Jupyter notebook: cell {number}'s {problem} "
                             "(Jupyter would not open it either): hand in the notebook as Jupyter saves it")
    return nb


def malformed(cell: dict) -> str | None:
    """What in `cell` no Jupyter notebook holds and the grader would trip on, or None: metadata
    that is not an object (nor its nbgrader part), source that is not text, a kind not code,
    markdown or raw (red team 45b, A04: a list as metadata made the grader fail, not refuse)."""
    metadata = cell.get("metadata", {})
    if not isinstance(metadata, dict):
        return "metadata is not an object"
    if not isinstance(metadata.get("nbgrader", {}), dict):
        return "nbgrader metadata is not an object"
    source = cell.get("source", "")
    if not (isinstance(source, str) or isinstance(source, list) and all(isinstance(s, str) for s in source)):
        return "source is not text"
    if cell.get("cell_type") not in ("code", "markdown", "raw"):
        return "kind (cell_type) is not code, markdown or raw"
    if not isinstance(cell.get("outputs", []), list):
        return "outputs are not a list"
    return None


def read_notebook(path: Path) -> dict:
    """A notebook of the instructor's (source, release) or of the grader's own making."""
    if path.stat().st_size > NOTEBOOK_BYTES:
        raise ValueError(f"the notebook is larger than {NOTEBOOK_BYTES // 2**20} MiB")
    return parse_notebook(path.read_bytes())


def notebooks_in(folder: Path) -> list[str]:
    """The names of the notebooks in a submission's folder (hidden files are not notebooks)."""
    return sorted(entry.name for entry in folder.iterdir()
                  if entry.name.endswith(".ipynb") and not entry.name.startswith("."))


def as_handed_out(notebook: dict, release: dict) -> bool:
    """Whether `notebook` is the release as handed out, as far as grading goes: it holds answer cells,
    each as released, and no code cell the release does not hold (outputs aside: it may have been
    run). A student who worked in a copy (Colab's "Save a copy" gives `Copy of <assignment>.ipynb`)
    may hand in the download they started from beside it (red team 45g, A08: that one was graded, 0
    of 10)."""
    answers = {grade_id(c): source_text(c).strip() for c in release["cells"]
               if grade_id(c) and (c.get("metadata", {}).get("nbgrader") or {}).get("solution")}
    code = {source_text(c).strip() for c in release["cells"] if c.get("cell_type") == "code"} | {""}
    cells = recovered(notebook, release)[0]["cells"]
    if not answers.keys() & {grade_id(c) for c in cells}:
        return False  # no answer cell to tell by
    return all(source_text(c).strip() == answers[grade_id(c)] if grade_id(c) in answers
               else c.get("cell_type") != "code" or source_text(c).strip() in code for c in cells)


def handed_out_among(folder: Path, names: list[str], release: dict | None) -> set[str]:
    """Those of the notebooks `names` in `folder` that are as handed out (`as_handed_out`); a
    notebook that cannot be read as a regular file, or parsed, is not known to be."""
    if release is None or len(names) < 2:
        return set()
    found = set()
    for name in names:
        try:
            if as_handed_out(read_regular(folder / name), release):
                found.add(name)
        except (OSError, ValueError, RecursionError):
            pass
    return found


def submission_files(course: Path, student: str, assignment: str,
                     release: dict | None = None) -> tuple[str, list[str], set[str]]:
    """(the file of the submission that is graded, its other notebooks, those of them as handed out).
    Graded: among the notebooks with work in them (with the `release`, a notebook as handed out counts
    only when every one is), `<assignment>.ipynb` if it is one, else the single one whatever its name
    (Colab's "Save a copy" gives `Copy of <assignment>.ipynb`; a download may add ` (1)`). Two or
    more, none with the assignment's name, or none at all, are refused with the reason."""
    folder = course / "submitted" / student / assignment
    expected = f"{assignment}.ipynb"
    found = notebooks_in(folder)
    if os.path.lexists(folder / expected) and expected not in found:
        found = sorted([*found, expected])
    handed_out = handed_out_among(folder, found, release)
    pool = [name for name in found if name not in handed_out] or found
    if expected in pool:
        graded = expected
    elif len(pool) == 1:
        graded = pool[0]
    elif not found:
        raise ValueError(f"the submission holds no notebook (.ipynb file): hand in {expected}")
    else:
        raise ValueError(f"the submission holds {len(pool)} notebooks ({', '.join(pool[:5])}) and none is "
                         f"named {expected}: hand in one notebook")
    return graded, [name for name in found if name != graded], handed_out


LMS_FILE = "lms.json"  # downloaded/<assignment>/lms.json: what the LMS's names said of each student collected


def uploaded_as(course: Path, student: str, assignment: str, graded: str) -> str | None:
    """The name under which the student uploaded the graded notebook to the LMS, where collection
    stored it under another (`Copy of ex1.ipynb` collected as `ex1.ipynb`; instructor walkthrough
    47b, C4: the page named a file the student never uploaded), else None: not collected from an
    LMS, named as the exercise there (` (1)`, `-1` are the LMS's), or changed since it was collected
    (its SHA-256 is not the one collection recorded: a notebook put there by hand since)."""
    if graded != f"{assignment}.ipynb":
        return None
    try:
        known = json.loads((course / "downloaded" / assignment / LMS_FILE).read_text(encoding="utf-8"))
        entry = known["students"][student]
        uploaded, digest = str(entry["uploaded"]), str(entry["sha256"])
        data = read_bytes(course / "submitted" / student / assignment / graded)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if hashlib.sha256(data).hexdigest() != digest or AGAIN.sub("", uploaded.removesuffix(".ipynb")) == assignment:
        return None
    return uploaded


AGAIN = re.compile(r"(?:-(\d+)| \((\d+)\))$")  # an LMS's upload number: name-2.ipynb (Canvas), name (2).ipynb (Moodle)


def read_bytes(path: Path) -> bytes:
    """A regular file's first NOTEBOOK_BYTES + 1 bytes, never through a symbolic link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        return f.read(NOTEBOOK_BYTES + 1)


def submitted_name(course: Path, student: str, assignment: str, release: dict | None = None) -> str:
    """The file of the submission that is graded (`submission_files`)."""
    return submission_files(course, student, assignment, release)[0]


def other_notebooks(course: Path, student: str, assignment: str, graded: str) -> list[str]:
    """The submission's notebooks besides the graded one (not graded: one notebook per submission)."""
    return [name for name in notebooks_in(course / "submitted" / student / assignment) if name != graded]


def renamed_note(name: str, assignment: str, uploaded: str | None = None) -> str | None:
    """What the report says when the graded notebook is not named `<assignment>.ipynb`, or was
    `uploaded` to the LMS under another name."""
    if uploaded:
        return f"graded {uploaded!r}, as uploaded to the LMS (collected as {name})"
    if name == f"{assignment}.ipynb":
        return None
    return f"graded {name!r}, the submission's only notebook (not named {assignment}.ipynb)"


def stopped_at(notebook: dict, tests: set[str]) -> str | None:
    """Where the notebook as saved last stopped, "code cell N (ValueError)", if it did before a test
    cell: its most recently run code cell (the highest execution count) ended with an error and a
    test cell (a grade id of `tests`) comes after it. A *Run All* stops there, so the test cells after it show no tick (or
    an earlier run's) in the student's notebook, though grading runs each part on its own (student
    walkthrough 48h, D1)."""
    code = [c for c in notebook.get("cells") or [] if isinstance(c, dict) and c.get("cell_type") == "code"]
    counts = [(c.get("execution_count") if type(c.get("execution_count")) is int else -1, n) for n, c in enumerate(code)]
    count, last = max(counts, default=(-1, -1))
    if count < 0 or not any(grade_id(c) in tests for c in code[last + 1:]):
        return None
    outputs = code[last].get("outputs")
    errors = [o for o in (outputs if isinstance(outputs, list) else []) if isinstance(o, dict)
              and o.get("output_type") == "error"]  # a student's JSON: any shape
    if not errors:
        return None
    name = re.sub(r"[^\w.]", "", str(errors[0].get("ename")))[:60] or "an error"
    return f"code cell {last + 1} ({name})"


def files_note(graded: str, others: list[str], handed_out: set[str], assignment: str,
               uploaded: str | None = None) -> str | None:
    """What the report says of the files of a submission: the graded one if it is not named
    `<assignment>.ipynb` (or was `uploaded` to the LMS under another name: `uploaded_as`), the
    others, and why the graded one won where one of them is as handed out."""
    if not others:
        return renamed_note(graded, assignment, uploaded)
    listed = ", ".join(repr(name) + (" (as handed out: no answer changed)" if name in handed_out else "")
                       for name in others[:5]) + (" ..." if len(others) > 5 else "")
    why = (", the notebook with work in it" if graded != f"{assignment}.ipynb" and handed_out & set(others) else "")
    return f"graded {uploaded or graded!r}{why}; not graded: {listed}"


def read_submission(course: Path, student: str, assignment: str, release: dict | None = None) -> dict:
    """The submitted notebook (`submitted_name`, with the `release` if given), read without
    following a symbolic link: refused if it is one, or a folder on its way is one, or its folder
    holds one (a link would make the grader read, and show in the feedback, whatever it points to)."""
    folder = course / "submitted"
    for name in (student, assignment):
        folder = folder / name
        if folder.is_symlink():
            raise ValueError(f"submitted/{folder.relative_to(course / 'submitted')} is a symbolic link, "
                             "not a folder: hand in the notebook itself")
    for where, folders, files in os.walk(folder):
        for name in folders + files:
            if os.path.islink(os.path.join(where, name)):
                raise ValueError(f"the submission contains a symbolic link ({name}): "
                                 "hand in the notebook itself, no links")
    notebook = folder / submitted_name(course, student, assignment, release)
    if notebook.is_symlink():
        raise ValueError("the submitted notebook is a symbolic link: hand in the notebook itself")
    return read_regular(notebook)


def read_regular(notebook: Path) -> dict:
    """A notebook read from a regular file, never through a symbolic link (nor from a pipe)."""
    try:
        fd = os.open(notebook, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == 40:  # ELOOP: the notebook itself is a link
            raise ValueError("the submitted notebook is a symbolic link: hand in the notebook itself") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("the submitted notebook is not a regular file")
        return parse_notebook(f.read(NOTEBOOK_BYTES + 1))


def write_private(path: Path, text: str) -> None:
    """Write a grader's file in the course, never through a symbolic link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def recovered(submission: dict, release: dict) -> tuple[dict, int]:
    """The submission with the nbgrader metadata of each released cell put back on the cell that
    kept its id but lost the metadata (some editors strip it), and how many cells got it back."""
    nb = copy.deepcopy(submission)
    released = {c.get("id"): c for c in release["cells"] if grade_id(c) and isinstance(c.get("id"), str)}
    present = {grade_id(c) for c in nb["cells"]}
    count = 0
    for cell in nb["cells"]:
        source = released.get(cell.get("id")) if isinstance(cell.get("id"), str) else None
        if source is not None and grade_id(cell) is None and grade_id(source) not in present:
            metadata = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
            cell["metadata"] = {**metadata, "nbgrader": copy.deepcopy(source["metadata"]["nbgrader"])}
            present.add(grade_id(source))
            count += 1
    return nb, count


OWN_SETUP = "# your set-up cell as you changed it: the one above runs as handed out"


def setup_kept(notebook: dict, release: dict) -> dict:
    """`notebook` with, right after its set-up cell, a code cell of the student's own holding that
    cell as they changed it. nbgrader's autograde puts a locked cell back as handed out, so the
    feedback run ran without the change (an `import math` added there) that the hidden tests run
    with: the page showed a NameError under a part graded full (student walkthrough 48g, D2)."""
    released = next((source_text(c) for c in release["cells"] if grade_id(c) == "setup"), None)
    cells = []
    for cell in notebook["cells"]:
        cells.append(cell)
        if (released is not None and grade_id(cell) == "setup" and cell.get("cell_type") == "code"
                and source_text(cell).strip() != released.strip()):
            cells.append({"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                          "source": f"{OWN_SETUP}\n{source_text(cell)}"})
    return {**notebook, "cells": cells}


def normalised(submission: dict, release: dict) -> dict:
    """The submission with each released cell's nbgrader metadata as released, on the first cell
    that carries its grade_id; removed from duplicates and from cells that never had any."""
    nb = copy.deepcopy(submission)
    released = {grade_id(c): c["metadata"]["nbgrader"] for c in release["cells"] if grade_id(c)}
    seen = set()
    for cell in nb["cells"]:
        metadata = cell.setdefault("metadata", {}) if isinstance(cell.get("metadata"), dict) else {}
        cell["metadata"] = metadata
        gid = grade_id(cell)
        metadata.pop("nbgrader", None)
        if gid in released and gid not in seen:
            metadata["nbgrader"] = copy.deepcopy(released[gid])
            seen.add(gid)
    return nb
