"""Cutting TensorBoard event files back to a step, so a resumed run plots each step once.

An event file is a sequence of records (TFRecord framing: 8-byte length, 4-byte
length CRC, the serialized Event, 4-byte data CRC). One process writes a file
in step order, so everything after the first event past the restored step, and
a record torn by a kill, is cut off with one truncate.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from tensorboardX.proto import event_pb2

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
