"""The op table: which implementation runs when a torch function meets an `MCTensor`.

Each op of `anynum.mc.ops` registers itself with :func:`implements` under the torch
functions and ``torch.Tensor`` methods it stands for (``torch.add``, ``torch.Tensor.add``,
...).  ``MCTensor.__torch_function__`` and the operator methods (``+``, ``@``, ``x.sum()``,
...) look the function up here and nothing else, so adding an op touches its own module only.
A function that is not in the table raises `AnynumError` naming it, the supported ones and
the way out (``x.to_tensor()``), in the manner of torchao's op tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anynum.errors import AnynumError

__all__ = ["HANDLED", "implements", "lookup", "supported"]

HANDLED: dict[Callable[..., Any], Callable[..., Any]] = {}


def implements(*funcs: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register the decorated function as the MC implementation of `funcs`.

    >>> import torch
    >>> from anynum.mc import optable
    >>> optable.lookup(torch.add).__name__
    'add'
    """

    def deco(impl: Callable[..., Any]) -> Callable[..., Any]:
        for f in funcs:
            HANDLED[f] = impl
        return impl

    return deco


def _name(func: Any) -> str:
    return getattr(func, "__name__", None) or repr(func)


def supported() -> list[str]:
    """Sorted names of the torch functions with an MC implementation.

    >>> from anynum.mc import optable
    >>> "matmul" in optable.supported()
    True
    """
    return sorted({_name(f) for f in HANDLED})


def lookup(func: Callable[..., Any]) -> Callable[..., Any]:
    """The MC implementation of `func`, or `AnynumError` naming it and what is supported.

    >>> import torch
    >>> from anynum.mc import optable
    >>> try:
    ...     optable.lookup(torch.fft.fft)
    ... except Exception as e:
    ...     print(str(e)[:40])
    fft_fft is not supported on MCTensor; su
    """
    impl = HANDLED.get(func)
    if impl is None:
        raise AnynumError(
            f"{_name(func)} is not supported on MCTensor; supported: {', '.join(supported())}. "
            "Convert with x.to_tensor() to use it at plain precision."
        )
    return impl
