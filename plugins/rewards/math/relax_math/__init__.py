"""Math reward scorers for Relax: ``math`` (math-verify equivalence of the final boxed
answer) and ``gsm8k`` (numeric comparison of the final number with a GSM8K label)."""
