"""What a run writes and shows: metric sinks and the run directory (``metrics``), the
terminal line (``progress``) and the end-of-run summary (``summary``); ``relax plot`` is
:mod:`cli.plot`."""
