"""level1_batched: one node, batched (see README.md).

Importing the tier registers the policy kind it provides: ``vllm:MODEL`` (``vllm_engine.VLLMEngine``,
built lazily, so vLLM is imported only when such a policy is made). ``sera eval --engine vllm`` and
``make_policy("vllm:smollm2")`` resolve through it; ``common/`` never imports the tier itself.
"""

from common.policy import register_engine


def _vllm_policy(model: str, **kw):
    from level1_batched.vllm_engine import make_vllm_policy

    return make_vllm_policy(model, **kw)


register_engine("vllm", _vllm_policy)
