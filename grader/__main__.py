"""The grader's command line. Never runs student code in this process: `grade`, `check` and `demo`
run every submission in sandboxes (grader/runs.py).

    python -m grader collect ASSIGNMENT --lms canvas|moodle --zip FILE [--course DIR]
                                      # an LMS download into submitted/ (nbgrader zip_collect)
    python -m grader grade ASSIGNMENT ... [--course DIR] [--no-sandbox] [--jobs N] [--student ID ...]
            [--regrade] [--no-feedback] [--shard K/N] [--db-url URL] [--timeout S]
                                      # grade a real course (grader/schedule.py), then feedback
    python -m grader results ASSIGNMENT ... [--course DIR] [--db-url URL]
                                      # the whole class's scores per part and report, from the
                                      # gradebook (after shards too: grader/results.py)
    python -m grader prepare ASSIGNMENT ... [--course DIR] [--db-url URL]
                                      # once, before `grade --shard K/N` on several machines
    python -m grader pack-feedback ASSIGNMENT ... [--course DIR] [--out DIR] [--lms canvas|moodle] [--db-url URL]
                                      # each student's feedback page; with --lms, in the zip that
                                      # LMS's bulk feedback upload takes (grader/lms.py)
    python -m grader export [--course DIR] [--db-url URL] [--to grades.csv]
                                      # every grade, one CSV row per student and assignment
    python -m grader export ASSIGNMENT --lms canvas|moodle [--to FILE] [--column NAME] [--db-url URL]
                                      # the CSV that LMS's grade import takes (grader/lms.py)
    python -m grader set-aside ASSIGNMENT --to DIR [--course DIR]
                                      # start over: what collecting and grading it wrote, moved to DIR
    python -m grader release          # `make exercises`: regenerate exercises/ from solutions/
    python -m grader check [ASSIGNMENT ...]
                                      # grade fabricated submissions, print per-part scores
    python -m grader demo [--out grade-demo]
                                      # `make grade-demo`: a whole grading session

Run it from the repository root (the package is not installed: `mpcourse` is what students get).
Every command runs the real `nbgrader` command line in a course directory: `--course` (default:
the current folder) for collect, grade, results, prepare, pack-feedback and export; the repository root for
`release`; a scratch copy of it for `check` and `demo`.
"""
import argparse
import os
import sys
import warnings
from pathlib import Path

from grader import course, gradebook, schedule
from grader.report import one_line, plural, print_report, print_table

COMMANDS = ["collect", "grade", "results", "prepare", "pack-feedback", "export", "set-aside", "release", "check", "demo"]


def grade_course(folder: Path, assignment: str, timeout: int, sandbox: bool, **options) -> None:
    """Grade a real course's submissions (the instructor guide's command), then write feedback for
    the students graded (`options`: schedule.grade()'s: workers, students, regrade, feedback, shard, url)."""
    from grader.fabricate import test_points
    from grader.feedback import feedback_for
    report = schedule.grade(folder, assignment, timeout=timeout, sandbox=sandbox, progress=True, **options)
    graded = sorted(set(report.scores) - report.unwritten)
    pageless = feedback_for(folder, assignment, graded, options.get("url")) if report.feedback and graded else {}
    if report.scores:
        print_table(assignment, report.scores, test_points(assignment))
    print_report(report)
    for student, why in sorted(pageless.items()):
        print(one_line(f"  NO FEEDBACK PAGE for {student} (their grade is written): {why}"))
    if not report.feedback and graded:
        print(f"  feedback NOT rebuilt (--no-feedback): the earlier pages of the students graded were removed from "
              f"{folder / 'feedback'} (they showed an earlier grade), so pack-feedback names them NO FEEDBACK; grade "
              "them again without --no-feedback (--regrade) to make new ones")
    elif graded:
        print(f"  feedback in {folder / 'feedback'}/<student>/{assignment}/")


def prepare(folder: Path, assignment: str, url: str | None) -> None:
    """Before shards start: the gradebook's schema, the assignment and its students, once."""
    students = gradebook.prepare(folder, assignment, url)
    print(f"{assignment} and {plural(len(students), 'student')} in {gradebook.without_password(gradebook.db_url(folder, url))}: "
          f"start the shards (python -m grader grade {assignment} --shard K/N ...)")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("assignments", nargs="*")
    parser.add_argument("--out", type=Path, default=None,
                        help="demo: the folder (grade-demo); pack-feedback: where the pages go (feedback-upload)")
    parser.add_argument("--course", type=Path, default=Path.cwd(), help="the course directory (default: here)")
    parser.add_argument("--lms", choices=["canvas", "moodle"],
                        help="collect: where the download comes from; export, pack-feedback: the LMS to go back to")
    parser.add_argument("--column", default=None,
                        help="export --lms canvas: the assignment's column in Canvas (default: the assignment's name)")
    parser.add_argument("--zip", type=Path, help="collect: the LMS download (a zip, or a folder of files)")
    parser.add_argument("--to", type=Path, default=None,
                        help="export: the CSV file (grades.csv in the course); set-aside: the folder to move to")
    parser.add_argument("--timeout", type=int, default=60, help="grade: seconds per cell and per part")
    parser.add_argument("--jobs", type=int, default=None,
                        help="grade: students at a time (default: one per core, as many as memory holds at "
                             f"{schedule.JOB_MEMORY // 2**30} GiB each; here {schedule.default_jobs()})")
    parser.add_argument("--student", action="append", default=None, metavar="ID",
                        help="grade, pack-feedback: only this student (repeat for several)")
    parser.add_argument("--regrade", action="store_true",
                        help="grade: the students who already have a grade too (otherwise a rerun grades only the others)")
    parser.add_argument("--no-feedback", action="store_true",
                        help="grade: skip the notebook run for the feedback (grades only, quick); the earlier "
                             "feedback pages of the students graded are removed")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="grade: this machine's share of N (the students whose int(sha256(id), 16) %% N == K-1), "
                             "into a shared gradebook that `prepare` made")
    parser.add_argument("--db-url", default=None,
                        help="grade, results, prepare, export: the gradebook (e.g. postgresql+psycopg://grader@host/course); "
                             "default: the course's c.CourseDirectory.db_url, else its gradebook.db")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="grade without bubblewrap: DANGEROUS, a submission can then change other "
                             "students' work and the gradebook")
    return parser


def for_each(cli, args, action, refused=(ValueError,)) -> None:
    """`action(name)` for each assignment named; an error of `refused`, or a gradebook that cannot be
    reached, ends the command in one sentence, not a traceback."""
    from sqlalchemy.exc import OperationalError
    for name in args.assignments or cli.error(f"{args.command}: name the assignments"):
        try:
            action(name)
        except refused as error:
            sys.exit(f"python -m grader {args.command} {name}: {error}")
        except OperationalError as error:
            sys.exit(f"python -m grader {args.command} {name}: the gradebook cannot be reached: {error.orig}")


def main(argv: list[str] | None = None) -> None:
    # A warning of ours (no grading secret, ...) is one line for the instructor, not Python's
    # file:line and source line, which read as a crash (issue 48, third walkthrough).
    warnings.formatwarning = lambda message, category, *where, **more: f"WARNING: {message}\n"
    cli = parser()
    args = cli.parse_args(argv)
    from sqlalchemy.exc import OperationalError
    if args.jobs is not None and args.jobs < 1:
        cli.error("--jobs: at least 1")
    if args.command == "release":
        course.release()
    elif args.command == "check":
        from grader import rehearsal
        rehearsal.check(args.assignments or course.assignments(), Path(os.environ.get("TMPDIR", "/tmp")) / "mpcourse-check")
    elif args.command == "grade":
        try:
            shard = schedule.parse_shard(args.shard) if args.shard else None
        except ValueError as error:
            cli.error(str(error))
        for_each(cli, args, lambda name: grade_course(
            args.course.resolve(), name, args.timeout, not args.no_sandbox, workers=args.jobs, students=args.student,
            regrade=args.regrade, feedback=not args.no_feedback, shard=shard, url=args.db_url),
            refused=(schedule.NoSandbox, schedule.BrokenEnvironment, gradebook.SecretError, schedule.NotPrepared,
                     ValueError))
    elif args.command == "results":
        from grader.results import print_results
        for_each(cli, args, lambda name: print_results(args.course.resolve(), name, args.db_url))
    elif args.command == "prepare":
        for_each(cli, args, lambda name: prepare(args.course.resolve(), name, args.db_url))
    elif args.command == "collect":
        if not (args.lms and args.zip and len(args.assignments) == 1):
            cli.error("collect: one assignment, --lms canvas|moodle and --zip FILE")
        from grader.collect import collect
        collect(args.course.resolve(), args.assignments[0], args.lms, args.zip.resolve())
    elif args.command == "pack-feedback":
        from grader import lms
        from grader.feedback import pack_feedback
        out = (args.out or args.course / "feedback-upload").resolve()
        for_each(cli, args, lambda name: lms.pack_feedback(args.course.resolve(), name, args.lms, out, args.db_url,
                                                           args.student) if args.lms
                 else pack_feedback(args.course.resolve(), name, out, args.db_url, args.student))
    elif args.command == "export" and args.lms:
        from grader import lms
        if len(args.assignments) != 1:
            cli.error("export --lms: one assignment (each LMS imports one assignment's grades at a time)")
        name, folder = args.assignments[0], args.course.resolve()
        try:
            lms.export_grades(folder, name, args.lms, (args.to or folder / f"grades-{name}-{args.lms}.csv").resolve(),
                              args.db_url, args.column)
        except ValueError as error:
            sys.exit(f"python -m grader export {name}: {error}")
        except OperationalError as error:
            sys.exit(f"python -m grader export {name}: the gradebook cannot be reached: {error.orig}")
    elif args.command == "export":
        folder = args.course.resolve()
        to = (args.to or folder / "grades.csv").resolve()
        try:
            never = gradebook.export(folder, to, args.db_url)
        except RuntimeError as error:
            sys.exit(f"python -m grader export: {error}")
        print(f"grades of every assignment and student in {to}")
        if never:
            print(f"  {plural(len(never), 'row')} left without a score: assignments never handed in or not graded yet, "
                  f"e.g. {never[0][0]} of {never[0][1]}")
    elif args.command == "set-aside":
        if not (args.to and len(args.assignments) == 1):
            cli.error("set-aside: one assignment and --to DIR (a new folder)")
        name = args.assignments[0]
        try:
            moved = course.set_aside(args.course, name, args.to)
        except (ValueError, OSError) as error:
            sys.exit(f"python -m grader set-aside {name}: {error}")
        print(f"{plural(len(moved), 'path')} of {name} moved to {args.to.resolve()}. Its grades are still in the "
              f"gradebook: remove them (the next grade registers it again) with\n"
              f"  nbgrader db assignment remove {name} --force")
    else:
        from grader import rehearsal
        rehearsal.demo(args.out or course.ROOT / "grade-demo")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C: what was written stays written, and the command said so
        sys.exit(130)
