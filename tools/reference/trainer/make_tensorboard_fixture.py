"""Golden TFRecord bytes for g4ft-trainer's TensorBoard writer (crates/trainer/src/metrics/tensorboard.rs).

Builds the four events the Rust test encodes (file version, two scalars, a SessionLog START) as
tensorboard's own event_pb2.Event messages, frames each with tensorboard's RecordWriter (length,
masked CRC-32C, data, masked CRC-32C) and writes their hex to tensorboard_fixture.json next to
this script.

Regenerate: /opt/refenv/bin/python tools/reference/trainer/make_tensorboard_fixture.py
(needs `pip install tensorboard` in that environment)
"""

import io
import json
import os

import tensorboard
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

HERE = os.path.dirname(os.path.abspath(__file__))


def scalar(wall_time, step, tag, value):
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def main():
    events = [
        event_pb2.Event(wall_time=1.5, file_version="brain.Event:2"),
        scalar(2.25, 3, "train/loss", 1.25),
        scalar(1_747_000_000.125, 123_456_789, "train/lr", 2e-4),
        event_pb2.Event(wall_time=3.0, step=21,
                        session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)),
    ]
    records = []
    for e in events:
        buf = io.BytesIO()
        RecordWriter(buf).write(e.SerializeToString())
        records.append(buf.getvalue().hex())
    path = os.path.join(HERE, "tensorboard_fixture.json")
    with open(path, "w") as f:
        json.dump(dict(tensorboard=tensorboard.__version__, records=records), f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
