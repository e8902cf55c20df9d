"""Step kernels compile for an H100/H200 (sm_90) on a machine without a GPU — the drawn trees'
draws (one child a row: a sampled token) and walk, the drawn chains' two kernels, a plain step's
writes, the tempered softmax, and the weight-stream GEMM and the add + RMSNorm storing their
streams twice (the stream and EAGLE-3's capture of it): the interpreter runs them on the CPU,
but a kernel the interpreter accepts may still fail Triton's compiler (types of loop-carried
values, constant conditions), which only a GPU run would otherwise show. Compiled in a
subprocess without ``TRITON_INTERPRET`` (under it the kernels are interpreted functions, which
the compiler does not take); Triton's wheel carries the ``ptxas`` the last stage needs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from eagletree.adapters.kernels.triton import (
        chain_sampling, draw_children, plain_step_writes, rmsnorm, skinny_gemm,
        tempered_probs, tree_sampling,
    )

    target = GPUTarget("cuda", 90, 32)
    draws = {
        "probs_ptr": "*fp32", "coins_ptr": "*fp32", "columns_ptr": "*i64",
        "scores_ptr": "*fp32", "vocab": "i32", "stride_probs": "i32", "stride_coins": "i32",
        "first_score": "fp32",
        "K": "constexpr", "BLOCK_K": "constexpr", "BLOCK_V": "constexpr",
        "NUM_BLOCKS": "constexpr",
    }
    walk = {
        "candidates_ptr": "*i64", "parents_ptr": "*i64", "ranks_ptr": "*i64",
        "sources_ptr": "*i64", "target_ptr": "*fp32", "draft_ptr": "*fp32",
        "column_of_ptr": "*i64", "drawn_ptr": "*i8", "coins_ptr": "*fp32",
        "bonus_ptr": "*fp32", "predict_ptr": "*i32", "accept_index_ptr": "*i32",
        "accept_length_ptr": "*i32", "n": "i32", "vocab": "i32", "draft_rows": "i32",
        "draft_vocab": "i32", "num_steps": "i32", "K": "constexpr", "HAS_MAP": "constexpr",
        "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "BLOCK_V": "constexpr",
        "NUM_BLOCKS": "constexpr",
    }
    chain_sums = {
        "target_ptr": "*fp32", "draft_ptr": "*fp32", "column_of_ptr": "*i64", "sums_ptr": "*fp32",
        "vocab": "i32", "draft_vocab": "i32", "num_steps": "i32", "num_blocks": "i32",
        "HAS_MAP": "constexpr", "BLOCK_V": "constexpr",
    }
    chain_walk = {
        "candidates_ptr": "*i64", "target_ptr": "*fp32", "draft_ptr": "*fp32",
        "column_of_ptr": "*i64", "sums_ptr": "*fp32", "coins_ptr": "*fp32", "bonus_ptr": "*fp32",
        "predict_ptr": "*i32", "accept_index_ptr": "*i32", "accept_length_ptr": "*i32",
        "vocab": "i32", "draft_vocab": "i32", "num_steps": "i32", "num_blocks": "i32",
        "stride_coins": "i32", "stride_bonus": "i32",
        "HAS_MAP": "constexpr", "BLOCK_N": "constexpr", "BLOCK_V": "constexpr",
        "NUM_BLOCKS": "constexpr",
    }
    writes = {
        "rows_ptr": "*i64", "tokens_ptr": "*i64", "features_ptr": "*bf16",
        "seq_lens_ptr": "*i64", "lag_tokens_ptr": "*i64", "lag_features_ptr": "*bf16",
        "lag_count_ptr": "*i64", "committed_ptr": "*i64", "pending_ptr": "*i64", "width": "i32",
        "num_features": "i32", "feature_stride": "i32", "HAS_PENDING": "constexpr",
        "BLOCK_F": "constexpr",
    }
    softmax = {
        "logits_ptr": "*bf16", "temperature_ptr": "*fp32", "probs_ptr": "*fp32", "vocab": "i32",
        "stride_row": "i32", "stride_out": "i32", "BLOCK_V": "constexpr",
    }
    gemm = {
        **{name: "*bf16" for name in ("x_ptr", "w_ptr", "bias_ptr", "residual_ptr", "out_ptr",
                                      "copy_ptr")},
        **{name: "i32" for name in ("rows", "cols", "depth", "stride_x", "stride_w",
                                    "stride_residual", "stride_out", "stride_copy")},
        **{name: "constexpr" for name in ("HAS_BIAS", "HAS_RESIDUAL", "HAS_COPY", "DOT_FP32",
                                          "PRECISION", "BLOCK_M", "BLOCK_N", "BLOCK_K")},
    }
    norm = {
        **{name: "*bf16" for name in ("x_ptr", "residual_ptr", "residual_out_ptr", "copy_ptr",
                                      "weight_ptr", "out_ptr")},
        **{name: "i32" for name in ("stride_x", "stride_residual", "stride_residual_out",
                                    "stride_copy", "stride_out", "hidden")},
        "eps": "fp32", "ADD_RESIDUAL": "constexpr", "HAS_COPY": "constexpr",
        "BLOCK": "constexpr",
    }
    writer = plain_step_writes._plain_step_writes_kernel
    block_f = plain_step_writes._BLOCK_F
    kernels = [
        (tempered_probs._tempered_probs_kernel, softmax, {"BLOCK_V": 1024}),
        (writer, writes, {"HAS_PENDING": True, "BLOCK_F": block_f}),
        (writer, writes, {"HAS_PENDING": False, "BLOCK_F": block_f}),
        (
            draw_children._draw_children_kernel, draws,
            {"K": 8, "BLOCK_K": 16, "BLOCK_V": 1024, "NUM_BLOCKS": 128},
        ),
        (  # one child a row: a sampled token
            draw_children._draw_children_kernel, draws,
            {"K": 1, "BLOCK_K": 16, "BLOCK_V": 1024, "NUM_BLOCKS": 16},
        ),
        (
            tree_sampling._verify_tree_drawn_kernel, walk,
            {"K": 2, "HAS_MAP": True, "BLOCK_N": 16, "BLOCK_K": 16, "BLOCK_V": 1024,
             "NUM_BLOCKS": 16},
        ),
        (
            tree_sampling._verify_tree_drawn_kernel, walk,
            {"K": 8, "HAS_MAP": False, "BLOCK_N": 32, "BLOCK_K": 16, "BLOCK_V": 1024,
             "NUM_BLOCKS": 128},
        ),
        (chain_sampling._chain_block_sums_kernel, chain_sums, {"HAS_MAP": True, "BLOCK_V": 1024}),
        (
            skinny_gemm._skinny_gemm_kernel, gemm,
            {"HAS_BIAS": False, "HAS_RESIDUAL": True, "HAS_COPY": True, "DOT_FP32": False,
             "PRECISION": None, "BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 512},
        ),
        (rmsnorm._rmsnorm_kernel, norm, {"ADD_RESIDUAL": True, "HAS_COPY": True, "BLOCK": 4096}),
        (
            chain_sampling._chain_walk_kernel, chain_walk,
            {"HAS_MAP": False, "BLOCK_N": 16, "BLOCK_V": 1024, "NUM_BLOCKS": 16},
        ),
    ]
    for kernel, signature, constants in kernels:
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=constants), target=target
        )
        assert "cubin" in compiled.asm, sorted(compiled.asm)
        print("compiled", kernel.fn.__name__, constants)
    """
)


def test_the_step_kernels_compile_for_sm_90() -> None:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("compiled") == 11, done.stdout
