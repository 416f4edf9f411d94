import pytest

from router.kv.index import InMemoryPrefixIndex
from tests.support.kv_contract import IndexContract


class TestInMemoryIndex(IndexContract):
    @pytest.fixture
    def index(self):
        return InMemoryPrefixIndex()


async def test_dump_lists_each_models_blocks_and_holders() -> None:
    from schemas.hashing import block_hashes
    from tests.support.kv_contract import BS, Feeder, M, tokens

    index = InMemoryPrefixIndex()
    f = Feeder(index)
    await f.store("a", tokens(8))
    await f.store("b", tokens(4))
    h = block_hashes(tokens(8), BS)
    assert index.dump() == {M: {h[0]: frozenset({"a", "b"}), h[1]: frozenset({"a"})}}
