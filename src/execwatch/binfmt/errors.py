"""The single exception the binfmt readers raise on malformed input."""


class BinfmtError(Exception):
    """A file could not be understood as an executable format.

    The message is one line ("truncated ELF header", "program header table outside the file")
    so that callers can print it next to a path without further formatting.
    """
