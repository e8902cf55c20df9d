"""Checkpoint loading: every format init-random writes loads back exactly, and bad checkpoints
fail with a ConfigurationError (a ValueError) that names the file and what is wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagletree.adapters.models.draft_loading import DraftKind, DraftModel, load_draft
from eagletree.adapters.models.eagle import EagleDraft
from eagletree.adapters.models.eagle3 import Eagle3Draft
from eagletree.adapters.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from eagletree.adapters.models.loading import load_models, load_target
from eagletree.adapters.models.mtp import MTPLayer
from eagletree.adapters.models.random_checkpoint import write_random_checkpoint
from eagletree.adapters.models.random_checkpoint_config import Arch, ModelSizes
from eagletree.adapters.models.runner import DraftModelRunner, TargetModelRunner
from eagletree.adapters.models.tensor_files import module_tensors
from eagletree.domain.errors import ConfigurationError
from tests.conftest import requires_triton
from tests.integration.models.harness import Memory, Requests, random_prompts, relative_error

SIZES = ModelSizes(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_layers=5,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
    draft_vocab_size=40,
    num_mtp_layers=2,
)
CASES = [
    (arch, draft) for arch in ("llama", "deepseek-mla") for draft in ("eagle", "eagle3", "mtp")
]


def read_all(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def target_tensor(model: torch.nn.Module, name: str) -> torch.Tensor:
    path = name if name.startswith("lm_head.") else name.removeprefix("model.")
    return module_tensors(model)[path]  # merged projections appear as their parts


def draft_tensor(drafts: list[DraftModel], name: str) -> torch.Tensor:
    if isinstance(drafts[0], MTPLayer):
        _, _, index, rest = name.split(".", 3)
        own = rest.startswith(("enorm.", "hnorm.", "eh_proj.", "shared_head."))
        return module_tensors(drafts[int(index)])[rest if own else f"decoder.{rest}"]
    if name in ("d2t", "t2d"):
        head = drafts[0]
        assert isinstance(head, Eagle3Draft)
        if name == "d2t":
            return head.d2t
        t2d = torch.zeros(head.vocab_size, dtype=torch.bool)
        t2d[head.draft_to_target] = True
        return t2d
    return module_tensors(drafts[0])[name]


@pytest.mark.parametrize(("arch", "draft"), CASES)
def test_every_written_tensor_loads_back_exactly_and_the_models_run(
    tmp_path: Path, arch: Arch, draft: DraftKind
) -> None:
    # a small shard limit makes the target a sharded checkpoint with an index
    target_dir, draft_dir = write_random_checkpoint(
        tmp_path, arch, draft, seed=3, sizes=SIZES, dtype=torch.float32, max_shard_bytes=60_000
    )
    assert draft_dir is not None
    assert (target_dir / "model.safetensors.index.json").is_file()
    models = load_models(target_dir, draft_dir, draft, torch.float32, "cpu")
    for name, tensor in read_all(target_dir).items():
        torch.testing.assert_close(target_tensor(models.target, name), tensor, rtol=0, atol=0)
    for name, tensor in read_all(draft_dir).items():
        torch.testing.assert_close(draft_tensor(models.drafts, name), tensor, rtol=0, atol=0)
    assert len(models.drafts) == (SIZES.num_mtp_layers if draft == "mtp" else 1)

    memory = Memory(torch.device("cpu"))
    target = TargetModelRunner(
        models.target, *memory.runner_parts(models.target.kv_layout, "torch", torch.float32)
    )
    head = models.drafts[0]
    runner = DraftModelRunner(head, *memory.runner_parts(head.kv_layout, "torch", torch.float32))
    prompts = random_prompts(SIZES.vocab_size, [4, 2], seed=4)
    out = target.forward(Requests(memory, 2).extend(prompts))
    hidden = out.aux_hidden_states if draft == "eagle3" else out.hidden_states
    assert hidden is not None
    draft_out = runner.forward(Requests(memory, 2).extend(prompts), hidden)
    assert draft_out.hidden_states.shape == (6, SIZES.hidden_size)
    assert torch.isfinite(draft_out.logits).all()
    if isinstance(head, Eagle3Draft):
        # logits over the draft vocabulary, each column named by its target id
        assert draft_out.logits.shape == (6, SIZES.draft_vocab_size)
        assert draft_out.token_ids is not None
        assert torch.equal(draft_out.token_ids, head.draft_to_target)
        columns = torch.arange(SIZES.draft_vocab_size)
        assert torch.equal(draft_out.token_ids[columns], columns + head.d2t)
    else:
        assert draft_out.logits.shape == (6, SIZES.vocab_size)
        assert draft_out.token_ids is None


def test_eagle3_capture_layers_come_from_the_draft_config(tmp_path: Path) -> None:
    target_dir, draft_dir = write_random_checkpoint(tmp_path, "llama", "eagle3", sizes=SIZES)
    assert draft_dir is not None
    models = load_models(target_dir, draft_dir, "eagle3", torch.float32, "cpu")
    assert models.target.aux_layer_ids == (2, 2, 2)  # inputs of layers 2, L/2, L-3 for L = 5
    edit_config(draft_dir, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 3]})
    models = load_models(target_dir, draft_dir, "eagle3", torch.float32, "cpu")
    assert models.target.aux_layer_ids == (1, 3, 4)  # the outputs of layers 0, 2, 3


# ---------------------------------------------------------------- bad checkpoints


def edit_config(directory: Path, **changes: Any) -> Path:
    file = directory / "config.json"
    config = json.loads(file.read_text())
    config.update(changes)
    file.write_text(json.dumps(config))
    return file


def edit_tensors(directory: Path, change: Any) -> Path:
    file = directory / "model.safetensors"
    tensors = load_file(str(file))
    change(tensors)
    save_file(tensors, str(file))
    return file


@pytest.fixture
def llama_eagle(tmp_path: Path) -> tuple[Path, Path]:
    target_dir, draft_dir = write_random_checkpoint(tmp_path, "llama", "eagle", sizes=SIZES)
    assert draft_dir is not None
    return target_dir, draft_dir


def test_a_draft_for_another_hidden_size_is_rejected_naming_the_draft(tmp_path: Path) -> None:
    target_dir, _ = write_random_checkpoint(tmp_path / "a", "llama", None, sizes=SIZES)
    _, draft_dir = write_random_checkpoint(
        tmp_path / "b", "llama", "eagle", sizes=ModelSizes(vocab_size=96, hidden_size=48)
    )
    assert draft_dir is not None
    target = load_target(target_dir, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"draft.*config\.json.*hidden_size 48.*target's 32"):
        load_draft(draft_dir, "eagle", target, torch.float32)


def test_a_draft_for_another_vocabulary_is_rejected(tmp_path: Path) -> None:
    target_dir, _ = write_random_checkpoint(tmp_path / "a", "llama", None, sizes=SIZES)
    _, draft_dir = write_random_checkpoint(
        tmp_path / "b",
        "llama",
        "eagle3",
        sizes=ModelSizes(vocab_size=80, hidden_size=32, draft_vocab_size=40),
    )
    assert draft_dir is not None
    target = load_target(target_dir, torch.float32, "cpu")
    with pytest.raises(ConfigurationError, match=r"vocab_size 80 differs from the target's 96"):
        load_draft(draft_dir, "eagle3", target, torch.float32)


def test_a_missing_tensor_is_named(llama_eagle: tuple[Path, Path]) -> None:
    target_dir, draft_dir = llama_eagle
    edit_tensors(draft_dir, lambda t: t.pop("layers.0.mlp.up_proj.weight"))
    target = load_target(target_dir, torch.float32, "cpu")
    with pytest.raises(
        ConfigurationError, match=r"draft: .*lacks.*layers\.0\.mlp\.up_proj\.weight"
    ):
        load_draft(draft_dir, "eagle", target, torch.float32)


def test_a_misshaped_tensor_is_named_with_file_and_both_shapes(
    llama_eagle: tuple[Path, Path],
) -> None:
    target_dir, draft_dir = llama_eagle
    file = edit_tensors(draft_dir, lambda t: t.update({"fc.weight": torch.zeros(32, 60)}))
    target = load_target(target_dir, torch.float32, "cpu")
    with pytest.raises(ConfigurationError) as error:
        load_draft(draft_dir, "eagle", target, torch.float32)
    assert str(file) in str(error.value)
    assert "'fc.weight' has shape [32, 60]" in str(error.value)
    assert "expects [32, 64]" in str(error.value)


def test_an_unsupported_target_architecture_is_named(llama_eagle: tuple[Path, Path]) -> None:
    target_dir, _ = llama_eagle
    edit_config(target_dir, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ConfigurationError, match=r"'GPT2LMHeadModel' is not supported.*Llama"):
        load_target(target_dir, torch.float32, "cpu")


def test_a_draft_of_the_wrong_kind_is_rejected(llama_eagle: tuple[Path, Path]) -> None:
    target_dir, draft_dir = llama_eagle
    target = load_target(target_dir, torch.float32, "cpu")
    with pytest.raises(ConfigurationError, match=r"'LlamaForCausalLMEagle' is not a MTP draft"):
        load_draft(draft_dir, "mtp", target, torch.float32)


def test_a_target_checkpoint_given_as_a_draft_is_rejected(llama_eagle: tuple[Path, Path]) -> None:
    target_dir, _ = llama_eagle
    target = load_target(target_dir, torch.float32, "cpu")
    with pytest.raises(ConfigurationError, match=r"tensor\(s\) the EAGLE head does not have"):
        load_draft(target_dir, "eagle", target, torch.float32)


def test_a_directory_without_config_or_weights_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"no config\.json"):
        load_target(tmp_path, torch.float32, "cpu")
    target_dir, _ = write_random_checkpoint(tmp_path, "llama", None, sizes=SIZES)
    (target_dir / "model.safetensors").rename(target_dir / "pytorch_model.bin")
    with pytest.raises(ConfigurationError, match=r"no \*\.safetensors.*pytorch_model\.bin"):
        load_target(target_dir, torch.float32, "cpu")


def test_an_inconsistent_vocabulary_map_is_rejected(tmp_path: Path) -> None:
    target_dir, draft_dir = write_random_checkpoint(tmp_path, "llama", "eagle3", sizes=SIZES)
    assert draft_dir is not None
    target = load_target(target_dir, torch.float32, "cpu")
    pristine = tmp_path / "pristine"
    shutil.copytree(draft_dir, pristine)
    edit_tensors(draft_dir, lambda t: t["d2t"].__setitem__(0, 10_000))
    with pytest.raises(ConfigurationError, match="outside the target vocabulary"):
        load_draft(draft_dir, "eagle3", target, torch.float32)
    edit_tensors(pristine, lambda t: t["t2d"].__setitem__(slice(None), False))
    with pytest.raises(ConfigurationError, match="t2d does not match d2t"):
        load_draft(pristine, "eagle3", target, torch.float32)


def test_mixture_of_experts_layers_are_refused(tmp_path: Path) -> None:
    target_dir, _ = write_random_checkpoint(tmp_path, "deepseek-mla", None, sizes=SIZES)
    edit_config(target_dir, first_k_dense_replace=1)
    with pytest.raises(ConfigurationError, match=r"layers 1\.\.4 are mixture-of-experts"):
        load_target(target_dir, torch.float32, "cpu")


def test_with_fused_kernels_a_llama_target_and_its_eagle_head_load_with_their_norms_folded(
    tmp_path: Path,
) -> None:
    requires_triton("cpu")
    target_dir, draft_dir = write_random_checkpoint(
        tmp_path, "llama", "eagle", seed=5, sizes=SIZES, dtype=torch.float32
    )
    assert draft_dir is not None
    logits = []
    for fused in (True, False):
        models = load_models(target_dir, draft_dir, "eagle", torch.float32, "cpu", fused)
        target, head = models.target, models.drafts[0]
        assert isinstance(target, LlamaForCausalLM) and isinstance(head, EagleDraft)
        layers = [*target.layers, *head.layers]
        assert all(isinstance(layer, LlamaDecoderLayer) for layer in layers)
        assert all(layer.norms_folded == fused for layer in layers)
        if fused:  # the weights now live in q/k/v and gate/up
            norms = [layer.post_attention_layernorm.weight for layer in layers]
            assert all(bool((w == 1).all()) for w in norms)
        memory = Memory(torch.device("cpu"))
        parts = memory.runner_parts(models.target.kv_layout, "triton", torch.float32)
        out = TargetModelRunner(models.target, *parts).forward(
            Requests(memory, 2).extend(random_prompts(SIZES.vocab_size, [5, 3], seed=6))
        )
        logits.append(out.logits)
    assert relative_error(logits[0], logits[1]) < 1e-5
