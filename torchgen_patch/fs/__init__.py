"""The file system, where another account or a damaged disk could have been first: every path this
tool reads from or writes to, and every directory it makes, swaps or locks, is reached through
descriptors checked on their own.

``walk``: a path found one component at a time (``find``, ``Found``), each symlink on the way followed
only where the kernel's ``protected_symlinks`` rule would; ``protected``: those rules
(``may_follow``, ``may_replace``), the directories an output may go into (``foreign_dir``) and who
may have written a path (``problem``, ``trusted_uids``);
``dirs``: a checked directory (``Dir``, ``open_dir``) and every operation below it; ``atomic``: a file
replaced whole (``replace_at``, ``atomic_write``) and ``renameat2``; ``locks``: the lock files no other
account can make or hold; ``leases``: which temporary build is alive, and the sweep of the others;
``load``: the name a library is loaded by; ``root``: where the cache lives and its -v notes;
``decode``: the JSON a lease or an entry holds.
"""
