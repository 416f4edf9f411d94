import pytest

from router.kv.index import InMemoryPrefixIndex
from tests.kv_contract import IndexContract


class TestInMemoryIndex(IndexContract):
    @pytest.fixture
    def index(self):
        return InMemoryPrefixIndex()
