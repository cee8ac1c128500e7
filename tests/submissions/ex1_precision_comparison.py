"""Fabricated submissions for ex1_precision_comparison, used by tests/test_exercises.py."""
# The part a "partial" submission gets right (its solution cells come from the source);
# every other part is left as released. Its score must equal exactly this part's points.
PARTIAL_PARTS = ["p3"]
# A submission whose part K merely calls mpcourse's reference: it must score 0 on part K.
# Keys are solution-cell grade_ids, values the full cell source the "student" typed.
# This one rounds the exact product with the library's round_to instead of torch's cast: the
# numbers are right (round_to rounds float64 input once, to nearest even), the work is not theirs.
REFERENCE_CALLER = {"p4_solution": '''\
from mpcourse.formats import round_to


def error_sources(a, b, dtype):
    """The error of a @ b in `dtype`, split into its sources."""
    fmt = str(dtype).removeprefix("torch.")  # "float16", "bfloat16", "float32": format names
    exact = a.double() @ b.double()
    rounded = a.to(dtype).double() @ b.to(dtype).double()
    computed = (a.to(dtype) @ b.to(dtype)).double()
    return {
        "inputs": (rounded - exact).abs().max().item(),
        "output": (round_to(exact, fmt).double() - exact).abs().max().item(),
        "output_bound": torch.finfo(dtype).eps / 2 * exact.abs().max().item(),
        "rounded_once": (computed == round_to(rounded, fmt).double()).double().mean().item(),
    }
'''}
