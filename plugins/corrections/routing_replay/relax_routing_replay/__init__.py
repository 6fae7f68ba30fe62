"""MoE routing replay (R3) correction plugin for Relax."""
