"""A Hugging Face ``transformers`` decoder (Llama, Qwen2, Qwen3, Mistral) cut into pipeline
stages, each loading only its own weights, with a static KV cache per microbatch.

The math is the library's: a stage holds the model's own modules (``embed_tokens``, its
slice of ``layers``, ``norm``, ``lm_head`` and the rotary embedding), built on the ``meta``
device and then given their tensors, read one by one by key from a ``save_pretrained``
directory (``safetensors.safe_open``) or drawn from a fixed seed per tensor. No process
ever holds the whole model. Shared by ``hf_decode.py`` (cgc and the Ray twin),
``tools/bench/bench_hf.py`` and the tests; decoding itself is ``tinygpt.generate``.

    spec = model_spec("llama", "tiny")
    stages = [HFStage(spec, a, b) for a, b in tinygpt.split_layers(4, 2)]
    tokens = tinygpt.generate(lambda m, t, p: run_all(stages, t, m, p), lambda r: r,
                              prompts(spec, 1, 1, 8), 4)

Why an example module and not a cgc package: it is a user's model code (as ``tinygpt.py``
is), and cgc itself does not depend on ``transformers`` (``pip install -e ".[hf]"`` in a clone installs it).
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import resource
import zlib
from collections.abc import Sequence
from typing import Any

import tinygpt
import torch
import transformers

# The library's class per family; the same stage code serves each (checked by the tests for
# Llama and Qwen2, and Qwen3 where it is installed).
FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}

SIZES: dict[str, dict[str, Any]] = {
    # CI on two CPU cores: GQA (4 heads, 2 KV heads), 4 layers so 2 stages hold 2 each.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 max_position_embeddings=512, tie_word_embeddings=False),
    # Llama-3.2-1B's shape (its RoPE scaling left out: default RoPE, as for Qwen2).
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
               max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True),
}
ATTENTION = ("sdpa", "eager")  # the implementations whose mask this module builds


def model_spec(family: str | None = None, size: str = "tiny", checkpoint: str | None = None,
               dtype: str = "float32", attn: str = "sdpa", seed: int = 0) -> dict[str, Any]:
    """A plain-data description of the model (it travels as a stage's constructor argument).

    With ``checkpoint`` (a ``save_pretrained`` directory) the config and weights come from
    there; else ``family`` and ``size`` pick a config and the weights are drawn from ``seed``.

    Example: ``model_spec("qwen2", "tiny")["arch"] == "Qwen2ForCausalLM"``.

    Raises:
        ValueError: an unknown family, size, dtype or attention implementation.
    """
    if attn not in ATTENTION:
        raise ValueError(f"attention {attn!r}: this module builds masks for {ATTENTION}")
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ValueError(f"dtype {dtype!r} is not a torch dtype")
    if checkpoint is not None:
        with open(os.path.join(checkpoint, "config.json")) as f:
            cfg = json.load(f)
        arch = (cfg.get("architectures") or [""])[0]
    else:
        if family not in FAMILIES or size not in SIZES:
            raise ValueError(f"model {family!r} size {size!r}: choose from {sorted(FAMILIES)} "
                             f"and {sorted(SIZES)}")
        arch = FAMILIES[family]
        cfg = dict(SIZES[size], model_type=family, architectures=[arch])
    if not hasattr(transformers, arch):
        raise ValueError(f"architecture {arch!r} is not in transformers "
                         f"{transformers.__version__}")
    return dict(arch=arch, config=cfg, checkpoint=checkpoint, dtype=dtype, attn=attn, seed=seed)


def build_config(spec: dict[str, Any]) -> Any:
    """The library's config object for ``spec``, with its attention implementation set.

    Example: ``build_config(model_spec("llama")).num_hidden_layers == 4``.
    """
    cfg = dict(spec["config"])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config._attn_implementation = spec["attn"]
    return config


def _random(name: str, shape: Sequence[int], seed: int, device: torch.device) -> torch.Tensor:
    # One generator per tensor, keyed by the architecture and the tensor's name: the same
    # bits in whatever process builds it.
    # Scaled so that activations keep their size (the library's default init, std 0.02,
    # makes a tiny model repeat one token).
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    if len(shape) == 1:
        if "norm" in name:
            return 1.0 + 0.1 * torch.randn(*shape, generator=gen, device=device)
        return 0.02 * torch.randn(*shape, generator=gen, device=device)
    std = 1.0 if "embed_tokens" in name else shape[-1] ** -0.5  # tokens stay distinct
    return torch.randn(*shape, generator=gen, device=device) * std


class Weights:
    """Tensors by key: read lazily from a ``save_pretrained`` directory, or drawn at random.

    ``read`` lists every key this object handed out, in order (what a stage loaded).
    ``tied``: the model's ``tie_word_embeddings`` (its config's value, defaults included).
    """

    def __init__(self, spec: dict[str, Any], device: torch.device, tied: bool) -> None:
        self.path, self.seed, self.device = spec["checkpoint"], spec["seed"], device
        self.arch, self.tied = spec["arch"], tied
        self.read: list[str] = []
        self._files: dict[str, Any] = {}
        self._where: dict[str, str] = {}
        if self.path is None:
            return
        index = os.path.join(self.path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                self._where = dict(json.load(f)["weight_map"])
        else:
            from safetensors import safe_open

            with safe_open(os.path.join(self.path, "model.safetensors"), "pt") as f:
                self._where = {k: "model.safetensors" for k in f.keys()}

    def get(self, key: str, shape: Sequence[int]) -> torch.Tensor:
        """The tensor named ``key`` (float32 or the checkpoint's dtype), on this device; a
        tied head is the embedding's tensor.

        Raises:
            KeyError: the checkpoint does not hold ``key``.
            ValueError: it holds another shape.
        """
        if key == "lm_head.weight" and self.tied and (self.path is None
                                                      or key not in self._where):
            like = self._keys_like("embed_tokens.weight")
            if len(like) != 1:
                raise KeyError(f"{key}: tied, and the checkpoint has {len(like)} embeddings "
                               f"({like})")
            key = like[0]
        self.read.append(key)
        if self.path is None:
            return _random(f"{self.arch}:{key}", shape, self.seed, self.device)
        if key not in self._where:
            raise KeyError(f"{key}: not in the checkpoint at {self.path}")
        name = self._where[key]
        if name not in self._files:
            from safetensors import safe_open

            self._files[name] = safe_open(os.path.join(self.path, name), "pt")
        t = self._files[name].get_tensor(key)
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{key}: checkpoint shape {tuple(t.shape)}, model {tuple(shape)}")
        return t.to(self.device)

    def _keys_like(self, suffix: str) -> list[str]:
        if self.path is None:
            return ["model." + suffix]
        return [k for k in self._where if k.endswith(suffix)]

    def close(self) -> None:
        """Close the checkpoint files."""
        self._files.clear()


def _skeleton(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The model on the meta device (no memory) and its config."""
    config = build_config(spec)
    with torch.device("meta"):
        model = getattr(transformers, spec["arch"])(config)
    return model, config


def _fill(module: torch.nn.Module, prefix: str, weights: Weights, dtype: torch.dtype) -> None:
    """Give ``module`` (on meta) its tensors, read by key ``prefix + name``."""
    state = {n: weights.get(prefix + n, t.shape).to(dtype)
             for n, t in module.state_dict().items()}
    module.load_state_dict(state, assign=True, strict=True)


def _rotary(base: Any, config: Any, device: torch.device) -> torch.nn.Module:
    # Its buffers are computed at construction, so it is built for real (small), in float32.
    return type(base.rotary_emb)(config=config).to(device)


def load_model(spec: dict[str, Any], device: str = "auto") -> Any:
    """The whole model in this process (the reference), with the stages' exact weights.

    Example: ``load_model(model_spec("llama")).generate(ids, max_new_tokens=4)``.

    Raises:
        KeyError: the checkpoint lacks a tensor of the model.
    """
    dev = tinygpt.pick_device(device)
    dtype = getattr(torch, spec["dtype"])
    model, config = _skeleton(spec)
    weights = Weights(spec, dev, config.tie_word_embeddings)
    _fill(model, "", weights, dtype)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.get_input_embeddings().weight
    base = getattr(model, model.base_model_prefix)
    base.rotary_emb = _rotary(base, config, dev)
    weights.close()
    return model.eval()


def _cache_keyword(layer: torch.nn.Module) -> str:
    # The decoder layer's cache argument: `cache` (transformers 5.x), `past_key_values`
    # (4.56+), `past_key_value` (older).
    params = inspect.signature(layer.forward).parameters
    for name in ("cache", "past_key_values", "past_key_value"):
        if name in params:
            return name
    raise TypeError(f"{type(layer).__name__}.forward takes no cache argument")


class _StaticKV:
    """The cache a decoder layer's attention writes to: ``StaticCache``'s layout per layer,
    ``(batch, kv_heads, max_seq, head_dim)``, written at the step's positions (a device
    tensor, so a captured step replays for any position). Only ``update`` is called."""

    def __init__(self, layers: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.layers = layers
        self.positions: torch.Tensor | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.layers[layer_idx]
        k.index_copy_(2, self.positions, key)
        v.index_copy_(2, self.positions, value)
        return k, v


def _window(config: Any, index: int) -> int | None:
    """The sliding window of layer ``index`` as the library applies it, or None."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return window if types[index] == "sliding_attention" else None
    return window if getattr(config, "use_sliding_window", True) else None


class HFStage:
    """Layers ``[first, last)`` of a ``transformers`` causal LM and their KV caches.

    The first stage also embeds the tokens; the last applies the final norm and the LM head
    and returns each sequence's greedy next token. ``compile=True`` runs each decoder layer
    through ``torch.compile`` (default mode: no CUDA graphs of its own, so cgc's capture of
    the step holds its kernels). ``forward(x, mb, pos)`` has
    ``tinygpt.GPTStage``'s contract (positions as a tensor, the whole cache masked), so a
    step is the same kernels at every position and can be replayed as a CUDA graph.

    Example: ``HFStage(model_spec("qwen2"), 0, 2, microbatches=2, batch=4, max_seq=64)``.

    Raises:
        ValueError: a span outside the model, or an attention implementation without a mask
            here (see ``ATTENTION``).
    """

    def __init__(self, spec: dict[str, Any], first: int, last: int, microbatches: int = 1,
                 batch: int = 1, max_seq: int = 256, device: str = "auto",
                 compile: bool = False) -> None:
        self.device = tinygpt.pick_device(device)
        self.dtype = getattr(torch, spec["dtype"])
        model, config = _skeleton(spec)
        n = config.num_hidden_layers
        if not 0 <= first < last <= n:
            raise ValueError(f"layers [{first}, {last}) of a {n}-layer model")
        self.first, self.last, self.is_first, self.is_last = first, last, first == 0, last == n
        self.config, self.batch, self.max_seq = config, batch, max_seq
        base, prefix = getattr(model, model.base_model_prefix), model.base_model_prefix + "."
        self.weights = Weights(spec, self.device, config.tie_word_embeddings)
        self.embed = self.norm = self.head = None
        if self.is_first:
            self.embed = base.embed_tokens
            _fill(self.embed, prefix + "embed_tokens.", self.weights, self.dtype)
        self.layers = list(base.layers[first:last])
        for i, layer in zip(range(first, last), self.layers, strict=True):
            _fill(layer, f"{prefix}layers.{i}.", self.weights, self.dtype)
        if self.is_last:
            self.norm, self.head = base.norm, model.lm_head
            _fill(self.norm, prefix + "norm.", self.weights, self.dtype)
            if config.tie_word_embeddings and self.embed is not None:
                self.head.weight = self.embed.weight
            else:
                _fill(self.head, "lm_head.", self.weights, self.dtype)
        self.weights.close()
        self.rotary = _rotary(base, config, self.device)
        del model, base
        for m in self._modules():
            m.to(self.device).eval()
        self._cache_kw = _cache_keyword(self.layers[0])
        if compile:  # fused kernels, as a user would; cgc may still capture the whole step
            self.layers = [torch.compile(layer, dynamic=False) for layer in self.layers]
        self.windows = [_window(config, i) for i in range(first, last)]
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        shape = (batch, config.num_key_value_heads, max_seq, head_dim)
        self.caches = [_StaticKV({i: (torch.zeros(shape, device=self.device, dtype=self.dtype),
                                      torch.zeros(shape, device=self.device, dtype=self.dtype))
                                  for i in range(first, last)})
                       for _ in range(microbatches)]
        self._steps = torch.arange(max_seq, device=self.device)
        self._min = torch.tensor(torch.finfo(self.dtype).min, device=self.device,
                                 dtype=self.dtype)

    def _modules(self) -> list[torch.nn.Module]:
        return [m for m in (self.embed, *self.layers, self.norm, self.head, self.rotary)
                if m is not None]

    def _mask(self, positions: torch.Tensor, window: int | None) -> torch.Tensor:
        # Query i (at positions[i]) sees the keys up to its own position (and, with a
        # sliding window, after positions[i] - window), as the library's masks do; boolean
        # for SDPA, additive (0 or the dtype's minimum) for eager attention.
        seen = self._steps[None, :] <= positions[:, None]
        if window is not None:
            seen = seen & (self._steps[None, :] > positions[:, None] - window)
        seen = seen[None, None]
        if self.config._attn_implementation == "eager":
            return torch.where(seen, torch.zeros((), device=seen.device, dtype=self.dtype),
                               self._min)
        return seen

    def forward(self, x: torch.Tensor, mb: int, pos: Any) -> torch.Tensor:
        """Run this stage on microbatch ``mb`` at positions ``pos ..`` (see the class doc).

        ``x``: token ids ``(batch, T)`` (first stage) or hidden states; ``pos`` an int or a
        one-element int64 tensor.

        Raises:
            ValueError: ``mb``, the batch or the positions do not fit the caches.
        """
        if not 0 <= mb < len(self.caches):
            raise ValueError(f"microbatch {mb}: this stage holds caches for "
                             f"{len(self.caches)} microbatches")
        if x.shape[0] != self.batch:
            raise ValueError(f"batch {x.shape[0]}: the caches hold batch {self.batch}")
        t = x.shape[1]
        first = int(pos) if not torch.is_tensor(pos) or pos.device.type == "cpu" else 0
        if first < 0 or first + t > self.max_seq:
            raise ValueError(f"positions {first}..{first + t - 1}: everything must fit in "
                             f"max_seq={self.max_seq}")
        if not torch.is_tensor(pos):
            pos = torch.tensor([pos])
        with torch.inference_mode():
            positions = pos.to(self.device, non_blocking=True).reshape(1) + self._steps[:t]
            position_ids = positions[None, :]
            x = x.to(self.device, non_blocking=True)
            h = self.embed(x) if self.embed is not None else x
            rope = self.rotary(h, position_ids)
            masks = {w: self._mask(positions, w) for w in set(self.windows)}
            cache = self.caches[mb]
            cache.positions = positions
            for layer, window in zip(self.layers, self.windows, strict=True):
                out = layer(h, attention_mask=masks[window], position_ids=position_ids,
                            position_embeddings=rope, use_cache=True,
                            cache_position=positions, **{self._cache_kw: cache})
                h = out[0] if isinstance(out, tuple) else out
            if self.head is None:
                return h
            return self.head(self.norm(h)[:, -1:]).float()[:, -1].argmax(dim=-1)

    def loaded_keys(self) -> list[str]:
        """Every checkpoint (or random) key this stage read, in order.

        Example: ``HFStage(spec, 0, 1).loaded_keys()[0] == "model.embed_tokens.weight"``.
        """
        return list(self.weights.read)

    def memory(self) -> dict[str, int]:
        """Bytes this stage holds: weights, KV caches, the device's allocator (CUDA: now and
        at peak), and the process's peak resident set (``ru_maxrss``).

        Example: ``stage.memory()["weights"]`` (bytes).
        """
        params = {id(p): p.numel() * p.element_size()
                  for m in self._modules() for p in m.parameters()}
        kv = sum(t.numel() * t.element_size()
                 for c in self.caches for pair in c.layers.values() for t in pair)
        out = dict(weights=sum(params.values()), kv_cache=kv,
                   max_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        if self.device.type == "cuda":
            out["cuda_allocated"] = torch.cuda.memory_allocated(self.device)
            out["cuda_max_allocated"] = torch.cuda.max_memory_allocated(self.device)
        return out


def prompts(spec: dict[str, Any], microbatches: int, batch: int, length: int,
            seed: int = 1) -> list[torch.Tensor]:
    """Random prompts from ``seed``: one ``(batch, length)`` tensor of ids per microbatch.

    Example: ``prompts(model_spec("llama"), 2, 4, 16)[1].shape == (4, 16)``.
    """
    gen = torch.Generator().manual_seed(seed)
    vocab = spec["config"]["vocab_size"]
    return [torch.randint(0, vocab, (batch, length), generator=gen)
            for _ in range(microbatches)]


def generate_reference(model: Any, prompt_list: Sequence[torch.Tensor], new_tokens: int,
                       **kwargs: Any) -> list[torch.Tensor]:
    """``model.generate(do_sample=False)`` per microbatch: its new tokens, never stopped
    early (no end-of-sequence token), on the CPU. ``kwargs`` are generation options (e.g.
    ``cache_implementation="static"``).

    Example: ``generate_reference(load_model(spec), prompts(spec, 1, 2, 8), 16)``.

    Raises:
        RuntimeError: ``generate`` returned fewer tokens than asked for.
    """
    # generate() fills the options left None from the model's own generation config, so
    # the end-of-sequence token is unset there too (and put back after).
    saved = model.generation_config
    gc = copy.deepcopy(saved)
    gc.eos_token_id, gc.pad_token_id, gc.do_sample = None, 0, False
    gc.max_new_tokens, gc.min_new_tokens = new_tokens, None
    for k, v in kwargs.items():
        setattr(gc, k, v)
    dev = next(model.parameters()).device
    out = []
    model.generation_config = gc
    try:
        with torch.inference_mode():
            for p in prompt_list:
                ids = p.to(dev)
                got = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids))
                if got.shape[1] != p.shape[1] + new_tokens:
                    raise RuntimeError(f"generate stopped after {got.shape[1] - p.shape[1]} "
                                       f"of {new_tokens} tokens")
                out.append(got[:, p.shape[1]:].cpu())
    finally:
        model.generation_config = saved
    return out


def run_stages(stages: Sequence[HFStage], tokens: torch.Tensor, mb: int, pos: Any) -> Any:
    """One step through every stage in this process (no actors).

    Example: ``run_stages(stages, prompt, 0, 0)``: microbatch 0's prefill, its next tokens.
    """
    x = tokens
    for s in stages:
        x = s.forward(x, mb, pos)
    return x


def first_difference(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> str | None:
    """Where two decodes first differ (``"microbatch m, sequence s, token t: a != b"``), or
    None when they are equal token for token.

    Example: ``first_difference(staged, generate_reference(model, ps, 8)) is None``.
    """
    for m, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            return f"microbatch {m}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        bad = (g != w).nonzero()
        if len(bad):
            s, t = bad[0].tolist()
            return f"microbatch {m}, sequence {s}, token {t}: {g[s, t]} != {w[s, t]}"
    return None


def divergence(model: Any, prompt_list: Sequence[torch.Tensor], got: Sequence[torch.Tensor],
               want: Sequence[torch.Tensor]) -> dict[str, Any] | None:
    """Where ``got`` first leaves ``want`` (``model.generate``'s tokens) and by how much: the
    model's logits, in one forward pass over the prompt and the tokens both agreed on, for
    the token it chose and the one ``got`` has, and the rank of the latter (1: the
    runner-up, a near tie). None where they are equal.

    Example: ``divergence(model, ps, staged, generated)["gap"]``.
    """
    for m, (g, w) in enumerate(zip(got, want, strict=True)):
        bad = (g != w).nonzero()
        if not len(bad):
            continue
        s, t = bad[0].tolist()
        dev = next(model.parameters()).device
        ids = torch.cat([prompt_list[m][s], w[s, :t]])[None].to(dev)
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0, -1].float().cpu()
        a, b = int(w[s, t]), int(g[s, t])
        return dict(microbatch=m, sequence=s, token=t, want=a, got=b,
                    logit_want=float(logits[a]), logit_got=float(logits[b]),
                    gap=float(logits[a] - logits[b]),
                    rank_got=int((logits > logits[b]).sum()))
    return None
