"""The errors for input that cannot be scanned: the CLI prints the one line and exits 2.

ScanInputError is the base the CLI catches; the subclasses say why, so that a test, a
caller or a log can tell a broken artifact from a hostile one from an empty one.
"""


class ScanInputError(Exception):
    """Bad, hostile or unsupported input (corrupt archive, path escape, bomb, unknown type)."""


class CorruptInput(ScanInputError):
    """Truncated or corrupt archive, stream or JSON, or a file that is not what it is named."""


class LimitExceeded(ScanInputError):
    """More entries, bytes, nesting or links than any real image has: a bomb, refused."""


class NothingToCheck(ScanInputError):
    """The target holds no executable: a CI gate must not read that as "no findings"."""
