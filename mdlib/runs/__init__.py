"""How runs are named, filed, locked and scheduled; nothing here changes a run's numbers.

- ``identity``: a run's kind, config, code fingerprint and key (``RunId``), and the table of kinds;
- ``files``: an entry's files, written atomically and checked when read back (and ``atomic_write``);
- ``lockfile``: one holder at a time, safe on NFS, and whether a process is alive;
- ``store``: the results store (``load``, ``exists``, ``save``, ``load_or_run``), keyed by ``RunId``;
- ``pool``: training runs through the store, in worker processes or an executor's jobs;
- ``progress``: the status files a pool writes for the command that shows its progress.
"""
