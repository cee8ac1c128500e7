"""GPU results recorded by the chapters, and the committed ones read back for the CPU build.

The book is built on a CPU, but some of its sentences are about GPUs: which ops CUDA's autocast
runs in FP16, how fast BF16 is against FP32, what ``_scaled_mm`` does with fast accumulation. A
chapter *records* such results when it runs on a GPU, and the CPU build *shows* the committed
record beside its own live CPU result, labelled with the GPU, the torch version and the date.
Nothing is typed by hand: a recorded file is written by the chapter's own cell on the GPU.

Recording (a chapter, on a GPU)::

    from mpcourse.gpu_record import recorder
    rec = recorder("05_bf16_and_tf32")          # the notebook's file stem
    rec.number("bf16_speedup", 2.9, note="fwd+bwd, 1024 tokens")
    rec.table("autocast_dtypes", rows, ["op", "dtype"])

A recorder writes only when the environment variable ``MPCOURSE_RECORD_GPU`` names a folder and
the device is a CUDA GPU; otherwise every call does nothing, so a reader's run never writes into
their tree unless they ask for it. Each call rewrites ``$MPCOURSE_RECORD_GPU/<device-slug>/<stem>.json``
at once (a run killed half-way keeps what it recorded). To commit a run, copy the device's folder
to ``mpcourse/data/gpu/<device-slug>/``.

Reading (the CPU build)::

    from mpcourse.gpu_record import committed
    for run in committed("05_bf16_and_tf32"):   # one per GPU committed, oldest torch first
        print(run.label, run.get("bf16_speedup"))
    beside("05_bf16_and_tf32", "autocast_dtypes",  # Markdown: each GPU's table, labelled, or
           measures="CUDA autocast's dtype per op")  # one line saying what a GPU run measures

The file (``SCHEMA`` = 1)::

    {"schema": 1, "notebook": "05_bf16_and_tf32",
     "device": {"name": "NVIDIA H100 80GB HBM3", "slug": "nvidia-h100-80gb-hbm3",
                "compute_capability": [9, 0]},
     "torch": "2.11.0+cu130", "cuda": "13.0", "date": "2026-11-27",
     "results": {"bf16_speedup": {"kind": "number", "value": 2.9, "note": "..."},
                 "autocast_dtypes": {"kind": "table", "headers": ["op", "dtype"],
                                     "rows": [["matmul", "torch.float16"], ...], "note": ""}}}

Values are stored as JSON: tuples become lists, tensors and NumPy values numbers or nested
lists, torch dtypes and other objects their ``str()``, and non-finite floats the strings ``"inf"``,
``"-inf"``, ``"nan"`` (strict JSON has no such numbers).

Committed benchmark reports (``python -m mpcourse bench --out DIR``, see
:mod:`mpcourse.bench.report`) live beside them in ``mpcourse/data/bench/<slug>-<date>/`` and are
read with :func:`committed_reports`.
"""
from __future__ import annotations

import datetime
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from mpcourse.bench.specs import device_slug

SCHEMA = 1
ENV = "MPCOURSE_RECORD_GPU"
DATA = Path(__file__).resolve().parent / "data"
GPU_DATA = DATA / "gpu"       # committed chapter records: <device-slug>/<notebook stem>.json
BENCH_DATA = DATA / "bench"   # committed benchmark reports: <device-slug>-<date>/report.json
# Where no GPU run is committed, the page shows no empty table: one line says what a GPU run of the
# cell measures, and links to the appendix that says how to record one.
REPORTS_PAGE = "gpu_reports.md"
NOT_YET = ("On a GPU, this cell also measures {measures}; no GPU run of it is committed yet "
           "(appendix [GPU reports](" + REPORTS_PAGE + "): how to record one).")


def jsonable(value):
    """``value`` as plain JSON data (see the module docstring for the conversions)."""
    if isinstance(value, torch.Tensor) or hasattr(value, "tolist"):  # tensors, NumPy values
        value = value.detach().cpu().tolist() if isinstance(value, torch.Tensor) else value.tolist()
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else ("nan" if math.isnan(value) else
                                                  ("inf" if value > 0 else "-inf"))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


class Recorder:
    """Records one notebook's GPU results; see :func:`recorder`. ``active`` says whether it writes."""

    def __init__(self, stem: str, folder: Path | None, device: torch.device):
        if not isinstance(stem, str) or not stem or "/" in stem or stem.startswith("."):
            raise ValueError(f"stem must be a notebook's file stem such as '05_bf16_and_tf32', "
                             f"got {stem!r}")
        self.stem, self.device = stem, device
        self.path = None if folder is None else folder / _device(device)["slug"] / f"{stem}.json"

    @property
    def active(self) -> bool:
        return self.path is not None

    def number(self, name: str, value, note: str = "") -> None:
        """Record one number (or any JSON-able value) under ``name``."""
        self._write(name, {"kind": "number", "value": jsonable(value), "note": note})

    def table(self, name: str, rows, headers, note: str = "") -> None:
        """Record a table: ``rows`` a sequence of rows, each with one cell per header."""
        rows, headers = jsonable(list(rows)), [str(h) for h in headers]
        if any(not isinstance(r, list) or len(r) != len(headers) for r in rows):
            raise ValueError(f"table {name!r}: every row needs {len(headers)} cells, one per header")
        self._write(name, {"kind": "table", "headers": headers, "rows": rows, "note": note})

    def _write(self, name: str, entry: dict) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a result's name must be a non-empty string, got {name!r}")
        if self.path is None:
            return
        data = json.loads(self.path.read_text()) if self.path.is_file() else self._header()
        data["results"][name] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
        tmp.replace(self.path)  # a reader never sees half a file

    def _header(self) -> dict:
        return {"schema": SCHEMA, "notebook": self.stem, "device": _device(self.device),
                "torch": torch.__version__, "cuda": torch.version.cuda,
                "date": datetime.date.today().isoformat(), "results": {}}


def recorder(stem: str, device=None, *, folder=None) -> Recorder:
    """A :class:`Recorder` for the notebook ``stem`` (its file name without ``.ipynb``).

    It writes into ``folder`` (default: ``$MPCOURSE_RECORD_GPU``) when that is set and ``device``
    (default: CUDA if available, else the CPU) is a CUDA GPU. ``device="cpu"`` with an explicit
    ``folder`` records the CPU, which only the mechanism's own tests do.
    """
    explicit = device is not None and folder is not None
    device = torch.device(device if device is not None else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    folder = folder if folder is not None else os.environ.get(ENV) or None
    if folder is not None and not (device.type == "cuda" or explicit):
        folder = None  # a CPU run never records unless a test asks for it
    return Recorder(stem, None if folder is None else Path(folder), device)


def _device(device: torch.device) -> dict:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"name": props.name, "slug": device_slug(props.name),
                "compute_capability": [props.major, props.minor]}
    from mpcourse.bench.specs import device_info
    name = device_info("cpu").name
    return {"name": name, "slug": device_slug(name), "compute_capability": None}


@dataclass(frozen=True)
class Recorded:
    """One committed record: a notebook's results on one GPU."""
    notebook: str
    device: str
    slug: str
    torch: str
    date: str
    results: dict
    path: Path

    @property
    def label(self) -> str:
        """``"NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, 2026-11-27"``: say where a number came from."""
        return f"{self.device}, torch {self.torch}, {self.date}"

    def get(self, name: str):
        """The recorded value of a number, or ``(headers, rows)`` of a table."""
        if name not in self.results:
            raise KeyError(f"{self.path} records no {name!r}; it has {sorted(self.results)}")
        entry = self.results[name]
        return (entry["headers"], entry["rows"]) if entry["kind"] == "table" else entry["value"]


def load_record(path) -> Recorded:
    """Read and check one recorded file (a clear ValueError for a malformed one)."""
    path = Path(path)
    data = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, this library reads {SCHEMA}")
    for key in ("notebook", "device", "torch", "date", "results"):
        if key not in data:
            raise ValueError(f"{path}: no {key!r}")
    for name, entry in data["results"].items():
        if entry.get("kind") not in ("number", "table"):
            raise ValueError(f"{path}: result {name!r} has kind {entry.get('kind')!r}")
        if entry["kind"] == "table" and any(len(r) != len(entry["headers"]) for r in entry["rows"]):
            raise ValueError(f"{path}: table {name!r} has a row that does not match its headers")
    device = data["device"]
    return Recorded(data["notebook"], device["name"], device["slug"], data["torch"], data["date"],
                    data["results"], path)


def committed(stem: str, root=None) -> list[Recorded]:
    """Every committed record of notebook ``stem``, one per GPU folder under ``root`` (default
    ``mpcourse/data/gpu``), oldest torch version first; empty until a GPU run is committed."""
    root = Path(root) if root is not None else GPU_DATA
    found = [load_record(p) for p in sorted(root.glob(f"*/{stem}.json"))]
    return sorted(found, key=lambda r: (_version_key(r.torch), r.slug))


def beside(stem: str, name: str, root=None, *, measures: str, shorten=None):
    """The committed GPU results ``name`` of notebook ``stem`` as Markdown to show beside a
    chapter's live CPU result: one labelled table or number per GPU, or, while none is committed
    (or none recorded ``name``), the one line :data:`NOT_YET`, which says what a GPU run of the
    cell ``measures`` (a phrase: "the peak memory and time of one AMP training step") and links
    to the appendix *GPU reports*. A CPU build never shows an empty table.

    ``shorten``: a function applied to the text of each cell of a recorded table before it is
    shown (for example :func:`mpcourse.bench.kernels.short_kernel_names`); the record keeps the
    full text."""
    from mpcourse.display import Markdown, markdown_table
    if not isinstance(measures, str) or not measures.strip() or measures.rstrip().endswith("."):
        raise ValueError("beside() needs measures=, a phrase saying what a GPU run of the cell "
                         f"measures (no final full stop), got {measures!r}")
    runs = [run for run in committed(stem, root) if name in run.results]
    if not runs:
        return Markdown(NOT_YET.format(measures=measures.strip()))
    parts = []
    for run in runs:
        value, note = run.get(name), run.results[name].get("note", "")
        suffix = f" ({note})" if note else ""
        if run.results[name]["kind"] == "table":
            rows = value[1] if shorten is None else [[shorten(str(cell)) for cell in row] for row in value[1]]
            parts.append(f"On {run.label}{suffix}:\n\n{markdown_table(rows, value[0]).data}")
        else:
            parts.append(f"On {run.label}: **{value}**{suffix}.")
    return Markdown("\n\n".join(parts))


def committed_reports(root=None) -> list[dict]:
    """Every committed benchmark report (``report.json`` under ``root``, default
    ``mpcourse/data/bench``), checked with :func:`mpcourse.bench.report_json.check_report`, by date."""
    from mpcourse.bench.report_json import check_report
    root = Path(root) if root is not None else BENCH_DATA
    reports = []
    for path in sorted(root.glob("*/report.json")):
        report = json.loads(path.read_text())
        check_report(report, path)
        reports.append(report)
    return sorted(reports, key=lambda r: r["date"])


def _version_key(version: str) -> tuple:
    parts = version.split("+")[0].split(".")
    return tuple(int(p) if p.isdigit() else 0 for p in parts)
