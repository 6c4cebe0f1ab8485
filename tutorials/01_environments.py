# %% [markdown]
# # Tutorial 1 — the two environments
#
# SERA trains one policy inside a *recursive* agent tree. Every agent of a tree acts on ONE shared,
# live world. This tutorial pokes both worlds by hand, with no model:
#
# * **TextCraft-Synth** (`common/envs/textcraft`): a seeded recipe world; agents write Python (CodeAct)
#   that calls `craft`, `get_info`, `view_inventory`, `finish` and `launch_subagent`.
# * **TextWorld-Sync** (`common/envs/textworld_sync`): a multi-dish kitchen with a global action budget,
#   tool cooldowns, an inventory capacity and a kitchen gate.
#
# Run it as a script (`python tutorials/01_environments.py`) or open it as a notebook with jupytext.
# It needs only the README's quick-start install: the TextWorld-Sync task below is written by hand with
# `make_row` (pure Python). Generating TextWorld-Sync tasks (`sera data textworld`) reads the food
# catalogue of the `textworld` package: install the extra for that (`pip install -e '.[textworld]'`).

# %%
from common.envs.textcraft.tasks import book_for_task, generate_tasks, solve
from common.envs.textcraft.world import TextCraftWorld

task = generate_tasks(split="train", n=1, seed=0, difficulty="easy")[0]  # the paper's first easy train task
book = book_for_task(task)  # the recipe world the task names: the paper's (seed 42)
print(len(book.items), "items; stable hash", book.stable_hash()[:12])
print(task["goal"], "| initial inventory:", task["misc"]["initial_inventory"])

# %% [markdown]
# The world is a shared inventory over an immutable recipe book. Tools return strings, errors included:
# a bad call never raises, it becomes an observation the model can read.

# %%
targets = task["misc"]["target_items"]
world = TextCraftWorld(book, task["misc"]["initial_inventory"], targets)
target, count = next(iter(targets.items()))
print(world.get_info([target])[0])
print(world.craft({"nothing": 1}, (target, 1)))  # an explicit error string
gold = solve(book, world.view_inventory(), {target: count})
for s in gold:  # replay the solver's gold craft sequence
    item, n_exec = s["target"]  # result_count is the step's total
    print(world.craft(s["ingredients"], (item, s["result_count"])))
print("TUTORIAL01 crafted", world.view_inventory().get(target, 0), "of", count, target)
assert world.view_inventory().get(target, 0) >= count, "the gold sequence crafts the target"

# %% [markdown]
# `fork()` is an isolated copy (used for counterfactual branches and best-of-n); `commit(branch)` makes a
# branch's state the live one, in place.

# %%
branch = world.fork()
branch.inventory.clear()  # wreck the fork ...
print("live world untouched:", world.view_inventory() != {})
world.commit(branch)  # ... and make it the live state
print("after commit:", world.view_inventory())
print("root success needs finish() too:", world.root_success())
assert branch.inventory == {} and world.inventory is not branch.inventory  # commit copies, no aliasing

# %% [markdown]
# ## TextWorld-Sync
# Agents reply with exactly one of `<action>…</action>`, `<delegate>{json}</delegate>`, `<finish>…</finish>`.
# Every action — even a rejected one — costs one step of the GLOBAL budget shared by the whole tree.

# %%
from common.envs.textworld_sync.protocol import parse_reply
from common.envs.textworld_sync.tasks import make_row
from common.envs.textworld_sync.world import SyncWorld

row = make_row([[("carrot", ("raw", "sliced"), "kitchen.fridge")]], max_steps=30)  # one dish, one food
w = SyncWorld(row)
print(w.observe("0")[:400])
print(parse_reply("<action>read cookbook</action>", w.valid_actions("0")))
before = w.steps_left
r = w.step("0", "fly to the moon")  # not a valid action: rejected, but the budget is spent
print("accepted", r.accepted, "counted", r.counted, "steps left", before, "->", w.steps_left)
assert not r.accepted and w.steps_left == before - 1

# %% [markdown]
# Forks are isolated here too: steps taken on a fork spend the FORK's budget. Committing the fork makes
# its state (budget included) the live one.

# %%
fork = w.fork()
for action in ("look around", "take carrot"):
    print(action, "->", fork.step("0", action).accepted)
print("live steps left", w.steps_left, "| fork steps left", fork.steps_left)
assert w.steps_left == 29 and fork.steps_left == 27
w.commit(fork)
print("after commit: live steps left", w.steps_left)
assert w.steps_left == 27
print("TUTORIAL01 tw_steps_left", w.steps_left)

# %% [markdown]
# ## GPU notes
# Nothing here touches a model, so a laptop GPU or a cluster changes nothing: the worlds are pure Python
# and fast on any CPU (bench/RESULTS.md, "TextCraft-Synth": `fork()` 0.23 µs, a CodeAct step 71 µs;
# "TextWorld-Sync vs real TextWorld": 58,226 steps/s, `fork()` 1.22 µs). On a cluster the environments
# run in the driver process next to the agents (level 2), never on the GPUs.
