"""Input that cannot be read within bounds: a broken artifact or a hostile one.

The file-system views and the linker raise these; `execwatch scan` prints the one line and
exits 2 (scan.errors names the base ScanInputError), the node's diagnosis reports the
file undiagnosed.
"""


class InputError(Exception):
    """Bad, hostile or unsupported input (corrupt archive, path escape, bomb, unknown type)."""


class CorruptInput(InputError):
    """Truncated or corrupt archive, stream or JSON, or a file that is not what it is named."""


class LimitExceeded(InputError):
    """More entries, bytes, nesting or links than any real image has: a bomb, refused."""
