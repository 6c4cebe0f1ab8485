"""AdamW that trains under bf16 compute: fp32 master weights live in the optimizer.

Why: at the paper's lr 3e-6 an AdamW update is ~3e-6 x |w|-ish, far below bf16's resolution (8 bits of
mantissa: a relative step of 2^-8 ~ 4e-3). Pure-bf16 parameters updated in place round almost every
update away (measured on SmolLM2: 3 steps changed 0.57% of the bf16 weights vs 100% in fp32). The fix used
by every serious trainer: keep an fp32 copy of each parameter (the *master*), apply AdamW to it, and copy
it back (rounded) into the bf16 model used for forward/backward. Small updates accumulate in the master
until they move the bf16 value. FSDP2's ``MixedPrecisionPolicy`` does the same with sharded fp32 params
(level 2); here it is ~30 readable lines.

    opt = make_optimizer(model, OptimConfig(dtype="bfloat16"))   # model already in bf16
    for part in parts: part.loss.backward(); opt.accumulate_model_grads()   # the sum is taken in fp32
    opt.clip_and_step(grad_clip=1.0)

Gradients are reduced in fp32 as well: ``accumulate_model_grads`` adds the model's (bf16) gradient of one
datum or micro-batch into the fp32 master gradient and clears it, so a step's per-datum gradients sum in
fp32 (the public trainer accumulates and reduces in fp32; summed in bf16 instead, six datums were 1-1.6 %
off the fp32 sum). The global-norm clip is computed on, and applied to, the fp32 master gradients.

Memory (issue #38.7: the quick start's 7.1 GB peak RSS): a 135M-parameter model in bf16 holds 0.27 GB of
weights, 0.54 GB of fp32 masters and 1.08 GB of AdamW moments (in RAM unless offloaded, below); three things keep the rest
from piling up on top of them:

* ``grads_to_masters_in_backward()`` (level 0) moves each parameter's bf16 gradient into its master the moment
  the backward pass has finished it, so one datum's gradient never exists for every parameter at once
  (the same fp32 sum as ``accumulate_model_grads``, bit for bit: the hook runs after all of a tied
  parameter's contributions have been added, as ``accumulate_model_grads`` would see them);
* on a CPU (no fused kernel) ``clip_and_step`` steps one master at a time and frees its gradient right after
  its update, so the moments AdamW creates at the first step do not coexist with every gradient (the same
  single-tensor AdamW arithmetic, parameter by parameter, as one ``step()`` over all of them);
* the gradients are freed after every step (``zero_grad``), not kept through the next round's rollouts.

What is left is the optimizer's own state: 1.6 GB of masters and moments that only a step and a checkpoint
read. ``offload(directory)`` (``--optimizer-state disk``, the default at levels 0 and 1 on a CPU) keeps them
in files between steps: a step reads one parameter's master and moments, runs the same AdamW on them, writes
them to a new file that replaces the old one, and lets them go; a checkpoint hard-links those files (they are
never rewritten in place), so saving one costs no copy.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from common.train_config import OptimConfig


class MasterWeightAdamW:
    """AdamW on fp32 master copies of (possibly low-precision) model parameters.

    ``step()`` moves each parameter's gradient into its master (as fp32), runs AdamW on the masters, and
    writes the masters back into the parameters. With fp32 parameters the masters ARE the parameters (no
    copy), so this is exactly ``torch.optim.AdamW`` there.
    """

    def __init__(self, params: list[torch.nn.Parameter], cfg: OptimConfig, fused: bool = False):
        self.params = [p for p in params if p.requires_grad]
        self.low_precision = any(p.dtype != torch.float32 for p in self.params)
        self.masters = (
            [p.detach().float().clone().requires_grad_(True) for p in self.params]
            if self.low_precision
            else self.params
        )
        kw: dict[str, Any] = {"fused": True} if fused else {}
        self.fused = fused
        self.offload_dir: Path | None = None  # offload(): masters and moments in files between steps
        self._hooks: list[Any] = []
        self.inner = torch.optim.AdamW(
            self.masters, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2), **kw
        )

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        if self.low_precision:
            for m in self.masters:
                m.grad = None

    def accumulate_model_grads(self) -> None:
        """Add each parameter's current gradient into its fp32 master's gradient and clear it (no-op in
        fp32, where the masters are the parameters). Call it after every backward pass of a step so that
        the per-datum / per-micro-batch gradients add up in fp32, not in the model's dtype."""
        if not self.low_precision:
            return
        for p, m in zip(self.params, self.masters, strict=True):
            if p.grad is None:
                continue
            g = p.grad.detach().float()
            m.grad = g if m.grad is None else m.grad.add_(g)
            p.grad = None

    def grads_to_masters_in_backward(self) -> None:
        """Move every parameter's gradient into its fp32 master as soon as the backward pass has finished it
        (``register_post_accumulate_grad_hook``), instead of after the whole backward
        (:meth:`accumulate_model_grads`, which then finds nothing left to move). The same fp32 sums; less
        memory: the model's gradients of one datum never all exist at once. A no-op in fp32 (the masters
        are the parameters). Not for data-parallel wrappers that reduce the model's gradients after the
        backward (DDP): only for a single process (level 0)."""
        if not self.low_precision or self._hooks:
            return

        def move(p: torch.nn.Parameter, m: torch.Tensor) -> None:
            if m.grad is None:
                m.grad = p.grad.detach().float()
            else:  # bf16 -> fp32 inside the add (exact), no fp32 copy of the whole gradient first
                m.grad.add_(p.grad.detach())
            p.grad = None

        for p, m in zip(self.params, self.masters, strict=True):
            self._hooks.append(p.register_post_accumulate_grad_hook(lambda p, m=m: move(p, m)))

    def _step(self) -> None:
        """AdamW on the masters, then the masters written back into the model (rounded to its dtype), and
        the gradients freed. Fused (CUDA): one ``step()``. Otherwise one master at a time (the same
        single-tensor AdamW arithmetic; torch's CPU AdamW runs it per tensor anyway), each gradient freed
        right after its update: at the first step AdamW's moments are created while the gradients go."""
        group = self.inner.param_groups[0]
        every = group["params"]
        batches = [every] if self.fused or len(self.inner.param_groups) > 1 else [[m] for m in every]
        try:
            for i, part in enumerate(batches):
                if self.offload_dir is not None:
                    self._bring_in(i)
                group["params"] = part
                self.inner.step()
                for m in part:
                    m.grad = None
                if self.offload_dir is not None:
                    with torch.no_grad():
                        self.params[i].copy_(part[0])  # rounds to the model's dtype
                    self._send_out(i)
        finally:
            group["params"] = every
        if self.low_precision and self.offload_dir is None:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters, strict=True):
                    p.copy_(m)  # rounds to the model's dtype

    def clip_and_step(self, grad_clip: float) -> float:
        """Global-norm clip (computed in fp32 on the masters' grads), AdamW, write back, gradients freed
        (model and masters: the next step starts from none). Returns the pre-clip gradient norm. Gradients still on the model are added to the masters' first. A step in
        which no backward ran (every datum had a zero advantage: trainers skip those) has a zero gradient,
        not none: AdamW still decays the weights and follows its momentum, as after computing the zeros."""
        self.accumulate_model_grads()
        if all(m.grad is None for m in self.masters):
            for m in self.masters:
                m.grad = torch.zeros_like(m)
        norm = torch.nn.utils.clip_grad_norm_(self.masters, grad_clip)
        self._step()
        self.zero_grad()  # not kept through the next round's rollouts
        return float(norm)

    # ---- --optimizer-state disk: masters and moments in files between steps ------------------------------
    def offload(self, directory: Path) -> None:
        """Keep each master and its AdamW moments in ``directory/NNNN.bin`` (raw fp32: master, then
        exp_avg and exp_avg_sq once a step has made them) between steps, not in RAM. A step then holds
        one parameter's state at a time. A no-op with fp32 weights (the masters are the weights) and with
        the fused CUDA step (a GPU has the memory; its step runs over every tensor at once)."""
        if not self.low_precision or self.fused or self.offload_dir is not None:
            return
        if len(self.inner.param_groups) > 1:
            raise ValueError("offload() steps one master at a time: one parameter group only")
        shutil.rmtree(directory, ignore_errors=True)  # a killed run's files: the checkpoint is the truth
        directory.mkdir(parents=True)
        self.offload_dir = directory
        for i in range(len(self.masters)):
            self._send_out(i)

    def close(self) -> None:
        """The end of a run: an offloaded optimizer's working files go (its checkpoint keeps its own links)."""
        if self.offload_dir is not None:
            shutil.rmtree(self.offload_dir, ignore_errors=True)

    def _file(self, i: int) -> Path:
        assert self.offload_dir is not None
        return self.offload_dir / f"{i:04d}.bin"

    def _pieces(self, i: int) -> list[torch.Tensor]:
        m = self.masters[i]
        st = self.inner.state.get(m, {})
        return [m.data] + [st[k] for k in ("exp_avg", "exp_avg_sq") if k in st]

    def _send_out(self, i: int) -> None:
        """Write master ``i`` (and its moments) to a new file that replaces the old one (so a checkpoint's
        hard link keeps the old contents), then leave only a shell of the right shape in RAM: a zero-stride
        view of one float, to which gradients can still be assigned."""
        path, tmp = self._file(i), self._file(i).with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for t in self._pieces(i):
                f.write(memoryview(t.detach().contiguous().numpy()).cast("B"))
        os.replace(tmp, path)
        self._shell(i)

    def _shell(self, i: int) -> None:
        m = self.masters[i]
        shell = torch.zeros(1, dtype=torch.float32).expand(m.shape)
        m.data = shell
        st = self.inner.state.get(m, {})
        for k in ("exp_avg", "exp_avg_sq"):
            if k in st:
                st[k] = shell

    def _bring_in(self, i: int, path: Path | None = None) -> None:
        """Read master ``i`` and its moments back from ``path`` (default: its working file; the step after
        this writes them out)."""
        m = self.masters[i]
        st = self.inner.state.get(m, {})
        names = ["master"] + [k for k in ("exp_avg", "exp_avg_sq") if k in st]
        path = path or self._file(i)
        with open(path, "rb") as f:
            for name in names:
                t = torch.empty(m.shape, dtype=torch.float32)
                if f.readinto(memoryview(t.numpy()).cast("B")) != t.numel() * 4:
                    raise OSError(f"{path} is shorter than {len(names)} x {t.numel()} floats")
                if name == "master":
                    m.data = t
                else:
                    st[name] = t

    def state_dict(self, into: Path | None = None) -> dict[str, Any]:
        """The optimizer's state for a checkpoint. Offloaded, with ``into`` (the checkpoint's directory):
        the files are hard-linked (copied where links fail) into ``into/optimizer_state`` and the dict holds
        the step counts, the hyperparameters and each file's size (a damaged file is found on --resume)."""
        if self.offload_dir is None:
            state: dict[str, Any] = {"inner": self.inner.state_dict()}
            if self.low_precision:
                state["masters"] = [m.detach() for m in self.masters]  # references, as inner's (no copy)
            return state
        if into is None:
            raise ValueError("an offloaded optimizer's state_dict needs the checkpoint directory (into=)")
        (into / "optimizer_state").mkdir(parents=True, exist_ok=True)
        files = {}
        for i in range(len(self.masters)):
            name = f"optimizer_state/{self._file(i).name}"
            _link_or_copy(self._file(i), into / name)
            files[name] = (into / name).stat().st_size
        steps = {
            i: {"step": self.inner.state[m]["step"]}
            for i, m in enumerate(self.masters)
            if m in self.inner.state
        }
        inner = {"state": steps, "param_groups": self.inner.state_dict()["param_groups"]}
        return {"inner": inner, "offloaded": "optimizer_state", "files": files}

    def load_state_dict(self, state: dict[str, Any], from_dir: Path | None = None) -> None:
        """Load either form of :meth:`state_dict` into either kind of optimizer (in RAM or offloaded);
        an offloaded state's files are read from ``from_dir`` (the checkpoint's directory)."""
        if "offloaded" in state:
            if from_dir is None:
                raise ValueError("an offloaded optimizer state needs its checkpoint directory (from_dir=)")
            self._load_files(state, from_dir / state["offloaded"])
            return
        offload_dir, self.offload_dir = self.offload_dir, None
        if offload_dir is not None:  # bring every master in to load the saved ones, then out again
            for i in range(len(self.masters)):
                self.masters[i].data = torch.empty(self.masters[i].shape, dtype=torch.float32)
        self.inner.load_state_dict(state["inner"])
        if self.low_precision:
            with torch.no_grad():
                for m, saved, p in zip(self.masters, state["masters"], self.params, strict=True):
                    m.copy_(saved)
                    p.copy_(m)
        if offload_dir is not None:
            self.offload_dir = offload_dir
            for i in range(len(self.masters)):
                self._send_out(i)

    def _load_files(self, state: dict[str, Any], source: Path) -> None:
        groups = state["inner"]["param_groups"]
        for group, saved in zip(self.inner.param_groups, groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self.inner.state.clear()
        for i, m in enumerate(self.masters):
            st = state["inner"]["state"].get(i)
            if st is not None:  # placeholders: _bring_in reads the moments the state names
                self.inner.state[m] = {"step": st["step"].clone(), "exp_avg": m.data, "exp_avg_sq": m.data}
            saved = source / f"{i:04d}.bin"
            if self.offload_dir is not None:  # the checkpoint's file is never rewritten in place: link it
                tmp = self._file(i).with_suffix(".tmp")
                tmp.unlink(missing_ok=True)
                _link_or_copy(saved, tmp)
                os.replace(tmp, self._file(i))
            self._bring_in(i, saved)
            with torch.no_grad():
                self.params[i].copy_(m)  # rounds to the model's dtype
            if self.offload_dir is not None:
                self._shell(i)


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link (no copy: offloaded files are replaced, never rewritten), a copy across filesystems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def place_optimizer_state(optimizer: MasterWeightAdamW, where: str, directory: Path, device: str) -> None:
    """``--optimizer-state``: disk (and auto on a CPU) keeps the masters and moments in files in
    ``directory`` between steps (:meth:`MasterWeightAdamW.offload`; a no-op for fp32 weights); call it
    before a checkpoint is loaded into the optimizer."""
    if where == "disk" or (where == "auto" and device == "cpu"):
        optimizer.offload(directory)


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> MasterWeightAdamW:
    """The optimizer of every tier (fused AdamW kernels on CUDA)."""
    params = list(model.parameters())
    fused = bool(params) and params[0].is_cuda
    return MasterWeightAdamW(params, cfg, fused=fused)
