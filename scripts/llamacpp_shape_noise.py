"""How far llama.cpp's logits move when one history is computed in another batch shape.

Greedy-decodes the speculative tests' copy prompts three at a time on the bundled GGUF, then
prefills each history in one go and compares the gap between the decode's top two tokens. The
tolerance `SHAPE_NOISE_NATS` in tests/engine/test_speculative_real.py comes from this figure.

    python scripts/llamacpp_shape_noise.py [--new 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localradix import Engine, SamplingParams  # noqa: E402
from tests.engine.conftest import bundled_gguf  # noqa: E402
from tests.engine.test_speculative_real import _copy_prompts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=64, help="greedy tokens per prompt")
    args = parser.parse_args()
    decode = SamplingParams(
        temperature=0, max_new_tokens=args.new, ignore_eos=True, logprobs=2, speculative=False
    )
    one = SamplingParams(temperature=0, max_new_tokens=1, logprobs=8, speculative=False)
    moves: list[float] = []
    with Engine(str(bundled_gguf()), backend="llamacpp", max_total_tokens=4096) as engine:
        prompts = _copy_prompts(engine)
        for prompt, out in zip(prompts, engine.generate(prompts, decode)):
            for i, step in enumerate(out.logprobs):
                engine.flush_cache()
                ref = dict(engine.generate([prompt + out.token_ids[:i]], one)[0].logprobs[0].top)
                (a, la), (b, lb) = step.top[:2]
                if a in ref and b in ref:
                    moves.append(abs((la - lb) - (ref[a] - ref[b])))
    moves.sort()
    print(
        f"top-two gap moved over {len(moves)} positions: median {statistics.median(moves):.3f}"
        f" nats, p95 {moves[int(0.95 * (len(moves) - 1))]:.3f}, max {moves[-1]:.3f}"
    )


if __name__ == "__main__":
    main()
