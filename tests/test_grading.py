"""mpcourse.grading, the checker inside every exercise: it must fail what it claims to catch."""
import functools
import operator
import sys
import types

import numpy as np
import pytest
import torch

from mpcourse import grading, records
from mpcourse.numerics import stable_softmax


def softmax_from_primitives(x):
    shifted = x - x.max(dim=-1, keepdim=True).values
    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)


def test_own_work_returns_the_result_of_code_built_from_primitives():
    x = torch.randn(4, 5)
    assert torch.equal(grading.own_work(softmax_from_primitives, x), softmax_from_primitives(x))


def test_own_work_fails_a_function_that_calls_the_library():
    def calls_the_reference(x):
        return stable_softmax(x)

    with pytest.raises(AssertionError, match="calls the course library.*stable_softmax"):
        grading.own_work(calls_the_reference, torch.randn(3, 4))


def test_own_work_sees_through_aliases_and_subclasses():
    from mpcourse.scaling import DynamicLossScaler as Renamed

    class MyScaler(Renamed):
        pass

    with pytest.raises(AssertionError, match="calls the course library"):
        grading.own_work(MyScaler)


def test_own_work_restores_the_previous_profiler():
    hook = lambda frame, event, arg: None  # noqa: E731
    sys.setprofile(hook)
    try:
        grading.own_work(softmax_from_primitives, torch.randn(2, 2))
        after = sys.getprofile()
    finally:
        sys.setprofile(None)
    assert after is hook


def test_a_signal_handler_of_the_answers_fails_own_work_whenever_it_was_set():
    """Review 72: a Python signal handler runs wherever its signal arrives, inside the watcher's own
    callback too, where nothing is profiled: a timer every 0.5 ms and a handler that computed the
    library's softmax there went unseen. A handler of the answer's fails the part, set before the
    call or inside it; the packages' and the standard library's own handlers do not."""
    import logging
    import signal

    def answer(x):
        for _ in range(2000):
            x = x + 0.0
        return x

    def handler(signum, frame):
        stolen.append(stable_softmax(torch.randn(4)))

    def sets_and_resets(x):
        signal.signal(signal.SIGUSR1, handler)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        return x

    stolen = []
    try:
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
        with pytest.raises(AssertionError, match="a signal handler of yours was set"):
            grading.own_work(answer, torch.zeros(4))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    with pytest.raises(AssertionError, match="a signal handler of yours was set"):
        grading.own_work(sets_and_resets, 1.0)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    try:
        signal.signal(signal.SIGUSR2, logging.shutdown)  # a Python handler of the standard library's
        assert grading.own_work(answer, torch.zeros(4)).sum() == 0
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_own_work_notices_when_its_watcher_is_switched_off():
    def switches_it_off():
        sys.setprofile(None)
        from mpcourse.display import pow2
        return pow2(1.0)

    with pytest.raises(AssertionError, match="switched off"):
        grading.own_work(switches_it_off)


def test_start_and_passed_accept_an_untouched_session(capsys):
    grading.start("Part 9")
    grading.passed("Part 9")
    assert "Part 9" in capsys.readouterr().out


@pytest.mark.parametrize("owner, name, fake", [
    (np, "allclose", lambda *a, **k: True),
    (np.testing, "assert_allclose", lambda *a, **k: None),
    (torch, "allclose", lambda *a, **k: True),
    (torch.testing, "assert_close", lambda *a, **k: None),
    (torch.Tensor, "__eq__", lambda self, other: True),
    (grading, "assert_close", lambda *a, **k: None),
    (grading, "own_work", lambda f, *a, **k: f(*a, **k)),
    (grading, "raises", lambda *a, **k: None),
    (grading, "closeness_problem", lambda *a, **k: None),  # the messages live in mpcourse.records (issue 52)
    (records, "_differ", lambda expected, actual: ("1", "1")),
    (records, "np", types.SimpleNamespace()),  # red team 14, T3: a numpy proxy in mpcourse.records
    (records, "sys", types.SimpleNamespace(modules={})),  # T1
    (grading, "np", types.SimpleNamespace()),  # T4
    (sys.modules, "torch", types.SimpleNamespace()),  # T2: what records tensors with
    (grading, "same_data", lambda expected, got: True),  # T5: assert_equal's comparison
])
def test_start_refuses_a_session_where_a_function_the_tests_use_was_replaced(monkeypatch, owner, name, fake):
    (monkeypatch.setitem if isinstance(owner, dict) else monkeypatch.setattr)(owner, name, fake)
    with pytest.raises(grading.TamperingError, match=name):
        grading.start("Part 1")


def test_a_replacement_made_before_the_checker_was_imported_is_caught():
    assert grading._is_genuine(np.allclose) and grading._is_genuine(torch.allclose)
    assert grading._is_genuine(torch.testing.assert_close) and grading._is_genuine(len)
    assert not grading._is_genuine(lambda *a, **k: True)


def test_assert_close_accepts_equal_values_and_names_the_difference():
    grading.assert_close(torch.tensor([1.0, float("inf"), float("nan")]),
                         np.array([1.0, np.inf, np.nan]))
    with pytest.raises(AssertionError, match=r"differs .* by up to 0\.5"):
        grading.assert_close(np.array([1.0, 2.5]), np.array([1.0, 2.0]), what="x")
    with pytest.raises(AssertionError, match="shape"):
        grading.assert_close(np.zeros(3), np.zeros(4))
    with pytest.raises(AssertionError, match="NaN"):
        grading.assert_close(np.array([np.nan]), np.array([0.0]))
    with pytest.raises(AssertionError, match="infinities"):
        grading.assert_close(np.array([-np.inf]), np.array([np.inf]))
    with pytest.raises(AssertionError, match="should be a number"):
        grading.assert_close("1.0", 1.0)


def test_a_complex_tensor_is_compared_by_its_real_and_imaginary_parts():
    """Review 79: recorded as magnitudes, z, conj(z) and 1j*z were one value."""
    from mpcourse import records
    z = torch.tensor([1 + 2j, -3 + 0.5j])
    grading.assert_close(z.conj(), torch.tensor([1 - 2j, -3 - 0.5j]))  # a lazy conjugate is read as its values
    for wrong in (z.conj(), 1j * z, -z.conj()):
        with pytest.raises(AssertionError, match="differs"):
            grading.assert_close(wrong, z)
        assert not records.same_data(records.data(z), records.data(wrong))
    assert records.same_data(records.data(z), records.data(z.clone()))


def test_a_value_nested_too_deeply_to_record_equals_nothing():
    """Review 81: recorded as "nested too deeply", any two such values were equal."""
    from mpcourse import records

    def nested(x, depth=10):
        return x if depth == 0 else [nested(x, depth - 1)]
    assert not records.same_data(records.data(nested(1)), records.data(nested(2)))
    assert not records.same_data(records.data(nested(1)), records.data(nested(1)))
    assert records.same_data(records.data(nested(1, 8)), records.data(nested(1, 8)))
    with pytest.raises(AssertionError, match="too large to compare"):
        grading.assert_equal(nested(1), nested(2))


def test_a_long_string_is_compared_whole_and_a_long_list_matches_nothing():
    """Review 83: only the first 1,000 characters and 10,000 items were recorded, so values that
    differ past them were equal."""
    from mpcourse import records
    text = "x" * 1000
    assert not records.same_data(records.data(text + "a"), records.data(text + "b"))
    assert records.same_data(records.data(text + "a"), records.data(text + "a"))
    grading.assert_equal(text + "a", text + "a")
    items = list(range(10_001))
    assert not records.same_data(records.data(items), records.data(items[:-1] + [0]))
    assert not records.same_data(records.data(items), records.data(items))  # too long to compare at all
    assert records.same_data(records.data(items[:10_000]), records.data(items[:10_000]))
    with pytest.raises(AssertionError, match="too large to compare"):
        grading.assert_equal({i: 0 for i in items}, {i: 0 for i in items})


def test_torchs_own_wrappers_are_not_tampering():
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # imports torch._dynamo, which wraps manual_seed
    grading.start("Part 1")


def test_a_wrapper_written_in_a_notebook_is_tampering(monkeypatch):
    import functools
    original = np.allclose

    @functools.wraps(original)
    def always_true(*args, **kwargs):
        return True

    monkeypatch.setattr(np, "allclose", always_true)
    with pytest.raises(grading.TamperingError, match="allclose"):
        grading.start("Part 1")


def test_own_work_sees_a_watcher_switched_off_and_restored():
    def sneaky(x):
        saved = sys.getprofile()
        sys.setprofile(None)
        try:
            return stable_softmax(x)
        finally:
            sys.setprofile(saved)

    with pytest.raises(AssertionError, match="switched off"):
        grading.own_work(sneaky, torch.randn(2, 3))


@pytest.mark.parametrize("call", [lambda x: torch.softmax(x, 0), lambda x: x.softmax(0),
                                  lambda x: torch.nn.functional.softmax(x, dim=0),
                                  lambda x: torch.special.softmax(x, 0),
                                  lambda x: torch._softmax(x, 0, False),
                                  lambda x: torch.ops.aten._softmax.default(x, 0, False),
                                  lambda x: torch.ops.aten.softmax.int(x, 0),
                                  # attention computes a softmax under another name (red team 45d A01):
                                  # softmax(x) = attention(q=0, k=0, v=I, mask=x)
                                  lambda x: torch.nn.functional.scaled_dot_product_attention(
                                      torch.zeros(1, 1, 3, 1), torch.zeros(1, 1, 3, 1), torch.eye(3)[None, None],
                                      attn_mask=x.expand(3, 3)[None, None]),
                                  lambda x: torch.nn.MultiheadAttention(1, 1)(x[:, None, None], x[:, None, None],
                                                                               x[:, None, None]),
                                  # red team 16f (F1, F5, F6): C code calls it, which no Python profiler sees;
                                  # the dispatcher sees every operation that runs
                                  lambda x: next(map(torch.softmax, [x], [0])),
                                  lambda x: functools.reduce(torch.softmax, [x, 0]),
                                  lambda x: operator.methodcaller("softmax", 0)(x),
                                  lambda x: torch.jit.script(_scripted_softmax)(x),  # TorchScript's interpreter
                                  # inside another operation: each target's probability is exp(-cross-entropy)
                                  lambda x: torch.exp(-torch.nn.functional.cross_entropy(
                                      x.expand(3, 3), torch.arange(3), reduction="none")),
                                  # review 91: a nested-tensor operation whose kernel runs the softmax unseen
                                  lambda x: torch._nested_tensor_softmax_with_shape(
                                      x[None, None, None, :].expand(1, 1, 3, 3).clone(),
                                      torch.nested.nested_tensor([x.new_zeros(3, 1)]))])
def test_a_part_can_forbid_a_torch_function(call):
    grading.start("Part 9", forbidden=("softmax",))
    try:
        with pytest.raises(AssertionError, match="(softmax|scaled_dot_product).*asks you not to use"):
            grading.own_work(call, torch.randn(3))
    finally:
        grading.start("Part 9")
    grading.own_work(call, torch.randn(3))  # allowed where the part forbids nothing


def _scripted_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, 0)


def test_an_honest_answer_under_the_dispatch_watcher_gives_what_it_gives_alone():
    grading.start("Part 9", forbidden=("softmax", "log_softmax"))
    try:
        x = torch.randn(4, 5, requires_grad=True)
        y = grading.own_work(softmax_from_primitives, x)
        y.sum().backward()  # autograd works through it
        assert torch.equal(y, softmax_from_primitives(x)) and x.grad is not None
    finally:
        grading.start("Part 9")


def test_taking_the_forbidden_list_or_the_profiler_functions_away_fails_the_part():
    """Red team 16f, F2 and F7: a forbidden set whose update ignores the names, and sys.setprofile
    replaced by a fake that keeps what it is given."""
    grading.start("Part 9", forbidden=("softmax",))
    try:
        with pytest.raises(AttributeError):  # start() makes a new frozen set each part: nothing to update
            grading._forbidden.update({"x"})
        vars(grading)["_forbidden"] = set()  # not the frozen set start() made
        with pytest.raises(AssertionError, match="forbidden functions were replaced"):
            grading.own_work(softmax_from_primitives, torch.randn(3))
    finally:
        grading.start("Part 9")
    grading.start("Part 9", forbidden=("softmax",))
    real = sys.setprofile
    vars(sys)["setprofile"] = lambda function: None
    try:
        with pytest.raises(AssertionError, match="softmax.*asks you not to use"):  # the watcher is installed all the same
            grading.own_work(lambda x: torch.softmax(x, 0), torch.randn(3))
        with pytest.raises(grading.TamperingError, match="sys.setprofile"):
            grading.passed("Part 9")
    finally:
        vars(sys)["setprofile"] = real
        grading.start("Part 9")


def test_a_tensor_is_recorded_as_it_is_whatever_its_methods_were_replaced_with():
    """Red team 16f, F8: Tensor.detach replaced recorded what it chose (softmax of the answer)."""
    from mpcourse import records
    x = torch.tensor([1.0, 2.0, 3.0])
    honest = records.data(x)
    saved = {name: vars(torch.Tensor).get(name) for name in ("detach", "dtype")}
    torch.Tensor.detach = lambda self: torch.softmax(self, 0)
    torch.Tensor.dtype = property(lambda self: torch.float64)
    try:
        assert records.data(x) == honest
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, value)


def test_a_mode_left_on_does_not_change_what_is_recorded():
    from torch.utils._python_dispatch import TorchDispatchMode
    from mpcourse import records

    class Normalise(TorchDispatchMode):  # every copy of a tensor comes out divided by its sum
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return out / out.sum() if func is torch.ops.aten._to_copy.default else out

    x = torch.tensor([1.0, 3.0])
    honest = records.data(x)
    with Normalise():
        assert records.data(x) == honest


def test_start_sets_torchs_default_dtype_back_to_float32_and_says_so(capsys):
    torch.set_default_dtype(torch.float64)
    try:
        grading.start("Part 9")
        assert torch.get_default_dtype() == torch.float32 and torch.randn(2).dtype == torch.float32
    finally:
        torch.set_default_dtype(torch.float32)
    assert "default dtype was torch.float64" in capsys.readouterr().out
    grading.start("Part 9")
    assert capsys.readouterr().out == ""  # nothing to say when nothing changed


def test_own_work_refuses_subclasses_of_plain_types_and_accepts_numpys_and_torchs():
    class AlwaysEqual(float):
        def __eq__(self, other):
            return True

    class Scaler:
        def __init__(self):
            self.scale = AlwaysEqual(1.0)

    for cheat in (lambda: AlwaysEqual(0.0), lambda: [1.0, AlwaysEqual(0.0)], Scaler):
        with pytest.raises(AssertionError, match="subclass of float"):
            grading.own_work(cheat)
    grading.own_work(lambda: (True, np.float64(1.0), torch.zeros(2).shape, {"a": torch.nn.Parameter(torch.zeros(1))}))


def test_seed_is_the_written_seed_in_a_notebook_and_secret_when_graded(monkeypatch):
    assert grading.seed(11) == 11
    monkeypatch.setattr(grading, "_secret", "instructor secret")
    drawn = grading.seed(11)
    assert drawn != 11 and drawn == grading.seed(11) and 0 <= drawn < 2**31
    monkeypatch.setattr(grading, "_secret", "another secret")
    assert grading.seed(11) != drawn


def matmul_cost(m, n, k, dtype):
    if not isinstance(dtype, torch.dtype):
        raise TypeError("dtype must be a torch.dtype")
    return 2 * m * n * k, (m * k + k * n + m * n) * dtype.itemsize


def test_raises_accepts_the_expected_exception_and_shows_the_real_call_otherwise():
    grading.raises(TypeError, matmul_cost, 4, 4, 4, "float32")
    grading.raises((ValueError, TypeError), matmul_cost, 4, 4, 4, "float32")
    # Nothing raised: the call as made (torch.float32, not 'float32'), what came back, what was expected
    with pytest.raises(AssertionError) as caught:
        grading.raises(ValueError, matmul_cost, 0, 4, 4, torch.float32)
    assert str(caught.value) == ("matmul_cost(0, 4, 4, torch.float32) returned (0, 64); "
                                 "expected it to raise ValueError for this bad input")
    # The wrong exception (a bare AttributeError for a non-module): named, and the expected one too
    def first_nonfinite(model, *inputs):
        return model.named_modules()
    with pytest.raises(AssertionError) as caught:
        grading.raises(TypeError, first_nonfinite, "model", torch.ones(2))
    assert str(caught.value) == ("first_nonfinite('model', tensor([1., 1.])) raised AttributeError: 'str' object "
                                 "has no attribute 'named_modules'; expected TypeError for this bad input")
    with pytest.raises(AssertionError, match=r"\(<tensor of shape \(100,\), torch.float32>, scale=2.0\) returned 0.5"):
        grading.raises(ValueError, lambda x, scale: 0.5, torch.zeros(100), scale=2.0)

    def unchecked_cost(m, n, k, dtype):
        return dtype.is_floating_point
    with pytest.raises(AssertionError, match=r"^unchecked_cost\(4, 4, 4, numpy.float32\) raised AttributeError: "):
        grading.raises(TypeError, unchecked_cost, 4, 4, 4, np.float32)


def test_assert_close_prints_enough_digits_to_see_the_difference():
    with pytest.raises(AssertionError) as caught:
        grading.assert_close(0.68449997901916504, 0.6845, rtol=1e-12)
    expected, got = str(caught.value).split("(expected ")[1].split(";")[0].split(", got ")
    assert expected != got and float(expected) == 0.6845 and float(got) == 0.68449997901916504
    with pytest.raises(AssertionError, match=r"expected 2, got 2.5;"):
        grading.assert_close(2.5, 2.0)


def test_summary_says_that_the_hidden_tests_also_try_other_and_bad_inputs(capsys):
    grading.summary()
    out = capsys.readouterr().out
    assert "hidden tests" in out and "bad inputs" in out and "other inputs" in out


def test_a_library_file_reached_through_a_symbolic_link_is_still_the_library(tmp_path):
    """A course or a venv reached through a symbolic link imports its files under the link's path:
    the watcher compares real paths (a symlinked venv hid scipy's softmax from it)."""
    from importlib import util
    from pathlib import Path
    link = tmp_path / "linked"
    link.symlink_to(Path(grading.__file__).resolve().parent)
    spec = util.spec_from_file_location("linked_numerics", link / "numerics.py")
    linked = util.module_from_spec(spec)
    spec.loader.exec_module(linked)
    assert linked.naive_softmax.__code__.co_filename.startswith(str(link))
    with pytest.raises(AssertionError, match="numerics.naive_softmax"):
        grading.own_work(linked.naive_softmax, torch.randn(4))


def test_a_class_is_numpys_or_torchs_by_where_its_code_is_not_by_its_module_name():
    """Red team 20 (A2): a dict subclass defined while `__name__` read "torch.lazy" passed the
    result check and filled itself in from the library when the tests read it."""
    namespace = {"__name__": "torch.lazy"}
    exec("class Lazy(dict):\n    def __getitem__(self, key):\n        return 1\n", namespace)
    assert namespace["Lazy"].__module__ == "torch.lazy"
    with pytest.raises(AssertionError, match="a subclass of dict"):
        grading.own_work(lambda: namespace["Lazy"]())
    for honest in (np.float64(1.0), torch.Size([2]), torch.nn.Parameter(torch.ones(2)), torch.max(torch.ones(2, 2), 0),
                   np.linalg.svd(np.eye(2)), np.ma.array([1.0])):
        grading.own_work(lambda: honest)  # numpy's and torch's own subclasses pass
