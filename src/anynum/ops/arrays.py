"""Array kinds for `anynum.ops`: torch, NumPy (and Python scalars), JAX and Dask in, the same kind out.

Every function runs on torch tensors (`run`). NumPy arrays cross without a copy,
concrete JAX arrays through DLPack; inside ``jax.jit`` the computation runs as a
``jax.pure_callback`` on the host. Dask arrays are processed block by block,
lazily: each input is rounded in its own chunks, then the function and the
output rounding run on aligned chunks. Stochastic rounding addresses each
element by its index in the whole array (`GlobalIndexRandom`), so results do not
depend on the chunking. jax and dask are imported only when such an array arrives.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from anynum.errors import InputError, RepresentabilityError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.fixed import UniformFormat
from anynum.formats.floating import FloatFormat
from anynum.formats.posit import Posit
from anynum.kernels.arrays import GlobalIndexRandom, is_dask_array, is_jax_array, is_jax_tracer
from anynum.ops.core import Settings, round_input
from anynum.quantize import check_representable

__all__ = ["Call", "block_runner", "check_fits", "from_torch", "kind_of", "run", "to_torch"]

_META = np.array((), dtype=np.float64)  # what Dask would otherwise infer by calling the block function
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: body(settings, rounded inputs) -> one output tensor or a tuple of them (float64 values
#: already rounded, or integer tensors such as frexp's exponents).
Body = Callable[..., Any]


@dataclass
class Call:
    """One call of an ops function, before it runs.

    `args` are the array arguments; `rounded[i]` says whether argument i is a value
    (rounded to the format) or an integer parameter (ldexp's exponent) passed as it is.
    `jax_like` is a jax.numpy function with the same output shapes and structure (for
    ``jax.jit``); `dask` maps the rounded Dask inputs to the result where blockwise
    application does not fit (reductions): ``dask(rounded, runner)``, where
    ``runner(body=call.body)`` is a NumPy-block function running `body` with the block's random stream.
    """

    settings: Callable[[torch.device], Settings]
    args: Sequence[Any]
    body: Body
    rounded: Sequence[bool] | None = None
    jax_like: Callable[..., Any] | None = None
    dask: Callable[..., Any] | None = None
    outputs: tuple[str, ...] = ("f",)  # per output: "f" float values, "i" int32 (frexp's exponent)


def _kind(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return "torch"
    if is_jax_array(v):
        return "jax"
    if is_dask_array(v):
        return "dask"
    if isinstance(v, (np.ndarray, np.generic)):
        return "numpy"
    if isinstance(v, (bool, int, float)):
        return "scalar"
    raise InputError(
        "an.ops functions take torch tensors, NumPy arrays, JAX arrays, Dask arrays or Python "
        f"numbers, got {type(v).__module__}.{type(v).__name__}."
    )


def kind_of(args: Sequence[Any]) -> str:
    """The array kind of a call: that of its arrays (one kind only); all Python numbers give "numpy"."""
    kinds = {_kind(a) for a in args} - {"scalar"}
    if len(kinds) > 1:
        raise InputError(
            f"an.ops got arrays of different kinds ({', '.join(sorted(kinds))}); convert them to one "
            "kind first (Python numbers mix with any kind)."
        )
    return kinds.pop() if kinds else "numpy"


def _numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype.name == "bfloat16":  # NumPy has no bfloat16 (ml_dtypes): cross through its bits
        return torch.from_numpy(np.array(a, copy=True, order="C").view(np.int16)).view(torch.bfloat16)
    if a.dtype.kind not in "biuf":
        raise InputError(f"an.ops needs real numbers, got a NumPy array of dtype {a.dtype}.")
    if not (a.flags.c_contiguous and a.flags.writeable):  # torch wants writable memory
        a = np.array(a, copy=True, order="C")  # (np.ascontiguousarray would make 0-d arrays 1-d)
    return torch.from_numpy(a)


def to_torch(v: Any, device: torch.device | None) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        t = v
    elif is_jax_array(v):
        t = torch.from_dlpack(v)
    elif isinstance(v, (bool, int, float)):
        t = torch.tensor(float(v), dtype=torch.float64)
    else:
        t = _numpy_to_torch(np.asarray(v))
    if t.is_complex():
        raise InputError(f"an.ops works on real numbers; got a complex array ({t.dtype}).")
    return t if device is None else t.to(device)


def _device(args: Sequence[Any]) -> torch.device:
    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    if len(devices) > 1:
        raise InputError(f"an.ops got tensors on different devices {sorted(map(str, devices))}.")
    return devices.pop() if devices else torch.device("cpu")


def _out_dtype(kind: str, args: Sequence[Any], tensors: Sequence[torch.Tensor]) -> torch.dtype:
    """The result dtype by the kind's own rule; Python numbers do not promote (they are weak)."""
    floats = [t.dtype for a, t in zip(args, tensors) if not isinstance(a, (bool, int, float)) and
              t.dtype in _FLOATS]
    if floats:
        out = floats[0]
        for d in floats[1:]:
            out = torch.promote_types(out, d)
        return out
    if kind == "torch" and any(isinstance(a, torch.Tensor) for a in args):
        return torch.get_default_dtype()
    if kind == "jax":
        import jax.numpy as jnp

        return torch.float64 if jnp.asarray(0.0).dtype == np.float64 else torch.float32
    return torch.float64  # NumPy: integers and Python numbers compute in float64


def from_torch(t: torch.Tensor, kind: str, scalar: bool) -> Any:
    if kind == "torch":
        return t
    if kind == "jax":
        import jax.numpy as jnp

        return jnp.from_dlpack(t.contiguous())
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        a = t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        a = t.detach().cpu().numpy()
    return a[()] if scalar or a.ndim == 0 else a


@functools.lru_cache(maxsize=256)
def _first_misfit(fmt: Format, dtype: torch.dtype) -> float | None:
    """A value of `fmt` that `dtype` cannot hold exactly, or None when every value fits."""
    if dtype == torch.float64:
        return None  # every format's values are float64 numbers by construction
    info = torch.finfo(dtype)
    precision = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24}[dtype]
    if isinstance(fmt, Block):
        check_representable(fmt, dtype)  # the block grid: quantize's own test
        return _first_misfit(fmt.element, dtype) if fmt.scale_rule == "none" else None
    if fmt.bits <= 16:
        vals = torch.from_numpy(fmt.values())
        bad = vals.to(dtype).to(torch.float64) != vals
        return float(vals[bad][0]) if bool(bad.any()) else None
    if isinstance(fmt, (FloatFormat, Posit, UniformFormat)):
        if fmt.precision > precision:
            return 1.0 + fmt.eps if isinstance(fmt, FloatFormat) else fmt.max
        if fmt.max > info.max:
            return fmt.max
        if fmt.smallest_subnormal < info.smallest_normal * info.eps or (
            isinstance(fmt, Posit) and fmt.minpos < info.smallest_normal
        ):
            return fmt.smallest_subnormal
        return None
    return fmt.max  # other wide formats: only float64 holds them


def check_fits(fmt: Format, dtype: torch.dtype) -> None:
    """Raise `RepresentabilityError` unless `dtype` holds every value `fmt` can produce (no 2nd rounding)."""
    bad = _first_misfit(fmt, dtype)
    if bad is not None:
        raise RepresentabilityError(
            f"an.ops results in {fmt.display_name()} include values such as {bad!r} that {dtype} cannot "
            "hold exactly; pass float32 or float64 inputs (e.g. x.float()) to avoid a second rounding."
        )


def _finish(out: Any, dtype: torch.dtype) -> Any:
    """Cast the float64 outputs to the result dtype (exact: the format fits it); integers stay."""
    if isinstance(out, tuple):
        return tuple(_finish(o, dtype) for o in out)
    return out.to(dtype) if out.is_floating_point() else out


def _map(out: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    return tuple(fn(o) for o in out) if isinstance(out, tuple) else fn(out)


def _run_torch(call: Call, st: Settings, tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> Any:
    flags = call.rounded or [True] * len(tensors)
    with torch.no_grad():
        ins = [round_input(t, st, i) if flag else t for i, (t, flag) in enumerate(zip(tensors, flags))]
        return _finish(call.body(st, *ins), dtype)


def run(call: Call) -> Any:
    """Run `call` on its arrays' kind and return the result in that kind and the result dtype."""
    kind = kind_of(call.args)
    if kind == "dask":
        return _run_dask(call)
    if kind == "jax" and any(is_jax_tracer(a) for a in call.args):
        return _run_jax_traced(call)
    device = _device(call.args)
    tensors = [to_torch(a, device) for a in call.args]
    dtype = _out_dtype(kind, call.args, tensors)
    st = call.settings(device)
    check_fits(st.fmt, dtype)
    out = _run_torch(call, st, tensors, dtype)
    scalar = all(isinstance(a, (bool, int, float, np.generic)) for a in call.args)
    return _map(out, lambda t: from_torch(t, kind, scalar))


# --- JAX under jit ----------------------------------------------------------------------------


def _run_jax_traced(call: Call) -> Any:
    import jax

    if call.jax_like is None:
        raise InputError(
            "this an.ops function cannot run inside jax.jit; call it outside the traced function."
        )
    st = call.settings(torch.device("cpu"))
    if st.mode.is_stochastic and st.rng is None:  # pragma: no cover - make_settings always gives one
        raise InputError("stochastic rounding under jax.jit needs a seed= or a PRNG key.")
    spec = jax.eval_shape(call.jax_like, *call.args)

    def host(*arrays: np.ndarray) -> Any:
        tensors = [_numpy_to_torch(np.asarray(a)) for a in arrays]
        dtype = _out_dtype("jax", arrays, tensors)
        check_fits(st.fmt, dtype)
        out = _run_torch(call, st, tensors, dtype)
        return _map(out, lambda t: from_torch(t, "numpy", False))

    return jax.pure_callback(host, spec, *call.args, vmap_method="sequential")


# --- Dask ---------------------------------------------------------------------------------------


def _block_settings(st: Settings, block_info: dict[Any, Any] | None, key: Any, shape: tuple[int, ...],
                    full: tuple[int, ...]) -> Settings:
    if st.rng is None or block_info is None:
        return st
    start = tuple(int(lo) for lo, _ in block_info[key]["array-location"])
    return st.with_rng(GlobalIndexRandom(st.rng, start, shape, full))


def _dask_round_inputs(call: Call, st: Settings, arrays: Sequence[Any]) -> list[Any]:
    import dask.array as da

    flags = call.rounded or [True] * len(arrays)
    out = []
    for i, (a, flag) in enumerate(zip(arrays, flags)):
        if not flag or a.dtype.kind not in "f":
            out.append(a.astype(np.float64) if flag else a)
            continue
        full = tuple(int(s) for s in a.shape)

        def rnd(b: np.ndarray, block_info: dict[Any, Any] | None = None, i: int = i,
                full: tuple[int, ...] = full) -> np.ndarray:
            bst = _block_settings(st, block_info, 0, tuple(b.shape), full)
            return round_input(_numpy_to_torch(b), bst, i).numpy()

        out.append(da.map_blocks(rnd, a, dtype=np.float64, meta=_META))
    return out


def block_runner(body: Body, st: Settings) -> Callable[..., Any]:
    """A function of NumPy blocks of the rounded inputs that runs `body` (which rounds the output).

    Stochastic output rounding addresses elements by their index in the whole
    output (``block_info[None]``), so the result does not depend on the chunking.
    """

    def block(*blocks: np.ndarray, block_info: dict[Any, Any] | None = None) -> Any:
        tensors = [_numpy_to_torch(np.asarray(b)) for b in blocks]
        full = tuple(int(s) for s in block_info[None]["shape"]) if block_info else ()
        with torch.no_grad():
            shape = tuple(block_info[None]["chunk-shape"]) if block_info else ()
            bst = _block_settings(st, block_info, None, shape, full)
            out = body(bst, *tensors)
        return _map(out, lambda t: t.numpy())

    return block


def _run_dask(call: Call) -> Any:
    import dask.array as da

    arrays = [a if is_dask_array(a) else da.asarray(np.asarray(a)) for a in call.args]
    tensors = [torch.empty(0, dtype=_numpy_to_torch(np.zeros(0, a.dtype)).dtype) for a in arrays]
    dtype = _out_dtype("numpy", call.args, tensors)
    st = call.settings(torch.device("cpu"))
    check_fits(st.fmt, dtype)
    if any(np.isnan(s) for a in arrays for s in a.shape):
        raise InputError("Dask arrays with unknown chunk sizes need x.compute_chunk_sizes() first.")
    rounded = _dask_round_inputs(call, st, arrays)
    np_dtype = np.dtype(str(dtype).replace("torch.", "")) if dtype != torch.bfloat16 else None
    if call.dask is not None:
        out = call.dask(rounded, lambda body=call.body: block_runner(body, st))
    else:
        runner = block_runner(call.body, st)
        aligned = da.broadcast_arrays(*rounded)
        if len(call.outputs) == 1:
            out = da.map_blocks(runner, *aligned, dtype=np.float64, meta=_META)
        else:  # map_blocks makes one array per call: one pass per output
            out = tuple(
                da.map_blocks(lambda *b, block_info=None, j=j: runner(*b, block_info=block_info)[j],
                              *aligned, dtype=np.float64 if kind == "f" else np.int32,
                              meta=np.array((), dtype=np.float64 if kind == "f" else np.int32))
                for j, kind in enumerate(call.outputs)
            )
    if np_dtype is None:
        raise InputError("bfloat16 Dask arrays are not supported by an.ops; use float32.")
    return _map_dask(out, np_dtype)


def _map_dask(out: Any, dtype: np.dtype) -> Any:
    if isinstance(out, tuple):
        return tuple(_map_dask(o, dtype) for o in out)
    return out.astype(dtype) if out.dtype.kind == "f" else out
