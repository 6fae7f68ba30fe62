"""Score-centering correction plugin for Relax."""
