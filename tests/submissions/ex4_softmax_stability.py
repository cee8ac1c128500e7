"""Fabricated submissions for ex4_softmax_stability, used by tests/test_exercises.py."""
# The part a "partial" submission gets right (its solution cells come from the source);
# every other part is left as released. Its score must equal exactly this part's points.
PARTIAL_PARTS = ["p2"]
# Parts that merely call mpcourse's reference implementations (correct results, not own work):
# the submission must score 0 on each of them.
REFERENCE_CALLER = {
    "p1_solution": (
        "def naive_softmax(x, dim=-1):\n"
        "    from mpcourse.numerics import naive_softmax as reference\n"
        "    return reference(x, dim=dim)\n"),
    "p3_solution": (
        "def stable_softmax(x, dim=-1):\n"
        "    from mpcourse.numerics import stable_softmax as reference\n"
        "    return reference(x, dim=dim)\n"),
}
