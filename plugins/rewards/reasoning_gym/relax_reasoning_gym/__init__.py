"""reasoning-gym for Relax: the ``rg:`` data source and the ``reasoning_gym`` scorer."""
