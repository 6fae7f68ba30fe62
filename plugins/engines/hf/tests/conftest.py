from relax_core.testing.fixtures import tiny_model_dir, tiny_moe_model_dir  # noqa: F401  (until the kit's pytest plugin registers them)
