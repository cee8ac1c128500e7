"""ex7's hidden tests observe and the judge decides (grader/judge.py): behaviour is recorded as data
(hooks left, the model's mode, `.grad` restored) and an answer that is wrong only on the secret
inputs loses its part, with a message that names what differs."""
import pytest

from tests.test_observed_ex8_bitwise_resume import broken, reference_record, verdicts

ASSIGNMENT = "ex7_fp16_nan_hunt"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return reference_record(ASSIGNMENT, tmp_path_factory.mktemp("reference"))  # once for this file


# For each part, a cheap way to be wrong that the visible tests do not see: each loses its part.
BREAKS = {
    "p1: the model left in training mode": (
        "p1", "    return found[0] if found else None", "    model.train()\n    return found[0] if found else None",
        "first_nonfinite of a model in eval mode: the model's mode afterwards: expected False, got True"),
    "p2: the largest magnitude taken over inf and NaN too": (
        "p2", "values = [t[torch.isfinite(t)].abs().max().item() for t in tensors if torch.isfinite(t).any()]",
        "values = [t.abs().max().item() for t in tensors]", "activation_ranges of a "),
    "p3: .grad set to None instead of restored": (
        "p3", "            p.grad = grad", "            p.grad = None",
        "leave .grad as it was"),  # the visible test catches it now (it sets .grad first)
    "p4: only the softmax of the visible model's hot block replaced": (
        "p4", "for parent in list(model.modules()):", "for parent in [model.blocks[1].attn] if len(model.blocks) > 1 else []:",
        "the fixed model's output still holds inf or NaN"),
}


@pytest.mark.parametrize("case", BREAKS)
def test_an_answer_wrong_on_the_hidden_inputs_loses_its_part(reference, tmp_path, case):
    part, old, new, named = BREAKS[case]
    verdict = verdicts(reference, broken(part, old, new, ASSIGNMENT), {part}, tmp_path, ASSIGNMENT)[f"{part}_tests"]
    assert not verdict["passed"] and named in verdict["message"], verdict

