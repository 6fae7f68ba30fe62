"""The plugin host: loading plugins (``plugins``), the one capability table
(``capabilities``), startup validation before anything loads (``validation``,
``reward_check``) and the capability matrix of ``relax capabilities`` (``matrix``)."""
