"""The ``llm_judge`` scorer for Relax (``--reward llm_judge``): a generative judge grades each response."""
