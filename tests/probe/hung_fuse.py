"""A FUSE file system whose reads never return for one process (the agent under test).

    python hung_fuse.py MOUNTPOINT CONTENT_FILE AGENT_PID

Every name in its one directory is a read-only executable file holding CONTENT_FILE's
bytes. Reads by any other process are answered, so the kernel can read the file's
header and fail the exec for real (a foreign ELF: ENOEXEC); reads by AGENT_PID and by
its diagnosis worker processes block forever, like a hung FUSE daemon or NFS server.
Direct I/O keeps the page cache from answering for it. Runs in the foreground until
killed.
"""

from __future__ import annotations

import errno
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

import mfusepy

from execwatch.diagnosis.sandbox import WORKER_NAME


class HungForOne(mfusepy.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, content: bytes, agent_pid: int) -> None:
        self.content = content
        self.agent_pid = agent_pid
        self.never = threading.Event()
        self.now = time.time_ns()

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        times = {"st_atime": self.now, "st_mtime": self.now, "st_ctime": self.now}
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, **times}
        return {
            "st_mode": stat.S_IFREG | 0o755,
            "st_nlink": 1,
            "st_size": len(self.content),
            **times,
        }

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", ".."]

    def open(self, path: str, fi: Any) -> int:
        fi.direct_io = 1
        return 0

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        if self._agent(mfusepy.fuse_get_context()[2]):
            self.never.wait()
            raise mfusepy.FuseOSError(errno.EIO)
        return self.content[offset : offset + size]

    def _agent(self, tid: int) -> bool:
        """The agent itself, or one of its diagnosis worker processes; not a child the
        test forked to exec a file here (its comm is still the agent's during the exec)."""
        try:
            status = Path(f"/proc/{tid}/status").read_text()
        except OSError:
            return False
        fields = {k: v.strip() for k, _, v in (ln.partition(":") for ln in status.splitlines())}
        if int(fields.get("Tgid", tid)) == self.agent_pid:
            return True
        return fields.get("PPid") == str(self.agent_pid) and fields.get("Name") == WORKER_NAME


def main() -> None:
    mountpoint, content, agent_pid = sys.argv[1], Path(sys.argv[2]).read_bytes(), int(sys.argv[3])
    mfusepy.FUSE(
        HungForOne(content, agent_pid),
        mountpoint,
        raw_fi=True,
        foreground=True,
        ro=True,
        fsname="execwatch-hung",
    )


if __name__ == "__main__":
    main()
