"""kombu's filesystem transport, with every message complete before it appears in the queue folder.

kombu's own ``_put`` creates the message file in the queue folder and only then locks it and writes the message. A
worker polling the folder can move the file away in between (a rename ignores the lock) and read it empty: the
worker's consumer fails with ``JSONDecodeError`` and the task is lost (the symptom of celery/kombu#1551). It happened
here about once in ten demo runs, to the reports enqueued ten at once. This transport writes each message to a hidden
file in the same folder, which the worker never picks up (its name is not ``<stamp>.<queue>.msg``), and renames it
into place only when it is complete: a rename within one file system is atomic, so a worker sees no message or all
of it.

Settings: ``CELERY_BROKER_TRANSPORT = "bank_site.broker:Transport"`` with ``CELERY_BROKER_URL = "filesystem://"``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    # kombu's stubs name the argument "message" in the base class and "payload" in this one: one must be ignored.
    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        """Put ``payload`` onto ``queue``: write a hidden file, then rename it to the name the worker polls for."""
        folder = self.data_folder_out
        final = os.path.join(folder, f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg")
        partial = os.path.join(folder, f".{uuid.uuid4()}.partial")
        try:
            with open(partial, "wb") as f:
                f.write(dumps(payload).encode("utf-8"))
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
