"""On-policy distillation (OPD) plugin for Relax."""
