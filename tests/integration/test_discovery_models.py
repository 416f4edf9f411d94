"""Discovery loads a model card's tokenizer even when its chunks vanish under the read."""

from __future__ import annotations

import asyncio

import pytest

from base.topology import ensure_topology
from model.card import default_model_dir, load_model_dir, to_model_card
from router.discovery import Discovery
from router.fleet_state import FleetState
from schemas import encode, model_token
from schemas.streams import MODEL_FILES_STORE, MODELS_BUCKET
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


async def test_a_tokenizer_whose_chunks_were_purged_is_read_again(nc, subjects):
    """Two workers starting at once both put ``tokenizer.json``: the second put purges the chunks
    of the first, and a frontend reading them waited forever (nats-py's get has no deadline). The
    state that read saw is rebuilt here: the object's meta names chunks that are gone."""
    js = nc.jetstream()
    await ensure_topology(js, subjects)
    local = load_model_dir(default_model_dir())
    name = f"{model_token(local.name)}/tokenizer.json"
    store = await js.object_store(subjects.bucket_name(MODEL_FILES_STORE))
    info = await store.put(name, local.tokenizer_json)
    stream = f"OBJ_{subjects.bucket_name(MODEL_FILES_STORE)}"
    await js.purge_stream(
        stream, subject=f"$O.{subjects.bucket_name(MODEL_FILES_STORE)}.C.{info.nuid}"
    )
    models = await js.key_value(subjects.bucket_name(MODELS_BUCKET))
    await models.put(model_token(local.name), encode(to_model_card(local, name)))

    discovery = Discovery(nc, subjects, FleetState(), tokenizer_read_timeout_s=0.5)
    started = asyncio.create_task(discovery.start())
    try:
        # the first read waits on the purged chunks (its consumer is there); then the worker's
        # second put lands
        async def reading_purged() -> bool:
            consumers = await js.consumers_info(stream)
            return any(info.nuid in (c.config.filter_subject or "") for c in consumers)

        await wait_for(reading_purged, timeout=10)
        await store.put(name, local.tokenizer_json)
        await asyncio.wait_for(started, 20)
        await wait_for(lambda: local.name in discovery.models, timeout=5)
        served = discovery.models[local.name]
        assert served.tokenizer.decode(served.tokenizer.encode("hello fleet")) == "hello fleet"

        # the reads' consumers are gone with them, the abandoned one included
        async def no_readers() -> bool:
            return not await js.consumers_info(stream)

        await wait_for(no_readers, timeout=10)
    finally:
        started.cancel()
        await discovery.stop()
