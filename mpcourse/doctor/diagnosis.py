"""From what happened in the watched steps (:class:`~mpcourse.doctor.watching.Observations`) to
findings: one function per code, each returning the findings it has evidence for."""
from __future__ import annotations

import torch

from mpcourse.doctor.report import Finding, Report, finding

NAMES = {torch.float16: "FP16", torch.bfloat16: "BF16"}
STALL = 0.5  # a share of updates rounded away above this: the weights have (nearly) stopped


def _fp16_without_scaling(seen, session):
    if seen.fp16_grad_values == 0:  # no backward of an unscaled loss went through FP16
        return []
    share = seen.fp16_subnormal / seen.fp16_grad_values
    if seen.fp16_subnormal == 0:
        return [finding("fp16-without-scaling", "info",
                        f"backward ran through FP16 without loss scaling; none of its "
                        f"{seen.fp16_grad_values} FP16 gradient values underflowed in these steps",
                        "loss.backward()")]
    return [finding("fp16-without-scaling", "warning",
                    f"backward ran through FP16 without loss scaling: {seen.fp16_subnormal} of "
                    f"{seen.fp16_grad_values} FP16 gradient values ({share:.1%}) fell below FP16's "
                    f"smallest normal number 2**-14 = 6.1e-5 (subnormal: fewer bits, the smallest "
                    f"flushed to 0)", f"loss.backward(): first the gradient of "
                                       f"{seen.fp16_subnormal_where}")]


def _names(names: list, most: int = 4) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _half_params(seen, session):
    found = []
    for group, params in seen.rounded.items():
        rounded = sum(counts[0] for counts in params.values())
        updates = sum(counts[1] for counts in params.values())
        share = rounded / updates if updates else 0.0
        formats = "/".join(sorted({NAMES[counts[2]] for counts in params.values()}))
        # None rounded away yet is still a warning: the risk grows as the updates shrink (a
        # decaying learning rate, smaller gradients), and a count of 0% would read as all clear.
        evidence = (f"{rounded} of {updates} updates ({share:.1%}) rounded away, leaving the weight "
                    f"unchanged" if rounded else
                    f"none of its {updates} updates was rounded away in these steps, but any update "
                    f"below half its weight's spacing would be, and the risk grows as the updates "
                    f"shrink")
        found.append(finding(
            "half-params-without-masters", "error" if share > STALL else "warning",
            f"the optimizer steps {formats} parameters directly, with no FP32 master copy: "
            f"{evidence}", f"optimizer.{group}: {_names(list(params))}"))
    return found


def _clip_before_unscale(seen, session):
    return [finding("clip-before-unscale", "error",
                    f"gradients were clipped while still multiplied by the loss scale "
                    f"({len(seen.clips)} time{'s' if len(seen.clips) > 1 else ''}): max_norm was "
                    f"compared with S times the true norm, so after unscaling a clipped gradient's "
                    f"norm is at most max_norm / S", call)
            for call in dict.fromkeys(seen.clips)]


def _scaler_misuse(seen, session):
    return [finding("scaler-misuse", "error",
                    message + (f" ({times} times)" if times > 1 else ""), where)
            for (where, message), times in seen.misuse.items()]


def _nonfinite(seen, session):
    found = []
    first = seen.first_nonfinite
    if first is not None:
        value = "NaN" if first["kind"] == "nan" else "inf"
        where, step = first["where"], first["step"]
        if first["origin"] == "input":
            message = f"the input of {where} held {value} before any computation: bad data"
        elif first["origin"] == "weights":
            message = f"the weights {where} already held {value} when the forward pass began"
        elif first["phase"] == "forward":
            cause = ("an overflow: a value beyond the format's largest number" if value == "inf"
                     else "NaN from finite inputs and weights (inf - inf, 0 * inf, or 0/0)")
            message = (f"the forward pass of module {where} produced {value} from finite inputs: "
                       f"{cause}")
        elif first["phase"] == "backward":
            born = ("in the loss's backward (between the loss and the model's output)"
                    if where == "the model's output" else
                    "in backward, where the gradients coming back were still finite (sqrt, "
                    "norm or division at 0, or an overflowing gradient)")
            message = (f"the forward pass was finite, but the gradient of {where} held {value}: "
                       f"born {born}")
        else:
            message = (f"gradients and weights were finite, but the optimizer step made {where} "
                       f"{value} (e.g. a division by sqrt(v) + eps where eps rounds to 0)")
        found.append(finding("nonfinite", "error", f"{message}; first seen in watched step {step}",
                             f"{first['phase']}: {where}"))
    if seen.skipped or seen.scaled_overflows:
        every = seen.scaler_steps > 0 and seen.skipped == seen.scaler_steps
        where = (f"first seen in the gradient of {seen.overflow_where}" if seen.overflow_where
                 else "in a parameter's gradient")
        if first is not None and first["phase"] == "forward":
            # The loss was already inf/NaN: the scale did not cause these gradients, and no scale fixes them.
            cause = ("the gradients were inf/NaN because the forward pass already was (the error "
                     "above), which no loss scale fixes: a falling scale is the symptom, not the cause")
        else:
            cause = (f"the scaled gradients overflowed ({where}) while the forward pass was finite"
                     + ("" if every else ": normal while a dynamic scale settles"))
        found.append(finding(
            "nonfinite", "warning" if every else "info",
            f"the scaler skipped {seen.skipped} of {seen.scaler_steps} steps: {cause}"
            + ("; no step was taken at all" if every else ""),
            f"backward: {seen.overflow_where or 'parameter gradients'}"))
    return found


def _half_loss(seen, session):
    if not seen.half_losses:
        return []
    # the loss function's own call names the mistake best; a 16-bit root of backward says it too
    call, dtype = next((c for c in seen.half_losses if c[0] != "loss.backward()"), seen.half_losses[0])
    return [finding("half-loss", "error",
                    f"the loss was computed in {NAMES[dtype]}: softmax and log of 16-bit logits "
                    f"lose the small probabilities, and the loss itself rounds coarsely", call)]


def _eps_underflow(seen, session):
    found = []
    for where, e in seen.eps.items():
        fmt, share = NAMES[e["dtype"]], e["dominated"] / e["total"] if e["total"] else 0.0
        if e["zero"]:
            found.append(finding("eps-underflow", "error",
                                 f"eps={e['eps']:g} rounds to 0 in {fmt}, the format the "
                                 f"optimizer keeps its squared gradients in: sqrt(v) + eps can be "
                                 f"0, and the update 0/0 or m/0", where))
        elif share > STALL:
            found.append(finding("eps-underflow", "warning",
                                 f"eps={e['eps']:g} outweighs sqrt(v) in {share:.1%} of the updated "
                                 f"elements, v kept in {fmt}: the optimizer is no longer adaptive "
                                 f"there", where))
    return found


def _half_batchnorm(seen, session):
    return [finding("half-batchnorm", "warning",
                    f"BatchNorm's running mean and variance are kept in {NAMES[dtype]}: "
                    + ("a variance beyond FP16's largest value, 65504, becomes inf, and in eval mode "
                       "every output of that channel collapses to its bias; smaller statistics "
                       if dtype == torch.float16 else "the statistics ")
                    + "round at every momentum update, and those used at evaluation drift", module)
            for module, dtype in seen.half_batchnorm.items()]


def _emulated_bf16(seen, session):
    from mpcourse import doctor  # through the package, so that tests can replace capability

    found = []
    for device in sorted(seen.bf16_devices, key=str):
        capability = doctor.capability(device)
        if capability is not None and tuple(capability) < (8, 0):
            version = f"{capability[0]}.{capability[1]}"
            if torch.device(device).type == "cuda":
                ran, where = f"BF16 ran on {device}, of compute capability {version}", str(device)
            else:  # the capability seam was replaced: a GPU simulated on another device
                ran, where = (f"BF16 ran on a simulated GPU of compute capability {version}",
                              f"{device} (simulated capability {version})")
            found.append(finding("emulated-bf16", "warning",
                                 f"{ran}: native BF16 needs 8.0 (Ampere), so it is emulated there",
                                 where))
    return found


def _checkpoint(seen, session):
    missing = seen.saves_without_scaler
    if not missing:
        return []
    calls = _names([str(n) for n in missing])
    return [finding("checkpoint-without-scaler", "error",
                    f"{len(missing)} of {seen.saves} torch.save calls saved the model or optimizer "
                    f"while a dynamic loss scaler was in use, without the scaler's state_dict: a "
                    f"resume restarts the scale and its growth counter",
                    f"torch.save (call{'s' if len(missing) > 1 else ''} {calls})")]


def _tf32(seen, session):
    from mpcourse.bench.probes import tf32_state

    try:
        state = tf32_state()
    except RuntimeError as error:  # torch raises when the old and new flag APIs were mixed
        state = f"unreadable ({error})"
    # the devices as torch names their types (torch.device("cuda")), every one the model used
    where = ", ".join(sorted(seen.devices)) or "no device"
    if "cuda" not in seen.devices:
        applies = f"this run computed on {where}, where TF32 does not apply"
    elif seen.devices == {"cuda"}:
        applies = "this run computed on cuda, where it applies"
    else:
        applies = f"this run computed on {where}: it applies on cuda"
    return [finding("tf32", "info", f"TF32 settings for FP32 matmuls and convolutions: {state}; "
                    f"{applies}", "torch.backends")]


def _unwatched(seen, session):
    return [finding("unwatched-scaler", "info",
                    f"the loop used a {kind} that was not passed to doctor.watch; the doctor "
                    f"followed it anyway", kind) for kind in dict.fromkeys(seen.unwatched_scalers)]


def _fsdp_fp16(seen, session):
    if not seen.fsdp_fp16 or not seen.backwards:
        return []
    from torch.amp import GradScaler
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    plain = [k.__name__ for k in seen.scaler_kinds
             if issubclass(k, GradScaler) and not issubclass(k, ShardedGradScaler)]
    if seen.scaler_kinds and not plain:
        return []
    severity = "error"
    if not plain:
        what = ("with no loss scaler: FP16 gradients below 2**-14 (6.1e-5) lose bits, those at or below "
                "2**-25 (3e-8) round to 0, and an overflow goes unchecked")
    elif _unsynced(seen, session):
        what = (f"with a plain {plain[0]}, not ShardedGradScaler: the ranks disagreed on an inf/NaN "
                f"(see unsynced-found-inf)")
    else:  # FSDP2's gradients are DTensors: torch reduces found_inf over the shards (by design)
        severity = "info"
        what = (f"with a plain {plain[0]}: on FSDP2's DTensor gradients torch reduces its inf/NaN "
                f"check over the ranks (as ShardedGradScaler does), and the ranks agreed in these steps")
    return [finding("fsdp-fp16-without-sharded-scaler", severity,
                    f"FSDP2 computes in FP16 (param_dtype=torch.float16) on rank {seen.rank} of "
                    f"{seen.world_size} {what}", f"MixedPrecisionPolicy of {_names(seen.fsdp_fp16)}")]


def _half_reduce(seen, session):
    if not seen.half_reductions:
        return []
    calls = ", ".join(f"{call} ({times} call{'s' if times > 1 else ''})"
                      for call, (dtype, times) in seen.half_reductions.items())
    dtype = NAMES[next(iter(seen.half_reductions.values()))[0]]
    source = {"FSDP2": "FSDP2's reduce_dtype", "DDP": "a DDP comm hook"}.get(
        seen.engine, "a reduction inside backward")
    measured = (f"; the first of them summed over the {seen.world_size} ranks in {dtype} differs "
                f"from the same sum in FP32 by a relative error of {seen.reduction_error:.1e}"
                if seen.reduction_error is not None else "")
    return [finding("half-reduce", "warning",
                    f"gradients were reduced across ranks in {dtype} ({source}): {calls} in the "
                    f"watched backwards{measured}; the error of a 16-bit reduction grows with the "
                    f"number of ranks", source)]


def _unsynced(seen, session):
    for i, step in enumerate(zip(*seen.rank_events) if seen.rank_events else ()):
        if "skipped" in step and "stepped" in step:
            skipped = [r for r, e in enumerate(step) if e == "skipped"]
            stepped = [r for r, e in enumerate(step) if e == "stepped"]
            return [finding("unsynced-found-inf", "error",
                            f"in watched step {i + 1}, rank{'s' if len(skipped) > 1 else ''} "
                            f"{_names([str(r) for r in skipped])} found an inf/NaN and skipped the "
                            f"step while rank{'s' if len(stepped) > 1 else ''} "
                            f"{_names([str(r) for r in stepped])} stepped: the shards of one model "
                            f"now differ in their updates and loss scales",
                            f"scaler.step(optimizer) on rank{'s' if len(skipped) > 1 else ''} "
                            f"{_names([str(r) for r in skipped])}")]
    if seen.rank_events and len({len(e) for e in seen.rank_events}) > 1:
        return [finding("unsynced-found-inf", "error",
                        f"the ranks took different numbers of optimizer steps "
                        f"({', '.join(str(len(e)) for e in seen.rank_events)})", "optimizer.step()")]
    return []


CHECKS = (_fp16_without_scaling, _half_params, _clip_before_unscale, _scaler_misuse, _nonfinite,
          _half_loss, _eps_underflow, _half_batchnorm, _emulated_bf16, _checkpoint, _tf32,
          _unwatched, _fsdp_fp16, _half_reduce, _unsynced)


def diagnose(seen, session) -> Report:
    findings: list[Finding] = [f for check in CHECKS for f in check(seen, session)]
    return Report(findings, seen.steps, seen.skipped)
