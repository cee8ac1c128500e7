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
replaced with the student's grades in one transaction. The failure messages are the runner's own,
as the grading run prints them: for the instructor only, never shown to a student (nbgrader's
feedback reads none of this table).
"""
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy import Column, Integer, MetaData, String, Table, Text, create_engine, delete, inspect, select

from grader.report import one_line, plural, print_report, print_table, shortened

METADATA = MetaData()
NOTES = Table("mpcourse_report", METADATA,
              Column("id", Integer, primary_key=True),
              Column("assignment", String(128), nullable=False, index=True),
              Column("student", String(128), nullable=False),
              Column("kind", String(16), nullable=False),  # not graded, note, failed, read
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
    for part, why in report.flags.get(student, {}).items():
        rows.append({"kind": "read", "part": part, "text": "\n".join(why)})
    return [{**row, "part": str(row["part"])[:128], "text": shortened(row["text"], TEXT_CHARS)} for row in rows]


def write_notes(gradebook, assignment: str, student: str, report) -> None:
    """Replace `student`'s lines of `assignment` with what `report` says of them, in the session's
    transaction (the caller commits it with the grades)."""
    gradebook.db.execute(delete(NOTES).where(NOTES.c.assignment == assignment, NOTES.c.student == student))
    rows = lines_of(report, student)
    if rows:
        gradebook.db.execute(NOTES.insert(), [{"assignment": assignment, "student": student, **row} for row in rows])


def read_report(url: str, assignment: str, graded: set[str]):
    """A report (grader.schedule.Report's fields, for grader.report.print_report) of the lines written for `assignment`'s `graded` students (none for
    a gradebook graded before the table existed)."""
    report = SimpleNamespace(not_graded={}, unwritten=set(), notes={}, messages={}, flags={}, flagged_before={})
    engine = create_engine(url)
    try:
        if not inspect(engine).has_table(NOTES.name):
            return report
        with engine.connect() as connection:
            rows = connection.execute(select(NOTES).where(NOTES.c.assignment == assignment)
                                      .order_by(NOTES.c.student, NOTES.c.id)).mappings().all()
    finally:
        engine.dispose()
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
        elif row["kind"] == "read":
            report.flags.setdefault(student, {})[row["part"]] = row["text"].split("\n")
    return report


def print_results(course: Path, assignment: str, url: str | None = None) -> None:
    """The scores per part of every student graded in `assignment`, then the report's lines for
    all of them, then the students with a submission and no grade."""
    from grader.fabricate import test_points
    from grader.gradebook import db_url, scores, submitters, without_password
    url = db_url(course, url)
    absent = url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists()
    graded = {} if absent else scores(course, assignment, url)  # (opening a missing SQLite file would create it)
    graded = {s: {t: (v or 0.0) for t, v in parts.items()} for s, parts in graded.items()}
    if not graded:
        print(f"no grade of {assignment} in {without_password(url)}: grade it first "
              f"(python -m grader grade {assignment})")
    else:
        print_table(assignment, graded, test_points(assignment))
        print_report(read_report(url, assignment, set(graded)))
    waiting = sorted(set(submitters(course, assignment)) - set(graded))
    if waiting:
        print(one_line(f"  NOT GRADED YET: {plural(len(waiting), 'student')} with a submission in submitted/ and no "
                       f"grade: {', '.join(waiting)} (python -m grader grade {assignment} grades them)"))
    print(f"{plural(len(graded), 'student')} graded in {without_password(url)}")
