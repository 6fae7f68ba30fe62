"""What a run writes and shows: metric sinks and the run directory (``metrics``), the
terminal line (``progress``), the end-of-run summary (``summary``) and ``relax plot``
(``plotting``)."""
