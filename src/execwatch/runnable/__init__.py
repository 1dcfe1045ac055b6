"""Will this binary start here? The knowledge the node's diagnosis and `execwatch scan` share.

- views of a root filesystem (fs.py): an image's layer stack in memory (memory.py), a
  tree on disk (directory.py), a live task's root through openat2 (liveroot.py,
  openat2.py: the one wrapper of that syscall);
- the dynamic loader's library search (linker.py), on any view, within a budget
  (limits.py; errors.py for input past it);
- the rules (rules.py), whose faults speak one vocabulary, Reason (reason.py);
- whether an image runs on an architecture, one vocabulary for audit and placement,
  Outcome (verdict.py).

It imports neither scan nor diagnosis: they both import it.
"""

from execwatch.runnable.reason import Reason

__all__ = ["Reason"]
