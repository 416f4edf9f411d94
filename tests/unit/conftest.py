"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest

from model.tokenizer import ModelTokenizer
from tests.support.tokenizers import shipped_tokenizer


@pytest.fixture(scope="module")
def tok() -> ModelTokenizer:
    """The shipped model's tokenizer."""
    return shipped_tokenizer()
