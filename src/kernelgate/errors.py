"""Every error and warning kernelgate raises, in one hierarchy.

Each error class also subclasses the builtin that fits it, so ``except ValueError`` in user code
keeps working::

    KernelgateError
    ├── InputError                      a call received an argument its op's contract rejects
    │   ├── InputTypeError  (TypeError)     wrong Python type or dtype
    │   ├── InputValueError (ValueError)    wrong rank, size, dimension or scalar range
    │   └── DeviceError     (ValueError)    tensors on different devices
    ├── DeclarationError (TypeError)    an op, argument spec or implementation is declared wrongly
    ├── SettingsError    (ValueError)   a KERNELGATE_* variable or configure() value is invalid
    ├── TritonUnavailableError (RuntimeError)
    │                                   mode "triton" was requested but no Triton implementation
    │                                   can run (or passed the correctness gate for) these inputs
    ├── CheckError (RuntimeError)       check mode found a Triton result that differs from the
    │                                   reference
    └── BenchError (ValueError)         a benchmark request is invalid: an unknown op or dtype,
                                        a malformed suite file or results CSV

    KernelgateWarning (UserWarning)
    ├── FallbackWarning                 a call took the reference path instead of Triton
    ├── LogWriteWarning                 the launch log could not be written and was disabled
    ├── CacheWarning                    the decision cache is corrupt, unreadable or unwritable,
    │                                   or holds an entry that does not fit the op's declaration
    └── CheckWarning                    check mode found a mismatch and demoted the decision

Messages name the argument, what was expected, what was received and how to fix it.
"""

from __future__ import annotations

import os
import sys

__all__ = [
    "BenchError",
    "CacheWarning",
    "CheckError",
    "CheckWarning",
    "DeclarationError",
    "DeviceError",
    "FallbackWarning",
    "InputError",
    "InputTypeError",
    "InputValueError",
    "KernelgateError",
    "KernelgateWarning",
    "LogWriteWarning",
    "SettingsError",
    "TritonUnavailableError",
]


class KernelgateError(Exception):
    """Base class of every error kernelgate raises."""


class InputError(KernelgateError):
    """A call's argument violates its op's input contract."""


class InputTypeError(InputError, TypeError):
    """An argument has the wrong Python type or dtype."""


class InputValueError(InputError, ValueError):
    """An argument has the wrong rank, size, dimension or value."""


class DeviceError(InputError, ValueError):
    """The tensors of one call live on different devices."""


class DeclarationError(KernelgateError, TypeError):
    """An op, an argument spec or an implementation is declared wrongly."""


class SettingsError(KernelgateError, ValueError):
    """A setting (a KERNELGATE_* variable or a configure() value) is invalid."""


class TritonUnavailableError(KernelgateError, RuntimeError):
    """Mode "triton" was requested, but no Triton implementation can run these inputs here."""


class CheckError(KernelgateError, RuntimeError):
    """Check mode found a Triton result that differs from the reference; the message is the report."""


class BenchError(KernelgateError, ValueError):
    """A benchmark request is invalid: an unknown op or dtype, a malformed suite file or results CSV."""


class KernelgateWarning(UserWarning):
    """Base class of every warning kernelgate emits."""


class FallbackWarning(KernelgateWarning):
    """A call ran the reference implementation instead of a Triton one (emitted once per op and reason)."""


class LogWriteWarning(KernelgateWarning):
    """The launch log could not be written; logging is disabled for the rest of the process."""


class CacheWarning(KernelgateWarning):
    """The decision cache could not be used as is (it is rebuilt or kept in memory)."""


class CheckWarning(KernelgateWarning):
    """Check mode found a mismatch and, as configured, demoted the decision to the reference."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep if torch and torch.__file__ else _PACKAGE_DIR


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the first caller outside kernelgate and torch.

    Calls often pass through torch (``torch.ops``, ``nn.Module.__call__``), whose frames say
    nothing about where the user's call is.
    """
    frame = sys._getframe(1)
    level = 1
    internal = (_PACKAGE_DIR, _torch_dir())
    while frame.f_back is not None and frame.f_code.co_filename.startswith(internal):
        frame = frame.f_back
        level += 1
    return level
