"""Level 2: the paper's system. Level 1's loop, with the model split into servers and FSDP2 trainer ranks.

    sera train --level 2 --model tiny --steps 3                                # local Ray, CPU, 1+1 actors
    sera train --level 2 --model tiny --trainers 2 --servers 2 --steps 3       # two gloo FSDP ranks
    sera train --level 2 --single-node 2 --model smollm2                       # 1 GPU serves, 1 GPU trains
    sera train --level 2 --paper --paper-cluster --model Qwen/Qwen3-4B-Instruct-2507   # 2 x 8 H200 (README)
    python -m level2_distributed.train --model tiny --steps 3                  # the same without `sera`

The loop is level 1's (``level1_batched/train.py`` is the oracle of this file: same sampler, schedule,
rewards, datums, packed CISPO loss, metric names and log line). The model now lives in two places:

1. Inference servers (``servers.py``): Ray actors that only generate. The agents' calls go through a
   :class:`~level2_distributed.servers.Router` (the policy the runtime sees), which spreads them over the
   servers and records, per completion, the token ids, behaviour log-probs and the policy version of the
   weights that produced it (the session layer).
2. Trainer ranks (``trainer.py``): Ray actors forming one FSDP2 process group (``fully_shard`` +
   activation checkpointing + bf16 compute / fp32 master and reduce). The driver packs the batch into
   micro-batches and deals them out; the ranks' gradients are reduce-scattered by FSDP.
3. Weight sync (``sync.py``) after every optimizer step: NCCL (gloo on CPU) broadcast from trainer rank
   0 to every server, or a reload from disk. Synchronous on-policy by default; ``--max-staleness N`` lets
   the servers lag up to N versions (fewer syncs; the gap is reported as ``offpolicy/*``; CISPO's ratio
   against the recorded behaviour log-probs keeps the update correct).
4. Checkpoints (``checkpoint.py``): sharded DCP, resumable at another world size; when an actor dies
   (a trainer rank mid-step, a server mid-rollout) the driver restarts the actors, reloads the last
   checkpoint and redoes the rounds after it: nothing lost or counted twice (``fault/restarts`` counts it).

What it simplifies: the rollouts' agent coroutines run in the driver process (their model calls are the
expensive part and go to the servers); no pipelining of the next round's rollouts with this round's
training (``--max-staleness`` only skips syncs); a failure restarts every actor, not only the dead one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from common.agent.judge import make_judge
from common.agent.log import append_tree
from common.envs import env_spec
from common.rl.batch import build_stage_batch
from common.rl.loss import RatioStats
from common.run.checkpoint import RunState, prepare_out, truncate_logs
from common.run.data import TaskSampler, seed_everything, task_pool
from common.run.metrics import (
    NO_UPDATE,
    MetricsWriter,
    RunHistory,
    closing_line,
    log_deadline_groups,
    log_line,
    plot_curves,
    step_metrics,
)
from common.run.progress import CountingPolicy, LiveStats, RunProgress
from common.run.rollout import make_env_with_prompts
from common.run.setup import idle_hint, method_and_schedule, out_of_time
from common.train_config import TrainConfig
from level1_batched.packing import pack_microbatches
from level1_batched.rollouts import collect_groups_in_flight
from level2_distributed.config import Level2Config
from level2_distributed.placement import Placement, actor_env, recoverable
from level2_distributed.sync import get_all

ROOT = Path(__file__).resolve().parents[1]
MAX_RESTARTS = 3


def ray_init(l2: Level2Config) -> None:
    """Join ``--ray-address`` or start a local Ray; the actors import this repository from its path."""
    import ray

    if ray.is_initialized():
        return
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        address=l2.ray_address or None,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
        log_to_driver=True,
    )


# ----------------------------------------------------------------------------------------------------
# The actors of one run: trainer ranks, servers, router. Restartable as a whole.
# ----------------------------------------------------------------------------------------------------
def deal_microbatches(lengths: list[int], max_tokens: int, world: int) -> list[list[list[int]]]:
    """Pack datums into micro-batches (level 1's first-fit decreasing), then deal them to ``world`` ranks,
    fewest micro-batches first, then fewest tokens; every rank gets the same count (``[]`` = a dummy).

    >>> deal_microbatches([5, 3, 4, 2], max_tokens=7, world=2)
    [[[0, 3]], [[2, 1]]]
    >>> deal_microbatches([5], max_tokens=7, world=2)
    [[[0]], [[]]]
    """
    micro = pack_microbatches(lengths, max_tokens)
    ranks: list[list[list[int]]] = [[] for _ in range(world)]
    load = [0] * world
    for mb in micro:  # largest first (FFD order)
        r = min(range(world), key=lambda r: (len(ranks[r]), load[r], r))
        ranks[r].append(mb)
        load[r] += sum(lengths[i] for i in mb)
    n = max(len(r) for r in ranks) if micro else 1
    return [r + [[]] * (n - len(r)) for r in ranks]


def needs_sync(version: int, served: int, max_staleness: int) -> bool:
    """Must the servers get new weights before this round's rollouts? Only when the weights they hold
    (``served``) would lag the trainer's ``version`` by more than ``max_staleness`` versions.

    >>> [needs_sync(v, served=2, max_staleness=0) for v in (2, 3)]
    [False, True]
    >>> [needs_sync(v, served=2, max_staleness=1) for v in (3, 4)]
    [False, True]
    """
    return version - served > max_staleness


SHARED_OUT_MARKER = ".sera_shared_out"
"""The file :func:`check_shared_out` writes under --out and reads back on every actor's node."""


def _sees_marker(_actor: Any, path: str, token: str) -> tuple[str, bool]:
    """Run inside an actor (``__ray_call__``): its node, and whether it reads the driver's marker there."""
    import ray

    p = Path(path)
    return ray.util.get_node_ip_address(), p.is_file() and p.read_text() == token


def check_shared_out(actors: list[Any], out: Path, timeout_s: float = 120.0) -> None:
    """Every actor that writes or reads under --out (trainer ranks: DCP's shards, the HF export; servers with
    --weight-sync disk: the weights file) must see the driver's directory, or a checkpoint is scattered over
    node-local disks and a resume finds a part of it. A marker written here, read on every actor's node:
    ValueError naming the nodes that do not see it (one line at the CLI), before the first round; Ray's
    GetTimeoutError when an actor does not answer within ``timeout_s``."""
    import secrets

    import ray

    marker = out / SHARED_OUT_MARKER
    token = secrets.token_hex(8)
    marker.write_text(token)
    try:  # a file read per actor: seconds; the deadline only guards against an actor that never answers
        seen = ray.get([a.__ray_call__.remote(_sees_marker, str(marker), token) for a in actors], timeout=timeout_s)
    finally:
        marker.unlink(missing_ok=True)
    blind = sorted({ip for ip, ok in seen if not ok})
    if blind:
        raise ValueError(
            f"--out {out} is not shared with node(s) {', '.join(blind)}: their actors do not see the file this "
            "driver wrote there (DCP writes every rank's shards under --out, and a resume reads them all); put "
            "--out on storage every node mounts at the same path"
        )


def actor_gpus(requested: float) -> float:
    import ray

    if requested >= 0:
        return requested
    return 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0


def trainer_gpu_share(colocate: bool, trainer_gpus: float) -> float:
    """The part of its GPU a trainer rank may train in (its step is checked against it at set-up): beside a
    colocated engine what the engine leaves, on a fraction of a GPU that fraction, else the whole card.

    >>> trainer_gpu_share(True, 1.0), trainer_gpu_share(False, 0.5), trainer_gpu_share(False, 1.0)
    (0.7, 0.5, 1.0)
    """
    from level2_distributed.colocate import ENGINE_GPU_SHARE

    if colocate:
        return round(1.0 - ENGINE_GPU_SHARE, 6)
    return trainer_gpus if 0.0 < trainer_gpus < 1.0 else 1.0


class System:
    """Trainer ranks + servers + the sync group. ``start()`` again after a failure makes fresh actors."""

    def __init__(self, cfg: TrainConfig, l2: Level2Config, tokenizer: Any,
                 checkpoint_config: dict[str, Any] | None = None) -> None:  # fmt: skip
        """``checkpoint_config``: the run's config as checkpoints record it (default ``asdict(cfg)``; with
        --init-adapter the actors' ``cfg.model`` is the merged directory, the checkpoints keep the user's)."""
        self.cfg, self.l2, self.tokenizer = cfg, l2, tokenizer
        self.checkpoint_config = checkpoint_config if checkpoint_config is not None else asdict(cfg)
        self.trainers: list[Any] = []
        self.servers: list[Any] = []
        self.placement: Placement | None = None
        self.engine = l2.server_engine
        self.restarts = 0

    def start(self) -> None:
        import ray

        from level2_distributed.servers import EngineProcessServer, HFServer, SGLangServer
        from level2_distributed.sync import setup_broadcast
        from level2_distributed.trainer import TrainerRank

        self.stop()
        env = actor_env()
        opts = {"num_cpus": 0, "runtime_env": {"env_vars": env}, "max_concurrency": 1}
        t_gpus, s_gpus = actor_gpus(self.l2.trainer_gpus), actor_gpus(self.l2.server_gpus)
        colocate = self.l2.colocate
        self.engine = self.l2.server_engine
        if self.engine == "auto":  # vLLM on GPU clusters, our hf engine on CPU
            self.engine = "vllm" if ray.cluster_resources().get("GPU", 0) > 0 else "hf"
        if t_gpus >= 1 and (s_gpus >= 1 or colocate):  # whole GPUs: placement groups
            self.placement = Placement(self.l2.trainers, self.l2.servers, colocate=colocate)
        if colocate:  # an async actor (its engine serves concurrent calls), one per GPU
            from level2_distributed.colocate import ColocatedRank

            trainer_cls, opts = ray.remote(ColocatedRank), {**opts, "max_concurrency": 1000}
        else:
            trainer_cls = ray.remote(TrainerRank)
        world = self.l2.trainers
        self.trainers = [
            trainer_cls.options(num_gpus=t_gpus, **opts, **self._where("trainer", r)).remote(
                r,
                world,
                self.cfg,
                self.l2.activation_checkpointing,
                self.l2.trainer_microbatch_tokens,
                fast_trainer=self.l2.trainer_fast,
                checkpoint_fraction=self.l2.trainer_checkpoint_fraction,
                compile_layers=self.l2.trainer_compile_layers,
                collective_timeout_s=self.l2.collective_timeout_s,
                gpu_share=trainer_gpu_share(colocate, t_gpus),
            )  # fmt: skip
            for r in range(world)
        ]
        host, port = ray.get([self.trainers[0].node_ip.remote(), self.trainers[0].free_port.remote()])
        if colocate:
            ray.get([t.setup.remote(f"{host}:{port}") for t in self.trainers])
            engine = "vllm" if self.engine == "vllm" else "hf"
            infos = ray.get([t.setup_engine.remote(engine, self.cfg.optim.dtype, self.l2.server_batch_size,
                                                   deterministic=self.l2.server_deterministic)
                             for t in self.trainers])  # fmt: skip
            self.servers = list(self.trainers)
            from level2_distributed.servers import Router

            self.router = Router(self.servers, self.tokenizer, infos[0]["max_context_tokens"])
            return
        engine = self.engine
        if engine == "sglang":
            cls: Any = SGLangServer
        elif self.l2.server_python:
            cls = EngineProcessServer
        else:
            cls = HFServer
        server_cls = ray.remote(cls)
        self.servers = [
            server_cls.options(
                num_gpus=s_gpus,
                num_cpus=0,
                runtime_env={"env_vars": env},
                max_concurrency=1000,
                **self._where("server", i),
            ).remote(
                self.cfg.model,
                self.cfg.optim.dtype,
                self.cfg.seed,
                self.l2.server_batch_size,
                engine,
                server_python=self.l2.server_python,
                gpu_memory_utilization=self.l2.server_gpu_memory_utilization,
                deterministic=self.l2.server_deterministic,
            )  # fmt: skip
            for i in range(self.l2.servers)
        ]
        ray.get([t.setup.remote(f"{host}:{port}") for t in self.trainers])
        info = ray.get(self.servers[0].info.remote())
        if self.l2.weight_sync == "broadcast":
            from level2_distributed.servers import SGLANG_GROUP

            setup_broadcast(self.trainers, self.servers, SGLANG_GROUP if self.engine == "sglang" else "",
                            self.l2.collective_timeout_s)  # fmt: skip
        from level2_distributed.servers import Router

        self.router = Router(self.servers, self.tokenizer, info["max_context_tokens"])

    def _where(self, role: str, index: int) -> dict[str, Any]:
        """The actor's scheduling strategy (its placement-group bundle), or nothing without placement groups."""
        if self.placement is None:
            return {}
        return self.placement.trainer(index) if role == "trainer" else self.placement.server(index)

    stop_timeout_s = 30.0
    """How long ``stop`` waits, in total, for the servers to end their engine processes (all at once)."""

    def stop(self) -> None:
        import ray

        colocated = self.servers == self.trainers
        # servers first: an engine process of theirs ends too; every server at once, one deadline for all (a hung
        # or dead one is killed below, and its engine process then ends by its watcher: reaper.py)
        refs = [a.shutdown.remote() for a in ([] if colocated else self.servers)]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=self.stop_timeout_s)
        for a in self.trainers + ([] if colocated else self.servers):
            ray.kill(a, no_restart=True)
        self.trainers, self.servers = [], []
        if self.placement is not None:
            self.placement.remove()
            self.placement = None

    def sync(self, version: int, out: Path) -> dict[str, float]:
        from level2_distributed.sync import sync_weights

        if self.l2.colocate:  # in-process, on the device: every rank loads its own engine
            t0 = time.perf_counter()
            get_all([t.sync_engine.remote(version, self.l2.sync_bucket_mb) for t in self.trainers])
            m = {"time/sync_s": time.perf_counter() - t0, "sync/version": float(version)}
        else:
            m = sync_weights(self.trainers, self.servers, self.l2.weight_sync, version, str(out / "weights"),
                             self.cfg.optim.dtype, self.l2.sync_bucket_mb)  # fmt: skip
        if self.l2.sync_check:
            m["sync/logprob_gap"] = self.logprob_gap()
            m["sync/weight_gap"] = self.weight_gap()
        return m

    def weight_gap(self) -> float:
        """Server 0's weights against the trainer's in the serving dtype, by fingerprint (``common.policy.engine
        .fingerprint_gap``: 0 up to float64 rounding when the engine holds exactly the weights the sync sent,
        NaN where its weights cannot be read). Unlike the log-prob gap, kernel noise does not enter it."""
        import ray

        from common.policy.engine import fingerprint_gap

        want = get_all([t.weights_fingerprint.remote(self.cfg.optim.dtype) for t in self.trainers])[0]
        return fingerprint_gap(ray.get(self.servers[0].engine_fingerprint.remote()), want)

    def logprob_gap(self) -> float:
        """Largest |server 0 - trainer| log-prob over a fixed probe sequence (teacher-forced)."""
        import ray

        ids = self.tokenizer("The quick brown fox jumps over the lazy dog. " * 3)["input_ids"]
        prompt, output = ids[:8], ids[8:]
        method = "trainer_logprobs" if self.l2.colocate else "score_logprobs"
        refs = [getattr(t, method).remote(prompt, output) for t in self.trainers]  # a collective: every rank
        served = ray.get(self.servers[0].score_logprobs.remote(prompt, output))
        want = get_all(refs)[0]
        return max(abs(a - b) for a, b in zip(served, want, strict=True))

    def train(self, datums: list[Any], weights: list[float], n_tokens: float, rnd: int) -> dict[str, float]:
        """One optimizer step over all ranks; loss shares summed, the (global) grad norm from rank 0."""

        if self.l2.colocate:
            get_all([t.sleep.remote() for t in self.trainers])  # the engines give the GPU to the update
        lengths = [len(d.prompt_ids) + len(d.output_ids) for d in datums]
        dealt = deal_microbatches(lengths, self.l2.trainer_microbatch_tokens, len(self.trainers))
        refs = [
            t.train_step.remote(
                [([datums[i] for i in mb], [weights[i] for i in mb]) for mb in mbs], n_tokens, round=rnd
            )  # fmt: skip
            for t, mbs in zip(self.trainers, dealt, strict=True)
        ]
        parts = get_all(refs)
        if self.l2.colocate:
            get_all([t.wake.remote() for t in self.trainers])  # the engines serve the next rollouts
        summed = {k: sum(p[k] for p in parts) for k in ("loss/cispo", "loss/clip_frac", "train/microbatches",
                                                         "train/packed_tokens")}  # fmt: skip
        mem = {k: max(p[k] for p in parts) for k in parts[0] if k.startswith("mem/")}  # the ranks' worst
        sums = ("loss/scored_tokens", "loss/ratio_sum", "loss/abs_log_ratio_sum")
        ratios = RatioStats.from_totals(
            [sum(p.pop(k) for p in parts) for k in sums], max(p["loss/ratio_max"] for p in parts)
        )  # the behaviour/trainer ratio over every rank's tokens, as levels 0 and 1 log it
        return {
            **parts[0], **summed, **mem, **ratios, "train/skipped": 0.0,
            "time/rank_train_s": max(p["time/rank_train_s"] for p in parts),
        }  # fmt: skip

    def export(self, path: Path) -> None:
        """The trained model as an HF directory (rank 0 writes; every rank takes part in the all-gather)."""
        get_all([t.save_for_disk.remote(str(path), self.cfg.optim.dtype, True) for t in self.trainers])

    def save(self, state: RunState, out: Path) -> None:

        get_all([t.save.remote(asdict(state), str(out), self.checkpoint_config) for t in self.trainers])

    def load(self, out: Path) -> RunState | None:

        states = get_all([t.load_latest.remote(str(out), self.checkpoint_config) for t in self.trainers])
        return None if states[0] is None else RunState(**states[0])


def restart(system: System, out: Path, exc: BaseException, log: Any = print) -> RunState:
    """After a recoverable failure ``exc``: fresh actors, the last checkpoint loaded; returns its run state.
    A start or load that fails recoverably too (an engine that cannot start yet, a rank that dies while
    loading) is retried; every attempt counts toward ``MAX_RESTARTS``, past which the last failure raises."""
    while True:
        if system.restarts >= MAX_RESTARTS:
            raise exc
        system.restarts += 1
        log(f"an actor died ({type(exc).__name__}); restart {system.restarts}: fresh actors, last checkpoint")
        try:
            system.start()
            return system.load(out) or RunState()
        except Exception as again:  # noqa: BLE001 - recoverable ones retry, the rest propagate
            if not recoverable(again):
                raise
            exc = again


# ----------------------------------------------------------------------------------------------------
# Rollouts: every tree of a wave in flight, the agents' calls spread over the servers by the router.
# ----------------------------------------------------------------------------------------------------
def rollout_policy(cfg: TrainConfig, router: Any) -> Any:
    """The router, optionally with teacher-forced oracle replies (``--oracle-mix``) as in every tier."""
    if cfg.oracle_mix == 0:
        return router
    from common.policy import make_policy
    from common.policy.forced import TeacherForcedPolicy

    teacher = make_policy("oracle", env=cfg.env, delegate=True)
    return TeacherForcedPolicy(router, teacher, cfg.oracle_mix, cfg.score_noise, seed=cfg.seed,
                               max_prompt_tokens=cfg.rollout.max_prompt_tokens)  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# The loop: level 1's, with servers, a sync and FSDP ranks.
# ----------------------------------------------------------------------------------------------------
def train(cfg: TrainConfig, l2: Level2Config | None = None, progress: bool = True) -> RunHistory:
    """Run until ``cfg.steps`` optimizer steps; returns the metrics of every round kept."""
    import ray

    from common.policy.models import load_tokenizer
    from common.policy.warmstart import merged_model_dir, resolve_init
    from level2_distributed.servers import offpolicy_metrics

    l2 = (l2 or Level2Config()).resolved()
    init = resolve_init(cfg.init_adapter, cfg.model, cfg.env, cfg.seed)  # a mismatched adapter fails here
    out = Path(cfg.out).resolve()
    prepare_out(out, cfg.resume)
    seed_everything(cfg.seed)
    preset, schedule = method_and_schedule(cfg)
    pool = task_pool(cfg.env, cfg.tasks, cfg.n_tasks, cfg.seed, cfg.difficulty)
    # --init-adapter: servers and FSDP ranks load models by path, so they get the merged weights as a model
    # directory (written once under $SERA_CACHE/merged; on several nodes that cache must be shared)
    actors_cfg = cfg if init.adapter is None else replace(cfg, model=merged_model_dir(init, cfg.seed))
    ray_init(l2)
    system = System(actors_cfg, l2, load_tokenizer(actors_cfg.model), checkpoint_config=asdict(cfg))
    system.start()
    try:
        disk = l2.weight_sync == "disk" and not l2.colocate  # servers read the weights file under --out
        check_shared_out(system.trainers + (system.servers if disk else []), out)
    except Exception:
        system.stop()  # no actor outlives a run that cannot start
        raise
    state = (system.load(out) if cfg.resume else None) or RunState()
    truncate_logs(out, state.round)
    init_record = {**init.record(), "merged_model_dir": actors_cfg.model if init.adapter else None}
    (out / "config.json").write_text(
        json.dumps({**asdict(cfg), "level2": asdict(l2), "init_weights": init_record}, indent=2)
    )
    print(init.line())
    print(f"[level2] {cfg.method} on {cfg.env} | model {cfg.model} | schedule {schedule} | {l2.trainers} FSDP "
          f"ranks, {l2.servers} {system.engine} servers, sync {l2.weight_sync}, max staleness {l2.max_staleness} "
          f"| steps {state.step}->{cfg.steps}")  # fmt: skip
    env, sampler = (
        make_env_with_prompts(cfg.env, cfg.rollout.prompts_dir, cfg.codeact_executor),
        TaskSampler(pool, cfg.seed, state.cursor),
    )
    stats = LiveStats()
    writer = MetricsWriter(out, cfg.tensorboard)
    stats.stuck_path = out / "stuck_calls.jsonl"  # what was in flight when a deadline fired
    bar = RunProgress(progress, cfg.steps, state.step, stats)  # + a heartbeat line every 30 s of a slow round
    history: list[dict[str, Any]] = []
    stopped: str | None = None  # why the run ends before --steps, if it does (sera train exits 3)
    served, idle = -(10**9), 0  # the version the servers hold (none yet: sync before the first rollout)
    started = time.monotonic()  # --time-limit-s counts from here
    while state.step < cfg.steps:
        stage = schedule.stage_at(state.step)  # the clock is the policy version
        t_start = time.perf_counter()
        try:
            sync_m = {"time/sync_s": 0.0}
            if needs_sync(state.step, served, l2.max_staleness):
                bar.phase("weight sync")
                sync_m = system.sync(state.step, out)
                served = state.step
            policy = CountingPolicy(rollout_policy(cfg, system.router), stats)
            judge = make_judge(cfg.judge, policy)
            bar.phase(f"{stage} rollouts")
            t0 = time.perf_counter()
            dropped: list[list[Any]] = []  # groups cut by a deadline (replaced; logged, never trained)
            groups, replaced = collect_groups_in_flight(
                cfg, stage, state.round, sampler, env, policy, judge, preset, dropped=dropped
            )
            t_roll = time.perf_counter() - t0
            if system.router.failure is not None:  # a server died under the agents: restart (below)
                raise system.router.failure
            off = offpolicy_metrics(system.router.take_records(), state.step)
            trees = [t for g in groups for t in g]
            batch = build_stage_batch(stage, groups, preset.execution_reward,
                                      zero_variance=env_spec(cfg.env).zero_variance, tokenizer=system.tokenizer)  # fmt: skip
            n_tokens = float(batch.num_trained_tokens)  # |M| counts every datum ...
            updated = batch.takes_step(cfg.min_trainable_datums)  # public decide_sync_action (paper: 8)
            bar.phase("training")
            t1 = time.perf_counter()
            train_m = (
                system.train(*batch.with_gradient(), n_tokens, state.round)  # ... only these have a gradient
                if updated
                else dict(NO_UPDATE)
            )
            t_train = time.perf_counter() - t1
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
            # a trainer rank or a server died, or a collective failed / timed out (NCCL, gloo): restart,
            # reload, redo; any other task error is a bug and propagates
            if not recoverable(exc):
                raise
            state = restart(system, out, exc, bar.log)
            truncate_logs(out, state.round)
            history = [h for h in history if h["round"] < state.round]
            sampler, served = TaskSampler(pool, cfg.seed, state.cursor), -(10**9)
            continue
        metrics = {
            **step_metrics(
                round=state.round, step=state.step, stage=stage, trees=trees, batch=batch, train=train_m,
                execution_reward=preset.execution_reward, t_rollout=t_roll, t_train=t_train, replaced=replaced,
                t_round=time.perf_counter() - t_start, deadline_groups=len(dropped),
            ),
            **sync_m, **off,
            "train/tokens_per_s": train_m.get("train/packed_tokens", 0.0) / max(t_train, 1e-9),
            "time/step_s": time.perf_counter() - t_start,
            "dp/world_size": l2.trainers, "servers": l2.servers, "fault/restarts": system.restarts,
        }  # fmt: skip
        history.append(metrics)
        state.round, state.cursor = state.round + 1, sampler.cursor
        state.step += int(updated)
        idle = 0 if updated else idle + 1
        for t in trees:
            t.meta.update(step=metrics["step"], round=metrics["round"])
            append_tree(out / "trees.jsonl", t)
        log_deadline_groups(out, dropped, metrics["step"], metrics["round"])
        writer.write(metrics)  # logs first, checkpoint second (as levels 0 and 1)
        late = out_of_time(cfg, started) if state.step < cfg.steps else None  # --time-limit-s: the last round
        if updated and (state.step % cfg.save_every == 0 or state.step == cfg.steps or late):
            system.save(state, out)
        bar.log(f"{log_line(metrics)} sync_s={metrics['time/sync_s']:.3g} "
                f"offpolicy_gap={metrics['offpolicy/gap_mean']:.3g}", state.step)  # fmt: skip
        if not updated:
            bar.log(idle_hint(cfg, stage, batch, groups))
        if idle >= cfg.max_idle_rounds or late:
            stopped = late or f"{idle} rounds in a row without an optimizer step (--max-idle-rounds)"
            bar.log(f"stopping: {stopped}")
            break
    bar.close()
    writer.close()
    if l2.export_hf and state.step > 0:
        system.export(out / "model")
        print(f"[level2] the trained model (step {state.step}) as an HF directory: {out / 'model'}")
    system.stop()
    if history:
        plot_curves(out / "metrics.jsonl", out / "curves.png")
    print(closing_line(out, state.step, state.round))
    return RunHistory(history, stopped=stopped)


# ----------------------------------------------------------------------------------------------------
# Command line (`python -m level2_distributed.train`): the `sera train` options at level 2.
# ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    """Become ``sera train --level 2 ARGS`` (common/run/entry.py: the CLI imports this tier, not the reverse)."""
    from common.run.entry import exec_sera

    exec_sera(["train", "--level", "2"], "level2_distributed.train", argv)


if __name__ == "__main__":
    main()
