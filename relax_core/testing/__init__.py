"""Contract test kit for plugin authors (work in progress: ``check_contract`` lands next)."""
