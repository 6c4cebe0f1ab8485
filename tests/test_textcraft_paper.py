"""The paper's TextCraft-Synth data (``common/envs/textcraft/paper.py``) against the public generator.

What is pinned, and where each expected value comes from:

* the recipe world: the recipes that the public platoon docs print (``m2_i2_12``, ``m2_i1_12``,
  ``a9_i1``), 1,452 items, the per-tier counts of ``SynthRecipeDatabase`` with 25 items per domain/tier;
* split sizes and tier counts (2,522 = 588/852/544/538 and 632 = 147/213/136/136, the public docs and
  ``Dataset/eval/textcraft_synth_val_all_632.json``), and the difficulty at every index of val 0-292 and
  613-631, transcribed by hand from that public file;
* two published rows (``textcraft_synth.train.30`` in full, ``textcraft_synth.train.0``'s target, depth,
  step count and first gold step, from the platoon docs), replayed under the base-item order that
  CPython's set gives with ``PYTHONHASHSEED=30`` / ``32`` (the one input the public code leaves to the
  hash seed; see paper.py);
* digests of the first 3 tasks of each split under our fixed order, the first task of each spelled out;
* the oracle's plan and the public gold trajectory solve all 632 val tasks through ``TextCraftWorld``;
* loading: a public row without a recipe book runs in the paper world; a row run in the wrong world is a
  ``file:line`` error.

Run: ``pytest tests/test_textcraft_paper.py -q`` (about 10 s: three generations of both splits).
"""

from __future__ import annotations

import collections
import hashlib
import json
import random
import sys

import pytest

from common.data import TaskFileError
from common.envs.textcraft.paper import (
    BASE_ORDER,
    Draws,
    base_needs,
    base_order_for_hash_seed,
    gold_trajectory,
    paper_tasks,
    paper_world,
)
from common.envs.textcraft.recipes import Recipe, generate_recipe_book
from common.envs.textcraft.tasks import generate_tasks, load_tasks, plan_crafts, save_tasks
from common.envs.textcraft.world import TextCraftWorld

# Difficulty per val index, from the public Dataset/eval/textcraft_synth_val_all_632.json
# (E easy, M medium, H hard, X extreme), indices 0-292 and 613-631.
PUBLIC_VAL_HEAD = (
    "EMMMXEHXME" "EXEXMHEEXE" "EMEMEXXXEX" "HHMMXXEHEH" "HHHMMMEEXM" "HMMMMMMEEE" "EHEEXEHMMM"
    "MMXXXMMEXM" "MXHXEMHEHX" "MHHXHHEEMM" "XMEMXEEXME" "EEHEEEMXMX" "HMMXMHEHME" "MMMHHEMXMM"
    "HHHEEX" "X" "MMMM" "EXEXMMEME" "HEHMXHHXEE" "HHHHMMXHHH" "EMXHXXHHME" "XXXXXMXHXM" "EMMMMMEMEE"
    "MHMHHHMHXX" "EEHHEXMXMH" "HMXMEEMMMH" "XEXMMXEEXH" "XMMMMMMEME" "HMEEEEEEEM" "XXEMHMHHMM"
    "MHEXEMHXHX" "MEX"
)  # fmt: skip
PUBLIC_VAL_TAIL = "EHHMEXHMXXHHEXMMEMX"  # indices 613-631
CODE = {"easy": "E", "medium": "M", "hard": "H", "extreme": "X"}

# list(set_of_base_items) in CPython 3.11/3.12 under PYTHONHASHSEED=30 and =32, the public insertion order.
HASHSEED_30 = tuple(
    "m2_ore raw_t8 raw_a2 c4_ore raw_o2 raw_a5 raw_t0 raw_a9 raw_o0 c3_ore c9_ore raw_a7 raw_a8 c5_ore raw_o4 "
    "raw_t7 m3_ore raw_o3 raw_t6 m4_ore raw_o6 raw_a3 raw_t3 raw_t5 raw_o1 m9_ore m1_ore raw_a6 m0_ore raw_o9 "
    "raw_t1 raw_t4 m5_ore c0_ore m8_ore raw_t9 raw_o5 raw_t2 raw_a4 c8_ore raw_a0 raw_o7 raw_a1 m6_ore raw_o8 "
    "m7_ore c1_ore c2_ore c6_ore c7_ore".split()
)
HASHSEED_32 = tuple(
    "m3_ore raw_t9 raw_a4 raw_o3 m7_ore c8_ore c9_ore raw_t2 m2_ore raw_o9 raw_t7 raw_a0 raw_t0 raw_a8 c3_ore "
    "raw_o4 raw_t5 raw_t1 raw_o8 m5_ore c2_ore raw_a7 c5_ore raw_t4 raw_a6 raw_o6 raw_a3 m8_ore m6_ore c7_ore "
    "raw_o5 m0_ore raw_a2 raw_a1 raw_o1 raw_o2 c4_ore raw_a5 m1_ore raw_t8 raw_t6 c1_ore raw_t3 raw_a9 m4_ore "
    "m9_ore raw_o0 c0_ore raw_o7 c6_ore".split()
)


@pytest.fixture(scope="module")
def val():
    return paper_tasks("val")


@pytest.fixture(scope="module")
def train():
    return paper_tasks("train")


def _digest(rows):
    first = [[r["misc"]["target_items"], r["misc"]["initial_inventory"]] for r in rows[:3]]
    return hashlib.sha256(json.dumps(first).encode()).hexdigest()


def test_draws_are_the_stdlib_draws():
    for seed in range(5):
        ours, ref = Draws(seed), random.Random(seed)
        items, ref_items = list(range(40)), list(range(40))
        ours.shuffle(items)
        ref.shuffle(ref_items)
        assert items == ref_items
        pool = [f"i{k}" for k in range(seed * 9 + 3)]  # both sample() code paths (n <= 21 and n > 21)
        assert ours.sample_one(pool) == ref.sample(pool, 1)[0]
        assert [ours.randint(1, 1), ours.choice(pool), ours.random()] == [
            ref.randint(1, 1),
            ref.choice(pool),
            ref.random(),
        ]


def test_world_matches_the_public_generator():
    w = paper_world()
    book = w.book
    assert len(book) == 1452 and len(w.base_items) == 50 and set(w.base_items) == set(BASE_ORDER)
    per_tier = collections.Counter(book.tiers.values())
    # 5 domains x (25 - tier // 3) items, plus the 4 + 4 + 4 cross-domain items at tiers 10, 11, 12.
    expected = [50, 125, 125, 120, 120, 120, 115, 115, 115, 110, 114, 114, 109]
    assert [per_tier[t] for t in range(13)] == expected
    assert len(w.items_by_tier[0]) == 125  # the public tier-0 list repeats each base name 2-3 times
    # Recipes printed by the public platoon docs (get_info of m2_i2_12; the craft of a9_i1 in train.0).
    assert book.recipe("m2_i2_12") == Recipe({"m2_i1_12": 1, "m3_ore": 1}, 3)
    assert book.recipe("m2_i1_12") == Recipe({"m9_ore": 1}, 2)
    assert book.recipe("a9_i1") == Recipe({"raw_a1": 2}, 3)
    assert book.stable_hash() == "fd9c29d6684358344a27a1f64b0236e694a9e973d7b7be698cb2b171035b196d"


def test_split_sizes_tier_counts_and_ids(val, train):
    assert len(train) == 2522 and len(val) == 632
    count = collections.Counter
    assert count(r["misc"]["difficulty"] for r in val) == {
        "easy": 147,
        "medium": 213,
        "hard": 136,
        "extreme": 136,
    }
    assert count(r["misc"]["difficulty"] for r in train) == {
        "easy": 588,
        "medium": 852,
        "hard": 544,
        "extreme": 538,
    }
    assert [r["id"] for r in val] == [f"textcraft_synth.val.{i}" for i in range(632)]
    assert [r["id"] for r in train] == [f"textcraft_synth.train.{i}" for i in range(2522)]
    assert {r["max_steps"] for r in val + train} == {75}
    targets = {
        s: {t for r in rows for t in r["misc"]["target_items"]} for s, rows in (("v", val), ("t", train))
    }
    assert not targets["v"] & targets["t"]  # item-disjoint splits


def test_val_difficulty_at_every_index_matches_the_public_file(val):
    ours = "".join(CODE[r["misc"]["difficulty"]] for r in val)
    assert len(PUBLIC_VAL_HEAD) == 293
    assert ours[:293] == PUBLIC_VAL_HEAD
    assert ours[613:] == PUBLIC_VAL_TAIL


def test_first_tasks_and_digests(val, train):
    assert _digest(val) == "55c36552aafe068fb2de2c61538a91c59efc5e113c0c1e3cff5255d38ea2281b"
    assert _digest(train) == "f651c2258c863f014715f711e6d10063bc54b9542ce54a535867f6286449faeb"
    v0 = val[0]
    assert v0["goal"] == "Craft the following items: 2x t2_i3_12"
    assert v0["misc"]["target_items"] == {"t2_i3_12": 2}
    # t2_i3_12 = t0_i1 + t5_i1 (x1); t0_i1 = 2 raw_t1 (x3); t5_i1 = 1 raw_t1 (x2): 3 raw_t1 per item
    # counted without result counts -> 6, + buffer randint(0, 3) = 2; distractor raw_t9 x3.
    assert v0["misc"]["initial_inventory"] == {"raw_t1": 8, "raw_t9": 3}
    assert [s["target"] for s in v0["misc"]["gold_trajectory"]] == [
        ["t0_i1", 1],
        ["t5_i1", 1],
        ["t2_i3_12", 2],
    ]
    assert (v0["misc"]["difficulty"], v0["misc"]["max_depth"], v0["misc"]["num_craft_steps"]) == (
        "easy",
        3,
        3,
    )
    t0 = train[0]["misc"]
    assert t0["target_items"] == {"a3_i4_13": 3}
    assert t0["initial_inventory"] == {
        "raw_a4": 20,
        "raw_a0": 15,
        "raw_a3": 12,
        "raw_a1": 31,
        "c9_ore": 1,
        "raw_a5": 3,
        "raw_t8": 1,
    }


def test_published_rows_replay_under_their_hash_orders():
    """train.30 and train.0 as printed by the public docs: each is what the public generator makes
    when the base-item set iterates in one hash seed's order, which our draws reproduce exactly."""
    r30 = paper_tasks("train", base_order=HASHSEED_30, gold=False)[30]
    assert r30["goal"] == "Craft the following items: 1x m2_i2_12"
    m = r30["misc"]
    assert m["target_items"] == {"m2_i2_12": 1}
    assert m["initial_inventory"] == {"m9_ore": 2, "m3_ore": 1, "m8_ore": 3}
    assert (m["difficulty"], m["max_depth"]) == ("easy", 2)
    assert len(gold_trajectory(paper_world(), m["target_items"], m["initial_inventory"])) == 2
    r0 = paper_tasks("train", base_order=HASHSEED_32, gold=False)[0]["misc"]
    assert r0["target_items"] == {"a1_i5": 3}
    assert (r0["difficulty"], r0["max_depth"]) == ("medium", 5)
    gold = gold_trajectory(paper_world(), r0["target_items"], r0["initial_inventory"])
    assert len(gold) == 22
    assert gold[0] == {
        "action": "craft",
        "target": ["a9_i1", 4],
        "ingredients": {"raw_a1": 8},
        "result_count": 12,
    }


@pytest.mark.skipif(sys.version_info < (3, 11), reason="CPython < 3.11 hashes strings with SipHash-2-4")
def test_base_order_for_hash_seed_is_the_set_order():
    assert base_order_for_hash_seed(30) == HASHSEED_30
    assert base_order_for_hash_seed(32) == HASHSEED_32
    assert sorted(base_order_for_hash_seed(0)) == sorted(BASE_ORDER)


def test_oracle_plan_and_gold_solve_every_val_task(val):
    book = paper_world().book
    for r in val:
        m = r["misc"]
        for steps in (
            plan_crafts(book, m["initial_inventory"], m["target_items"]).steps,
            m["gold_trajectory"],
        ):
            w = TextCraftWorld(book, m["initial_inventory"], m["target_items"])
            for st in steps:
                out = w.craft(st["ingredients"], (st["target"][0], st["result_count"]))
                assert out.startswith("Successfully crafted"), (r["id"], out)
            w.root_finish_message = "done"
            assert w.root_success(), r["id"]


def test_inventory_slack_is_the_public_generators(train):
    """Base needs counted without result counts + up to 50 % buffer: mean slack over the true minimum
    grows with the tier, 3.3x (easy) to 8.9x (extreme) on the train split."""
    book = paper_world().book
    ratios = collections.defaultdict(list)
    for r in train:
        m = r["misc"]
        need = plan_crafts(book, {}, m["target_items"]).missing_base
        have = sum(m["initial_inventory"][b] for b in need)
        ratios[m["difficulty"]].append(have / sum(need.values()))
        assert base_needs(paper_world(), m["target_items"]).keys() <= m["initial_inventory"].keys()
    mean = {d: sum(v) / len(v) for d, v in ratios.items()}
    assert 3.1 < mean["easy"] < 3.5 and 8.6 < mean["extreme"] < 9.2, mean
    assert mean["easy"] < mean["medium"] < mean["hard"] < mean["extreme"]


def test_gold_solver_rejects_unknown_items():
    assert gold_trajectory(paper_world(), {"no_such_item": 1}, {}) is None


def test_generate_tasks_defaults_to_the_paper_splits(val):
    assert generate_tasks("val", 632) == val
    assert [r["id"] for r in generate_tasks("val", 5, difficulty="hard")] == [
        r["id"] for r in val if r["misc"]["difficulty"] == "hard"
    ][:5]
    shuffled = generate_tasks("val", 632, seed=3)
    assert shuffled != val and sorted(r["id"] for r in shuffled) == sorted(r["id"] for r in val)
    with pytest.raises(ValueError, match="has 632 tasks"):
        generate_tasks("val", 633)
    with pytest.raises(ValueError, match="generator"):
        generate_tasks("val", 1, generator="nope")


def test_world_resolution_and_wrong_world_errors(tmp_path, val):
    path = tmp_path / "public.jsonl"
    public = [{k: r[k] for k in ("id", "goal", "max_steps")} | {"misc": dict(r["misc"])} for r in val[:3]]
    for row in public:  # public rows carry neither a recipe book nor a split
        del row["misc"]["recipe_book"], row["misc"]["split"]
    save_tasks(path, public)
    assert [r["id"] for r in load_tasks(path)] == [r["id"] for r in val[:3]]
    # The same row declared as a seed-0 row of our generator: its items exist there, its task does not.
    wrong = json.loads(json.dumps(public))
    wrong[1]["misc"]["recipe_book"] = {"generator": "sera", "seed": 0}
    save_tasks(path, wrong)
    with pytest.raises(TaskFileError, match=r":2: .*cannot be crafted .* sera world seed 0"):
        load_tasks(path)
    # A row of our seed-0 generator without its recipe book is read as a public row: a paper-only item
    # is named in the error (the seed-0 world and the paper world share 1,446 names).
    paper_only = sorted(set(paper_world().book.items) - set(generate_recipe_book(0).items))
    assert paper_only
    sera_row = generate_tasks("val", 1, generator="sera")[0]
    del sera_row["misc"]["recipe_book"]
    save_tasks(path, [sera_row])
    with pytest.raises(TaskFileError, match=r":1: .*paper's world"):
        load_tasks(path)


def test_the_splits_are_kept_on_disk_and_redrawn_when_the_file_is_damaged(tmp_path, monkeypatch):
    """``_splits`` keeps one generation in ``$SERA_CACHE/textcraft/`` (each process that asks for a task would
    otherwise spend ~3 s drawing 3,154): the file's content is the drawing, a later call reads it back (the
    drawing is not repeated), a damaged file is drawn again and rewritten, an unwritable cache changes nothing."""
    import common.envs.textcraft.paper as paper

    monkeypatch.setenv("SERA_CACHE", str(tmp_path / "cache"))
    args = (paper.PAPER_SEED, paper.ITEMS_PER_DOMAIN_TIER, None, False)  # gold=False: the quicker drawing
    drawn = paper._make_splits(*args)
    paper._splits.cache_clear()
    assert paper._splits(*args) == drawn
    path = paper._splits_cache_file(*args)
    assert path.is_file() and path.parent == tmp_path / "cache" / "textcraft"
    paper._splits.cache_clear()
    draws = []
    monkeypatch.setattr(paper, "_make_splits", lambda *a: draws.append(a) or drawn)
    assert paper._splits(*args) == drawn and draws == []  # read back, not drawn
    for damage in (path.read_bytes()[:1000], b"not gzip", __import__("gzip").compress(b"[1, 2]")):
        path.write_bytes(damage)
        paper._splits.cache_clear()
        assert paper._splits(*args) == drawn and len(draws) == 1
        assert paper._splits_cache_file(*args).read_bytes() != damage  # rewritten whole
        draws.clear()
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("SERA_CACHE", str(tmp_path / "a_file"))  # no cache can be made there (even as root)
    try:
        paper._splits.cache_clear()
        assert paper._splits(*args) == drawn and len(draws) == 1
    finally:
        paper._splits.cache_clear()
    assert paper._splits_cache_file(*args) != paper._splits_cache_file(paper.PAPER_SEED + 1, *args[1:])
