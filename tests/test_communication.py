"""mpcourse.communication against the real thing: all-reduces between real processes
(torch.distributed, gloo) checked against float64 sums computed here, an FP32 error bound derived
from the standard analysis of recursive summation, and a ring emulation written here with NumPy's
own float16 arithmetic; the FP16 overflow reproduced and fixed; error feedback; the launcher's
failures. Each test launches processes at most once (the first also starts the fork server)."""
import math
import os
import sys
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from mpcourse import communication as comm
from mpcourse.formats import FP16


# --- worker functions: the workers import them by name, so they live at the top level -------
def report_rank(rank, world_size, tag):
    return rank, world_size, tag, dist.get_rank(), dist.get_world_size()


def raise_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("planted failure on rank 1")
    dist.barrier()  # rank 0 waits for rank 1, which never arrives


def die_on_rank_one(rank, world_size):
    if rank == 1:
        os._exit(3)
    dist.barrier()


def sleep_long(rank, world_size):
    time.sleep(60)


def builds_an_optimizer(rank, world_size):
    # torch.optim.Optimizer.__init__ imports torch._dynamo on its first call: seconds per worker
    # unless the fork server imported it once for all of them
    already = "torch._dynamo" in sys.modules
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    return already


# --- the launcher -----------------------------------------------------------------------------
def test_run_workers_returns_each_ranks_result_in_rank_order():
    results = comm.run_workers(report_rank, 3, "tag", backend="gloo")
    assert results == [(rank, 3, "tag", rank, 3) for rank in range(3)]


def test_the_worker_server_started_ahead_is_the_one_run_workers_uses():
    import multiprocessing.forkserver
    comm.start_worker_server()
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    comm.start_worker_server()  # again: the same server
    assert server is not None and multiprocessing.forkserver._forkserver._forkserver_pid == server
    assert comm.run_workers(report_rank, 2, "ahead", backend="gloo") == [(r, 2, "ahead", r, 2) for r in range(2)]
    assert multiprocessing.forkserver._forkserver._forkserver_pid == server


def test_workers_start_with_the_import_an_optimizer_needs_already_done():
    assert comm.run_workers(builds_an_optimizer, 2, backend="gloo") == [True, True]


def test_a_worker_exception_surfaces_as_a_clear_error_without_waiting_for_the_timeout():
    with pytest.raises(comm.WorkerError, match="rank 1 of 2 failed") as info:
        comm.run_workers(raise_on_rank_one, 2, backend="gloo", timeout=60)
    assert "ValueError: planted failure on rank 1" in str(info.value)


def test_a_worker_that_dies_silently_is_reported():
    with pytest.raises(comm.WorkerError, match=r"(?s)rank 1 of 2 failed.*exit code 3"):
        comm.run_workers(die_on_rank_one, 2, backend="gloo", timeout=60)


def test_a_hanging_worker_is_stopped_at_the_timeout():
    with pytest.raises(TimeoutError, match=r"ranks \[0\] did not finish within 2 s"):
        comm.run_workers(sleep_long, 1, backend="gloo", timeout=2)


@pytest.mark.parametrize("call, error, message", [
    (lambda: comm.run_workers(lambda rank, n: rank, 2), TypeError, "top level of an importable"),
    (lambda: comm.run_workers(report_rank, 0, "x"), ValueError, "world_size"),
    (lambda: comm.run_workers(report_rank, True, "x"), ValueError, "world_size"),
    (lambda: comm.run_workers(report_rank, 2, "x", backend="mpi"), ValueError, "gloo"),
    (lambda: comm.run_workers(report_rank, 2, "x", timeout=0), ValueError, "timeout"),
    (lambda: comm.start_worker_server("torch._dynamo"), TypeError, "list of module names"),
    (lambda: comm.ring_allreduce_reference([]), ValueError, "non-empty list"),
    (lambda: comm.ring_allreduce_reference([torch.ones(3), torch.ones(4)]), ValueError, "shape"),
    (lambda: comm.ring_allreduce_reference([torch.ones(3, dtype=torch.int32)]), TypeError,
     "floating-point"),
    (lambda: comm.ring_allreduce_reference([torch.ones(0)]), ValueError, "empty"),
    (lambda: comm.ring_allreduce_reference([torch.ones(3)], "e4m3"), ValueError, "wire format"),
    (lambda: comm.ring_allreduce_reference([torch.ones(3)], "fp12"), ValueError, "unknown format"),
    (lambda: comm.allreduce_sum([torch.ones(2)], "e5m2"), ValueError, "wire format"),
    (lambda: comm.allreduce_error((2, 0)), ValueError, "world_sizes"),
    (lambda: comm.allreduce_error((2,), kind="normal"), ValueError, "kind"),
    (lambda: comm.overflow_experiment(2, scale=-1.0), ValueError, "scale"),
    (lambda: comm.error_feedback(2, 10, "fp16"), ValueError, "e4m3"),
    (lambda: comm.error_feedback(2, 0), ValueError, "steps"),
    (lambda: comm.local_gradient(0, kind="normal"), ValueError, "kind"),
])
def test_bad_input_gets_a_clear_error_before_any_process_starts(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --- the ring, emulated -------------------------------------------------------------------------
def test_ring_reference_small_example_worked_out_by_hand():
    # gloo's layout for 4 fp16 elements on 4 ranks: 8 segments of one element, two per chunk, so
    # elements 0-1 form chunk 0 (its sum starts at rank 3), elements 2-3 chunk 1 (starts at rank 0).
    assert comm.gloo_ring_order(4, 2, 4).tolist() == [3, 3, 0, 0]
    ranks = [torch.full((4,), 2048.0)] + [torch.ones(4) for _ in range(3)]
    # 1 + 1 + 1 = 3 exactly, 3 + 2048 = 2051 is a tie between 2050 and 2052 -> even 2052;
    # 2048 + 1 = 2049 is a tie between 2048 and 2050 -> 2048, three times.
    assert comm.ring_allreduce_reference(ranks, "fp16").tolist() == [2052, 2052, 2048, 2048]
    assert comm.ring_allreduce_reference(ranks, "fp32").tolist() == [2051] * 4


def numpy_ring(tensors, dtype):
    """The ring's additions, one at a time in NumPy's own float16 (or float32) arithmetic, in the
    order gloo_ring_order gives."""
    values = [t.numpy().astype(dtype) for t in tensors]
    first = comm.gloo_ring_order(len(values[0]), np.dtype(dtype).itemsize, len(values)).numpy()
    out = np.empty(len(values[0]), dtype=dtype)
    for i, start in enumerate(first):
        total = values[start][i]
        for hop in range(1, len(values)):
            total = dtype(total + values[(start - hop) % len(values)][i])
        out[i] = total
    return out


@pytest.mark.parametrize("dtype, wire", [(np.float16, "fp16"), (np.float32, "fp32")])
def test_ring_reference_matches_sequential_numpy_arithmetic(dtype, wire):
    tensors = [comm.local_gradient(rank, kind="lognormal")[:600] * 2.0**12 for rank in range(5)]
    expected = numpy_ring(tensors, dtype).astype(np.float32)
    got = comm.ring_allreduce_reference(tensors, wire).numpy()
    np.testing.assert_array_equal(got, expected)


def test_gloo_segments_more_than_one_mebibyte_the_way_the_order_says():
    # 3 MiB of fp32 on 2 ranks: 4 segments (the minimum, 2N), chunk 0 = first half.
    order = comm.gloo_ring_order(3 * 2**18, 4, 2)
    assert order[: 3 * 2**17].eq(1).all() and order[3 * 2**17:].eq(0).all()
    # 9 MiB: ceil(9 MiB / 1 MiB) = 9 segments, rounded up to 10; 5 per chunk.
    order = comm.gloo_ring_order(9 * 2**18, 4, 2)
    segment = math.ceil(9 * 2**18 / 10)
    assert order[5 * segment - 1] == 1 and order[5 * segment] == 0


# --- the all-reduce, for real ----------------------------------------------------------------
def test_real_allreduce_against_float64_and_the_ring_emulation():
    measured = comm.allreduce_error((2, 4), ("fp32", "fp16", "bf16"), kind="lognormal",
                                    backend="gloo")
    rows = {(row.world_size, row.wire): row for row in measured}
    assert all(row.matches_ring for row in rows.values())  # gloo's sums, bit for bit
    for n in (2, 4):
        inputs = torch.stack([comm.local_gradient(rank, kind="lognormal") for rank in range(n)])
        exact = inputs.double().sum(0)
        # Recursive summation of n terms: |error| <= gamma_{n-1} * sum |x_i| per element, with
        # gamma_k = k u / (1 - k u), u = 2**-24 (Higham, Accuracy and Stability, section 4.2).
        u = 2.0**-24
        gamma = (n - 1) * u / (1 - (n - 1) * u)
        bound = gamma * inputs.double().abs().sum(0).norm() / exact.norm()
        assert 0 < rows[n, "fp32"].relative_error <= bound
        assert rows[n, "fp32"].cast_error == 0  # FP32 inputs are FP32 already
        assert rows[n, "fp32"].relative_error < rows[n, "fp16"].relative_error
        assert rows[n, "fp16"].relative_error < rows[n, "bf16"].relative_error
        assert rows[n, "fp16"].cast_error <= rows[n, "fp16"].relative_error * 1.5


def test_allreduce_sum_runs_the_four_rank_example_in_real_processes():
    ranks = [torch.full((4,), 2048.0)] + [torch.ones(4) for _ in range(3)]
    assert comm.allreduce_sum(ranks, "fp16", backend="gloo").tolist() == [2052, 2052, 2048, 2048]


def test_fp16_overflow_when_summing_is_reproduced_and_fixed_by_dividing_first():
    n = 4
    gradients = [comm.local_gradient(rank) for rank in range(n)]
    largest_rank = max(g.abs().max().item() for g in gradients)
    largest_sum = torch.stack(gradients).double().sum(0).abs().max().item()
    # A loss scale under which every rank's values fit in FP16 but their sum does not (values
    # from 65520 up round to inf).
    scale = 0.999 * FP16.max_value / largest_rank
    assert largest_rank * scale < FP16.max_value and largest_sum * scale >= 65520
    rows = {r.averaging: r for r in comm.overflow_experiment(n, scale, "fp16", backend="gloo")}
    assert rows["sum_then_divide"].nonfinite > 0
    assert math.isinf(rows["sum_then_divide"].relative_error)
    assert rows["reduce_op_avg"].nonfinite > 0  # gloo's AVG sums first, then divides
    for fixed in ("divide_then_sum", "split"):
        assert rows[fixed].nonfinite == 0
        assert rows[fixed].relative_error < 2.0**-9  # a few FP16 roundings, not a lost step


def test_error_feedback_keeps_the_accumulated_error_bounded():
    steps = 12
    result = comm.error_feedback(2, steps, "e4m3", planted=1e-6, backend="gloo")
    without = result.accumulated_error["without feedback"]
    with_ = result.accumulated_error["with feedback"]
    assert len(without) == len(with_) == len(result.exact_norm) == steps
    assert without[0] == with_[0]  # the first step sends the same message either way
    assert without[-1] > 2 * without[0]  # without feedback, the errors pile up...
    spread = sum(e * e for e in result.step_error["without feedback"]) ** 0.5
    assert 0.7 < without[-1] / spread < 1.4  # ...as a random walk: the root-sum-square of the steps
    assert without[-1] < 0.6 * sum(result.step_error["without feedback"])  # not as a systematic sum
    assert with_[-1] < without[-1] / 2
    assert max(with_) < 2 * with_[0]  # with feedback, the error stays one residual's size
    assert result.never_sent["with feedback"] <= result.never_sent["without feedback"]
    # the planted component, below E4M3's flush threshold: never sent without feedback
    assert result.planted["without feedback"] == [1.0] * steps
    assert result.planted["with feedback"][-1] < 0.5


def test_error_feedback_refuses_a_planted_component_that_is_not_a_fraction():
    with pytest.raises(ValueError, match="0 < planted < 1"):
        comm.error_feedback(2, 2, "e4m3", planted=2.0)


def test_allreduce_throughput_times_every_message_in_every_round():
    times = comm.allreduce_throughput(2, ((1024, "fp32"), (1024, "bf16")), repeats=3, backend="gloo")
    assert set(times) == {(1024, "fp32"), (1024, "bf16")}
    assert all(len(t) == 3 and min(t) > 0 for t in times.values())
    with pytest.raises(ValueError, match="repeats"):
        comm.allreduce_throughput(2, ((1024, "fp32"),), repeats=0)


def test_local_gradients_are_a_data_parallel_split_of_one_batch():
    # The mean of the ranks' gradients is the gradient of their combined batch.
    import torch.nn.functional as F
    n = 4
    x = torch.cat([comm.rank_batch(rank)[0] for rank in range(n)])
    y = torch.cat([comm.rank_batch(rank)[1] for rank in range(n)])
    model = comm.digits_model()
    F.cross_entropy(model(x), y).backward()
    full = torch.cat([p.grad.flatten() for p in model.parameters()])
    mean = torch.stack([comm.local_gradient(rank) for rank in range(n)]).mean(0)
    torch.testing.assert_close(mean, full, rtol=1e-5, atol=1e-7)


def test_ring_traffic_and_split_factors():
    assert comm.ring_traffic_bytes(100.0, 1) == 0
    assert comm.ring_traffic_bytes(100.0, 4) == 150.0
    for n in (1, 2, 3, 8, 64, 1000):
        before, after = comm.split_factors(n)
        assert before * after == n
    assert [comm.split_factors(n) for n in (1, 2, 8, 32, 128)] == [(1, 1), (2, 1), (4, 2), (8, 4), (16, 8)]
    for bad in (0, -4, 2.5, True):  # no world of ranks: a clear error, not (1, 0.0)
        with pytest.raises(ValueError, match="world_size"):
            comm.split_factors(bad)


def test_split_factors_are_fsdp2s():
    # the independent reference: the pre- and post-divide factors FSDP2 itself uses for FP16
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors

    for n in (1, 2, 3, 4, 6, 8, 12, 32, 64, 100, 128, 1000):
        pre, post, _, _ = _get_gradient_divide_factors(None, None, torch.float16, factor=float(n))
        assert comm.split_factors(n) == (pre, post), n


def test_ring_sum_is_the_reference_ring_and_trains():
    """ring_sum (torch's own 16-bit additions) equals the exact-rounding emulation bit for bit, and
    train_data_parallel returns a finite test loss that training lowers."""
    from mpcourse import communication as comm

    grads = [comm.local_gradient(r) for r in range(4)]
    for wire in ("fp32", "fp16", "bf16"):
        assert torch.equal(comm.ring_sum(torch.stack(grads), wire), comm.ring_allreduce_reference(grads, wire))
    start, trained = comm.train_data_parallel("bf16", 0, ranks=2, steps=0), comm.train_data_parallel("bf16", 0, ranks=2, steps=5)
    assert torch.isfinite(torch.tensor(trained)) and trained < start
