"""Format names: ``an.format("e4m3fn")``, ``an.format("fixed(8,4)")`` and `list_formats()`.

Preset names live in one table; parametric families register a regular
expression and a factory (`register_family`), so the posit, table and block
modules add their own names without this module knowing them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass

from anynum.errors import FormatError
from anynum.formats import floating as fl
from anynum.formats.base import Format, family_classes, record_preset_name
from anynum.formats.fixed import FixedPoint, IntFormat

__all__ = ["format", "list_formats", "register_family", "register_name"]

_NAMES: dict[str, Format] = {}
_CANONICAL: list[str] = []  # the names list_formats() shows, in registration order


@dataclass(frozen=True)
class _Family:
    pattern: re.Pattern[str]
    factory: Callable[[re.Match[str]], Format]
    example: str


_FAMILIES: list[_Family] = []


def _key(name: str) -> str:
    return re.sub(r"[\s\-]", "", name.strip().lower())


def register_name(fmt: Format, *names: str) -> None:
    """Make `fmt` reachable under each of `names` (the first is the canonical one)."""
    for i, n in enumerate(names):
        _NAMES[_key(n)] = fmt
        if i == 0:
            _CANONICAL.append(n)
            record_preset_name(fmt, n)


def register_family(regex: str, factory: Callable[[re.Match[str]], Format], example: str) -> None:
    """Register a parametric family: names fully matching `regex` build a format via `factory`."""
    _FAMILIES.append(_Family(re.compile(regex), factory, example))


def format(name: str | Format) -> Format:
    """Look up a format by name (case-insensitive); a Format passes through.

    Presets (``"fp16"``, ``"bf16"``, ``"e4m3fn"``, ``"fp8_e5m2"``, ``"q43"``, ...)
    and families: ``"e{E}m{M}"`` with optional ``fn``/``fnuz`` suffix,
    ``"fixed(I,F)"``, ``"ufixed(I,F)"``, ``"int8"``/``"uint4"``,
    ``"p3109(k,p)"`` (suffix ``u`` unsigned, ``f`` finite domain). A format's
    `canonical_name` reads back too: a preset name, or a constructor call with
    literal arguments (``"Posit(n=12, es=1)"``), parsed without executing anything.

    >>> import anynum as an
    >>> an.format("Block(element=e2m1, block_size=16)") == an.Block(an.E2M1, 16)
    True
    >>> an.format("fp8_e4m3fn") == an.E4M3FN
    True
    >>> an.format("fixed(8,4)")
    FixedPoint(8, 4)
    >>> an.format("e4m3fm")
    Traceback (most recent call last):
    ...
    anynum.errors.FormatError: unknown format 'e4m3fm'. Did you mean 'e4m3fn', 'e4m3', 'e4m3fnuz'? ...
    """
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise FormatError(f"a format name must be a string or Format, got {type(name).__name__}.")
    if _CONSTRUCTOR.match(name):
        return _from_constructor(name)
    key = _key(name)
    if key in _NAMES:
        return _NAMES[key]
    for family in _FAMILIES:
        m = family.pattern.fullmatch(key)
        if m:
            return family.factory(m)
    close = difflib.get_close_matches(key, list(_NAMES), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    examples = ", ".join(f.example for f in _FAMILIES)
    raise FormatError(
        f"unknown format {name!r}.{hint} Known presets: an.list_formats(); families: {examples}."
    )


_CONSTRUCTOR = re.compile(r"\s*[A-Z]\w*\s*\(")
_MAX_SPEC_CHARS = 1 << 20


def _from_constructor(spec: str) -> Format:
    """A format from its canonical constructor call, read as literals only: nothing is executed."""
    import ast

    if len(spec) > _MAX_SPEC_CHARS:
        raise FormatError(f"a format name of {len(spec)} characters is too long to be one.")
    try:
        tree = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError as exc:
        raise FormatError(f"cannot read the format {spec[:80]!r}: {exc.msg}.") from None
    classes = family_classes()

    def value(node: ast.AST) -> object:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool, type(None))):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = value(node.operand)
            if isinstance(inner, (int, float)) and not isinstance(inner, bool):
                return -inner
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(value(e) for e in node.elts)
        if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
            return float(node.id)
        if isinstance(node, ast.Name) and _key(node.id) in _NAMES:  # a nested preset, by name
            return _NAMES[_key(node.id)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes:
            args = [value(a) for a in node.args]
            kwargs = {k.arg: value(k.value) for k in node.keywords if k.arg is not None}
            if len(kwargs) != len(node.keywords):
                raise FormatError(f"cannot read the format {spec[:80]!r}: ** arguments are not allowed.")
            try:
                return classes[node.func.id](*args, **kwargs)  # type: ignore[arg-type]
            except TypeError as exc:
                raise FormatError(f"cannot build {node.func.id} from {spec[:80]!r}: {exc}.") from None
        raise FormatError(
            f"cannot read the format {spec[:80]!r}: only format constructors "
            f"({', '.join(sorted(classes))}) with literal arguments are allowed."
        )

    fmt = value(tree)
    if not isinstance(fmt, Format):
        raise FormatError(f"{spec[:80]!r} does not name a format.")
    return fmt


def list_formats() -> list[str]:
    """Canonical names of every preset, in a stable order.

    >>> import anynum as an
    >>> "e4m3fn" in an.list_formats()
    True
    """
    return list(_CANONICAL)


# --- built-in names ------------------------------------------------------------------------

register_name(fl.FP64, "fp64", "float64", "double", "binary64")
register_name(fl.FP32, "fp32", "float32", "single", "binary32")
register_name(fl.TF32, "tf32", "tensorfloat32")
register_name(fl.FP16, "fp16", "float16", "half", "binary16", "e5m10")
register_name(fl.BF16, "bf16", "bfloat16")
register_name(fl.E5M2, "e5m2", "fp8_e5m2", "float8_e5m2")
register_name(fl.E4M3FN, "e4m3fn", "fp8_e4m3fn", "float8_e4m3fn", "fp8_e4m3")
register_name(fl.E4M3FNUZ, "e4m3fnuz", "fp8_e4m3fnuz", "float8_e4m3fnuz")
register_name(fl.E5M2FNUZ, "e5m2fnuz", "fp8_e5m2fnuz", "float8_e5m2fnuz")
register_name(fl.E4M3, "e4m3", "float8_e4m3")
register_name(fl.E3M4, "e3m4", "float8_e3m4")
register_name(fl.E3M2, "e3m2", "fp6_e3m2", "float6_e3m2fn")
register_name(fl.E2M3, "e2m3", "fp6_e2m3", "float6_e2m3fn")
register_name(fl.E2M1, "e2m1", "fp4", "fp4_e2m1", "float4_e2m1fn")
register_name(fl.E8M0, "e8m0", "float8_e8m0fnu", "e8m0fnu")
register_name(fl.Q43, "q43")
register_name(fl.Q52, "q52")
for _bits in (2, 4, 8, 16, 32):
    register_name(IntFormat(_bits), f"int{_bits}")
    register_name(IntFormat(_bits, signed=False), f"uint{_bits}")


def _float_family(m: re.Match[str]) -> Format:
    specials = {"": "ieee", "fn": "fn", "fnuz": "fnuz"}[m.group(3) or ""]
    return fl.FloatFormat(int(m.group(1)), int(m.group(2)), specials=specials)


def _p3109_family(m: re.Match[str]) -> Format:
    signed = "u" not in (m.group(3) or "")
    domain = "finite" if "f" in (m.group(3) or "") else "extended"
    return fl.p3109(int(m.group(1)), int(m.group(2)), signed=signed, domain=domain)


register_family(r"e(\d+)m(\d+)(fnuz|fn)?", _float_family, "'e{E}m{M}[fn|fnuz]'")
register_family(
    r"(u?)fixed\((-?\d+),(-?\d+)\)",
    lambda m: FixedPoint(int(m.group(2)), int(m.group(3)), signed=not m.group(1)),
    "'fixed(I,F)'",
)
register_family(r"(u?)int(\d+)", lambda m: IntFormat(int(m.group(2)), signed=not m.group(1)), "'int{N}'")
register_family(r"p3109\((\d+),(\d+)\)([uf]*)", _p3109_family, "'p3109(k,p)[u][f]'")
