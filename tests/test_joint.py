"""JointSteps: searches that join at any step and share each model call answer as if run alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nmt.joint import JointSteps
from nmt.translate import InferenceOptions, Translator

pytestmark = pytest.mark.usefixtures("one_thread")
GROUPS = [
    ["他们买了七只红色的猫。", "这本书二十五元。", "我们九点见。", "", "你有几本书？"],
    ["我的生日是三月十二日。", "他有一条狗。"],
    ["我。", "他们九点买了一本书。", "这只猫是红色的。"],
]


@pytest.fixture(scope="module")
def translator(tiny_run: Path) -> Translator:
    return Translator.from_options(InferenceOptions(run_dir=tiny_run, precision="fp32"))


class Results:
    """Collects what `finished` reports, per search."""

    def __init__(self) -> None:
        self.found: dict[int, tuple] = {}

    def __call__(self, key: int):
        def finished(result, error):
            assert key not in self.found, "finished twice"
            self.found[key] = (result, error)

        return finished


def assert_same(got: list, expected: list) -> None:
    assert [[text for text, _ in hyps] for hyps in got] == [[text for text, _ in hyps] for hyps in expected]
    for g, e in zip(got, expected, strict=True):
        assert [s for _, s in g] == pytest.approx([s for _, s in e], abs=1e-4)


def test_searches_that_join_at_different_steps_answer_as_alone(translator):
    expected = [translator.translate_nbest(lines, beam=3, nbest=2) for lines in GROUPS]
    calls: list[int] = []
    model = translator.model
    decode_steps = model.decode_steps
    joint, results = JointSteps(model), Results()
    try:
        model.decode_steps = lambda tokens, states: calls.append(len(states)) or decode_steps(tokens, states)
        joint.add(translator.steps(GROUPS[0], beam=3, nbest=2, scores=True), results(0))
        joint.step()
        joint.step()
        joint.add(translator.steps(GROUPS[1], beam=3, nbest=2, scores=True), results(1))
        joint.step()
        joint.add(translator.steps(GROUPS[2], beam=3, nbest=2, scores=True), results(2))
        while len(joint):
            joint.step()
    finally:
        del model.decode_steps
    assert max(calls) == 3  # the three searches did share steps
    for key in range(3):
        result, error = results.found[key]
        assert error is None
        assert_same(result, expected[key])


def test_a_search_without_model_steps_finishes_when_added(translator):
    """Greedy search (and engines without `search_steps`) run whole inside `add`."""
    joint, results = JointSteps(translator.model), Results()
    joint.add(translator.steps(GROUPS[1], beam=1), results(0))
    assert len(joint) == 0
    result, error = results.found[0]
    assert error is None and [h[0][0] for h in result] == translator.translate(GROUPS[1], beam=1)


def test_a_search_that_raises_finishes_alone(translator):
    def failing():
        yield from translator.steps(GROUPS[0][:1], beam=2, scores=True)  # runs to its end
        raise ValueError("this search's own mistake")

    joint, results = JointSteps(translator.model), Results()
    joint.add(failing(), results(0))
    joint.add(translator.steps(GROUPS[1], beam=2, scores=True), results(1))
    while len(joint):
        joint.step()
    assert isinstance(results.found[0][1], ValueError)
    assert results.found[1][1] is None
    assert_same(results.found[1][0], translator.translate_nbest(GROUPS[1], beam=2))


def test_a_model_error_fails_the_searches_of_that_step_and_no_more(translator):
    model = translator.model
    joint, results = JointSteps(model), Results()
    joint.add(translator.steps(GROUPS[0], beam=2, scores=True), results(0))
    joint.add(translator.steps(GROUPS[1], beam=2, scores=True), results(1))
    joint.step()
    model.decode_steps = lambda tokens, states: (_ for _ in ()).throw(RuntimeError("out of memory"))
    try:
        joint.step()
    finally:
        del model.decode_steps
    assert len(joint) == 0
    assert [str(results.found[k][1]) for k in (0, 1)] == ["out of memory"] * 2
    joint.add(translator.steps(GROUPS[2], beam=2, scores=True), results(2))  # the model still serves
    while len(joint):
        joint.step()
    assert_same(results.found[2][0], translator.translate_nbest(GROUPS[2], beam=2))


def test_a_model_without_decode_steps_runs_each_search_in_turn(translator):
    class OneAtATime:
        def __init__(self, model: torch.nn.Module) -> None:
            self.model = model

        def decode_step(self, tokens, state):
            return self.model.decode_step(tokens, state)

    joint, results = JointSteps(OneAtATime(translator.model)), Results()
    for key, lines in enumerate(GROUPS):
        joint.add(translator.steps(lines, beam=2, scores=True), results(key))
    while len(joint):
        joint.step()
    for key, lines in enumerate(GROUPS):
        assert_same(results.found[key][0], translator.translate_nbest(lines, beam=2))
