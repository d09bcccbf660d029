"""The OpenAI API's request and response shapes, as pydantic models.

Requests list the fields the server understands: OpenAI's, plus the vLLM extras that
map onto `SamplingParams` (``top_k``, ``min_p``, ``repetition_penalty``, ...). A field
the server does not know is a 400 that names it (``extra="forbid"``), never silently
ignored. Types are checked here; ranges are checked once, by `SamplingParams` and the
engine's admission, and come back as 400s naming the field (`sampling.py`).

Responses are dumped with ``exclude_none=True``: a field that has no value is left out,
which the OpenAI clients read as None.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# --- requests ---------------------------------------------------------------------------


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Request):
    include_usage: bool = False


class SamplingFields(Request):
    """The sampling fields completions and chat completions share."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extra sampling fields (the openai client sends them with extra_body=...)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool = True
    structured_outputs: dict[str, Any] | None = None
    prompt_logprobs: int | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # HF transformers' filters, which vLLM's API does not have (this server's extensions)
    typical_p: float | None = None
    epsilon_cutoff: float | None = None
    eta_cutoff: float | None = None
    no_repeat_ngram_size: int | None = None
    # llama.cpp's and koboldcpp's samplers (this server's extensions, llama.cpp's names)
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    xtc_threshold: float | None = None
    xtc_probability: float | None = None
    mirostat_mode: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None


class CompletionRequest(SamplingFields):
    """POST /v1/completions. ``prompt``: text, token ids, or a list of either."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Request):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedToolChoice(Request):
    type: Literal["function"] = "function"
    function: dict[str, Any]


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None  # chat's {"name", "schema", "strict"}


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions. ``messages`` are passed to the chat template as they
    come (its roles, ``tool_calls`` and ``tool_call_id`` included); a message's content
    may be text or a list of text parts."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    # vLLM's extra chat fields
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


class ResponsesTool(Request):
    """A function tool of the Responses API: the function's fields flat, not under
    ``function`` as in chat completions."""

    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesToolChoice(Request):
    type: Literal["function"] = "function"
    name: str


class ResponsesText(Request):
    format: ResponseFormat | None = None


class ResponsesRequest(Request):
    """POST /v1/responses. ``input`` is a user message's text, or a list of input items:
    messages (role user / system / developer / assistant, content text or text parts),
    ``function_call`` items of earlier turns and their ``function_call_output``.
    Responses are not stored (no ``previous_response_id``, ``store`` must be false)."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesToolChoice | None = None
    parallel_tool_calls: bool = True
    text: ResponsesText | None = None
    stream: bool = False
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None


class EmbeddingRequest(Request):
    """POST /v1/embeddings. ``input``: text, token ids, or a list of either.
    ``dimensions``: a Matryoshka model's shorter embedding (refused, naming the field,
    for other models). ``normalize`` is vLLM's extra field (default: the model's)."""

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    normalize: bool | None = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class ScoreRequest(Request):
    """POST /v1/score (and /score), vLLM's: how well each text of ``text_2`` matches
    ``text_1`` (one text against each, or list against list, pairwise).
    ``activation``: a cross-encoder's sigmoid (default on)."""

    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    activation: bool | None = None
    user: str | None = None


class ScoreData(BaseModel):
    object: Literal["score"] = "score"
    index: int
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreData]
    usage: EmbeddingUsage


class RerankRequest(Request):
    """POST /rerank, /v1/rerank, /v2/rerank (Jina's and Cohere's shape, as vLLM serves
    it): the ``documents`` ordered by their relevance to ``query``, the best ``top_n``
    (all by default), with their texts unless ``return_documents`` is false."""

    model: str | None = None
    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = True
    activation: bool | None = None
    user: str | None = None


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument | None = None
    relevance_score: float


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ClassificationRequest(Request):
    """POST /classify (vLLM's): the class probabilities of each ``input`` (text or token
    ids, or a list of either); ``activation`` false returns the logits."""

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    activation: bool | None = None
    user: str | None = None


class ClassificationData(BaseModel):
    object: Literal["classification"] = "classification"
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ClassificationData]
    usage: EmbeddingUsage


class TokenizeRequest(Request):
    """POST /tokenize: ``prompt`` text, or chat ``messages`` rendered by the template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(Request):
    model: str | None = None
    tokens: list[int]


# --- responses --------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    """The completions API's log-probabilities: parallel lists, one entry per token (None
    for an echoed prompt's first token, which nothing predicts)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's ``prompt_logprobs`` entry of one token at one prompt position."""

    logprob: float
    rank: int
    decoded_token: str


PromptLogprobs = list[dict[int, PromptLogprob] | None]
"""Per prompt token (None for the first): token id -> its entry, the prompt's token first."""


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class FunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallOut(BaseModel):
    """A tool call of a message, or (streaming) a fragment of one, with its index."""

    index: int | None = None
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall | None = None


class ChatMessage(BaseModel):
    """A whole message (``message``) or one chunk's part of it (``delta``).

    ``reasoning`` carries the same text as ``reasoning_content`` (vLLM sends both names)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class MessageItem(BaseModel):
    """The assistant's text, an output item of a response."""

    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningItem(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = MessageItem | FunctionCallItem | ReasoningItem


class ResponseUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class ResponseObject(BaseModel):
    """A response of the Responses API (``object: "response"``)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    model: str
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    incomplete_details: dict[str, str] | None = None
    error: dict[str, str] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ResponsesTool] = Field(default_factory=list)
    tool_choice: str | ResponsesToolChoice = "auto"
    parallel_tool_calls: bool = True
    metadata: dict[str, str] | None = None
    store: bool = False


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "pyagent"
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base model
    max_model_len: int | None = None


class LoadLoRAAdapterRequest(BaseModel):
    """``POST /v1/load_lora_adapter`` (vLLM's): serve the adapter at ``lora_path`` as
    the model ``lora_name``."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(BaseModel):
    """``POST /v1/unload_lora_adapter`` (vLLM's): stop serving the adapter ``lora_name``."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo
