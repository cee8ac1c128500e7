"""The course's gradebook (nbgrader's): registering an assignment, writing each student's grade
and feedback notebook as soon as it is known, reading and exporting the grades, and the
instructor's secret. Never runs student code: it writes what the judge decided, as data.

    prepare(course, assignment, url)      # once, before shards start: the schema, the assignment, the students
    register(course, assignment, url)     # the assignment, its notebook, points and cells
    graded_students(gradebook, assignment, points) -> {students with every part's grade written}
    record(gradebook, course, assignment, student, result, ...)  # one student, from the scheduler
    stored_flags(records, student) -> {part: [why]}      # the review flags kept with a grade
    scores(course, assignment, url) -> {student: {test cell: score}}
    export(course, to, url)               # `nbgrader export`: one CSV row per student and assignment

The gradebook is SQLite (`gradebook.db` in the course) on one machine, or any database nbgrader's
`CourseDirectory.db_url` names: PostgreSQL (`postgresql+psycopg://user@host/database`) where
several machines grade one assignment at once. One writer per grading process (the scheduler's
thread); each student's rows are written in a transaction of their own, retried if the database
is busy, so that shards (each with its own students) never write the same rows. With them, in a
table of the grader's own (GRADED), what was graded and its review flags: any machine's rerun
reads them.
"""
import functools
import json
import os
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

from grader.course import generate_assignment, nbgrader
from grader.feedback import feedback_notebook, safe_message
from grader.notebooks import grade_id, read_submission, stopped_at, submission_files, uploaded_as, write_private
from grader.report import shortened

STUDENT_ID_CHARS = 128  # nbgrader's student.id, varchar(128): PostgreSQL refuses more, SQLite would not

PLACEHOLDER_SECRET = "public-placeholder"
RETRIES = 8  # a busy database (SQLite locked by another process, a PostgreSQL conflict): tries per student


def db_url(course: Path, url: str | None = None) -> str:
    """The gradebook's address: `url`, else the course's `c.CourseDirectory.db_url`
    (nbgrader_config.py), else SQLite in the course (nbgrader's default). A relative SQLite path
    is the course's, as for nbgrader (run in the course directory)."""
    if not url and (course / "nbgrader_config.py").exists():
        from traitlets.config.loader import PyFileConfigLoader
        config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
        url = str(config.CourseDirectory.get("db_url") or "")
    url = url or "sqlite:///gradebook.db"
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        url = f"sqlite:///{course / url.removeprefix('sqlite:///')}"
    if url.startswith("postgresql"):
        refuse_text_not_utf8(url)
    return url


CHECKED_ENCODING: set = set()  # the PostgreSQL addresses whose encoding this process has read


def refuse_text_not_utf8(url: str) -> None:
    """ValueError, in a sentence, for a PostgreSQL database that stores text other than as UTF-8:
    initdb on a machine with no locale (a container) makes SQL_ASCII ones, whose text comes back as
    bytes, and SQLAlchemy's first connection failed with a TypeError traceback before anyone was
    graded (red team 22, A02). A server that cannot be reached is left to the caller's message."""
    if url in CHECKED_ENCODING:
        return
    import psycopg
    from sqlalchemy.engine import make_url
    address = make_url(url)
    try:
        with psycopg.connect(host=address.host, port=address.port, user=address.username, password=address.password,
                             dbname=address.database, connect_timeout=10) as connection:
            encoding = connection.execute("SHOW server_encoding").fetchone()[0]
    except psycopg.Error:
        return
    encoding = encoding.decode(errors="replace") if isinstance(encoding, bytes) else str(encoding)
    if encoding.upper() not in ("UTF8", "UTF-8"):
        raise ValueError(f"the PostgreSQL database {without_password(url)} stores text as {encoding}, and the grader "
                         f"needs UTF8 (students' names, messages): make it with createdb --encoding=UTF8 --locale=C "
                         "--template=template0 (instructor guide, 'Several machines')")
    CHECKED_ENCODING.add(url)


def without_password(url: str) -> str:
    """The address without its password, for messages."""
    from sqlalchemy.engine import make_url
    return make_url(url).render_as_string(hide_password=True)


def registered(course: Path, assignment: str, url: str | None = None) -> bool:
    """Whether the course's gradebook knows `assignment` (grades can be written for it)."""
    from nbgrader.api import Gradebook, MissingEntry
    from sqlalchemy import create_engine, inspect
    url = db_url(course, url)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return False
    engine = create_engine(url)
    try:
        if "notebook" not in inspect(engine).get_table_names():  # no schema: nothing prepared there
            return False
    finally:
        engine.dispose()
    with Gradebook(url) as gradebook:
        try:
            gradebook.find_notebook(assignment, assignment)
        except MissingEntry:
            return False
    return True


def register(course: Path, assignment: str, url: str | None = None) -> None:
    """Put `assignment` (its notebook, points and cells) in the course's gradebook as `nbgrader
    generate_assignment` does, without touching exercises/ (the release goes to a scratch folder):
    `make exercises` registers nothing, it uses a scratch gradebook. nbgrader's code runs in this
    process (grader/course.py, generate_assignment): a command of its own cost 2 s of CPU, half of
    them in the `alembic heads` that nbgrader starts to stamp a new gradebook (issue 52)."""
    with tempfile.TemporaryDirectory(prefix="registration-") as scratch:
        try:
            generate_assignment(course, assignment, db_url(course, url), release_directory=scratch)
            said = ""
        except RuntimeError as error:
            said = str(error)
    if said or not registered(course, assignment, url):
        raise RuntimeError(f"could not register {assignment} in {without_password(db_url(course, url))}: nbgrader said\n"
                           f"{said[-3000:]}\nFix that, then run, in {course}:\n"
                           f"  nbgrader generate_assignment {assignment} --force "
                           f"--CourseDirectory.release_directory=/tmp/{assignment}-release")


def submitters(course: Path, assignment: str) -> list[str]:
    """The students with a submission of `assignment` in submitted/."""
    return sorted(p.parent.name for p in (course / "submitted").glob(f"*/{assignment}"))


def prepare(course: Path, assignment: str, url: str | None = None) -> list[str]:
    """Once, before the shards of a grading start: the gradebook's schema (with GRADED), `assignment`
    and every student who handed it in, so that no two shards ever create the same rows. Returns
    the students."""
    from nbgrader.api import Gradebook
    from sqlalchemy import create_engine
    engine = create_engine(db_url(course, url))
    try:
        engine.connect().close()  # an unreachable server: sqlalchemy's OperationalError, before nbgrader's traceback
    finally:
        engine.dispose()
    students = submitters(course, assignment)
    too_long = [s for s in students if len(s) > STUDENT_ID_CHARS]
    if too_long:  # SQLite would take them, PostgreSQL not: the gradebooks would differ
        raise ValueError(f"student ids longer than the gradebook's {STUDENT_ID_CHARS} characters in "
                         f"{course / 'submitted'}: {', '.join(too_long)}. Rename their folders there "
                         "(python -m grader collect shortens such ids itself)")
    register(course, assignment, url)
    from grader.results import create_table
    create_table(db_url(course, url))
    with Gradebook(db_url(course, url)) as gradebook:
        create_graded_table(gradebook)
        for student in students:
            gradebook.update_or_create_student(student)
    return students


def graded_students(gradebook, assignment: str, points: dict) -> set[str]:
    """The students of `assignment` whose every test cell in `points` has its grade written (a
    run stopped half-way through a student's rows leaves that student ungraded)."""
    from nbgrader.api import Assignment, Grade, GradeCell, SubmittedAssignment, SubmittedNotebook
    rows = (gradebook.db.query(SubmittedAssignment.student_id, GradeCell.name, Grade.auto_score)
            .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
            .join(SubmittedNotebook, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
            .join(Grade, Grade.notebook_id == SubmittedNotebook.id)
            .join(GradeCell, Grade.cell_id == GradeCell.id)
            .filter(Assignment.name == assignment).all())
    written: dict = {}
    for student, cell, score in rows:
        if score is not None:
            written.setdefault(student, set()).add(cell)
    return {student for student, cells in written.items() if set(points) <= cells}


SECRET_VARIABLE = "MPCOURSE_GRADING_SECRET"
SECRET_FILE = ".grading-secret"


class SecretError(RuntimeError):
    pass


SECRET_CHARS = 32  # the least a secret holds: a short one is guessed from one student's derived secret (red team 14, s29)


def git(course: Path, *args: str) -> subprocess.CompletedProcess:
    """git in `course`, without the caller's GIT_DIR, GIT_INDEX_FILE, ... (they would point it at
    another repository or index than the course's: red team 14, s09/s10)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", *args], cwd=course, capture_output=True, text=True, env=clean)


def in_repository(course: Path) -> bool:
    folder = course.resolve()
    return any((p / ".git").exists() for p in (folder, *folder.parents))


def git_problem(course: Path, path: Path, secret: str) -> str | None:
    """Why `secret`, read from `path` in `course`, may be in git (tracked, or in any commit of any
    branch: a `git rm --cached` leaves it in the history a push sends, red team 14, s03/s04), or
    why git cannot say; None outside a git repository or when git holds it nowhere."""
    if not in_repository(course):
        return None
    try:
        index = git(course, "ls-files", "--error-unmatch", str(path))
    except FileNotFoundError:
        return "git is not installed here, so the grader cannot tell whether git holds it"
    if index.returncode == 0:
        return (f"it is tracked by git, so the secret would be pushed with it: run `git rm --cached {SECRET_FILE}` "
                "there, then make a new secret (the old one may be public)")
    if index.returncode != 1:  # e.g. root in another user's clone after `su -`: "dubious ownership" (review 37g)
        said = (index.stderr.strip().splitlines() or ["no message"])[-1]
        return f"git cannot tell whether it is tracked ({said})"
    if git(course, "check-ignore", "-q", str(path)).returncode == 1:  # red team 14, s16: one `git add -A` away
        return (f"git does not ignore it, so one `git add -A` would commit it: add `/{SECRET_FILE}` to the "
                "repository's .gitignore")
    commits = git(course, "log", "--all", "--format=%H", "--", str(path)).stdout.split()
    for commit in commits[:200]:
        shown = git(course, "show", f"{commit}:./{path.name}")
        if shown.returncode == 0 and shown.stdout.strip() == secret:
            return (f"this secret is in git's history (commit {commit[:10]}), which a push sends: make a new "
                    "secret (and keep it out of git)")
    return None


def instructor_secret(course: Path) -> str:
    """The secret the hidden tests' inputs are drawn from: $MPCOURSE_GRADING_SECRET, else the file
    .grading-secret in the course directory: a plain file only its owner reads, that git holds
    nowhere (a clone of a public repository pushes it back one day), of at least SECRET_CHARS
    characters. Neither: the public placeholder, with a warning. SecretError says what to change."""
    from traitlets.config.loader import PyFileConfigLoader
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    if not str(config.HiddenTests.get("secret", PLACEHOLDER_SECRET)).startswith(PLACEHOLDER_SECRET):
        raise SecretError(f"nbgrader_config.py sets c.HiddenTests.secret: that file is tracked by git, so the "
                          f"secret would be pushed with it. Put it in ${SECRET_VARIABLE} or in {course / SECRET_FILE} "
                          "(git-ignored), and set the line back to the placeholder.")
    secret = os.environ.get(SECRET_VARIABLE, "").strip()
    path = course / SECRET_FILE
    make = f"(umask 077; python -c \"import secrets; print(secrets.token_hex(32))\" > {SECRET_FILE})"
    if not secret and (path.exists() or path.is_symlink()):
        if path.is_symlink() or not path.is_file():
            raise SecretError(f"{path} is {'a link' if path.is_symlink() else 'not a file'}: the grader reads the secret "
                              f"only from a plain file of its own (a link may lead to a tracked or public file). Make one: {make}")
        info = path.stat()
        if info.st_nlink > 1:
            raise SecretError(f"{path} has {info.st_nlink - 1} other hard link(s), which may be tracked or public: make "
                              f"a new secret in a file of its own: rm {SECRET_FILE}; {make}")
        if info.st_mode & 0o077:
            raise SecretError(f"{path} can be read by other users of this machine (mode {info.st_mode & 0o777:o}): "
                              f"chmod 600 {SECRET_FILE}, and make a new secret if anyone else may have read it")
        secret = path.read_text().strip()
        problem = git_problem(course, path, secret)
        if problem:
            raise SecretError(f"{path}: {problem}. Or give the secret in ${SECRET_VARIABLE}.")
    if not secret or secret.startswith(PLACEHOLDER_SECRET):
        warnings.warn(f"no grading secret (${SECRET_VARIABLE} or {SECRET_FILE}): using the public placeholder, so anyone "
                      "who reads solutions/ can compute the hidden tests' inputs. Set your own (instructor guide).")
        return PLACEHOLDER_SECRET
    if len(secret) < SECRET_CHARS:
        raise SecretError(f"the grading secret has {len(secret)} characters, fewer than {SECRET_CHARS}: a short one can be "
                          f"guessed from one student's derived secret, and then every student's hidden inputs "
                          f"computed. Make one: {make}")
    return secret


def record(gradebook, course, assignment, student, result, points, release, report, *, secrets, hidden_lines,
           feedback=True, fingerprint=None):
    """Write one student's points to the gradebook (their page in feedback/, of the grade before,
    removed first), their feedback notebook to autograded/ (unless not `feedback`: the one there
    stays) and what the instructor must know to `report`; their review flags and the submission's
    fingerprint with the grade, in one transaction (`write_grades`).
    `fingerprint`: submission_fingerprint taken before the submission was read for grading (a
    submission replaced while it was graded is then graded again on the next run); None: taken now."""
    verdicts, ran, problem, note, flags = result
    verdicts = verdicts or {}
    if flags:
        report.flags[student] = flags
    if problem:
        report.not_graded[student] = problem
    failed_in_run = visible_failures(ran, verdicts, points) if ran is not None else []
    if failed_in_run:  # graded full all the same: the instructor should know (issue 48, third walkthrough)
        note = "; ".join(filter(None, [note, f"its notebook as run fails the visible tests of {', '.join(failed_in_run)} "
                                             "(a cell above stopped with an error), graded full all the same: grading "
                                             "runs the lines after one that raises"]))
    if note:
        report.notes[student] = note
    scores = {t: (p if verdicts.get(t, {}).get("passed") is True else 0.0) for t, p in points.items()}
    report.scores[student] = scores
    report.messages[student] = {t: shortened(v.get("message"), 2000) for t, v in verdicts.items() if not v.get("passed")}
    if fingerprint is None:
        fingerprint = submission_fingerprint(course, student, assignment)
    folder = course / "autograded" / student / assignment
    for path in (course / "autograded", course / "autograded" / student, folder):
        if path.is_symlink():
            raise ValueError(f"{path} is a symbolic link: the grader writes nothing through it")
    # The page of the grade before, removed: never packed with this one (red team 16c, A08: after
    # `grade --no-feedback`, the old page went back as current); the feedback step writes the new one.
    page = course / "feedback" / student / assignment / f"{assignment}.html"
    if not any(p.is_symlink() for p in (page.parent, page.parent.parent)):
        page.unlink(missing_ok=True)
    write_grades(gradebook, assignment, student, scores, report, fingerprint=fingerprint, flags=flags or {})
    if ran is not None and feedback:
        shown = {t: {"passed": v.get("passed") is True,
                     "message": safe_message(v.get("message", ""), secrets=secrets, hidden_lines=hidden_lines)}
                 for t, v in verdicts.items()}
        try:
            files = submission_files(course, student, assignment, release)
            files = (*files, uploaded_as(course, student, assignment, files[0]))
        except (OSError, ValueError):
            files = None
        try:  # where the student's own Run All stopped, if before a test cell (student walkthrough 48h, D1)
            stopped = stopped_at(read_submission(course, student, assignment, release), set(points))
        except (OSError, ValueError):
            stopped = None
        write_private(folder / f"{assignment}.ipynb",
                      json.dumps(feedback_notebook(ran, release, points, shown, files, stopped), indent=1))


FLAGS_BYTES = 1_000_000  # more than the grader writes; larger flags are not read
# What a student was graded from and the review flags written with that grade, in the gradebook,
# beside nbgrader's tables, and nowhere else: a shard's command rerun on another machine still finds
# what was graded, and grades a re-submission again (red team 45i, A02: it kept 0 for a 10/10
# re-submission, silently); a run that skips a graded student lists their flags (A09).
GRADED = "grader_graded_submission"


@functools.cache
def graded_table():
    """GRADED: per assignment and student, the fingerprint of the submission graded ("" when it
    could not be read) and its review flags (JSON), written with the grade (`write_grades`)."""
    from sqlalchemy import Column, MetaData, String, Table, Text
    return Table(GRADED, MetaData(), Column("assignment", String(128), primary_key=True),
                 Column("student", String(STUDENT_ID_CHARS), primary_key=True),
                 Column("fingerprint", String(64), nullable=False), Column("flags", Text, nullable=False))


def create_graded_table(gradebook) -> None:
    """GRADED in `gradebook`'s database, unless there (`prepare` makes it before the shards start;
    two processes creating it at once: one does, the other finds it made)."""
    from sqlalchemy import inspect
    from sqlalchemy.exc import SQLAlchemyError
    try:
        graded_table().create(gradebook.db.connection(), checkfirst=True)  # in the session's transaction
        gradebook.db.commit()
    except SQLAlchemyError:
        gradebook.db.rollback()
        if GRADED not in inspect(gradebook.db.get_bind()).get_table_names():
            raise


def graded_records(gradebook, assignment: str) -> dict[str, tuple[str, str]]:
    """{student: (fingerprint, flags as JSON)} of `assignment` from GRADED."""
    table = graded_table()
    rows = gradebook.db.execute(table.select().where(table.c.assignment == assignment)).all()
    return {row.student: (row.fingerprint, row.flags) for row in rows}


def submission_fingerprint(course: Path, student: str, assignment: str) -> str | None:
    """A SHA-256 of the student's submission folder as it is now (every file's name and bytes), or
    None if it cannot be read: grading it again is decided by it, not by the gradebook alone."""
    import hashlib
    folder = course / "submitted" / student / assignment
    if not folder.is_dir():  # moved out of the course: no submission to compare
        return None
    digest = hashlib.sha256()
    try:
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    except OSError:
        return None
    return digest.hexdigest()


def graded_from(records: dict, student: str) -> str | None:
    """The fingerprint of the submission `student` was last graded from (`records`: graded_records),
    or None: not recorded (a grade written by a grader older than GRADED, or from an unreadable folder)."""
    return (records.get(student) or ("", ""))[0] or None


def stored_flags(records: dict, student: str) -> dict[str, list[str]]:
    """The review flags written with `student`'s grade ({part: [why to read it]}; {} when none, or
    none recorded) from `records` (graded_records). A run that skips the student as graded
    reports them (red team 45i, A09: a run stopped after a flagged student's grade was written,
    then rerun, never said to read that answer)."""
    if student not in records:
        return {}
    text = records[student][1]
    try:
        if len(text) > FLAGS_BYTES:
            raise ValueError("too large")
        flags = json.loads(text)
        if not (isinstance(flags, dict) and all(isinstance(part, str) and isinstance(why, list)
                                                and all(isinstance(w, str) for w in why) for part, why in flags.items())):
            raise ValueError("not {part: [why]}")
    except ValueError as error:  # the grader's own record, damaged: say so rather than nothing
        return {"?": [f"may be flagged: its flags in {GRADED} in the gradebook cannot be read ({error}); "
                      "read the whole answer"]}
    return flags


def handed_in_again(course: Path, assignment: str, students: list[str], records: dict) -> list[str]:
    """The graded `students` whose submission changed since it was graded (a collect of a later
    download replaced it): they are graded again (instructor walkthrough 47b, B1: a re-submission
    kept its old 0 and its old feedback page, exported to Canvas). `records`: graded_records."""
    changed = []
    for student in students:
        before, now = graded_from(records, student), submission_fingerprint(course, student, assignment)
        if before is not None and now is not None and before != now:
            changed.append(student)
    return changed


def visible_failures(ran: dict, verdicts: dict, points: dict) -> list[str]:
    """The test cells that stopped with an error in the feedback run (`ran`, data from the sandbox)
    although their part passed when graded."""
    failed = []
    for cell in ran.get("cells", []) if isinstance(ran, dict) else []:
        gid = grade_id(cell) if isinstance(cell, dict) else None
        outputs = cell.get("outputs") if gid in points else None
        if (isinstance(outputs, list) and verdicts.get(gid, {}).get("passed") is True
                and any(isinstance(o, dict) and o.get("output_type") == "error" for o in outputs)):
            failed.append(str(gid))
    return failed


def write_grades(gradebook, assignment: str, student: str, scores: dict, report=None, *,
                 fingerprint: str | None = None, flags: dict | None = None) -> None:
    """One student's rows, committed; tried again after a pause while the database is busy (another
    process holds SQLite's lock, or PostgreSQL reports a conflict). A student whose rows are not all
    written stays ungraded (`graded_students`), so that the next run grades them again. In the same
    transaction: with `report` (grader.schedule.Report), what it says of the student, for
    `python -m grader results` (grader/results.py; its table made by `prepare` or `grade` first);
    with `flags` (the review flags, {} for none), they and `fingerprint`, the submission's, in
    GRADED, which every machine that reaches the gradebook reads."""
    from nbgrader.api import InvalidEntry
    from sqlalchemy.exc import IntegrityError, OperationalError
    for attempt in range(RETRIES):
        try:
            gradebook.update_or_create_student(student)
            gradebook.update_or_create_submission(assignment, student)
            for test, score in scores.items():
                gradebook.find_grade(test, assignment, assignment, student).auto_score = score
            if report is not None:
                from grader.results import write_notes
                write_notes(gradebook, assignment, student, report)
            if flags is not None:  # what was graded: this submission's, or (unread) none
                table = graded_table()
                mine = (table.c.assignment == assignment) & (table.c.student == student)
                gradebook.db.execute(table.delete().where(mine))
                gradebook.db.execute(table.insert().values(assignment=assignment, student=student,
                                                           fingerprint=fingerprint or "", flags=json.dumps(flags)))
            gradebook.db.commit()
            return
        except (OperationalError, IntegrityError, InvalidEntry):
            gradebook.db.rollback()
            if attempt == RETRIES - 1:
                raise
            time.sleep(min(0.05 * 2 ** attempt, 5))
        except BaseException:  # anything else: nothing of this student's is left for the next commit
            gradebook.db.rollback()  # (red team 45j, A06: the next student's commit wrote half of theirs)
            raise


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


def not_current(course: Path, assignment: str, url: str | None = None) -> dict[str, str]:
    """{student: why the grade the gradebook holds is not the one to hand back now}: a part with no
    grade written (a run stopped half-way through their rows: red team 45k, A11, shown as 0), or a
    submission collected again since it was graded (A02, A06: `results`, `export --lms` and
    `pack-feedback --lms` gave the old grade, flags and page, silently). `grade` grades both."""
    from nbgrader.api import Gradebook, MissingEntry
    from sqlalchemy.exc import SQLAlchemyError
    if db_url(course, url).startswith("sqlite:///") and not Path(db_url(course, url)[len("sqlite:///"):]).exists():
        return {}  # no gradebook: nothing graded (opening one would create it)
    marked = scores(course, assignment, db_url(course, url))  # nbgrader's score: 0.0 where none is written
    with Gradebook(db_url(course, url)) as gradebook:
        try:
            cells = {c.name for nb in gradebook.find_assignment(assignment).notebooks for c in nb.grade_cells}
        except MissingEntry:
            return {}
        written = graded_students(gradebook, assignment, dict.fromkeys(cells))
        try:
            records = graded_records(gradebook, assignment)
        except SQLAlchemyError:  # a gradebook graded before GRADED existed
            gradebook.db.rollback()
            records = {}
    out = {s: HALF_WRITTEN for s in marked if s not in written}
    for student in handed_in_again(course, assignment, sorted(set(marked) - set(out)), records):
        out[student] = "handed in again since graded (a later download was collected)"
    return out


HALF_WRITTEN = "a part has no grade written (a grading run stopped half-way through this student)"


def refuse_not_current(course: Path, assignment: str, url: str | None, doing: str, students) -> None:
    """ValueError naming those of `students` whose grade is `not_current`, before `doing` hands it back."""
    stale = {s: why for s, why in not_current(course, assignment, url).items() if s in students}
    if stale:
        listed = "; ".join(f"{s}: {why}" for s, why in sorted(stale.items())[:5])
        more = f"; and {len(stale) - 5} more" if len(stale) > 5 else ""
        raise ValueError(f"not {doing}: {len(stale)} grade(s) of {assignment} are not current ({listed}{more}). "
                         f"Grade them first: python -m grader grade {assignment}"
                         + (f" --db-url {without_password(url)}" if url else ""))  # the gradebook read (walkthrough 47f, C1)


def export(course: Path, to: Path, url: str | None = None) -> list[tuple[str, str]]:
    """Every grade in the gradebook to the CSV file `to` (`nbgrader export`'s layout: one row per
    student and assignment), from the course's gradebook or the one at `url`; the (assignment,
    student) of each row never handed in (no submission in the gradebook). nbgrader writes 0.0
    there, the same as a graded 0; here its scores are left empty, which a spreadsheet or an LMS
    reads as no grade (walkthrough 3, issue 48)."""
    import csv

    from nbgrader.api import Gradebook
    with Gradebook(db_url(course, url)) as book:
        names = [a.name for a in book.assignments]
    for name in names:  # a re-submission's old grade is never exported as current (red team 45l, A02)
        try:
            refuse_not_current(course, name, url, "exported", set(scores(course, name, db_url(course, url))))
        except ValueError as error:
            raise RuntimeError(str(error)) from None
    nbgrader(course, "export", "--to", str(to), *([f"--CourseDirectory.db_url={url}"] if url else []))
    with Gradebook(db_url(course, url)) as book:
        handed_in = {(s.assignment.name, s.student.id) for a in book.assignments for s in a.submissions}
    with open(to, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    never = [(row["assignment"], row["student_id"]) for row in rows
             if (row["assignment"], row["student_id"]) not in handed_in]
    if never:
        with open(to, "w", newline="", encoding="utf-8") as f:
            out = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            out.writeheader()
            for row in rows:
                missing = (row["assignment"], row["student_id"]) not in handed_in
                out.writerow({**row, "raw_score": "", "score": ""} if missing else row)
    return never
