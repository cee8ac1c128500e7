"""One step's lines for the GPU session's summary.txt (tools/gpu_session.sh).

    python tools/gpu_summary.py junit STEP RC SECONDS FILE.xml [FILE.xml ...]
    python tools/gpu_summary.py bench STEP RC SECONDS REPORT_DIR
    python tools/gpu_summary.py kernel-died FILE.xml

``junit``: passed / skipped / failed counts from pytest's JUnit XML, the skip reasons grouped
with their counts, and the failed tests by name. ``bench``: which steps of report.json ran and
which were skipped, and why. A missing file (a step killed at its time limit writes none) is
said so, never counted as a pass. ``kernel-died``: the notebooks (book/NAME.ipynb) whose every
failure is a kernel that died or never answered as it started, one a line. Standard library only: it runs before anything is installed.
"""
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def junit_lines(files) -> list[str]:
    counts, reasons, failed, missing = Counter(), Counter(), [], []
    for name in files:
        if not Path(name).is_file():
            missing.append(name)
            continue
        for case in ET.parse(name).getroot().iter("testcase"):
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            outcome = next((child for child in case
                            if child.tag in ("failure", "error", "skipped")), None)
            if outcome is None:
                counts["passed"] += 1
            elif outcome.tag == "skipped":
                counts["skipped"] += 1
                reasons[(outcome.get("message") or "").strip()[:160]] += 1
            else:
                counts["failed"] += 1
                failed.append(f"{test}: {(outcome.get('message') or '').strip()[:160]}")
    lines = [f"  passed {counts['passed']}, skipped {counts['skipped']}, failed {counts['failed']}"]
    lines += [f"  skipped x{n}: {reason}" for reason, n in reasons.most_common()]
    lines += [f"  FAILED {line}" for line in failed]
    lines += [f"  no result file {name} (the step was stopped or crashed before writing it)"
              for name in missing]
    return lines


def bench_lines(folder) -> list[str]:
    reports = sorted(Path(folder).glob("*/report.json")) + sorted(Path(folder).glob("report.json"))
    if not reports:
        return [f"  no report.json under {folder} (the step was stopped or crashed)"]
    report = json.loads(reports[-1].read_text())
    ran, skipped = [], []
    steps = {f"matmul {p}": v for p, v in report["matmul"].items()}
    steps.update({k: report[k] for k in ("bandwidth", "alignment", "transformer_block", "do_bench")})
    for step, value in steps.items():
        (skipped if "skipped" in value else ran).append(step)
    lines = [f"  report {reports[-1].parent.name}: {report['device']['name']}, torch "
             f"{report['software']['torch']}, {report['seconds']:.0f} s; ran {len(ran)}, "
             f"skipped {len(skipped)}"]
    lines += [f"  skipped {step}: {steps[step]['skipped'][:160]}" for step in skipped]
    for precision, entry in report["matmul"].items():
        if "skipped" not in entry:
            peak = entry["percent_of_peak"]
            lines.append(f"  {precision}: {entry['best']['tflops']:.4g} TFLOP/s"
                         + ("" if peak is None else f" ({peak:.0f}% of {entry['peak_tflops']:g})"))
    return lines


KERNEL_START = ("Kernel died before replying", "Kernel didn't respond", "Failure starting kernel")


def kernel_died(name) -> list[str]:
    """Notebooks whose every failure is a kernel start, not a cell."""
    started, other = set(), set()
    if not Path(name).is_file():
        return []
    for case in ET.parse(name).getroot().iter("testcase"):
        outcome = next((c for c in case if c.tag in ("failure", "error")), None)
        if outcome is not None:
            text = (outcome.get("message") or "") + (outcome.text or "")
            died = any(marker in text for marker in KERNEL_START)
            (started if died else other).add(case.get("classname", ""))
    return [f"book/{c.removeprefix('book.')}" for c in sorted(started - other) if c.endswith(".ipynb")]


def main(argv) -> int:
    if argv[:1] == ["kernel-died"]:
        print("\n".join(kernel_died(argv[1])))
        return 0
    kind, step, rc, seconds, *files = argv
    status = "ok" if rc == "0" else ("TIMED OUT" if rc in ("124", "137") else f"exit {rc}")
    print(f"{step}: {status}, {float(seconds):.0f} s")
    print("\n".join(junit_lines(files) if kind == "junit" else bench_lines(files[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
