"""Error types shared by every stage.

`UsageError` is a problem with the whole run (bad option, missing checkpoint): the CLI maps it to exit code 2.
`ItemError` is a problem with one input item: the pipeline records it and goes on with the others.
`RunError` (and `DeviceError`, a device that cannot go on) ends the run, keeping finished work: exit code 1.
"""

from __future__ import annotations


class GemmaEmbedError(Exception):
    """Base class of the errors this package raises on purpose."""


class UsageError(GemmaEmbedError):
    """The run cannot start or go on: a bad option, a missing checkpoint, an unwritable output."""


class CheckpointError(UsageError):
    """The checkpoint lacks what the command needs, or its tensors do not match the tower."""


class RunError(GemmaEmbedError):
    """The run had to stop (disk full, output unwritable); finished work is kept where it could be."""


class DeviceError(RunError):
    """The device failed in a way that persists (a CUDA illegal address, a device-side assert): every later
    chunk would fail too, so the run stops at once, keeping the items already saved."""


class ItemError(GemmaEmbedError):
    """One item failed at one stage. The message is one line and names the file."""

    def __init__(
        self, key: str, stage: str, message: str, error_type: str | None = None, traceback_text: str | None = None
    ):
        self.key = key
        self.stage = stage
        self.error_type = error_type or type(self).__name__
        self.message = " ".join(str(message).split())  # always one line
        self.traceback_text = traceback_text  # shown with --debug only
        self.warnings: list[str] = []  # what libraries said while this item was decoded (capture.py)
        super().__init__(f"{key}: {self.message}")

    def __reduce__(self):
        """Pickled whole (a Ray run's decoded rows carry their failures to the encode actors and the driver)."""
        return (type(self), (self.key, self.stage, self.message, self.error_type, self.traceback_text), self.__dict__)

    @classmethod
    def wrap(cls, key: str, stage: str, exc: BaseException) -> ItemError:
        if isinstance(exc, ItemError):
            return exc
        import traceback

        text = str(exc) or type(exc).__name__
        return cls(key, stage, text, type(exc).__name__, "".join(traceback.format_exception(exc)))

    def as_record(self) -> dict:
        return {
            "key": self.key,
            "stage": self.stage,
            "error": self.error_type,
            "message": self.message,
            "warnings": list(self.warnings),
        }
