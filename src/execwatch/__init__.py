"""execwatch: catch, diagnose and attribute failed execs on Linux nodes."""

__version__ = "0.1.0"
