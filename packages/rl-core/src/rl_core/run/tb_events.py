"""TensorBoard event files: written in the caller's thread, and cut back to a step so a
resumed run plots each step once.

An event file is a sequence of records (TFRecord framing: 8-byte length, 4-byte
length CRC, the serialized Event, 4-byte data CRC). One process writes a file
in step order, so everything after the first event past the restored step, and
a record torn by a kill, is cut off with one truncate.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
import weakref
from pathlib import Path

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import event_pb2
from tensorboardX.summary import scalar, text

from rl_core.run.faults import fault_point
from rl_core.run.files import write_error

_HEADER = 12  # uint64 length + uint32 masked CRC of the length
_FOOTER = 4  # uint32 masked CRC of the data


def kept_bytes(data: bytes, step: int) -> int:
    """Length of the prefix of an event file's bytes that holds only whole events of steps <= `step`."""
    offset = 0
    while offset + _HEADER <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        end = offset + _HEADER + length + _FOOTER
        if end > len(data):
            break  # torn by a kill mid-write
        event = event_pb2.Event()
        try:
            event.ParseFromString(data[offset + _HEADER : end - _FOOTER])
        except Exception:  # noqa: BLE001 - protobuf's DecodeError; a damaged tail is cut like a torn one
            break
        if event.step > step:
            break
        offset = end
    return offset


def truncate_events(folder: str | Path, step: int) -> None:
    """Cut every event file in `folder` back to the events of steps <= `step`."""
    for path in sorted(Path(folder).glob("events.out.tfevents.*")):
        data = path.read_bytes()
        keep = kept_bytes(data, step)
        if keep < len(data):
            os.truncate(path, keep)


class EventWriter:
    """Scalars and Markdown text to one event file in `folder`, written in the caller's thread.

    tensorboardX's SummaryWriter writes from a thread of its own: there a full disk is a
    traceback on stderr (and a buffered file that fails again at exit), never an error the run
    sees. Here `flush` raises an OSError naming the event file, and the file is closed then.
    """

    def __init__(self, folder: str | Path, filename_suffix: str = "") -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        try:
            self._writer = EventsWriter(os.path.join(folder, "events"), filename_suffix)
        except OSError as e:
            raise write_error(e, folder) from None
        self.path = Path(self._writer._file_name)
        self._failed = False
        # a writer dropped without close (a learner never closed) still writes and closes its file
        self._finalizer = weakref.finalize(self, _close_quietly, self._writer)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._add(scalar(tag, value), step)

    def text(self, tag: str, markdown: str, step: int) -> None:
        self._add(text(tag, markdown), step)

    def _add(self, summary, step: int) -> None:
        event = event_pb2.Event(summary=summary, wall_time=time.time(), step=int(step))
        self._failing(lambda: self._writer.write_event(event))  # a full buffer writes, and may fail

    def flush(self, step: int | None = None) -> None:
        """Write and fsync what was added; an OSError names the file (which is then closed)."""
        self._failing(lambda: (
            fault_point("write", "tensorboard" if step is None else f"tensorboard:{step}"),
            self._writer.flush(),
        ))

    def close(self) -> None:
        self._finalizer.detach()
        if not self._failed:
            self.flush()
            self._writer.close()

    def _failing(self, write) -> None:
        try:
            write()
        except OSError as e:
            self._failed = True
            self._finalizer.detach()
            with contextlib.suppress(OSError):  # closed without its buffer: nothing fails again at exit
                self._writer._py_recordio_writer._writer.close()
            raise write_error(e, self.path) from None


def _close_quietly(writer: EventsWriter) -> None:
    with contextlib.suppress(OSError):
        writer.close()
