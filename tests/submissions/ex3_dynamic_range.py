"""Fabricated submissions for ex3_dynamic_range, used by tests/test_exercises.py."""
# The part a "partial" submission gets right (its solution cells come from the source);
# every other part is left as released. Its score must equal exactly this part's points.
PARTIAL_PARTS = ["p1"]
# A submission whose part K merely calls mpcourse's reference: it must score 0 on part K.
# Keys are solution-cell grade_ids, values the full cell source the "student" typed.
# This one classifies (and tabulates) with the library's round_to (the OCP/IEEE conversion the tests use as their
# oracle), so its fractions are right; the work is not the student's.
REFERENCE_CALLER = {"p2_solution": '''\
from mpcourse.formats import round_to


def classify(x, dtype):
    """Fractions of the elements of `x` that `dtype` stores as zero, subnormal, normal, or overflow."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError("classify takes a float32 tensor")
    if x.numel() == 0 or not bool(torch.isfinite(x).all()):
        raise ValueError("classify takes a non-empty tensor of finite values")
    stored = round_to(x, str(dtype).removeprefix("torch.")).abs()  # NaN or inf where it overflows
    overflow = ~torch.isfinite(stored)
    zero = stored == 0
    subnormal = (stored > 0) & (stored < torch.finfo(dtype).smallest_normal)
    normal = ~(zero | subnormal | overflow)
    return {kind: mask.double().mean().item() for kind, mask in
            (("zero", zero), ("subnormal", subnormal), ("normal", normal), ("overflow", overflow))}
''',
    # Part 3's table from the same call (its classify is Part 2's, so it cannot pass without round_to)
    "p3_solution": '''\
from mpcourse.formats import round_to


def range_table(x, dtypes):
    """classify's fractions plus "lost" and "max_error_normal", from the library's round_to."""
    table = {}
    for name, dtype in dtypes.items():
        row = classify(x, dtype)
        row["lost"] = row["zero"] + row["overflow"]
        info = torch.finfo(dtype)
        stored = round_to(x, str(dtype).removeprefix("torch.")).double()
        normal_range = (x.abs() >= info.smallest_normal) & (x.abs() <= info.max)
        error = (stored - x.double()).abs() / x.double().abs()
        row["max_error_normal"] = error[normal_range].max().item() if bool(normal_range.any()) else 0.0
        table[name] = row
    return table
'''}
