"""The error for input that cannot be scanned: the CLI prints its one line and exits 2."""


class ScanInputError(Exception):
    """Bad, hostile or unsupported input (corrupt archive, path escape, bomb, unknown type)."""
