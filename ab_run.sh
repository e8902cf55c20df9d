# measurement driver (not committed)
export OUT
B="cli bench --preset llama3-8b --checkpoint-dir /tmp/l8b --new-tokens 24 --profile-steps 2"
timeout 170 bash scripts/gpu.sh tests tests/unit/kernels tests/unit/domain/test_top_k_probs.py tests/integration/models/test_fused_kernels.py tests/integration/spec/test_step_graphs.py tests/integration/spec/test_shipped_defaults.py 2>&1 | tail -12
timeout 80 bash scripts/gpu.sh bench draft_topk 2>&1 | tail -12
bash scripts/gpu.sh $B --configs plain tree:S5,k4,N8 --batch-sizes 1 32 --breakdown --out $OUT/fold | tail -40
best=$(awk -F'|' '$2+0==128256 && $3+0==128 {gsub(/ /,"",$7); print $7}' $OUT/draft_topk.md)
chunk=${best#c}; chunk=${chunk%w*}; warps=${best#*w}
echo "topk best at 128 rows: chunk=$chunk warps=$warps"
if [ -n "$chunk" ]; then
  sed -i "s/return TopKConfig(chunk=4096, num_warps=8)/return TopKConfig(chunk=$chunk, num_warps=$warps)/" eagletree/adapters/kernels/triton/draft_topk.py
  grep -n "return TopKConfig" eagletree/adapters/kernels/triton/draft_topk.py
  bash scripts/gpu.sh $B --configs plain tree:S5,k4,N8 --batch-sizes 1 32 --out $OUT/topk | tail -8
fi
timeout 100 bash scripts/gpu.sh cli bench --preset llama3-8b --draft eagle3 --checkpoint-dir /tmp/l8b3 --configs plain tree:S5,k4,N8 --new-tokens 24 --profile-steps 2 --batch-sizes 1 --out $OUT/e3 | tail -5
timeout 150 bash scripts/gpu.sh $B --configs plain tree:S5,k4,N8 --batch-sizes 1 8 32 --arrivals 4 --num-arrivals 8 --prefill-step with_decode alone --profile-steps 0 --out $OUT/arrivals | tail -20
