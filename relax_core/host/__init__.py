"""The plugin host: loading plugins (``plugins``), the one capability table
(``capabilities``) and startup validation before anything loads (``validation``,
``reward_check``)."""
