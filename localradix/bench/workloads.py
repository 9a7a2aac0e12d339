"""The benchmark workloads: seeded, reproducible conversations that mirror real use.

A workload is a list of sessions. A session is a fixed opening (system prompt) and one or more
user turns; turn k+1 is sent only after turn k's reply arrived, with that reply appended.
Sessions run concurrently; sharing between sessions (system prompt, tool list, document) is
what a prefix cache can exploit.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from localradix.bench.words import TextGen, json_tokens

WORKLOADS = ("agent", "chat", "rag", "random", "single")

WORKLOAD_HELP = {
    "agent": "many requests sharing one long system prompt + tool list, short unique tasks",
    "chat": "several multi-turn conversations growing turn by turn (IDE assistant)",
    "rag": "a few long documents, many questions per document",
    "random": "unique prompts, no sharing",
    "single": "one request at a time, unique prompts (latency)",
}


@dataclass(frozen=True)
class Sizes:
    """User-chosen sizes; None = the workload's default. Counts scale with `scale`."""

    scale: float = 1.0
    num_requests: int | None = None  # agent, random, single
    num_conversations: int | None = None  # chat
    turns: int | None = None  # chat
    num_docs: int | None = None  # rag
    questions_per_doc: int | None = None  # rag
    system_tokens: int | None = None  # agent, chat
    doc_tokens: int | None = None  # rag
    prompt_tokens: int | None = None  # the unique part of each request
    max_tokens: int | None = None


# Defaults at scale 1: small enough for a CPU model, big enough to show prefix reuse.
DEFAULTS = {
    "agent": dict(num_requests=32, system_tokens=1024, prompt_tokens=48, max_tokens=48),
    "chat": dict(num_conversations=4, turns=6, system_tokens=128, prompt_tokens=64, max_tokens=96),
    "rag": dict(num_docs=2, questions_per_doc=8, doc_tokens=2048, prompt_tokens=24, max_tokens=48),
    "random": dict(num_requests=32, prompt_tokens=512, max_tokens=96),
    "single": dict(num_requests=8, prompt_tokens=256, max_tokens=128),
}
SCALED = ("num_requests", "num_conversations", "num_docs")


@dataclass(frozen=True)
class Session:
    system: str | None
    turns: tuple[str, ...]


@dataclass(frozen=True)
class Workload:
    name: str
    sessions: tuple[Session, ...]
    max_tokens: int
    params: dict
    sequential: bool = False  # one request at a time, whatever --concurrency says

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


def resolve_sizes(name: str, sizes: Sizes) -> dict:
    """The workload's effective sizes: defaults, overridden by flags, counts scaled."""
    if name not in DEFAULTS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    chosen = {k: v for k, v in asdict(sizes).items() if v is not None}
    out = {}
    for key, default in DEFAULTS[name].items():
        if key in chosen:
            out[key] = chosen[key]
        elif key in SCALED:
            out[key] = max(1, round(default * sizes.scale))
        else:
            out[key] = default
    return out


def build_workload(name: str, sizes: Sizes = Sizes(), seed: int = 0, nonce: str = "") -> Workload:
    """Materialize a workload. Same (name, sizes, seed, nonce) -> byte-identical prompts.

    `nonce`, when given, opens every prompt, so a server whose cache is warm from an earlier run
    cannot reuse prefixes across runs; prompts within one run share exactly as designed.
    """
    params = resolve_sizes(name, sizes)
    gen = TextGen(f"{name}:{seed}")
    sessions = _BUILDERS[name](gen, params)
    if nonce:
        sessions = [_with_nonce(s, nonce) for s in sessions]
    return Workload(
        name=name,
        sessions=tuple(sessions),
        max_tokens=params["max_tokens"],
        params={**params, "seed": seed, "nonce": nonce},
        sequential=name == "single",
    )


def _with_nonce(s: Session, nonce: str) -> Session:
    tag = f"[run {nonce}] "
    if s.system is not None:
        return Session(tag + s.system, s.turns)
    return Session(None, (tag + s.turns[0],) + s.turns[1:])


def _agent(gen: TextGen, p: dict) -> list[Session]:
    tool_text = json.dumps(_tools(gen, p["system_tokens"] * 2 // 3), indent=1)
    intro = "You are an agent that completes tasks by calling tools. "
    system = (
        intro
        + gen.prose(p["system_tokens"] - json_tokens(tool_text) - 12)
        + "\n\nAvailable tools:\n"
        + tool_text
    )
    return [
        Session(system, (f"Task {i}: " + gen.prose(p["prompt_tokens"]),))
        for i in range(p["num_requests"])
    ]


def _tools(gen: TextGen, n_tokens: int) -> list[dict]:
    """Tool definitions in OpenAI's JSON shape, about `n_tokens` tokens in all."""
    tools: list[dict] = []
    while not tools or json_tokens(json.dumps(tools, indent=1)) < n_tokens:
        params = {gen.name(): {"type": "string", "description": gen.text(6)} for _ in range(2)}
        fn = {
            "name": gen.name(),
            "description": gen.text(gen.randint(12, 40)),
            "parameters": params,
        }
        tools.append({"type": "function", "function": fn})
    return tools


def _chat(gen: TextGen, p: dict) -> list[Session]:
    out = []
    for c in range(p["num_conversations"]):
        system = f"You are a helpful coding assistant. Project {c}: " + gen.prose(
            p["system_tokens"]
        )
        turns = tuple(gen.prose(p["prompt_tokens"]) for _ in range(p["turns"]))
        out.append(Session(system, turns))
    return out


def _rag(gen: TextGen, p: dict) -> list[Session]:
    system = "Answer the question using only the document the user provides."
    docs = [gen.prose(p["doc_tokens"]) for _ in range(p["num_docs"])]
    sessions = [
        Session(system, (f"Document:\n{doc}\n\nQuestion: {gen.prose(p['prompt_tokens'])}",))
        for doc in docs
        for _ in range(p["questions_per_doc"])
    ]
    gen.shuffle(sessions)  # questions arrive interleaved across documents
    return sessions


def _unique(gen: TextGen, p: dict) -> list[Session]:
    return [
        Session(None, (f"Request {i}. " + gen.prose(p["prompt_tokens"]),))
        for i in range(p["num_requests"])
    ]


_BUILDERS = {"agent": _agent, "chat": _chat, "rag": _rag, "random": _unique, "single": _unique}
