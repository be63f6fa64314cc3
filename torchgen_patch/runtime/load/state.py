"""What this process has registered: one ``Registry``, held here as ``REGISTRY``, the only
registration state of the package (kernels registered, the handles that keep them alive, the
libraries loaded, the evidence of runtime ops), guarded by its own lock."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field


@dataclass(eq=False)
class Registry:
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while kernels are registered or removed
    installed: dict = field(default_factory=dict)  # op -> the backend that serves it (Backend, or "boxed")
    handles: list = field(default_factory=list)  # keeps registrations alive (torch.library.Library)
    libraries: dict = field(default_factory=dict)  # (st_dev, st_ino) of a library loaded -> its ctypes handle
    evidence: object = None  # pykernel.Evidence of the runtime ops registered with evidence=True

    def reset_lock(self) -> None:
        """A child forked while another thread held the lock would wait for it forever: it starts free."""
        self.lock = threading.Lock()


REGISTRY = Registry()
os.register_at_fork(after_in_child=REGISTRY.reset_lock)
