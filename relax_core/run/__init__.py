"""Starting, stopping and continuing a run: ``launch`` (``relax train``: flags → config,
preflight, components, the loop), ``checkpoint`` (atomic checkpoints, the newest complete
one), ``resume`` (which run ``--resume`` continues, with which configuration),
``interrupts`` (Ctrl-C) and ``exits`` (the exit codes)."""
