"""What the instructor reads after a grading run: the scores per part, and the report (who was not
graded and why, notes, failure messages, answers to read by hand). Never runs student code: it
prints data the grader collected.

    print_table(assignment, graded, points)    # graded: {student: {test cell: points}}
    print_report(report, messages=True)        # report: grader.schedule.Report
"""


def print_table(assignment: str, graded: dict[str, dict[str, float]], points: dict[str, float]) -> None:
    print(f"\n{assignment}  (max {sum(points.values()):g})")
    print(f"{'student':26}" + "".join(f"{gid:>10}" for gid in points) + f"{'total':>8}")
    for student, by_cell in sorted(graded.items()):
        cells = "".join(f"{by_cell.get(gid, 0):>10g}" for gid in points)
        print(f"{student:26}{cells}{sum(by_cell.values()):>8g}")


def print_report(report, messages: bool = True) -> None:
    """What the instructor must read: who was not graded, notes, per student and part the failure
    message (as the runner gave it: never shown to students as is) and answers to read by hand."""
    for student, why in sorted(report.not_graded.items()):
        fate = "no grade written: the next run grades them" if student in report.unwritten else "recorded as 0"
        print(f"  NOT GRADED {student}: {why} ({fate})")
    for student, note in sorted(report.notes.items()):
        print(f"  note on {student}: {note}")
    for student, failed in sorted(report.messages.items()) if messages else ():
        for test, message in failed.items():
            print(f"  {student} {test} failed: {' '.join(str(message).split())[:300]}")
    for student, parts in sorted(report.flags.items()):
        for part, why in parts.items():
            print(f"  READ {student} {part}: its answer {', '.join(why)}")
