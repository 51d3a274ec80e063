"""The front door: argument checks, dispatch on the array type, and the straight-through gradient.

Every rounding is run by the kernel the router picks (`anynum.kernels.route`); this
package chooses no route itself. Its modules:

* `core`: `quantize` for torch tensors, NumPy, JAX and Dask arrays, with the straight-through gradient;
* `checks`: the argument checks every entry point shares;
* `codes`: `encode` / `decode`, the format's real bit codes (Block codes included);
* `block`: `quantize_block`, what a Block format stores (elements, scales);
* `integer`: scale/zero-point integer quantization (`quantize_int`);
* `rounder`: `Rounder`, one number category resolved once for training loops.

Importing it installs `quantize`, `encode` and `decode` as the formats' hooks, so
``fmt.quantize(x)``, ``fmt.encode(x)`` and ``fmt.decode(c)`` work without formats/
importing anything above it (DESIGN.md section 7, resolution 2).
"""

from __future__ import annotations

from anynum.formats.base import install_hooks
from anynum.quantize.block import BlockQuantized, quantize_block
from anynum.quantize.checks import check_rand_bits, check_representable, check_tensor
from anynum.quantize.codes import decode, encode
from anynum.quantize.core import quantize, quantize_tensor
from anynum.quantize.integer import IntQuantized, dequantize_int, quantize_int
from anynum.quantize.rounder import Rounder

__all__ = [
    "BlockQuantized",
    "IntQuantized",
    "Rounder",
    "check_rand_bits",
    "check_representable",
    "check_tensor",
    "decode",
    "dequantize_int",
    "encode",
    "quantize",
    "quantize_block",
    "quantize_int",
    "quantize_tensor",
]

install_hooks(quantize=quantize, encode=encode, decode=decode)
