"""OpenAI request and response bodies as msgspec Structs (decoded strictly, unknown keys ignored).

The Structs carry every constraint JSON Schema can say (types, ranges, enums, lengths), so the
published OpenAPI schema and the server agree: a body the schema accepts is not refused for its
shape. What needs two fields or the model (`top_logprobs` without `logprobs`, `best_of` != `n`,
token ids past the vocabulary, a prompt longer than the context) is checked in `core/jobs`, and
each such error names the parameter too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

# JSON integers are unbounded; everything past the engine stays within int64. The ranges below
# mirror SamplingParams.validate, so the OpenAPI schema documents them.
Int = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
StopString = Annotated[str, Meta(min_length=1)]
Unsupported = Meta(max_length=0, description="not supported: omit it (or send it empty)")

# ---- requests -------------------------------------------------------------------------------


class StreamOptions(Struct):
    include_usage: bool = False


class ContentPart(Struct):
    """A text part of a message's content (image and audio parts are not supported)."""

    type: Literal["text"]
    text: str


Role = Literal["system", "developer", "user", "assistant", "tool"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ChatMessage(Struct):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDefinition(Struct, omit_defaults=True):
    name: Annotated[str, Meta(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class Tool(Struct):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Struct):
    name: str


class NamedToolChoice(Struct):
    """Force one call of this function."""

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class TextFormat(Struct, tag_field="type", tag="text"):
    """Plain text: no constraint."""


class JsonObjectFormat(Struct, tag_field="type", tag="json_object"):
    """Any JSON object."""


class JsonSchemaSpec(Struct):
    schema: dict[str, Any]  # the JSON schema the output must match
    name: str | None = None
    description: str | None = None
    strict: bool | None = None


class JsonSchemaFormat(Struct, tag_field="type", tag="json_schema"):
    """JSON matching `json_schema.schema`."""

    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


class _SamplingFields(Struct, kw_only=True):
    """The sampling knobs both endpoints share (OpenAI's plus common vLLM/SGLang extensions)."""

    model: str | None = None  # None: the served model
    temperature: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    # -1 and 0 both mean no top-k cut.
    top_k: Annotated[int, Meta(ge=-1, le=2**63 - 1)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    seed: Int | None = None
    stop: StopString | Annotated[list[StopString], Meta(max_length=16)] | None = None
    stop_token_ids: list[Count] | None = None
    n: Annotated[int, Meta(ge=1, le=64)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: Annotated[dict[str, float], Unsupported] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    speculative: bool = True  # False: no n-gram drafts for this request (serve --speculative)
    # Structured output: at most one of these (type "text" does not count).
    response_format: ResponseFormat | None = None
    regex: str | None = None
    ebnf: str | None = None
    # Ollama's keep_alive, here too: seconds or "5m"; 0 unloads the model after this request,
    # -1 keeps it loaded.
    keep_alive: float | str | None = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    # None: the server's --default-max-tokens.
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True
    # Extra variables for the chat template (vLLM's and SGLang's field), e.g. Qwen3's
    # {"enable_thinking": false}; Ollama's `think` sets that one.
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's reasoning_effort: given to the template (gpt-oss's "Reasoning: low"); "none"
    # turns thinking off where the template can (enable_thinking) and lets a forced tool call
    # start at once, without a reasoning block.
    reasoning_effort: ReasoningEffort | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    # A string, a list of strings, a list of token ids, or a list of token-id lists. An empty
    # string only with a suffix (a gap at the start of a file); completion_job says so.
    prompt: str | Annotated[list[str | Count | list[Count]], Meta(min_length=1)]
    max_tokens: Count | None = None  # None: the server's --default-max-tokens
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    suffix: str | None = None  # fill-in-the-middle: the text after the completion
    best_of: Annotated[int, Meta(ge=1, le=64)] | None = None


# ---- responses (what the routes encode; optional keys a reply leaves out are omitted) -------


class PromptTokensDetails(Struct):
    cached_tokens: int = 0


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct):
    content: list[ChatTokenLogprob]


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class FunctionCall(Struct):
    name: str
    arguments: str  # JSON text


class ToolCall(Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(Struct, omit_defaults=True):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionResponse(Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(Struct, omit_defaults=True):
    arguments: str
    name: str | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    """A tool call's first delta has id, type and name; later ones only more arguments."""

    index: int
    function: FunctionCallDelta
    id: str | None = None
    type: Literal["function"] | None = None


class ChatDelta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(Struct):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(Struct, kw_only=True, omit_defaults=True):
    """One SSE event of a chat stream; `usage` only in the last (stream_options.include_usage)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class CompletionResponse(Struct, kw_only=True, omit_defaults=True):
    """A text completion, or one SSE event of its stream (where `usage` comes last, if asked)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "localradix"  # gateways (smg) treat "sglang"/"vllm" owners as those engines
    root: str  # the model's path or repository
    max_model_len: int


class ModelList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(Struct):
    error: ErrorDetail
