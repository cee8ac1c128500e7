"""Communicating gradients: all-reduce in FP32, FP16 and BF16 with real ``torch.distributed``.

In data-parallel training each of ``N`` ranks (processes, one per GPU) computes the gradient
``g_r`` of its own share of the batch, and before the optimizer step every rank needs the mean::

    g = (g_0 + g_1 + ... + g_{N-1}) / N

An *all-reduce* computes that sum and leaves it on every rank. The common algorithm is the
*ring*: the vector is cut into ``N`` chunks, and each chunk travels once around the ring of
ranks, each rank adding its own part before passing it on; then the finished chunks travel
around once more to reach everyone. Each rank sends (and receives) ``2 (N - 1) / N`` times the
message, never more than twice it however many ranks there are: :func:`ring_traffic_bytes`.

The message is the gradient in a *wire format*. Sending FP16 or BF16 instead of FP32 halves the
traffic, but the additions along the ring are then done in that format too: the partial sum is
rounded to the wire format at every hop. :func:`ring_allreduce_reference` computes, locally and
exactly, what a ring returns; :func:`allreduce_mean` does the real thing between processes.

Processes: :func:`run_workers` starts ``N`` processes on this machine, joins them in a process
group (``gloo`` on CPUs, ``nccl`` when every rank has its own GPU) and runs a function on each.
The workers import that function by name, so it must live in a module, not in a notebook: the
chapter's experiments (:func:`allreduce_sum`, :func:`allreduce_error`,
:func:`overflow_experiment`, :func:`error_feedback`, :func:`allreduce_throughput`) are here for
that reason, and each needs a single launch.
"""
from __future__ import annotations

import functools
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pickle
import socket
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mpcourse.formats import get_format, round_to

WIRE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
AVERAGING = ("sum_then_divide", "divide_then_sum", "split", "reduce_op_avg")


# ---------------------------------------------------------------------------------------------
# Launching processes

class WorkerError(RuntimeError):
    """A worker process failed; the message holds its rank and its traceback."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend(world_size: int) -> str:
    """``"nccl"`` when every rank can have a GPU of its own, else ``"gloo"`` (CPU tensors)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return "nccl" if dist.is_nccl_available() and gpus >= world_size else "gloo"


def rank_device() -> torch.device:
    """The device this rank's tensors live on: its own GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# What the fork server imports once for all workers: what the course's experiments use. The
# workloads and scikit-learn's datasets (workers that load the digits), and torch._dynamo, which
# torch.optim.Optimizer.__init__ imports on first use: seconds in every worker that builds one.
WORKER_PRELOAD = ("mpcourse.workloads", "sklearn.datasets", "torch._dynamo")


def _context(preload=WORKER_PRELOAD):
    # A fork server imports torch once and forks every worker from that warm process: starting a
    # worker then costs milliseconds instead of the seconds of a fresh `import torch`. Like spawn
    # (and unlike fork) it works from a notebook. Windows has neither, so spawn there. The
    # preload list counts only when the server starts (the first run, or start_worker_server).
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__, *preload])
        return context
    return multiprocessing.get_context("spawn")


def start_worker_server(preload=WORKER_PRELOAD) -> None:
    """Start the process that :func:`run_workers` forks its workers from, and return at once.

    The server imports torch, this library and the modules in ``preload`` on its own, in the
    background (seconds); a notebook that calls this early finds it ready when it first calls
    :func:`run_workers`, instead of waiting for those imports then. A worker imports anything else
    it needs itself, so a notebook whose workers need less can preload less: the default is what
    the course's experiments use. Calling it again does nothing while the server runs. Where
    workers are spawned rather than forked from a server (Windows), it does nothing.
    """
    if isinstance(preload, str) or not all(isinstance(name, str) for name in preload):
        raise TypeError(f"preload takes a list of module names, got {preload!r}")
    if _context(tuple(preload)).get_start_method() == "forkserver":
        multiprocessing.forkserver.ensure_running()


def _worker(rank, world_size, port, backend, timeout, fn, args, writer):
    """The body of each worker process: join the group, run fn, send back the outcome.

    The outcome is ``(time, error, result)``: when it was sent, the traceback or None, and fn's
    return value. It is pickled here, so tensors travel by value.
    """
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)  # the workers share the machine's cores
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout))
        message = pickle.dumps((time.time(), None, fn(rank, world_size, *args)))
    except BaseException:
        message = pickle.dumps((time.time(), traceback.format_exc(), None))
    # Sent before the group is destroyed: a rank that fails is heard from before the ranks that
    # fail because of it (they notice only when its connections close).
    writer.send_bytes(message)
    writer.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def _check_importable(fn) -> None:
    qualname = getattr(fn, "__qualname__", "")
    if not callable(fn):
        raise TypeError(f"run_workers takes a function, not {type(fn).__name__}")
    if getattr(fn, "__module__", None) == "__main__" or "<" in qualname:
        raise TypeError(
            f"run_workers cannot send {qualname or fn!r} to the workers: each worker process "
            "imports the function by name, so it must be defined at the top level of an "
            "importable module (a .py file), not in a notebook, a script's __main__, a lambda "
            "or another function")


def run_workers(fn, world_size: int, *args, backend: str | None = None,
                timeout: float = 120.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes joined in a process group.

    Each process sets ``MASTER_ADDR=127.0.0.1`` and ``MASTER_PORT`` (a free port chosen now),
    calls ``torch.distributed.init_process_group``, runs ``fn``, and destroys the group. The
    return values come back to the caller, pickled, as a list in rank order.

    ``fn`` and everything in ``args`` are pickled too, and the workers import ``fn`` by name: it
    must live at the top level of an importable module, which is why the chapter's experiments
    are functions of this module rather than of the notebook. From a script, call this under
    ``if __name__ == "__main__":``, since the workers import the script as well.

    Args:
        fn: the function each rank runs; it may use ``torch.distributed`` freely.
        world_size: number of processes (ranks), at least 1.
        backend: ``"gloo"`` or ``"nccl"``; by default :func:`default_backend`. Under NCCL, rank
            ``r`` uses GPU ``r``: put tensors on :func:`rank_device`.
        timeout: seconds for the whole run, and for each collective inside it.

    Raises:
        WorkerError: a rank raised or died. The message names the rank that failed first, with
            its traceback; the other ranks, which may be waiting for it inside a collective,
            are stopped.
        TimeoutError: the ranks did not all finish within ``timeout``; all are stopped.
    """
    _check_importable(fn)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    backend = backend or default_backend(world_size)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"the nccl backend needs one GPU per rank: {world_size} ranks, "
                         f"{torch.cuda.device_count()} GPUs; use backend='gloo'")

    context, port = _context(), free_port()
    workers, readers, outcomes = [], [], {}
    try:
        for rank in range(world_size):
            reader, writer = context.Pipe(duplex=False)
            worker = context.Process(target=_worker, daemon=True, args=(
                rank, world_size, port, backend, timeout, fn, args, writer))
            worker.start()
            writer.close()  # keep only the reading end: it reports EOF if the worker dies
            workers.append(worker)
            readers.append(reader)
        outcomes = _collect(readers, workers, timeout)
    finally:
        succeeded = len(outcomes) == world_size and not any(e for _, e, _ in outcomes.values())
        for worker in workers:  # after a success they exit by themselves; otherwise stop them
            worker.join(timeout=5 if succeeded else 0.2)
            if worker.is_alive():
                worker.kill()
                worker.join()
        for reader in readers:
            reader.close()

    failures = sorted((sent, rank, error) for rank, (sent, error, _) in outcomes.items() if error)
    if failures:
        _, rank, error = failures[0]
        later = [r for _, r, _ in failures[1:]]
        also = f" (then ranks {later}, probably in consequence)" if later else ""
        raise WorkerError(f"rank {rank} of {world_size} failed{also}:\n{error}")
    if len(outcomes) < world_size:
        waiting = [rank for rank in range(world_size) if rank not in outcomes]
        raise TimeoutError(f"ranks {waiting} did not finish within {timeout} s; all were stopped")
    return [outcomes[rank][2] for rank in range(world_size)]


def _collect(readers, workers, timeout) -> dict:
    """Each rank's outcome ``(time, error, result)``, as they arrive: all of them, or what has
    arrived by the deadline, which moves to one second after the first failure."""
    outcomes, pending = {}, dict(zip(readers, range(len(readers))))
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for reader in multiprocessing.connection.wait(list(pending), deadline - time.monotonic()):
            rank = pending.pop(reader)
            try:
                outcomes[rank] = pickle.loads(reader.recv_bytes())
            except EOFError:  # died without a word (killed, os._exit): when is unknown, and it
                workers[rank].join(timeout=1)  # is more likely a cause than a consequence
                outcomes[rank] = (0.0, f"the process died (exit code {workers[rank].exitcode}) "
                                  "before returning a result; its standard error says why",
                                  None)
        if any(error for _, error, _ in outcomes.values()):
            deadline = min(deadline, time.monotonic() + 1.0)
    return outcomes


# ---------------------------------------------------------------------------------------------
# What each rank holds

@functools.lru_cache(maxsize=1)
def _digits_train():
    from mpcourse.workloads import load_digits
    return load_digits()[0]


def local_gradient(rank: int, *, kind: str = "digits", step: int = 0, seed: int = 0,
                   batch_size: int = 32, device="cpu") -> torch.Tensor:
    """The FP32 gradient vector rank ``rank`` holds at ``step``, the same in every process.

    ``kind="digits"``: the gradient of the mean cross-entropy of a ``DigitsMLP`` (weights drawn
    from ``seed``, the same on every rank, as in data parallelism) on this rank's own mini-batch
    of ``batch_size`` training digits, drawn from ``(seed, step, rank)``; 26,122 values.
    ``kind="lognormal"``: 4,096 values with random signs and magnitudes ``2**z``, ``z`` normal
    with mean -10 and standard deviation 2: a synthetic gradient spanning a dozen binades.
    """
    if kind == "lognormal":
        draw = torch.Generator().manual_seed(_draw_seed(rank, step, seed))
        magnitude = torch.exp2(-10 + 2 * torch.randn(4096, generator=draw))
        sign = torch.where(torch.rand(4096, generator=draw) < 0.5, -1.0, 1.0)
        return (sign * magnitude).to(device)
    _check_kind(kind)
    x, y = rank_batch(rank, step=step, seed=seed, batch_size=batch_size)
    model = digits_model(seed).to(device)
    F.cross_entropy(model(x.to(device)), y.to(device)).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def _check_kind(kind) -> None:
    if kind not in ("digits", "lognormal"):
        raise ValueError(f"kind must be 'digits' or 'lognormal', got {kind!r}")


def _draw_seed(rank: int, step: int, seed: int) -> int:
    return 1_000_003 * seed + 1009 * step + rank


def rank_batch(rank: int, *, step: int = 0, seed: int = 0, batch_size: int = 32):
    """Rank ``rank``'s mini-batch ``(x, y)`` of training digits at ``step``, drawn from
    ``(seed, step, rank)``."""
    train = _digits_train()
    draw = torch.Generator().manual_seed(_draw_seed(rank, step, seed))
    index = torch.randperm(len(train), generator=draw)[:batch_size]
    return train.x[index], train.y[index]


def digits_model(seed: int = 0):
    """The ``DigitsMLP`` every rank starts from, its weights drawn from ``seed`` (the global
    random state is left as it was)."""
    from mpcourse.workloads import DigitsMLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DigitsMLP()


# ---------------------------------------------------------------------------------------------
# The all-reduce, real and emulated

def _wire_dtype(wire) -> torch.dtype:
    name = get_format(wire).name
    if name not in WIRE_DTYPES:
        raise ValueError(f"the wire format must be one of {', '.join(WIRE_DTYPES)}, got {wire!r}")
    return WIRE_DTYPES[name]


def split_factors(world_size: int) -> tuple[int, int]:
    """``(before, after)``: divide by ``before`` before the sum and by ``after`` after it, as
    PyTorch's FSDP2 does for FP16 reductions (``_get_gradient_divide_factors``): ``before``
    doubles from 1 while it divides ``N`` and ``N / before > before``. For ``N`` a power of two
    that is the smallest power of two with ``before >= N / before``, the larger factor first
    (``N = 8``: ``(4, 2)``), so the sum grows at most ``sqrt(N)``-fold and values sink
    ``log2(before) >= log2(N) / 2`` binades; otherwise the doubling stops at the power of two in
    ``N`` (``N = 1000``: ``(16, 62.5)``)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive whole number of ranks, got {world_size!r}")
    before = 1
    while world_size % before == 0 and world_size / before > before:
        before *= 2
    return before, world_size / before


def allreduce_mean(gradient: torch.Tensor, wire="fp32", *, averaging: str = "divide_then_sum",
                   group=None) -> torch.Tensor:
    """The mean of ``gradient`` over the ranks of ``group``, communicated in ``wire`` format.

    Every rank calls it with its own FP32 gradient and gets the same FP32 mean back. The
    gradient is cast to the wire dtype (FP32, FP16 or BF16), all-reduced with SUM, and cast back.
    Where the division by ``N`` happens is ``averaging``:

    - ``"sum_then_divide"``: ``(sum_r fl(g_r)) / N``. The partial sums can overflow FP16.
    - ``"divide_then_sum"``: ``sum_r fl(g_r / N)``, as PyTorch DDP and its FP16/BF16
      compression hooks do. No overflow, but every value sinks ``log2(N)`` binades toward
      underflow.
    - ``"split"``: divide by ``before`` first and by ``after`` last, :func:`split_factors`.
    - ``"reduce_op_avg"``: ``ReduceOp.AVG``, whatever the backend makes of it (gloo sums, then
      divides in the wire dtype; NCCL multiplies each contribution by ``1/N`` first).

    Infinities and NaNs travel through, as in any all-reduce: a loss scaler downstream must see
    them.
    """
    if averaging not in AVERAGING:
        raise ValueError(f"averaging must be one of {', '.join(AVERAGING)}, got {averaging!r}")
    _check_gradient(gradient)
    dtype, n = _wire_dtype(wire), dist.get_world_size(group)
    before, after = {"sum_then_divide": (1, n), "divide_then_sum": (n, 1),
                     "split": split_factors(n), "reduce_op_avg": (1, 1)}[averaging]
    message = (gradient.float() / before).to(dtype)
    op = dist.ReduceOp.AVG if averaging == "reduce_op_avg" else dist.ReduceOp.SUM
    dist.all_reduce(message, op=op, group=group)
    return message.float() / after


def _check_gradient(gradient) -> None:
    if not isinstance(gradient, torch.Tensor) or not gradient.is_floating_point():
        raise TypeError(f"a gradient is a floating-point tensor, not "
                        f"{getattr(gradient, 'dtype', type(gradient).__name__)}")
    if gradient.numel() == 0:
        raise ValueError("the gradient is empty: there is nothing to communicate")


def _check_rank_tensors(tensors, what: str) -> None:
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{what} takes a non-empty list of tensors, one per rank")
    for t in tensors:
        _check_gradient(t)
    if any(t.shape != tensors[0].shape for t in tensors):
        raise ValueError("every rank's tensor must have the same shape")


def _allreduce_sum_worker(rank, world_size, tensors, wire):
    message = tensors[rank].to(rank_device(), WIRE_DTYPES[wire], copy=True)
    dist.all_reduce(message)
    return message.float().cpu() if rank == 0 else None


def allreduce_sum(tensors, wire="fp32", *, backend=None) -> torch.Tensor:
    """All-reduce SUM for real: rank ``r`` of ``len(tensors)`` processes casts ``tensors[r]`` to
    the wire format and calls ``torch.distributed.all_reduce``. Returns the sum (float32), as
    every rank receives it."""
    _check_rank_tensors(tensors, "allreduce_sum")
    wire = get_format(wire).name
    _wire_dtype(wire)
    tensors = [t.detach().cpu() for t in tensors]
    return run_workers(_allreduce_sum_worker, len(tensors), tensors, wire, backend=backend)[0]


def gloo_ring_order(numel: int, element_size: int, world_size: int) -> torch.Tensor:
    """For each element, the rank whose value starts its sum in gloo's ring all-reduce.

    Gloo cuts the message into ``S`` segments (``S`` a multiple of ``N``, at least ``2N``, each at
    most 1 MiB); rank ``r`` finishes chunk ``r``, the ``r``-th run of ``S / N`` segments. The sum
    of an element in chunk ``c`` starts from rank ``c - 1``'s value and picks up ranks
    ``c - 2, c - 3, ...`` down to ``c`` (indices modulo ``N``), one rounded addition per hop.

    This is gloo's TCP ring, which PyTorch's gloo backend runs for processes started as
    :func:`run_workers` starts them (checked bit for bit by :func:`allreduce_error`). Some gloo
    builds add a shared-memory path for ranks that torchrun starts on one node; it adds the
    ranks in order 0, 1, ..., N - 1 instead.
    """
    max_segment = 2**20 // element_size * element_size
    total = numel * element_size
    segments = max(math.ceil(total / max_segment), 2 * world_size)
    segments = math.ceil(segments / world_size) * world_size
    segment_bytes = math.ceil(math.ceil(total / segments) / element_size) * element_size
    chunk = (torch.arange(numel) * element_size // segment_bytes) // (segments // world_size)
    return (chunk - 1) % world_size


def ring_allreduce_reference(tensors, wire="fp16") -> torch.Tensor:
    """What a ring all-reduce SUM of ``tensors`` (one per rank) returns in ``wire`` format,
    computed locally and exactly, in gloo's order (:func:`gloo_ring_order`)::

        s = fl(x_first);  then for each next rank r:  s = fl(s + fl(x_r))

    where ``fl`` rounds to the wire format (each addition is done exactly, then rounded once, as
    IEEE arithmetic does; infinities and NaNs propagate). Returns float32, shaped like the inputs.
    """
    _check_rank_tensors(tensors, "ring_allreduce_reference")
    fmt = get_format(wire)
    dtype = _wire_dtype(fmt)
    n = len(tensors)
    values = torch.stack([round_to(t.detach().reshape(-1).cpu().double(), fmt) for t in tensors])
    first = gloo_ring_order(values.shape[1], torch.finfo(dtype).bits // 8, n)
    columns = torch.arange(values.shape[1])
    total = values[first, columns].double()
    for hop in range(1, n):
        total = round_to(total + values[(first - hop) % n, columns].double(), fmt)
    return total.float().reshape(tensors[0].shape)


def ring_traffic_bytes(message_bytes: float, world_size: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce: ``2 (N - 1) / N * message``.

    Half of it is the reduce-scatter (``N - 1`` steps of one chunk of ``message / N``), half the
    all-gather that hands the finished chunks around.
    """
    return 2 * (world_size - 1) / world_size * message_bytes


@functools.cache
def _ring_chunks(numel: int, element_size: int, world_size: int):
    """gloo's chunks: the rank each starts at and its length (they depend on the sizes only)."""
    first, lengths = torch.unique_consecutive(gloo_ring_order(numel, element_size, world_size),
                                              return_counts=True)
    return list(zip(first.tolist(), lengths.tolist()))


def ring_sum(gradients: torch.Tensor, wire="fp32") -> torch.Tensor:
    """gloo's ring all-reduce SUM of ``gradients`` (one row per rank), emulated with torch's own
    additions in the wire dtype: each chunk's sum starts at its own rank and goes round the ring,
    each addition rounded as gloo's are. Equal to :func:`ring_allreduce_reference`, and faster."""
    values, n = gradients.to(_wire_dtype(wire)), len(gradients)
    sums, start = [], 0
    for rank, length in _ring_chunks(values.shape[1], values.element_size(), n):
        chunk = values[:, start:start + length]
        total = chunk[rank]
        for hop in range(1, n):
            total = total + chunk[(rank - hop) % n]
        sums.append(total)
        start += length
    return torch.cat(sums).float()


def train_data_parallel(wire="fp32", seed: int = 0, *, ranks: int = 8, steps: int = 100,
                        lr: float = 0.5) -> float:
    """Data-parallel SGD on the digits MLP, emulated in one process: each of ``ranks`` ranks
    computes the gradient of its own batch (:func:`rank_batch`), divides it by ``ranks`` as DDP
    does, and the ranks' gradients are summed by :func:`ring_sum` in ``wire``. Returns the test
    loss after ``steps`` steps; ``seed`` sets the initial weights and the batches."""
    from torch.func import functional_call, grad, vmap

    from mpcourse.workloads import load_digits

    model = digits_model(seed)
    params = {name: p.detach() for name, p in model.named_parameters()}
    loss = lambda params, x, y: F.cross_entropy(functional_call(model, params, (x,)), y)
    rank_gradients = vmap(grad(loss), in_dims=(None, 0, 0))  # all ranks' gradients in one call
    for step in range(steps):
        x, y = (torch.stack(b) for b in zip(*(rank_batch(r, step=step, seed=seed) for r in range(ranks))))
        g = rank_gradients(params, x, y)
        mean = ring_sum(torch.cat([g[name].flatten(1) for name in params], 1) / ranks, wire)
        for p, chunk in zip(params.values(), mean.split([p.numel() for p in params.values()])):
            p -= lr * chunk.view_as(p)  # SGD
    test = load_digits()[1]
    with torch.no_grad():
        return F.cross_entropy(functional_call(model, params, (test.x,)), test.y).item()


# ---------------------------------------------------------------------------------------------
# Experiments: each is one launch of processes, and returns plain results to the caller.

def relative_error(result: torch.Tensor, exact: torch.Tensor) -> float:
    """``||result - exact|| / ||exact||`` (2-norms, in float64); inf if ``result`` is not finite."""
    result, exact = result.double().cpu(), exact.double().cpu()
    if not bool(torch.isfinite(result).all()):
        return math.inf
    return (torch.linalg.vector_norm(result - exact) / torch.linalg.vector_norm(exact)).item()


@dataclass(frozen=True)
class AllreduceError:
    """One all-reduce SUM, measured: ``relative_error`` of the wire-format sum against the exact
    (float64) sum of the FP32 inputs; ``cast_error`` the part due to rounding the inputs alone
    (the exact sum of the rounded inputs); ``matches_ring`` whether the real all-reduce equals
    :func:`ring_allreduce_reference` bit for bit."""

    world_size: int
    wire: str
    relative_error: float
    cast_error: float
    matches_ring: bool


def _allreduce_error_worker(rank, world_size, world_sizes, wires, kind, seed):
    gradient = local_gradient(rank, kind=kind, seed=seed, device=rank_device())
    sums = {}
    for n in world_sizes:
        group = dist.new_group(list(range(n)))  # every rank takes part in creating every group
        if rank < n:
            for wire in wires:
                message = gradient.to(WIRE_DTYPES[wire], copy=True)
                dist.all_reduce(message, group=group)
                sums[n, wire] = message.float().cpu()
    return gradient.cpu(), sums if rank == 0 else None


def allreduce_error(world_sizes=(2, 4, 8), wires=("fp32", "fp16", "bf16"), *, kind="digits",
                    seed=0, backend=None) -> list[AllreduceError]:
    """All-reduce SUM each rank's :func:`local_gradient` in each wire format, over groups of the
    first ``n`` ranks for each ``n`` in ``world_sizes`` (one launch of ``max(world_sizes)``
    processes), and measure each result against the float64 sum computed here."""
    world_sizes, wires = tuple(world_sizes), tuple(get_format(w).name for w in wires)
    for wire in wires:
        _wire_dtype(wire)
    _check_kind(kind)
    if not world_sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                              for n in world_sizes):
        raise ValueError(f"world_sizes must be whole numbers >= 1, got {world_sizes!r}")
    results = run_workers(_allreduce_error_worker, max(world_sizes), world_sizes, wires, kind, seed,
                          backend=backend)
    inputs, sums = [gradient for gradient, _ in results], results[0][1]
    rows = []
    for n in world_sizes:
        exact = torch.stack(inputs[:n]).double().sum(0)
        for wire in wires:
            rounded = torch.stack([round_to(g.double(), wire) for g in inputs[:n]]).double().sum(0)
            rows.append(AllreduceError(
                n, wire, relative_error(sums[n, wire], exact), relative_error(rounded, exact),
                torch.equal(sums[n, wire], ring_allreduce_reference(inputs[:n], wire))))
    return rows


@dataclass(frozen=True)
class AveragingResult:
    """The mean of N ranks' gradients in one wire format with one ``averaging`` strategy:
    how many values came out inf or NaN, how many non-zero means came out as zero, and the
    relative error against the exact mean (inf when anything overflowed)."""

    averaging: str
    nonfinite: int
    flushed_to_zero: int
    relative_error: float


def _overflow_worker(rank, world_size, scale, wire, seed):
    gradient = local_gradient(rank, seed=seed, device=rank_device()) * scale
    means = {averaging: allreduce_mean(gradient, wire, averaging=averaging).cpu()
             for averaging in AVERAGING}
    return gradient.cpu(), means if rank == 0 else None


def overflow_experiment(world_size: int = 8, scale: float = 1.0, wire="fp16", *, seed=0,
                        backend=None) -> list[AveragingResult]:
    """Average ``scale`` times each rank's digits gradient over ``world_size`` ranks with each
    strategy of :func:`allreduce_mean` (one launch), against the exact mean computed here."""
    wire = get_format(wire).name
    _wire_dtype(wire)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    results = run_workers(_overflow_worker, world_size, float(scale), wire, seed, backend=backend)
    exact = torch.stack([gradient for gradient, _ in results]).double().mean(0)
    rows = []
    for averaging, mean in results[0][1].items():
        rows.append(AveragingResult(averaging, int((~torch.isfinite(mean)).sum()),
                                    int(((mean == 0) & (exact != 0)).sum()),
                                    relative_error(mean, exact)))
    return rows


@dataclass(frozen=True)
class FeedbackResult:
    """Error feedback over the steps: for each variant (``"without feedback"``, ``"with
    feedback"``), ``accumulated_error[variant][t]`` is ``||what was communicated up to step t -
    the exact sum up to step t||``, and ``exact_norm[t]`` the norm of that exact sum (summed over
    ranks and steps); ``step_error[variant][t]`` is the norm of step t's own error (what was
    communicated at step t minus that step's exact sum); ``never_sent[variant]`` counts the values
    whose communicated total is still zero at the end although their exact total is not.

    ``planted``: with :func:`error_feedback`'s ``planted``, each rank appends one component that
    is always that fraction of its largest gradient value; ``planted[variant][t]`` is the error of
    that component's total up to step t, relative to its exact total (1.0: nothing of it arrived).
    Empty without a planted component."""

    accumulated_error: dict
    exact_norm: list
    never_sent: dict
    step_error: dict = field(default_factory=dict)
    planted: dict = field(default_factory=dict)


def _gather_sums(messages, world_size) -> list[torch.Tensor]:
    """All-gather every rank's FP8 messages (codes and scale) in one go, and return for each
    message the FP32 sum of all ranks' decoded values (in rank order, the same on every rank)."""
    # gloo has no float8 dtype: send the bytes. The 4-byte scales go first, to stay aligned.
    packed = torch.cat([q.scale.reshape(1).view(torch.uint8) for q in messages] +
                       [q.data.view(torch.uint8) for q in messages])
    received = [torch.empty_like(packed) for _ in range(world_size)]
    dist.all_gather(received, packed)
    sums, offset = [], 4 * len(messages)
    for i, q in enumerate(messages):
        total = torch.zeros(q.data.shape, dtype=torch.float32, device=packed.device)
        for buffer in received:
            scale = buffer[4 * i:4 * i + 4].view(torch.float32)
            total += buffer[offset:offset + q.data.numel()].view(q.data.dtype).float() / scale
        sums.append(total)
        offset += q.data.numel()
    return sums


def _error_feedback_worker(rank, world_size, steps, fmt, seed, planted):
    from mpcourse.fp8 import quantize

    residual = None
    variants = ("without feedback", "with feedback")
    sent = dict.fromkeys(variants, 0.0)
    sent_history, own_history, own_total = {name: [] for name in variants}, [], 0.0
    for step in range(steps):
        gradient = local_gradient(rank, step=step, seed=seed, device=rank_device())
        if planted is not None:  # one more component, always this fraction of the largest value
            gradient = torch.cat([gradient, planted * gradient.abs().max().reshape(1)])
        corrected = gradient if residual is None else gradient + residual
        plain, fed = quantize(gradient, fmt), quantize(corrected, fmt)
        residual = corrected - fed.dequantize()  # what was not sent: send it next time
        for name, total in zip(variants, _gather_sums([plain, fed], world_size)):
            sent[name] = sent[name] + total.double()
            if rank == 0:
                sent_history[name].append(sent[name])
        own_total = own_total + gradient.double()
        own_history.append(own_total)
    # The reference: each rank's exact running sum, step by step, added up across ranks in FP64.
    exact = torch.stack(own_history)
    dist.reduce(exact, dst=0)
    if rank != 0:
        return None
    result = {}
    for name in variants:
        error = torch.stack(sent_history[name]) - exact  # step t: accumulated error up to t
        per_step = torch.diff(error, dim=0, prepend=torch.zeros_like(error[:1]))
        result[name] = (torch.linalg.vector_norm(error, dim=1).cpu().tolist(),
                        torch.linalg.vector_norm(per_step, dim=1).cpu().tolist(),
                        (error[:, -1].abs() / exact[:, -1].abs()).cpu().tolist())
    never_sent = {name: int(((sent[name] == 0) & (exact[-1] != 0)).sum()) for name in variants}
    return FeedbackResult({name: r[0] for name, r in result.items()},
                          torch.linalg.vector_norm(exact, dim=1).cpu().tolist(), never_sent,
                          {name: r[1] for name, r in result.items()},
                          {name: r[2] for name, r in result.items()} if planted is not None else {})


def error_feedback(world_size: int = 4, steps: int = 50, fmt="e4m3", *, seed=0,
                   planted: float | None = None, backend=None) -> FeedbackResult:
    """Communicate digits gradients compressed to FP8 (one scale per tensor, via
    :func:`mpcourse.fp8.quantize`) for ``steps`` steps, with and without error feedback.

    The weights stay fixed (only the communication is under study), each step's gradients come
    from fresh mini-batches. With feedback, each rank adds to its gradient the residual it failed
    to send last step, ``e_t = (g_t + e_{t-1}) - decompress(compress(g_t + e_{t-1}))``, so the sum
    of what it sent up to step t is ``sum g - e_t``: the accumulated error stays the size of the
    ranks' current residuals instead of growing with t.
    The compressed messages are all-gathered (each rank has its own scale) and summed in FP32.

    ``planted``: if given, each rank appends one component equal to ``planted`` times its largest
    gradient value at every step (a small, steady gradient, such as a bias's); below the format's
    flush threshold (``2**-10 / 448`` for E4M3) it is rounded to zero at every step without
    feedback (see :attr:`FeedbackResult.planted`).
    """
    fmt = get_format(fmt)
    if planted is not None and not (isinstance(planted, (int, float)) and 0 < planted < 1):
        raise ValueError(f"planted is a fraction of the largest gradient value, 0 < planted < 1, "
                         f"got {planted!r}")
    if fmt.name not in ("e4m3", "e5m2"):
        raise ValueError(f"error_feedback compresses to FP8, 'e4m3' or 'e5m2', not {fmt.name!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    return run_workers(_error_feedback_worker, world_size, steps, fmt.name, seed,
                       None if planted is None else float(planted), backend=backend)[0]


def _throughput_worker(rank, world_size, messages, repeats):
    device = rank_device()
    buffers = {(numel, wire): torch.zeros(numel, dtype=WIRE_DTYPES[wire], device=device)
               for numel, wire in messages}
    for buffer in buffers.values():
        dist.all_reduce(buffer)  # warm up the connections and buffers
    timings = {key: [] for key in buffers}
    keys = list(buffers)
    for round_ in range(repeats):  # interleaved: every message once per round, under the same load,
        shift = round_ % len(keys)  # each round starting one message later, so that each takes every place
        for key in keys[shift:] + keys[:shift]:
            buffer = buffers[key]
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            if device.type == "cuda":
                torch.cuda.synchronize()
            timings[key].append(time.perf_counter() - start)
    return timings if rank == 0 else None


def allreduce_throughput(world_size: int = 4, messages=((2**20, "fp32"), (2**20, "fp16"), (2**20, "bf16")),
                         *, repeats: int = 15, backend=None) -> dict:
    """Seconds per all-reduce of each message ``(numel, wire)``, measured on rank 0, one call at a
    time: ``{(numel, wire): [seconds of each repeat]}``. The repeats are interleaved (one of each
    message per round), so that a change in the machine's load hits every message alike, and each
    round starts one message later than the one before, so that over ``len(messages)`` rounds each
    message runs once in every place of the round; take the median and the spread. On one
    machine with gloo this is loopback TCP through the CPU, not a network: the numbers say what
    this machine does, not what a cluster link does."""
    messages = tuple((int(numel), get_format(wire).name) for numel, wire in messages)
    for numel, wire in messages:
        _wire_dtype(wire)
        if numel < 1:
            raise ValueError(f"a message needs at least one element, got {numel}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number >= 1, got {repeats!r}")
    return run_workers(_throughput_worker, world_size, messages, repeats, backend=backend)[0]


# ---------------------------------------------------------------------------------------------
# What DistributedDataParallel puts on the wire

@dataclass(frozen=True)
class DdpWire:
    """One DDP backward pass: the model's parameter dtype, the autocast dtype (None: off), the
    dtype of the logits, of the gradients, and of the buckets DDP hands to its all-reduce."""

    parameters: str
    autocast: str | None
    logits: str
    gradients: str
    bucket: str


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _ddp_wire_worker(rank, world_size, setups):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    device, rows = rank_device(), []
    for parameters, autocast in setups:
        dtype = WIRE_DTYPES[parameters]
        ddp = DistributedDataParallel(digits_model().to(device, dtype))
        buckets = set()

        def hook(state, bucket):  # DDP's own all-reduce, after noting what the bucket holds
            buckets.add(_dtype_name(bucket.buffer().dtype))
            return allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, hook)
        x, y = rank_batch(rank)
        with torch.autocast(device.type, dtype=WIRE_DTYPES[autocast or "bf16"],
                            enabled=autocast is not None):
            logits = ddp(x.to(device, dtype))
        F.cross_entropy(logits.float(), y.to(device)).backward()
        gradients = {_dtype_name(p.grad.dtype) for p in ddp.parameters()}
        rows.append(DdpWire(parameters, autocast, _dtype_name(logits.dtype), ", ".join(sorted(gradients)),
                            ", ".join(sorted(buckets))))
    return rows if rank == 0 else None


def ddp_wire_dtypes(setups=(("fp32", None), ("fp32", "bf16"), ("fp32", "fp16"), ("bf16", None)),
                    *, world_size: int = 2, backend=None) -> list[DdpWire]:
    """What ``DistributedDataParallel`` all-reduces, for real, in ``world_size`` processes.

    ``setups``: ``(parameters, autocast)`` pairs, the model's dtype and the autocast dtype (None:
    no autocast). Each wraps the digits MLP in DDP, runs one forward (under autocast) and
    backward pass, and records the dtypes, the buckets' as DDP hands them to its communication
    hook. DDP's buckets take the gradients' dtype, and under autocast the parameters, so their
    gradients, stay FP32: autocast alone never puts 16-bit values on the wire. A 16-bit wire
    takes a communication hook (``bf16_compress_hook``), an FSDP mixed-precision policy, or a
    16-bit model.
    """
    setups = tuple((get_format(p).name, None if a is None else get_format(a).name) for p, a in setups)
    for parameters, autocast in setups:
        _wire_dtype(parameters)
        if autocast is not None and autocast not in ("fp16", "bf16"):
            raise ValueError(f"autocast runs in fp16 or bf16, not {autocast!r}")
    return run_workers(_ddp_wire_worker, world_size, setups, backend=backend)[0]
