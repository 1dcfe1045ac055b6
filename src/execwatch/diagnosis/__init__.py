"""Why did the kernel refuse to run this file? Looks at the file inside the task's root."""

from execwatch.diagnosis.diagnoser import FileDiagnoser

__all__ = ["FileDiagnoser"]
