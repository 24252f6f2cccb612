"""Keyword dicts written as Python text, as rl-zoo3's yml files write them (``"dict(net_arch=[64, 64])"``), read
without running any code.

Owns the safe reading of such text (literals, ``dict(...)`` calls, dotted names kept as their text); knows
nothing of SB3, rl-zoo3 or what any key means.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from ...exceptions import EstimateError

__all__ = ["read_kwargs", "read_value"]


def read_value(text: str, what: str) -> Any:
    """The value ``text`` writes: numbers, strings, True/False/None, lists, tuples, ``{...}`` and ``dict(k=v)``
    (nested too), a negative number; a dotted name (``nn.ReLU``, ``RMSpropTFLike``) is kept as its text. Any
    other code (calls of anything but ``dict``, operators, comprehensions) is an ``EstimateError`` naming
    ``what``: nothing is evaluated.

    Examples:
        >>> read_value("dict(log_std_init=-2, net_arch=dict(pi=[256], vf=[256]), activation_fn=nn.ReLU)", "x")
        {'log_std_init': -2, 'net_arch': {'pi': [256], 'vf': [256]}, 'activation_fn': 'nn.ReLU'}
        >>> read_value("__import__('os').system('true')", "policy_kwargs")
        Traceback (most recent call last):
        ...
        optuna_memprune.exceptions.EstimateError: policy_kwargs must be a literal or dict(...) text, ...
    """
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise EstimateError(
            f'{what} must be Python text such as "dict(net_arch=[64, 64])", but got {text!r} ({exc.msg}).'
        ) from None
    return _value(tree.body, what, text)


def read_kwargs(value: Any, what: str) -> dict[str, Any]:
    """A dict of keyword arguments from a mapping or from its text (``read_value``); None is ``{}``.

    Examples:
        >>> read_kwargs("dict(net_arch=[400, 300], n_critics=1)", "policy_kwargs")
        {'net_arch': [400, 300], 'n_critics': 1}
    """
    if value is None:
        return {}
    if isinstance(value, str):
        value = read_value(value, what)
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise EstimateError(
            f'{what} must be a dict of keyword arguments (or its text, "dict(...)"), but got {value!r}.'
        )
    return dict(value)


def _value(node: ast.AST, what: str, text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.UAdd))
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, (int, float))
    ):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_value(e, what, text) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict):
        keys = [k for k in node.keys if k is not None]  # None: a ``**mapping`` entry
        if len(keys) == len(node.keys):
            return {_value(k, what, text): _value(v, what, text) for k, v in zip(keys, node.values, strict=True)}
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _dotted(node, what, text)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "dict"
        and not node.args
        and all(k.arg is not None for k in node.keywords)
    ):
        return {k.arg: _value(k.value, what, text) for k in node.keywords}
    raise EstimateError(
        f"{what} must be a literal or dict(...) text, with names such as nn.ReLU, but got "
        f"{text!r}: {ast.unparse(node)!r} would need running code."
    )


def _dotted(node: ast.AST, what: str, text: str) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise EstimateError(f"{what}: {text!r} holds {ast.unparse(node)!r}, which is not a plain dotted name.")
    return ".".join([node.id, *reversed(parts)])
