"""A rounding pair (the forward value and its gradient) as one native torch autograd node.

QAT rounds a layer's input on the way forward and its gradient (the error) on the way back.
As a Python ``autograd.Function`` that costs a Python call each way per layer and step, and
inside a training step, between convolutions that evict the interpreter from the caches, each
costs several times what it costs in a loop of its own. ``anynum_native::round_pair`` (C++,
``csrc/pairop.cpp``) is that Function as a torch C++ autograd node: the forward rounds with one
call of the C library (`anynum.kernels.clib`), the backward rounds the gradient with another,
and no Python runs in the backward.

It is built like the C library: by the system C++ compiler against the installed torch's
headers, once per user, machine and torch, through the private verified cache of
`anynum.kernels.nativelib`, in the background on first use. Until it is loaded, and where it
cannot be (no C++ compiler, ``ANYNUM_COMPILE=0``, a call the C library does not take first),
`side` or `pair_op` says None and the caller uses its Python Function: the results are the
same bits either way (tests/kernels/test_pairop.py).

Exact stochastic rounding leaves an element undecided with probability 2**-53; the node then
calls back into Python (`refine_undecided`, through a ctypes callback) for those elements, as
`anynum.kernels.ckernel.native_round` does.

>>> import torch
>>> from anynum.kernels.route import plan_for
>>> from anynum.rounding import Rounding
>>> import anynum as an
>>> plan = plan_for(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", None, torch.float32, "cpu", None)
>>> s = side(plan)
>>> s is None or len(s) == 3
True
"""

from __future__ import annotations

import ctypes
import warnings
from pathlib import Path
from typing import Any

import torch

from anynum.kernels.ckernel import native_kernel, refine_undecided
from anynum.kernels.clib import building_library, library_soon
from anynum.kernels.cparams import CallParams
from anynum.kernels.nativelib import NativeSource, load
from anynum.kernels.nativesoon import building, load_soon
from anynum.kernels.route import Call, Plan
from anynum.rounding import CounterRandom

__all__ = ["SOURCE", "build_now", "each_op", "pair_op", "side"]

_TORCH = Path(torch.__file__).parent


# The torch version and ABI are part of the flags, so a library built against one torch is a
# different cache entry from one built against another. -O2: the node's own code is a few calls
# (the loops are the C library's), and -O3 doubles the build of torch's headers.
SOURCE = NativeSource(
    "anynum_pairop",
    (Path(__file__).with_name("csrc") / "pairop.cpp").read_text(encoding="utf-8"),
    flags=(
        "-O2",
        f"-I{_TORCH / 'include'}",
        f"-I{_TORCH / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-DANYNUM_TORCH_VERSION={torch.__version__}",
        "-w",  # torch's headers warn under -std=c++17; the warnings are theirs
    ),
    language="c++",
    libraries=(f"-L{_TORCH / 'lib'}", f"-Wl,-rpath,{_TORCH / 'lib'}", "-lc10", "-ltorch_cpu", "-ltorch"),
)

#: What each side's token names: its call and its parameters (which also keep the C structure
#: that the side's address points to alive for the life of the process), one entry per
#: parameters object (the native kernel's own cache holds one per call).
_SIDES: list[tuple[Call, CallParams]] = []
_TOKENS: dict[int, int] = {}  # id(params) -> token


@ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
def _refine(token: int, y: int, n: int, seed: int) -> int:
    """The node's callback for undecided elements: refine them in place (0), or fail (-1)."""
    try:
        call, params = _SIDES[token]
        size = torch.empty((), dtype=call.dtype).element_size()
        memory = (ctypes.c_char * (n * size)).from_address(y)
        refine_undecided(params, call, torch.frombuffer(memory, dtype=call.dtype), CounterRandom(seed))
        return 0
    except Exception as exc:  # a C++ caller cannot take a Python exception: it raises its own
        warnings.warn(f"anynum: refining undecided elements failed: {exc!r}", RuntimeWarning, stacklevel=1)
        return -1


def side(plan: Plan) -> list[int] | None:
    """The node's description of rounding by `plan` ``[call address, token, stochastic]``, or None
    where the C library is not the plan's first kernel or does not take elementwise calls of it."""
    if not plan.kernels or plan.kernels[0] is not native_kernel():
        return None
    params = native_kernel().params(plan.call)
    if params is None or params.block:
        return None
    token = _TOKENS.get(id(params))  # (_SIDES keeps params alive: its id names no other object)
    if token is None:
        token = _TOKENS[id(params)] = len(_SIDES)
        _SIDES.append((plan.call, params))
    return [params.address, token, int(plan.call.random is not None)]


_LOADED: list[Any] = []  # the ops once loaded (round_pair, round_each), or None once they cannot load


def _ops() -> tuple[Any, Any] | None:
    """The node's ops once they and the C library are loaded, else None (at once: a first build
    runs in the background meanwhile)."""
    if _LOADED:
        return _LOADED[0]
    lib = library_soon()
    if lib is None:
        if not building_library():
            _LOADED.append(None)  # no C library in this process: stop asking
        return None
    if load_soon(SOURCE) is None:
        if not building(SOURCE):
            _LOADED.append(None)  # the node cannot be built or loaded here: stop asking
        return None
    _LOADED.append(_connected(lib))
    return _LOADED[0]


def pair_op() -> Any:
    """``torch.ops.anynum_native.round_pair`` once it and the C library are loaded, else None."""
    ops = _ops()
    return None if ops is None else ops[0]


def each_op() -> Any:
    """``torch.ops.anynum_native.round_each`` once it and the C library are loaded, else None:
    ``round_each(tensors, side, generator)`` rounds contiguous CPU tensors of one dtype in place
    as their concatenation (as `anynum.kernels.ckernel.native_round_each`) and returns the
    count of undecided elements it refined, or -1, with nothing written and nothing drawn, for
    any other list.

    >>> op = each_op()
    >>> op is None or callable(op)
    True
    """
    ops = _ops()
    return None if ops is None else ops[1]


def _connected(lib: ctypes.CDLL) -> tuple[Any, Any]:
    """The ops, after handing them the library's entry points and the refine callback (once: `_ops`)."""
    ops = torch.ops.anynum_native
    ops.set_entry_points(
        ctypes.cast(lib.anynum_round, ctypes.c_void_p).value,
        ctypes.cast(lib.anynum_round_each, ctypes.c_void_p).value,
        ctypes.cast(lib.anynum_stream_base, ctypes.c_void_p).value,
        ctypes.cast(_refine, ctypes.c_void_p).value,
    )
    return ops.round_pair, ops.round_each


def build_now() -> bool:
    """Build and load the node now, waiting for the compiler; whether it loaded."""
    return load(SOURCE) is not None
