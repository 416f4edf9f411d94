"""Flags declared once from config classes: defaults, types, units, and the argv round trip
that ``jetfleet up`` and the local connector rely on."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from infra.cli import build_parser, fleet, parse_args
from infra.cli.components import (
    CLIENT,
    FRONTEND,
    INDEXER,
    KV,
    MOCKER,
    TOKENIZE,
    VLLM,
    WORKER,
    engine_argv,
    routing_argv,
)
from infra.cli.flags import ConfigFlags, Flag, field_docs
from router.client import ClientConfig
from router.kv.router import KvRouterConfig
from schemas import Subjects
from workers.engines.mocker.config import MockerConfig


def parse(*argv: str) -> argparse.Namespace:
    return parse_args(list(argv))


def test_no_flags_give_the_configs_defaults() -> None:
    args = parse("worker")
    assert MOCKER.build(args) == MockerConfig()
    fe = parse("frontend")
    assert KV.build(fe) == KvRouterConfig()
    assert CLIENT.build(fe) == ClientConfig()
    assert CLIENT.build(parse("router-service")).wait_for_worker_s == 5.0


def test_flags_set_fields_with_their_types_and_units() -> None:
    args = parse(
        "worker", "--speedup", "20", "--no-prefix-caching", "--block-size", "64",
        "--flush-interval-ms", "7", "--drain-timeout", "9", "--role", "decode",
    )  # fmt: skip
    mocker = MOCKER.build(args)
    assert (mocker.speedup, mocker.enable_prefix_caching, mocker.block_size) == (20.0, False, 64)
    worker = WORKER.build(args, nats_url="n", model_dir=".", model_name="m")
    assert worker.flush_interval_s == pytest.approx(0.007)
    assert (worker.drain_timeout_s, worker.role) == (9.0, "decode")
    assert worker.worker_id.startswith("w-")  # generated when not given


def test_shared_fields_feed_every_config_that_declares_them() -> None:
    args = parse("worker", "--engine", "vllm", "--block-size", "32", "--max-num-seqs", "8")
    vllm = VLLM.build(args, model="/m")
    assert (vllm.block_size, vllm.max_num_seqs) == (32, 8)
    assert (MOCKER.build(args).block_size, MOCKER.build(args).max_num_seqs) == (32, 8)


def test_a_shared_flag_left_unset_gives_each_engine_its_own_default() -> None:
    """vLLM picks its step budget by platform (2,048 tokens on a CPU, as its own server); the
    mocker's 8,192 once reached vLLM through the shared flag, and a CPU step prefilling 8k
    tokens kept every other request's first token waiting behind it."""
    args = parse("worker", "--engine", "vllm")
    assert VLLM.build(args, model="/m").max_num_batched_tokens is None  # vLLM's own default
    assert MOCKER.build(args).max_num_batched_tokens == MockerConfig().max_num_batched_tokens
    given = parse("up", "--engine", "vllm", "--model", "/m", "--max-num-batched-tokens", "8192")
    child = parse("worker", *engine_argv(given))  # the mocker's default value, passed on still
    assert VLLM.build(child, model="/m").max_num_batched_tokens == 8192


def test_argv_reproduces_the_arguments_in_a_child_process() -> None:
    up = parse(
        "up", "--speedup", "20", "--no-prefix-caching", "--model", "/tmp/m",
        "--kv-temperature", "0", "--stall-timeout", "5", "--router", "approx",
    )  # fmt: skip
    child = parse("worker", *engine_argv(up))
    assert MOCKER.build(child) == MOCKER.build(up)
    assert child.model == "/tmp/m"
    fe = parse("frontend", *routing_argv(up))
    assert KV.build(fe) == KV.build(up) and KV.build(fe).temperature == 0.0
    assert CLIENT.build(fe).stall_timeout_s == 5.0 and fe.router == "approx"
    assert engine_argv(parse("up")) == []  # defaults are not repeated


def test_the_block_size_defaults_by_engine_and_vllm_flags_reach_its_workers() -> None:
    assert parse("worker").block_size == 16
    assert parse("worker", "--engine", "vllm").block_size == 32  # the CPU build's multiple
    assert parse("worker", "--engine", "vllm", "--block-size", "64").block_size == 64
    up = parse(
        "up", "--engine", "vllm", "--model", "/m", "--max-num-seqs", "8", "--cpu-threads", "1",
        "--enable-lora", "--vllm-arg", "max_model_len=2048",
    )  # fmt: skip
    argv = engine_argv(up)
    assert argv.count("--max-num-seqs") == 1  # a flag both engines declare, passed on once
    assert "--block-size" not in argv  # the child resolves the same default
    child = parse("worker", *argv)
    assert VLLM.build(child, model="/m") == VLLM.build(up, model="/m")
    assert child.vllm_arg == ["max_model_len=2048"] and child.block_size == 32
    assert "--enable-lora" not in engine_argv(parse("up", "--enable-lora"))  # mocker: not vLLM's


def test_repeatable_flags_become_tuples() -> None:
    fe = parse("frontend", "--api-key", "a", "--api-key", "b")
    assert FRONTEND.build(fe).api_keys == ("a", "b")


def test_the_tokenizer_cache_flag_reaches_the_frontend_config_and_child_processes() -> None:
    from infra.cli.serve import frontend_argv

    fe = parse("frontend", "--tokenizer-cache-tokens", "1000")
    assert TOKENIZE.build(fe).cache_tokens == 1000
    assert TOKENIZE.build(parse("frontend")).cache_tokens == 4_000_000
    child = parse("frontend", *frontend_argv(fe))
    assert TOKENIZE.build(child) == TOKENIZE.build(fe)


def test_help_shows_each_flags_default_and_doc(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("worker", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "--num-gpu-blocks NUM_GPU_BLOCKS KV cache size, in blocks. (default: 16384)" in text
    assert "--flush-interval-ms" in text and "(default: 5.0 ms)" in text
    assert "--drain-timeout" in text and "(default: 60.0 s)" in text


def test_field_docs_reads_docstrings_and_comments() -> None:
    docs = field_docs(MockerConfig)
    assert docs["num_gpu_blocks"] == "KV cache size, in blocks."
    assert field_docs(ClientConfig)["max_attempts"] == "first try + migrations"


def test_a_declared_field_must_exist() -> None:
    with pytest.raises(KeyError):
        ConfigFlags(MockerConfig, Flag("no_such_field"))


def test_a_flag_two_sets_share_must_have_one_default() -> None:
    """Both sets read a shared flag's value: a default of one set's would reach the other's
    config (the mocker's 8,192 prompt tokens a step once reached vLLM this way)."""

    @dataclasses.dataclass
    class Small:
        max_num_batched_tokens: int = 2048

    parser = argparse.ArgumentParser()
    ConfigFlags(MockerConfig, "max_num_batched_tokens").add_to(parser)
    with pytest.raises(ValueError, match="--max-num-batched-tokens"):
        ConfigFlags(Small, "max_num_batched_tokens").add_to(parser)
    agreed = argparse.ArgumentParser()
    for cls in (MockerConfig, Small):  # no default of the flag's own: each config keeps its own
        ConfigFlags(cls, Flag("max_num_batched_tokens", default=None)).add_to(agreed)
    assert (
        ConfigFlags(Small, Flag("max_num_batched_tokens", default=None)).build(
            agreed.parse_args([])
        )
        == Small()
    )


def test_every_indexer_field_but_the_wiring_is_a_flag() -> None:
    names = {s.field for s in INDEXER.specs}
    wiring = {"nats_url", "redis_url", "subjects", "indexer_id"}
    from router.indexer import IndexerConfig

    assert names == {f.name for f in dataclasses.fields(IndexerConfig)} - wiring


def _subparsers(parser: argparse.ArgumentParser, path: str = "jetfleet"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, f"{path} {name}")


def test_every_command_and_option_explains_itself() -> None:
    missing = []
    for path, parser in _subparsers(build_parser()):
        parser.format_help()  # renders (no stray % in a help text)
        if path != "jetfleet" and not parser.description:
            missing.append(f"{path}: no description")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or not action.option_strings:
                continue
            if "-h" in action.option_strings:
                continue
            if not action.help:
                missing.append(f"{path} {action.option_strings[0]}: no help")
            elif action.default not in (None, False, [], (), "") and "default" not in action.help:
                missing.append(f"{path} {action.option_strings[0]}: default not shown")
    assert missing == []


def test_up_runs_on_given_servers_or_embedded_ones() -> None:
    """Without --nats / --redis up starts its own (None); with them it uses those (the routing
    flag's environment default must not make up skip its embedded Redis)."""
    embedded = parse("up")
    assert (embedded.nats, embedded.redis, embedded.replicas) == (None, None, 1)
    given = parse(
        "up", "--nats", "nats://a:4222,nats://b:4222", "--redis", "redis://r:6379/0",
        "--replicas", "3",
    )  # fmt: skip
    assert (given.nats, given.redis, given.replicas) == (
        "nats://a:4222,nats://b:4222",
        "redis://r:6379/0",
        3,
    )


@pytest.mark.parametrize("command", ["up", "servers"])
def test_the_embedded_redis_is_one_server_unless_shards_are_asked(command: str) -> None:
    assert parse(command).redis_shards == 1
    assert parse(command, "--redis-shards", "3").redis_shards == 3


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["servers", "--redis-shards", "0"], "--redis-shards is 1 or more, not 0"),
        (["up", "--redis", "redis://h:1", "--redis-shards", "3"], "with --redis there is none"),
    ],
)
def test_redis_shards_that_cannot_be_started_are_refused(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fleet.run(parse(*argv), Subjects(), runner=lambda _: 0) == 2
    assert problem in capsys.readouterr().err
