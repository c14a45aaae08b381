"""tf.data's Python functions as loading stages, without TensorFlow: the call timing
against a stand-in for TensorFlow's function registry (scripted clocks), and the
rows, cause line, table and limitation a tf.data run's stage totals become."""

from __future__ import annotations

import functools
import io
from types import SimpleNamespace
from typing import Any

import pytest

from loadprof import patch
from loadprof.frameworks.tensorflow.stages import WHERE, TfStages, callable_name, stage_of
from loadprof.patch import Patches
from loadprof.records import Environment, LoaderInfo, Run, StageTime, Step
from loadprof.report import build_report
from loadprof.report.stages import TF_GRAPH_NOT_TIMED, TF_NOT_TIMED, stage_table
from loadprof.stagemodel import loading, top_stage_line


# -- the outside world: TensorFlow's registry of Python functions, as script_ops has it --
def _registry_class() -> type:
    """A fresh class per test: the hook wraps its ``__call__`` at class level."""

    class FuncRegistry:
        def __init__(self, funcs: dict[str, Any]) -> None:
            self._funcs = funcs

        def get(self, token: str, default: Any = None) -> Any:
            return self._funcs.get(token, default)

        def __call__(self, token: str, device: Any, args: Any) -> Any:
            return self._funcs[token](*args)

    return FuncRegistry


def slow_read(x: Any) -> Any:
    return x


class Decoder:
    def __call__(self, x: Any) -> Any:
        return x


class Ticks:
    """A clock that advances by ``step`` on every reading."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _timed(funcs: dict[str, Any], tokens: list[str], ours: bool = True):
    registry = _registry_class()(funcs)
    stages = TfStages(lambda: ours, clock=Ticks(0.010), cpu_clock=Ticks(0.001))
    patches = Patches("test")
    assert stages.install(patches, SimpleNamespace(_py_funcs=registry)) is None
    info = LoaderInfo("tf.data", "tf.data pipeline", batch_size=8)
    stages.watch(info, tokens)
    return registry, stages, patches, info


def test_each_call_of_a_watched_function_adds_its_clock_time_to_the_stage_named_as_written():
    registry, stages, patches, info = _timed({"pyfunc_0": slow_read}, ["pyfunc_0"])
    try:
        for i in range(3):
            assert registry("pyfunc_0", None, [i]) == i
    finally:
        patches.restore()
    (stage,) = info.stages
    assert (stage.kind, stage.where, stage.random) == ("user", WHERE, None)
    assert stage.name == f"slow_read (test_stages_tf.py:{slow_read.__code__.co_firstlineno})"
    assert stage.calls == 3
    assert stage.seconds == pytest.approx(0.030)  # one 10 ms tick between the two readings
    assert stage.cpu == pytest.approx(0.003)


def test_the_wrapper_passes_the_arguments_result_and_exception_through_untouched():
    sentinel = object()
    error = KeyError("the user's own")

    def same(*args: Any) -> Any:
        assert args[0] is sentinel
        return args

    def fails(x: Any) -> Any:
        raise error

    registry, stages, patches, info = _timed({"a": same, "b": fails}, ["a", "b"])
    try:
        out = registry("a", None, [sentinel, 2])
        assert out[0] is sentinel and out[1] == 2
        with pytest.raises(KeyError) as raised:
            registry("b", None, [1])
        assert raised.value is error
    finally:
        patches.restore()
    assert [s.calls for s in info.stages] == [1, 1]  # a failed call took its time too


def test_calls_of_functions_not_in_a_seen_pipeline_and_calls_after_the_session_are_not_timed():
    registry, stages, patches, info = _timed({"pipe": slow_read, "step": slow_read}, ["pipe"])
    try:
        registry("step", None, [1])  # a py_function in a train step, say
    finally:
        patches.restore()
    assert [s.calls for s in info.stages] == [0]
    registry, stages, patches, info = _timed({"pipe": slow_read}, ["pipe"], ours=False)
    try:
        registry("pipe", None, [1])
    finally:
        patches.restore()
    assert [s.calls for s in info.stages] == [0]


def test_restore_gives_the_registry_class_back_its_own_call():
    cls = _registry_class()
    own = cls.__dict__["__call__"]
    patches = Patches("test")
    TfStages(lambda: True).install(patches, SimpleNamespace(_py_funcs=cls({})))
    assert cls.__dict__["__call__"] is not own
    patches.restore()
    assert cls.__dict__["__call__"] is own and patch.active() == []


def test_a_missing_registry_is_a_reason_not_an_error():
    assert "not timed" in (TfStages(lambda: True).install(Patches("test"), SimpleNamespace()) or "")


def test_two_tokens_of_one_function_share_a_stage_and_a_stage_never_called_is_dropped():
    registry, stages, patches, info = _timed({"a": slow_read, "b": slow_read, "c": Decoder()}, ["a", "b", "c"])
    try:
        registry("a", None, [1])
        registry("b", None, [1])
    finally:
        patches.restore()
    assert [s.calls for s in info.stages] == [2, 0]
    stages.finish()
    assert [s.name.split(" ")[0] for s in info.stages] == ["slow_read"]


def test_names_of_what_users_hand_to_py_function():
    line = Decoder.__call__.__code__.co_firstlineno
    assert callable_name(Decoder()) == f"Decoder (test_stages_tf.py:{line})"
    assert callable_name(functools.partial(slow_read)).startswith("slow_read (test_stages_tf.py:")
    wrapped = functools.wraps(slow_read)(lambda x: x)  # as autograph's do_not_convert wraps it
    assert callable_name(wrapped).startswith("slow_read (")
    assert callable_name(SimpleNamespace(_func=slow_read)).startswith("slow_read (")  # EagerFunc
    assert callable_name(len) == "len"


def test_a_from_generator_element_is_a_read_named_after_the_generator_and_its_bookkeeping_is_no_stage():
    def gen():
        yield 1

    state = SimpleNamespace(_generator=gen)

    def generator_py_func(iterator_id: Any) -> Any:
        return next(state)

    def finalize_py_func(iterator_id: Any) -> Any:
        return iterator_id

    for fn in (generator_py_func, finalize_py_func):
        fn.__module__ = "tensorflow.python.data.ops.from_generator_op"
    kind, name = stage_of(generator_py_func) or ("", "")
    assert kind == "read" and name.startswith("test_a_from_generator_element_is_a_read_named_after_the_generator")
    assert "<locals>.gen (test_stages_tf.py:" in name
    assert stage_of(finalize_py_func) is None
    assert stage_of(slow_read) == ("user", callable_name(slow_read))


# -- the totals as rows ----------------------------------------------------------------------
def _tf_run(stages: list[StageTime], batches: int = 10) -> Run:
    """10 batches of 8 through a tf.data pipeline; 20 steps of 100 ms, 90 of them waiting."""
    loader = LoaderInfo("tf.data", "tf.data pipeline", batch_size=8, iterations=1, stages=stages,
                        stage_batches=batches)
    return Run(environment=Environment(usable_cores=2, logical_cores=2), duration=2.0,
               steps=[Step(i, 0.1 * i, 0.1 * (i + 1), data_wait=0.09) for i in range(20)],
               loaders=[loader], data_wait_method="iterator-next")


def _py_stages() -> list[StageTime]:
    return [StageTime("read", "gen (data.py:3)", 0.05, 0.05, 81, WHERE),
            StageTime("user", "slow_read (data.py:9)", 0.80, 0.01, 80, WHERE)]


def test_a_python_function_total_over_the_batches_taken_is_its_ms_per_batch_and_its_share_of_the_timed_ones():
    run = _tf_run(_py_stages())
    load = loading(run, run.loaders[0])
    assert load is not None and load.python_only
    top = load.rows[0]
    assert top.stage == "user: slow_read (data.py:9)" and top.where == WHERE and top.random is None
    assert top.ms_per_batch == pytest.approx(80.0) and top.cpu_ms_per_batch == pytest.approx(1.0)
    assert top.share == pytest.approx(0.8 / 0.85)
    assert load.ms_per_batch == pytest.approx(85.0)
    assert load.fetch_ms_per_batch is None  # tf.data's own fetch is not timed
    assert load.wait_ms_per_batch == pytest.approx(90.0)  # the loop's, measured
    assert top_stage_line(load) == ("; slowest stage: user: slow_read (data.py:9), 94% of the timed Python "
                                    "functions (tf.data threads)")


def test_a_tf_report_names_the_slowest_python_function_and_says_the_graph_is_not_timed():
    report = build_report(_tf_run(_py_stages()))
    assert report.verdict == "data-starved"
    assert "slowest stage: user: slow_read (data.py:9), 94% of the timed Python functions" in report.summary
    assert TF_GRAPH_NOT_TIMED in report.limitations and TF_NOT_TIMED not in report.limitations
    assert [s["name"] for s in report.to_dict()["loading"]["stages"]] == ["slow_read (data.py:9)", "gen (data.py:3)"]
    out = io.StringIO()
    report.render_console(file=out, width=120)
    text = out.getvalue()
    assert "user: slow_read (data.py:9)" in text and "tf.data threads" in text
    assert "only its Python functions are timed" in text


def test_a_tf_run_whose_pipeline_calls_no_python_keeps_the_wider_limitation():
    report = build_report(_tf_run([], batches=10))
    assert report.stages is None and report.loading is None
    assert TF_NOT_TIMED in report.limitations and TF_GRAPH_NOT_TIMED not in report.limitations


def test_a_torch_table_has_no_tf_caption():
    torch = LoaderInfo("torch", "DataLoader", batch_size=8, num_workers=0, iterations=1,
                       stages=[StageTime("decode", "PIL PNG decode", 0.5, 0.5, 80, "main", False)],
                       stage_batches=10, stage_seconds=0.5)
    load = loading(Run(), torch)
    assert load is not None and not load.python_only and load.fetch_ms_per_batch == pytest.approx(50.0)
    assert stage_table(load).caption is None
    assert top_stage_line(load).endswith("100% of loading (main)")
