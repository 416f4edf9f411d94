"""A request's prompt as token ids: the chat template or the completion prompt, tokenized off the
event loop (``tokenize.py``), checked against the model (vocabulary, context length), and the
other prompt forms (``prompt_embeds``, an embedding input, the echoed text)."""

from __future__ import annotations

from collections.abc import Callable

from router.discovery import ServedModel
from router.frontend.errors import OpenAIError, bad, context_length_exceeded
from router.frontend.openai_protocol import ChatCompletionRequest, CompletionRequest
from router.frontend.params import GenerationParams
from router.frontend.prompt_embeds import PromptEmbedsError, decode_prompt_embeds
from router.frontend.tokenize import PromptTokenizer, PromptTooLong


class Prompts:
    def __init__(self, tokenizer: PromptTokenizer, idle: Callable[[], bool]) -> None:
        """``idle()``: nothing else is in flight (small prompts are then tokenized inline)."""
        self.tokenizer = tokenizer
        self.idle = idle

    async def chat(
        self,
        served: ServedModel,
        creq: ChatCompletionRequest,
        params: GenerationParams,
        size_hint: int,
    ) -> list[int]:
        """The messages through the model's chat template (with the request's tools)."""
        tok = served.tokenizer
        messages = creq.messages_as_dicts()
        extra = creq.template_kwargs()
        tools = params.tools.template_tools() if params.tools is not None else None
        if tools:
            extra["tools"] = tools

        def render() -> str:
            return tok.apply_chat_template(messages, add_generation_prompt=True, **extra)

        return await self._tokenize(served, render, size_hint, "messages")

    async def completion(
        self, served: ServedModel, creq: CompletionRequest, size_hint: int
    ) -> list[int]:
        """The completion prompt: text tokenized, or token ids checked."""
        prompt = creq.prompt_value()
        if not isinstance(prompt, str):
            if any(t < 0 or t >= served.tokenizer.vocab_size for t in prompt):
                raise bad("prompt", "prompt contains token ids outside the vocabulary")
            return list(prompt)
        text: str = prompt
        return await self._tokenize(served, lambda: text, size_hint, "prompt")

    async def embedding_input(
        self, served: ServedModel, item: str | list[int], size_hint: int
    ) -> list[int]:
        """One ``/v1/embeddings`` input: text tokenized, or token ids checked."""
        context = served.card.context_length
        if isinstance(item, list):
            if any(t >= served.tokenizer.vocab_size for t in item):
                raise bad("input", "input contains token ids outside the vocabulary")
            ids = list(item)
        else:
            try:
                ids = await self.tokenizer.tokenize(
                    served.card.name,
                    served.tokenizer,
                    lambda: item,
                    context,
                    size_hint,
                    idle=self.idle(),
                )
            except PromptTooLong as exc:
                raise _input_too_long(context, exc.at_least) from None
        if len(ids) > context:
            raise _input_too_long(context, len(ids))
        return ids

    async def _tokenize(
        self, served: ServedModel, render: Callable[[], str], size_hint: int, param: str
    ) -> list[int]:
        ctx = served.card.context_length
        try:
            return await self.tokenizer.tokenize(
                served.card.name, served.tokenizer, render, ctx, size_hint, idle=self.idle()
            )
        except PromptTooLong as exc:
            raise context_length_exceeded(
                ctx, f"your {param} resulted in at least {exc.at_least} tokens", param, param
            ) from None
        except ValueError as exc:  # a template that refuses the messages
            if isinstance(exc, OpenAIError):
                raise
            raise bad(param, str(exc)) from None

    @staticmethod
    def embeds(served: ServedModel, creq: CompletionRequest) -> tuple[bytes, int]:
        """``prompt_embeds``: the tensor's bytes and positions, checked against the model."""
        card = served.card
        if "prompt_embeds" not in card.tasks:
            raise bad(
                "prompt_embeds",
                f"The model `{card.name}` takes no prompt_embeds: its workers are not vLLM "
                "workers started with --vllm-arg enable_prompt_embeds=true.",
            )
        try:
            data, header = decode_prompt_embeds(creq.prompt_embeds_value() or "")
        except PromptEmbedsError as exc:
            raise bad("prompt_embeds", str(exc)) from None
        if len(header.shape) != 2 or header.shape[0] < 1:
            raise bad(
                "prompt_embeds",
                f"prompt_embeds must be 2-D (positions x hidden size), got shape {header.shape}",
            )
        if card.hidden_size and header.shape[1] != card.hidden_size:
            raise bad(
                "prompt_embeds",
                f"prompt_embeds has {header.shape[1]} columns; this model's hidden size is "
                f"{card.hidden_size}",
            )
        return data, header.shape[0]

    @staticmethod
    def echo_text(served: ServedModel, creq: CompletionRequest, prompt: list[int]) -> str:
        """The prompt as ``echo`` sends it back: as given when it was text."""
        value = creq.prompt_value()
        return value if isinstance(value, str) else served.tokenizer.decode(prompt, False)


def _input_too_long(context: int, tokens: int) -> OpenAIError:
    return context_length_exceeded(context, f"an input has {tokens} tokens", "input", "input")
