"""Collection: an LMS download (Canvas, Moodle) into submitted/, one notebook per student, the
latest. Never runs student code: it names and copies files.

    collect(course, assignment, lms, download)   # `python -m grader collect ASSIGNMENT --lms canvas --zip FILE`

which puts the download in downloaded/ASSIGNMENT/archive/ and runs, in the course directory,

    nbgrader zip_collect ASSIGNMENT --force --collector=grader.collectors.CanvasCollector
    nbgrader zip_collect ASSIGNMENT --force --collector=grader.collectors.MoodleCollector

(which an instructor may also run by hand, with the repository on PYTHONPATH; the collectors,
grader/collectors.py, are also found as grader.collect.CanvasCollector and ...MoodleCollector).

The names the two systems give a submitted file:

- Canvas: `doejane_123456_7890123_ex2_loss_scaling.ipynb` (the student's name as Canvas sorts it,
  lower-cased, then user id, the file's own id, the file's name), with `_late` after the name when
  handed in late, and the file's name suffixed `-1`, `-2`, ... when the student uploaded it again;
  the download holds each student's current submission, each of its files under its own id;
- Moodle: `Jane Doe_12345_assignsubmission_file_ex2_loss_scaling.ipynb`, or a folder
  `Jane Doe_12345_assignsubmission_file/` (Moodle 4.1 on; before it with a last `_`) holding the
  file ("download submissions in folders"),
  the file's name suffixed ` (1)`, ` (2)`, ... when uploaded again.

Only the download's own files are read: a notebook's owner is the name the LMS wrote at the top of
the download (Canvas: the file's name; Moodle: the submission's folder, or the file's name where
there is no folder), never a name a student chose inside it: a folder in a student's Moodle
folder, whatever its name, is theirs, its notebooks at most their candidates. An upload that is not
a notebook (an archive too: it is never opened, so no bomb, damaged file or traversal in it stops
the collection), a notebook inside a folder the LMS did not write, a notebook whose own name claims
another student, a name outside the download or too long to write, a file over NOTEBOOK_BYTES:
skipped, each named in the summary.

Each student's latest notebook (the download holds one submission a student, all their files
ranked together: one with work in it before one as handed out, then one named as the exercise,
then the highest suffix, then Canvas's higher file id) is collected as
submitted/<student>/ASSIGNMENT/ASSIGNMENT.ipynb, whatever the student named it (the assignment is
one notebook); the others are skipped with a note, so two files from one student do not stop the
collection. Student ids: the name and the LMS's own number for the person, Canvas's user id
(`doejane_123456`), Moodle's participant number (`jane_doe_12345`): two classmates named alike stay
two students (red team 45b, A03: keyed by Canvas's name alone, one Jane Doe's upload replaced the
other's); one longer than the gradebook holds (STUDENT_ID_CHARS, on SQLite as on
PostgreSQL) is shortened the same way on every run (`gradebook_id`) and named in the log
(`LONG ID`). Late hand-ins are named in the log (`LATE`); no grade depends on it.
"""
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import unicodedata
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from grader.course import BIN, ROOT
from grader.gradebook import STUDENT_ID_CHARS
from grader.notebooks import (AGAIN, LMS_FILE, NOTEBOOK_BYTES, as_handed_out, handed_out_among, read_notebook,
                              read_regular)
from grader.report import one_line, plural, printable, text_of

# The collectors nbgrader's zip_collect loads live in grader/collectors.py: they subclass nbgrader's
# plugin, whose import (about a second of CPU) only zip_collect's own process needs, not every
# `python -m grader collect` (issue 52). `--collector=grader.collect.CanvasCollector`, as the
# instructor guide gives it, still finds them here.
COLLECTORS = ("LatestNotebookCollector", "CanvasCollector", "MoodleCollector", "OneLineLog")


def __getattr__(name: str):
    if name in COLLECTORS:
        from grader import collectors
        return getattr(collectors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


CANVAS = re.compile(r"^(?P<person>[\w.\-]+?)(?P<late>_late)?_(?P<user>\d+)_(?P<file>\d+)_(?P<name>.+)$",
                    re.I)  # \w: a name may hold any letter (müllerjürgen)
ANONYMOUS = re.compile(r"^(late_)?anon_", re.I)  # Canvas's names with anonymous grading on
# Moodle 4.1 on names a student's folder `Jane Doe_12345_assignsubmission_file` (mod/assign's
# downloader); earlier releases, and its flat download's file names, end that part with `_`.
MOODLE = re.compile(r"^(?P<person>.+?)_(?P<user>\d+)_assign(?:submission|feedback)_[a-z]+(?:_(?P<name>.*))?$")
# Where the LMS's own fields may start in a name (Canvas: user and file ids; Moodle: the
# participant number): a name where they could start at two places reads as two students' uploads.
CANVAS_FIELDS = re.compile(r"(?=_\d+_\d+_.)")
MOODLE_FIELDS = re.compile(r"(?=_\d+_assign(?:submission|feedback)_[a-z]+(?:_|$))")


def ambiguous(name: str, fields: re.Pattern) -> bool:
    """Whether the LMS's fields could start at more than one place in `name`: a person's name or
    a file's name holding what looks like them (red team 45c, A01, A02: a Canvas name
    `doejane_123456_9999999_x`, or a Moodle name ending `_12345_assignsubmission_file_`, made
    the attacker's upload a classmate's latest one). Such a file is refused and named, never
    guessed."""
    return sum(1 for m in fields.finditer(name) if m.start() > 0) > 1


NAME_JOINERS = "\u200c\u200d"  # zero-width non-joiner and joiner: part of Persian and Indic names


def marks_as_letters(name: str) -> str:
    r"""`name` with each combining mark, joiner and connector other than `_` read as a letter, for
    matching: \w reads letters, not the marks that some scripts write as characters of their own
    (Devanagari's vowel signs, Arabic's shadda: red team 45j, A01, and 45k, A04, never collected),
    nor a Persian name's zero-width non-joiner or a fullwidth `＿` (45l, A03). The same length, so
    a match's spans hold for `name` itself."""
    return "".join("a" if unicodedata.category(c)[0] == "M" or c in NAME_JOINERS
                   or (unicodedata.category(c) == "Pc" and c != "_") else c for c in name)


# The most bytes of an id: it names folders (submitted/<id>, autograded/<id>, feedback/<id>), and a
# file system holds 255 bytes a name; lower-casing (`Ⱥ` -> `ⱥ`, 2 -> 3 bytes) and NFC (`क़`, one
# character, 3 -> 6 bytes) made a name under 255 bytes an id over it, and nbgrader's zip_collect
# stopped the whole class's collection (red team 45l, A01).
ID_BYTES = 200


def gradebook_id(lms_id: str) -> str:
    """`lms_id`, or, if the gradebook or a folder name cannot hold it, its start and a hash of the
    whole: the same id on every run and either database, and never one two students share."""
    if len(lms_id) <= STUDENT_ID_CHARS and len(lms_id.encode()) <= ID_BYTES:
        return lms_id
    digest = hashlib.sha256(lms_id.encode()).hexdigest()[:12]
    start = lms_id[:STUDENT_ID_CHARS - len(digest) - 1]
    while len(start.encode()) > ID_BYTES - len(digest) - 1:
        start = start[:-1]
    return f"{start}_{digest}"


def upload_number(name: str) -> int:
    match = AGAIN.search(Path(name).stem)
    return int(match.group(1) or match.group(2)) if match else 0


def canvas(relative: Path) -> dict | None:
    """Canvas names every file at the top of its download: a file in a folder is none of its. The id
    after the user's is the file's own (canvas-lms `ContentZipper`: `_#{attachment.id}_`), not the
    submission's: two files of one submission have two (red team 45i, A03: ranked as two
    submissions, the untouched release, uploaded second, beat the `Copy of ...` with the work). The
    download holds the current submission's files only, so they are one submission, ranked by the
    rules for one (`latest_uploads`), the file id last before the name."""
    name = unicodedata.normalize("NFC", relative.name)  # `u` and a combining mark, as macOS writes it, is `ü`
    if ANONYMOUS.match(name):  # no student in it: `anon_x7k2q_7890123_1_hw.ipynb` read as user 7890123 (45k, A01)
        return None
    match = CANVAS.match(marks_as_letters(name)) if len(relative.parts) == 1 else None
    if not match:
        return None
    match = {group: name[match.start(group):match.end(group)] if match[group] is not None else None
             for group in ("person", "late", "user", "file", "name")} | {"name_at": match.start("name")}
    # Canvas itself keeps only word characters; a name that starts with `-` or `.` (an option to a
    # command, a hidden folder) is read without them, as Moodle's is: the user id keeps it one student.
    student = f"{match['person'].lower().lstrip('.-')}_{match['user']}"
    if ambiguous(name, CANVAS_FIELDS):  # refused; its "owner", the first student it reads as, read as above
        return {"student_id": None, "ambiguous": relative.name, "owner": gradebook_id(student)}
    return {"student_id": gradebook_id(student), "lms_id": student, "late": bool(match["late"]),
            "order": (upload_number(match["name"]), int(match["file"])),
            "user": match["user"], "name": match["person"], "prefix": name[:match["name_at"]],
            "uploaded": match["name"]}


def moodle_student(match) -> str:
    """`jane_doe_12345`: Moodle's full name, lower-cased, with its letters, marks and digits in any
    script (`ana_garcía_5501004`, `иван_петров_5501007`; instructor walkthrough 47b, C3: every
    letter outside a-z was dropped), `-` kept, and every other character (a space, `/`, `,`, which
    nbgrader's lists of ids split at, `*`, `?`, `[`, which its paths glob, `.`, which hides a
    folder) a `_`; then the participant number. Written in Unicode's composed form (NFC), so that
    a download whose names are decomposed (`e` and a combining accent, as macOS writes them) gives
    the same id: the same student is the same id on every collect."""
    person = unicodedata.normalize("NFC", unicodedata.normalize("NFC", match["person"]).lower())
    kept = "".join(c if unicodedata.category(c)[0] in "LMN" or c in "-_" else "_" for c in person)
    return re.sub(r"_+", "_", kept).strip("_-") + f"_{match['user']}"


def moodle(relative: Path) -> dict | None:
    """Moodle's submission folder names the student ("download in folders"), else, at the top of
    the download, the file's own name. A file in a folder whose own name claims another student
    is refused: {"claims": that student}."""
    own = MOODLE.match(relative.name)
    if any(ambiguous(part, MOODLE_FIELDS) for part in relative.parts[:2]):  # refused; "owner": the first student read
        first = MOODLE.match(relative.parts[0])
        return {"student_id": None, "ambiguous": str(relative), "owner": first and gradebook_id(moodle_student(first))}
    if len(relative.parts) > 1:
        folder = MOODLE.match(relative.parts[0])
        if not folder or folder["name"]:
            return None
        owner, person = moodle_student(folder), folder
        if own and moodle_student(own) != owner:
            return {"student_id": gradebook_id(owner), "claims": moodle_student(own)}
    elif own and own["name"]:
        owner, person = moodle_student(own), own
    else:
        return None
    return {"student_id": gradebook_id(owner), "lms_id": owner, "late": False,
            "order": (upload_number(own["name"] if own else relative.name),),
            "user": person["user"], "name": person["person"],
            "uploaded": own["name"] if own and own["name"] else relative.name}


def in_submission(relative: Path) -> str:
    """A file of the download as a note names it: its path inside the student's Moodle folder (a
    notebook in a folder of theirs with it), else its name."""
    return PurePosixPath(*relative.parts[1:]).as_posix() if len(relative.parts) > 1 else relative.name


def own_name(relative: Path, assignment: str) -> bool:
    """Whether the notebook is named as the exercise (`ex1_precision_comparison.ipynb`, or with an
    upload number, `ex1_precision_comparison (2).ipynb`), whatever prefix the LMS put before it."""
    name = AGAIN.sub("", Path(relative.name).stem)
    return name == assignment or name.endswith("_" + assignment)


def latest_uploads(folder: Path, parse, assignment: str | None = None,
                   release: dict | None = None) -> dict[str, tuple[Path, dict]]:
    """{student: (their latest notebook's path relative to `folder`, what its name says)}: of all a
    student's notebooks in the download (one submission: the LMS downloads the current one), with
    the `release`, a notebook with work in it before one as handed out (red team 45g, A08: Colab's
    `Copy of ...` beside the untouched download under the exercise's name), then a notebook named
    as the exercise (`assignment`, by default the folder's: downloaded/<assignment>/extracted)
    before another (red team 45f, A11: a leftover `..._old.ipynb` sorted after the finished notebook
    and was graded), then the highest of `parse`'s "order" (the upload number, then Canvas's file id),
    then the name that sorts last. Names refused by `parse` count for no one. What the name says
    gains "handed_out": whether the notebook chosen is as handed out beside others."""
    assignment = assignment or folder.parent.name
    uploads = {}
    for path in folder.rglob("*.ipynb"):
        if path.is_dir():  # a folder named as a notebook (red team 23, A12): the notebooks in it count, not it
            continue
        relative = path.relative_to(folder)
        theirs = parse(relative)
        if theirs and "claims" not in theirs and "ambiguous" not in theirs:
            uploads.setdefault(theirs["student_id"], []).append((relative, theirs))
    best = {}
    for student, files in uploads.items():
        untouched = handed_out_among(folder, [r.as_posix() for r, _ in files], release)
        best[student] = max(((relative.as_posix() not in untouched, own_name(relative, assignment), *theirs["order"]),
                             relative.as_posix(),
                             {**theirs, "handed_out": relative.as_posix() in untouched}) for relative, theirs in files)
    return {student: (Path(relative), info) for student, (_, relative, info) in best.items()}


def handed_out(path: Path, release: dict | None) -> bool:
    """Whether the notebook at `path` is the `release` as handed out."""
    try:
        return release is not None and as_handed_out(read_regular(path), release)
    except (OSError, ValueError, RecursionError):
        return False


def release_of(course: Path, assignment: str) -> dict | None:
    """The course's release of `assignment` (exercises/<assignment>/<assignment>.ipynb), or None."""
    try:
        return read_notebook(course / "exercises" / assignment / f"{assignment}.ipynb")
    except (OSError, ValueError):
        return None


def members(download: Path):
    """(name, size, open, whether it is a link) of each file of the download, a zip or a folder (no
    link followed; a zip's link is a member whose Unix mode says so, its target its content)."""
    if download.is_dir():
        for path in sorted(download.rglob("*")):
            if path.is_symlink() or path.is_file():
                yield (path.relative_to(download).as_posix(), path.lstat().st_size, lambda path=path: path.open("rb"),
                       path.is_symlink())
        return
    with zipfile.ZipFile(download) as archive:
        for info in archive.infolist():
            if not info.is_dir():
                yield (utf8_name(info), info.file_size, lambda info=info: archive.open(info),
                       stat.S_ISLNK(info.external_attr >> 16))


def utf8_name(info: zipfile.ZipInfo) -> str:
    """The member's name, read as UTF-8 also where the zip does not flag it so: zipfile then reads
    it as CP437, and `müller` came out `m├╝ller`, a name no LMS pattern reads (red team 45k, A03).
    Bytes that are not UTF-8 keep zipfile's reading."""
    if info.flag_bits & 0x800:
        return info.filename
    try:
        return info.filename.encode("cp437").decode("utf-8")
    except UnicodeError:
        return info.filename


# The most notebooks, and bytes of them, read from one student's upload: each is written twice
# (archive/ and nbgrader's extracted/), so a 1 MB download of 20 compressible notebooks just
# under NOTEBOOK_BYTES wrote 2 GB (red team 45i, A08), linearly in their number. No honest
# submission holds more than a few notebooks of a few MB.
NOTEBOOKS_PER_STUDENT = 10
BYTES_PER_STUDENT = 2 * NOTEBOOK_BYTES
TOO_MANY = (f"one notebook too many: at most {NOTEBOOKS_PER_STUDENT} notebooks, {BYTES_PER_STUDENT // 2**20} MiB "
            "in all, are read from one student's upload")


def unpack(download: Path, into: Path, parse=None) -> dict[str, str]:
    """The download's notebooks copied under `into`, at the paths the LMS gave them, at most
    NOTEBOOKS_PER_STUDENT and BYTES_PER_STUDENT of one student's (whose: `parse`, the LMS's
    reading of a path; the names it refuses count for their owner, apart; a name it reads as no
    one's for its top folder). Returns {each file left out: why}: nothing in a student's upload can
    stop the others'."""
    skipped, read = {}, {}
    for name, size, opened, link in members(download):
        relative = PurePosixPath(name)
        why = ("its name points outside the download" if relative.is_absolute() or ".." in relative.parts
               else "a link" if link  # in a zip too: collected, its target's path was graded as a notebook (red team 32)
               else "not a notebook (an archive is never opened)" if relative.suffix != ".ipynb"
               else f"larger than {NOTEBOOK_BYTES // 2**20} MiB" if size > NOTEBOOK_BYTES else None)
        info = (parse(Path(name)) if parse and why is None else None) or {}
        # a refused name counts for its owner, apart from their notebooks, never with no one's (red team 16c, A01)
        whose = (info.get("student_id") or (info.get("owner") and (info["owner"], "refused"))
                 or (relative.parts[0] if len(relative.parts) > 1 else ""))
        count, total = read.get(whose, (0, 0))
        if why is None and (count >= NOTEBOOKS_PER_STUDENT or total + size > BYTES_PER_STUDENT):
            why = TOO_MANY
        if why is None:
            try:
                with opened() as source:
                    data = source.read(NOTEBOOK_BYTES + 1)  # a zip's stated size may lie
            except (zipfile.BadZipFile, zlib.error, EOFError) as error:  # this file only (red team 29, A3)
                skipped[name] = f"damaged in the download ({error}): download it again, or collect it by hand"
                continue
            read[whose] = (count + 1, total + len(data))
            if len(data) > NOTEBOOK_BYTES:
                why = f"larger than {NOTEBOOK_BYTES // 2**20} MiB"
            elif total + len(data) > BYTES_PER_STUDENT:
                why = TOO_MANY
            else:
                target = into.joinpath(*relative.parts)
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
                except OSError as error:  # a name longer than the file system holds
                    why = f"cannot be written here ({error.strerror}): rename it in the download"
        if why:
            skipped[name] = why
    return skipped


def collect(course: Path, assignment: str, lms: str, download: Path) -> None:
    """Put an LMS download's notebooks (from a zip, or a folder of files) in
    downloaded/<assignment>/archive/ (emptied first) and run `nbgrader zip_collect` with this
    module's collector for that LMS: each student's latest notebook lands in
    submitted/<student>/<assignment>/<assignment>.ipynb. Every file left out is named."""
    archive = course / "downloaded" / assignment / "archive"
    shutil.rmtree(archive, ignore_errors=True)
    archive.mkdir(parents=True)
    try:
        skipped = unpack(download, archive, {"canvas": canvas, "moodle": moodle}[lms])
    except (zipfile.BadZipFile, OSError) as error:
        sys.exit(f"python -m grader collect: cannot read the download {download}: {error}")
    collector = {"canvas": "CanvasCollector", "moodle": "MoodleCollector"}[lms]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([str(BIN / "nbgrader"), "zip_collect", assignment, "--force",
                             f"--collector=grader.collectors.{collector}"], cwd=course, env=env,
                            capture_output=True, text=True)
    log = result.stdout + result.stderr
    if result.returncode != 0:
        sys.exit(printable(f"nbgrader zip_collect failed:\n{log[-3000:]}"))
    parse = {"canvas": canvas, "moodle": moodle}[lms]

    def whose(name: str) -> str | None:
        info = parse(Path(name))
        return info.get("student_id") if info else None

    logged = [counted(line.split("] ", 1)[-1]) for line in log.split("\n")
              if line.split("] ", 1)[0].endswith("| WARNING")  # ours: never nbgrader's `Parsing file: <name>`
              and ("LATE:" in line or "LONG ID:" in line or "skipped" in line.lower())
              and "Skipped submission with no match information" not in line]  # nbgrader's, after each of ours
    print_notes([(whose(name), f"skipped {name}: {why}") for name, why in skipped.items()] +
                [(line.split(": skipped ", 1)[0] if ": skipped " in line and " " not in line.split(": skipped ", 1)[0]
                  else None, line) for line in logged])
    students = sorted(p.parent.name for p in (course / "submitted").glob(f"*/{assignment}"))
    print(one_line(f"{plural(len(students), 'submission')} of {assignment} in {course / 'submitted'}: {', '.join(students)}"))
    if lms == "canvas" and any(ANONYMOUS.match(p.name) for p in archive.glob("*.ipynb")):
        print(one_line("  ANONYMOUS: this download's names carry no student (Canvas's anonymous grading names files "
                       "anon_...): its notebooks cannot be matched to students here. Download again with anonymous "
                       "grading off (or after grades are posted), or put each notebook in "
                       f"submitted/<student>/{assignment}/{assignment}.ipynb by hand"))
    chosen = latest_uploads(archive, parse, release=release_of(course, assignment))
    remember(course, assignment, lms, {student: upload for student, upload in chosen.items() if student in students})
    print_same_user(course, assignment, lms)
    owners = {name: info.get("student_id") or info.get("owner") for name in skipped if (info := parse(Path(name)))}
    uploaders = set(owners.values()) - {None}
    # whose skipped files hold a notebook: one too large, or whose name the file system cannot hold
    # (red team 24, A03: told "none of them a notebook" for a Moodle name of 327 bytes)
    with_notebooks = {owner for name, owner in owners.items() if PurePosixPath(name).suffix == ".ipynb"}
    refused = refused_owners(archive, parse)
    for student in sorted(uploaders - set(students) - set(refused)):  # e.g. a notebook handed in zipped
        print(one_line(f"  NOT COLLECTED {student}: "
                       + ("their notebook(s) were skipped (see the skipped lines for why)" if student in with_notebooks
                          else "uploaded files, none of them a notebook (see the skipped lines)")
                       + ": ask them for the .ipynb, or put it in submitted/ by hand"))
    for student, files in sorted(refused.items()):
        if student not in students:
            print(one_line(f"  NOT COLLECTED {student}: their only notebook(s) were refused ({'; '.join(files)}): "
                            f"if one is theirs, put it in submitted/{student}/{assignment}/{assignment}.ipynb by hand"))
    for student in sorted((uploaders | set(refused)) & set(students) - set(chosen)):
        print(one_line(f"  NOT COLLECTED {student}: no notebook of theirs in this download was collected (see the "
                       "skipped lines); the submission collected earlier stays in submitted/, and is graded"))
    print_absent(course, assignment, sorted(set(students) - set(chosen) - uploaders - set(refused)))


def print_same_user(course: Path, assignment: str, lms: str) -> None:
    """Names the LMS users collected under two ids: a name the LMS changed between two downloads
    makes a new id beside the old one (red team 45i, A05). `export` and `pack-feedback` refuse them
    until one folder is moved out (grader/lms.py, `one_per_user`)."""
    students = json.loads((course / "downloaded" / assignment / LMS_FILE).read_text(encoding="utf-8"))["students"]
    ids: dict[str, list[str]] = {}
    for student, entry in sorted(students.items()):
        ids.setdefault(str(entry["user"]), []).append(student)
    for user, names in sorted(ids.items()):
        if len(names) > 1:
            print(one_line(f"  SAME USER: {lms} user {user} is {len(names)} students here, {', '.join(names)} (the LMS "
                           f"changed their name between downloads): keep the folder of the current submission and "
                           f"move the other out (mv submitted/<student>/{assignment} <elsewhere>) before grading; "
                           "export and pack-feedback refuse them until then"))


def print_absent(course: Path, assignment: str, absent: list[str]) -> None:
    """Names the students whose submission in submitted/ this download does not hold (instructor
    walkthrough 47b, C2: a Moodle download collected into a course that held a Canvas class's
    left the six Canvas students there, silently, to be graded and exported with the Moodle ones).
    Their folders stay: a collect never removes a submission (it may be one put there by hand)."""
    if not absent:
        return
    graded = [s for s in absent if (course / "autograded" / s / assignment).is_dir()]
    print(one_line(f"  NOT IN THIS DOWNLOAD: {plural(len(absent), 'student')} with a submission of {assignment} in "
                   f"submitted/ that this download does not hold (an earlier download's, or one put there by hand), "
                   f"kept, and graded and exported with the others: {', '.join(absent)}"))
    if graded:
        print(one_line(f"    {plural(len(graded), 'of them has', 'of them have')} a grade already: {', '.join(graded)}"))
    print(one_line(f"    If they left the course or belong to another class, move their folders out of the course before "
                   f"grading (mv submitted/<student>/{assignment} <elsewhere>), then collect again; to start over with "
                   "this download alone, see the instructor guide, \"Starting over\""))


NBGRADER_COUNTS = re.compile(r"^(\d+) files collected, (\d+) files skipped$")
COUNTS = re.compile(r"^\d+ files? collected, \d+ files? skipped$")  # the same, as `counted` writes it


def counted(line: str) -> str:
    """nbgrader's `6 files collected, 1 files skipped` as `6 files collected, 1 file skipped`."""
    match = NBGRADER_COUNTS.match(line)
    return f"{plural(int(match[1]), 'file')} collected, {plural(int(match[2]), 'file')} skipped" if match else line


NOTES_PER_STUDENT = 5  # the most lines printed about one student's skipped files; the rest counted
NOTES_UNOWNED = 10     # the most about files that read as no student's (red team 45i, A07: 3,000 such lines)
UNOWNED = "files that read as no student's"


def print_notes(notes: list[tuple[str | None, str]]) -> None:
    """Collection's notes, (student or None, line), one line each, at most NOTES_PER_STUDENT about
    one student (red team 45g, A10: one submission of 3,000 notebooks printed 6,000 lines, in which a
    classmate's LATE line was lost): the first few, then how many more."""
    about: dict[str, int] = {}
    for student, line in notes:
        if student is None and (line.startswith(("LATE:", "LONG ID:")) or COUNTS.match(line)):
            print(" ", one_line(line))  # about one student each, or the counts: never capped (red team 45k, A10)
            continue
        key = student or ""  # "": files that read as no student's
        about[key] = about.get(key, 0) + 1
        if about[key] <= (NOTES_PER_STUDENT if key else NOTES_UNOWNED):
            print(" ", one_line(line))
    for student, count in sorted(about.items()):
        shown = NOTES_PER_STUDENT if student else NOTES_UNOWNED
        if count > shown:
            print(" ", one_line(f"{student or UNOWNED}: {plural(count - shown, 'more file')} "
                                 f"skipped, not listed (the first {shown} are above)"))


def refused_owners(archive: Path, parse) -> dict[str, list[str]]:
    """{student: [why each notebook that reads as theirs was refused]}: a name that reads as more
    than one student's upload, under the first student it names (red team 45d, A11: Canvas's
    `smithann_1001_5001_hw_3_1_solution.ipynb` was skipped and its student left out of the summary), and a
    notebook in a student's folder named as a classmate's upload, under the folder's student."""
    owners = {}
    for path in sorted(archive.rglob("*.ipynb")):
        relative = path.relative_to(archive)
        info = parse(relative)
        if not info:
            continue
        if "claims" in info:
            owners.setdefault(info["student_id"], []).append(f"{relative.as_posix()}: named as {info['claims']}'s upload")
        elif info.get("owner"):  # read by `parse` as it reads a collected name's student (red team 16c, A02)
            owners.setdefault(info["owner"], []).append(f"{relative.as_posix()}: its name reads as more than one "
                                                        "student's upload")
    return owners


def sha256_of(path: Path) -> str | None:
    """The SHA-256 of the file at `path` as collected (grader/notebooks.py, `uploaded_as`), or None."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def remember(course: Path, assignment: str, lms: str, uploads: dict[str, tuple[Path, dict]]) -> None:
    """What the download's names tell of each student collected, for the way back (grader/lms.py:
    `export --lms`, `pack-feedback --lms`): the LMS's user id (Canvas) or participant number
    (Moodle), the name the LMS wrote, the collected file's name in the download and the name the
    student gave it (with the SHA-256 of the file, so that the report and the feedback page name it
    only while the notebook in submitted/ is that file: grader/notebooks.py, `uploaded_as`), and lateness
    (Canvas's `_late`; Moodle's download does not say). Names, never a student's file contents; the
    file's name is the student's own text (printed through `one_line`, shown on the page as inert
    text). Merged into the file of an earlier collection: a student collected again replaces their
    entry, and one whose folder is no longer in submitted/ (moved out) is forgotten."""
    path = course / "downloaded" / assignment / LMS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    students = {} if known.get("lms") != lms else known.get("students", {})
    here = {p.parent.name for p in (course / "submitted").glob(f"*/{assignment}")}
    students = {s: entry for s, entry in students.items() if s in here}  # a submission moved out: forgotten
    for student, (relative, info) in uploads.items():
        students[student] = {"lms_id": info["lms_id"], "user": info["user"], "name": text_of(info["name"]),
                             "file": relative.as_posix(), "late": info["late"], "uploaded": info["uploaded"],
                             "sha256": sha256_of(course / "downloaded" / assignment / "archive" / relative),
                             **({"prefix": info["prefix"]} if "prefix" in info else {})}
    kept = {"column": known["column"]} if known.get("lms") == lms and "column" in known else {}  # export --column
    write_json(path, {"lms": lms, "assignment": assignment, "students": students, **kept})


def write_json(path: Path, data) -> None:
    """`data` as UTF-8 JSON at `path` (whatever the locale: red team 45k, A07), replaced whole or not
    at all; a name that is not text (a folder download's file name in another encoding) is written
    escaped: it stopped the write half-way, and the empty file every later command (red team 45l, A04)."""
    try:
        text = json.dumps(data, indent=1, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(data, indent=1).encode("ascii")
    scratch = path.with_name(path.name + ".new")
    scratch.write_bytes(text)
    os.replace(scratch, path)
