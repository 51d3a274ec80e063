"""The double-word (nc = 2) algorithms as C loops (the mc native library, `anynum.mc.native`).

Each loop is a transliteration, operation for operation, of one formula of `anynum.mc.arith`
(Joldes, Muller, Popescu, ACM TOMS 44(2), 2017), for float and double, with C99 ``fma`` where
the formula uses ``torch.addcmul`` (a verified FMA: these loops are only used where
`anynum.mc.eft.fma_available` holds, so both paths run the same algorithm).  The results are
therefore bit for bit those of the formulas, which tests/mc/test_kernels.py checks on random,
cancelling, spread/subnormal/near-overflow and non-finite inputs.

One pass over memory instead of the 10-27 passes of the eager kernels: an MC addition or
multiplication costs about what a float64 one costs.  Large tensors are cut into one chunk per
intra-op thread (``torch.get_num_threads()``), each run by a C call that releases the GIL.

No compiler, or a failed build, leaves the callers on the eager kernels; ``ANYNUM_COMPILE=0``
(eager only) and ``=1`` (torch.compile) keep them off this path.
"""

from __future__ import annotations

import torch

from anynum.kernels.settings import compile_mode
from anynum.mc._core import Comps
from anynum.mc.native import DW_KERNELS, library, run_parallel

__all__ = ["KERNELS", "available", "run"]

KERNELS = DW_KERNELS
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_CHUNK_MIN = 1 << 16  # elements per thread below which one call is cheaper than a thread hand-off


def available(*ins: torch.Tensor) -> bool:
    """Whether the C loops apply: ``ANYNUM_COMPILE`` "auto", same-shape contiguous float32 or
    float64 CPU tensors, and the library builds here.

    >>> import torch
    >>> from anynum.mc import cloops
    >>> cloops.available(torch.ones(3, dtype=torch.float16))
    False
    """
    x0 = ins[0]
    if x0.device.type != "cpu" or x0.dtype not in _SUFFIX or compile_mode() != "auto":
        return False
    shape = x0.shape
    if not all(t.shape == shape and t.dtype == x0.dtype and t.is_contiguous() for t in ins):
        return False
    return library() is not None


def run(name: str, *ins: torch.Tensor) -> Comps:
    """Run C kernel `name` on inputs for which :func:`available` holds; returns (zh, zl).

    Both components come from one ``(2, *shape)`` allocation (two independent contiguous
    views).  NaN/inf propagate as in the formulas (the callers patch them).

    >>> import torch
    >>> from anynum.mc import cloops
    >>> x = torch.ones(4)
    >>> if cloops.available(x, x, x):
    ...     zh, zl = cloops.run("dw_plus_fp", x, x * 0, x * 2.0**-30)
    ... else:
    ...     zh, zl = torch.ones(4), torch.full((4,), 2.0**-30)
    >>> zh[0].item(), zl[0].item() == 2.0**-30
    (1.0, True)
    """
    lib = library()
    assert lib is not None
    x0 = ins[0]
    out = torch.empty((2, *x0.shape), dtype=x0.dtype)
    zh, zl = out.unbind(0)
    fn = getattr(lib, f"anynum_mc_{name}_{_SUFFIX[x0.dtype]}")
    n = x0.numel()
    threads = min(torch.get_num_threads(), n // _CHUNK_MIN)
    ptrs = [t.data_ptr() for t in (*ins, zh, zl)]
    if threads <= 1:
        fn(*ptrs, n)
        return zh, zl
    size = x0.element_size()
    step = -(-n // threads)
    run_parallel(fn, [[*(p + i * size for p in ptrs), min(step, n - i)] for i in range(0, n, step)])
    return zh, zl
