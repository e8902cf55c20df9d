"""The user mistakes of docs/errors.md: id -> (setup returning argv, words the message
holds), one table of errors and one of warnings. The ids are the rows of the tables
in docs/errors.md."""

from __future__ import annotations

import os

import torch

from tests.integration.errors.setups import (
    Setup,
    _as_gpt2,
    _config_edit,
    _corrupt_config_removed,
    _corrupt_file,
    _file,
    _flags_before_loading,
    _generate_flags,
    _init_random,
    _no_interpreter,
    _prompts_file,
    _prompts_file_bytes,
    _random_bytes,
    _tensor_edit,
    _token_map,
    _tokenizer,
    _train,
    _two_settings_files,
    _unwritable_cache,
    _variables,
    _with_nan,
    _with_target,
)

TOKEN_MAP_TREE = 'algorithm = "eagle"\nnum_steps = 2\neagle_topk = 4\nnum_draft_tokens = 5\n'


CASES: dict[str, tuple[Setup, str]] = {
    # settings files
    "file-random-bytes-toml": (_random_bytes(".toml"), "is not UTF-8 text"),
    "file-random-bytes-yaml": (_random_bytes(".yaml"), "s.yaml"),
    "file-missing": (lambda p, m: ["config", "validate", str(p.tmp / "no.toml")], "does not exist"),
    "file-is-a-directory": (lambda p, m: ["config", "validate", str(p.tmp)], "is a directory"),
    "file-unknown-format": (_file("{}", "s.json"), "unknown format '.json'"),
    "file-bad-toml": (_file("[model\n"), "is not valid toml"),
    "file-not-a-mapping": (_file("- model\n", "s.yaml"), "must hold a mapping"),
    "file-unknown-key": (_file('[model]\ndevise = "cpu"\n'), "model.devise"),
    "page-size-true": (_file("[memory]\npage_size = true\n"), "not a boolean"),
    "requests-false": (_file("[memory]\nmax_running_requests = false\n"), "not a boolean"),
    "requests-zero": (_file("[memory]\nmax_running_requests = 0\n"), "greater than or equal"),
    "device-tpu": (_file('[model]\ndevice = "tpu"\n'), "'cuda:N'"),
    "device-meta": (_file('[model]\ndevice = "meta"\n'), "model.device"),
    "dtype-bf16": (_file('[model]\ndtype = "bf16"\n'), "allowed values are 'auto'"),
    # environment variables
    "env-section-not-json": (_variables(EAGLETREE_MEMORY="page_size=2"), "must be a JSON object"),
    "env-unknown-section": (_variables(EAGLETREE_FOO__BAR="1"), "EAGLETREE_FOO__BAR names no"),
    "env-unknown-field": (_variables(EAGLETREE_MODEL__DEVISE="cpu"), "EAGLETREE_MODEL__DEVICE"),
    "env-not-a-number": (_variables(EAGLETREE_MEMORY__PAGE_SIZE="abc"), "memory.page_size"),
    # the machine
    "flash-on-cpu": (
        _variables(EAGLETREE_MODEL__DEVICE="cpu", EAGLETREE_BACKEND__ATTENTION="flash"),
        "FlashAttention runs on CUDA only",
    ),
    "triton-attention-on-cpu": (
        _no_interpreter(EAGLETREE_BACKEND__ATTENTION="triton"),
        "backend.attention = 'triton'",
    ),
    "triton-mover-on-cpu": (
        _no_interpreter(EAGLETREE_BACKEND__KV_MOVE="triton"),
        "backend.kv_move = 'triton'",
    ),
    "cuda-graph-on-cpu": (
        _variables(EAGLETREE_MODEL__DEVICE="cpu", EAGLETREE_BACKEND__CUDA_GRAPH="on"),
        "backend.cuda_graph = 'on'",
    ),
    # checkpoints
    "target-missing-validate": (
        _with_target("", "validate", target="nowhere"),
        "model.target_path",
    ),
    "target-missing-generate": (
        _with_target("", "generate", target="nowhere"),
        "model.target_path",
    ),
    "target-no-config": (_corrupt_config_removed, "no config.json"),
    "target-config-empty": (_config_edit(lambda t: "", "validate"), "not valid JSON"),
    "target-config-not-json": (_config_edit(lambda t: t[:40], "generate"), "config.json"),
    "target-unsupported-validate": (
        _config_edit(_as_gpt2),
        "'GPT2LMHeadModel' is not supported",
    ),
    "target-unsupported-generate": (
        _config_edit(_as_gpt2, "generate"),
        "'GPT2LMHeadModel' is not supported",
    ),
    "draft-missing": (
        _with_target('draft_path = "nowhere"\n[speculative]\nalgorithm = "eagle"\n', "validate"),
        "model.draft_path",
    ),
    "context-too-long-validate": (
        _with_target("max_context_len = 100000\n", "validate"),
        "exceeds the target's max_position_embeddings",
    ),
    "context-too-long-generate": (
        _with_target("max_context_len = 100000\n", "generate"),
        "exceeds the target's max_position_embeddings",
    ),
    "token-map-missing": (
        _token_map(None, TOKEN_MAP_TREE, "validate"),
        "speculative.token_map: token map",
    ),
    "token-map-for-eagle3": (
        _token_map([1, 2, 3, 4], 'algorithm = "eagle3"\n', "validate"),
        "unset speculative.token_map",
    ),
    "token-map-below-topk-generate": (
        _token_map([1, 2, 3], TOKEN_MAP_TREE, "generate"),
        "speculative.eagle_topk = 4 exceeds the 3 tokens the draft proposes from",
    ),
    "topk-above-vocab-validate": (
        _with_target(
            'draft_path = "{draft}"\n[speculative]\nalgorithm = "eagle"\nnum_steps = 1\n'
            "eagle_topk = 600\nnum_draft_tokens = 2\n",
            "validate",
        ),
        "speculative.eagle_topk = 600 exceeds the target vocabulary",
    ),
    "safetensors-truncated": (
        _corrupt_file("model.safetensors", b"", truncate=True),
        "not a readable safetensors file",
    ),
    "safetensors-random-bytes": (
        _corrupt_file("model.safetensors", os.urandom(4096)),
        "not a readable safetensors file",
    ),
    "checkpoint-int-weights-generate": (
        _tensor_edit(lambda t: (t * 100).to(torch.int32), "generate"),
        "tensor 'model.layers.0.mlp.down_proj.weight' is int32, but eagletree loads weights",
    ),
    "checkpoint-int-weights-validate": (
        _tensor_edit(lambda t: (t * 100).to(torch.int32), "validate"),
        "target/model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight' is int32",
    ),
    "checkpoint-nan-generate": (
        _tensor_edit(_with_nan, "generate"),
        "tensor 'model.layers.0.mlp.down_proj.weight' holds NaN or infinite values",
    ),
    "checkpoint-nan-validate": (
        _tensor_edit(_with_nan, "validate"),
        "target/model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight' holds NaN",
    ),
    "checkpoint-shape-generate": (
        _tensor_edit(lambda t: t[:, :64].contiguous(), "generate"),
        "tensor 'model.layers.0.mlp.down_proj.weight' has shape [64, 64], the "
        "LlamaForCausalLM target expects [64, 128]",
    ),
    "checkpoint-shape-validate": (
        _tensor_edit(lambda t: t[:, :64].contiguous(), "validate"),
        "tensor 'model.layers.0.mlp.down_proj.weight' has shape [64, 64], the "
        "LlamaForCausalLM target expects [64, 128]",
    ),
    "generation-config-corrupt": (
        _corrupt_file("generation_config.json", b"{not json"),
        "generation_config.json is not valid JSON",
    ),
    "tokenizer-corrupt-with-prompt-ids": (_tokenizer(broken=True), "tokenizer files"),
    "chat-without-template": (_tokenizer(broken=False), "no chat template"),
    "cache-unwritable": (_unwritable_cache, "cannot create the default checkpoint"),
    # generate flags
    "text-without-tokenizer": (
        _generate_flags("--prompt", "hello", text_prompt=True),
        "needs the checkpoint's tokenizer",
    ),
    "max-new-tokens-zero": (_generate_flags("--max-new-tokens", "0"), "--max-new-tokens must"),
    "prompt-ids-not-ints": (_generate_flags("--prompt-ids", "1 x"), "token id 'x'"),
    "prompt-ids-outside-vocab": (_generate_flags("--prompt-ids", "99999"), "outside the vocab"),
    "chat-without-prompt": (_generate_flags("--chat", "--prompt-ids", "1"), "--chat applies"),
    "prompts-file-missing": (_prompts_file(None), "does not exist"),
    "prompts-file-bad-json": (_prompts_file('{"prompt": "a"}\n{oops\n'), "prompts.jsonl:2"),
    "prompts-file-bad-shape": (_prompts_file('{"text": "a"}\n'), 'expected {"prompt"'),
    "prompts-file-unknown-key": (
        _prompts_file('{"prompt": "a", "max_new_tokens": 4}\n'),
        "prompts.jsonl:1: unknown key 'max_new_tokens'",
    ),
    "prompts-file-not-utf8": (
        _prompts_file_bytes(b'{"prompt": "\xff"}\n'),
        "cannot be read as UTF-8 text",
    ),
    "prompts-file-lone-surrogate": (
        _prompts_file('{"prompt": "a\\ud800"}\n'),
        'prompts.jsonl:1: "prompt" is not valid UTF-8 text (a lone surrogate \\ud800 at',
    ),
    "prompt-not-utf8": (
        _generate_flags("--prompt", "ok", "--prompt", "caf\udcff"),  # bytes b"caf\xff" in argv
        "--prompt #2 is not valid UTF-8 text (the byte 0xff at character 3)",
    ),
    "temperature-negative": (
        _flags_before_loading("--temperature", "-1"),
        "--temperature must be >= 0 (0: greedy), got -1.0",
    ),
    "top-p-zero": (_flags_before_loading("--top-p", "0"), "--top-p must be in (0, 1], got 0.0"),
    "config-two-files": (_two_settings_files, "config show got two settings files"),
    # init-random
    "init-negative-size": (_init_random("--arch", "llama", "--hidden-size", "-8"), "at least 1"),
    "init-zero-layers": (_init_random("--arch", "llama", "--num-layers", "0"), "--num-layers 0"),
    "init-odd-head-dim": (_init_random("--arch", "llama", "--head-dim", "7"), "must be even"),
    "init-odd-rope-dim": (
        _init_random("--arch", "deepseek-mla", "--qk-rope-head-dim", "5"),
        "--qk-rope-head-dim 5",
    ),
    "init-kv-heads": (_init_random("--arch", "llama", "--num-kv-heads", "3"), "not a multiple"),
    "init-out-is-a-file": (_init_random("--arch", "llama", out_is_file=True), "is a file"),
    "init-llama-mtp": (_init_random("--arch", "llama", "--draft", "mtp"), "--arch deepseek-mla"),
    "init-draft-vocab": (
        _init_random("--arch", "llama", "--draft", "eagle3", "--draft-vocab-size", "9999"),
        "exceeds --vocab-size",
    ),
    "init-tokenizer-small-vocab": (
        _init_random("--arch", "llama", "--tokenizer", "--vocab-size", "100"),
        "--tokenizer needs --vocab-size >= 259",
    ),
    "init-device-missing-cuda": (
        _init_random("--arch", "llama", "--device", "cuda:99"),
        "--device cuda:99 but",
    ),
    "init-device-unknown": (_init_random("--arch", "llama", "--device", "tpu"), "is not a device"),
    "init-too-large": (
        _init_random("--arch", "llama", "--vocab-size", "100000000", "--hidden-size", "1000000"),
        "error: the checkpoint of these sizes",  # memory, or else the disk, is short
    ),
    # train-draft and token-map
    "train-seq-len-above-positions": (
        _train("--seq-len", "100000"),
        "--seq-len = 100000 exceeds the target's max_position_embeddings (4096)",
    ),
    "train-without-tokenizer": (_train(), "vocabulary of 512 ids is not the 256 bytes"),
    "token-map-without-tokenizer": (
        _train(command="token-map"),
        "has no tokenizer (tokenizer.json or tokenizer.model beside config.json)",
    ),
    # serve
    "serve-bad-port": (lambda p, m: ["serve", "--port", "70000"], "is not a TCP port"),
    "serve-max-tokens-limit-zero": (
        lambda p, m: ["serve", "--max-tokens-limit", "0"],
        "--max-tokens-limit 0: must be at least 1",
    ),
}


WARNINGS: dict[str, tuple[Setup, str]] = {
    "top-k-with-greedy": (_generate_flags("--top-k", "5"), "--top-k has no effect"),
    "seed-with-greedy": (_generate_flags("--seed", "5"), "--seed has no effect"),
}
