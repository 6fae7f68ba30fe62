"""TIS correction plugin for Relax."""
