"""What the public val file pins and what depends on the generator's PYTHONHASHSEED (issue #20 item 10).

Public ``Dataset/eval/textcraft_synth_val_all_632.json`` holds ids and difficulties only. Under ANY
base-item set order (= any ``PYTHONHASHSEED`` of the public generator, ``--hash-seed`` here) the difficulty
at every val index and the multiset of (goal, difficulty) are the same; which goal sits at which index,
and every inventory, change with the order.
"""

from __future__ import annotations

import collections

from common.envs.textcraft.paper import BASE_ORDER, paper_tasks
from tests.test_textcraft_paper import HASHSEED_30, HASHSEED_32


def _rows(order):
    return paper_tasks("val", base_order=order, gold=False)


def test_val_difficulty_per_index_and_goal_multiset_do_not_depend_on_the_hash_seed():
    runs = {"ours": _rows(None), "hash 30": _rows(HASHSEED_30), "hash 32": _rows(HASHSEED_32)}
    assert BASE_ORDER != HASHSEED_30 != HASHSEED_32
    difficulty = {k: [r["misc"]["difficulty"] for r in rows] for k, rows in runs.items()}
    multiset = {
        k: collections.Counter((r["goal"], r["misc"]["difficulty"]) for r in rows) for k, rows in runs.items()
    }
    goals = {k: [r["goal"] for r in rows] for k, rows in runs.items()}
    inventories = {k: [r["misc"]["initial_inventory"] for r in rows] for k, rows in runs.items()}
    assert difficulty["ours"] == difficulty["hash 30"] == difficulty["hash 32"]
    assert multiset["ours"] == multiset["hash 30"] == multiset["hash 32"]
    assert goals["ours"] != goals["hash 30"] and goals["hash 30"] != goals["hash 32"]
    assert inventories["ours"] != inventories["hash 30"] != inventories["hash 32"]
