"""The stages that :mod:`relax_core.trainer` composes into one step: ``rollout`` (where
scored batches come from and where weights go: ``Rollout``, the sources, the
``Publisher``), ``episodes`` and ``env_host`` (the episode runner and where its
environment calls run), ``rewarding`` (the reward stage), ``loss`` (the actor and critic losses of a
micro-batch) and ``optimizer`` (one optimizer step for every backend)."""
