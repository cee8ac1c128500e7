"""Back into the LMS: grades as the CSV file each system's grade import takes, and feedback pages
in the archive each system's bulk feedback upload takes. Never runs student code: it reads the
gradebook, the feedback pages and what collection remembered of the download's names
(downloaded/<assignment>/lms.json, grader/collect.py).

    export_grades(course, assignment, lms, to, url)   # `python -m grader export ASSIGNMENT --lms canvas|moodle`
    pack_feedback(course, assignment, lms, out)        # `python -m grader pack-feedback ASSIGNMENT --lms canvas|moodle`

Canvas (Grades > Import): a CSV whose rows Canvas matches by its user id, the `ID` column; its
identifying columns are `Student`, `ID`, `SIS User ID`, `SIS Login ID`, `Section`; every other
column is read as an assignment, matched by name (or `Name (assignment id)`) or created. Lateness has
no column there (Canvas keeps its own from the submission time): it is printed.
Canvas (the assignment's "Re-Upload Submissions"): a zip of files whose names keep the download's
prefix `name[_LATE]_userid_fileid_`; Canvas reads the first two all-digit parts of a name as the
user and the submitted file, and attaches the file to that submission as a comment.

Moodle (the assignment's "Upload grading worksheet", offline grading worksheet feedback enabled):
a CSV whose rows Moodle matches by `Identifier` (`Participant <number>`, the number of the download's
names), with the grade in `Grade` and `Last modified (grade)` (a row older than Moodle's own
grade is skipped unless "allow updating records modified more recently" is ticked). Other columns
(`Full name`, `Status`, ...) are not imported; Moodle's download does not say who was late (Moodle
shows it itself). Moodle (the assignment's "Upload
multiple feedback files in a zip", file feedback enabled): a folder per student named
`Full name_number_assignfeedback_file_`, holding the page.
"""
import csv
import json
import time
import zipfile
from pathlib import Path

from grader.collect import LMS_FILE, write_json
from grader.gradebook import db_url, refuse_not_current, scores
from grader.notebooks import grade_id, read_notebook
from grader.report import one_line, plural, text_of

CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_COLUMNS = ["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade",
                  "Grade can be changed", "Last modified (grade)"]
MOODLE_PARTICIPANT = "Participant "  # Moodle's string 'hiddenuser': "Participant " and the number


def collected(course: Path, assignment: str, lms: str) -> dict[str, dict]:
    """{student: what collection remembered}; ValueError if `assignment` was not collected from `lms`."""
    path = course / "downloaded" / assignment / LMS_FILE
    known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if known.get("lms") != lms:
        raise ValueError(f"{assignment} was not collected from {lms} in {course} (no {path.relative_to(course)} "
                         f"for {lms}): run `python -m grader collect {assignment} --lms {lms} --zip DOWNLOAD` first")
    return {s: {**entry, "name": text_of(entry["name"])} for s, entry in known["students"].items()}  # 16c, A03


def one_per_user(students: dict[str, dict], chosen, lms: str, assignment: str) -> None:
    """ValueError if two of the `chosen` students are one LMS user (red team 45i, A05: Canvas renamed
    a student between two downloads, the second collect made a new id beside the old one, and the
    export wrote two rows with one `ID`, the stale grade among them, with no word)."""
    ids: dict[str, list[str]] = {}
    for student in sorted(chosen):
        ids.setdefault(str(students[student]["user"]), []).append(student)
    twice = {user: names for user, names in ids.items() if len(names) > 1}
    if twice:
        user, names = next(iter(twice.items()))
        raise ValueError(one_line(
            f"{lms} user {user} is {len(names)} students here: {', '.join(names)} (the LMS changed their name "
            f"between downloads){f', and {len(twice) - 1} more users alike' if len(twice) > 1 else ''}. Keep the "
            f"folder of the current submission, move the other out of the course (mv submitted/<student>/{assignment} "
            "<elsewhere>), then collect, grade and export again"))


def maximum(course: Path, assignment: str) -> float:
    source = read_notebook(course / "solutions" / assignment / f"{assignment}.ipynb")
    return sum(float(c["metadata"]["nbgrader"]["points"]) for c in source["cells"]
               if grade_id(c) and c["metadata"]["nbgrader"].get("grade") and c["cell_type"] == "code")


def inert(text: str) -> str:
    """A student's name as a spreadsheet shows it and computes nothing from it: one beginning with
    `=`, `+`, `-`, `@`, a tab or a carriage return gets a leading `'` (red team 45f, A04: a Moodle
    full name `=SUM(1+41)` went into the worksheet as a formula). The LMS matches rows by id."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def number(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def export_grades(course: Path, assignment: str, lms: str, to: Path, url: str | None = None,
                  column: str | None = None) -> dict[str, float]:
    """The grades of `assignment` as `lms`'s grade import takes them, into `to`; {student: points}.
    `column` (Canvas): the assignment's column header, remembered for the next export (in
    downloaded/<assignment>/lms.json: a re-export after a regrade that forgot it made Canvas create a
    new column; instructor walkthrough 47b, K4); default the assignment's name."""
    students = collected(course, assignment, lms)
    refuse_not_current(course, assignment, url, "exported", students)
    known_path = course / "downloaded" / assignment / LMS_FILE
    known = json.loads(known_path.read_text(encoding="utf-8")) if known_path.is_file() else {}
    if column and lms == "canvas" and known and known.get("column") != column:
        write_json(known_path, {**known, "column": column})
    elif not column and lms == "canvas" and known.get("column"):
        column = str(known["column"])
        print(one_line(f"  column {column!r}, as the last export named it (--column to change it)"))
    graded = {s: sum(v for v in parts.values() if v is not None)
              for s, parts in scores(course, assignment, db_url(course, url)).items()}
    most = maximum(course, assignment)
    exported = {s: graded[s] for s in students if s in graded}
    one_per_user(students, exported, lms, assignment)
    with open(to, "w", newline="", encoding="utf-8") as f:
        rows = csv.writer(f)
        if lms == "canvas":
            rows.writerow(CANVAS_COLUMNS + [column or assignment])
            rows.writerow(["    Points Possible", "", "", "", "", number(most)])
            for student in sorted(exported):
                rows.writerow([inert(students[student]["name"]), students[student]["user"], "", "", "",
                               number(exported[student])])
        else:
            stamp = time.strftime("%A, %d %B %Y, %I:%M %p")  # as Moodle writes it; PHP's strtotime reads it
            rows.writerow(MOODLE_COLUMNS)
            for student in sorted(exported):
                rows.writerow([f"{MOODLE_PARTICIPANT}{students[student]['user']}", inert(students[student]["name"]), "", "",
                               number(exported[student]), number(most), "Yes", stamp])
    print(one_line(f"{plural(len(exported), 'grade')} of {assignment} for {lms} in {to}"))
    where = "Points" if lms == "canvas" else "Maximum grade"  # the import does not set it (walkthrough 47d, B)
    print(one_line(f"  points out of {number(most)}: give the {lms} assignment {number(most)} as its {where} "
                   "before the upload"))
    for student in sorted(set(students) - set(graded)):
        print(one_line(f"  NOT EXPORTED {student}: collected, but no grade in the gradebook (grade {assignment} first)"))
    for student in sorted(set(graded) - set(students)):
        print(one_line(f"  NOT EXPORTED {student}: graded, but not collected from {lms} (no {lms} id): enter by hand"))
    for student in sorted(s for s in exported if students[s]["late"]):
        print(one_line(f"  LATE: {student} handed in {assignment} late ({students[student]['file']})"))
    return exported


def upload_name(lms: str, assignment: str, entry: dict) -> str:
    """The page's name in the upload archive: Canvas's download prefix (user and file ids), or
    Moodle's feedback folder for the participant."""
    if lms == "canvas":
        return f"{entry['prefix']}{assignment}_feedback.html"
    return f"{entry['name']}_{entry['user']}_assignfeedback_file_/{assignment}_feedback.html"


def pack_feedback(course: Path, assignment: str, lms: str, out: Path, url: str | None = None,
                  only: list[str] | None = None) -> Path:
    """Each collected student's feedback page in OUT/<assignment>-feedback-<lms>.zip, named for
    `lms`'s bulk feedback upload; with `only`, those students' pages alone (a re-submission's new
    page, without the class's pages again), in OUT/<assignment>-feedback-<lms>-some.zip (the class's
    zip kept). Names the students collected who have no page."""
    from grader.feedback import NO_PAGE, chosen, some_zip
    students = chosen(collected(course, assignment, lms), only, assignment)
    refuse_not_current(course, assignment, url, "packed", students)
    one_per_user(students, students, lms, assignment)
    out.mkdir(parents=True, exist_ok=True)
    archive, packed, missing = out / f"{assignment}-feedback-{lms}{some_zip(only)}.zip", 0, []
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for student, entry in sorted(students.items()):
            page = course / "feedback" / student / assignment / f"{assignment}.html"
            if not page.is_file() or any(p.is_symlink() for p in (page, page.parent, page.parent.parent)):
                missing.append(student)
                continue
            zipped.write(page, upload_name(lms, assignment, entry))
            packed += 1
    print(one_line(f"{plural(packed, 'feedback page')} of {assignment} for {lms} in {archive}"))
    for student in missing:
        print(one_line(NO_PAGE.format(student=student, assignment=assignment)))
    return archive
