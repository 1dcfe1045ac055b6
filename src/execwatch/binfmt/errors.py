"""The exceptions the binfmt readers raise on malformed input: one base, two kinds of "why".

Callers that only need "could not be understood" catch BinfmtError; the subclasses let a
report say whether the file was cut short or built to exhaust the reader.
"""


class BinfmtError(Exception):
    """A file could not be understood as an executable format.

    The message is one line ("truncated ELF header", "program header table outside the file")
    so that callers can print it next to a path without further formatting.
    """


class TruncatedFile(BinfmtError):
    """An offset or size points past the end of the file: it was cut short (or lies)."""


class ParseLimitExceeded(BinfmtError):
    """The file asks for more entries, string bytes, reads or time than any real one needs.

    Raised instead of allocating or looping: the parser's budget is a fixed, small multiple
    of what the largest real binaries use (see ElfLimits).
    """
