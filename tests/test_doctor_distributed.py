"""mpcourse.doctor on 2 gloo processes, one session per rank, all set-ups in one launch: the three
multi-process codes in their broken FSDP2 / DDP / model-parallel set-ups, none of them (and no
error or warning at all) in the corrected ones."""
import pytest

from mpcourse.doctor import distributed
from mpcourse.doctor.report import Finding

DISTRIBUTED_CODES = {"fsdp-fp16-without-sharded-scaler", "half-reduce", "unsynced-found-inf"}


@pytest.fixture(scope="module")
def reports():
    return distributed.diagnose_setups()


def serious(report) -> set:
    return {f.code for f in report.findings if f.severity in ("error", "warning")}


@pytest.mark.parametrize("setup", [*distributed.BROKEN, *distributed.AT_SCALE])
def test_broken_and_risky_setups_get_their_codes_on_every_rank(reports, setup):
    ranks = reports[setup]
    assert len(ranks) == 2
    for report in ranks:
        assert all(isinstance(f, Finding) for f in report.findings)
        expected = {**distributed.BROKEN, **distributed.AT_SCALE}[setup]
        assert serious(report) & DISTRIBUTED_CODES == expected, str(report)


@pytest.mark.parametrize("setup", list(distributed.AT_SCALE))
def test_a_16_bit_reduction_is_a_trade_off_that_grows_with_the_ranks_not_an_error(reports, setup):
    for report in reports[setup]:
        assert not [f for f in report.findings if f.severity == "error"], str(report)
        half = next(f for f in report.findings if f.code == "half-reduce")
        assert half.severity == "warning" and "grows with the number of ranks" in half.message


@pytest.mark.parametrize("setup", distributed.CORRECT)
def test_correct_setups_have_no_error_or_warning(reports, setup):
    for report in reports[setup]:
        assert report.ok and not serious(report), str(report)


def test_severities_and_what_they_measured(reports):
    first = {s: {f.code: f for f in reports[s][0].findings} for s in reports}
    assert first["fsdp fp16, no scaler"]["fsdp-fp16-without-sharded-scaler"].severity == "error"
    # FSDP2's gradients are DTensors, whose found_inf torch reduces over the ranks by design (its own
    # FSDP2 test uses torch.amp.GradScaler): an info, not a warning
    plain = first["fsdp fp16, plain GradScaler"]["fsdp-fp16-without-sharded-scaler"]
    assert plain.severity == "info" and "agreed" in plain.message
    unsynced = first["shards, unsynced scaler"]["unsynced-found-inf"]
    assert unsynced.severity == "error" and f"step {distributed.INF_STEP + 1}" in unsynced.message
    assert "rank 0" in unsynced.message and "rank 1 stepped" in unsynced.message
    for setup in ("fsdp bf16, bf16 reduce", "ddp, bf16 comm hook"):
        half = first[setup]["half-reduce"]
        assert half.severity == "warning" and "BF16" in half.message
        error = float(half.message.rsplit("relative error of ", 1)[1].split(";")[0])
        assert 2.0**-12 < error < 2.0**-7, half.message  # BF16 rounding of one sum: 8 bits
        assert half.guide == "fg-half-reduce"


def test_an_unknown_setup_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="unknown set-up"):
        distributed.diagnose_setups(["fsdp fp64"])
