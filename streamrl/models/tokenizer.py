"""Tokenizers: the built-in character-level tokenizer, and prompt encoding for any tokenizer."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from streamrl.core.types import Item

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3, so pad id 0 matches Batch.collate's default

# Printable ASCII (space .. ~) plus newline and tab: one token each.
DEFAULT_CHARS = "".join(chr(c) for c in range(32, 127)) + "\n\t"

# Saved in tokenizer_config.json, so the flag survives save_pretrained / from_pretrained.
CHAR_TOKENIZER_FLAG = "streamrl_char_tokenizer"

# A minimal chat format for the char tokenizer ("role: content" lines), so chat items
# also work with the tiny from-scratch models.
CHAR_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_char_tokenizer(chars: str | None = None) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: every character in ``chars`` is one token.

    Ids 0..3 are ``<pad> <bos> <eos> <unk>``; characters follow in order. Characters not
    in ``chars`` encode to ``<unk>``. Encoding adds no special tokens (``encode_prompt``
    prepends ``<bos>`` itself) and decoding concatenates tokens, so
    ``decode(encode(s)) == s`` for any ``s`` over ``chars``.

    >>> tok = build_char_tokenizer()
    >>> ids = tok.encode("12+34=")
    >>> len(ids), tok.decode(ids)
    (6, '12+34=')
    """
    chars = DEFAULT_CHARS if chars is None else chars
    unique = list(dict.fromkeys(chars))  # keep order, drop duplicates
    if len(unique) != len(chars):
        raise ValueError("build_char_tokenizer: `chars` must not contain duplicate characters")
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *unique])}
    # BPE with no merges splits the whole text into single characters; unknown ones -> <unk>.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=False))
    backend.decoder = decoders.Fuse()  # join tokens with no separator
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,  # would turn "a ." into "a." on decode
        padding_side="left",
        chat_template=CHAR_CHAT_TEMPLATE,
        **{CHAR_TOKENIZER_FLAG: True},
    )


def is_char_tokenizer(tokenizer: PreTrainedTokenizerBase) -> bool:
    """True for tokenizers made by ``build_char_tokenizer`` (also after a save/load round trip)."""
    return bool(getattr(tokenizer, "init_kwargs", {}).get(CHAR_TOKENIZER_FLAG, False))


def encode_prompt(tokenizer: PreTrainedTokenizerBase, item: Item) -> list[int]:
    """Token ids of an item's prompt, ready to generate from.

    ``item.messages`` go through the tokenizer's chat template with the generation
    prompt appended. ``item.prompt`` is encoded as plain text: the char tokenizer
    gets ``<bos>`` prepended, pretrained tokenizers add whatever special tokens they
    add by default (e.g. Llama 3 adds ``<|begin_of_text|>``, SmolLM2 adds none).
    """
    if (item.prompt is None) == (item.messages is None):
        raise ValueError(
            f"item {item.id!r}: exactly one of `prompt` or `messages` must be set "
            f"(got prompt={item.prompt!r}, messages={item.messages!r})"
        )
    if item.messages is not None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"item {item.id!r} has chat messages but the tokenizer "
                f"{getattr(tokenizer, 'name_or_path', '')!r} has no chat template"
            )
        out: Any = tokenizer.apply_chat_template(
            item.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(out, dict) or hasattr(out, "input_ids"):  # BatchEncoding on some versions
            out = out["input_ids"]
        return [int(i) for i in out]
    if is_char_tokenizer(tokenizer):
        return [
            int(tokenizer.bos_token_id),
            *tokenizer.encode(item.prompt, add_special_tokens=False),
        ]
    return [int(i) for i in tokenizer.encode(item.prompt)]


def reference_ids(tokenizer: PreTrainedTokenizerBase, completion: str) -> list[int]:
    """The tokens a demonstration of ``completion`` trains on after the prompt: the
    completion + EOS (SFT's target, and what the likelihood gate scores)."""
    target_ids = [int(i) for i in tokenizer.encode(completion, add_special_tokens=False)]
    if tokenizer.eos_token_id is not None:
        target_ids.append(int(tokenizer.eos_token_id))
    return target_ids
