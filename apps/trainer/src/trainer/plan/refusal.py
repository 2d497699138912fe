"""A compiler's refusal to build a program that does not fit, read as a verdict.

XLA:CPU compiles a program of any size and reports its bytes (`memory_analysis`); XLA:TPU checks
the program against the chip's memory while it compiles and refuses one that does not fit, with
RESOURCE_EXHAUSTED and the sizes in its message:

  RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries
  (70.66G) exceeds available HBM (15.75G).
  RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm.
  Used 21.95G of 15.48G hbm. Exceeded hbm capacity by 6.47G.     (older libtpu releases)

The first names what its total is for (HLO temporaries, as above), and the verdict says so. Only
those are turned into `ProgramRefused`: any other error, a RESOURCE_EXHAUSTED of a kernel's
scratch memory (vmem) included, is a fault to see in full, not a verdict.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from jax.errors import JaxRuntimeError

from trainer.plan.device_memory import GIB

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = r"([\d.]+)\s*([KMGT]?)i?B?"
_REQUIRED = re.compile(rf"required for ([\w ]+?) \({_SIZE}\) exceeds available HBM \({_SIZE}\)")
_USED = re.compile(rf"memory space hbm\. Used {_SIZE} of {_SIZE} hbm")


class ProgramRefused(Exception):
    """The compiler refused a program that does not fit the device's memory."""

    def __init__(self, platform: str, needed_bytes: int, available_bytes: int, what: str) -> None:
        self.platform, self.what = platform, what
        self.needed_bytes, self.available_bytes = needed_bytes, available_bytes
        super().__init__(self.verdict())

    def to_dict(self) -> dict[str, object]:
        """`trainer plan --json`'s answer: a plan's `fits` and `verdict`, with the compiler's sizes."""
        return {"fits": False, "verdict": self.verdict(), "refused_by": self.platform,
                "needed_bytes": self.needed_bytes, "available_bytes": self.available_bytes}

    def verdict(self) -> str:
        """One line, worded as `Plan.verdict` words a plan that does not fit."""
        return (f"does NOT fit: the {self.platform.upper()} compiler needs {self.needed_bytes / GIB:.2f} GiB "
                f"{self.what}, the device has {self.available_bytes / GIB:.2f} GiB")


def refusal(error: BaseException, platform: str) -> ProgramRefused | None:
    """`error` as a refusal by `platform`'s compiler, or None when it is not one."""
    if not isinstance(error, JaxRuntimeError) or "RESOURCE_EXHAUSTED" not in str(error):
        return None
    message = str(error)
    if match := _REQUIRED.search(message):  # "HLO temporaries", as XLA:TPU says it today
        what = "of " + match.group(1).removeprefix("HLO ")
        return ProgramRefused(platform, _bytes(*match.group(2, 3)), _bytes(*match.group(4, 5)), what)
    if match := _USED.search(message):
        return ProgramRefused(platform, _bytes(*match.group(1, 2)), _bytes(*match.group(3, 4)), "in all")
    return None


@contextlib.contextmanager
def refusals_as_verdicts(platform: str) -> Iterator[None]:
    """Raise `ProgramRefused` for a compiler's refusal inside; let every other error through as it is."""
    try:
        yield
    except JaxRuntimeError as e:
        if (refused := refusal(e, platform)) is None:
            raise
        raise refused from None  # the verdict is the answer: the compiler's long report is not


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])
