"""Fabricated submissions for ex7_fp16_nan_hunt, used by tests/test_exercises.py."""
# The part a "partial" submission gets right (its solution cells come from the source);
# every other part is left as released. Its score must equal exactly this part's points.
PARTIAL_PARTS = ["p2"]
# Parts that merely call mpcourse's reference implementations (correct results, not own work):
# mpcourse.debugging.PrecisionDebugger finds the first non-finite output and output gradient with
# its own hooks. The submission must score 0 on each of these parts.
REFERENCE_CALLER = {
    "p1_solution": '''\
def first_nonfinite(model, *inputs):
    from mpcourse.debugging import ROOT, PrecisionDebugger
    debugger = PrecisionDebugger(model)
    with debugger, torch.no_grad():
        model(*inputs)
    report = debugger.first_nonfinite("forward")
    if report is None:
        return None
    return "" if report.module == ROOT else report.module
''',
    "p3_solution": '''\
def first_nonfinite_gradient(model, loss_fn, *inputs):
    from mpcourse.debugging import ROOT, PrecisionDebugger
    saved = [p.grad for p in model.parameters()]
    debugger = PrecisionDebugger(model)
    try:
        with debugger:
            loss_fn(model(*inputs)).backward()
    finally:
        for p, grad in zip(model.parameters(), saved):
            p.grad = grad
    for record in debugger.records:
        if record.phase == "backward" and record.tensor.endswith("output gradient") and not record.finite:
            return "" if record.module == ROOT else record.module
    return None
''',
}
