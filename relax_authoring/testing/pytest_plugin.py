"""pytest plugin of the contract test kit (entry point ``pytest11: relax_contract``).

Provides the ``relax_contract`` fixture: a callable ``relax_contract(spec, params=None)``
that runs :func:`relax_authoring.testing.check_contract`; and the session-scoped tiny-model
fixtures ``tiny_model_dir`` / ``tiny_moe_model_dir`` / ``tiny_bytes_model_dir`` of :mod:`relax_authoring.testing.fixtures`; and the
``cuda`` marker: a test marked ``@pytest.mark.cuda`` is skipped where no CUDA device is
visible (``-m cuda`` selects them on a GPU machine).  Loaded in every pytest session of
an environment where relax-core is installed, so it imports nothing heavy at load time
(torch only when a collected test carries the marker).
"""

from __future__ import annotations

import pytest

from relax_authoring.testing.fixtures import tiny_bytes_model_dir, tiny_model_dir, tiny_moe_model_dir  # noqa: F401


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker cuda)")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def relax_contract():
    """``relax_contract(spec, params=None)``: run the contract checks chosen by the
    spec's declared capabilities; fails the test listing every failed check."""
    from relax_authoring.testing import check_contract

    return check_contract
