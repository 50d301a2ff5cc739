"""Gold MuSiQue trajectories (template teacher, real BM25 retrieval), tokenized by SmolLM2's tokenizer, through
every method's reward with no model: the oracle's step verdicts, CP-Search's progressive reward, HiPRAG's
reward (no re-ask), I_traj and the answer. The paths real data takes that an untuned policy never reaches.

    python -m research.drivers.real_data_gold_rewards RUN_DIR    # RUN_DIR of research/drivers/real_data_methods.sh
"""

import collections
import math
import sys

from transformers import AutoTokenizer

from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.rollout import _blank_token_ids
from prorag.agent.schema import parse_token_actions
from prorag.agent.trajectory import ActionRecord, Trajectory, decode_completion
from prorag.core.metrics import f1_score
from prorag.data.records import read_records
from prorag.method.rewards.outcome import OutcomeRewardConfig, RewardInputs, trajectory_answer, trajectory_format_valid
from prorag.method.rewards.sources import STEP_REWARD_SOURCES
from prorag.models.tags import tag_token_ids
from prorag.retrieval.index import open_retriever
from prorag.stages.rl import RLConfig
from prorag.supervision.hiprag import HiPRAGReward
from prorag.supervision.step_rewards import OracleSteps

run = sys.argv[1]
tok = AutoTokenizer.from_pretrained(f"{run}/smollm2")
recs = read_records(f"{run}/rl32.jsonl")
ret = open_retriever(f"{run}/bm25")
golds = render_gold(recs, ret, k=3)
tags = tag_token_ids(tok)
blank = _blank_token_ids(tok)
by_id = {r.id: r for r in recs}
trajs, rs = [], []
for g in golds:
    ids, mask = tokenize_segments(tok, g.segments)
    acts = [
        ActionRecord(a.kind.value if a.kind else None, a.span, a.well_formed)
        for a in parse_token_actions(ids, tags, mask, blank_ids=blank)
    ]
    t = Trajectory(
        g.id, g.question, [], ids, mask, [0.0] * len(ids), acts, g.retrievals, "answer", text=decode_completion(tok, ids)
    )
    trajs.append(t)
    rs.append(by_id[g.id])
c = collections.Counter()
oracle = OracleSteps()(trajs, rs)
cp = STEP_REWARD_SOURCES.get("cpsearch")(RLConfig())(trajs, rs)
hip = HiPRAGReward(OutcomeRewardConfig(form="hiprag"))
hv = hip(RewardInputs(trajs, [r.golden_answers for r in rs], tok, rs))
for t, r, o, p in zip(trajs, rs, oracle, cp, strict=True):
    c["trajs"] += 1
    c["actions"] += len(t.actions)
    c["well_formed"] += sum(a.well_formed for a in t.actions)
    c["oracle_valid"] += sum(x == 1.0 for x in o)
    c["oracle_undecided"] += sum(x == 0.0 for x in o)
    c["cps_finite"] += sum(math.isfinite(x) for x in p)
    c["cps_positive"] += sum(x > 0 for x in p if math.isfinite(x))
    c["format_valid"] += trajectory_format_valid(t, tok)
    a = trajectory_answer(t, tok)
    c["f1=1"] += a is not None and f1_score(a, r.golden_answers) == 1.0
print(dict(c))
print("hiprag ratios", hip.last_ratios, "mean reward", sum(hv) / len(hv))
