"""Every user-facing error anynum raises.

`AnynumError` is both a ValueError and a TypeError, so code written against
either built-in (``except ValueError``) keeps working; each message names what
was expected, what was received, and how to fix it.
"""

from __future__ import annotations

__all__ = ["AnynumError", "FormatError", "InputError", "RepresentabilityError"]


class AnynumError(ValueError, TypeError):
    """Base class of every error raised by anynum for bad user input."""


class FormatError(AnynumError):
    """A format was configured with impossible parameters or an unknown name."""


class InputError(AnynumError):
    """An array or argument passed to an anynum function cannot be used."""


class RepresentabilityError(AnynumError):
    """A result would not be exactly representable in the requested container dtype."""
