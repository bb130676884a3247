"""Tiny Hugging Face models for the tests: one spelling of "a LLaMA/T5/BART/GPT-2/BERT this small".

Built from a config here (never downloaded). :func:`tiny_model` takes the sizes in one vocabulary
(``width``, ``layers``, ``heads``, ``vocab``, ``positions``; feed-forward ``2 * width``, T5's
``d_kv`` ``width // heads``) and spells them as each family's config does; any other keyword goes
to the config as it is (``num_key_value_heads=1``, ``tie_word_embeddings=False``,
``dropout_rate=0.0``, ...). Used by the probe's verification against brute force
(``tests/probe``) and the trainer integrations' real stacks (``tests/integrations``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

#: family -> (config class, model class) in ``transformers``
FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "t5": ("T5Config", "T5ForConditionalGeneration"),
    "bart": ("BartConfig", "BartForConditionalGeneration"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "bert": ("BertConfig", "BertForSequenceClassification"),
}


def import_transformers() -> Any:
    """``transformers`` (skipping when absent), usable even next to a broken torchvision.

    A torchvision built for another torch fails at import (``torchvision::nms does not exist``)
    and transformers would import it for its vision helpers; the text models never need it.
    """
    import pytest

    transformers = pytest.importorskip("transformers")
    try:
        import torchvision  # noqa: F401
    except Exception:
        import transformers.utils as utils
        import transformers.utils.import_utils as import_utils

        for module in (utils, import_utils):
            for name in ("is_torchvision_available", "is_torchvision_v2_available"):
                if hasattr(module, name):
                    setattr(module, name, lambda: False)
    return transformers


#: One name per size -> the config keys each family spells it with (T5: relative attention, no
#: position table; GPT-2: feed-forward at its own ``4 * width``).
_LLAMA_LIKE = {
    "width": ("hidden_size",),
    "ffn": ("intermediate_size",),
    "layers": ("num_hidden_layers",),
    "heads": ("num_attention_heads",),
    "vocab": ("vocab_size",),
    "positions": ("max_position_embeddings",),
}
SPELLINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "llama": _LLAMA_LIKE,
    "bert": _LLAMA_LIKE,
    "gpt2": {
        "width": ("n_embd",),
        "layers": ("n_layer",),
        "heads": ("n_head",),
        "vocab": ("vocab_size",),
        "positions": ("n_positions",),
    },
    "t5": {
        "width": ("d_model",),
        "head_width": ("d_kv",),
        "ffn": ("d_ff",),
        "layers": ("num_layers", "num_decoder_layers"),
        "heads": ("num_heads",),
        "vocab": ("vocab_size",),
    },
    "bart": {
        "width": ("d_model",),
        "ffn": ("encoder_ffn_dim", "decoder_ffn_dim"),
        "layers": ("encoder_layers", "decoder_layers"),
        "heads": ("encoder_attention_heads", "decoder_attention_heads"),
        "vocab": ("vocab_size",),
        "positions": ("max_position_embeddings",),
    },
}


def tiny_model(
    family: str,
    *,
    width: int = 8,
    layers: int = 2,
    heads: int = 2,
    vocab: int = 29,
    positions: int = 16,
    attention: str | None = None,
    **config: Any,
) -> nn.Module:
    """A freshly initialised ``family`` model (float32; seed torch first for fixed weights).

    ``attention``: the config's ``_attn_implementation`` (``"eager"``), else the library's choice.
    """
    hf = import_transformers()
    config_class, model_class = FAMILIES[family]
    sizes = dict(
        width=width,
        head_width=width // heads,
        ffn=2 * width,
        layers=layers,
        heads=heads,
        vocab=vocab,
        positions=positions,
    )
    spelled = {key: sizes[size] for size, keys in SPELLINGS[family].items() for key in keys}
    cfg = getattr(hf, config_class)(**spelled, **config)
    if attention is not None:
        cfg._attn_implementation = attention
    return getattr(hf, model_class)(cfg)
