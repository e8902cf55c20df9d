"""Embed eagletree in a program: build an engine, generate, stream, close.

    python examples/embed.py                 # the embedded default model (tiny, random weights)
    python examples/embed.py path/to/ckpt    # a checkpoint directory with a tokenizer

Without CUDA the engine runs on the CPU in float32 ("auto" settings), on one thread for this
tiny model (the thread policy, ``backend.cpu_threads``). The default model's weights are
random, so its text is gibberish; the calls are the same for a trained model.
"""

from __future__ import annotations

import sys

from eagletree import EngineSettings, build_engine


def main(argv: list[str]) -> int:
    model = {"target_path": argv[0]} if argv else {}
    settings = EngineSettings(model=model, memory={"max_total_tokens": 4096})
    if not argv:  # the embedded default: written to the user cache on first use
        from eagletree.app.composition.run_settings import settings_for_run

        settings = settings_for_run(settings, notify=print)

    with build_engine(settings) as engine:
        # generate: a batch of prompts (text, or lists of token ids), results in prompt order
        results = engine.generate(["The draft tree", [1, 5, 9]], max_new_tokens=12)
        for result in results:
            print(f"{result.finish_reason.value}: {result.output_ids} {result.text!r}")
            print(f"  first token after {result.timings.time_to_first_token_s * 1000:.1f} ms")

        # stream: new tokens and text as each engine step commits them
        pieces = []
        for event in engine.stream(["Speculative decoding"], max_new_tokens=12):
            pieces.append(event.text)
            if event.result is not None:
                assert "".join(pieces) == event.result.text
                print(f"streamed {len(event.result.output_ids)} tokens: {''.join(pieces)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
