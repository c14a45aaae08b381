"""How the report names a user's function, whatever shape the callable has."""

from __future__ import annotations

import functools

from loadprof.callables import callable_name


def parse(x, scale=1):
    return x * scale


class Decoder:
    def __call__(self, x):
        return x

    def method(self, x):
        return x


class Opaque:
    __slots__ = ()


def test_a_function_is_named_with_its_file_and_first_line() -> None:
    assert callable_name(parse) == f"parse (test_callables.py:{parse.__code__.co_firstlineno})"


def test_a_partial_is_named_as_the_function_inside() -> None:
    assert callable_name(functools.partial(parse, scale=2)) == callable_name(parse)


def test_a_bound_method_and_a_callable_object_are_named_by_their_code() -> None:
    line = Decoder.method.__code__.co_firstlineno
    assert callable_name(Decoder().method) == f"Decoder.method (test_callables.py:{line})"
    line = Decoder.__call__.__code__.co_firstlineno
    assert callable_name(Decoder()) == f"Decoder (test_callables.py:{line})"


def test_a_callable_without_python_code_is_named_by_its_type() -> None:
    assert callable_name(len) == "len"
    assert callable_name(Opaque()) == "Opaque"
