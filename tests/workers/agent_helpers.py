"""A tiny chat model and scripted assistant turns for the multi-turn tests (everything built in memory)."""

from __future__ import annotations

import asyncio
import time
from collections import deque

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from config.sections import MultiTurnConfig
from tests.data.gsm8k_fixture import printable_tokenizer
from workers.compute.agent_loop import AgentLoop
from workers.tools import BaseTool, ToolBox, ToolResponse
from workers.tools.calculator import CalculatorTool

# a ChatML-like template: each turn ends with the EOS token, as SmolLM2's and Qwen's end with <|im_end|>
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


# ChatML as Qwen2.5 writes it: consecutive tool messages share one user turn of <tool_response> blocks, and an
# assistant turn's tool_calls are written after its content
CHATML = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\n<tool_response>\n' + m['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{ '<|im_end|>\n' }}{%- endif -%}"
    "{%- else -%}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] }}"
    "{%- if m.tool_calls is defined -%}{%- for c in m.tool_calls -%}"
    "{{ '\n<tool_call>\n{\"name\": \"' + c['function']['name'] + '\"}\n</tool_call>' }}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
# Llama 3's layout: a header per turn, <|eot_id|> after each, tool results as the ipython role, content trimmed
LLAMA3 = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{%- set role = 'ipython' if m['role'] == 'tool' else m['role'] -%}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif -%}"
)


def chat_tokenizer():
    return printable_tokenizer(TEMPLATE)


def special_tokenizer(template: str, specials: list[str], eos: str):
    """The printable tokenizer with ``specials`` as special tokens and ``eos`` (one of them) as its EOS."""
    tokenizer = printable_tokenizer(template)
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.eos_token = eos
    return tokenizer


def chatml_tokenizer():
    return special_tokenizer(CHATML, ["<|im_start|>", "<|im_end|>"], "<|im_end|>")


def llama3_tokenizer():
    specials = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]
    return special_tokenizer(LLAMA3, specials, "<|eot_id|>")


def peaked_model(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    """A random 2-layer Llama with large weights: greedy choices have clear margins (no near-ties)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.3,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config).eval()


def call(name: str, **arguments) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class Script:
    """A logits processor that makes each row's model emit the given turns, then lets it decode freely; forced
    tool-turn positions do not consume the script. A turn is a text (its tokens, then EOS) or a list of token ids
    (exactly those, its stop token included: e.g. a split the tokenizer would never produce).

    With ``sample=True`` the unscripted positions are sampled here from the model's distribution (a seeded
    generator) and forced, and every sampled token is recorded in ``sampled[(row, position)]``: an account of
    what the model sampled that does not come from the agent loop."""

    def __init__(self, tokenizer, turns_per_row: list[list], sample: bool = False, seed: int = 0) -> None:
        eos = tokenizer.eos_token_id
        self.queues = [
            deque(i for turn in turns for i in (turn if isinstance(turn, list) else _ids(tokenizer, turn) + [eos]))
            for turns in turns_per_row
        ]
        self.sample, self.sampled = sample, {}
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, rows, t, logits, sampling):
        logits = logits.clone()
        for j, row in enumerate(rows.tolist()):
            if not bool(sampling[j]):
                continue
            if self.queues[row]:
                token = self.queues[row].popleft()
            elif self.sample:
                token = int(torch.multinomial(torch.softmax(logits[j].float(), -1), 1, generator=self.generator))
            else:
                continue
            self.sampled[(row, t)] = token
            logits[j] = float("-inf")
            logits[j, token] = 0.0
        return logits


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


class RaisingTool(BaseTool):
    default_schema = {"type": "function", "function": {"name": "boom", "description": "raises"}}

    def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("the tool broke")


class SlowTool(BaseTool):
    default_schema = {"type": "function", "function": {"name": "slow", "description": "never answers in time"}}

    def execute(self, instance_id, parameters, **kwargs):
        time.sleep(3.0)
        return "late"


class HangingTool(BaseTool):
    default_schema = {"type": "function", "function": {"name": "hang", "description": "awaits forever"}}

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.Event().wait()


class RubbishTool(BaseTool):
    default_schema = {"type": "function", "function": {"name": "rubbish", "description": "returns no result"}}

    def execute(self, instance_id, parameters, **kwargs):
        return object(), "not a reward"


class AsyncEchoTool(BaseTool):
    """verl-style: async methods, an instance per call (verl 0.9), state across calls in agent_data.extra_fields,
    a step reward and a score."""

    default_schema = {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "echoes",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    }

    def __init__(self, config, tool_schema=None):
        super().__init__(config, tool_schema)
        self.state, self.created, self.released, self.seen = {}, [], [], []

    async def create(self, instance_id=None, create_kwargs=None, **kwargs):
        instance_id = instance_id or f"i{len(self.created)}"
        self.created.append(instance_id)
        self.state[instance_id] = {"bonus": (create_kwargs or {}).get("bonus", 0.0)}
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, agent_data=None, **kwargs):
        await asyncio.sleep(0)
        calls = agent_data.extra_fields["echo_calls"] = agent_data.extra_fields.get("echo_calls", 0) + 1
        self.state[instance_id]["calls"] = calls
        self.seen.append((agent_data.request_id, [m["role"] for m in agent_data.messages]))
        return parameters.get("text", ""), 0.25, {}

    async def calc_reward(self, instance_id, **kwargs):
        return self.state[instance_id]["bonus"] + self.state[instance_id]["calls"]

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)
        del self.state[instance_id]


def make_loop(tokenizer, timeout_s: float = 0.5, **multi_turn) -> AgentLoop:
    tools = [CalculatorTool({}), RaisingTool({}), SlowTool({}), HangingTool({}), RubbishTool({}), AsyncEchoTool({})]
    config = MultiTurnConfig(enable=True, tool_timeout_s=timeout_s, **multi_turn)
    return AgentLoop(tokenizer, ToolBox({t.name: t for t in tools}, config), config, default_agent="tool_agent")


def prompt_batch(tokenizer, questions: list[str], schemas: list[dict]) -> dict[str, torch.Tensor]:
    """Left-padded chat prompts rendered with the tools, as ``RLHFDataset`` renders a tool_agent row."""
    rows = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tools=schemas, tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]
    ids = [tokenizer.encode(r, add_special_tokens=False) for r in rows]
    width = max(map(len, ids))
    input_ids = torch.full((len(ids), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row) :], mask[i, width - len(row) :] = torch.tensor(row), 1
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def objects(values: list) -> np.ndarray:
    """A numpy object column (lists and dicts stay whole), as the dataset's collate builds them."""
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def run(
    loop: AgentLoop,
    model,
    tokenizer,
    questions: list[str],
    turns: list[list[str]],
    response_length: int,
    agent_names=None,
    tools_kwargs=None,
    **generate_kwargs,
):
    batch = prompt_batch(tokenizer, questions, loop.toolbox.schemas)
    non_tensors = {"raw_prompt": objects([[{"role": "user", "content": q}] for q in questions])}
    if agent_names is not None:
        non_tensors["agent_name"] = objects(agent_names)
    if tools_kwargs is not None:
        non_tensors["tools_kwargs"] = objects(tools_kwargs)
    return loop.generate(
        model,
        batch,
        non_tensors,
        response_length=response_length,
        eos_token_id=generate_kwargs.pop("eos_token_id", [tokenizer.eos_token_id]),
        pad_token_id=tokenizer.pad_token_id,
        sampling={"do_sample": False},
        logits_processor=Script(tokenizer, turns) if not isinstance(turns, Script) else turns,
        **generate_kwargs,
    )


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>'


def save_tool_calling_model(
    path, question: str = "1+2?", steps: int = 200, seed: int = 0, hidden_size: int = 64
) -> str:
    """A 1-layer model (4 heads) taught (supervised, seconds) to answer ``question`` by calling the calculator on
    1+2 and then writing ``#### 3``: greedy it does exactly that; sampled at temperature 1 its calls are sometimes
    malformed. Saved with its tokenizer."""
    from data.builtin import build_tiny_model

    tokenizer = chat_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=hidden_size, num_layers=1, max_position_embeddings=512, seed=seed)
    teach_tool_call(model, tokenizer, question, steps)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return str(path)


def teach_tool_call(model, tokenizer, question: str = "1+2?", steps: int = 200, lr: float = 3e-3) -> None:
    """Teach ``model`` (``chat_tokenizer``'s vocabulary) to answer ``question`` with the calculator call on 1+2,
    then ``#### 3`` after the tool turn; left in eval mode."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    parts = [(prompt, False), (CALL + "<eos>", True), ("\n<|tool|>3<eos>\n<|assistant|>", False), ("#### 3<eos>", True)]
    ids, labels = [], []
    for text, learned in parts:
        part = tokenizer.encode(text, add_special_tokens=False)
        ids += part
        labels += part if learned else [-100] * len(part)
    batch = {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels])}
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
