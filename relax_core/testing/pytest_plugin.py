"""pytest plugin of the contract test kit (entry point ``pytest11: relax_contract``).

Provides the ``relax_contract`` fixture: a callable ``relax_contract(spec, params=None)``
that runs :func:`relax_core.testing.check_contract`; and the session-scoped tiny-model
fixtures ``tiny_model_dir`` / ``tiny_moe_model_dir`` of :mod:`relax_core.testing.fixtures`.  Loaded in every pytest session of
an environment where relax-core is installed, so it imports nothing heavy at load time.
"""

from __future__ import annotations

import pytest

from relax_core.testing.fixtures import tiny_model_dir, tiny_moe_model_dir  # noqa: F401  (fixtures)


@pytest.fixture
def relax_contract():
    """``relax_contract(spec, params=None)``: run the contract checks chosen by the
    spec's declared capabilities; fails the test listing every failed check."""
    from relax_core.testing import check_contract

    return check_contract
