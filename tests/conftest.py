"""Shared, generic test helpers: hypothesis profiles, probe-point builders, value comparison.

Helpers are exposed as session fixtures (not imported), so test folders without
``__init__.py`` can use them whatever the import mode.

Hypothesis profiles: ``ci`` (default, modest), ``dev`` and ``thorough``; pick one
with ``ANYNUM_HYPOTHESIS_PROFILE=thorough pytest ...``.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

# --doctest-modules would import each folder's conftest.py a second time as a module named
# "conftest" (the folders have no __init__.py), and two of them clash; they hold no doctests.
collect_ignore_glob = ["*/conftest.py"]

# pytest-xdist already runs one worker per core: a second intra-op thread per worker only
# oversubscribes the cores (10-40x slower elementwise kernels measured on 2 cores). Tests that
# are about thread counts set them explicitly.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("anynum fuzz")
    group.addoption(
        "--fuzz-seed",
        type=int,
        default=None,
        help="seed of the differential fuzzer (tests/fuzz); random draws, reproducible",
    )
    group.addoption(
        "--fuzz-examples",
        type=int,
        default=None,
        help="examples per fuzz test (default: a few in the normal run, unbounded with -m fuzz)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """tests/fuzz read these before their modules are imported: `pytest -m fuzz` is the long mode."""
    marks = (config.getoption("markexpr", "") or "").replace(" ", "")
    if "fuzz" in marks and "notfuzz" not in marks:
        os.environ["ANYNUM_FUZZ_LONG"] = "1"
    for option, env in (("fuzz_seed", "ANYNUM_FUZZ_SEED"), ("fuzz_examples", "ANYNUM_FUZZ_EXAMPLES")):
        value = config.getoption(option, None)
        if value is not None:
            os.environ[env] = str(value)


settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("ANYNUM_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session", autouse=True)
def native_library_built() -> None:
    """The native kernels built (or loaded) before the first test. Otherwise the router runs the
    eager reference while a first build goes on in the background (`clib.library_soon`), and a
    test that checks which kernel ran would see that instead."""
    from anynum.kernels.clib import library

    library()


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (cheaper when test files run in parallel on few cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float64)


def grid_probes(grid: np.ndarray, *, top_step: float | None = None) -> dict[str, np.ndarray]:
    """Probe inputs for rounding onto a grid of finite values (float64, any order, both signs ok).

    Returns ``{"float32": ..., "float64": ...}``: the grid values and their
    negatives, every midpoint of adjacent values (and between max and
    ``max + top_step``, the first value past the top in an unbounded exponent
    range, when `top_step` is given), the float32 (resp. float64) neighbours of
    each midpoint (``np.nextafter``), and NaN, ±inf, ±0. float32 entries are
    only those points exactly representable in float32, plus the float32
    neighbours of each midpoint; values outside float32's range are dropped.
    """
    pos = np.unique(np.abs(np.asarray(grid, dtype=np.float64)))
    pos = pos[np.isfinite(pos)]
    ext = pos if top_step is None else np.append(pos, pos[-1] + top_step)
    if ext[0] > 0:
        ext = np.insert(ext, 0, 0.0)
    mids = ext[:-1] + (ext[1:] - ext[:-1]) / 2  # exact: neighbours within a factor of 2^53
    out = {}
    for dt in (np.float32, np.float64):
        with np.errstate(over="ignore"):
            mids_dt = mids.astype(dt)
            near = np.concatenate(
                [
                    np.nextafter(mids_dt, dt(np.inf)),
                    np.nextafter(mids_dt, dt(0)),
                    np.nextafter(mids_dt, dt(-np.inf)),
                ]
            )
            base = np.concatenate([pos, ext, mids]).astype(dt)
        exact = base.astype(np.float64) == np.concatenate([pos, ext, mids])
        pts = np.concatenate([base[exact], near[np.isfinite(near) & (near >= 0)]])
        pts = np.unique(pts)
        out[np.dtype(dt).name] = np.concatenate([pts, -pts, SPECIALS.astype(dt)])
    return out


def random_floats(n: int, dtype: type, seed: int, lo_exp: int = -140, hi_exp: int = 140) -> np.ndarray:
    """n random values of `dtype` with log-uniform magnitudes in [2**lo_exp, 2**hi_exp) and random signs.

    Exponents are clipped to what `dtype` can hold; the significand uses every bit of `dtype`.
    """
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype)
    lo = max(lo_exp, int(np.log2(float(info.smallest_subnormal))))
    hi = min(hi_exp, int(info.maxexp) - 1)
    exps = rng.integers(lo, hi + 1, n)
    sig = 1.0 + rng.random(n)  # [1, 2)
    vals = np.ldexp(sig, exps).astype(dtype)
    vals = np.where(rng.random(n) < 0.5, -vals, vals).astype(dtype)
    return vals[np.isfinite(vals)]


def assert_same_values(actual, expected, inputs=None, *, what: str = "", check_sign: bool = True):
    """Assert two float arrays are identical as values: NaN where NaN, equal elsewhere, same sign of zero.

    On failure, the message lists up to ten mismatches with their inputs.
    """
    a = np.asarray(actual, dtype=np.float64).reshape(-1)
    e = np.asarray(expected, dtype=np.float64).reshape(-1)
    assert a.shape == e.shape, (a.shape, e.shape)
    same = (a == e) | (np.isnan(a) & np.isnan(e))
    if check_sign:
        same &= (np.signbit(a) == np.signbit(e)) | np.isnan(a)
    if not same.all():
        idx = np.flatnonzero(~same)
        x = None if inputs is None else np.asarray(inputs, dtype=np.float64).reshape(-1)
        rows = [
            f"  x={x[i]!r} expected={e[i]!r} got={a[i]!r}"
            if x is not None
            else f"  [{i}] expected={e[i]!r} got={a[i]!r}"
            for i in idx[:10]
        ]
        raise AssertionError(f"{what}: {idx.size} of {a.size} differ; first ones:\n" + "\n".join(rows))


@pytest.fixture(scope="session")
def probe_points():
    """`grid_probes` as a fixture."""
    return grid_probes


@pytest.fixture(scope="session")
def random_values():
    """`random_floats` as a fixture."""
    return random_floats


@pytest.fixture(scope="session")
def same_values():
    """`assert_same_values` as a fixture."""
    return assert_same_values


@pytest.fixture
def eager_only(monkeypatch):
    """Run anynum's eager reference kernels (ANYNUM_COMPILE=0) unless the environment asks otherwise.

    Oracle suites use this so they stay fast; set ANYNUM_TEST_FUSED=1 to run them
    through the default (possibly compiled) path instead.
    """
    if os.environ.get("ANYNUM_TEST_FUSED") != "1":
        monkeypatch.setenv("ANYNUM_COMPILE", "0")


@pytest.fixture(scope="session")
def float32_probe() -> torch.Tensor:
    """Float32 inputs for bit-exact kernel comparisons: every float16 and bfloat16 pattern, random
    bit patterns, values spread over the whole float32 range (subnormals included) and specials."""
    g = torch.Generator().manual_seed(0)
    all16 = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16)
    raw = torch.randint(-(2**31), 2**31 - 1, (200_000,), generator=g, dtype=torch.int64)
    dense = torch.randn(200_000, generator=g) * torch.exp2(
        torch.randint(-30, 20, (200_000,), generator=g).float()
    )
    spread = torch.randn(100_000, generator=g) * torch.exp2(
        torch.randint(-150, 128, (100_000,), generator=g).float()
    )
    special = [0.0, -0.0, math.inf, -math.inf, math.nan, 448.0, 464.0, 480.0, 57344.0, 61440.0, 65504.0]
    special += [65520.0, 2.0**-18, 2.0**-25, 2.0**-126, 2.0**-149, -(2.0**-149), 3.4028234663852886e38]
    special += [2.0**-9 * 1.5, -(2.0**-10)]
    return torch.cat(
        [
            all16.view(torch.float16).float(),
            all16.view(torch.bfloat16).float(),
            raw.to(torch.int32).view(torch.float32),
            dense,
            spread,
            torch.tensor(special),
        ]
    )
