"""prompt_embeds: the tensor header read without torch (from files torch itself wrote), hostile
archives refused, and the request path's other ends (validation, migration, the vLLM engine)."""

from __future__ import annotations

import base64
import io
import pickle
import zipfile
from pathlib import Path

import msgspec
import pytest

from router.frontend.prompt_embeds import PromptEmbedsError, decode_prompt_embeds
from router.generation import migrated_request
from schemas import Request, SamplingParams, StructuredOutput
from schemas.validate import request_problem

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize(
    ("name", "dtype", "shape"),
    [
        ("prompt_embeds_f32_3x64.pt", "float32", (3, 64)),
        ("prompt_embeds_bf16_5x64.pt", "bfloat16", (5, 64)),
        ("prompt_embeds_f32_1d.pt", "float32", (64,)),
        ("prompt_embeds_f16_2x32_view.pt", "float16", (2, 32)),  # a view: the whole storage saved
    ],
)
def test_headers_of_tensors_torch_saved(name: str, dtype: str, shape: tuple[int, ...]) -> None:
    """The files were written by ``torch.save`` (torch 2.13, CPU) of the dtypes and shapes named."""
    raw = (DATA / name).read_bytes()
    data, header = decode_prompt_embeds(base64.b64encode(raw).decode())
    assert data == raw and (header.dtype, header.shape) == (dtype, shape)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("echo pwned",))


def _archive(payload: bytes) -> str:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        # a fixed date: the test's ids hold the archive, equal in every process (pytest-xdist)
        z.writestr(zipfile.ZipInfo("archive/data.pkl", date_time=(2024, 1, 1, 0, 0, 0)), payload)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not base64 at all!", "base64"),
        (base64.b64encode(b"plain bytes").decode(), "torch.save"),
        (_archive(pickle.dumps(_Evil())), "posix.system|os.system"),
        (_archive(pickle.dumps({"a": 1})), "one tensor"),
        (_archive(b"\x80\x02garbage"), "torch.save"),
    ],
)
def test_anything_but_a_saved_tensor_is_refused(text: str, match: str) -> None:
    with pytest.raises(PromptEmbedsError, match=match):
        decode_prompt_embeds(text)


def test_a_request_of_prompt_embeds_needs_no_tokens() -> None:
    sp = SamplingParams(max_tokens=4)
    assert request_problem(Request("r", "m", (), sp, prompt_embeds=b"x")) is None
    assert request_problem(Request("r", "m", (), sp)) == "token_ids is empty"


def test_a_migrated_request_keeps_every_field_but_what_the_move_changes() -> None:
    """Set every field of Request to a non-default value: the next attempt keeps each one except
    the prompt, budget, attempt, count, route and KV transfer parameters."""
    sampling = SamplingParams(
        max_tokens=10, seed=3, logprobs=2, structured=StructuredOutput(json_object=True)
    )
    old = Request(
        "r",
        "m",
        (1, 2, 3),
        sampling,
        lora_name="l",
        detokenize=False,
        skip_special_tokens=False,
        task="embed",
        dimensions=8,
        prompt_embeds=b"t",
        kv_transfer_params={"a": 1},
        created_at_s=5.0,
    )
    new = migrated_request(old, 3, [7, 8], remaining=8)
    changed = {
        "token_ids",
        "sampling",
        "attempt",
        "num_generated_before",
        "route",
        "kv_transfer_params",
    }
    for field in msgspec.structs.fields(Request):
        if field.name not in changed:
            assert getattr(new, field.name) == getattr(old, field.name), field.name
    assert new.token_ids == (1, 2, 3, 7, 8) and new.attempt == 1 and new.num_generated_before == 2
    assert new.sampling.max_tokens == 8 and new.sampling.logprobs == 2
    assert new.kv_transfer_params is None and new.route is None
