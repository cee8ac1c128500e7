"""The GPU half, checked on the CPU: the kit covers what the GPU run imports, the session script's
steps and limits fit the GPU window, report.json is internally consistent, and the chapters'
GPU recording mechanism writes and reads what it says (in a temporary folder)."""
import ast
import dataclasses
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from packaging.utils import canonicalize_name

from mpcourse.bench import check_report, run_suite, write_report
from mpcourse.bench.report import default_report_dir
from mpcourse.gpu_record import NOT_YET, SCHEMA, beside, committed, committed_reports, load_record, recorder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gpu_kit_check  # noqa: E402
import gpu_summary  # noqa: E402

SCRIPT = ROOT / "tools" / "gpu_session.sh"
OPTIONAL = {"torchao": "imported under try/except or pytest.importorskip"}


def _settings() -> dict[str, str]:
    """The script's NAME=value lines (limits, lists), unquoted."""
    found = re.findall(r'^([A-Z_0-9]+)=("[^"]*"|\S+)', SCRIPT.read_text(), re.MULTILINE)
    return {name: value.strip('"') for name, value in found}


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level modules imported by what the GPU run executes: the library, the tests it runs,
    every book notebook's code cells, and the summary tool. {module: files}."""
    skip = set(_settings()["SKIP_TESTS"].split())
    sources = [(p, p.read_text()) for p in (ROOT / "mpcourse").rglob("*.py")]
    sources += [(p, p.read_text()) for p in (ROOT / "tests").glob("*.py") if p.name not in skip]
    sources += [(ROOT / "tools" / "gpu_summary.py", (ROOT / "tools" / "gpu_summary.py").read_text())]
    for notebook in (ROOT / "book").glob("*.ipynb"):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] == "code":
                code = "".join(cell["source"])
                code = re.sub(r"^(\s*)[%!].*$", r"\1pass", code, flags=re.MULTILINE)  # magics
                sources.append((notebook, code))
    local = {p.stem for p in ROOT.iterdir()} | {p.stem for p in (ROOT / "tools").glob("*.py")} | {
        p.stem for p in (ROOT / "tests").glob("*.py")}  # a test module importing another's helpers
    modules: dict[str, set[str]] = {}
    for path, code in sources:
        for node in ast.walk(ast.parse(code)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in local:
                    modules.setdefault(top, set()).add(path.name)
    return modules


def test_the_kit_and_the_image_cover_every_module_the_gpu_run_imports():
    available = set(gpu_kit_check.read_list(gpu_kit_check.IMAGE)) | \
        set(gpu_kit_check.read_list(gpu_kit_check.KIT))
    distributions = metadata.packages_distributions()
    uncovered = []
    for module, files in sorted(_third_party_imports().items()):
        if module in OPTIONAL:
            continue
        if module not in distributions:  # not installed here: the image must have it by name
            if canonicalize_name(module) in available:
                continue
            uncovered.append(f"{module} (imported by {sorted(files)}) is not installed here")
            continue
        names = {canonicalize_name(d) for d in distributions[module]}
        if not names & available:
            uncovered.append(f"{module} ({sorted(names)}, imported by {sorted(files)[:3]}) is "
                             "in neither tools/gpu-kit.txt nor the image's list")
    assert not uncovered, "\n".join(uncovered)
    # The run itself needs these, beyond what the code imports.
    for needed in ("nbval", "ipykernel", "pytest-xdist", "torch", "triton"):
        assert canonicalize_name(needed) in available, needed


def test_the_kit_pins_what_the_tests_run_with_and_meets_its_own_requirements():
    kit, image = gpu_kit_check.read_list(gpu_kit_check.KIT), gpu_kit_check.read_list(gpu_kit_check.IMAGE)
    assert "torch" not in kit and not set(kit) & set(image), "the kit repeats the image"
    assert all(version for version in kit.values()), "every kit package is pinned"
    installed = {name: metadata.version(name) for name in kit}
    assert installed == kit, "tools/gpu-kit.txt differs from the versions installed here"
    requires = {name: list(metadata.requires(name) or []) for name in kit}
    for python in ("3.11", "3.12"):
        assert gpu_kit_check.unmet(requires, {**image, **kit}, python) == []


def test_unmet_requirements_are_found():
    requires = {"a": ["b>=2", "c; python_version < '3.0'", "d"]}
    problems = gpu_kit_check.unmet(requires, {"b": "1.0"}, "3.12")
    assert len(problems) == 2 and "b is 1.0" in problems[0] and "d" in problems[1]
    assert gpu_kit_check.unmet(requires, {"b": None, "d": "1"}, "3.12") == []


def test_the_session_script_parses_and_its_limits_fit_the_gpu_window():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    settings = _settings()
    limits = {name: int(settings[name]) for name in
              ("LIMIT_SETUP", "LIMIT_TESTS", "LIMIT_NOTEBOOKS", "LIMIT_ALONE", "LIMIT_BENCH",
               "BENCH_BUDGET_S", "TOTAL_LIMIT")}
    steps = sum(v for k, v in limits.items() if k.startswith("LIMIT_"))
    assert steps <= limits["TOTAL_LIMIT"] <= 9 * 60, limits
    assert 0 < limits["BENCH_BUDGET_S"] < limits["LIMIT_BENCH"]
    for name in settings["SKIP_TESTS"].split():
        assert (ROOT / "tests" / name).is_file(), name
    for key in ("TIMING_NOTEBOOKS", "QUICK_NOTEBOOKS", "QUICK_ALONE"):
        for stem in settings[key].split():
            assert (ROOT / "book" / f"{stem}.ipynb").is_file(), (key, stem)
    for path in settings["QUICK_TESTS"].split():
        assert (ROOT / path).is_file(), path
    text = SCRIPT.read_text()
    packed = set(re.findall(r"^\s*pack (\S+)", text, re.MULTILINE))
    outputs = packed | {"summary.txt", "results.tar.gz"}
    assert len(outputs) <= 6, outputs
    for step in ("1-tests.log", "2-notebooks.log", "3-alone.log", "4-bench.log"):
        assert step in packed
        assert f"run_step {step}" in text
    assert "MPCOURSE_RECORD_GPU=" in text and "--budget-s" in text
    assert "--no-index --no-deps" in text and "--target" in text


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    results = run_suite("cpu", quick=True, progress=False)
    folder = tmp_path_factory.mktemp("report")
    write_report(results, folder)
    return results, folder


def test_report_json_is_consistent_and_documents_the_run(report_dir):
    results, folder = report_dir
    report = json.loads((folder / "report.json").read_text())
    check_report(report, folder=folder)
    assert report["schema"] == 1 and report["software"]["torch"] == torch.__version__
    assert report["device"]["slug"] == default_report_dir(results).name.rsplit("-", 3)[0]
    assert report["figures"] and all((folder / f).is_file() for f in report["figures"])
    best = report["matmul"]["fp32"]["best"]
    assert best["tflops"] == pytest.approx(results.matmul["fp32"].tflops)
    assert "needs a CUDA GPU" in report["do_bench"]["skipped"]
    assert report["clocks"] is None  # a CPU run


@pytest.mark.parametrize("tamper, message", [
    (lambda r: r["matmul"]["fp32"]["shapes"][0].update(tflops=r["matmul"]["fp32"]["shapes"][0]["tflops"] * 1.5), "shapes[0].tflops"),
    (lambda r: r["matmul"]["fp32"]["best"].update(tflops=1e9), "best.tflops"),
    (lambda r: r["bandwidth"].update(gbs=r["bandwidth"]["gbs"] * 2), "bandwidth.gbs"),
    (lambda r: r["transformer_block"]["rows"][2].update(step_speedup=99.0), "step_speedup"),
    (lambda r: r["alignment"]["rows"][0].update(aligned=not r["alignment"]["rows"][0]["aligned"]), "aligned"),
    (lambda r: r["device"].update(slug="other"), "slug"),
    (lambda r: r.update(schema=2), "schema"),
    (lambda r: r.pop("datasheet"), "missing"),
    (lambda r: r["figures"].append("absent.png"), "absent.png"),
])
def test_check_report_names_what_is_inconsistent(report_dir, tamper, message):
    _, folder = report_dir
    report = json.loads((folder / "report.json").read_text())
    tamper(report)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_report(report, folder=folder)


def test_a_budget_skips_steps_with_the_reason_and_the_report_still_checks(tmp_path):
    results = run_suite("cpu", quick=True, progress=False, budget_s=1e-9)
    assert all("budget was spent" in reason for reason in results.matmul.values())
    write_report(results, tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    check_report(report, folder=tmp_path)
    assert report["figures"] == [] and "budget" in report["transformer_block"]["skipped"]
    lines = gpu_summary.bench_lines(tmp_path)
    assert "ran 0, skipped 9" in lines[0]
    with pytest.raises(ValueError, match="budget_s"):
        run_suite("cpu", quick=True, progress=False, budget_s=0)


def test_committed_reports_are_read_and_checked(report_dir, tmp_path):
    _, folder = report_dir
    (tmp_path / "cpu-2026-01-01").mkdir()
    (tmp_path / "cpu-2026-01-01" / "report.json").write_text((folder / "report.json").read_text())
    assert [r["schema"] for r in committed_reports(tmp_path)] == [1]
    bad = json.loads((folder / "report.json").read_text())
    bad["bandwidth"]["gbs"] = -1.0
    (tmp_path / "cpu-2026-01-01" / "report.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="bandwidth.gbs"):
        committed_reports(tmp_path)


def test_every_committed_report_and_record_is_consistent():
    for report in committed_reports():  # mpcourse/data/bench: none until a GPU run is committed
        assert report["schema"] == 1
    for path in (ROOT / "mpcourse" / "data" / "gpu").glob("*/*.json"):
        assert load_record(path).notebook == path.stem
        assert (ROOT / "book" / f"{path.stem}.ipynb").is_file(), path  # a record of a page that exists


def test_the_appendix_shows_every_committed_report():
    appendix = (ROOT / "book" / "gpu_reports.md").read_text()
    included = set(re.findall(r"```\{include\} \.\./mpcourse/data/bench/([^/\s]+)/report\.md", appendix))
    committed_folders = {p.parent.name for p in (ROOT / "mpcourse" / "data" / "bench").glob("*/report.md")}
    assert included == committed_folders


def test_a_recorder_writes_named_numbers_and_tables_with_their_provenance(tmp_path):
    rec = recorder("05_bf16_and_tf32", "cpu", folder=tmp_path)
    assert rec.active
    rec.number("speedup", torch.tensor(2.5), note="fwd+bwd")
    rec.number("overflow", float("inf"))
    rec.number("grid", torch.tensor([[1.0, float("nan")]]))
    rec.number("numpy", np.float16(0.5))
    rec.table("autocast", [("matmul", torch.float16), ("softmax", torch.float32)], ["op", "dtype"])
    rec.number("speedup", 3.0)  # a second write replaces the first
    files = list(tmp_path.glob("*/05_bf16_and_tf32.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["schema"] == SCHEMA and data["torch"] == torch.__version__
    assert data["device"]["slug"] == files[0].parent.name and data["date"]
    (run,) = committed("05_bf16_and_tf32", root=tmp_path)
    assert run.get("speedup") == 3.0 and run.get("overflow") == "inf"
    assert run.get("grid") == [[1.0, "nan"]] and run.get("numpy") == 0.5
    assert run.get("autocast") == (["op", "dtype"], [["matmul", "torch.float16"],
                                                     ["softmax", "torch.float32"]])
    assert torch.__version__ in run.label and run.device in run.label
    with pytest.raises(KeyError, match="records no 'absent'"):
        run.get("absent")
    with pytest.raises(ValueError, match="one per header"):
        rec.table("bad", [(1, 2, 3)], ["a", "b"])


def test_nothing_is_recorded_unless_asked_for_on_a_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("MPCOURSE_RECORD_GPU", raising=False)
    assert not recorder("01_floating_point").active
    monkeypatch.setenv("MPCOURSE_RECORD_GPU", str(tmp_path))
    rec = recorder("01_floating_point")
    assert rec.active == torch.cuda.is_available()
    assert not recorder("01_floating_point", "cpu").active  # the CPU only with an explicit folder
    rec.number("x", 1.0)
    assert any(tmp_path.iterdir()) == torch.cuda.is_available()
    with pytest.raises(ValueError, match="file stem"):
        recorder("../escape", "cpu", folder=tmp_path)


def test_a_malformed_record_is_refused(tmp_path):
    rec = recorder("07_hardware", "cpu", folder=tmp_path)
    rec.table("t", [(1, 2)], ["a", "b"])
    path = next(tmp_path.glob("*/07_hardware.json"))
    data = json.loads(path.read_text())
    data["results"]["t"]["rows"].append([1])
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="does not match its headers"):
        load_record(path)
    data["schema"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="schema 99"):
        committed("07_hardware", root=tmp_path)
    assert committed("07_hardware", root=tmp_path / "nothing") == []


def test_the_summary_counts_a_junit_file_and_says_when_one_is_missing(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="t" name="a"/>'
                   '<testcase classname="t" name="b"><skipped message="needs a CUDA GPU"/></testcase>'
                   '<testcase classname="t" name="c"><failure message="boom"/></testcase>'
                   '</testsuite></testsuites>')
    lines = gpu_summary.junit_lines([str(xml), str(tmp_path / "absent.xml")])
    assert lines[0] == "  passed 1, skipped 1, failed 1"
    assert "needs a CUDA GPU" in lines[1] and "t::c: boom" in lines[2]
    assert "no result file" in lines[3]


def test_only_notebooks_whose_every_failure_is_a_kernel_start_are_run_again(tmp_path):
    died = '<error message="failed on setup with &quot;RuntimeError: Kernel died before replying to kernel_info&quot;"/>'
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite>'
                   f'<testcase classname="book.a.ipynb" name="Cell 0">{died}</testcase>'
                   f'<testcase classname="book.a.ipynb" name="Cell 1">{died}</testcase>'
                   f'<testcase classname="book.b.ipynb" name="Cell 0">{died}</testcase>'
                   '<testcase classname="book.b.ipynb" name="Cell 1"><failure message="ClaimFailed"/></testcase>'
                   '<testcase classname="book.c.ipynb" name="Cell 0"><failure message="ClaimFailed"/></testcase>'
                   '<testcase classname="book.d.ipynb" name="Cell 0"/>'
                   '</testsuite></testsuites>')
    assert gpu_summary.kernel_died(str(xml)) == ["book/a.ipynb"]
    assert gpu_summary.kernel_died(str(tmp_path / "absent.xml")) == []


def test_dataclass_fields_of_the_results_are_all_in_the_report(report_dir):
    results, folder = report_dir
    report = json.loads((folder / "report.json").read_text())
    suite_fields = {f.name for f in dataclasses.fields(results)}
    represented = {"info": "device", "matmul": "matmul", "bandwidth": "bandwidth",
                   "alignment": "alignment", "precisions": "transformer_block", "quick": "quick",
                   "seconds": "seconds", "torch_version": "software", "crosscheck": "do_bench",
                   "budget_s": "budget_s"}
    assert suite_fields == set(represented)
    assert all(key in report for key in represented.values())


def test_beside_shows_each_gpu_labelled_or_one_line_on_what_a_gpu_run_measures(tmp_path):
    what = "CUDA autocast's dtype for each op"
    none_yet = beside("05_bf16_and_tf32", "autocast", root=tmp_path, measures=what).data
    assert none_yet == NOT_YET.format(measures=what) and "\n" not in none_yet and "|" not in none_yet
    assert what in none_yet and "](gpu_reports.md)" in none_yet  # what it measures, and where to read on
    rec = recorder("05_bf16_and_tf32", "cpu", folder=tmp_path)
    rec.table("autocast", [("matmul", torch.float16)], ["op", "dtype"], note="CUDA autocast")
    rec.number("speedup", 2.5)
    table = beside("05_bf16_and_tf32", "autocast", root=tmp_path, measures=what).data
    (run,) = committed("05_bf16_and_tf32", root=tmp_path)
    assert table.startswith(f"On {run.label} (CUDA autocast):") and "| matmul | torch.float16 |" in table
    assert beside("05_bf16_and_tf32", "speedup", root=tmp_path, measures="x").data == f"On {run.label}: **2.5**."
    assert beside("05_bf16_and_tf32", "absent", root=tmp_path, measures=what).data == NOT_YET.format(measures=what)
    shortened = beside("05_bf16_and_tf32", "autocast", root=tmp_path, measures=what, shorten=str.upper).data
    assert "| MATMUL | TORCH.FLOAT16 |" in shortened and shortened.startswith(f"On {run.label} (CUDA autocast):")
    assert committed("05_bf16_and_tf32", root=tmp_path)[0].get("autocast")[1] == [["matmul", "torch.float16"]]  # kept whole


@pytest.mark.parametrize("measures", ["", "  ", None, "the peak memory."])
def test_beside_needs_a_phrase_saying_what_a_gpu_run_measures(tmp_path, measures):
    with pytest.raises(ValueError, match="measures="):
        beside("05_bf16_and_tf32", "autocast", root=tmp_path, measures=measures)
