"""Fabricated submissions for ex5_mixed_precision_speedup, used by tests/test_exercises.py."""
# The part a "partial" submission gets right (its solution cells come from the source);
# every other part is left as released. Its score must equal exactly this part's points.
PARTIAL_PARTS = ["p3"]
# A submission whose part K merely calls mpcourse's reference: it must score 0 on part K.
# Keys are solution-cell grade_ids, values the full cell source the "student" typed. This
# time_it is correct (warm-up first, sync before every clock reading, `repeats` samples in
# seconds), but the timing itself is mpcourse.bench.benchmark's.
REFERENCE_CALLER = {"p1_solution": '''\
def time_it(fn, *, warmup=3, repeats=10, sync=None, clock=time.perf_counter):
    from mpcourse.bench import benchmark
    if not callable(fn):
        raise TypeError("fn must be callable")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError("warmup must be an int >= 0")
    for _ in range(warmup):
        fn()

    def synced_clock():
        if sync is not None:
            sync()
        return clock()

    result = benchmark(fn, device="cpu", timer=synced_clock, repeats=repeats, warmup_ms=0)
    return [ms / 1e3 for ms in result.samples_ms]
'''}
