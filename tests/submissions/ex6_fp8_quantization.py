"""Fabricated submissions for ex6_fp8_quantization, used by tests/test_exercises.py."""
# The part a "partial" submission gets right (its solution cells come from the source);
# every other part is left as released. Its score must equal exactly this part's points.
PARTIAL_PARTS = ["p2"]
# A submission whose part K merely calls mpcourse's reference: it must score 0 on part K.
# Keys are solution-cell grade_ids, values the full cell source the "student" typed. Correct
# results (the same scale and data, the same errors for bad input), from mpcourse.fp8.quantize.
REFERENCE_CALLER = {"p1_solution": '''\
def quantize_e4m3(x):
    from mpcourse.fp8 import quantize
    q = quantize(x, "e4m3", granularity="tensor")
    return q.data, q.scale


def dequantize(data, scale):
    return data.float() / scale
'''}
