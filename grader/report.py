"""What the instructor reads after a grading run: the scores per part, and the report (who was not
graded and why, notes, failure messages, answers to read by hand). Never runs student code: it
prints data the grader collected.

    print_table(assignment, graded, points)    # graded: {student: {test cell: points}}
    print_report(report, messages=True)        # report: grader.schedule.Report
    printable(text) -> text                    # student-controlled text made safe for a terminal
    one_line(text) -> text                     # and on one line
    shortened(message, limit) -> text          # a failure message cut, "[...]" where, the grader's note kept
    plural(count, "file") -> "1 file", "2 files"

Every line printed goes through `printable`: a student chooses their messages, file names and
answers, and a terminal obeys the control characters in them (move the cursor, erase the lines
above, set the title, write the clipboard, hide what follows).
"""
import unicodedata

# A failure message is the runner's text (what the tests or the student's code raised: grader/hidden_tests.py)
# and, after NOTE, the grader's own note (grader/advice.py). Each place that shows one cuts it (the
# feedback page, this report, `python -m grader results`, each at its length): the note says why the
# part failed and what to do, so the runner's text is cut and the note kept (student walkthrough 48f,
# B: the page cut "set it in a cell of your own" away, and the report cut it with no mark).
NOTE = "\nGrader's note: "   # where the grader's note starts in a failure message
CUT = " [...]"                # where a message was cut
NOTE_CHARS = 1000             # the most of a note kept whole (a student's own text could pose as one)
MESSAGE_CHARS = 300           # a failure message in the report, note aside


def shortened(message, limit: int) -> str:
    """`message` with the runner's text cut to `limit` characters (CUT where it was cut) and the
    grader's note, if any (the text after the last NOTE), kept whole up to NOTE_CHARS."""
    text, found, note = str(message).rpartition(NOTE)
    if not found:
        text, note = note, ""
    text = text if len(text) <= limit else text[:limit] + CUT
    note = note if len(note) <= NOTE_CHARS else note[:NOTE_CHARS] + CUT
    return f"{text}{NOTE}{note}" if found else text


def printable(text) -> str:
    """`text` with every control or format character (C0 but newline and tab, DEL, C1 and so every
    escape sequence, bidirectional overrides, lone surrogates) and the line and paragraph separators
    (U+2028, U+2029: a line break to `str.splitlines`, red team 45l, A05) written as its escape,
    `\\x1b`: shown, never obeyed, and always encodable."""
    return "".join(char if char in "\n\t" or (unicodedata.category(char)[0] != "C"
                                             and unicodedata.category(char) not in ("Zl", "Zp"))
                   else char.encode("unicode_escape").decode() for char in str(text))


def one_line(text) -> str:
    """`printable(text)` with its newlines written as `\\n`: one line of the report, whatever a
    student put in it (red team 45e, A03: a feedback run's stderr, quoted in a note, forged
    `READ` and `NOT GRADED` lines about classmates)."""
    return printable(str(text).replace("\n", "\\n"))


def text_of(name: str) -> str:
    """`name` with each lone surrogate (a byte that is not UTF-8 in a folder download's file name, as
    Python reads it) written U+FFFD: text that any file, CSV or zip can hold (red team 16c, A03)."""
    return "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in str(name))


def plural(count: int, one: str, many: str | None = None) -> str:
    """`1 file`, `2 files`: the count and its noun (`many`: the plural where it is not `one` + s)."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def print_table(assignment: str, graded: dict[str, dict[str, float]], points: dict[str, float]) -> None:
    print(f"\n{assignment}  (max {sum(points.values()):g})")
    print(f"{'student':26}" + "".join(f"{gid:>10}" for gid in points) + f"{'total':>8}")
    for student, by_cell in sorted(graded.items()):
        cells = "".join(f"{by_cell.get(gid, 0):>10g}" for gid in points)
        print(printable(f"{student:26}{cells}{sum(by_cell.values()):>8g}"))


def print_report(report, messages: bool = True) -> None:
    """What the instructor must read: who was not graded, notes, per student and part the failure
    message (as the runner gave it: never shown to students as is) and answers to read by hand,
    those this run graded and those an earlier run graded and flagged (red team 45i, A09)."""
    for student, why in sorted(report.not_graded.items()):
        fate = "no grade written: the next run grades them" if student in report.unwritten else "recorded as 0"
        print(one_line(f"  NOT GRADED {student}: {why} ({fate})"))
    for student, note in sorted(report.notes.items()):
        print(one_line(f"  note on {student}: {note}"))
    for student, failed in sorted(report.messages.items()) if messages else ():
        for test, message in failed.items():
            print(printable(f"  {student} {test} failed: {' '.join(shortened(message, MESSAGE_CHARS).split())}"))
    for student, parts in sorted(report.flags.items()):
        for part, why in parts.items():
            print(one_line(f"  READ {student} {part}: its answer {', '.join(why)}"))
    for student, parts in sorted(report.flagged_before.items()):  # skipped as graded
        for part, why in parts.items():
            print(one_line(f"  READ {student} {part}: its answer {', '.join(why)} (flagged by an earlier run, "
                           "which graded it; still to read)"))
