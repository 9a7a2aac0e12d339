"""A FAKE engine core and tokenizer for server tests that need no model (fast, deterministic).

The tokenizer is byte-level (id = byte, 256 = <eos>), so multi-byte characters always split
across tokens. Greedy output cycles through GREEDY_TEXT (with an emoji in it); sampled output is
letters from an RNG seeded by (seed, step). A prompt containing "[eos]" ends after one sentence;
one containing "CRASH" makes `step` raise, which kills the engine process.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

from localradix.messages import (
    EngineStats,
    GenerateRequest,
    ModelInfo,
    RequestOutput,
    TokenLogprob,
)

EOS = 256
GREEDY_TEXT = "The quick brown fox 🦊 jumps over the lazy dog. "
STEP_DELAY_S = float(os.environ.get("FAKE_STEP_DELAY_S", "0.002"))


class FakeTokenizer:
    eos_token_ids = (EOS,)
    vocab_size = 257

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)  # no BOS: the rule adds none

    def piece_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b"<eos>"

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
            elif not skip_special_tokens:
                out.append(buf.decode("utf-8", "replace") + "<eos>")
                buf = bytearray()
        return "".join(out) + buf.decode("utf-8", "replace")

    def convert_ids_to_tokens(self, ids):
        return [f"<0x{i:02X}>" if i < 256 else "<eos>" for i in ids]

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, **kw) -> str:
        for m in messages:
            if m["role"] not in ("system", "user", "assistant", "tool", "developer"):
                raise ValueError(f"unknown role {m['role']!r}")
        text = "".join(f"<{m['role']}>{m.get('content') or ''}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def fake_tokenizer(args) -> FakeTokenizer:
    return FakeTokenizer()


@dataclass
class _Req:
    msg: GenerateRequest
    cached: int
    out: list[int] = field(default_factory=list)
    sent: int = 0
    lps: list[TokenLogprob] = field(default_factory=list)


class FakeCore:
    def __init__(self, args) -> None:
        self.args = args
        self.tokenizer = FakeTokenizer()
        self.context_length = args.context_length or 2048
        self.kv_total = args.max_total_tokens or 16384
        self.info = ModelInfo(
            name=args.served_model_name or "fake-model",
            path="<fake>",
            context_length=self.context_length,
            vocab_size=257,
            backend="fake",
            device="cpu",
            dtype="float32",
            kv_total_tokens=self.kv_total,
            architecture="fake",
        )
        self.waiting: list[_Req] = []
        self.running: dict[str, _Req] = {}
        self.pending: list[RequestOutput] = []
        self.seen: list[tuple[int, ...]] = []
        self.prompt_total = self.gen_total = self.hits = 0

    def add_request(self, msg: GenerateRequest) -> None:
        n = len(msg.input_ids)
        if n == 0 or n >= self.context_length:
            self.pending.append(RequestOutput(msg.rid, (), True, "error", error=f"bad length {n}"))
            return
        cached = max((_common(msg.input_ids, s) for s in self.seen), default=0)
        cached = min(cached, n - 1)
        self.seen.append(msg.input_ids)
        self.prompt_total += n
        self.hits += cached
        self.waiting.append(_Req(msg, cached))

    def abort(self, rid: str) -> None:
        req = self.running.pop(rid, None)
        for r in list(self.waiting):
            if r.msg.rid == rid:
                self.waiting.remove(r)
                req = r
        if req is not None:
            self.pending.append(self._output(req, "abort", None))

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.pending)

    def step(self) -> list[RequestOutput]:
        while self.waiting and len(self.running) < self.args.max_running_requests:
            req = self.waiting.pop(0)
            if b"CRASH" in bytes(t for t in req.msg.input_ids if t < 256):
                raise RuntimeError("fake engine crash requested by the prompt")
            self.running[req.msg.rid] = req
        if self.running:
            time.sleep(STEP_DELAY_S)
        outputs, self.pending = self.pending, []
        for rid, req in list(self.running.items()):
            token = self._next_token(req)
            req.out.append(token)
            self.gen_total += 1
            if req.msg.params.logprobs is not None:
                k = req.msg.params.logprobs
                top = tuple((t % 256, -0.5 - j) for j, t in enumerate(range(token, token + k)))
                req.lps.append(TokenLogprob(token, -0.5, top))
            reason, matched = self._finished(req, token)
            if reason:
                del self.running[rid]
            outputs.append(self._output(req, reason, matched))
        return outputs

    def _next_token(self, req: _Req) -> int:
        p = req.msg.params
        prompt = bytes(t for t in req.msg.input_ids if t < 256)
        if b"[eos]" in prompt and len(req.out) >= GREEDY_TEXT.encode().index(b".") + 1:
            return EOS
        if p.greedy:
            data = GREEDY_TEXT.encode()
            return data[len(req.out) % len(data)]
        rng = random.Random(hash((p.seed, len(req.out))) if p.seed is not None else None)
        return ord(rng.choice("abcdefghijklmnopqrstuvwxyz "))

    def _finished(self, req: _Req, token: int) -> tuple[str | None, int | str | None]:
        p = req.msg.params
        if token == EOS and not p.ignore_eos:
            return "stop", EOS
        tail = self.tokenizer.decode(req.out[-64:])
        for s in p.stop:  # (before the length, as the engine's StopChecker)
            if s in tail:
                return "stop", s
        if (
            len(req.out) >= p.max_new_tokens
            or len(req.msg.input_ids) + len(req.out) >= self.context_length
        ):
            return "length", None
        return None, None

    def _output(self, req: _Req, reason: str | None, matched) -> RequestOutput:
        new, req.sent = tuple(req.out[req.sent :]), len(req.out)
        lps = tuple(req.lps[len(req.lps) - len(new) :]) if req.lps and new else ()
        return RequestOutput(
            rid=req.msg.rid,
            new_token_ids=new,
            finished=reason is not None,
            finish_reason=reason,
            matched_stop=matched,
            prompt_tokens=len(req.msg.input_ids),
            cached_tokens=req.cached,
            completion_tokens=len(req.out),
            logprobs=lps,
        )

    def stats(self) -> EngineStats:
        used = sum(len(r.msg.input_ids) + len(r.out) for r in self.running.values())
        return EngineStats(
            running=len(self.running),
            queued=len(self.waiting),
            kv_total=self.kv_total,
            kv_used=used,
            kv_cached=0,
            kv_free=self.kv_total - used,
            cache_hit_tokens=self.hits,
            cache_miss_tokens=self.prompt_total - self.hits,
            prompt_tokens_total=self.prompt_total,
            generated_tokens_total=self.gen_total,
            requests=tuple({"id": rid} for rid in self.running),
        )

    def flush_cache(self) -> bool:
        if self.running or self.waiting:
            return False
        self.seen.clear()
        return True


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
