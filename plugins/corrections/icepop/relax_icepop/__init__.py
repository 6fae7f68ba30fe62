"""ICE-POP correction plugin for Relax."""
