"""The ``reward_model`` scorer for Relax (``--reward reward_model --reward-model-path DIR``)."""
