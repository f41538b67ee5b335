"""A ``transformers`` causal LM cut into pipeline stages, each loading only its own weights
and holding a static KV cache per microbatch.

The math is the library's: a stage holds the model's own modules (``embed_tokens``, its
slice of ``layers``, ``norm``, ``lm_head``, the rotary embedding), built on the ``meta``
device and then given their tensors by key (``weights.Weights``). What the library's model
forward does outside its decoder layers (embedding multipliers, logit scaling and
soft-capping, rotary per layer type, sliding windows) comes from the architecture's entry in
``architectures.ARCHITECTURES``.
"""

from __future__ import annotations

import inspect
import resource
from typing import Any

import torch

from cgc.hf.architectures import UnsupportedModelError, dtype_of, window_of
from cgc.hf.cache import StaticKV
from cgc.hf.sampling import Sampler, Sampling
from cgc.hf.spec import ModelSpec, build_config, model_class
from cgc.hf.weights import Weights


def pick_device(device: str = "auto") -> torch.device:
    """``"auto"``: this process's GPU when it has one, else the CPU.

    Example:

    >>> pick_device("cpu")
    device(type='cpu')

    Raises:
        RuntimeError: a string torch does not know as a device.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def skeleton(spec: ModelSpec) -> tuple[Any, Any]:
    """The whole model on the meta device (no memory) and its config."""
    config = build_config(spec)
    with torch.device("meta"):
        model = model_class(spec)(config)
    return model, config


def _fill(module: torch.nn.Module, prefix: str, weights: Weights, dtype: torch.dtype) -> None:
    """Give ``module`` (on meta) its tensors, read by key ``prefix + name``."""
    state = {n: weights.get(prefix + n, t.shape).to(dtype)
             for n, t in module.state_dict().items()}
    module.load_state_dict(state, assign=True, strict=True)
    _materialise_buffers(module)


# Non-persistent buffers (not in a checkpoint) the library computes at construction, which
# the meta device left empty: rebuilt from what the module keeps beside them.
_BUFFERS = {"embed_scale": lambda m: torch.tensor(m.scalar_embed_scale)}


def _materialise_buffers(module: torch.nn.Module) -> None:
    """Rebuild ``module``'s meta buffers listed in ``_BUFFERS``; refuse any other."""
    for owner in module.modules():
        for name, buf in list(owner.named_buffers(recurse=False)):
            if buf is not None and buf.is_meta:
                if name not in _BUFFERS:
                    raise UnsupportedModelError(f"{type(owner).__name__}.{name}: a buffer "
                                                f"cgc.hf does not know how to build")
                setattr(owner, name, _BUFFERS[name](owner))


def _rotary(base: Any, config: Any, device: torch.device) -> torch.nn.Module:
    """The rotary embedding, built for real (its buffers are computed at construction)."""
    return type(base.rotary_emb)(config=config).to(device)


def _cache_keyword(layer: torch.nn.Module) -> str:
    """The decoder layer's cache argument: ``cache`` (5.x), ``past_key_values`` (4.56+)..."""
    params = inspect.signature(layer.forward).parameters
    for name in ("cache", "past_key_values", "past_key_value"):
        if name in params:
            return name
    raise UnsupportedModelError(f"{type(layer).__name__}.forward takes no cache argument")


def load_model(spec: ModelSpec, device: str = "auto") -> Any:
    """The whole model in this process with the stages' exact weights (to write a
    checkpoint of a seeded model with ``save_pretrained``; the oracle is
    ``reference.reference_model``, the library's own loading).

    Example: ``load_model(model_spec("llama")).save_pretrained(DIR)``.

    Raises:
        KeyError: the checkpoint lacks a tensor of the model.
    """
    dev = pick_device(device)
    model, config = skeleton(spec)
    weights = Weights(spec, dev, config.tie_word_embeddings)
    base = getattr(model, model.base_model_prefix)
    base.rotary_emb = _rotary(base, config, dev)  # built for real first: no meta buffers
    _fill(model, "", weights, dtype_of(spec.dtype))
    if config.tie_word_embeddings:
        model.lm_head.weight = model.get_input_embeddings().weight
    weights.close()
    return model.eval()


class HFStage:
    """Layers ``[first, last)`` of a ``transformers`` causal LM and their KV caches.

    The first stage also embeds the tokens; the last applies the final norm and the LM head
    and returns each sequence's next token (greedy, or drawn with ``sampling``).
    ``compile=True`` runs each decoder layer through ``torch.compile``. ``forward(x, mb,
    pos)`` takes positions as a tensor and masks the whole cache, so a step is the same
    kernels at every position and can be replayed as a CUDA graph (greedy only).

    ``spec`` and ``sampling`` may be given as plain data (``ModelSpec.plain()``,
    ``dataclasses.asdict``), as a plan stores them.

    Example: ``HFStage(model_spec("qwen2"), 0, 2, microbatches=2, batch=4, max_seq=64)``.

    Raises:
        ValueError: a span outside the model.
        UnsupportedModelError: see ``model_spec``.
    """

    def __init__(self, spec: ModelSpec | dict[str, Any], first: int, last: int,
                 microbatches: int = 1, batch: int = 1, max_seq: int = 256,
                 device: str = "auto", compile: bool = False,
                 sampling: Sampling | dict[str, Any] | None = None) -> None:
        spec = ModelSpec.of(spec)  # plain data where it came through a plan
        if isinstance(sampling, dict):
            sampling = Sampling(**sampling)
        self.device = pick_device(device)
        self.dtype = dtype_of(spec.dtype)
        self.arch = arch = spec.architecture
        model, config = skeleton(spec)
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
        self.windows = [window_of(arch, config, i) for i in range(first, last)]
        types: list[str] = list(getattr(config, "layer_types", None) or [])
        self.rope_keys = [types[i] if arch.rotary_per_layer_type else None
                          for i in range(first, last)]
        self._embed_mult = getattr(config, arch.embedding_multiplier) \
            if arch.embedding_multiplier else None
        self.sampler = Sampler(sampling, microbatches, batch, self.device) \
            if sampling is not None and self.is_last else None
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        shape = (batch, config.num_key_value_heads, max_seq, head_dim)
        self.caches = [StaticKV({i: (torch.zeros(shape, device=self.device, dtype=self.dtype),
                                     torch.zeros(shape, device=self.device, dtype=self.dtype))
                                 for i in range(first, last)})
                       for _ in range(microbatches)]
        self._steps = torch.arange(max_seq, device=self.device)
        self._min = torch.tensor(torch.finfo(self.dtype).min, device=self.device,
                                 dtype=self.dtype)

    def _modules(self) -> list[torch.nn.Module]:
        """Every module this stage holds."""
        return [m for m in (self.embed, *self.layers, self.norm, self.head, self.rotary)
                if m is not None]

    def _mask(self, positions: torch.Tensor, window: int | None) -> torch.Tensor:
        """Keys each query sees (boolean for SDPA, additive for eager attention)."""
        seen = self._steps[None, :] <= positions[:, None]
        if window is not None:
            seen = seen & (self._steps[None, :] > positions[:, None] - window)
        seen = seen[None, None]
        if self.config._attn_implementation == "eager":
            return torch.where(seen, torch.zeros((), device=seen.device, dtype=self.dtype),
                               self._min)
        return seen

    def _rope(self, h: torch.Tensor, position_ids: torch.Tensor) -> dict[Any, Any]:
        """The rotary embeddings, one per layer type where the architecture has several."""
        if not self.arch.rotary_per_layer_type:
            return {None: self.rotary(h, position_ids)}
        return {k: self.rotary(h, position_ids, k) for k in set(self.rope_keys)}

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The last position's logits (float32), scaled as the library's forward does."""
        a, c = self.arch, self.config
        if self.head is None or self.norm is None:
            raise ValueError(f"layers [{self.first}, {self.last}): not the last stage")
        logits = self.head(self.norm(h[:, -1:]))
        if a.logit_divisor:
            logits = logits / getattr(c, a.logit_divisor)
        if a.logit_multiplier:
            logits = logits * getattr(c, a.logit_multiplier)
        cap = getattr(c, a.logit_softcap) if a.logit_softcap else None
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits[:, -1].float()

    def forward(self, x: torch.Tensor, mb: int, pos: Any) -> torch.Tensor:
        """Run this stage on microbatch ``mb`` at positions ``pos ..`` (see the class doc).

        ``x``: token ids ``(batch, T)`` (first stage) or hidden states; ``pos`` an int or a
        one-element int64 tensor. Returns hidden states, or (last stage) next tokens.

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
            if self._embed_mult is not None and self.embed is not None:
                h = h * self._embed_mult
            rope = self._rope(h, position_ids)
            masks = {w: self._mask(positions, w) for w in set(self.windows)}
            cache = self.caches[mb]
            cache.positions = positions
            for layer, window, key in zip(self.layers, self.windows, self.rope_keys,
                                          strict=True):
                out = layer(h, attention_mask=masks[window], position_ids=position_ids,
                            position_embeddings=rope[key], use_cache=True,
                            cache_position=positions, **{self._cache_kw: cache})
                h = out[0] if isinstance(out, tuple) else out
            if self.head is None:
                return h
            logits = self.logits(h)
            if self.sampler is None:
                return logits.argmax(dim=-1)
            if pos.device.type != "cpu":
                raise ValueError("sampling reseeds at each prefill: pass the position on "
                                 "the host (a replayed CUDA graph cannot sample)")
            return self.sampler.draw(logits, mb, prefill=first == 0)

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

