"""benchmarks/train_step.py on the CPU: one line per algorithm and log-softmax precision, each
with its step time, and the profiled operators under it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from benchmarks import train_step
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import ModelSizes
from eagletree.adapters.text.byte_tokenizer import write_byte_level_tokenizer


@pytest.mark.hf
def test_each_algorithm_and_precision_gets_its_step_time_and_profile(tmp_path: Path) -> None:
    sizes = ModelSizes(vocab_size=320, hidden_size=32, intermediate_size=64, num_layers=3,
                       num_heads=2, num_kv_heads=1, head_dim=16)  # fmt: skip
    target, _ = write_random_checkpoint(tmp_path, "llama", None, sizes=sizes, dtype=torch.float32)
    write_byte_level_tokenizer(target, sizes.vocab_size)
    data = tmp_path / "data.txt"
    data.write_text("def add(a, b):\n    return a + b\n" * 40)
    out = tmp_path / "train_step.md"
    train_step.main([
        "--target", str(target), "--data", str(data), "--out", str(out), "--device", "cpu",
        "--algorithms", "eagle3", "eagle", "--ce-precisions", "float32", "bfloat16",
        "--batch-size", "2", "--seq-len", "16", "--warmup", "1", "--steps", "2",
        "--profile-steps", "1", "--rows", "5",
    ])  # fmt: skip
    text = out.read_text()
    heads = re.findall(r"^## (\w+), log-softmax in (\w+): ([\d.]+) ms per step", text, re.M)
    assert [(a, p) for a, p, _ in heads] == [
        ("eagle3", "float32"), ("eagle3", "bfloat16"), ("eagle", "float32"), ("eagle", "bfloat16"),
    ]  # fmt: skip
    assert all(float(ms) > 0 for _, _, ms in heads)
    assert text.count("1 steps profiled:") == 4 and text.count("aten::") >= 4
