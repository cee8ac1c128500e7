"""The whole class's results of an assignment, read back from the gradebook: the scores per part
and the report each grading run prints for its own students (who was recorded as 0 and why,
notes, failure messages, answers to read by hand), for every student at once, also after grading
in shards on several machines into one PostgreSQL database (instructor walkthrough 47b, C6: each
shard printed its own students' table only, and no command printed the class's). Never runs
student code: it prints what the grader wrote.

    python -m grader results ASSIGNMENT [--course DIR] [--db-url URL]
    write_notes(gradebook, assignment, student, report)   # in the student's grade transaction
    print_results(course, assignment, url)

The report's lines are kept in a table of the grader's own, `mpcourse_report`, in the gradebook's
database beside nbgrader's tables (which nbgrader neither reads nor changes): one row per line,
replaced with the student's grades in one transaction. The answers to read by hand are the review
flags the grade was written with (grader/gradebook.py's GRADED table), their one home. The failure
messages are the runner's own, as the grading run prints them: for the instructor only, never shown
to a student (nbgrader's feedback reads none of this table).
"""
import json
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy import Column, Integer, MetaData, String, Table, Text, create_engine, delete, inspect, select

from grader.report import one_line, plural, print_report, print_table, shortened

METADATA = MetaData()
NOTES = Table("mpcourse_report", METADATA,
              Column("id", Integer, primary_key=True),
              Column("assignment", String(128), nullable=False, index=True),
              Column("student", String(128), nullable=False),
              Column("kind", String(16), nullable=False),  # not graded, note, failed
              Column("part", String(128), nullable=False, default=""),
              Column("text", Text, nullable=False))
TEXT_CHARS = 2000  # the most characters of one line kept (the grading run keeps as many of a message), the grader's note aside


def create_table(url: str) -> None:
    """The grader's table in the gradebook at `url`, if it is not there (before anyone is graded:
    two shards that create it at once find it made by the other)."""
    engine = create_engine(url)
    try:
        try:
            METADATA.create_all(engine, checkfirst=True)
        except Exception:  # noqa: BLE001  another shard created it between the check and the create
            if not inspect(engine).has_table(NOTES.name):
                raise
    finally:
        engine.dispose()


def lines_of(report, student: str) -> list[dict]:
    """What `report` (grader.schedule.Report) says of `student`, as the table's rows."""
    rows = []
    if student in report.not_graded:
        rows.append({"kind": "not graded", "part": "", "text": report.not_graded[student]})
    if student in report.notes:
        rows.append({"kind": "note", "part": "", "text": report.notes[student]})
    for part, message in report.messages.get(student, {}).items():
        rows.append({"kind": "failed", "part": part, "text": message})
    return [{**row, "part": storable(row["part"])[:128], "text": shortened(storable(row["text"]), TEXT_CHARS)}
            for row in rows]


def storable(text) -> str:
    """`text` as every database stores it: PostgreSQL refuses a NUL in text, and the failed
    insert cost a student their grade, their report lines and their flags' record (red team 45j,
    A05, A06: `ValueError('\\x00')` in a failure message); a lone surrogate is not UTF-8."""
    return str(text).replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")


def write_notes(gradebook, assignment: str, student: str, report) -> None:
    """Replace `student`'s lines of `assignment` with what `report` says of them, in the session's
    transaction (the caller commits it with the grades)."""
    gradebook.db.execute(delete(NOTES).where(NOTES.c.assignment == assignment, NOTES.c.student == student))
    rows = lines_of(report, student)
    if rows:
        gradebook.db.execute(NOTES.insert(), [{"assignment": assignment, "student": student, **row} for row in rows])


def read_report(url: str, assignment: str, graded: set[str]):
    """A report (grader.schedule.Report's fields, for grader.report.print_report) of the lines
    written for `assignment`'s `graded` students (none for a gradebook graded before the table
    existed), with the review flags written with their grades."""
    from nbgrader.api import Gradebook
    from grader.gradebook import GRADED, graded_records, stored_flags
    report = SimpleNamespace(not_graded={}, unwritten=set(), notes={}, messages={}, flags={}, flagged_before={})
    engine = create_engine(url)
    try:
        tables = inspect(engine).get_table_names()
        rows = []
        if NOTES.name in tables:
            with engine.connect() as connection:
                rows = connection.execute(select(NOTES).where(NOTES.c.assignment == assignment)
                                          .order_by(NOTES.c.student, NOTES.c.id)).mappings().all()
    finally:
        engine.dispose()
    if GRADED in tables:
        with Gradebook(url) as gradebook:
            records = graded_records(gradebook, assignment)
        report.flags = {s: flags for s in sorted(graded) if (flags := stored_flags(records, s))}
    for row in rows:
        student = row["student"]
        if student not in graded:
            continue
        if row["kind"] == "not graded":
            report.not_graded[student] = row["text"]
        elif row["kind"] == "note":
            report.notes[student] = row["text"]
        elif row["kind"] == "failed":
            report.messages.setdefault(student, {})[row["part"]] = row["text"]
    return report


def late_hand_ins(course: Path, assignment: str) -> dict[str, dict]:
    """{student: what collect remembered} of the students an LMS download named late (Canvas's
    `_late`), or {} where the assignment was not collected from an LMS."""
    from grader.collect import LMS_FILE
    try:
        known = json.loads((course / "downloaded" / assignment / LMS_FILE).read_text(encoding="utf-8"))
        return {s: e for s, e in known["students"].items() if isinstance(e, dict) and e.get("late") is True}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def print_results(course: Path, assignment: str, url: str | None = None) -> None:
    """The scores per part of every student graded in `assignment`, then the report's lines for
    all of them, then the students with a submission and no grade."""
    from grader.fabricate import test_points
    from grader.gradebook import HALF_WRITTEN, db_url, not_current, scores, submitters, without_password
    given = f" --db-url {without_password(url)}" if url else ""  # the hints name the gradebook read (walkthrough 47f, C1)
    url = db_url(course, url)
    absent = url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists()
    graded = {} if absent else scores(course, assignment, url)  # (opening a missing SQLite file would create it)
    stale = {} if absent else not_current(course, assignment, url)
    graded = {s: {t: (v or 0.0) for t, v in parts.items()} for s, parts in graded.items()
              if stale.get(s) != HALF_WRITTEN}  # half-written: NOT GRADED YET, below
    if not graded:
        print(f"no grade of {assignment} in {without_password(url)}: grade it first "
              f"(python -m grader grade {assignment})")
    else:
        print_table(assignment, graded, test_points(assignment))
        print_report(read_report(url, assignment, set(graded)))
    for student, why in sorted(stale.items()):
        if student in graded:
            print(one_line(f"  NOT CURRENT {student}: {why}: the grade above is the earlier submission's "
                           f"(python -m grader grade {assignment}{given} grades it again)"))
    for student, entry in sorted(late_hand_ins(course, assignment).items()):
        if student in graded:  # collect's LATE lines, again where the class's results are read (walkthrough 47c)
            print(one_line(f"  LATE: {student} handed in {assignment} late ({entry.get('file', '?')})"))
    waiting = sorted(set(submitters(course, assignment)) - set(graded))
    if waiting:
        print(one_line(f"  NOT GRADED YET: {plural(len(waiting), 'student')} with a submission in submitted/ and no "
                       f"grade: {', '.join(waiting)} (python -m grader grade {assignment} grades them)"))
    print(f"{plural(len(graded), 'student')} graded in {without_password(url)}")
