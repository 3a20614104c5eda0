"""kopf's API client module as released, for tests that install gpuplane's decoding on it."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from kopf._cogs.clients import api as kopf_api

from gpuplane.controller import kopf_decoding


def reset_api() -> None:
    """Reload kopf's API module: no bounded decoder, no transform."""
    importlib.reload(kopf_api)
    for mark in (kopf_decoding._MARK, kopf_decoding._TRANSFORM):
        if hasattr(kopf_api, mark):
            delattr(kopf_api, mark)


@pytest.fixture
def pristine_kopf() -> Iterator[Any]:
    """kopf's API module as released, restored afterwards for the other tests."""
    reset_api()
    yield kopf_api
    reset_api()
