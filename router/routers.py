"""Build the ``Router`` a frontend or router service uses, by policy name."""

from __future__ import annotations

from typing import Any

from router.kv.keys import namespace
from router.kv.redis_index import RedisPrefixIndex
from router.kv.router import ApproxKvRouter, KvRouter, KvRouterConfig
from router.policies import LocalRouter, Router, make_policy
from schemas import Subjects


def build_router(
    name: str,
    subjects: Subjects,
    redis: Any | None = None,
    kv: KvRouterConfig | None = None,
    seed: int | None = None,
) -> Router | None:
    """``None`` means pool routing (the pool subject decides)."""
    if name == "kv":
        if redis is None:
            raise ValueError("the kv router needs Redis (--redis URL)")
        return KvRouter(RedisPrefixIndex(redis, namespace(subjects.prefix)), kv, seed)
    if name == "approx":
        return ApproxKvRouter(kv, seed)
    policy = make_policy(name, seed)
    return None if policy is None else LocalRouter(policy)


async def warm_router(router: Router | None) -> None:
    """Open connections and load scripts before the first request (a no-op for local policies)."""
    if isinstance(router, KvRouter):
        await router.warm()
