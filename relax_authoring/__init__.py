"""Tools for plugin and documentation authors, not used by a run: ``relax plugins new``
(``scaffold``) and the generated documentation (``docgen``).  The contract test kit is
:mod:`relax_authoring.testing` (public API)."""
