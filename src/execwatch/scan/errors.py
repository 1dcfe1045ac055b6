"""The errors for input that cannot be scanned: the CLI prints the one line and exits 2.

ScanInputError is the base the CLI catches (the neutral runnable.errors.InputError, which
the file-system views and the linker raise too); the subclasses say why, so that a test, a
caller or a log can tell a broken artifact from a hostile one from an empty one.
"""

from execwatch.runnable.errors import CorruptInput, InputError, LimitExceeded

ScanInputError = InputError

__all__ = ["CorruptInput", "LimitExceeded", "NothingToCheck", "ScanInputError"]


class NothingToCheck(ScanInputError):
    """The target holds no executable: a CI gate must not read that as "no findings"."""
