"""relax-tools: function calling with an exact calculator."""
