"""What the doctor hands back: one :class:`Finding` per mistake, gathered in a :class:`Report`."""
from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("error", "warning", "info")  # most serious first: the order a report lists them in

# Each code the doctor knows -> the one-sentence fix it proposes. The field guide gives every code
# an entry with the MyST label ``fg-<code>``; a finding with no entry there has guide "".
FIXES = {
    "fp16-without-scaling":
        "Scale the loss: scaler = torch.amp.GradScaler(); scaler.scale(loss).backward(); "
        "scaler.step(optimizer); scaler.update() (or train in BF16, which needs no scaling).",
    "half-params-without-masters":
        "Keep FP32 master weights: wrap the optimizer in mpcourse.optim.MasterWeightOptimizer, "
        "or keep the parameters FP32 and use torch.autocast (or CompensatedOptimizer for pure BF16).",
    "clip-before-unscale":
        "Call scaler.unscale_(optimizer) before clipping, so that max_norm is compared with the "
        "true gradient norm.",
    "scaler-misuse":
        "Once per optimizer step: scaler.scale(loss).backward() per micro-batch, then "
        "scaler.unscale_(optimizer) at most once, scaler.step(optimizer), scaler.update().",
    "nonfinite":
        "Fix the first place an inf or NaN appears (named in 'where'), not the places it spreads to.",
    "half-loss":
        "Compute the loss in FP32: under torch.autocast pass the logits straight to the loss, "
        "or call loss_fn(logits.float(), target) when the model runs in FP16/BF16.",
    "eps-underflow":
        "Keep the optimizer's state in FP32 (MasterWeightOptimizer, or FP32 parameters under "
        "autocast), or choose an eps the state's format holds (FP16: at least 6.1e-5).",
    "half-batchnorm":
        "Keep BatchNorm in FP32: convert the model, then call .float() on its BatchNorm "
        "modules (or use torch.autocast, which keeps parameters and buffers in FP32).",
    "emulated-bf16":
        "On a GPU of compute capability below 8.0 train in FP16 with a GradScaler: BF16 is "
        "emulated there, slower than FP32.",
    "checkpoint-without-scaler":
        "Save scaler.state_dict() in the same checkpoint, and load it with "
        "scaler.load_state_dict() on resume.",
    "tf32":
        "Set torch.backends.cuda.matmul.fp32_precision ('ieee' or 'tf32') explicitly, with one "
        "API only: mixing it with allow_tf32 raises.",
    "fsdp-fp16-without-sharded-scaler":
        "Use a loss scaler whose inf check covers every rank: ShardedGradScaler, or under FSDP2 "
        "torch.amp.GradScaler (DTensor reduces its check over the ranks); or a BF16 param_dtype, "
        "which needs no loss scaling.",
    "half-reduce":
        "Reduce gradients in FP32: MixedPrecisionPolicy(param_dtype=..., reduce_dtype=torch.float32) "
        "under FSDP2, no compressing comm hook (or one with error feedback) under DDP.",
    "unsynced-found-inf":
        "Agree on the inf check across ranks before stepping: ShardedGradScaler under FSDP2, or "
        "all-reduce the flag (mpcourse's LossScaler.sync_found_inf) between unscale_ and step.",
    "unwatched-scaler":
        "Pass the scaler the loop uses: doctor.watch(model, optimizer, scaler).",
}
GUIDED = set(FIXES) - {"unwatched-scaler"}  # the codes the field guide has an entry for


@dataclass(frozen=True)
class Finding:
    """One mistake (or setting worth knowing) seen in the watched steps.

    ``severity``: ``"error"`` (training is wrong or will fail), ``"warning"`` (likely harmful
    here) or ``"info"``. ``where`` names the module, parameter, optimizer group or call; ``fix`` is
    one concrete sentence; ``guide`` is the field guide's MyST label, ``fg-<code>``, or ``""``.
    """

    code: str
    severity: str
    message: str
    where: str
    fix: str
    guide: str

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity is one of {SEVERITIES}, not {self.severity!r}")


def finding(code: str, severity: str, message: str, where: str) -> Finding:
    """A :class:`Finding` with the code's fix sentence and field-guide label filled in."""
    return Finding(code, severity, message, where, FIXES[code],
                   f"fg-{code}" if code in GUIDED else "")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 or noun == "info" else f"{count} {noun}s"


class Report:
    """The findings of one watched block, most serious first.

    ``ok`` is True when no finding has severity ``"error"``. ``print(report)`` gives plain text;
    a notebook shows :meth:`_repr_markdown_`, a table.
    """

    def __init__(self, findings, steps: int, skipped: int = 0):
        self.findings = sorted(findings, key=lambda f: SEVERITIES.index(f.severity))
        self.steps = steps  # optimizer steps taken
        self.skipped = skipped  # steps the scaler skipped (inf/NaN gradients): not in ``steps``

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def _summary(self) -> str:
        counts = [_plural(sum(f.severity == s for f in self.findings), s) for s in SEVERITIES]
        if not self.skipped:
            return f"doctor: {', '.join(counts)} in {_plural(self.steps, 'watched optimizer step')}"
        return (f"doctor: {', '.join(counts)} in {_plural(self.steps + self.skipped, 'watched step')} "
                f"({self.skipped} skipped by the scaler, {_plural(self.steps, 'optimizer step')} taken)")

    def __str__(self) -> str:
        lines = [self._summary()]
        for f in self.findings:
            lines.append(f"{f.severity.upper()} {f.code} at {f.where}: {f.message}")
            lines.append(f"  fix: {f.fix}" + (f" (field guide: {f.guide})" if f.guide else ""))
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        def cell(text: str) -> str:
            return text.replace("|", "\\|").replace("\n", " ")

        rows = [f"**{self._summary()}**", "", "| severity | code | where | what happened | fix |",
                "|---|---|---|---|---|"]
        rows += [f"| {f.severity} | `{f.code}` | {cell(f.where)} | {cell(f.message)} | "
                 f"{cell(f.fix)} |" for f in self.findings]
        return "\n".join(rows)

    def __repr__(self) -> str:
        return f"Report({len(self.findings)} findings, ok={self.ok})"
