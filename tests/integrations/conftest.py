"""The hand-built graph and untrained model every adapter test reads (``tests.datasets.hand_built_artifacts``:
no Ray, a few seconds), built once per session, and the Python API's answers they are compared with."""

from __future__ import annotations

import pytest

from tests.datasets import hand_built_artifacts


@pytest.fixture(scope="session")
def hand_built(tmp_path_factory):
    """(artifacts, model directory, the graph's questions)."""
    return hand_built_artifacts(tmp_path_factory.mktemp("integrations"), "dense")


@pytest.fixture(scope="session")
def retriever(hand_built):
    from seeder import Retriever

    return Retriever.load(hand_built[1])


@pytest.fixture(scope="session")
def questions(hand_built):
    """A few of the graph's questions and one that names nothing in it."""
    return hand_built[2][:4] + ["which places are linked to nothing at all"]
